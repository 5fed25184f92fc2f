//! Vision Transformer: Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for
//! Image Recognition at Scale", ICLR 2021 (Eq. 1–4: patch embedding, class token, learned
//! positional embedding, pre-norm blocks of multi-head self-attention and a GELU MLP, final
//! LayerNorm), in timm's layout: the keys are those of `timm.create_model(
//! 'vit_small_patch16_224')` without its `head`, so converted timm weights load unchanged.
//!
//! `[N, C, H, W]` → `[N, D]`, the class token after the final norm ([`VitPool::Class`]), or the
//! mean of the patch tokens after it ([`VitPool::Mean`], how I-JEPA evaluates its encoder).
//! [`VisionTransformer::forward_tokens`] returns the patch tokens too, and runs the encoder on
//! a subset of the patches of each image (the masked encoders of MAE and I-JEPA). The 16×16
//! stride-16 patch convolution is a reshape into patches and one matmul. Inputs of another size
//! than [`VitConfig::img_size`] (multi-crop's local views) get the positional embedding of the
//! patch grid resampled as timm's `resample_abs_pos_embed` does (PyTorch's antialiased
//! bicubic), as one differentiable matrix product. Initialisation as timm: positional
//! embedding N(0, 0.02²) (timm truncates at ±2, i.e. ±100σ: the same draw), class token
//! N(0, 10⁻¹²), linear weights N(0, 0.02²) with zero biases, the patch projection PyTorch's
//! default convolution init. [`PosEmbed::Sincos`] replaces the learned positional embedding by
//! the fixed 2D sine–cosine one of MAE's and I-JEPA's encoders. No dropout or drop-path
//! (timm's defaults), so train and eval modes compute the same function.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use crate::attention::multi_head_attention;
use crate::autocast::matmul;
use crate::gelu::gelu_erf;
use crate::layer_norm::{layer_norm, LayerNorm};
use crate::{Encoder, Linear};
use ssl_core::{TokenEncoder, Tokens};

pub mod positions;

pub use positions::{sincos_2d, sincos_positions};

/// What [`VisionTransformer::forward`] returns of its output tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VitPool {
    /// The class token (timm's `global_pool='token'`; MAE's linear probe).
    #[default]
    Class,
    /// The mean of the patch tokens after the final norm (I-JEPA's evaluation).
    Mean,
}

/// Where a ViT's tokens get their positions from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PosEmbed {
    /// A learned `pos_embed` `[1, 1 + L, D]`, initialised N(0, 0.02²) (ViT, timm), resampled
    /// for other grids.
    #[default]
    Learned,
    /// The fixed 2D sine–cosine embedding of MAE's and I-JEPA's encoders, with a zero row for
    /// the class token ([`sincos_positions`]): computed for each grid, not trained, not among
    /// the weights.
    Sincos,
}

/// Size of a ViT.
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    pub patch_size: usize,
    /// Token width `D`.
    pub embed_dim: usize,
    /// Transformer blocks.
    pub depth: usize,
    pub num_heads: usize,
    /// MLP hidden width / `D`.
    pub mlp_ratio: usize,
    pub in_channels: usize,
    /// Side of the images the positional embedding is learned for.
    pub img_size: usize,
    pub pool: VitPool,
    pub pos_embed: PosEmbed,
}

impl VitConfig {
    fn with(embed_dim: usize, num_heads: usize) -> Self {
        Self {
            patch_size: 16,
            embed_dim,
            depth: 12,
            num_heads,
            mlp_ratio: 4,
            in_channels: 3,
            img_size: 224,
            pool: VitPool::Class,
            pos_embed: PosEmbed::Learned,
        }
    }

    /// ViT-T/16: width 192, 3 heads.
    pub fn tiny() -> Self {
        Self::with(192, 3)
    }

    /// ViT-S/16: width 384, 6 heads (IConE's 2D encoder).
    pub fn small() -> Self {
        Self::with(384, 6)
    }

    /// ViT-B/16: width 768, 12 heads.
    pub fn base() -> Self {
        Self::with(768, 12)
    }

    fn grid(&self) -> usize {
        self.img_size / self.patch_size
    }
}

/// A linear layer with timm's ViT init: weight N(0, 0.02²), bias 0.
fn vit_linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let w = vb.get_with_hints(
        (out_dim, in_dim),
        "weight",
        Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        },
    )?;
    let b = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
    Ok(Linear::new(w, Some(b)))
}

/// A pre-norm transformer block, `blocks.{i}` of a ViT: `x + attn(norm1(x))`, then
/// `x + mlp(norm2(x))`; also the blocks of MAE's decoder and I-JEPA's predictor.
#[derive(Debug, Clone)]
pub struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    heads: usize,
}

impl Block {
    fn new(cfg: &VitConfig, vb: VarBuilder) -> Result<Self> {
        Self::with_width(cfg.embed_dim, cfg.num_heads, cfg.mlp_ratio, vb)
    }

    /// A block of width `d` with `heads` attention heads and an MLP of `mlp_ratio·d` hidden
    /// units, initialised as timm's ViT blocks.
    pub fn with_width(d: usize, heads: usize, mlp_ratio: usize, vb: VarBuilder) -> Result<Self> {
        if d == 0 || !d.is_multiple_of(heads) {
            candle_core::bail!("transformer block: width {d} must split into {heads} heads");
        }
        let hidden = d * mlp_ratio;
        Ok(Self {
            norm1: layer_norm(d, 1e-6, vb.pp("norm1"))?,
            qkv: vit_linear(d, 3 * d, vb.pp("attn").pp("qkv"))?,
            proj: vit_linear(d, d, vb.pp("attn").pp("proj"))?,
            norm2: layer_norm(d, 1e-6, vb.pp("norm2"))?,
            fc1: vit_linear(d, hidden, vb.pp("mlp").pp("fc1"))?,
            fc2: vit_linear(hidden, d, vb.pp("mlp").pp("fc2"))?,
            heads,
        })
    }

    /// Multi-head self-attention of `x`: `[N, T, D]` (softmax(QKᵀ/√d_head) V per head).
    fn attention(&self, x: &Tensor) -> Result<Tensor> {
        self.proj
            .forward(&multi_head_attention(&self.qkv.forward(x)?, self.heads)?)
    }

    /// `[N, T, D]` → `[N, T, D]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = (x + self.attention(&self.norm1.forward(x)?)?)?;
        self.mlp_residual(&x)
    }

    /// `x + mlp(norm2(x))`, row by row.
    fn mlp_residual(&self, x: &Tensor) -> Result<Tensor> {
        let h = gelu_erf(&self.fc1.forward(&self.norm2.forward(x)?)?)?;
        x + self.fc2.forward(&h)?
    }

    /// The class token's row of [`Block::forward`], `[N, T, D]` → `[N, D]`: attention reads
    /// every token, but after it each row is on its own, so the output projection, the MLP and
    /// the residual adds run on the class token's row alone. For the last block, whose other
    /// rows the encoder drops, that is three quarters of its linear layers' work left out.
    fn forward_class_token(&self, x: &Tensor) -> Result<Tensor> {
        let mixed = multi_head_attention(&self.qkv.forward(&self.norm1.forward(x)?)?, self.heads)?;
        let class = |t: &Tensor| t.narrow(1, 0, 1)?.squeeze(1);
        let x = (class(x)? + self.proj.forward(&class(&mixed)?)?)?;
        self.mlp_residual(&x)
    }
}

/// The weights `[n_out, n_in]` with which timm's `resample_abs_pos_embed` (PyTorch's
/// `interpolate(mode='bicubic', antialias=True, align_corners=False)`) resamples `n_in`
/// positions to `n_out`: the cubic filter with `a = −0.5`, widened by `n_in/n_out` when
/// shrinking, truncated at the borders and normalised to sum 1 per output.
pub fn resample_matrix(n_in: usize, n_out: usize) -> Vec<f64> {
    const A: f64 = -0.5;
    let filter = |x: f64| {
        let x = x.abs();
        if x < 1.0 {
            ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            (((x - 5.0) * x + 8.0) * x - 4.0) * A
        } else {
            0.0
        }
    };
    let scale = n_in as f64 / n_out as f64;
    let (support, inv) = match scale >= 1.0 {
        true => (2.0 * scale, 1.0 / scale),
        false => (2.0, 1.0),
    };
    let mut m = vec![0.0; n_out * n_in];
    for (i, row) in m.chunks_mut(n_in).enumerate() {
        let centre = scale * (i as f64 + 0.5);
        // PyTorch truncates towards zero before clamping.
        let first = ((centre - support + 0.5) as i64).max(0) as usize;
        let end = ((centre + support + 0.5) as i64).min(n_in as i64) as usize;
        for (j, w) in row.iter_mut().enumerate().take(end).skip(first) {
            *w = filter((j as f64 - centre + 0.5) * inv);
        }
        let total: f64 = row.iter().sum();
        row.iter_mut().for_each(|w| *w /= total);
    }
    m
}

/// `patches[n, keep[n, k]]`: `[N, L, D]`, `keep` `[N, K]` u32 with `L = gh·gw` → `[N, K, D]`,
/// one row gather of the flattened batch (its backward adds the gradients back into the
/// gathered rows).
fn gather_patches(patches: &Tensor, keep: &Tensor, (gh, gw): (usize, usize)) -> Result<Tensor> {
    let (n, l, d) = patches.dims3()?;
    let fix = "pass [N, K] u32 indices of the patches to keep per image, each below gh·gw";
    let k = match keep.dims() {
        &[rows, k] if rows == n && k > 0 => k,
        dims => candle_core::bail!(
            "ViT: keep must be [N, K] = [{n}, K] with K ≥ 1 for a batch of {n} images \
             of {gh}×{gw} patches, got a keep tensor of shape {dims:?}; {fix}"
        ),
    };
    if keep.dtype() != DType::U32 {
        candle_core::bail!(
            "ViT: keep must hold u32 patch indices, got {:?}; {fix}",
            keep.dtype()
        );
    }
    let largest = keep.flatten_all()?.max(0)?.to_scalar::<u32>()? as usize;
    if largest >= l {
        candle_core::bail!(
            "ViT: keep (shape {:?}) names patch {largest}, but the images have {gh}×{gw} = {l} \
             patches (indices 0..{l}); {fix}",
            keep.dims()
        );
    }
    // Row `keep[n, k]` of image n is row `n·L + keep[n, k]` of the flattened batch.
    let offsets: Vec<u32> = (0..n).map(|i| (i * l) as u32).collect();
    let rows = keep
        .broadcast_add(&Tensor::from_vec(offsets, (n, 1), keep.device())?)?
        .flatten_all()?;
    patches
        .reshape((n * l, d))?
        .index_select(&rows, 0)?
        .reshape((n, k, d))
}

/// ViT encoder with keys `cls_token`, `pos_embed` (learned positions only),
/// `patch_embed.proj.*`, `blocks.{i}.*`, `norm.*`.
#[derive(Debug, Clone)]
pub struct VisionTransformer {
    cfg: VitConfig,
    /// The patch projection as a matrix `[D, C·p·p]` (the conv weight `[D, C, p, p]` reshaped).
    patch_weight: Tensor,
    patch_bias: Tensor,
    cls_token: Tensor,
    /// The positions of the configured grid, `[1, 1 + L, D]` (a parameter when learned).
    pos_embed: Tensor,
    blocks: Vec<Block>,
    norm: LayerNorm,
}

impl VisionTransformer {
    pub fn new(cfg: &VitConfig, vb: VarBuilder) -> Result<Self> {
        if cfg.pos_embed == PosEmbed::Sincos && !cfg.embed_dim.is_multiple_of(4) {
            candle_core::bail!(
                "ViT: fixed sine-cosine positions need a width that is a multiple of 4, got {}; \
                 use learned positions (model.pos_embed: learned)",
                cfg.embed_dim
            );
        }
        if !cfg.embed_dim.is_multiple_of(cfg.num_heads) || cfg.patch_size == 0 || cfg.grid() == 0 {
            candle_core::bail!(
                "ViT: width {} must split into {} heads, and the image side {} hold a patch of {}",
                cfg.embed_dim,
                cfg.num_heads,
                cfg.img_size,
                cfg.patch_size
            );
        }
        let (d, p, c) = (cfg.embed_dim, cfg.patch_size, cfg.in_channels);
        let normal = |stdev: f64| Init::Randn { mean: 0.0, stdev };
        let bound = 1.0 / ((c * p * p) as f64).sqrt();
        let uniform = Init::Uniform {
            lo: -bound,
            up: bound,
        };
        let pe = vb.pp("patch_embed").pp("proj");
        let patch_weight = pe
            .get_with_hints((d, c, p, p), "weight", uniform)?
            .reshape((d, c * p * p))?;
        let patch_bias = pe.get_with_hints(d, "bias", uniform)?;
        let g = cfg.grid();
        let pos_embed = match cfg.pos_embed {
            PosEmbed::Learned => vb.get_with_hints((1, 1 + g * g, d), "pos_embed", normal(0.02))?,
            PosEmbed::Sincos => sincos_positions(d, (g, g), vb.dtype(), vb.device())?,
        };
        Ok(Self {
            cls_token: vb.get_with_hints((1, 1, d), "cls_token", normal(1e-6))?,
            pos_embed,
            blocks: (0..cfg.depth)
                .map(|i| Block::new(cfg, vb.pp("blocks").pp(i.to_string())))
                .collect::<Result<_>>()?,
            norm: layer_norm(d, 1e-6, vb.pp("norm"))?,
            patch_weight,
            patch_bias,
            cfg: cfg.clone(),
        })
    }

    /// Patch tokens `[N, gh·gw, D]` of `x`: `[N, C, H, W]`.
    fn embed_patches(&self, x: &Tensor) -> Result<(Tensor, usize, usize)> {
        let (n, c, h, w) = x.dims4()?;
        let p = self.cfg.patch_size;
        if c != self.cfg.in_channels || h % p != 0 || w % p != 0 {
            candle_core::bail!(
                "ViT/{p} takes [N, {}, H, W] images with H and W multiples of {p}, got {:?}; \
                 resize or crop the images (e.g. --size {})",
                self.cfg.in_channels,
                x.dims(),
                (h.max(p) / p) * p
            );
        }
        let (gh, gw) = (h / p, w / p);
        // [N, C, gh, p, gw, p] → [N, gh, gw, C, p, p] → [N·gh·gw, C·p·p]
        let patches = x
            .reshape((n, c, gh, p, gw, p))?
            .permute((0, 2, 4, 1, 3, 5))?
            .contiguous()?
            .reshape((n * gh * gw, c * p * p))?;
        let tokens = matmul(&patches, &self.patch_weight.t()?)?
            .broadcast_add(&self.patch_bias)?
            .reshape((n, gh * gw, self.cfg.embed_dim))?;
        Ok((tokens, gh, gw))
    }

    /// The positional embedding for a `gh × gw` patch grid: `[1, 1 + gh·gw, D]`, the learned
    /// one resampled or the fixed one computed for it.
    fn positions(&self, gh: usize, gw: usize) -> Result<Tensor> {
        let g = self.cfg.grid();
        if (gh, gw) == (g, g) {
            return Ok(self.pos_embed.clone());
        }
        let d = self.cfg.embed_dim;
        if self.cfg.pos_embed == PosEmbed::Sincos {
            return sincos_positions(d, (gh, gw), self.pos_embed.dtype(), self.pos_embed.device());
        }
        let cls = self.pos_embed.narrow(1, 0, 1)?;
        let grid = self.pos_embed.narrow(1, 1, g * g)?.reshape((g * g, d))?;
        // Separable resampling as one Kronecker-product matrix [gh·gw, g·g].
        let (mh, mw) = (resample_matrix(g, gh), resample_matrix(g, gw));
        let mut kron = vec![0f32; gh * gw * g * g];
        for (i, j, a, b) in (0..gh).flat_map(|i| {
            (0..gw).flat_map(move |j| (0..g).flat_map(move |a| (0..g).map(move |b| (i, j, a, b))))
        }) {
            kron[(i * gw + j) * g * g + a * g + b] = (mh[i * g + a] * mw[j * g + b]) as f32;
        }
        let kron =
            Tensor::from_vec(kron, (gh * gw, g * g), grid.device())?.to_dtype(grid.dtype())?;
        let resampled = kron.matmul(&grid)?.reshape((1, gh * gw, d))?;
        Tensor::cat(&[&cls, &resampled], 1)
    }

    /// The encoder's input tokens `[N, 1 + K, D]`: the class token, then the patch tokens of
    /// `x`: `[N, C, H, W]`, each with its positional embedding added before the patches named
    /// by `keep` (`[N, K]` u32, per sample) are gathered; all `gh·gw` patches in order without
    /// `keep`.
    fn input_tokens(&self, x: &Tensor, keep: Option<&Tensor>) -> Result<Tensor> {
        let (tokens, gh, gw) = self.embed_patches(x)?;
        let (n, d) = (tokens.dim(0)?, self.cfg.embed_dim);
        let positions = self.positions(gh, gw)?;
        let patches = tokens.broadcast_add(&positions.narrow(1, 1, gh * gw)?)?;
        let patches = match keep {
            Some(keep) => gather_patches(&patches, keep, (gh, gw))?,
            None => patches,
        };
        let cls = (&self.cls_token + positions.narrow(1, 0, 1)?)?.broadcast_as((n, 1, d))?;
        Tensor::cat(&[&cls, &patches], 1)
    }

    /// Every output token: the class token and the patch tokens after the final norm. With
    /// `keep` (`[N, K]` u32 patch indices per sample, row-major over the `gh × gw` patch grid
    /// of `x`: `[N, C, H, W]`), only those `K` patches enter the encoder, each with its own
    /// positional embedding (added before the gather, as MAE's and I-JEPA's encoders do): the
    /// blocks run on `1 + K` tokens, so the masked patches cost nothing. `patches[n, k]` is
    /// the output of patch `keep[n, k]`; without `keep`, of patch `k`.
    ///
    /// Checking the indices reads `keep` back to the host (a wait on a GPU for its upload).
    pub fn forward_tokens(&self, x: &Tensor, keep: Option<&Tensor>) -> Result<Tokens> {
        let mut h = self.input_tokens(x, keep)?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        let h = self.norm.forward(&h)?;
        let patches = h.dim(1)? - 1;
        Ok(Tokens {
            cls: h.narrow(1, 0, 1)?.squeeze(1)?,
            patches: h.narrow(1, 1, patches)?,
        })
    }

    /// `[N, C, H, W]` → `[N, D]`: the class token of [`VisionTransformer::forward_tokens`]
    /// without a mask, or the mean of its patch tokens ([`VitConfig::pool`]).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.cfg.pool == VitPool::Mean {
            return self.forward_tokens(x, None)?.patches.mean(1);
        }
        let mut h = self.input_tokens(x, None)?;
        let Some((last, blocks)) = self.blocks.split_last() else {
            return self.norm.forward(&h.narrow(1, 0, 1)?.squeeze(1)?);
        };
        for block in blocks {
            h = block.forward(&h)?;
        }
        // Only the class token leaves the encoder: the last block computes its row alone.
        self.norm.forward(&last.forward_class_token(&h)?)
    }

    /// Token width `D`.
    pub fn output_dim(&self) -> usize {
        self.cfg.embed_dim
    }
}

impl Encoder for VisionTransformer {
    /// Train and eval modes are the same function (no dropout, no batch norm).
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        self.forward(x)
    }
    fn output_dim(&self) -> usize {
        self.cfg.embed_dim
    }
    fn tokens(&self) -> Option<&dyn TokenEncoder> {
        Some(self)
    }
}

impl TokenEncoder for VisionTransformer {
    fn patch_size(&self) -> usize {
        self.cfg.patch_size
    }
    fn token_dim(&self) -> usize {
        self.cfg.embed_dim
    }
    fn forward_tokens(&self, x: &Tensor, keep: Option<&Tensor>) -> Result<Tokens> {
        VisionTransformer::forward_tokens(self, x, keep)
    }
}

#[cfg(test)]
mod tests;
