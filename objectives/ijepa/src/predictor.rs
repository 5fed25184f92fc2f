//! I-JEPA's predictor (the official `VisionTransformerPredictor`): a narrow transformer that
//! reads the context encoder's tokens and one mask token per target patch, each with the fixed
//! sine–cosine embedding of its position, and outputs a prediction of the target encoder's
//! token for every target patch.

use candle_core::{bail, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_models::layer_norm::{layer_norm, LayerNorm};
use ssl_models::vit::sincos_2d;
use ssl_models::vit::Block;
use ssl_models::Linear;

use crate::ops::{apply_masks, repeat_interleave_batch};

/// The predictor's transformer blocks have an MLP of 4× their width (the official
/// `vit_predictor`).
const MLP_RATIO: usize = 4;

/// Layer-norm ε of the blocks and the final norm (the official `vit_predictor`'s
/// `partial(nn.LayerNorm, eps=1e-6)`).
const NORM_EPS: f64 = 1e-6;

/// Standard deviation of the initial linear weights and mask token (the official `init_std`).
const INIT_STD: f64 = 0.02;

/// The predictor, with the official state-dict keys under its `VarBuilder`: `predictor_embed`
/// (`E → P`), `mask_token` `[1, 1, P]`, `predictor_blocks.{i}` (timm's pre-norm blocks),
/// `predictor_norm`, `predictor_proj` (`P → E`). The official `predictor_pos_embed` is a fixed
/// buffer, a function of the patch grid: it is computed for each input's grid
/// ([`sincos_2d`]) rather than stored.
///
/// Initialisation as the released training code leaves it (`src/helper.py` `init_model`):
/// linear weights and the mask token N(0, 0.02²) (the official truncation at ±2 is ±100σ, so
/// the same draw), biases 0, layer norms 1 and 0. The predictor's constructor also divides each
/// block's `attn.proj` and `mlp.fc2` weights by `√(2·layer)` (`fix_init_weight`), but
/// `init_model` then re-draws every linear weight, undoing it; the released runs therefore
/// start without that rescaling, and so does this predictor.
#[derive(Debug, Clone)]
pub struct Predictor {
    embed: Linear,
    mask_token: Tensor,
    blocks: Vec<Block>,
    norm: LayerNorm,
    proj: Linear,
    embed_dim: usize,
    dim: usize,
}

/// A linear layer `in_dim → out_dim` with weight N(0, 0.02²) and bias 0.
fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let weight = vb.get_with_hints(
        (out_dim, in_dim),
        "weight",
        Init::Randn {
            mean: 0.0,
            stdev: INIT_STD,
        },
    )?;
    let bias = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
    Ok(Linear::new(weight, Some(bias)))
}

impl Predictor {
    /// A predictor from encoder width `embed_dim` (`E`) through `depth` blocks of width `dim`
    /// (`P`, a multiple of 4 and of `heads`) back to `E`.
    pub fn new(
        embed_dim: usize,
        dim: usize,
        depth: usize,
        heads: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        if embed_dim == 0 || dim == 0 || !dim.is_multiple_of(4) || heads == 0 {
            bail!(
                "I-JEPA predictor: the encoder width ({embed_dim}) must be at least 1, the \
                 predictor width ({dim}) a positive multiple of 4 (its 2D sine-cosine positions) \
                 and the heads ({heads}) at least 1"
            );
        }
        if !dim.is_multiple_of(heads) {
            bail!("I-JEPA predictor: width {dim} must split into {heads} heads");
        }
        Ok(Self {
            embed: linear(embed_dim, dim, vb.pp("predictor_embed"))?,
            mask_token: vb.get_with_hints(
                (1, 1, dim),
                "mask_token",
                Init::Randn {
                    mean: 0.0,
                    stdev: INIT_STD,
                },
            )?,
            blocks: (0..depth)
                .map(|i| {
                    Block::with_width(
                        dim,
                        heads,
                        MLP_RATIO,
                        vb.pp("predictor_blocks").pp(i.to_string()),
                    )
                })
                .collect::<Result<_>>()?,
            norm: layer_norm(dim, NORM_EPS, vb.pp("predictor_norm"))?,
            proj: linear(dim, embed_dim, vb.pp("predictor_proj"))?,
            embed_dim,
            dim,
        })
    }

    /// Width of the blocks `P`.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Width `E` of the encoder tokens it reads and predicts.
    pub fn embed_dim(&self) -> usize {
        self.embed_dim
    }

    /// The fixed positional embedding of a `gh × gw` grid, `[B, gh·gw, P]` (every image the
    /// same) in `dtype`, computed in double precision.
    fn positions(&self, batch: usize, (gh, gw): (usize, usize), like: &Tensor) -> Result<Tensor> {
        Tensor::from_vec(
            sincos_2d(self.dim, gh, gw),
            (1, gh * gw, self.dim),
            like.device(),
        )?
        .to_dtype(like.dtype())?
        .broadcast_as((batch, gh * gw, self.dim))?
        .contiguous()
    }

    /// Predictions of the target tokens, `[T·C·B, K_t, E]`, row `(t·C + c)·B + b` predicting
    /// target `t` of image `b` from its context `c` (the official order), from
    ///
    /// * `context`: the context encoder's output `[C·B, K_c, E]`, context mask `c`'s images in
    ///   rows `c·B ..` (as [`apply_masks`] stacks them);
    /// * `context_masks`: the `C` context masks, `[B, K_c]` u32 patch indices each;
    /// * `target_masks`: the `T` target masks, `[B, K_t]` u32 each;
    /// * `grid`: the images' patch grid `(H/p, W/p)`, the indices' row-major range.
    ///
    /// Embeds the context tokens to width `P` and adds their positions; per target mask, mask
    /// tokens plus the targets' positions are appended to every context; the blocks and the
    /// final norm run on the `K_c + K_t` tokens; the target rows are projected back to `E`.
    pub fn forward(
        &self,
        context: &Tensor,
        context_masks: &[Tensor],
        target_masks: &[Tensor],
        grid: (usize, usize),
    ) -> Result<Tensor> {
        let (rows, k_context, width) = context.dims3()?;
        let (contexts, targets) = (context_masks.len(), target_masks.len());
        if contexts == 0
            || targets == 0
            || !rows.is_multiple_of(contexts)
            || width != self.embed_dim
        {
            bail!(
                "I-JEPA predictor: expected context tokens [C·B, K, {}] for C = {contexts} \
                 context masks (at least 1) and at least one target mask ({targets} given), got \
                 {:?}",
                self.embed_dim,
                context.dims()
            );
        }
        let batch = rows / contexts;
        if let Some(mask) = context_masks
            .iter()
            .find(|m| m.dims() != [batch, k_context])
        {
            bail!(
                "I-JEPA predictor: each context mask must be [B, K] = [{batch}, {k_context}] like \
                 the context tokens {:?}, got {:?}",
                context.dims(),
                mask.dims()
            );
        }
        let positions = self.positions(batch, grid, context)?;
        let x = self
            .embed
            .forward(context)?
            .add(&apply_masks(&positions, context_masks)?)?;
        let target_positions =
            repeat_interleave_batch(&apply_masks(&positions, target_masks)?, batch, contexts)?; // [T·C·B, K_t, P]
        let k_target = target_positions.dim(1)?;
        let queries = self
            .mask_token
            .to_dtype(context.dtype())?
            .broadcast_add(&target_positions)?;
        let mut h = Tensor::cat(&[&x.repeat((targets, 1, 1))?, &queries], 1)?;
        for block in &self.blocks {
            h = block.forward(&h)?;
        }
        let h = self.norm.forward(&h)?.narrow(1, k_context, k_target)?;
        self.proj.forward(&h)
    }
}
