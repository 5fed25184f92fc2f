//! `train:` — epochs, batch, views, the optimiser and its schedule, precision, threads.

use anyhow::{bail, ensure, Result};
use serde::{Deserialize, Serialize};
use ssl_models::autocast::Precision;
use ssl_optim::OptimizerSettings;

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub views: usize,
    /// Multi-crop: extra low-resolution local views per instance (Caron et al. 2020), seen by
    /// the student only; objectives read them as the views after the `views` global ones.
    pub local_views: usize,
    /// Side of a local view in pixels (0: `⌈side · 96/224⌉`, DINO's 96 px at 224).
    pub local_size: usize,
    /// Area fraction range of a local crop (default: the recipe's, SwAV `[0.05, 0.14]`, else
    /// DINO's `[0.05, 0.4]`).
    pub local_scale: (f64, f64),
    pub optimizer: OptimizerKind,
    /// Peak learning rate (after warm-up).
    pub lr: f64,
    /// Final learning rate of the cosine schedule.
    pub min_lr: f64,
    /// Epochs of linear warm-up, at most `epochs` (when not given: 2, or `epochs` if fewer).
    pub warmup_epochs: usize,
    /// Decoupled (AdamW) or L2 (SGD/LARS) weight decay; biases and norm weights are excluded.
    pub weight_decay: f64,
    /// Adam betas.
    pub betas: (f64, f64),
    /// SGD/LARS momentum and Nesterov switch.
    pub momentum: f64,
    pub nesterov: bool,
    /// LARS trust coefficient η.
    pub lars_eta: f64,
    pub drop_last: bool,
    pub seed: u64,
    /// CPU threads (0 = all cores, or under a launcher this rank's share of them; more than
    /// [`MAX_THREADS_PER_CORE`] per core are capped).
    pub threads: usize,
    /// Seconds a data-parallel collective waits for the other ranks before the job ends with an
    /// error naming it, the rank and the step (a rank that never joins it would otherwise hang
    /// the job).
    pub collective_timeout: usize,
    /// `cpu`, `cuda[:N]` or `metal`.
    pub device: String,
    /// Online linear probe learning rate (0 disables the probe), with the backbone's optimiser
    /// and schedule and no weight decay; the probe standardises its features
    /// ([`crate::online_probe`]). Spec metrics §2 gives 0.1–0.3 as typical; the main job's
    /// probe ends at 98.1 % with it (offline 97.8 %), and on a ViT-T after 10 epochs of MAE 0.1
    /// gave 55 %, 0.01 42 % and 0.001 31 %.
    pub probe_lr: f64,
    /// Checkpoint every N epochs (the last epoch is always saved).
    pub checkpoint_every: usize,
    /// Steps between reads of the logged values (loss, its terms, the probe's loss) from the
    /// device: every step is still logged, an interval's steps at once, and a non-finite loss
    /// stops training at the first read after it, naming its step. On a GPU each read waits for
    /// every queued kernel; reading every step would stall the queue once a step.
    pub log_every: usize,
    /// Stop after this many epochs of this invocation (0 = run to the end); for tests of resume.
    pub stop_after_epochs: usize,
    /// Gradient accumulation: one optimiser step per this many batches, on their mean gradient
    /// (effective batch `accumulate × batch_size`; the objective still sees `batch_size`
    /// instances at a time, so batch statistics are the smaller batch's).
    pub accumulate: usize,
    /// `f32`, or `bf16`: the encoder's and projector's matrix products take bf16 operands and
    /// accumulate in f32, everything else stays f32 (as `torch.autocast(dtype=torch.bfloat16)`;
    /// on the CPU a speed-up where the core has AMX or AVX512-BF16, else a check of the recipe).
    pub precision: Precision,
    /// Gradient clipping over every trainable parameter: their gradients are scaled together
    /// so that their global norm is at most this (0: off). A parameter group clips its own.
    #[serde(skip_serializing_if = "is_off")]
    pub clip_grad_norm: f64,
    /// Optimiser settings by parameter-name prefix, applied after the objective's own groups
    /// (`ssl describe NAME` lists them), e.g. `[{params: projector., lr: 0.05, schedule:
    /// constant, weight_decay: 0, lars: false, clip_grad_norm: 3.0, freeze_epochs: 1}]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub param_groups: Vec<ssl_core::ParamGroup>,
}

fn is_off(x: &f64) -> bool {
    *x == 0.0
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 50,
            batch_size: 128,
            views: 2,
            local_views: 0,
            local_size: 0,
            local_scale: (0.05, 0.4),
            optimizer: OptimizerKind::Adamw,
            lr: 1e-3,
            min_lr: 0.0,
            warmup_epochs: 2,
            weight_decay: 1e-4,
            betas: (0.9, 0.999),
            momentum: 0.9,
            nesterov: false,
            lars_eta: 0.02,
            drop_last: true,
            seed: 0,
            threads: 0,
            collective_timeout: 600,
            device: "cpu".into(),
            probe_lr: 0.1,
            checkpoint_every: 10,
            log_every: 10,
            stop_after_epochs: 0,
            accumulate: 1,
            precision: Precision::F32,
            clip_grad_norm: 0.0,
            param_groups: Vec::new(),
        }
    }
}

impl TrainConfig {
    /// The optimiser's settings of this run.
    pub fn optimizer_settings(&self) -> OptimizerSettings {
        OptimizerSettings {
            kind: self.optimizer,
            lr: self.lr,
            warmup_epochs: self.warmup_epochs,
            weight_decay: self.weight_decay,
            betas: self.betas,
            momentum: self.momentum,
            nesterov: self.nesterov,
            lars_eta: self.lars_eta,
            clip_grad_norm: self.clip_grad_norm,
        }
    }

    /// Side of a multi-crop local view of images of side `side`: `local_size`, or
    /// `⌈side · 96/224⌉` (DINO's 96 px at 224) when 0.
    pub fn local_side(&self, side: usize) -> usize {
        match self.local_size {
            0 => (side * 96).div_ceil(224).max(1),
            s => s,
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        at_least_one("train.epochs", self.epochs, "")?;
        at_least_one("train.batch_size", self.batch_size, "")?;
        at_least_one("train.views", self.views, "")?;
        at_least_one(
            "train.accumulate",
            self.accumulate,
            " (1: no gradient accumulation)",
        )?;
        at_least_one(
            "train.checkpoint_every",
            self.checkpoint_every,
            " (epochs between checkpoints; the last epoch is always saved)",
        )?;
        at_least_one(
            "train.collective_timeout",
            self.collective_timeout,
            " (seconds a data-parallel collective waits for the other ranks; default 600)",
        )?;
        at_least_one(
            "train.log_every",
            self.log_every,
            " (steps between reads of the loss; 1: every step)",
        )?;
        positive("train.lr", self.lr, " (default 1e-3)")?;
        in_range(
            "train.min_lr",
            self.min_lr,
            0.0..=self.lr,
            &format!("in [0, train.lr] = [0, {}]", self.lr),
            " (the cosine schedule's end; default 0)",
        )?;
        ensure!(
            self.warmup_epochs <= self.epochs,
            "train.warmup_epochs must be ≤ train.epochs ({}), got {}",
            self.epochs,
            self.warmup_epochs
        );
        in_range(
            "train.weight_decay",
            self.weight_decay,
            0.0..,
            "≥ 0",
            " (default 1e-4)",
        )?;
        let (b1, b2) = self.betas;
        for (key, beta) in [("train.betas[0]", b1), ("train.betas[1]", b2)] {
            in_range(key, beta, 0.0..1.0, "in [0, 1)", " (Adam: [0.9, 0.999])")?;
        }
        in_range(
            "train.momentum",
            self.momentum,
            0.0..1.0,
            "in [0, 1)",
            " (default 0.9)",
        )?;
        positive("train.lars_eta", self.lars_eta, " (LARS; default 0.02)")?;
        in_range(
            "train.probe_lr",
            self.probe_lr,
            0.0..,
            "≥ 0",
            " (0: no online probe; default 0.1)",
        )?;
        let (lo, hi) = self.local_scale;
        ensure!(
            lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi && hi <= 1.0,
            "train.local_scale must be [a, b] with 0 < a ≤ b ≤ 1 (the local crop's area fraction; \
             DINO: [0.05, 0.4]), got [{lo}, {hi}]"
        );
        in_range(
            "train.clip_grad_norm",
            self.clip_grad_norm,
            0.0..,
            "≥ 0",
            " (0: no clipping)",
        )?;
        for (i, group) in self.param_groups.iter().enumerate() {
            if let Err(e) = group.validate() {
                bail!("train.param_groups[{i}]: {e}");
            }
        }
        Ok(())
    }
}
