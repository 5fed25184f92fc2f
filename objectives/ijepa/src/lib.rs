//! I-JEPA: a predictor, reading the patch tokens a ViT encoder makes of one large *context*
//! block of an image, predicts the tokens an EMA *target* encoder makes of the whole image at
//! several *target* blocks, in representation space (no pixels are reconstructed).
//!
//! Assran, Duval, Misra, Bojanowski, Vincent, Rabbat, LeCun, Ballas, "Self-Supervised Learning
//! from Images with a Joint-Embedding Predictive Architecture", CVPR 2023 (official code:
//! github.com/facebookresearch/ijepa, followed here step by step). Spec:
//! `docs/spec/objectives.md` §2.28.
//!
//! Per global view `x` `[B, C, H, W]` of a step (I-JEPA takes no local crops), on its patch grid
//! `(H/p) × (W/p)`:
//!
//! 1. **Masks** ([`ssl_masking::MultiBlockConfig`], spec §3.1): `T = 4` target blocks and
//!    `C = 1` context block per image, the context with the targets taken out, drawn from the
//!    run's seed and step (one stream per view).
//! 2. **Target**: the teacher's patch tokens of the whole view, `h = LN(f_ξ(x))`
//!    ([`target_layer_norm`], no affine, ε = 1e-5), detached, gathered at each target mask
//!    ([`apply_masks`], mask-major) and repeated for each context
//!    ([`repeat_interleave_batch`]): `[T·C·B, K_t, E]`.
//! 3. **Context**: the student's patch tokens of the context patches only,
//!    `z = f_θ(x, context)` `[C·B, K_c, E]`.
//! 4. **Prediction** ([`Predictor`]): `ẑ = g_φ(z, context, targets)` `[T·C·B, K_t, E]`.
//! 5. **Loss** ([`ijepa_loss`]): `F.smooth_l1_loss(ẑ, h)` (β = 1, mean over every element, the
//!    released `train.py`; the paper writes an L2 distance); the mean over the views.
//! 6. After each optimiser step, `ξ ← m_k ξ + (1 − m_k) θ` with the official linear schedule
//!    `m_k = 0.996 + k·0.004/(K·ipe_scale)` ([`momentum`]).
//!
//! The objective's embedding of a view (what the trainer's spectrum of the training batches
//! reads) is the teacher's patch tokens before the layer norm, averaged over the patches, as
//! I-JEPA evaluates its target encoder. The online probe and the run's final evaluation read
//! the student's features, as for every objective.
//!
//! Deviations from the official code: the encoder is the project's one ViT
//! (`ssl_models::VisionTransformer`, timm's layout, shared by every objective for a fair
//! comparison), with a class token (ignored here) and by default a *learned* positional
//! embedding, where I-JEPA's ViT has no class token and a fixed sine–cosine embedding
//! (`model.pos_embed: sincos` gives the encoder the fixed one); the predictor's fixed
//! embedding is computed for each view's grid (the official one is built for the square
//! training grid only).
//!
//! Small images: the default masks need blocks of more than `min_keep = 10` patches, which a
//! 4 × 4 or 8 × 8 grid cannot hold; the objective refuses them on the first step and names the
//! key to change. Settings that work (tested): on 8 × 8 grids (16 px with
//! `model.patch_size: 2`, 32 px with 4) `min_keep: 4`; on 4 × 4 grids (16 px with 4-px
//! patches) `target_scale: [0.25, 0.35]`, `targets: 2`, `min_keep: 1`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_ijepa::{apply_masks, ijepa_loss, repeat_interleave_batch};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::Cpu;
//! // Two images of three tokens of width 1; two masks of one token each, stacked mask-major.
//! let tokens = Tensor::new(&[[[10f64], [11.], [12.]], [[20.], [21.], [22.]]], &dev)?;
//! let masks = [Tensor::new(&[[2u32], [0]], &dev)?, Tensor::new(&[[1u32], [1]], &dev)?];
//! let picked = apply_masks(&tokens, &masks)?;
//! assert_eq!(picked.flatten_all()?.to_vec1::<f64>()?, [12., 20., 11., 21.]);
//! // Each block of B = 2 rows repeated for 2 contexts, in place.
//! let repeated = repeat_interleave_batch(&picked, 2, 2)?;
//! assert_eq!(repeated.flatten_all()?.to_vec1::<f64>()?, [12., 20., 12., 20., 11., 21., 11., 21.]);
//! // Smooth L1 (β = 1): 0.5² / 2 inside the unit, |3| − 1/2 outside, averaged.
//! let loss = ijepa_loss(&Tensor::new(&[0.5f64, 3.0], &dev)?, &Tensor::zeros(2, candle_core::DType::F64, &dev)?)?;
//! assert_eq!(loss.to_scalar::<f64>()?, (0.125 + 2.5) / 2.0);
//! # Ok(())
//! # }
//! ```

pub mod ops;
pub mod predictor;

#[cfg(test)]
mod tests;

pub use ops::{apply_masks, ijepa_loss, momentum, repeat_interleave_batch, target_layer_norm};
pub use predictor::Predictor;

use anyhow::{bail, ensure, Context as _, Result};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    PixelBatch, PixelLoss, Requirements, StepContext, TeacherSpec,
};
use ssl_masking::{BlockSize, MultiBlockConfig, MULTIBLOCK_STREAM};

/// I-JEPA hyper-parameters; the defaults are the official configurations'
/// (`configs/in1k_vith14_ep300.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IjepaConfig {
    /// Predictor width `P` (`pred_emb_dim`, 384).
    pub predictor_dim: usize,
    /// Predictor blocks (`pred_depth`, 12).
    pub predictor_depth: usize,
    /// Predictor attention heads (12: the official code passes the encoder's head count, 16
    /// for its ViT-H and 12 for a ViT-B, which the encoder interface does not expose; 12 is
    /// also `VisionTransformerPredictor`'s own default and splits 384 into heads of 32).
    pub predictor_heads: usize,
    /// EMA momentum at the first step (`ema[0]`, 0.996).
    pub ema_start: f64,
    /// EMA momentum the linear schedule reaches after `ipe_scale` × the run (`ema[1]`, 1.0).
    pub ema_end: f64,
    /// Stretch of the momentum schedule (`ipe_scale`, 1.0).
    pub ipe_scale: f64,
    /// Context block area as a fraction of the patches (`enc_mask_scale`, [0.85, 1.0]).
    pub context_scale: (f64, f64),
    /// Target block area as a fraction of the patches (`pred_mask_scale`, [0.15, 0.2]).
    pub target_scale: (f64, f64),
    /// Target block height / width (`aspect_ratio`, [0.75, 1.5]).
    pub aspect_ratio: (f64, f64),
    /// Context blocks per image (`num_enc_masks`, 1).
    pub contexts: usize,
    /// Target blocks per image (`num_pred_masks`, 4).
    pub targets: usize,
    /// Every block keeps more than this many patches (`min_keep`, 10).
    pub min_keep: usize,
    /// Leave the targets in the context (`allow_overlap`, false).
    pub allow_overlap: bool,
}

impl Default for IjepaConfig {
    fn default() -> Self {
        let masks = MultiBlockConfig::default();
        Self {
            predictor_dim: 384,
            predictor_depth: 12,
            predictor_heads: 12,
            ema_start: 0.996,
            ema_end: 1.0,
            ipe_scale: 1.0,
            context_scale: masks.context_scale,
            target_scale: masks.target_scale,
            aspect_ratio: masks.aspect_ratio,
            contexts: masks.context_blocks,
            targets: masks.target_blocks,
            min_keep: masks.min_keep,
            allow_overlap: masks.allow_overlap,
        }
    }
}

impl IjepaConfig {
    /// The mask parameters as [`MultiBlockConfig`].
    pub fn masks(&self) -> MultiBlockConfig {
        MultiBlockConfig {
            context_scale: self.context_scale,
            target_scale: self.target_scale,
            aspect_ratio: self.aspect_ratio,
            context_blocks: self.contexts,
            target_blocks: self.targets,
            min_keep: self.min_keep,
            allow_overlap: self.allow_overlap,
        }
    }

    /// Refuses a patch grid on which some block size the scales can produce keeps no more than
    /// `min_keep` patches (the mask sampler could never place it), naming the key to change.
    fn check_grid(&self, grid: (usize, usize), view: (usize, usize), patch: usize) -> Result<()> {
        let (gh, gw) = grid;
        ensure!(
            gh >= 2 && gw >= 2,
            "objective `ijepa`: {}×{} views cut into {patch}-pixel patches give a {gh}×{gw} patch \
             grid, and the mask blocks need at least 2×2; use a smaller model.patch_size or a \
             larger data.size",
            view.0,
            view.1
        );
        let blocks = [
            (
                "target",
                "target_scale",
                self.target_scale,
                self.aspect_ratio,
            ),
            ("context", "context_scale", self.context_scale, (1.0, 1.0)),
        ];
        for (kind, key, scale, ratio) in blocks {
            let smallest = (0..SIZE_SWEEP)
                .map(|i| {
                    MultiBlockConfig::block_size(i as f64 / SIZE_SWEEP as f64, scale, ratio, grid)
                })
                .min_by_key(|b| b.height * b.width)
                .unwrap_or(BlockSize {
                    height: 0,
                    width: 0,
                });
            let area = smallest.height * smallest.width;
            if area <= self.min_keep {
                let fix = match area {
                    0 => format!("raise `{key}`"),
                    _ => format!(
                        "set `min_keep` to {} or less (--set objective.params.min_keep={}), raise `{key}`",
                        area - 1,
                        area - 1
                    ),
                };
                bail!(
                    "objective `ijepa`: on the {gh}×{gw} patch grid of {}×{} views (patch {patch}) \
                     a {kind} block can be {}×{} = {area} patches, but every block must keep more \
                     than `min_keep` = {} patches; {fix}, or use a finer grid (smaller \
                     model.patch_size or larger data.size). For 4×4 grids: target_scale [0.25, \
                     0.35], targets 2, min_keep 1; for 8×8: min_keep 4",
                    view.0,
                    view.1,
                    smallest.height,
                    smallest.width,
                    self.min_keep
                );
            }
        }
        Ok(())
    }
}

impl ObjectiveConfig for IjepaConfig {
    fn validate(&self) -> Result<()> {
        let (p, h) = (self.predictor_dim, self.predictor_heads);
        ensure!(
            p > 0 && p.is_multiple_of(4),
            "`predictor_dim` must be a positive multiple of 4 (the predictor's 2D sine-cosine \
             positions split it in four; I-JEPA uses 384), got {p}"
        );
        ensure!(
            h > 0 && p.is_multiple_of(h),
            "`predictor_heads` must divide `predictor_dim` = {p} (e.g. 12 for 384), got {h}"
        );
        for (key, m) in [("ema_start", self.ema_start), ("ema_end", self.ema_end)] {
            ensure!(
                (0.0..=1.0).contains(&m),
                "`{key}` is an EMA momentum and must lie in [0, 1] (I-JEPA: ema_start 0.996, \
                 ema_end 1.0), got {m}"
            );
        }
        ensure!(
            self.ipe_scale.is_finite() && self.ipe_scale > 0.0,
            "`ipe_scale` stretches the momentum schedule and must be a finite number > 0 (1.0 in \
             the official configurations), got {}",
            self.ipe_scale
        );
        ensure!(
            self.contexts > 0 && self.targets > 0,
            "`contexts` ({}) and `targets` ({}) count mask blocks per image and must be at \
             least 1 (I-JEPA: 1 and 4)",
            self.contexts,
            self.targets
        );
        self.masks().validate().map_err(|e| {
            anyhow::anyhow!(
                "{e} (keys `context_scale`, `target_scale`, `aspect_ratio` of objective `ijepa`)"
            )
        })
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        ensure!(
            ctx.views == ctx.global_views,
            "objective `ijepa` masks whole images and takes no local crops, but the run has {} \
             local views; set train.local_views: 0",
            ctx.views - ctx.global_views
        );
        // The views' patch grid, known before the run starts: a mask that can never be drawn
        // is refused here rather than at the first step.
        if let Some(p) = ctx.patches.filter(|p| p.size > 0) {
            let (height, width) = p.image;
            self.check_grid((height / p.size, width / p.size), p.image, p.size)?;
        }
        let predictor = Predictor::new(
            ctx.feature_dim,
            self.predictor_dim,
            self.predictor_depth,
            self.predictor_heads,
            ctx.vb.clone(),
        )?;
        Ok(Box::new(Ijepa {
            cfg: self.clone(),
            masks: self.masks(),
            predictor,
        }))
    }
}

/// Steps of the block-size sweep of [`IjepaConfig::check_grid`].
const SIZE_SWEEP: usize = 1000;

/// The I-JEPA objective: owns the predictor, asks the trainer for an EMA teacher and the views'
/// pixels.
pub struct Ijepa {
    cfg: IjepaConfig,
    masks: MultiBlockConfig,
    predictor: Predictor,
}

impl Ijepa {
    /// The predictor.
    pub fn predictor(&self) -> &Predictor {
        &self.predictor
    }

    /// The loss of one global view `v` and its embedding `[B, E]`.
    fn view_loss(
        &self,
        batch: &PixelBatch<'_>,
        teacher: &dyn ssl_core::TokenEncoder,
        v: usize,
    ) -> Result<(Tensor, Tensor)> {
        let view = &batch.views[v];
        let (b, _, height, width) = view.dims4()?;
        let patch = batch.encoder.patch_size();
        ensure!(
            patch > 0 && height.is_multiple_of(patch) && width.is_multiple_of(patch),
            "objective `ijepa`: view {v} is {height}×{width} pixels, not a whole number of \
             {patch}-pixel patches; set data.size to a multiple of model.patch_size"
        );
        let grid = (height / patch, width / patch);
        self.cfg.check_grid(grid, (height, width), patch)?;
        // Drawn (and truncated) for the global batch and cut to this worker's rows, so that
        // every worker masks its instances as one process would.
        let (world, rank) = (batch.collective.world_size(), batch.collective.rank());
        let mut rng = batch.progress.rng(MULTIBLOCK_STREAM.wrapping_add(v as u64));
        let masks = self
            .masks
            .sample(b * world, grid, &mut rng)
            .with_context(|| {
                "objective `ijepa`: the masks could not be drawn (keys `min_keep`, `target_scale`, \
                 `context_scale`, `aspect_ratio`)"
            })?;
        let device = view.device();
        let to_tensors = |masks: &[ssl_masking::PatchIndices]| -> Result<Vec<Tensor>> {
            Ok(masks
                .iter()
                .map(|m| m.rows(rank * b, b).to_tensor(device))
                .collect::<candle_core::Result<_>>()?)
        };
        let (context_masks, target_masks) =
            (to_tensors(&masks.context)?, to_tensors(&masks.targets)?);

        let tokens = teacher.forward_tokens(view, None)?.patches.detach(); // [B, L, E]
        let embedding = tokens.mean(1)?;
        let target = repeat_interleave_batch(
            &apply_masks(&target_layer_norm(&tokens)?, &target_masks)?,
            b,
            context_masks.len(),
        )?;
        let context = context_masks
            .iter()
            .map(|keep| Ok(batch.encoder.forward_tokens(view, Some(keep))?.patches))
            .collect::<Result<Vec<_>>>()?;
        let context = Tensor::cat(&context, 0)?;
        let prediction = self
            .predictor
            .forward(&context, &context_masks, &target_masks, grid)?;
        Ok((ijepa_loss(&prediction, &target)?, embedding))
    }
}

impl Objective for Ijepa {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 1,
            min_batch: 1,
            projector: false,
            // The official target encoder is never put in eval mode; the ViT has no batch norm
            // or dropout, so both modes compute the same function.
            teacher: Some(TeacherSpec { train_mode: true }),
            pixels: true,
            ..Requirements::default()
        }
    }

    fn pixel_loss(&mut self, batch: &PixelBatch<'_>) -> Result<PixelLoss> {
        let Some(teacher) = batch.teacher else {
            bail!(
                "objective `ijepa` regresses the EMA target encoder's tokens, but the batch has no \
                 teacher; the trainer provides one when requirements().teacher is set"
            );
        };
        let views = batch.views.len();
        ensure!(
            batch.global_views == views && views > 0,
            "objective `ijepa` masks whole images and takes no local crops, got {views} views of \
             which {} global; set train.local_views: 0",
            batch.global_views
        );
        let (width, expected) = (batch.encoder.token_dim(), self.predictor.embed_dim());
        ensure!(
            width == expected && teacher.token_dim() == expected,
            "objective `ijepa`: the predictor was built for {expected}-wide tokens, but the \
             encoder's are {width} and the teacher's {} wide",
            teacher.token_dim()
        );
        let mut losses = Vec::with_capacity(views);
        let mut embeddings = Vec::with_capacity(views);
        for v in 0..views {
            let (loss, embedding) = self.view_loss(batch, teacher, v)?;
            losses.push(loss);
            embeddings.push(embedding);
        }
        let loss = (Tensor::stack(&losses, 0)?.sum_all()? / views as f64)?;
        Ok(PixelLoss {
            output: LossOutput::new(loss),
            embeddings: Tensor::stack(&embeddings, 0)?.detach(),
        })
    }

    fn after_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        ctx.ema_update(momentum(
            self.cfg.ema_start,
            self.cfg.ema_end,
            self.cfg.ipe_scale,
            &ctx.progress,
        ))
    }
}

register_objective! {
    name: "ijepa",
    aliases: &["i-jepa"],
    summary: "a predictor regresses the EMA target encoder's layer-normed patch tokens of 4 target blocks from a context block (multi-block masks, smooth L1)",
    paper: "Assran, Duval, Misra, Bojanowski, Vincent, Rabbat, LeCun, Ballas. Self-Supervised \
            Learning from Images with a Joint-Embedding Predictive Architecture. CVPR 2023",
    keys: &[
        ConfigKey { name: "predictor_dim", doc: "predictor width P, a multiple of 4 (384)" },
        ConfigKey { name: "predictor_depth", doc: "predictor transformer blocks (12)" },
        ConfigKey { name: "predictor_heads", doc: "predictor attention heads, dividing predictor_dim (12; the official code passes the encoder's)" },
        ConfigKey { name: "ema_start", doc: "EMA momentum at the first step (0.996)" },
        ConfigKey { name: "ema_end", doc: "EMA momentum the linear schedule reaches after ipe_scale × the run (1.0)" },
        ConfigKey { name: "ipe_scale", doc: "stretch of the momentum schedule: m_k = ema_start + k·(ema_end − ema_start)/(K·ipe_scale) (1.0)" },
        ConfigKey { name: "context_scale", doc: "context block area as a fraction of the patches, [min, max] ([0.85, 1.0])" },
        ConfigKey { name: "target_scale", doc: "target block area as a fraction of the patches, [min, max] ([0.15, 0.2])" },
        ConfigKey { name: "aspect_ratio", doc: "target block height/width, [min, max] ([0.75, 1.5])" },
        ConfigKey { name: "contexts", doc: "context blocks per image (1)" },
        ConfigKey { name: "targets", doc: "target blocks per image (4)" },
        ConfigKey { name: "min_keep", doc: "every block keeps more than this many patches (10; 4 on 8×8 grids, 1 on 4×4)" },
        ConfigKey { name: "allow_overlap", doc: "leave the targets in the context (false)" },
    ],
    config: IjepaConfig,
}
