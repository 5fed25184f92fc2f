//! MoCo v2: contrastive queries against a momentum key encoder and a queue of past keys.
//!
//! He, Fan, Wu, Xie & Girshick, "Momentum Contrast for Unsupervised Visual Representation
//! Learning", CVPR 2020; Chen, Fan, Girshick & He, "Improved Baselines with Momentum Contrastive
//! Learning", arXiv:2003.04297, 2020. Spec: `docs/spec/objectives.md` §2.20, EMA §3,
//! disagreements §6.12.
//!
//! Queries `q = normalize(f_q(x_q))` are the trainer's projections, keys
//! `k = sg(normalize(f_k(x_k)))` the EMA teacher's projections (the key encoder), and the queue
//! `Q ∈ R^{K×D}` holds the keys of past batches (initialised with normalised Gaussian rows).
//! Per instance the logits are `[⟨q, k⟩, ⟨q, Q_1⟩, …, ⟨q, Q_K⟩] / T` and the loss is their
//! cross-entropy with label 0, averaged over the batch. Only `q` carries a gradient.
//!
//! **Default (the original, asymmetric, one queue).** Keys come from one key view, queries from
//! every other view, and the key view's keys are enqueued. At two views: `q` from view 0, `k`
//! from view 1. **Variant** `symmetric: true` (a framework's form): every global view is a key
//! view with its own queue, queries from every other view; at two views
//! `L = ½[ℓ(q₁, k₂, Q₂) + ℓ(q₂, k₁, Q₁)]`.
//!
//! **More views, multi-crop.** With `V` views of which the first `V_g` are global crops (the
//! only ones the key encoder sees), the key views are the last global view `w = V_g − 1`
//! (default) or every global view `w < V_g` (symmetric); each key view `w` is paired with every
//! query view `v < V`, `v ≠ w`, and the loss is the mean over these pairs of
//! `ℓ(q_v, k_w, Q_w)`.
//!
//! **Order per step.** The reference momentum-updates the key encoder, computes the keys, the
//! loss with the queue as it was before this step, then enqueues the keys. Here the loss reads
//! the queue and stores the detached keys; [`Objective::after_step`] (after the optimiser step)
//! enqueues them and momentum-updates the teacher, which the next step's keys then use. The
//! update at the end of step `t` equals the reference's update at the start of step `t + 1`
//! (both average the same teacher and student weights), and the reference's update before the
//! first step changes nothing (the teacher starts as a copy of the student), so the two orders
//! give the same keys.
//!
//! **State.** The queues `objective.queue` (`[Q, K, D]`, `Q` = 1, or `V_g` with `symmetric`) and
//! the FIFO position `objective.queue_ptr` (`[1]`, f32, exact up to 2²⁴) live in the parameter
//! store, so checkpoints save them and `--resume` continues the FIFO where it stopped; they never
//! receive a gradient, so the optimiser leaves them alone.
//!
//! **Shuffling BN** of the reference permutes the batch across GPUs before the key encoder; on
//! one device batch-norm statistics do not depend on the order of the batch, so there is nothing
//! to shuffle. With data-parallel workers the keys enqueued are gathered from all of them
//! ([`ssl_core::Collective::all_gather`]), as the reference does.
//!
//! Minimum batch size 1: the negatives come from the queue (spec §5).
//!
//! # Example
//!
//! Spec §2.20's known answer: two queries, their keys and a queue of three past keys (all unit
//! rows) at temperature 0.2.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_linalg::normalize_rows;
//! use ssl_moco::{moco_logits, moco_loss};
//!
//! let dev = &Device::Cpu;
//! let q = normalize_rows(&Tensor::new(&[[1f64, 0.], [0., 1.]], dev)?)?;
//! let k = normalize_rows(&Tensor::new(&[[1f64, 0.1], [0.2, 1.]], dev)?)?;
//! let queue = normalize_rows(&Tensor::new(&[[1f64, 1.], [-1., 0.], [0., -1.]], dev)?)?;
//! let logits = moco_logits(&q, &k, &queue, 0.2)?; // [B, 1 + K]: the positive, then the queue
//! assert_eq!(logits.dims(), [2, 4]);
//! let loss = moco_loss(&q, &k, &queue, 0.2)?.to_scalar::<f64>()?;
//! assert!((loss - 0.2255999584).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor};
use candle_nn::Init;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements, RunFacts, StepContext, TeacherSpec,
};
use ssl_linalg::{logsumexp_rows, normalize_rows};

/// Largest queue the f32 pointer `queue_ptr` addresses exactly (2²⁴).
pub const MAX_QUEUE_SIZE: usize = 1 << 24;

/// MoCo logits `[B, 1 + K]`: row `i` is `[⟨q_i, k_i⟩, ⟨q_i, Q_1⟩, …, ⟨q_i, Q_K⟩] / T`.
/// `q`, `k`: `[B, D]` unit rows (queries, keys); `queue`: `[K, D]`. `k` and `queue` are
/// detached (stop-gradient) and cast to the dtype of `q`.
pub fn moco_logits(
    q: &Tensor,
    k: &Tensor,
    queue: &Tensor,
    temperature: f64,
) -> candle_core::Result<Tensor> {
    let k = k.detach().to_dtype(q.dtype())?;
    let queue = queue.detach().to_dtype(q.dtype())?;
    let positive = (q * k)?.sum_keepdim(1)?;
    let negative = q.matmul(&queue.t()?)?;
    Tensor::cat(&[positive, negative], 1)? / temperature
}

/// `mean_i CE(label 0, logits_i)` = `mean_i [lse(logits_i) − logits_i0]` of [`moco_logits`];
/// a scalar.
pub fn moco_loss(
    q: &Tensor,
    k: &Tensor,
    queue: &Tensor,
    temperature: f64,
) -> candle_core::Result<Tensor> {
    let logits = moco_logits(q, k, queue, temperature)?;
    let positive = logits.narrow(1, 0, 1)?.squeeze(1)?;
    (logsumexp_rows(&logits)? - positive)?.mean_all()
}

/// FIFO push of `keys`: `[B, D]` into `queue`: `[K, D]` starting at row `ptr < K`: key `j` goes to
/// row `(ptr + j) mod K`, overwriting the oldest keys (when `B > K` only the last `K` keys
/// remain). Returns the new queue (detached, dtype of `queue`) and pointer `(ptr + B) mod K`.
pub fn enqueue(queue: &Tensor, ptr: usize, keys: &Tensor) -> candle_core::Result<(Tensor, usize)> {
    let (size, d) = queue.dims2()?;
    let (b, dk) = keys.dims2()?;
    if d != dk {
        candle_core::bail!("keys of width {dk} cannot enter a queue of width {d}");
    }
    if ptr >= size {
        candle_core::bail!("queue pointer {ptr} is outside a queue of {size} rows");
    }
    let queue = queue.detach();
    let n = b.min(size);
    let keys = keys.detach().to_dtype(queue.dtype())?.narrow(0, b - n, n)?;
    let start = (ptr + b - n) % size;
    let pieces = if start + n <= size {
        [
            queue.narrow(0, 0, start)?,
            keys,
            queue.narrow(0, start + n, size - start - n)?,
        ]
    } else {
        let head = size - start;
        let tail = n - head;
        [
            keys.narrow(0, head, tail)?,
            queue.narrow(0, tail, start - tail)?,
            keys.narrow(0, 0, head)?,
        ]
    };
    let pieces: Vec<Tensor> = pieces.into_iter().filter(|p| p.dims()[0] != 0).collect();
    Ok((Tensor::cat(&pieces, 0)?, (ptr + b) % size))
}

/// MoCo v2 hyper-parameters (paper defaults: T = 0.2, K = 65 536, m = 0.999 constant, the
/// original asymmetric form).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MocoConfig {
    /// Softmax temperature T.
    pub temperature: f64,
    /// Queue length K (negatives per query); a multiple of the batch size.
    pub queue_size: usize,
    /// Key-encoder momentum m in `θ_k ← m θ_k + (1 − m) θ_q`.
    pub momentum: f64,
    /// Ramp the momentum from `momentum` to 1 with the cosine schedule of spec §3 instead of
    /// keeping it constant.
    pub cosine_momentum: bool,
    /// The framework's symmetrised form: every global view is a key view with its own queue.
    pub symmetric: bool,
}

impl Default for MocoConfig {
    fn default() -> Self {
        Self {
            temperature: 0.2,
            queue_size: 65_536,
            momentum: 0.999,
            cosine_momentum: false,
            symmetric: false,
        }
    }
}

impl ObjectiveConfig for MocoConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.temperature.is_finite() && self.temperature > 0.0,
            "`temperature` must be finite and > 0, got {}",
            self.temperature
        );
        ensure!(
            (1..=MAX_QUEUE_SIZE).contains(&self.queue_size),
            "`queue_size` must be between 1 and {MAX_QUEUE_SIZE} keys, got {}",
            self.queue_size
        );
        ensure!(
            (0.0..=1.0).contains(&self.momentum),
            "`momentum` must lie in [0, 1] (1 freezes the key encoder), got {}",
            self.momentum
        );
        Ok(())
    }

    /// A queue longer than the training set (the paper's 65,536 keys for ImageNet) would hold
    /// each image's own older keys as negatives: it becomes the most whole batches within it.
    fn fit_to_data(&mut self, run: &RunFacts, defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        let (n, b) = (run.num_instances, run.batch_size.max(1));
        if !defaulted("queue_size") || self.queue_size <= n {
            return Vec::new();
        }
        let k = (n / b).max(1) * b;
        let note = format!(
            "MoCo's queue of {} keys is longer than the {n} training images: queue_size = {k} \
             ({} batches of {b}); set objective.params.queue_size to choose",
            self.queue_size,
            k / b
        );
        self.queue_size = k;
        vec![note]
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let (k, b) = (self.queue_size, ctx.batch_size);
        ensure!(b > 0, "MoCo needs a batch size > 0");
        if k % b != 0 {
            let up = k.div_ceil(b) * b;
            let down = k / b * b;
            let fix = match down {
                0 => format!("use queue_size = {up}"),
                _ => format!("use queue_size = {down} or {up}"),
            };
            bail!(
                "`queue_size` must be a multiple of the batch size (the reference enqueues whole \
                 batches), got queue_size = {k} with batch size {b}; {fix} \
                 (--set objective.params.queue_size=…) or change --batch-size"
            );
        }
        let d = ctx.projection_dim;
        ensure!(d > 0, "MoCo needs a projection width > 0");
        let queues = if self.symmetric { ctx.global_views } else { 1 };
        let init = Init::Randn {
            mean: 0.0,
            stdev: 1.0,
        };
        let queue = ctx.vb.get_with_hints((queues, k, d), "queue", init)?;
        queue.slice_set(&normalize_rows(&queue.detach())?, 0, 0)?;
        let ptr = ctx
            .vb
            .get_with_hints_dtype(1, "queue_ptr", Init::Const(0.0), DType::F32)?;
        Ok(Box::new(Moco {
            config: self.clone(),
            queue,
            ptr,
            next_row: None,
            pending: Vec::new(),
        }))
    }
}

/// The MoCo v2 objective with its key queues.
pub struct Moco {
    config: MocoConfig,
    /// `[Q, K, D]`, the storage of `objective.queue`.
    queue: Tensor,
    /// `[1]` f32, the storage of `objective.queue_ptr`.
    ptr: Tensor,
    /// The host's copy of `queue_ptr`, read from it at the first enqueue (after a resumed run's
    /// checkpoint is loaded) and kept in step with it after, so a step reads nothing back.
    next_row: Option<usize>,
    /// This step's keys `[B, D]` (gathered across workers, detached) and the queue each enters.
    pending: Vec<(usize, Tensor)>,
}

impl Moco {
    /// The queues `[Q, K, D]` (detached).
    pub fn queue(&self) -> Tensor {
        self.queue.detach()
    }

    /// The row of every queue the next key goes to.
    pub fn pointer(&self) -> Result<usize> {
        let p = self.ptr.to_vec1::<f32>()?[0];
        let size = self.config.queue_size;
        ensure!(
            p >= 0.0 && p.fract() == 0.0 && (p as usize) < size,
            "`queue_ptr` = {p} is not a row of a queue of {size} keys; the checkpoint was written \
             with another queue_size"
        );
        Ok(p as usize)
    }

    fn momentum(&self, ctx: &StepContext<'_>) -> f64 {
        match self.config.cosine_momentum {
            true => ctx.progress.cosine_ramp(self.config.momentum, 1.0),
            false => self.config.momentum,
        }
    }
}

impl Objective for Moco {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 1,
            min_batch_reason: "negatives come from the queue",
            teacher: Some(TeacherSpec { train_mode: true }),
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let Some(teacher) = batch.teacher else {
            bail!(
                "objective `moco` needs the key encoder's projections (Batch::teacher), but the batch \
                 has none; the trainer provides them when requirements().teacher is set"
            );
        };
        let (v, b, d) = batch.projections.dims3()?;
        let g = batch.global_views;
        ensure!(
            (1..=v).contains(&g) && v >= 2,
            "objective `moco` needs ≥ 2 views with 1 to V global ones, got {v} views, {g} global"
        );
        ensure!(
            teacher.dims() == [g, b, d],
            "objective `moco` expects key projections [V_g, B, D] = [{g}, {b}, {d}], got {:?}",
            teacher.dims()
        );
        let (queues, _, width) = self.queue.dims3()?;
        ensure!(
            width == d,
            "objective `moco` was built for projections of width {width}, got {d}"
        );
        let key_views: Vec<usize> = match self.config.symmetric {
            true => (0..g).collect(),
            false => vec![g - 1],
        };
        if self.config.symmetric && g > queues {
            bail!(
                "symmetric MoCo keeps one queue per global view and was built for {queues} global views, got {g} \
                 global views; build it with --views {g} or more"
            );
        }
        let q = normalize_rows(batch.projections)?;
        let keys = normalize_rows(teacher)?;
        let mut pending = Vec::with_capacity(key_views.len());
        let mut total = Tensor::zeros((), q.dtype(), q.device())?;
        for (slot, &w) in key_views.iter().enumerate() {
            let others: Vec<u32> = (0..v as u32).filter(|&u| u as usize != w).collect();
            let others = Tensor::new(others.as_slice(), q.device())?;
            let queries = q.index_select(&others, 0)?.reshape(((v - 1) * b, d))?;
            let k = keys.get(w)?;
            let repeated = k.unsqueeze(0)?.broadcast_as((v - 1, b, d))?;
            let repeated = repeated.reshape(((v - 1) * b, d))?;
            let queue = self.queue.get(slot)?;
            total = (total + moco_loss(&queries, &repeated, &queue, self.config.temperature)?)?;
            pending.push((slot, batch.collective.all_gather(&k, 0)?.detach()));
        }
        if batch.train {
            self.pending = pending;
        }
        Ok(LossOutput::new((total / key_views.len() as f64)?))
    }

    /// Enqueues the keys of the last training loss, then `θ_k ← m θ_k + (1 − m) θ_q`.
    fn after_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        if let Some((_, first)) = pending.first() {
            let ptr = match self.next_row {
                Some(row) => row,
                None => self.pointer()?,
            };
            let mut next = ptr;
            for (slot, keys) in &pending {
                let (queue, p) = enqueue(&self.queue.get(*slot)?, ptr, keys)?;
                self.queue.slice_set(&queue.unsqueeze(0)?, 0, *slot)?;
                next = p;
            }
            let value = Tensor::new(&[next as f32], first.device())?;
            self.ptr
                .slice_set(&value.to_device(self.ptr.device())?, 0, 0)?;
            self.next_row = Some(next);
        }
        ctx.ema_update(self.momentum(ctx))
    }
}

register_objective! {
    name: "moco",
    aliases: &["mocov2", "moco-v2"],
    summary: "contrastive queries vs. momentum-encoder keys and a FIFO queue of past keys (MoCo v2, InfoNCE)",
    paper: "Chen, Fan, Girshick, He. Improved Baselines with Momentum Contrastive Learning. \
            arXiv:2003.04297, 2020 (MoCo: He, Fan, Wu, Xie, Girshick. CVPR 2020)",
    keys: &[
        ConfigKey { name: "temperature", doc: "softmax temperature T (0.2)" },
        ConfigKey { name: "queue_size", doc: "queue length K, a multiple of the batch size (65536; 4096 in the IConE baseline)" },
        ConfigKey { name: "momentum", doc: "key-encoder EMA momentum m (0.999; 0.99 in the IConE baseline)" },
        ConfigKey { name: "cosine_momentum", doc: "ramp m to 1 with the cosine schedule instead of keeping it constant (false)" },
        ConfigKey { name: "symmetric", doc: "framework variant: every global view is a key view with its own queue, loss averaged (false: the original, keys from one view)" },
    ],
    config: MocoConfig,
}

#[cfg(test)]
mod tests;
