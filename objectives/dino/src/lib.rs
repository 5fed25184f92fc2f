//! DINO: self-distillation with no labels.
//!
//! Caron, Touvron, Misra, Jégou, Mairal, Bojanowski & Joulin, "Emerging Properties in
//! Self-Supervised Vision Transformers", ICCV 2021. Spec: `docs/spec/objectives.md` §2.22
//! (EMA teacher §3, multi-crop §4, smallest batch §5).
//!
//! The objective owns both heads and works on backbone features (`requirements().projector` is
//! false). Student: backbone → [`DinoHead`] `objective.head` (3-layer MLP 2048-2048-256 with
//! GELU, L2-normalise, weight-normalised prototypes with gain 1, `K` = 65 536 outputs).
//! Teacher: the trainer's EMA copy of the backbone → `objective.teacher_head`, the same head
//! kept as an EMA of the student's, on the `V_g` global crops only.
//!
//! With student logits `s` `[V, B, K]` (all crops, global first) and teacher logits `t`
//! `[V_g, B, K]`, centre `c` `[K]`:
//!
//! `P_t^a = sg(softmax((t^a − c)/τ_t))`,  `log P_s^b = log softmax(s^b/τ_s)`,
//!
//! `L = (1/(P·B)) Σ_{a<V_g} Σ_{b<V, b≠a} Σ_i −⟨P_t^a[i], log P_s^b[i]⟩`,  `P = V_g·(V − 1)` pairs.
//!
//! After every optimiser step ([`Objective::after_step`]):
//! * teacher momentum `m = 1 − (1 − m_0)(cos(πk/K) + 1)/2` (per iteration, `m_0` = 0.996); the
//!   backbone teacher and `teacher_head` both follow `θ_t ← m θ_t + (1 − m) θ_s`;
//! * centre `c ← m_c c + (1 − m_c)·mean_{a,i} t^a[i]` with the teacher logits of the step's loss
//!   (all global crops, the whole batch across devices), `m_c` = 0.9. The centre
//!   (`objective.center`) is a checkpointed buffer that never gets a gradient.
//!
//! Temperatures: `τ_s` = 0.1; `τ_t` warms up linearly per **epoch** from `warmup_teacher_temp`
//! to `teacher_temp` over `warmup_teacher_temp_epochs` (numpy `linspace` semantics, the last
//! warm-up epoch already at the final value), then stays constant ([`teacher_temperature`]).
//! Defaults are DINO's (0.04 → 0.04, so the 30 warm-up epochs change nothing); the IConE
//! baseline uses `teacher_temp: 0.07` (0.04 → 0.07 over 30 epochs). The prototypes stay
//! frozen during the first `freeze_last_layer_epochs` epochs (1), and the ViT recipe's gradient
//! clipping (`clip_grad`, 3.0: each student parameter's gradient to norm 3.0 on its own) applies:
//! both parameter groups the objective declares (`ssl describe dino`) and the trainer applies.
//!
//! The loss is defined at `B = 1` (spec §5), though the centre then follows single samples; with
//! `use_bn` the heads' batch norm needs at least 2 rows per call.
//!
//! # Example
//!
//! Spec §2.22's known answers: the loss of student and teacher logits (two views of two
//! instances, `K = 3`) at `τ_s = 0.1`, `τ_t = 0.04`, and the centre after the step at `m = 0.9`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_dino::{dino_loss, updated_center};
//!
//! let dev = &Device::Cpu;
//! let student = Tensor::new(
//!     &[[[1f64, 0., -1.], [0., 2., 0.]], [[0.5, 0.5, 0.], [1., 1., 1.]]],
//!     dev,
//! )?; // [V, B, K]
//! let teacher = Tensor::new(
//!     &[[[2f64, 0., 0.], [0., 1., 0.]], [[0., 0., 1.], [1., 0., 0.]]],
//!     dev,
//! )?; // [V_g, B, K]
//! let center = Tensor::new(&[0.1f64, 0., -0.1], dev)?;
//! let loss = dino_loss(&student, &teacher, &center, 0.1, 0.04)?.to_scalar::<f64>()?;
//! assert!((loss - 10.4487920455).abs() < 1e-8);
//! // 0.9·c + 0.1·(the teacher logits' mean [0.75, 0.25, 0.25])
//! let center = updated_center(&center, &teacher, 0.9)?.to_vec1::<f64>()?;
//! for (got, want) in center.iter().zip([0.165, 0.025, -0.065]) {
//!     assert!((got - want).abs() < 1e-12);
//! }
//! # Ok::<(), candle_core::Error>(())
//! ```

mod head;

#[cfg(test)]
mod tests;

pub use head::{DinoHead, HeadShape};

use anyhow::{bail, ensure, Result};
use candle_core::{Tensor, Var, D};
use candle_nn::Init;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    ParamGroup, Requirements, RunFacts, StepContext, TeacherSpec,
};

/// Teacher temperature of `epoch` (0-based): `linspace(warmup_start, final, warmup_epochs)[epoch]`
/// during the warm-up, `final` afterwards, i.e.
/// `warmup_start + (final − warmup_start)·epoch/(warmup_epochs − 1)` for `epoch < warmup_epochs`
/// (`warmup_start` itself when `warmup_epochs` = 1).
pub fn teacher_temperature(
    epoch: usize,
    warmup_start: f64,
    final_temp: f64,
    warmup_epochs: usize,
) -> f64 {
    if epoch >= warmup_epochs {
        final_temp
    } else if warmup_epochs == 1 {
        warmup_start
    } else {
        warmup_start + (final_temp - warmup_start) * epoch as f64 / (warmup_epochs - 1) as f64
    }
}

/// The teacher targets `sg(softmax((t − c)/τ_t))`: `teacher_logits` `[V_g, B, K]`, `center`
/// `[K]` → `[V_g, B, K]`, without gradient.
pub fn teacher_probabilities(
    teacher_logits: &Tensor,
    center: &Tensor,
    tau_t: f64,
) -> candle_core::Result<Tensor> {
    let centred = teacher_logits
        .detach()
        .broadcast_sub(&center.detach().to_dtype(teacher_logits.dtype())?)?;
    candle_nn::ops::softmax_last_dim(&(centred / tau_t)?)
}

/// The cross-entropy over the crop pairs, `(1/(P·B)) Σ_{a<V_g} Σ_{b≠a} Σ_i −⟨q^a[i],
/// log softmax(s^b[i]/τ_s)⟩`, of student logits `s` `[V, B, K]` and teacher targets `q`
/// `[V_g, B, K]` (constants; crop `a` of `q` is crop `a` of `s`), `V ≥ 2`, `1 ≤ V_g ≤ V`.
///
/// Computed as `−(⟨Σ_a q^a, Σ_b log p^b⟩ − Σ_a ⟨q^a, log p^a⟩)/(P·B)`, linear in `V`.
pub fn pair_cross_entropy(
    student_logits: &Tensor,
    targets: &Tensor,
    tau_s: f64,
) -> candle_core::Result<Tensor> {
    let (v, b, k) = student_logits.dims3()?;
    let (vg, bt, kt) = targets.dims3()?;
    if v < 2 || vg == 0 || vg > v || (bt, kt) != (b, k) {
        candle_core::bail!(
            "DINO needs student logits [V ≥ 2, B, K] and teacher logits [1 ≤ V_g ≤ V, B, K], got \
             student {:?} and teacher {:?}",
            student_logits.dims(),
            targets.dims()
        );
    }
    let q = targets.detach();
    let log_p = candle_nn::ops::log_softmax(&(student_logits / tau_s)?, D::Minus1)?;
    let same_crop = (&q * log_p.narrow(0, 0, vg)?)?.sum_all()?;
    let all_pairs = (q.sum(0)? * log_p.sum(0)?)?.sum_all()?;
    (same_crop - all_pairs)? / (vg * (v - 1) * b) as f64
}

/// The DINO loss (spec §2.22): [`pair_cross_entropy`] of the student logits `[V, B, K]` against
/// [`teacher_probabilities`] of the teacher logits `[V_g, B, K]` with centre `[K]`.
pub fn dino_loss(
    student_logits: &Tensor,
    teacher_logits: &Tensor,
    center: &Tensor,
    tau_s: f64,
    tau_t: f64,
) -> candle_core::Result<Tensor> {
    let targets = teacher_probabilities(teacher_logits, center, tau_t)?;
    pair_cross_entropy(student_logits, &targets, tau_s)
}

/// The centre after a step, `m·c + (1 − m)·mean(t)`, without gradient: `center` `[K]`,
/// `teacher_logits` `[…, K]` averaged over every leading axis (crops and batch; a `[K]` batch
/// mean passes through unchanged).
pub fn updated_center(
    center: &Tensor,
    teacher_logits: &Tensor,
    momentum: f64,
) -> candle_core::Result<Tensor> {
    let k = center.elem_count();
    let mean = teacher_logits
        .detach()
        .to_dtype(center.dtype())?
        .reshape(((), k))?
        .mean(0)?;
    (center.detach() * momentum)? + (mean * (1.0 - momentum))?
}

/// Mean entropy `−Σ_k q_k log q_k` of the teacher targets `[V_g, B, K]` (a collapse monitor:
/// 0 when one prototype dominates, `log K` when the centre makes the targets uniform).
fn mean_entropy(targets: &Tensor) -> candle_core::Result<Tensor> {
    let rows = (targets.elem_count() / targets.dim(D::Minus1)?) as f64;
    let plogp = (targets * targets.clamp(1e-30, 1.0)?.log()?)?;
    plogp.sum_all()? / -rows
}

/// DINO hyper-parameters (the reference's defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DinoConfig {
    /// Number of prototypes `K` (65 536).
    pub out_dim: usize,
    /// Linear layers of the head's MLP (3).
    pub head_layers: usize,
    /// Hidden width of the head's MLP (2048).
    pub head_hidden: usize,
    /// Bottleneck width before the prototypes (256).
    pub bottleneck: usize,
    /// Batch norm after the hidden layers of the head (false).
    pub use_bn: bool,
    /// Student temperature `τ_s` (0.1).
    pub student_temp: f64,
    /// Final teacher temperature (0.04; 0.07 in the IConE baseline).
    pub teacher_temp: f64,
    /// Teacher temperature at epoch 0 (0.04).
    pub warmup_teacher_temp: f64,
    /// Epochs of linear teacher-temperature warm-up (30).
    pub warmup_teacher_temp_epochs: usize,
    /// Centre momentum `m_c` (0.9).
    pub center_momentum: f64,
    /// Base teacher momentum `m_0`, cosine-ramped to 1 over training (0.996).
    pub momentum_base: f64,
    /// Epochs at the start during which the prototypes get no gradient (1).
    pub freeze_last_layer_epochs: usize,
    /// Each student parameter's gradient (encoder and head) is clipped to this norm on its
    /// own, as the reference's `clip_gradients` (3.0; 0: off).
    pub clip_grad: f64,
}

impl Default for DinoConfig {
    fn default() -> Self {
        Self {
            out_dim: 65536,
            head_layers: 3,
            head_hidden: 2048,
            bottleneck: 256,
            use_bn: false,
            student_temp: 0.1,
            teacher_temp: 0.04,
            warmup_teacher_temp: 0.04,
            warmup_teacher_temp_epochs: 30,
            center_momentum: 0.9,
            momentum_base: 0.996,
            freeze_last_layer_epochs: 1,
            clip_grad: 3.0,
        }
    }
}

impl ObjectiveConfig for DinoConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.clip_grad.is_finite() && self.clip_grad >= 0.0,
            "`clip_grad` must be ≥ 0 (the reference clips each gradient to norm 3.0; 0: off), got {}",
            self.clip_grad
        );
        ensure!(
            self.out_dim >= 2,
            "`out_dim` must be ≥ 2 (with one prototype both distributions are 1 and the loss is \
             constant; DINO uses 65536), got {}",
            self.out_dim
        );
        ensure!(
            self.head_layers >= 1,
            "`head_layers` must be ≥ 1 (DINO uses 3), got 0"
        );
        ensure!(
            self.head_hidden >= 1 && self.bottleneck >= 1,
            "`head_hidden` and `bottleneck` must be ≥ 1 (DINO uses 2048 and 256), got {} and {}",
            self.head_hidden,
            self.bottleneck
        );
        for (key, value, paper) in [
            ("student_temp", self.student_temp, 0.1),
            ("teacher_temp", self.teacher_temp, 0.04),
            ("warmup_teacher_temp", self.warmup_teacher_temp, 0.04),
        ] {
            ensure!(
                value.is_finite() && value > 0.0,
                "`{key}` must be a temperature > 0 (DINO uses {paper}), got {value}"
            );
        }
        for (key, value, paper) in [
            ("center_momentum", self.center_momentum, 0.9),
            ("momentum_base", self.momentum_base, 0.996),
        ] {
            ensure!(
                (0.0..=1.0).contains(&value),
                "`{key}` must lie in [0, 1] (DINO uses {paper}), got {value}"
            );
        }
        Ok(())
    }

    /// `K` beyond the training set (the reference's 65,536 prototypes for ImageNet) becomes
    /// the largest power of two within it; a head much wider than the encoder's features (the
    /// reference's 2048 on ViT-S/16's 384) is fitted to them ([`RunFacts::fit_head_width`]).
    fn fit_to_data(&mut self, run: &RunFacts, defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut notes = Vec::new();
        let n = run.num_instances;
        if defaulted("out_dim") && self.out_dim > n {
            let k = run.power_of_two_within_instances(2);
            notes.push(format!(
                "DINO's {} prototypes are more than the {n} training images: out_dim = {k}; \
                 set objective.params.out_dim to choose",
                self.out_dim
            ));
            self.out_dim = k;
        }
        let paper = "ViT-S/16's 384 features";
        notes.extend(run.fit_head_width(
            "head_hidden",
            &mut self.head_hidden,
            run.feature_dim,
            paper,
            defaulted,
        ));
        notes
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Dino::new(self.clone(), ctx)?))
    }
}

/// The DINO objective: student and teacher heads, the centre, and the teacher logits' mean
/// of the last training loss, folded into the centre after the step.
pub struct Dino {
    cfg: DinoConfig,
    head: DinoHead,
    teacher_head: DinoHead,
    /// `c`, `[K]`.
    center: Var,
    /// `mean_{a,i} t^a[i]` `[K]` of the last training loss, detached.
    batch_center: Option<Tensor>,
}

impl Dino {
    /// Creates `objective.head`, `objective.teacher_head` (a copy of the head) and
    /// `objective.center` (zeros) for backbone features of width `ctx.feature_dim`.
    pub fn new(cfg: DinoConfig, ctx: &BuildContext<'_>) -> Result<Self> {
        ensure!(
            ctx.feature_dim > 0,
            "DINO needs backbone features of width > 0"
        );
        let shape = HeadShape {
            in_dim: ctx.feature_dim,
            layers: cfg.head_layers,
            hidden: cfg.head_hidden,
            bottleneck: cfg.bottleneck,
            out_dim: cfg.out_dim,
            use_bn: cfg.use_bn,
        };
        let head = DinoHead::new(shape, ctx.vb.pp("head"))?;
        let teacher_head = DinoHead::new(shape, ctx.vb.pp("teacher_head"))?;
        teacher_head.copy_from(&head)?;
        let center = ctx
            .vb
            .get_with_hints(cfg.out_dim, "center", Init::Const(0.0))?;
        ensure!(
            center.is_variable(),
            "DINO needs a VarBuilder that hands out variables (a ParamStore or VarMap) for its centre"
        );
        Ok(Self {
            cfg,
            head,
            teacher_head,
            center: Var::from_tensor(&center)?,
            batch_center: None,
        })
    }

    /// The reference's parameter groups: gradient clipping over the student (the encoder and
    /// `objective.head`), each parameter on its own (none with `clip_grad: 0`), and the
    /// prototypes `objective.head.last_layer.` frozen for `freeze_last_layer_epochs` (its
    /// `cancel_gradients_last_layer`; the loss also detaches them then, which only saves their
    /// gradient's computation).
    fn param_groups(&self) -> Vec<ParamGroup> {
        let mut groups = Vec::new();
        if self.cfg.clip_grad > 0.0 {
            let mut student = ParamGroup::new(["encoder.", "objective.head."]);
            student.clip_grad_norm = Some(self.cfg.clip_grad);
            student.clip_per_parameter = true;
            groups.push(student);
        }
        if self.cfg.freeze_last_layer_epochs > 0 {
            let mut last = ParamGroup::new(["objective.head.last_layer."]);
            last.freeze_epochs = Some(self.cfg.freeze_last_layer_epochs);
            groups.push(last);
        }
        groups
    }

    /// The student head `objective.head`.
    pub fn head(&self) -> &DinoHead {
        &self.head
    }
    /// The teacher head `objective.teacher_head`.
    pub fn teacher_head(&self) -> &DinoHead {
        &self.teacher_head
    }
    /// The centre `c`, `[K]`.
    pub fn center(&self) -> &Tensor {
        self.center.as_tensor()
    }
}

impl Objective for Dino {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 2,
            min_batch: 1,
            min_batch_reason: "the loss needs one instance",
            projector: false,
            teacher: Some(TeacherSpec { train_mode: true }),
            param_groups: self.param_groups(),
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let Some(teacher) = batch.teacher else {
            bail!(
                "objective `dino` needs the EMA teacher's backbone features (Batch::teacher), but \
                 the batch has none; the trainer provides them when requirements().teacher is set"
            );
        };
        let (v, b, f) = batch.projections.dims3()?;
        ensure!(
            v >= 2,
            "objective `dino` needs at least 2 views (teacher crop a, student crop b ≠ a), got {v}; \
             use --views 2 or more"
        );
        ensure!(
            teacher.dims() == [batch.global_views, b, f],
            "objective `dino` expects teacher features [V_g, B, F] = [{}, {b}, {f}] of the global \
             views, got {:?}",
            batch.global_views,
            teacher.dims()
        );
        if self.cfg.use_bn && batch.train && batch.global_views * b < 2 {
            bail!(
                "objective `dino` with `use_bn: true` passes the {} global crops × {b} instances \
                 through the teacher head's batch norm, which needs at least 2 rows; use a batch \
                 size of 2 or more, or `use_bn: false`",
                batch.global_views
            );
        }
        let frozen = batch.progress.epoch < self.cfg.freeze_last_layer_epochs;
        let student = self
            .head
            .forward_views(batch.projections, batch.train, frozen)?;
        let teacher_logits = self
            .teacher_head
            .forward_views(&teacher.detach(), batch.train, true)?
            .detach();
        let tau_t = teacher_temperature(
            batch.progress.epoch,
            self.cfg.warmup_teacher_temp,
            self.cfg.teacher_temp,
            self.cfg.warmup_teacher_temp_epochs,
        );
        let targets = teacher_probabilities(&teacher_logits, self.center.as_tensor(), tau_t)?;
        let loss = pair_cross_entropy(&student, &targets, self.cfg.student_temp)?;
        if batch.train {
            let global = batch.collective.all_gather(&teacher_logits, 1)?;
            self.batch_center = Some(global.mean((0, 1))?);
        }
        Ok(LossOutput::new(loss).with_term("teacher_entropy", mean_entropy(&targets)?))
    }

    fn after_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        let m = ctx.progress.cosine_ramp(self.cfg.momentum_base, 1.0);
        ctx.ema_update(m)?;
        self.teacher_head.ema_from(&self.head, m)?;
        if let Some(mean) = self.batch_center.take() {
            let c = updated_center(self.center.as_tensor(), &mean, self.cfg.center_momentum)?;
            self.center.set(&c)?;
        }
        Ok(())
    }
}

register_objective! {
    name: "dino",
    aliases: &[],
    summary: "self-distillation: student crops predict the centred, sharpened EMA teacher's prototype distribution of the global crops",
    paper: "Caron, Touvron, Misra, Jégou, Mairal, Bojanowski, Joulin. Emerging Properties in \
            Self-Supervised Vision Transformers. ICCV 2021",
    keys: &[
        ConfigKey { name: "out_dim", doc: "number of prototypes K of the weight-normalised last layer (65536)" },
        ConfigKey { name: "head_layers", doc: "Linear layers of the head's MLP, the last to the bottleneck (3)" },
        ConfigKey { name: "head_hidden", doc: "hidden width of the head's MLP (2048)" },
        ConfigKey { name: "bottleneck", doc: "bottleneck width before L2 normalisation and the prototypes (256)" },
        ConfigKey { name: "use_bn", doc: "batch norm after the head's hidden layers (false)" },
        ConfigKey { name: "student_temp", doc: "student softmax temperature τ_s (0.1)" },
        ConfigKey { name: "teacher_temp", doc: "final teacher temperature τ_t (0.04; 0.07 in the IConE baseline)" },
        ConfigKey { name: "warmup_teacher_temp", doc: "teacher temperature at epoch 0, warmed up linearly per epoch (0.04)" },
        ConfigKey { name: "warmup_teacher_temp_epochs", doc: "epochs of teacher-temperature warm-up, linspace semantics (30)" },
        ConfigKey { name: "center_momentum", doc: "centre momentum m_c: c ← m_c·c + (1 − m_c)·mean teacher logits (0.9)" },
        ConfigKey { name: "momentum_base", doc: "base teacher EMA momentum, cosine-ramped to 1 over training (0.996)" },
        ConfigKey { name: "freeze_last_layer_epochs", doc: "epochs at the start during which the prototypes get no gradient (1)" },
        ConfigKey { name: "clip_grad", doc: "each student parameter's gradient clipped to this norm on its own (3.0; 0: off)" },
    ],
    config: DinoConfig,
}
