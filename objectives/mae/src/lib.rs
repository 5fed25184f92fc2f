//! MAE: masked autoencoders. Each view loses a random 75 % of its patches; the encoder sees only
//! the rest, and a light transformer decoder reconstructs the pixels of the removed patches.
//!
//! He, Chen, Xie, Li, Dollár, Girshick, "Masked Autoencoders Are Scalable Vision Learners",
//! CVPR 2022 (official code: github.com/facebookresearch/mae, `models_mae.py`). Spec:
//! `docs/spec/objectives.md` §2.27; masks §3.1 (`ssl_masking::random_masking`).
//!
//! Per global view `x` `[B, C, H, W]` (MAE takes no local crops), with `p` the encoder's patch
//! size and `L = (H/p)(W/p)` patches:
//!
//! * **mask**: per image, uniform noise over the `L` patches, sorted; the `K = ⌊L(1 − r)⌋`
//!   lowest are kept ([`ssl_masking::draw_random_masking`], drawn from the run's seed and step
//!   on stream [`mask_stream`]`(v)`, so every view has its own mask, the same after `--resume`
//!   and on every worker).
//! * **encoder**: the ViT on the `K` visible patches and its class token
//!   ([`ssl_core::TokenEncoder::forward_tokens`]).
//! * **decoder** ([`MaeDecoder`]): `[cls; visible]` embedded to width `D`, `L − K` copies of a
//!   learned mask token appended, unshuffled to patch order, fixed 2D sine–cosine positions
//!   added (a zero row for the class token), blocks, LayerNorm, a linear layer to `p·p·C`
//!   values per patch; the class row is dropped.
//! * **loss** ([`mae_loss`]): the target is [`patchify`]`(x)` (per patch: pixel row, column,
//!   channel), with `norm_pix_loss` each patch normalised by its own mean and unbiased variance,
//!   `(t − μ)/√(σ² + 10⁻⁶)`; the per-patch mean squared error is averaged over the removed
//!   patches only. The objective's loss is the mean over the views, logged as `reconstruction`.
//!
//! The objective's embedding of a view (the trainer's spectrum of the training batches) is the
//! class token of the visible patches; the online probe and the final evaluation read the
//! encoder on whole views. The official encoder's positions are the fixed 2D sine–cosine ones
//! (`model.pos_embed: sincos`); the project's ViT learns them by default.
//!
//! Defaults are the paper's (ViT-B/L/H): `mask_ratio` 0.75, `norm_pix_loss` true, a decoder of
//! width 512, depth 8 and 16 heads (MLP ratio 4, LayerNorm ε 10⁻⁶). That decoder is wider than
//! a ViT-T (192) or ViT-S (384) encoder; for those a lighter one is the usual choice, e.g.
//! `--set objective.params.decoder_dim=256 --set objective.params.decoder_depth=4
//! --set objective.params.decoder_heads=8`
//! (the paper's ablations, Table 1a–b, find narrower and shallower decoders cost little
//! fine-tuning accuracy and some linear-probe accuracy). The decoder predicts the pixels of
//! the encoder's patches, whose side and channels it is built for
//! ([`ssl_core::BuildContext::patches`]).
//!
//! Masks are drawn from the run's seed and step for the global batch, each data-parallel
//! worker keeping its own instances' rows, so several workers mask as one process does.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_mae::{mae_loss, patchify};
//!
//! # fn main() -> candle_core::Result<()> {
//! // One grey 2 × 4 image, two 2 × 2 patches; the first removed, the second visible.
//! let image = Tensor::new(&[[[[1f64, 2., 5., 6.], [3., 4., 7., 8.]]]], &Device::Cpu)?;
//! let target = patchify(&image, 2)?; // [1, 2, 4]
//! assert_eq!(target.to_vec3::<f64>()?, [[[1., 2., 3., 4.], [5., 6., 7., 8.]]]);
//! let pred = Tensor::zeros((1, 2, 4), candle_core::DType::F64, &Device::Cpu)?;
//! let mask = Tensor::new(&[[1f64, 0.]], &Device::Cpu)?; // 1 = removed
//! // Raw pixels: the mean square of the removed patch, (1 + 4 + 9 + 16)/4.
//! let raw = mae_loss(&pred, &target, &mask, false)?.to_scalar::<f64>()?;
//! assert_eq!(raw, 7.5);
//! // Normalised pixels: Σ(t − μ)²/4 over the unbiased variance 5/3 (+ 10⁻⁶), about 3/4.
//! let normalised = mae_loss(&pred, &target, &mask, true)?.to_scalar::<f64>()?;
//! assert!((normalised - 1.25 / (5.0 / 3.0 + 1e-6)).abs() < 1e-15);
//! # Ok(())
//! # }
//! ```

pub mod decoder;
pub mod pixels;

#[cfg(test)]
mod tests;

pub use decoder::{DecoderConfig, MaeDecoder, DECODER_MLP_RATIO};
pub use pixels::{mae_loss, normalize_pixels, patchify, unpatchify, NORM_PIX_EPS};

use anyhow::{bail, ensure, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig, Patches,
    PixelBatch, PixelLoss, Requirements, TokenEncoder,
};
use ssl_masking::{draw_random_masking, RandomMask, RANDOM_MASKING_STREAM};

/// The [`ssl_core::Progress::rng`] stream of global view `view`'s mask: view 0 draws from
/// [`RANDOM_MASKING_STREAM`] (as [`ssl_masking::random_masking_for_step`]), view `v` from the
/// `v`-th stream after it.
pub fn mask_stream(view: usize) -> u64 {
    RANDOM_MASKING_STREAM.wrapping_add(view as u64)
}

/// One masked view through the encoder and the decoder.
pub struct Reconstruction {
    /// Predicted pixels `[N, L, p·p·C]`, in patch order.
    pub pred: Tensor,
    /// The encoder's class token of the visible patches, `[N, E]`.
    pub cls: Tensor,
    /// `[N, L]`, 1 where the patch was removed, in the dtype of `pred`.
    pub mask: Tensor,
}

/// `images` `[N, C, H, W]` with the patches `mask` removes left out of `encoder`, then
/// reconstructed by `decoder`.
pub fn reconstruct(
    encoder: &dyn TokenEncoder,
    decoder: &MaeDecoder,
    images: &Tensor,
    mask: &RandomMask,
) -> candle_core::Result<Reconstruction> {
    let (n, _, h, w) = images.dims4()?;
    let p = encoder.patch_size();
    let grid = (h / p, w / p);
    if h % p != 0 || w % p != 0 || mask.keep.images() != n || mask.patches() != grid.0 * grid.1 {
        candle_core::bail!(
            "MAE: a mask of {} images × {} patches for {n} images of {h} × {w} pixels in {p}-px \
             patches",
            mask.keep.images(),
            mask.patches()
        );
    }
    let device = images.device();
    let tokens = encoder.forward_tokens(images, Some(&mask.keep.to_tensor(device)?))?;
    let pred = decoder.forward(
        &tokens.cls,
        &tokens.patches,
        &mask.restore_tensor(device)?,
        grid,
    )?;
    let mask = mask.mask_tensor(device)?.to_dtype(pred.dtype())?;
    Ok(Reconstruction {
        pred,
        cls: tokens.cls,
        mask,
    })
}

/// MAE hyper-parameters (the paper's defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaeConfig {
    /// Fraction of each view's patches removed (0.75).
    pub mask_ratio: f64,
    /// Normalise every target patch by its own mean and variance (true, the paper's default).
    pub norm_pix_loss: bool,
    /// Decoder token width (512).
    pub decoder_dim: usize,
    /// Decoder transformer blocks (8).
    pub decoder_depth: usize,
    /// Decoder attention heads (16).
    pub decoder_heads: usize,
}

impl Default for MaeConfig {
    fn default() -> Self {
        Self {
            mask_ratio: 0.75,
            norm_pix_loss: true,
            decoder_dim: 512,
            decoder_depth: 8,
            decoder_heads: 16,
        }
    }
}

impl ObjectiveConfig for MaeConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.mask_ratio.is_finite() && self.mask_ratio > 0.0 && self.mask_ratio < 1.0,
            "`mask_ratio` is the fraction of patches removed and must lie in (0, 1): 0 leaves \
             nothing to reconstruct, 1 nothing to encode (MAE uses 0.75), got {}",
            self.mask_ratio
        );
        ensure!(
            self.decoder_heads >= 1,
            "`decoder_heads` must be at least 1 (MAE uses 16), got 0"
        );
        ensure!(
            self.decoder_dim > 0
                && self.decoder_dim.is_multiple_of(4)
                && self.decoder_dim.is_multiple_of(self.decoder_heads),
            "`decoder_dim` must be a positive multiple of 4 (the 2D sine-cosine positions) and of \
             `decoder_heads` ({}); MAE uses 512 with 16 heads, got {}",
            self.decoder_heads,
            self.decoder_dim
        );
        ensure!(
            self.decoder_depth >= 1,
            "`decoder_depth` must be at least 1 transformer block (MAE uses 8), got 0"
        );
        Ok(())
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let Some(patches) = ctx.patches else {
            bail!(
                "objective `mae` reconstructs the pixels of the encoder's patches, and the encoder \
                 has none; use a ViT (--set model.encoder=vit_t16, with model.patch_size=4 on the \
                 16-px digits)"
            );
        };
        ensure!(
            !self.norm_pix_loss || patches.values() >= 2,
            "`norm_pix_loss` normalises each patch by its variance, and a 1-px single-channel \
             patch has none; use norm_pix_loss: false or larger patches (model.patch_size)"
        );
        if ctx.views > ctx.global_views {
            bail!(
                "objective `mae` masks and reconstructs full-size views and takes no local crops; \
                 got {} local crops (--local-views {}); use --local-views 0",
                ctx.views - ctx.global_views,
                ctx.views - ctx.global_views
            );
        }
        let decoder = MaeDecoder::new(
            DecoderConfig {
                encoder_dim: ctx.feature_dim,
                dim: self.decoder_dim,
                depth: self.decoder_depth,
                heads: self.decoder_heads,
                patch_values: patches.values(),
            },
            ctx.vb.clone(),
        )?;
        Ok(Box::new(Mae {
            cfg: self.clone(),
            patches,
            decoder,
        }))
    }
}

/// The MAE objective: its decoder and configuration.
pub struct Mae {
    cfg: MaeConfig,
    /// The encoder's patches, whose pixels the decoder predicts.
    patches: Patches,
    decoder: MaeDecoder,
}

impl Mae {
    /// Its decoder.
    pub fn decoder(&self) -> &MaeDecoder {
        &self.decoder
    }

    /// Checks a view and the encoder against the patches the decoder was built for; returns the
    /// view's patch grid.
    fn check_view(&self, view: &Tensor, p: usize) -> Result<(usize, usize)> {
        let (_, c, h, w) = view.dims4()?;
        let Patches { size, channels, .. } = self.patches;
        ensure!(
            (p, c) == (size, channels),
            "objective `mae` was built to predict {size}-px patches of {channels} channels, and \
             is given an encoder of {p}-px patches on {c}-channel views; build it for the run's \
             encoder and images"
        );
        ensure!(
            h % p == 0 && w % p == 0,
            "objective `mae` cuts the views into {p}-px patches, and they are {h} × {w}; use an \
             image size that is a multiple of {p}"
        );
        Ok((h / p, w / p))
    }
}

impl Objective for Mae {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 1,
            projector: false,
            pixels: true,
            ..Requirements::default()
        }
    }

    fn pixel_loss(&mut self, batch: &PixelBatch<'_>) -> Result<PixelLoss> {
        let views = batch.global_views;
        ensure!(
            views >= 1 && views == batch.views.len(),
            "objective `mae` reconstructs every view and takes no local crops; got {} views of \
             which {views} global; use --local-views 0",
            batch.views.len()
        );
        let p = batch.encoder.patch_size();
        let mut losses = Vec::with_capacity(views);
        let mut embeddings = Vec::with_capacity(views);
        for (v, view) in batch.views.iter().enumerate() {
            let (gh, gw) = self.check_view(view, p)?;
            let len = gh * gw;
            // Drawn for the global batch and cut to this worker's rows, so that every worker
            // masks its instances as one process would.
            let n = view.dim(0)?;
            let collective = batch.collective;
            let mut rng = batch.progress.rng(mask_stream(v));
            let mask = draw_random_masking(
                n * collective.world_size(),
                len,
                self.cfg.mask_ratio,
                &mut rng,
            )?
            .rows(collective.rank() * n, n);
            ensure!(
                mask.keep.per_image() < len,
                "objective `mae`: mask_ratio {} removes none of the {len} patches of a {} × {} \
                 view; raise mask_ratio or use larger views",
                self.cfg.mask_ratio,
                view.dim(2)?,
                view.dim(3)?
            );
            let out = reconstruct(batch.encoder, &self.decoder, view, &mask)?;
            let target = patchify(view, p)?;
            losses.push(mae_loss(
                &out.pred,
                &target,
                &out.mask,
                self.cfg.norm_pix_loss,
            )?);
            embeddings.push(out.cls);
        }
        let loss = (Tensor::stack(&losses, 0)?.sum_all()? / views as f64)?;
        Ok(PixelLoss {
            output: LossOutput::new(loss.clone()).with_term("reconstruction", loss),
            embeddings: Tensor::stack(&embeddings, 0)?,
        })
    }
}

register_objective! {
    name: "mae",
    aliases: &["masked-autoencoder"],
    summary: "masked autoencoder: the encoder sees a random 25 % of each view's patches, a light decoder reconstructs the (normalised) pixels of the rest",
    paper: "He, Chen, Xie, Li, Dollár, Girshick. Masked Autoencoders Are Scalable Vision \
            Learners. CVPR 2022",
    keys: &[
        ConfigKey { name: "mask_ratio", doc: "fraction of each view's patches removed, in (0, 1) (0.75)" },
        ConfigKey { name: "norm_pix_loss", doc: "targets are each patch's pixels normalised by its own mean and unbiased variance, (t − μ)/√(σ² + 1e-6) (true)" },
        ConfigKey { name: "decoder_dim", doc: "decoder width, a multiple of 4 and of decoder_heads (512, the paper's for ViT-B/L/H; e.g. 256 for ViT-T/S)" },
        ConfigKey { name: "decoder_depth", doc: "decoder transformer blocks (8; e.g. 4 for ViT-T/S)" },
        ConfigKey { name: "decoder_heads", doc: "decoder attention heads (16; e.g. 8 for ViT-T/S)" },
    ],
    config: MaeConfig,
}
