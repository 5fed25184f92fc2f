//! CARP: consistent assignment of views over random partitions.
//!
//! Silva & Ramírez Rivera, "Representation Learning via Consistent Assignment of Views over
//! Random Partitions", NeurIPS 2023. Spec: `docs/spec/objectives.md` §2.17 (recipe §1.4, EMA
//! teacher §3, multi-crop §4, smallest batch §5, disagreements §6.8).
//!
//! The objective owns both heads and works on backbone features (`requirements().projector` is
//! false). Student: backbone → [`CarpHead`] `objective.head` (MLP 2048-2048-256 with batch norm
//! and GELU, no L2 normalisation, weight-normalised prototypes with gain 1, `K` outputs).
//! Teacher: the trainer's EMA copy of the backbone → `objective.teacher_head`, the same head kept
//! as an EMA of the student's, on the `V_g` global crops only.
//!
//! Every step draws a random permutation of the `K` prototypes ([`random_partition`]) and cuts it
//! into `N_P = ⌊K/N_B⌋` blocks of `N_B` consecutive entries (the remainder is dropped). With
//! student logits `S_v` `[B, K]` (`V` crops, global first) and teacher logits `T_w` (`V_g` global
//! crops, constants), `s_{i,j}^v = softmax(S_v[i, block_j])`, `t_{i,j}^w` likewise, and
//! `clip(x) = min(max(x, ε), 1 − ε)` with `ε` the dtype's machine epsilon:
//!
//! `L_c = mean_{(v,w): v≠w} −mean_{j,i} log clip(⟨s_{i,j}^v, t_{i,j}^w⟩)` — global crop `w`'s
//! student view is not paired with its own teacher view, local crops pair with every teacher
//! crop, `V_g·(V − 1)` pairs;
//!
//! `p̄_j = mean` of the block-`j` probability vectors over the `(V + V_g)·B` rows of all student
//! and teacher crops (teacher rows carry no gradient; gathered over data-parallel workers),
//! `L_kl = mean_j [log N_B + Σ_c p̄_{jc} log clip(p̄_{jc})] = mean_j KL(p̄_j ‖ U)`;
//!
//! `L = L_c + L_kl`, both logged (`consistency`, `kl`). The KL form is the code's (§6.8; the
//! paper's `−H(p̄)` differs by a constant).
//!
//! At every step `k`, after the backward pass and before the optimiser step (the reference's
//! order, [`Objective::before_step`]), the teacher momentum `m = 1 − (1 − m_0)(cos(πk/K) + 1)/2`
//! (`m_0` = 0.99) updates the backbone teacher and `teacher_head` with the student weights that
//! produced step `k`'s loss: `θ_t^{k+1} = m θ_t^k + (1 − m) θ_s^k`.
//!
//! In training the heads compute only the `N_P·N_B` partitioned logits, the prototype rows
//! gathered in partition order before the product, so the block softmaxes are a reshape of the
//! logits; the softmax, the pair inner products and the sums of `p̄` are fused CPU kernels.
//!
//! Defaults are the paper's (`K` = 65 536 as in both its main runs and its ablations, `N_B` =
//! 512, bottleneck 256; the ablations use a 128-d bottleneck). The KL term is only informative
//! when the `(V + V_g)·B` rows are many compared with `N_B`; for small batches the spec
//! suggests a smaller `block_size`. The loss is defined at `B = 1` (spec §5), but the heads'
//! batch norm needs at least 2 rows per call.
//!
//! # Example
//!
//! Spec §2.17's known answer: student and teacher logits of two views of two instances over
//! `K = 4` prototypes, partitioned into two blocks of `N_B = 2`; and a step's random partition,
//! a permutation of the prototypes.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_carp::{carp_loss, random_partition};
//! use ssl_core::Progress;
//!
//! let dev = &Device::Cpu;
//! let student = Tensor::new(
//!     &[[[1f64, 0., 2., -1.], [0.5, 0.5, 0., 1.]], [[0., 1., 1., 0.], [2., 0., -1., 0.]]],
//!     dev,
//! )?; // [V, B, K]
//! let teacher = Tensor::new(
//!     &[[[1f64, 0., 1., 0.], [0., 0., 0., 2.]], [[0., 0., 2., 0.], [1., 1., 0., 0.]]],
//!     dev,
//! )?; // [V_g, B, K]
//! let (consistency, kl) = carp_loss(&student, &teacher, &[2, 0, 3, 1], 2)?;
//! assert!((consistency.to_scalar::<f64>()? - 0.6570656664).abs() < 1e-9);
//! assert!((kl.to_scalar::<f64>()? - 0.0005849814).abs() < 1e-9);
//!
//! let at = Progress { step: 3, epoch: 0, steps_per_epoch: 10, total_steps: 10, seed: 0 };
//! let mut partition = random_partition(&at, 4, 2)?;
//! partition.sort_unstable();
//! assert_eq!(partition, [0, 1, 2, 3]);
//! # Ok::<(), anyhow::Error>(())
//! ```

mod head;
mod kernels;

#[cfg(test)]
mod tests;

pub use head::{CarpHead, HeadShape, HEAD_LAYERS};

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor, D};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, Collective, ConfigKey, LossOutput, Objective,
    ObjectiveConfig, Progress, Requirements, RunFacts, SingleProcess, StepContext, TeacherSpec,
};

/// The [`Progress::rng`] stream of the partitions.
pub const PARTITION_STREAM: u64 = 0xCA49;

/// Machine epsilon of `dtype` (`torch.finfo(dtype).eps`, the reference's clip): 2⁻⁵² for f64,
/// 2⁻²³ for f32, 2⁻¹⁰ for f16, 2⁻⁷ for bf16.
pub fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => f32::EPSILON as f64,
    }
}

/// The partition of step `progress`: a random permutation of `0..k` from
/// `progress.rng(PARTITION_STREAM)` (the same after `--resume` and on every worker), truncated
/// to `N_P·N_B` entries, `N_P = ⌊k/n_b⌋`; block `j` is `[j·N_B, (j + 1)·N_B)`.
pub fn random_partition(progress: &Progress, k: usize, n_b: usize) -> Result<Vec<u32>> {
    ensure!(
        (1..=k).contains(&n_b),
        "a CARP partition needs 1 ≤ block size ≤ K, got block size {n_b} and K = {k}"
    );
    let k32 = u32::try_from(k)
        .map_err(|_| anyhow::anyhow!("CARP supports at most {} prototypes, got {k}", u32::MAX))?;
    let mut permutation: Vec<u32> = (0..k32).collect();
    permutation.shuffle(&mut progress.rng(PARTITION_STREAM));
    permutation.truncate(k / n_b * n_b);
    Ok(permutation)
}

/// The prototype indices of `partition` as a `[N_P·N_B]` u32 tensor on `device`, after checking
/// that they are a positive multiple of `n_b` distinct indices `< k`.
pub fn partition_index(
    partition: &[u32],
    k: usize,
    n_b: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let m = partition.len();
    if n_b == 0 || m == 0 || !m.is_multiple_of(n_b) {
        candle_core::bail!(
            "a CARP partition needs a positive multiple of the block size {n_b} indices, got {m}"
        );
    }
    let mut seen = vec![false; k];
    for &p in partition {
        match seen.get_mut(p as usize) {
            Some(s) if !*s => *s = true,
            _ => candle_core::bail!(
                "a CARP partition holds distinct prototype indices < K = {k}; {p} is repeated or \
                 out of range"
            ),
        }
    }
    Tensor::from_slice(partition, m, device)
}

/// Block softmaxes of logits whose last axis lists the prototypes in partition order (column
/// `j·N_B + c` is entry `c` of block `j`): `[…, N_P·N_B]` → `[…, N_P, N_B]`, each block a
/// softmax over its own `N_B` logits (one fused pass each way on the CPU; candle's
/// `softmax_last_dim` has no backward).
pub fn block_probabilities(partitioned_logits: &Tensor, n_b: usize) -> candle_core::Result<Tensor> {
    let m = partitioned_logits.dim(D::Minus1)?;
    if n_b == 0 || m == 0 || !m.is_multiple_of(n_b) {
        candle_core::bail!(
            "CARP blocks need a positive multiple of the block size {n_b} logits, got {m}"
        );
    }
    let mut dims = partitioned_logits.dims().to_vec();
    dims.pop();
    dims.extend([m / n_b, n_b]);
    kernels::softmax_last(&partitioned_logits.reshape(dims)?)
}

/// `L_c`: the mean over the `V_g·(V − 1)` pairs (student crop `v`, teacher crop `w`), `v ≠ w`, of
/// `−mean_{i,j} log clip(⟨s_{i,j}^v, t_{i,j}^w⟩, ε, 1 − ε)`. `student` `[V, B, N_P, N_B]` and
/// `teacher` `[V_g, B, N_P, N_B]` block probabilities (crop `w < V_g` of both is the same global
/// crop); the teacher is a constant.
pub fn consistency(student: &Tensor, teacher: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, n_p, n_b) = student.dims4()?;
    let (vg, bt, n_pt, n_bt) = teacher.dims4()?;
    if vg == 0 || vg > v || v < 2 || (bt, n_pt, n_bt) != (b, n_p, n_b) {
        candle_core::bail!(
            "CARP consistency needs student blocks [V ≥ 2, B, N_P, N_B] and teacher blocks \
             [1 ≤ V_g ≤ V, B, N_P, N_B], got student {:?} and teacher {:?}",
            student.dims(),
            teacher.dims()
        );
    }
    let eps = machine_epsilon(student.dtype());
    let dots = kernels::pair_dots(
        &student.reshape((v, b * n_p, n_b))?,
        &teacher.detach().reshape((vg, b * n_p, n_b))?,
    )?;
    let log_dots = dots.clamp(eps, 1.0 - eps)?.log()?.sum(D::Minus1)?;
    let pairs: Vec<f64> = (0..v * vg)
        .map(|i| f64::from(u8::from(i / vg != i % vg)))
        .collect();
    let mask = Tensor::from_vec(pairs, (v, vg), student.device())?.to_dtype(student.dtype())?;
    (log_dots * mask)?.sum_all()? / -((vg * (v - 1) * b * n_p) as f64)
}

/// `p̄`: the mean block-probability vectors `[N_P, N_B]` over every row of `student`
/// `[V, B, N_P, N_B]` and of the constant `teacher` `[V_g, B, N_P, N_B]`, summed over the
/// workers of `collective` (each with the same `V`, `V_g`, `B`).
pub fn mean_block_probabilities(
    student: &Tensor,
    teacher: &Tensor,
    collective: &dyn Collective,
) -> candle_core::Result<Tensor> {
    let (v, b, n_p, n_b) = student.dims4()?;
    let vg = teacher.dim(0)?;
    let column_sums =
        |p: &Tensor, rows: usize| kernels::column_sums(&p.reshape((rows, n_p * n_b))?);
    let sums = (column_sums(student, v * b)? + column_sums(&teacher.detach(), vg * b)?)?;
    let total = collective.all_gather(&sums.unsqueeze(0)?, 0)?.sum(0)?;
    total.reshape((n_p, n_b))? / ((v + vg) * b * collective.world_size()) as f64
}

/// `L_kl = mean_j [log N_B + Σ_c p̄_{jc} log clip(p̄_{jc}, ε, 1 − ε)] = mean_j KL(p̄_j ‖ U)` of
/// `p_bar` `[N_P, N_B]`.
pub fn kl_to_uniform(p_bar: &Tensor) -> candle_core::Result<Tensor> {
    let n_b = p_bar.dim(D::Minus1)?;
    let eps = machine_epsilon(p_bar.dtype());
    let plogp = (p_bar * p_bar.clamp(eps, 1.0 - eps)?.log()?)?.sum(D::Minus1)?;
    (plogp + (n_b as f64).ln())?.mean_all()
}

/// `(L_c, L_kl)` of student logits `[V, B, M]` and teacher logits `[V_g, B, M]` (detached here)
/// whose columns are already in partition order (`M = N_P·N_B`, see [`block_probabilities`]),
/// with `p̄` gathered over `collective`.
pub fn partitioned_terms(
    student: &Tensor,
    teacher: &Tensor,
    n_b: usize,
    collective: &dyn Collective,
) -> candle_core::Result<(Tensor, Tensor)> {
    let s = block_probabilities(student, n_b)?;
    let t = block_probabilities(&teacher.detach(), n_b)?;
    let l_c = consistency(&s, &t)?;
    let l_kl = kl_to_uniform(&mean_block_probabilities(&s, &t, collective)?)?;
    Ok((l_c, l_kl))
}

/// `(L_c, L_kl)` of student logits `[V, B, K]` and teacher logits `[V_g, B, K]` (detached here)
/// under `partition` (prototype indices, `N_P·N_B` distinct values `< K`, block `j` at
/// `[j·N_B, (j + 1)·N_B)`), with `p̄` gathered over `collective`.
pub fn carp_terms(
    student: &Tensor,
    teacher: &Tensor,
    partition: &[u32],
    n_b: usize,
    collective: &dyn Collective,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (_, b, k) = student.dims3()?;
    let (_, bt, kt) = teacher.dims3()?;
    if (bt, kt) != (b, k) {
        candle_core::bail!(
            "CARP needs student logits [V, B, K] and teacher logits [V_g, B, K], got student {:?} \
             and teacher {:?}",
            student.dims(),
            teacher.dims()
        );
    }
    let index = partition_index(partition, k, n_b, student.device())?;
    partitioned_terms(
        &student.index_select(&index, D::Minus1)?,
        &teacher.detach().index_select(&index, D::Minus1)?,
        n_b,
        collective,
    )
}

/// The CARP loss terms `(L_c, L_kl)` (spec §2.17) on one process; `L = L_c + L_kl`. See
/// [`carp_terms`] for the arguments.
pub fn carp_loss(
    student: &Tensor,
    teacher: &Tensor,
    partition: &[u32],
    n_b: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    carp_terms(student, teacher, partition, n_b, &SingleProcess)
}

/// CARP hyper-parameters (the paper's defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CarpConfig {
    /// Number of prototypes `K` (65 536, main runs and ablations).
    pub num_prototypes: usize,
    /// Block size `N_B` of the random partitions (512).
    pub block_size: usize,
    /// Bottleneck width before the prototypes (256; 128 in the ablations).
    pub bottleneck: usize,
    /// Hidden width of the head's MLP (2048).
    pub head_hidden: usize,
    /// Base teacher momentum `m_0`, cosine-ramped to 1 over training (0.99).
    pub momentum_base: f64,
}

impl Default for CarpConfig {
    fn default() -> Self {
        Self {
            num_prototypes: 65536,
            block_size: 512,
            bottleneck: 256,
            head_hidden: 2048,
            momentum_base: 0.99,
        }
    }
}

impl ObjectiveConfig for CarpConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.num_prototypes >= 2,
            "`num_prototypes` must be ≥ 2 (CARP uses 65536), got {}",
            self.num_prototypes
        );
        ensure!(
            self.block_size >= 2 && self.block_size <= self.num_prototypes,
            "`block_size` must lie in [2, num_prototypes = {}] (a block of one prototype has \
             probability 1 and no gradient; CARP uses 512), got {}; lower `block_size` or raise \
             `num_prototypes`",
            self.num_prototypes,
            self.block_size
        );
        ensure!(
            u32::try_from(self.num_prototypes).is_ok(),
            "`num_prototypes` must be at most {}, got {}",
            u32::MAX,
            self.num_prototypes
        );
        ensure!(
            self.head_hidden >= 1 && self.bottleneck >= 1,
            "`head_hidden` and `bottleneck` must be ≥ 1 (CARP uses 2048 and 256), got {} and {}",
            self.head_hidden,
            self.bottleneck
        );
        ensure!(
            (0.0..=1.0).contains(&self.momentum_base),
            "`momentum_base` must lie in [0, 1] (CARP uses 0.99), got {}",
            self.momentum_base
        );
        Ok(())
    }

    /// `K` beyond the training set (the paper's 65,536 prototypes for ImageNet's 1.28 M images)
    /// becomes the largest power of two within it, and `N_B` keeps the paper's 128 blocks; a
    /// head much wider than the encoder's features (the paper's 2048 on a ResNet-50's 2048)
    /// is fitted to them ([`RunFacts::fit_head_width`]).
    fn fit_to_data(&mut self, run: &RunFacts, defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        let mut notes = Vec::new();
        let n = run.num_instances;
        if defaulted("num_prototypes") && self.num_prototypes > n {
            let (k, blocks) = (run.power_of_two_within_instances(4), 128);
            let mut note = format!(
                "CARP's {} prototypes are more than the {n} training images: num_prototypes = {k}",
                self.num_prototypes
            );
            self.num_prototypes = k;
            if defaulted("block_size") {
                self.block_size = (k / blocks).max(2);
                note += &format!(
                    " and block_size = {} (the paper's {blocks} blocks)",
                    self.block_size
                );
            }
            notes.push(note + "; set objective.params.num_prototypes to choose");
        }
        let paper = "ResNet-50's 2048 features";
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
        Ok(Box::new(Carp::new(self.clone(), ctx)?))
    }
}

/// The CARP objective: student and teacher heads.
pub struct Carp {
    cfg: CarpConfig,
    head: CarpHead,
    teacher_head: CarpHead,
}

impl Carp {
    /// Creates `objective.head` and `objective.teacher_head` (a copy of the head) for backbone
    /// features of width `ctx.feature_dim`.
    pub fn new(cfg: CarpConfig, ctx: &BuildContext<'_>) -> Result<Self> {
        cfg.validate()?;
        ensure!(
            ctx.feature_dim > 0,
            "CARP needs backbone features of width > 0"
        );
        let shape = HeadShape {
            in_dim: ctx.feature_dim,
            hidden: cfg.head_hidden,
            bottleneck: cfg.bottleneck,
            prototypes: cfg.num_prototypes,
        };
        let head = CarpHead::new(shape, ctx.vb.pp("head"))?;
        let teacher_head = CarpHead::new(shape, ctx.vb.pp("teacher_head"))?;
        teacher_head.copy_from(&head)?;
        Ok(Self {
            cfg,
            head,
            teacher_head,
        })
    }

    /// The student head `objective.head`.
    pub fn head(&self) -> &CarpHead {
        &self.head
    }
    /// The teacher head `objective.teacher_head`.
    pub fn teacher_head(&self) -> &CarpHead {
        &self.teacher_head
    }
}

impl Objective for Carp {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 2,
            min_batch: 1,
            min_batch_reason: "the loss needs one instance",
            projector: false,
            teacher: Some(TeacherSpec { train_mode: true }),
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let Some(teacher) = batch.teacher else {
            bail!(
                "objective `carp` needs the EMA teacher's backbone features (Batch::teacher), but \
                 the batch has none; the trainer provides them when requirements().teacher is set"
            );
        };
        let (v, b, f) = batch.projections.dims3()?;
        let vg = batch.global_views;
        ensure!(
            v >= 2,
            "objective `carp` needs at least 2 views (student crop v, teacher crop w ≠ v), got {v}; \
             use --views 2 or more"
        );
        ensure!(
            (1..=v).contains(&vg) && teacher.dims() == [vg, b, f],
            "objective `carp` expects teacher features [V_g, B, F] = [{vg}, {b}, {f}] of the \
             1 ≤ V_g ≤ {v} global views, got {:?}",
            teacher.dims()
        );
        if batch.train && vg * b < 2 {
            bail!(
                "objective `carp` passes the {vg} global crop(s) × {b} instance(s) through the \
                 teacher head's batch norm, which needs at least 2 rows; use a batch size of 2 or \
                 more, or more global views"
            );
        }
        let k = self.cfg.num_prototypes;
        let partition = random_partition(&batch.progress, k, self.cfg.block_size)?;
        let index = partition_index(&partition, k, self.cfg.block_size, teacher.device())?;
        let student = self
            .head
            .forward_views(batch.projections, batch.train, Some(&index))?;
        let teacher_logits = self
            .teacher_head
            .forward_views(&teacher.detach(), batch.train, Some(&index))?
            .detach();
        let (l_c, l_kl) = partitioned_terms(
            &student,
            &teacher_logits,
            self.cfg.block_size,
            batch.collective,
        )?;
        Ok(LossOutput::new((&l_c + &l_kl)?)
            .with_term("consistency", l_c)
            .with_term("kl", l_kl))
    }

    fn before_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        let m = ctx.progress.cosine_ramp(self.cfg.momentum_base, 1.0);
        ctx.ema_update(m)?;
        self.teacher_head.ema_from(&self.head, m)
    }
}

register_objective! {
    name: "carp",
    aliases: &[],
    summary: "consistent assignment of student crops to the EMA teacher's prototypes over random partitions, plus KL-to-uniform per block",
    paper: "Silva, Ramírez Rivera. Representation Learning via Consistent Assignment of Views \
            over Random Partitions. NeurIPS 2023",
    keys: &[
        ConfigKey { name: "num_prototypes", doc: "number of prototypes K of the weight-normalised last layer (65536)" },
        ConfigKey { name: "block_size", doc: "prototypes per random block N_B, 2 ≤ N_B ≤ K; smaller for small batches (512)" },
        ConfigKey { name: "bottleneck", doc: "bottleneck width before the prototypes, no L2 normalisation (256; 128 in the ablations)" },
        ConfigKey { name: "head_hidden", doc: "hidden width of the head's 3-layer MLP with batch norm and GELU (2048)" },
        ConfigKey { name: "momentum_base", doc: "base teacher EMA momentum, cosine-ramped to 1 over training (0.99)" },
    ],
    config: CarpConfig,
}
