//! MAE's decoder (the official `forward_decoder`): the encoder's tokens of the visible patches
//! are embedded to the decoder's width, a shared learned mask token stands in for every removed
//! patch, the sequence is put back in patch order, the fixed sine–cosine positions are added,
//! and a few transformer blocks, a LayerNorm and a linear layer predict every patch's pixels.

use candle_core::{bail, Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};
use ssl_models::layer_norm::{layer_norm, LayerNorm};
use ssl_models::vit::{sincos_positions, Block};
use ssl_models::Linear;

/// The decoder's MLP width over its token width (the official decoders use the encoder's, 4).
pub const DECODER_MLP_RATIO: usize = 4;

/// Sizes of a [`MaeDecoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Width `E` of the encoder tokens it reads.
    pub encoder_dim: usize,
    /// Its token width `D` (a multiple of 4 and of `heads`).
    pub dim: usize,
    /// Transformer blocks.
    pub depth: usize,
    pub heads: usize,
    /// Values predicted per patch, `p·p·C`.
    pub patch_values: usize,
}

/// A linear layer initialised as the official MAE's: Xavier-uniform weight
/// (±√(6/(fan_in + fan_out))), zero bias.
fn xavier_linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let bound = (6.0 / (in_dim + out_dim) as f64).sqrt();
    let weight = vb.get_with_hints(
        (out_dim, in_dim),
        "weight",
        Init::Uniform {
            lo: -bound,
            up: bound,
        },
    )?;
    let bias = vb.get_with_hints(out_dim, "bias", Init::Const(0.0))?;
    Ok(Linear::new(weight, Some(bias)))
}

/// MAE's decoder, keyed as the official state dict under the objective's prefix:
/// `decoder_embed`, `mask_token`, `decoder_blocks.{i}`, `decoder_norm`, `decoder_pred`.
#[derive(Debug, Clone)]
pub struct MaeDecoder {
    embed: Linear,
    mask_token: Tensor,
    blocks: Vec<Block>,
    norm: LayerNorm,
    pred: Linear,
    cfg: DecoderConfig,
}

impl MaeDecoder {
    /// A decoder of `cfg`'s sizes, initialised as the official one: Xavier-uniform linear
    /// layers with zero biases (the blocks' too), LayerNorms at 1 and 0, mask token
    /// N(0, 0.02²).
    pub fn new(cfg: DecoderConfig, vb: VarBuilder) -> Result<Self> {
        let (e, d) = (cfg.encoder_dim, cfg.dim);
        if d == 0 || !d.is_multiple_of(4) || cfg.heads == 0 || !d.is_multiple_of(cfg.heads) {
            bail!(
                "MAE decoder: its width {d} must be a positive multiple of 4 (the 2D sine-cosine \
                 positions) and of its {} heads",
                cfg.heads
            );
        }
        let blocks = (0..cfg.depth)
            .map(|i| {
                let vb = vb.pp("decoder_blocks").pp(i.to_string());
                // The official init: created here first, the block then reads these variables.
                let hidden = DECODER_MLP_RATIO * d;
                xavier_linear(d, 3 * d, vb.pp("attn").pp("qkv"))?;
                xavier_linear(d, d, vb.pp("attn").pp("proj"))?;
                xavier_linear(d, hidden, vb.pp("mlp").pp("fc1"))?;
                xavier_linear(hidden, d, vb.pp("mlp").pp("fc2"))?;
                Block::with_width(d, cfg.heads, DECODER_MLP_RATIO, vb)
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            embed: xavier_linear(e, d, vb.pp("decoder_embed"))?,
            mask_token: vb.get_with_hints(
                (1, 1, d),
                "mask_token",
                Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            )?,
            blocks,
            norm: layer_norm(d, 1e-6, vb.pp("decoder_norm"))?,
            pred: xavier_linear(d, cfg.patch_values, vb.pp("decoder_pred"))?,
            cfg,
        })
    }

    /// Its sizes.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// The predicted pixels of every patch, `[N, L, p·p·C]` in patch order, from the encoder's
    /// class token `cls` `[N, E]` and visible patch tokens `visible` `[N, K, E]` (in the order
    /// of the mask's `keep`), with `restore` `[N, L]` u32 (the mask's restoring permutation:
    /// patch `l` is at position `restore[n, l]` of `[visible; mask tokens]`) on a `gh × gw`
    /// patch grid.
    pub fn forward(
        &self,
        cls: &Tensor,
        visible: &Tensor,
        restore: &Tensor,
        grid: (usize, usize),
    ) -> Result<Tensor> {
        let (n, kept, e) = visible.dims3()?;
        let (rn, len) = restore.dims2()?;
        if cls.dims() != [n, e] || e != self.cfg.encoder_dim || rn != n {
            bail!(
                "MAE decoder: expected a class token [N, {0}] and visible tokens [N, K, {0}] for \
                 N = {n} restore rows; got {1:?} and {2:?} with {rn} rows",
                self.cfg.encoder_dim,
                cls.dims(),
                visible.dims()
            );
        }
        if len != grid.0 * grid.1 || kept > len {
            bail!(
                "MAE decoder: {kept} visible of {len} patches on a {} × {} grid",
                grid.0,
                grid.1
            );
        }
        let d = self.cfg.dim;
        let tokens = Tensor::cat(&[&cls.unsqueeze(1)?, visible], 1)?;
        let x = self.embed.forward(&tokens)?;
        let mut patches = x.narrow(1, 1, kept)?;
        if kept < len {
            let masked = self
                .mask_token
                .to_dtype(x.dtype())?
                .broadcast_as((n, len - kept, d))?
                .contiguous()?;
            patches = Tensor::cat(&[&patches, &masked], 1)?;
        }
        let index = restore
            .unsqueeze(2)?
            .broadcast_as((n, len, d))?
            .contiguous()?;
        let patches = patches.contiguous()?.gather(&index, 1)?;
        let x = Tensor::cat(&[&x.narrow(1, 0, 1)?, &patches], 1)?;
        let mut x = x.broadcast_add(&sincos_positions(d, grid, x.dtype(), x.device())?)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        let x = self.pred.forward(&self.norm.forward(&x)?)?;
        x.narrow(1, 1, len)
    }
}
