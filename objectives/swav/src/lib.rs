//! SwAV: swapped prediction of Sinkhorn–Knopp cluster assignments.
//!
//! Caron, Misra, Mairal, Goyal, Bojanowski & Joulin, "Unsupervised Learning of Visual Features by
//! Contrasting Cluster Assignments", NeurIPS 2020. Spec: `docs/spec/objectives.md` §2.21
//! (multi-view handling §4, smallest batch §5).
//!
//! Every view is normalised, `z_v = normalize(projections_v)` `[B, D]`, and scored against the
//! prototypes `C` `[K, D]` (unit rows): `S_v = z_v Cᵀ` `[B, K]`. Each global crop `s` (the
//! assignment crops; §4: targets from global crops) gets codes `q^s = sinkhorn(S_s)` without
//! gradient, predicted from every other crop, local crops included:
//!
//! `ℓ_s = (1/(V − 1)) Σ_{v≠s} mean_i CE(q_i^s, softmax(S_v[i]/τ))`,  `L = mean_s ℓ_s`.
//!
//! The prototypes are the trained parameter `objective.prototypes.weight`, re-normalised to unit
//! rows after build and after every optimiser step; during the first `freeze_prototypes_steps`
//! steps they receive no gradient. An optional queue of past global-view embeddings
//! (`objective.queue` with `queue_ptr` and `queue_fill`, checkpointed) is prepended to Sinkhorn's
//! input once it is full and the epoch has reached `queue_start_epoch`.
//!
//! Needs `B ≥ 2` without a queue: Sinkhorn on a single sample returns exactly uniform codes.
//!
//! # Example
//!
//! Spec §2.21's Sinkhorn codes of three instances' scores against two prototypes (`ε = 0.05`,
//! three iterations): each row is a distribution over the prototypes.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_swav::sinkhorn;
//!
//! let scores = Tensor::new(&[[0.9f64, 0.1], [0.8, 0.3], [0.2, 0.7]], &Device::Cpu)?; // [B, K]
//! let codes = sinkhorn(&scores, 0.05, 3)?.to_vec2::<f64>()?;
//! assert!((codes[0][0] - 0.99997245602).abs() < 1e-10);
//! assert!((codes[2][1] - 0.99999981452).abs() < 1e-10);
//! for row in &codes {
//!     assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
//! }
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor, Var, D};
use candle_nn::Init;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements, RunFacts, StepContext,
};
use ssl_linalg::normalize_rows;

#[cfg(test)]
mod tests;

/// Sinkhorn–Knopp equal-partition codes of `scores` `[B, K]` → `[B, K]`, without gradient
/// (spec §2.21). With `Q = exp(Sᵀ/ε)` `[K, B]`: `Q /= ΣQ`; `iterations` times
/// `Q /= rowsum; Q /= K` (every prototype gets mass `1/K`), `Q /= colsum; Q /= B` (every sample
/// gets `1/B`); finally `Q *= B` and `Qᵀ` is returned, so every row of the result sums to 1.
/// Computed directly in the `[B, K]` layout: the spec's row sums are sums over samples here.
///
/// `max(S)/ε` is subtracted before `exp`: a common factor of every entry, removed exactly by the
/// first `Q /= ΣQ`, so the result is unchanged and large scores cannot overflow. Returned in the
/// dtype of `scores`. On the CPU the small `B × K` matrix is computed in f64 with plain loops
/// over rows (tensor reductions over the sample axis were most of SwAV's loss time); on other
/// devices it stays there, [`sinkhorn_on_device`], so a step reads nothing back to the host.
pub fn sinkhorn(scores: &Tensor, epsilon: f64, iterations: usize) -> candle_core::Result<Tensor> {
    if !scores.device().is_cpu() {
        return sinkhorn_on_device(scores, epsilon, iterations);
    }
    let (b, k) = scores.dims2()?;
    let dtype = scores.dtype();
    let scores = scores.detach().flatten_all()?;
    // Widened in Rust: Candle's own f32 → f64 conversion is several times slower.
    let mut q: Vec<f64> = match scores.dtype() {
        DType::F32 => scores
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => scores.to_dtype(DType::F64)?.to_vec1::<f64>()?,
    };
    let max = q.iter().copied().fold(f64::NEG_INFINITY, f64::max) / epsilon;
    // The `exp` pass is most of the time: rows in blocks on Candle's CPU workers.
    ssl_linalg::for_each_chunk_mut(
        &mut q,
        16 * k,
        || (),
        |_, _, block| {
            block
                .iter_mut()
                .for_each(|x| *x = (*x / epsilon - max).exp());
        },
    );
    let inverse_total = 1.0 / q.iter().sum::<f64>();
    q.iter_mut().for_each(|x| *x *= inverse_total);
    let mut per_prototype = vec![0f64; k];
    for _ in 0..iterations {
        per_prototype.fill(0.0);
        for row in q.chunks_exact(k) {
            per_prototype.iter_mut().zip(row).for_each(|(m, x)| *m += x);
        }
        per_prototype
            .iter_mut()
            .for_each(|m| *m = 1.0 / (*m * k as f64));
        for row in q.chunks_exact_mut(k) {
            row.iter_mut()
                .zip(&per_prototype)
                .for_each(|(x, r)| *x *= r);
        }
        for row in q.chunks_exact_mut(k) {
            let inverse_mass = 1.0 / (row.iter().sum::<f64>() * b as f64);
            row.iter_mut().for_each(|x| *x *= inverse_mass);
        }
    }
    q.iter_mut().for_each(|x| *x *= b as f64);
    Tensor::from_vec(q, (b, k), &candle_core::Device::Cpu)?.to_dtype(dtype)
}

/// [`sinkhorn`] as tensor operations on the device of `scores` `[B, K]`, in the log domain so
/// that no prototype's or sample's mass underflows to an all-zero line whatever `ε` (f32's `exp`
/// underflows below −87, which `S/ε` reaches at `ε = 0.02`): `L = S/ε − lse(S/ε)`; per iteration
/// `L −= lse_samples(L) + ln K`, `L −= lse_prototypes(L) + ln B`; the codes are `B·exp(L)`.
/// In f64 for f64 scores, else in f32 (bf16 is widened); returned in the dtype of `scores`.
pub fn sinkhorn_on_device(
    scores: &Tensor,
    epsilon: f64,
    iterations: usize,
) -> candle_core::Result<Tensor> {
    let (b, k) = scores.dims2()?;
    let dtype = scores.dtype();
    let work = match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let scaled = (scores.detach().to_dtype(work)? / epsilon)?;
    let total = log_sum_exp(&scaled.flatten_all()?, 0)?.unsqueeze(0)?;
    let mut log_q = scaled.broadcast_sub(&total)?;
    let (ln_k, ln_b) = ((k as f64).ln(), (b as f64).ln());
    for _ in 0..iterations {
        log_q = log_q.broadcast_sub(&(log_sum_exp(&log_q, 0)? + ln_k)?)?;
        log_q = log_q.broadcast_sub(&(log_sum_exp(&log_q, 1)? + ln_b)?)?;
    }
    (log_q + ln_b)?.exp()?.to_dtype(dtype)
}

/// `ln Σ exp(x)` along `dim`, kept as a size-1 dimension, with the maximum factored out.
fn log_sum_exp(x: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(dim)?;
    x.broadcast_sub(&max)?.exp()?.sum_keepdim(dim)?.log()? + max
}

/// The swapped-prediction loss `L = mean_s (1/(V − 1)) Σ_{v≠s} mean_i CE(q_i^s, softmax(S_v[i]/τ))`
/// of `scores` `[V, B, K]` (all crops) and `codes` `[G, B, K]` (the Sinkhorn codes of the first
/// `G ≤ V` crops, treated as constants), with `CE(q, p) = −Σ_k q_k log p_k`.
///
/// Computed as `(Σ_s ⟨q^s, log p_s⟩ − ⟨Σ_s q^s, Σ_v log p_v⟩) / (B·(V − 1)·G)`.
pub fn swapped_prediction_loss(
    scores: &Tensor,
    codes: &Tensor,
    temperature: f64,
) -> candle_core::Result<Tensor> {
    let (v, b, k) = scores.dims3()?;
    let (g, bc, kc) = codes.dims3()?;
    if v < 2 || g == 0 || g > v || (bc, kc) != (b, k) {
        candle_core::bail!(
            "swapped prediction needs scores [V ≥ 2, B, K] and codes [1 ≤ G ≤ V, B, K], got \
             scores {:?} and codes {:?}",
            scores.dims(),
            codes.dims()
        );
    }
    let codes = codes.detach();
    let log_p = candle_nn::ops::log_softmax(&(scores / temperature)?, D::Minus1)?;
    let same_crop = (&codes * log_p.narrow(0, 0, g)?)?.sum_all()?;
    let all_pairs = (codes.sum(0)? * log_p.sum(0)?)?.sum_all()?;
    (same_crop - all_pairs)? / (b * (v - 1) * g) as f64
}

/// SwAV hyper-parameters (the paper's defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwavConfig {
    /// Number of prototypes `K`.
    pub num_prototypes: usize,
    /// Softmax temperature `τ` of the predictions.
    pub temperature: f64,
    /// Entropic regularisation `ε` of Sinkhorn–Knopp.
    pub epsilon: f64,
    /// Sinkhorn–Knopp iterations.
    pub sinkhorn_iterations: usize,
    /// Optimiser steps at the start during which the prototypes get no gradient.
    pub freeze_prototypes_steps: usize,
    /// Embeddings kept per global view in the queue (0: no queue).
    pub queue_size: usize,
    /// First epoch (0-based) in which the queue is filled and, once full, used.
    pub queue_start_epoch: usize,
}

impl Default for SwavConfig {
    fn default() -> Self {
        Self {
            num_prototypes: 3000,
            temperature: 0.1,
            epsilon: 0.05,
            sinkhorn_iterations: 3,
            freeze_prototypes_steps: 313,
            queue_size: 0,
            queue_start_epoch: 15,
        }
    }
}

impl ObjectiveConfig for SwavConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.num_prototypes >= 2,
            "`num_prototypes` must be ≥ 2 (with one prototype every code is 1 and the loss is \
             constant; the paper uses 3000), got {}",
            self.num_prototypes
        );
        ensure!(
            self.temperature.is_finite() && self.temperature > 0.0,
            "`temperature` must be > 0 (the paper uses 0.1), got {}",
            self.temperature
        );
        ensure!(
            self.epsilon.is_finite() && self.epsilon > 0.0,
            "`epsilon` must be > 0 (the paper uses 0.05), got {}",
            self.epsilon
        );
        ensure!(
            self.sinkhorn_iterations >= 1,
            "`sinkhorn_iterations` must be ≥ 1 (the paper uses 3), got 0"
        );
        Ok(())
    }

    /// `K` beyond the training set (the paper's 3,000 prototypes for ImageNet) becomes the
    /// largest power of two within it; the prototypes stay frozen for the first epoch, as the
    /// paper's 313 steps are ImageNet's first epoch at its batch of 4,096.
    fn fit_to_data(&mut self, run: &RunFacts, defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        let n = run.num_instances;
        let mut notes = Vec::new();
        if defaulted("num_prototypes") && self.num_prototypes > n {
            let k = run.power_of_two_within_instances(2);
            notes.push(format!(
                "SwAV's {} prototypes are more than the {n} training images: num_prototypes = \
                 {k}; set objective.params.num_prototypes to choose",
                self.num_prototypes
            ));
            self.num_prototypes = k;
        }
        let epoch = (n / run.batch_size.max(1)).max(1);
        if defaulted("freeze_prototypes_steps") && self.freeze_prototypes_steps > epoch {
            notes.push(format!(
                "SwAV freezes its prototypes for the first epoch (313 steps on ImageNet): \
                 freeze_prototypes_steps = {epoch}, this data set's epoch, not {}; set \
                 objective.params.freeze_prototypes_steps to choose",
                self.freeze_prototypes_steps
            ));
            self.freeze_prototypes_steps = epoch;
        }
        notes
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let d = ctx.projection_dim;
        ensure!(d > 0, "SwAV needs a projection width > 0");
        let layer = candle_nn::linear_no_bias(d, self.num_prototypes, ctx.vb.pp("prototypes"))?;
        let prototypes = Var::from_tensor(layer.weight())?;
        normalize_prototypes(&prototypes)?;
        let queue = match self.queue_size {
            0 => None,
            size => {
                let zero = |shape: &[usize], name: &str| -> Result<Var> {
                    Ok(Var::from_tensor(&ctx.vb.get_with_hints(
                        shape,
                        name,
                        Init::Const(0.0),
                    )?)?)
                };
                Some(Queue {
                    embeddings: zero(&[ctx.global_views, size, d], "queue")?,
                    pointer: zero(&[1], "queue_ptr")?,
                    filled: zero(&[1], "queue_fill")?,
                    counts: None,
                })
            }
        };
        Ok(Box::new(Swav {
            cfg: self.clone(),
            prototypes,
            queue,
            pending: None,
        }))
    }
}

/// `C ← C / max(‖C_k‖, 1e-12)` row by row, in place.
fn normalize_prototypes(prototypes: &Var) -> candle_core::Result<()> {
    prototypes.set(&normalize_rows(&prototypes.as_tensor().detach())?)
}

/// A FIFO of past normalised global-view embeddings, one ring buffer per view slot.
struct Queue {
    /// `[slots, Q, D]`: one queue per global view of the run (local crops are never queued).
    embeddings: Var,
    /// `[1]`: the row the next embedding is written to.
    pointer: Var,
    /// `[1]`: rows written so far, at most `Q`.
    filled: Var,
    /// The host's copies of `(pointer, filled)`, read from them at first use (after a resumed
    /// run's checkpoint is loaded) and kept in step after, so a step reads nothing back.
    counts: Option<(usize, usize)>,
}

fn read_count(v: &Var) -> candle_core::Result<usize> {
    Ok(v.as_tensor()
        .to_dtype(DType::F64)?
        .sum_all()?
        .to_scalar::<f64>()? as usize)
}

fn write_count(v: &Var, n: usize) -> candle_core::Result<()> {
    v.set(&Tensor::new(&[n as f64], v.device())?.to_dtype(v.dtype())?)
}

impl Queue {
    fn size(&self) -> usize {
        self.embeddings.dims()[1]
    }

    fn slots(&self) -> usize {
        self.embeddings.dims()[0]
    }

    fn counts(&mut self) -> candle_core::Result<(usize, usize)> {
        if let Some(counts) = self.counts {
            return Ok(counts);
        }
        let counts = (read_count(&self.pointer)?, read_count(&self.filled)?);
        self.counts = Some(counts);
        Ok(counts)
    }

    fn is_full(&mut self) -> candle_core::Result<bool> {
        Ok(self.counts()?.1 >= self.size())
    }

    /// Writes `z` `[G, B, D]` into the first `G` queues, oldest rows first overwritten; with
    /// `B > Q` only the newest `Q` rows are kept.
    fn push(&mut self, z: &Tensor) -> candle_core::Result<()> {
        let (g, b, _) = z.dims3()?;
        let size = self.size();
        let n = b.min(size);
        let z = z
            .narrow(1, b - n, n)?
            .to_dtype(self.embeddings.dtype())?
            .contiguous()?;
        let queues = self.embeddings.as_tensor().narrow(0, 0, g)?;
        let (pointer, filled) = self.counts()?;
        let head = n.min(size - pointer);
        queues.slice_set(&z.narrow(1, 0, head)?.contiguous()?, 1, pointer)?;
        if n > head {
            queues.slice_set(&z.narrow(1, head, n - head)?.contiguous()?, 1, 0)?;
        }
        let counts = ((pointer + n) % size, (filled + n).min(size));
        write_count(&self.pointer, counts.0)?;
        write_count(&self.filled, counts.1)?;
        self.counts = Some(counts);
        Ok(())
    }
}

/// The SwAV objective with its prototypes and optional queue (all checkpointed).
pub struct Swav {
    cfg: SwavConfig,
    /// `[K, D]`, unit rows.
    prototypes: Var,
    queue: Option<Queue>,
    /// Detached normalised global views `[G, B, D]` of the last training batch, pushed to the
    /// queue after the optimiser step.
    pending: Option<Tensor>,
}

impl Swav {
    /// Codes `[G, B, K]` of the global-view scores `scores` `[G, B, K]`; with an active queue
    /// Sinkhorn runs on `[queue scores; S_s]` and only the batch rows are kept.
    fn codes(&mut self, scores: &Tensor, prototypes: &Tensor, epoch: usize) -> Result<Tensor> {
        let (g, b, _) = scores.dims3()?;
        let active = match self.queue.as_mut() {
            Some(q) => epoch >= self.cfg.queue_start_epoch && q.is_full()?,
            None => false,
        };
        let queue = self.queue.as_ref().filter(|_| active);
        let (eps, iters) = (self.cfg.epsilon, self.cfg.sinkhorn_iterations);
        let mut codes = Vec::with_capacity(g);
        for s in 0..g {
            let own = scores.get(s)?.detach();
            let q = match queue {
                Some(q) => {
                    let past = q
                        .embeddings
                        .get(s)?
                        .to_dtype(prototypes.dtype())?
                        .matmul(&prototypes.t()?)?;
                    let all = Tensor::cat(&[&past, &own], 0)?;
                    sinkhorn(&all, eps, iters)?.narrow(0, q.size(), b)?
                }
                None => sinkhorn(&own, eps, iters)?,
            };
            codes.push(q);
        }
        Ok(Tensor::stack(&codes, 0)?)
    }
}

impl Objective for Swav {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: if self.queue.is_some() { 1 } else { 2 },
            min_batch_reason: "Sinkhorn–Knopp on a single sample returns exactly uniform codes; \
                               set `queue_size` for smaller batches",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let (v, _, d) = z.dims3()?;
        let (k, dc) = self.prototypes.dims2()?;
        let g = batch.global_views;
        ensure!(
            d == dc,
            "SwAV prototypes are {k}×{dc} but the projections are {d} wide; the objective was \
             built for another projector"
        );
        ensure!(
            (1..=v).contains(&g),
            "SwAV takes its assignment crops from the global views, but the batch has {g} global \
             views of {v}"
        );
        if let Some(q) = &self.queue {
            ensure!(
                g <= q.slots(),
                "SwAV's queue has {} view slots but the batch has {g} global views; rebuild the \
                 objective for {g} or more global views",
                q.slots()
            );
        }
        let z = normalize_rows(&z.to_dtype(self.prototypes.dtype())?)?;
        let prototypes = match batch.progress.step < self.cfg.freeze_prototypes_steps {
            true => self.prototypes.as_tensor().detach(),
            false => self.prototypes.as_tensor().clone(),
        };
        // One `[V·B, D] × [D, K]` GEMM: a batched matmul would copy the broadcast prototypes.
        let (vb, b) = (z.dims()[0] * z.dims()[1], z.dims()[1]);
        let scores = z
            .reshape((vb, d))?
            .matmul(&prototypes.t()?)?
            .reshape((v, b, k))?;
        let codes = self.codes(
            &scores.narrow(0, 0, g)?,
            &prototypes.detach(),
            batch.progress.epoch,
        )?;
        let loss = swapped_prediction_loss(&scores, &codes, self.cfg.temperature)?;
        if batch.train && self.queue.is_some() {
            self.pending = Some(z.narrow(0, 0, g)?.detach());
        }
        Ok(LossOutput::new(loss))
    }

    fn after_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        normalize_prototypes(&self.prototypes)?;
        if let (Some(queue), Some(z)) = (self.queue.as_mut(), self.pending.take()) {
            if ctx.progress.epoch >= self.cfg.queue_start_epoch {
                queue.push(&z)?;
            }
        }
        Ok(())
    }
}

register_objective! {
    name: "swav",
    aliases: &[],
    summary: "Swapped prediction of Sinkhorn–Knopp prototype assignments between crops (online clustering)",
    paper: "Caron, Misra, Mairal, Goyal, Bojanowski, Joulin. Unsupervised Learning of Visual Features by Contrasting Cluster Assignments. NeurIPS 2020",
    keys: &[
        ConfigKey { name: "num_prototypes", doc: "number of prototypes K (3000; 300 in IConE's comparison)" },
        ConfigKey { name: "temperature", doc: "softmax temperature τ of the predicted assignments (0.1)" },
        ConfigKey { name: "epsilon", doc: "entropic regularisation ε of Sinkhorn–Knopp (0.05)" },
        ConfigKey { name: "sinkhorn_iterations", doc: "Sinkhorn–Knopp iterations (3)" },
        ConfigKey { name: "freeze_prototypes_steps", doc: "first optimiser steps in which the prototypes get no gradient (313)" },
        ConfigKey { name: "queue_size", doc: "past embeddings queued per global view and prepended to Sinkhorn's input (0 = no queue; the paper uses 3840 for small batches)" },
        ConfigKey { name: "queue_start_epoch", doc: "first epoch (0-based) in which the queue is filled and, once full, used (15)" },
    ],
    config: SwavConfig,
}
