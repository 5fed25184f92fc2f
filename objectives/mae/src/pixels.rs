//! MAE's pixel targets and loss, pure functions of tensors (the official `patchify`,
//! `unpatchify` and `forward_loss` of `models_mae.py`).

use candle_core::{bail, Result, Tensor, D};

/// The ε under the square root of the per-patch normalisation, `(t − μ)/√(σ² + ε)`.
pub const NORM_PIX_EPS: f64 = 1e-6;

/// `imgs` `[N, C, H, W]` cut into `p × p` patches, `[N, L, p·p·C]` with `L = (H/p)(W/p)` patches
/// row-major; each patch's values ordered by pixel row, pixel column, then channel (the official
/// `einsum('nchpwq->nhwpqc')`, so a patch is `p·p` RGB triplets).
pub fn patchify(imgs: &Tensor, p: usize) -> Result<Tensor> {
    let (n, c, h, w) = imgs.dims4()?;
    if p == 0 || h % p != 0 || w % p != 0 {
        bail!(
            "patchify: a {h} × {w} image does not split into {p} × {p} patches; use a patch size \
             that divides both sides"
        );
    }
    let (gh, gw) = (h / p, w / p);
    imgs.reshape((n, c, gh, p, gw, p))?
        .permute((0, 2, 4, 3, 5, 1))?
        .contiguous()?
        .reshape((n, gh * gw, p * p * c))
}

/// The inverse of [`patchify`]: `[N, gh·gw, p·p·C]` → `[N, C, gh·p, gw·p]`.
pub fn unpatchify(
    x: &Tensor,
    p: usize,
    channels: usize,
    (gh, gw): (usize, usize),
) -> Result<Tensor> {
    let (n, len, width) = x.dims3()?;
    if len != gh * gw || width != p * p * channels {
        bail!(
            "unpatchify: {:?} is not {gh}·{gw} patches of {p}·{p}·{channels} values",
            x.dims()
        );
    }
    x.reshape((n, gh, gw, p, p, channels))?
        .permute((0, 5, 1, 3, 2, 4))?
        .contiguous()?
        .reshape((n, channels, gh * p, gw * p))
}

/// Each patch of `target` `[N, L, P]` normalised by its own mean and unbiased variance (as
/// torch's `var(dim=-1)`: divided by `P − 1`), `(t − μ)/√(σ² + ε)` with ε = [`NORM_PIX_EPS`].
pub fn normalize_pixels(target: &Tensor) -> Result<Tensor> {
    let values = target.dim(D::Minus1)?;
    if values < 2 {
        bail!(
            "norm_pix_loss normalises each patch by its variance, which one value per patch does \
             not have; use patches of more than one value or norm_pix_loss: false"
        );
    }
    let centred = target.broadcast_sub(&target.mean_keepdim(D::Minus1)?)?;
    let var = (centred.sqr()?.sum_keepdim(D::Minus1)? / (values - 1) as f64)?;
    centred.broadcast_div(&(var + NORM_PIX_EPS)?.sqrt()?)
}

/// MAE's loss: the mean squared error of `pred` against `target` (both `[N, L, P]`; the
/// target normalised per patch by [`normalize_pixels`] when `norm_pix`) per patch, averaged
/// over the patches `mask` `[N, L]` marks removed (1 = removed, 0 = visible; a weight, as in
/// the official code): `Σ mask·mse / Σ mask`. A mask that removes nothing gives 0/0.
pub fn mae_loss(pred: &Tensor, target: &Tensor, mask: &Tensor, norm_pix: bool) -> Result<Tensor> {
    let (n, len, _) = pred.dims3()?;
    if target.dims() != pred.dims() || mask.dims() != [n, len] {
        bail!(
            "MAE loss: prediction {:?}, target {:?} and mask {:?} must be [N, L, P], [N, L, P] and \
             [N, L]",
            pred.dims(),
            target.dims(),
            mask.dims()
        );
    }
    let target = target.to_dtype(pred.dtype())?;
    let target = if norm_pix {
        normalize_pixels(&target)?
    } else {
        target
    };
    let per_patch = (pred - target)?.sqr()?.mean(D::Minus1)?;
    let mask = mask.to_dtype(pred.dtype())?;
    (per_patch * &mask)?.sum_all()? / mask.sum_all()?
}
