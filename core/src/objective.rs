//! The [`Objective`] trait and everything that crosses its boundary.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor, Var};
use candle_nn::VarBuilder;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{de::DeserializeOwned, Serialize};

use crate::{Collective, ParamGroup, TokenEncoder};

/// Where training stands when a loss is computed or a step has ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// Optimiser steps taken before this one (0-based).
    pub step: usize,
    /// Current epoch (0-based).
    pub epoch: usize,
    /// Steps in one epoch.
    pub steps_per_epoch: usize,
    /// Steps in the whole run.
    pub total_steps: usize,
    /// The run's seed; combine with `step` through [`Progress::rng`] for per-step randomness
    /// that a resumed run reproduces.
    pub seed: u64,
}

impl Progress {
    /// Fraction of training done, in `[0, 1]`.
    pub fn fraction(&self) -> f64 {
        if self.total_steps == 0 {
            1.0
        } else {
            (self.step as f64 / self.total_steps as f64).min(1.0)
        }
    }

    /// A generator determined by the run seed, this step and a caller-chosen `stream`, so an
    /// objective's random draws (slices, partitions) are the same after `--resume`.
    pub fn rng(&self, stream: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x5eed_0b1e_c71e);
        rng.set_stream(stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.step as u64);
        rng
    }

    /// Cosine ramp from `start` (step 0) to `end` (last step):
    /// `end − (end − start)(cos(π k/K) + 1)/2`, the EMA momentum schedule of BYOL/DINO/CARP.
    pub fn cosine_ramp(&self, start: f64, end: f64) -> f64 {
        let k = self.fraction();
        end - (end - start) * ((std::f64::consts::PI * k).cos() + 1.0) / 2.0
    }
}

/// Per-instance `u32` values of a batch (dataset indices or class labels), `[B]` on the
/// training device together with the same values on the host, so that an objective checks them
/// against its tables without reading device memory inside a step (which would wait for the
/// forward pass on a GPU). Built from the host values, so the two cannot disagree.
#[derive(Debug, Clone)]
pub struct Ids {
    tensor: Tensor,
    host: Vec<u32>,
}

impl Ids {
    /// `values` uploaded to `device`.
    pub fn new(values: &[u32], device: &Device) -> candle_core::Result<Self> {
        Ok(Self {
            tensor: Tensor::new(values, device)?,
            host: values.to_vec(),
        })
    }

    /// The ids `0, 1, …, n − 1`.
    pub fn range(n: usize, device: &Device) -> candle_core::Result<Self> {
        Self::new(&(0..n as u32).collect::<Vec<_>>(), device)
    }

    /// The values on the device, `[B]` u32.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The same values on the host.
    pub fn host(&self) -> &[u32] {
        &self.host
    }

    /// `Ok` when every value indexes one of `rows` rows; else the error `what` builds from the
    /// first value that does not.
    pub fn check_below(&self, rows: usize, what: impl FnOnce(u32) -> String) -> Result<()> {
        match self.host.iter().find(|&&v| v as usize >= rows) {
            Some(&v) => bail!(what(v)),
            None => Ok(()),
        }
    }
}

/// One mini-batch as an objective sees it. All tensors live on the training device.
///
/// `B` = instances in the batch, `V` = views per instance (global first, then local crops),
/// `D` = projection width, `F` = backbone width.
pub struct Batch<'a> {
    /// Projector outputs `[V, B, D]`, view-major (`projections.get(v)` is view `v` of every
    /// instance). If the objective asked for no projector, this is the backbone output.
    pub projections: &'a Tensor,
    /// Backbone outputs `[V, B, F]`.
    pub features: &'a Tensor,
    /// The first `global_views` views are full-size ("global") crops; the rest are local crops.
    pub global_views: usize,
    /// Dataset indices of the `B` instances, stable over epochs (instance tables).
    pub indices: &'a Ids,
    /// Class labels of the `B` instances when the data set has them.
    pub labels: Option<&'a Ids>,
    /// Teacher projections of the global views `[V_global, B, D]`, detached; present exactly
    /// when [`Requirements::teacher`] asked for a teacher.
    pub teacher: Option<&'a Tensor>,
    /// Training progress (step, epoch, totals, seed).
    pub progress: Progress,
    /// Train mode (batch-norm batch statistics) for the objective's own heads.
    pub train: bool,
    /// Gathers batch statistics across data-parallel workers; see [`Collective`].
    pub collective: &'a dyn Collective,
}

impl Batch<'_> {
    /// Number of views `V`.
    pub fn views(&self) -> usize {
        self.projections.dims()[0]
    }
    /// Number of instances `B`.
    pub fn batch_size(&self) -> usize {
        self.projections.dims()[1]
    }
    /// The labels, or a clear error for objectives that need them.
    pub fn require_labels(&self, objective: &str) -> Result<&Ids> {
        match self.labels {
            Some(l) => Ok(l),
            None => bail!(
                "objective `{objective}` is supervised and needs class labels, but the data set has none; \
                 use a labelled data set or an unsupervised objective"
            ),
        }
    }
}

/// One mini-batch as an objective that encodes the views itself sees it
/// ([`Requirements::pixels`]): the views' pixels and the encoders, nothing forwarded yet. All
/// tensors live on the training device.
pub struct PixelBatch<'a> {
    /// The views, each `[B, C, H, W]`: the `global_views` full-size crops first, then the local
    /// crops (at their own size).
    pub views: &'a [Tensor],
    pub global_views: usize,
    /// The student encoder; its gradients are the ones the optimiser applies.
    pub encoder: &'a dyn TokenEncoder,
    /// The EMA teacher's encoder (a copy of the student's, updated through
    /// [`StepContext::ema_update`]), present exactly when [`Requirements::teacher`] asked for
    /// one. Its outputs carry no gradient to the student; detach them.
    pub teacher: Option<&'a dyn TokenEncoder>,
    /// Dataset indices of the `B` instances.
    pub indices: &'a Ids,
    /// Class labels of the `B` instances when the data set has them.
    pub labels: Option<&'a Ids>,
    pub progress: Progress,
    pub train: bool,
    /// Gathers batch statistics across data-parallel workers; see [`Collective`].
    pub collective: &'a dyn Collective,
}

impl PixelBatch<'_> {
    /// Number of instances `B`.
    pub fn batch_size(&self) -> usize {
        self.views.first().map_or(0, |v| v.dims()[0])
    }
}

/// What [`Objective::pixel_loss`] returns: the loss and an embedding of every global view.
pub struct PixelLoss {
    pub output: LossOutput,
    /// One embedding per global view and instance, `[V_global, B, E]`, as the objective computed
    /// it on the way to its loss (MAE: the class token of the visible patches; I-JEPA: the
    /// teacher's pooled patch tokens). The trainer logs its spectrum, as it does the
    /// projections of the other objectives (the online probe reads the encoder's output on the
    /// whole views instead).
    pub embeddings: Tensor,
}

/// The scalar loss plus its named terms (unweighted values as logged).
pub struct LossOutput {
    /// Scalar tensor to differentiate.
    pub loss: Tensor,
    /// Named scalar terms, e.g. `("invariance", …)`, logged every step.
    pub terms: Vec<(String, Tensor)>,
}

impl LossOutput {
    /// A loss with no separate terms.
    pub fn new(loss: Tensor) -> Self {
        Self {
            loss,
            terms: Vec::new(),
        }
    }
    /// Adds a named term.
    pub fn with_term(mut self, name: impl Into<String>, value: Tensor) -> Self {
        self.terms.push((name.into(), value));
        self
    }
}

/// An exponential-moving-average teacher: a copy of encoder + projector, never trained by the
/// optimiser, fed the global views, updated in [`Objective::after_step`] (or
/// [`Objective::before_step`]) through [`StepContext::ema_update`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TeacherSpec {
    /// Whether the teacher's batch norm uses batch statistics (train mode), as BYOL and DINO do.
    pub train_mode: bool,
}

/// What an objective needs from the trainer; checked before the first step.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirements {
    /// Smallest number of views per instance.
    pub min_views: usize,
    /// Largest number of views, if bounded.
    pub max_views: Option<usize>,
    /// Smallest batch size `B`, and why (quoted in the error).
    pub min_batch: usize,
    pub min_batch_reason: &'static str,
    /// Needs class labels (supervised objectives).
    pub labels: bool,
    /// Wants the trainer's projector; `false` gives the loss the backbone output.
    pub projector: bool,
    /// Wants an EMA teacher.
    pub teacher: Option<TeacherSpec>,
    /// Optimiser settings of parts of the model that the objective's paper trains differently
    /// (a constant-rate predictor, a frozen last layer); a run's `train.param_groups` apply
    /// after these.
    pub param_groups: Vec<ParamGroup>,
    /// The objective encodes the views itself, from their pixels, through the encoder's patch
    /// tokens (masked-image and predictive objectives: MAE, I-JEPA): the trainer then forwards
    /// nothing and calls [`Objective::pixel_loss`] instead of [`Objective::loss`]. The encoder
    /// must be a [`TokenEncoder`] (a ViT).
    pub pixels: bool,
}

impl Default for Requirements {
    fn default() -> Self {
        Self {
            min_views: 2,
            max_views: None,
            min_batch: 1,
            min_batch_reason: "",
            labels: false,
            projector: true,
            teacher: None,
            param_groups: Vec::new(),
            pixels: false,
        }
    }
}

impl Requirements {
    /// Checks a planned run against these limits, with an error that names the fix.
    pub fn check(
        &self,
        objective: &str,
        views: usize,
        batch: usize,
        has_labels: bool,
    ) -> Result<()> {
        if views < self.min_views {
            bail!(
                "objective `{objective}` needs at least {} views per instance, got --views {views}; \
                 use --views {} or more",
                self.min_views,
                self.min_views
            );
        }
        if let Some(max) = self.max_views {
            if views > max {
                bail!(
                    "objective `{objective}` takes at most {max} views per instance, got --views {views}; \
                     use --views {max} or fewer"
                );
            }
        }
        if batch < self.min_batch {
            bail!(
                "objective `{objective}` needs batch size ≥ {} ({}), got --batch-size {batch}; \
                 use --batch-size {} or more",
                self.min_batch,
                self.min_batch_reason,
                self.min_batch
            );
        }
        if self.labels && !has_labels {
            bail!(
                "objective `{objective}` is supervised and needs class labels, but the data set has none"
            );
        }
        Ok(())
    }
}

/// What an objective may use when it is built.
pub struct BuildContext<'a> {
    /// Creates the objective's own parameters and buffers (instance tables, prototypes,
    /// queues, predictor heads). Names under it are saved in and restored from checkpoints.
    pub vb: VarBuilder<'a>,
    /// Number of training instances `N` (instance tables are `N × d`).
    pub num_instances: usize,
    /// Number of classes when the data has labels.
    pub num_classes: Option<usize>,
    /// Class label of every training instance, indexed like an instance table (`[N]`), when the
    /// data has labels (supervised instance tables such as IConE-Instance need all of them).
    pub instance_labels: Option<&'a [u32]>,
    /// Width of [`Batch::projections`].
    pub projection_dim: usize,
    /// Width of [`Batch::features`].
    pub feature_dim: usize,
    /// Views per instance the run will use: the global views, then the local crops.
    pub views: usize,
    /// How many of the `views` are global (full-size) crops, the ones a teacher or key encoder
    /// sees and [`Batch::global_views`] counts (`views` without multi-crop).
    pub global_views: usize,
    /// Batch size `B` the run will use.
    pub batch_size: usize,
    /// How the encoder cuts images into patches, when it is a [`TokenEncoder`]: what a
    /// pixel decoder (MAE's) predicts per patch.
    pub patches: Option<Patches>,
}

/// The patches of a [`TokenEncoder`]'s inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patches {
    /// Side of a patch in pixels.
    pub size: usize,
    /// Channels of the images.
    pub channels: usize,
    /// Height and width of the global views in pixels (a mask generator's patch grid is these
    /// over `size`).
    pub image: (usize, usize),
}

impl Patches {
    /// Values in one patch, `size²·channels`.
    pub fn values(&self) -> usize {
        self.size * self.size * self.channels
    }
}

/// Given to [`Objective::before_step`] and [`Objective::after_step`] around every optimiser
/// step.
pub struct StepContext<'a> {
    /// The step being taken.
    pub progress: Progress,
    /// Trainable student parameters (encoder + projector) by name.
    pub student: &'a [(String, Var)],
    /// The teacher's parameters under the same names, when one was requested.
    pub teacher: Option<&'a [(String, Var)]>,
}

impl StepContext<'_> {
    /// `θ_t ← m·θ_t + (1 − m)·θ_s` for every student parameter (spec `docs/spec/objectives.md` §3).
    pub fn ema_update(&self, momentum: f64) -> Result<()> {
        let Some(teacher) = self.teacher else {
            bail!("ema_update called but the objective did not request a teacher");
        };
        ema_update(teacher, self.student, momentum)
    }
}

/// `teacher` and `student` paired by position, each pair checked to have the same name and shape.
pub fn paired_parameters<'a>(
    teacher: &'a [(String, Var)],
    student: &'a [(String, Var)],
) -> Result<Vec<(&'a Var, &'a Var)>> {
    if teacher.len() != student.len() {
        bail!(
            "teacher and student differ: {} against {} parameters",
            teacher.len(),
            student.len()
        );
    }
    teacher
        .iter()
        .zip(student)
        .map(|((name_t, t), (name_s, s))| {
            if name_t != name_s || t.shape() != s.shape() {
                bail!(
                    "teacher and student differ: `{name_t}` {:?} against `{name_s}` {:?}",
                    t.dims(),
                    s.dims()
                );
            }
            Ok((t, s))
        })
        .collect()
}

/// `θ_t ← m·θ_t + (1 − m)·θ_s` over parameter lists with the same names in the same order (spec
/// §3): the trainer's teacher, or an objective's own teacher head. Batch-norm running statistics
/// are not in the lists; a teacher's own forward passes update them, as in the references.
pub fn ema_update(
    teacher: &[(String, Var)],
    student: &[(String, Var)],
    momentum: f64,
) -> Result<()> {
    for (t, s) in paired_parameters(teacher, student)? {
        t.set(&((t.as_tensor() * momentum)? + (s.as_tensor() * (1.0 - momentum))?)?)?;
    }
    Ok(())
}

/// A self-supervised (or supervised) training objective. It implements [`Objective::loss`] on
/// the trainer's embeddings of the views, or, with [`Requirements::pixels`],
/// [`Objective::pixel_loss`] on the views' pixels.
pub trait Objective: Send {
    /// What the trainer must provide; checked before training starts.
    fn requirements(&self) -> Requirements;

    /// The loss for one batch of embedded views.
    fn loss(&mut self, _batch: &Batch<'_>) -> Result<LossOutput> {
        bail!("this objective encodes the views itself (Requirements::pixels): call pixel_loss")
    }

    /// The loss for one batch of views the objective encodes itself
    /// ([`Requirements::pixels`]).
    fn pixel_loss(&mut self, _batch: &PixelBatch<'_>) -> Result<PixelLoss> {
        bail!("this objective takes embedded views (Requirements::pixels is false): call loss")
    }

    /// Runs once per optimiser step after the step's gradients are computed and before the
    /// optimiser applies them, so the student weights are still those that produced the loss
    /// (CARP's teacher update, which its reference code runs before `optimizer.step()`).
    fn before_step(&mut self, _ctx: &StepContext<'_>) -> Result<()> {
        Ok(())
    }

    /// Runs after every optimiser step (EMA update, queue push, prototype normalisation).
    fn after_step(&mut self, _ctx: &StepContext<'_>) -> Result<()> {
        Ok(())
    }
}

/// A typed objective configuration: serde defaults are the paper's defaults, unknown keys are
/// rejected (`#[serde(deny_unknown_fields)]`), [`ObjectiveConfig::validate`] checks values.
pub trait ObjectiveConfig: Serialize + DeserializeOwned + Default + 'static {
    /// Value checks beyond types (e.g. a positive temperature), naming the key and the fix.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
    /// Builds the objective.
    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>>;

    /// Fits the paper defaults that make no sense for this run (more prototypes, or a longer
    /// queue, than there are training instances; a head many times wider than what it reads)
    /// to it, before the run is built and recorded. Only keys for which `defaulted(key)` holds
    /// (the run left them at the paper's default) may change; a value the user gave is kept.
    /// Returns one sentence per change, naming the key, both values and why, which the
    /// trainer prints at the start of the run.
    fn fit_to_data(&mut self, _run: &RunFacts, _defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        Vec::new()
    }
}

/// What [`ObjectiveConfig::fit_to_data`] knows of the run: the training set's size, the batch
/// and the widths of the encoder's features and of the projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFacts {
    /// Training instances `N`.
    pub num_instances: usize,
    /// Instances per batch `B` (the global batch of a data-parallel run).
    pub batch_size: usize,
    /// Width of the encoder's features ([`Batch::features`]).
    pub feature_dim: usize,
    /// Width of the projections ([`Batch::projections`]).
    pub projection_dim: usize,
}

/// How much wider than its input a head's hidden layer may be before it is fitted: the
/// papers' heads are 1× (CARP's 2048 on a ResNet-50's 2048 features) to 5.3× (DINO's 2048 on
/// ViT-S/16's 384) their input, and BYOL's predictor is 16× its 256-d projections.
pub const HEAD_WIDTH_RATIO: usize = 4;

impl RunFacts {
    /// The largest power of two at most `N` (at least `floor`): the size a prototype layer
    /// fitted to the data set takes.
    pub fn power_of_two_within_instances(&self, floor: usize) -> usize {
        let n = self.num_instances.max(1);
        (1usize << n.ilog2()).max(floor)
    }

    /// Fits a head's hidden width `width` (objective key `key`, left at its default) to the
    /// `reads`-wide vectors it reads: above [`HEAD_WIDTH_RATIO`] × `reads` it becomes that.
    /// `paper` names what the paper's width was for. Returns the note, if it changed.
    pub fn fit_head_width(
        &self,
        key: &str,
        width: &mut usize,
        reads: usize,
        paper: &str,
        defaulted: &dyn Fn(&str) -> bool,
    ) -> Option<String> {
        let fitted = HEAD_WIDTH_RATIO * reads.max(1);
        if !defaulted(key) || *width <= fitted {
            return None;
        }
        let note = format!(
            "`{key}` {width} is the paper's for {paper}; on these {reads}-wide inputs it is \
             {fitted} ({HEAD_WIDTH_RATIO}×); set objective.params.{key} to choose"
        );
        *width = fitted;
        Some(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_keep_the_device_and_host_values_equal_and_name_the_first_out_of_range() -> Result<()> {
        let ids = Ids::new(&[3, 0, 7, 9], &Device::Cpu)?;
        assert_eq!(ids.tensor().to_vec1::<u32>()?, ids.host());
        assert_eq!(Ids::range(3, &Device::Cpu)?.host(), [0, 1, 2]);
        ids.check_below(10, |_| unreachable!())?;
        let err = ids
            .check_below(7, |v| format!("id {v} has no row"))
            .unwrap_err();
        assert_eq!(err.to_string(), "id 7 has no row");
        Ok(())
    }
}
