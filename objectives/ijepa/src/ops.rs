//! The pure functions of I-JEPA's training step (spec `docs/spec/objectives.md` §2.28), each as
//! the official code computes it: gathering the tokens of masks, the batch repetition that pairs
//! every target with every context, the target's layer norm, the smooth-L1 loss and the
//! momentum schedule.

use candle_core::{bail, DType, Result, Tensor, D};
use ssl_core::Progress;

/// `x[b, m[b, k], :]` for every mask `m`, the masks stacked along the batch axis, mask-major:
/// `x` `[B, L, D]` and `len` masks of `[B, K]` u32 indices below `L` give
/// `[len·B, K, D]` whose rows `i·B .. (i + 1)·B` are mask `i`'s (the official `apply_masks`).
/// One row gather of the flattened batch; its backward adds the gradients back into the
/// gathered rows.
///
/// Checking the indices reads the masks back to the host (a wait on a GPU for their upload).
pub fn apply_masks(x: &Tensor, masks: &[Tensor]) -> Result<Tensor> {
    let (b, l, d) = x.dims3()?;
    let fix = "pass [B, K] u32 patch indices, the same K in every mask, each index below L";
    let Some(first) = masks.first() else {
        bail!(
            "apply_masks: no masks given for tokens {:?}; {fix}",
            x.dims()
        );
    };
    let k = first.dims().get(1).copied().unwrap_or(0);
    for (i, mask) in masks.iter().enumerate() {
        if mask.dims() != [b, k] || k == 0 {
            bail!(
                "apply_masks: mask {i} has shape {:?}, but the tokens {:?} are [B, L, D] = \
                 [{b}, {l}, {d}] and mask 0 has {k} indices per image; {fix}",
                mask.dims(),
                x.dims()
            );
        }
        if mask.dtype() != DType::U32 {
            bail!(
                "apply_masks: mask {i} holds {:?}, not u32; {fix}",
                mask.dtype()
            );
        }
    }
    let stacked = Tensor::cat(masks, 0)?; // [len·B, K]
    let largest = stacked.flatten_all()?.max(0)?.to_scalar::<u32>()? as usize;
    if largest >= l {
        bail!(
            "apply_masks: a mask names token {largest}, but the tokens {:?} have L = {l} per \
             image; {fix}",
            x.dims()
        );
    }
    // Row m[b, k] of image b is row b·L + m[b, k] of the flattened batch, for every mask.
    let offsets: Vec<u32> = (0..masks.len() * b)
        .map(|row| ((row % b) * l) as u32)
        .collect();
    let rows = stacked
        .broadcast_add(&Tensor::from_vec(
            offsets,
            (masks.len() * b, 1),
            stacked.device(),
        )?)?
        .flatten_all()?;
    x.reshape((b * l, d))?
        .index_select(&rows, 0)?
        .reshape((masks.len() * b, k, d))
}

/// The official `repeat_interleave_batch`: `x` `[N·B, …]`, `N` blocks of `batch` rows, each
/// block repeated `repeat` times in place, `[N·repeat·B, …]`. Block `i`'s copies are rows
/// `(i·repeat + r)·B ..`: with the targets of [`apply_masks`] (mask-major) and `repeat` the
/// number of context masks, row `(t·C + c)·B + b` pairs target `t` with context `c` of image `b`,
/// as the predictor's output is ordered. (The official function drops trailing rows that do not
/// fill a block; here that is an error.)
pub fn repeat_interleave_batch(x: &Tensor, batch: usize, repeat: usize) -> Result<Tensor> {
    let rows = x.dim(0)?;
    if batch == 0 || repeat == 0 || !rows.is_multiple_of(batch) {
        bail!(
            "repeat_interleave_batch: {rows} rows must be whole blocks of batch = {batch} rows \
             (batch ≥ 1), each repeated repeat = {repeat} ≥ 1 times"
        );
    }
    let blocks = rows / batch;
    let rest: usize = x.dims()[1..].iter().product();
    let mut shape = x.dims().to_vec();
    shape[0] = rows * repeat;
    x.reshape((blocks, 1, batch * rest))?
        .repeat((1, repeat, 1))?
        .reshape(shape)
}

/// `F.layer_norm(h, (h.size(-1),))`: each row normalised over its last axis, population
/// variance, `ε = 1e-5` (PyTorch's default), no scale or shift. I-JEPA's targets.
pub fn target_layer_norm(h: &Tensor) -> Result<Tensor> {
    const EPS: f64 = 1e-5;
    let centred = h.broadcast_sub(&h.mean_keepdim(D::Minus1)?)?;
    let variance = centred.sqr()?.mean_keepdim(D::Minus1)?;
    centred.broadcast_div(&(variance + EPS)?.sqrt()?)
}

/// `F.smooth_l1_loss(z, h)` with `β = 1`, averaged over every element:
/// `mean ℓ(z − h)` with `ℓ(d) = d²/2` for `|d| < 1` and `|d| − 1/2` otherwise, the loss of the
/// released `train.py` (the paper writes an L2 distance). Written as `c²/2 + (d − c)·c` with
/// `c = clamp(d, −1, 1)`, whose gradient is `c` exactly (the official `d` inside, `sign(d)`
/// outside). Gradients flow into both arguments; I-JEPA's target is detached.
pub fn ijepa_loss(prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
    if prediction.dims() != target.dims() {
        bail!(
            "ijepa_loss: the prediction {:?} and the target {:?} must have the same shape",
            prediction.dims(),
            target.dims()
        );
    }
    let d = (prediction - target)?;
    let c = d.clamp(-1.0, 1.0)?;
    let per_element = ((c.sqr()? * 0.5)? + ((&d - &c)? * &c)?)?;
    per_element.mean_all()
}

/// The official momentum schedule, linear from `start` at the first step to `end` after
/// `ipe_scale` times the run's steps: `m_k = start + k·(end − start)/(K·ipe_scale)` at step `k`
/// (0-based) of `K = progress.total_steps` (the generator `train.py` advances once per step,
/// after the optimiser). With the official `ipe_scale = 1` the last step uses
/// `end − (end − start)/K`, never `end` itself. Past `K·ipe_scale` steps (only when
/// `ipe_scale < 1`, where the official generator runs out) it stays at `end`.
pub fn momentum(start: f64, end: f64, ipe_scale: f64, progress: &Progress) -> f64 {
    let horizon = progress.total_steps as f64 * ipe_scale;
    if horizon <= 0.0 || progress.step as f64 >= horizon {
        return end;
    }
    start + progress.step as f64 * (end - start) / horizon
}
