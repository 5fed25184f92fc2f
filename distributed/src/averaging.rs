//! Averaging gradients over the ranks, bucket by bucket, during the backward pass where the back
//! end allows it (PyTorch DDP's reducer, after Li et al., "PyTorch Distributed: Experiences on
//! Accelerating Data Parallel Training", VLDB 2020, §3.2).
//!
//! The parameters are packed, in reverse order, into buckets of at most
//! [`BUCKET_ELEMENTS`] values: the backward pass completes the last layers' gradients first, so
//! the first buckets fill first. The backward hands each parameter's gradient over as soon as it
//! is complete (Candle's `backward_with`); a bucket whose gradients are all in is all-reduced as
//! the back end's [`Comm::gradient_reduction`] says — on a thread of its own while the backward
//! goes on (MPI), enqueued from the backward's thread as it completes (NCCL, on a stream of its
//! own), or after the backward — and every rank reduces the buckets in the same order, a bucket
//! complete before an earlier one waiting for it. A bucket is the concatenation of its
//! gradients in the back end's [`Comm::bucket_dtype`] (`f64` for `f64` parameters, `f32`
//! otherwise), built and reduced on their device
//! ([`Comm::all_reduce_gradients`]). Once the backward has returned, one more (host) all-reduce
//! counts the ranks on which each parameter had a gradient: none anywhere leaves it without one
//! (the optimiser skips it, as in one process); some counts zero on the others, as in DDP.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use anyhow::{bail, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, TensorId, Var};

use crate::{Comm, GradientReduction};

/// Elements of one all-reduce message: 25 MiB of `f32`, PyTorch DDP's default bucket.
pub const BUCKET_ELEMENTS: usize = 25 * 1024 * 1024 / 4;

/// Takes the complete gradient of the variable with this id (`None`: it has none on this rank);
/// variables that are not averaged are ignored. Called from any thread of the backward pass.
pub type Complete<'a> = dyn Fn(TensorId, Option<&Tensor>) -> Result<()> + Sync + 'a;

/// One optimiser step's averaging of `params`' gradients over the ranks of `comm`.
pub struct GradientAveraging<'a> {
    comm: &'a dyn Comm,
    reduction: GradientReduction,
    params: &'a [(String, Var)],
    index: HashMap<TensorId, usize>,
    /// Parameter indices, bucket by bucket: `order[buckets[b]]`.
    order: Vec<usize>,
    buckets: Vec<Range<usize>>,
    /// Per bucket: the dtype its gradients travel in.
    bucket_dtypes: Vec<DType>,
    bucket_of: Vec<usize>,
    progress: Mutex<Progress>,
    changed: Condvar,
    /// Held while buckets are being reduced: one thread at a time, in bucket order.
    reducing: Mutex<()>,
}

/// What the backward and the reducing thread share.
struct Progress {
    /// Per parameter: `None` until handed over, then its gradient if it has one.
    grads: Vec<Option<Option<Tensor>>>,
    /// Per bucket: parameters not handed over yet.
    missing: Vec<usize>,
    /// Buckets whose every gradient was in before the backward returned.
    ready_during_backward: usize,
    /// The backward returned (every gradient is in) or failed (nothing more will come).
    backward_over: bool,
    /// Per bucket: the sum over the ranks, once reduced.
    sums: Vec<Option<Tensor>>,
    /// The next bucket to reduce: the ones before it are.
    next: usize,
}

/// The gradients averaged over the ranks, and how the buckets went.
pub struct Averaged {
    pub grads: GradStore,
    pub buckets: usize,
    /// Buckets complete before the backward pass returned: those a back end that reduces
    /// during the backward ([`Comm::gradient_reduction`]) reduces while it goes on.
    pub ready_during_backward: usize,
}

impl<'a> GradientAveraging<'a> {
    /// Averaging of `params` (the same on every rank, in the same order) in buckets of at most
    /// `bucket_elements` values (a larger parameter travels alone).
    pub fn new(comm: &'a dyn Comm, params: &'a [(String, Var)], bucket_elements: usize) -> Self {
        let order: Vec<usize> = (0..params.len()).rev().collect();
        let mut buckets = Vec::new();
        let mut bucket_of = vec![0; params.len()];
        let mut start = 0;
        while start < order.len() {
            let mut end = start + 1;
            let mut len = params[order[start]].1.elem_count();
            while end < order.len() && len + params[order[end]].1.elem_count() <= bucket_elements {
                len += params[order[end]].1.elem_count();
                end += 1;
            }
            for &p in &order[start..end] {
                bucket_of[p] = buckets.len();
            }
            buckets.push(start..end);
            start = end;
        }
        // A bucket of f32 and f64 parameters (a rare model) travels in the wider dtype.
        let bucket_dtypes = buckets
            .iter()
            .map(|b: &Range<usize>| {
                let f64 = order[b.clone()]
                    .iter()
                    .any(|&p| params[p].1.dtype() == DType::F64);
                comm.bucket_dtype(if f64 { DType::F64 } else { DType::F32 })
            })
            .collect();
        let progress = Progress {
            grads: vec![None; params.len()],
            missing: buckets.iter().map(|b| b.len()).collect(),
            ready_during_backward: 0,
            backward_over: false,
            sums: vec![None; buckets.len()],
            next: 0,
        };
        Self {
            comm,
            reduction: comm.gradient_reduction(),
            params,
            index: params
                .iter()
                .enumerate()
                .map(|(i, (_, v))| (v.as_tensor().id(), i))
                .collect(),
            order,
            buckets,
            bucket_dtypes,
            bucket_of,
            progress: Mutex::new(progress),
            changed: Condvar::new(),
            reducing: Mutex::new(()),
        }
    }

    /// Runs `backward`, which computes this rank's gradients, may hand each variable's over to
    /// the [`Complete`] it is given as soon as it is complete, and returns them all; returns them
    /// averaged over the ranks. A parameter not handed over takes its gradient from the returned
    /// store. At world size 1 the gradients are returned as they are, except on a communicator
    /// bound to a device (NCCL), which reduces them anyway so that one GPU runs the path that
    /// several take.
    pub fn run(self, backward: impl FnOnce(&Complete) -> Result<GradStore>) -> Result<Averaged> {
        if self.comm.world_size() == 1 && self.comm.device().is_none() {
            return Ok(Averaged {
                grads: backward(&|_, _| Ok(()))?,
                buckets: 0,
                ready_during_backward: 0,
            });
        }
        let complete = |id: TensorId, grad: Option<&Tensor>| match self.index.get(&id) {
            Some(&p) => self.hand_over(p, grad, true),
            None => Ok(()),
        };
        let (local, present) = match self.reduction {
            GradientReduction::OnThread => std::thread::scope(|scope| {
                let reducing = scope.spawn(|| self.reduce_buckets(true));
                let local = backward(&complete).and_then(|grads| self.hand_over_rest(grads));
                self.lock().backward_over = true;
                self.changed.notify_all();
                let present = local.as_ref().ok().map(|_| self.presence());
                let reduced = reducing
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                // A failed backward comes first: the reducing thread stopped because of it.
                let local = local?;
                reduced?;
                Ok::<_, anyhow::Error>((local, present.context("presence counted")??))
            })?,
            GradientReduction::Enqueued => {
                let local = backward(&complete).and_then(|grads| self.hand_over_rest(grads));
                self.lock().backward_over = true;
                let enqueued = match &local {
                    Ok(_) => self.reduce_buckets(true),
                    Err(_) => Ok(()),
                };
                // Also after a failed backward: the buckets enqueued must be done with its
                // gradients before they are freed.
                let reduced = self.comm.gradients_reduced();
                let local = local?;
                enqueued?;
                reduced?;
                (local, self.presence()?)
            }
            GradientReduction::AfterBackward => {
                let local = backward(&complete).and_then(|grads| self.hand_over_rest(grads))?;
                self.lock().backward_over = true;
                let present = self.presence()?;
                self.reduce_buckets(true)?;
                (local, present)
            }
        };
        self.averaged(local, &present)
    }

    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes parameter `p`'s complete gradient, handed over `during_backward` or after it.
    fn hand_over(&self, p: usize, grad: Option<&Tensor>, during_backward: bool) -> Result<()> {
        let mut progress = self.lock();
        if progress.grads[p].is_some() {
            bail!(
                "the gradient of {} was handed over twice in one backward pass",
                self.params[p].0
            );
        }
        progress.grads[p] = Some(grad.cloned());
        let b = self.bucket_of[p];
        progress.missing[b] -= 1;
        if progress.missing[b] == 0 {
            progress.ready_during_backward += usize::from(during_backward);
            drop(progress);
            self.changed.notify_all();
            if during_backward && self.reduction == GradientReduction::Enqueued {
                self.reduce_buckets(false)?;
            }
        }
        Ok(())
    }

    /// Hands over, from the backward's `grads`, every parameter's gradient it did not hand over.
    fn hand_over_rest(&self, grads: GradStore) -> Result<GradStore> {
        let rest: Vec<usize> = {
            let progress = self.lock();
            (0..self.params.len())
                .filter(|&p| progress.grads[p].is_none())
                .collect()
        };
        for p in rest {
            self.hand_over(p, grads.get(self.params[p].1.as_tensor()), false)?;
        }
        Ok(grads)
    }

    /// For every parameter, the number of ranks on which it has a gradient (every gradient is in).
    fn presence(&self) -> Result<Vec<f32>> {
        let mut present: Vec<f32> = self
            .lock()
            .grads
            .iter()
            .map(|g| f32::from(matches!(g, Some(Some(_)))))
            .collect();
        self.comm.all_reduce_sum(&mut present)?;
        Ok(present)
    }

    /// All-reduces the buckets not reduced yet, in order, each once its gradients are in: waits
    /// for them when `wait` (stopping early when the backward failed), else stops at the first
    /// bucket still missing one.
    fn reduce_buckets(&self, wait: bool) -> Result<()> {
        let _one_at_a_time = self.reducing.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let (b, grads): (usize, Vec<Option<Tensor>>) = {
                let mut progress = self.lock();
                let b = progress.next;
                if b == self.buckets.len() {
                    return Ok(());
                }
                while wait && progress.missing[b] > 0 && !progress.backward_over {
                    progress = self
                        .changed
                        .wait(progress)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                if progress.missing[b] > 0 {
                    return Ok(());
                }
                let grads = self.order[self.buckets[b].clone()]
                    .iter()
                    .map(|&p| progress.grads[p].clone().flatten())
                    .collect();
                (b, grads)
            };
            let sum = self
                .comm
                .all_reduce_gradients(&self.bucket(b, &grads)?)
                .with_context(|| format!("all-reducing gradient bucket {b}"))?;
            let mut progress = self.lock();
            progress.sums[b] = Some(sum);
            progress.next = b + 1;
        }
    }

    /// The message of bucket `b` whose parameters have gradients `grads`: the gradients
    /// flattened in the bucket's dtype, zeros where there is none.
    fn bucket(&self, b: usize, grads: &[Option<Tensor>]) -> Result<Tensor> {
        let dtype = self.bucket_dtypes[b];
        let mut parts = Vec::with_capacity(grads.len());
        for (&p, grad) in self.order[self.buckets[b].clone()].iter().zip(grads) {
            let (name, var) = &self.params[p];
            parts.push(match grad {
                Some(g) => g
                    .to_dtype(dtype)
                    .and_then(|g| g.flatten_all())
                    .with_context(|| format!("the gradient of {name}"))?,
                None => Tensor::zeros(var.elem_count(), dtype, var.device())?,
            });
        }
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// `local` with every parameter's gradient replaced by its mean over the ranks (none where
    /// `present` counts no rank).
    fn averaged(self, mut local: GradStore, present: &[f32]) -> Result<Averaged> {
        let scale = 1.0 / self.comm.world_size() as f64;
        let progress = self
            .progress
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for (range, sum) in self.buckets.iter().zip(progress.sums) {
            let sum = sum.context("a gradient bucket was not reduced")?;
            let mut offset = 0;
            for &p in &self.order[range.clone()] {
                let var = &self.params[p].1;
                let n = var.elem_count();
                if present[p] > 0.0 {
                    let mean = (sum.narrow(0, offset, n)?.reshape(var.shape())? * scale)?;
                    local.insert(var.as_tensor(), mean.to_dtype(var.dtype())?);
                } else {
                    local.remove(var.as_tensor());
                }
                offset += n;
            }
        }
        Ok(Averaged {
            grads: local,
            buckets: self.buckets.len(),
            ready_during_backward: progress.ready_during_backward,
        })
    }
}

/// Replaces the gradient of every variable of `params` in `grads` by its mean over the ranks,
/// after the backward pass: [`GradientAveraging`] with nothing handed over early.
pub fn reduce_gradients(
    comm: &dyn Comm,
    params: &[(String, Var)],
    grads: &mut GradStore,
    bucket_elements: usize,
) -> Result<()> {
    let local = std::mem::take(grads);
    *grads = GradientAveraging::new(comm, params, bucket_elements)
        .run(|_| Ok(local))?
        .grads;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Collective, SingleProcess};
    use candle_core::Device;
    use std::time::{Duration, Instant};

    /// Two ranks with identical gradients, in one process: a sum over the ranks doubles. Logs
    /// the size of every gradient bucket it reduces, and how many were reduced at each
    /// [`Comm::gradients_reduced`].
    struct IdenticalPair {
        reduction: GradientReduction,
        reduced: Mutex<Vec<usize>>,
        waits: Mutex<Vec<usize>>,
    }

    impl IdenticalPair {
        fn new(reduction: GradientReduction) -> Self {
            Self {
                reduction,
                reduced: Mutex::new(Vec::new()),
                waits: Mutex::new(Vec::new()),
            }
        }
        fn reduced(&self) -> Vec<usize> {
            self.reduced.lock().unwrap().clone()
        }
        fn waits(&self) -> Vec<usize> {
            self.waits.lock().unwrap().clone()
        }
    }

    const MODES: [GradientReduction; 3] = [
        GradientReduction::AfterBackward,
        GradientReduction::OnThread,
        GradientReduction::Enqueued,
    ];

    impl Collective for IdenticalPair {
        fn world_size(&self) -> usize {
            2
        }
        fn rank(&self) -> usize {
            0
        }
        fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
            Tensor::cat(&[t, t], dim)
        }
    }

    impl Comm for IdenticalPair {
        fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
            buf.iter_mut().for_each(|x| *x *= 2.0);
            Ok(())
        }
        fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
            buf.iter_mut().for_each(|x| *x *= 2.0);
            Ok(())
        }
        fn all_reduce_gradients(&self, bucket: &Tensor) -> Result<Tensor> {
            self.reduced.lock().unwrap().push(bucket.elem_count());
            Ok((bucket * 2.0)?)
        }
        fn gradient_reduction(&self) -> GradientReduction {
            self.reduction
        }
        fn gradients_reduced(&self) -> Result<()> {
            let reduced = self.reduced().len();
            self.waits.lock().unwrap().push(reduced);
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            Ok(())
        }
        fn abort(&self, code: i32) -> ! {
            panic!("abort({code})")
        }
        fn as_collective(&self) -> &dyn Collective {
            self
        }
    }

    /// Parameters `p0..p4` of 3, 4, 5, 6 and 7 values.
    fn params() -> Vec<(String, Var)> {
        (0..5)
            .map(|i| {
                (
                    format!("p{i}"),
                    Var::zeros(3 + i, DType::F32, &Device::Cpu).unwrap(),
                )
            })
            .collect()
    }

    /// Gradients `i + 1 + k/8` for every parameter `pi` but `p2`, which has none.
    fn gradients(params: &[(String, Var)]) -> GradStore {
        let mut grads = GradStore::default();
        for (i, (_, var)) in params.iter().enumerate().filter(|(i, _)| *i != 2) {
            let g: Vec<f32> = (0..3 + i)
                .map(|k| (i + 1) as f32 + k as f32 / 8.0)
                .collect();
            grads.insert(var.as_tensor(), Tensor::new(g, &Device::Cpu).unwrap());
        }
        grads
    }

    fn values(grads: &GradStore, var: &Var) -> Option<Vec<f32>> {
        grads.get(var.as_tensor()).map(|g| g.to_vec1().unwrap())
    }

    /// The mean over two ranks with the same gradients is those gradients, however the buckets
    /// are reduced; a parameter without a gradient on any rank keeps none. Buckets of at most 12
    /// values from the last parameter: [p4], [p3, p2], [p1, p0] (a bucket holds what fits; a
    /// larger parameter would travel alone). Enqueued reductions are waited for once, after the
    /// last.
    #[test]
    fn the_mean_over_identical_ranks_is_the_local_gradient() {
        for mode in MODES {
            let (params, comm) = (params(), IdenticalPair::new(mode));
            let grads = gradients(&params);
            let averaged = GradientAveraging::new(&comm, &params, 12)
                .run(|_| Ok(gradients(&params)))
                .unwrap();
            assert_eq!(averaged.buckets, 3);
            assert_eq!(comm.reduced(), [7, 6 + 5, 4 + 3]);
            for (name, var) in &params {
                assert_eq!(
                    values(&averaged.grads, var),
                    values(&grads, var),
                    "{name}, {mode:?}"
                );
            }
            assert!(averaged.grads.get(params[2].1.as_tensor()).is_none());
            let waits = match mode {
                GradientReduction::Enqueued => vec![3],
                _ => vec![],
            };
            assert_eq!(comm.waits(), waits, "{mode:?}");
        }
    }

    /// Gradients handed over in the backward order start their bucket's all-reduce while the
    /// backward goes on: the backward below waits, before it returns, for the first bucket to
    /// have been reduced. After the backward, buckets still missing a gradient take it from the
    /// returned store.
    #[test]
    fn a_full_bucket_is_reduced_while_the_backward_goes_on() {
        let (params, comm) = (params(), IdenticalPair::new(GradientReduction::OnThread));
        let grads = gradients(&params);
        let averaged = GradientAveraging::new(&comm, &params, 12)
            .run(|complete| {
                for (_, var) in params.iter().rev().take(3) {
                    complete(var.as_tensor().id(), grads.get(var.as_tensor()))?;
                }
                let waited = Instant::now();
                while comm.reduced().len() < 2 {
                    assert!(
                        waited.elapsed() < Duration::from_secs(20),
                        "the full buckets were not reduced during the backward"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(gradients(&params))
            })
            .unwrap();
        assert_eq!(averaged.ready_during_backward, 2);
        assert_eq!(comm.reduced(), [7, 11, 7]);
        for (name, var) in &params {
            assert_eq!(values(&averaged.grads, var), values(&grads, var), "{name}");
        }
    }

    /// Enqueued, a bucket's all-reduce starts in the hand-over that completes it, on the
    /// backward's thread, and in bucket order: the last bucket, complete first, waits for the
    /// first two; the one wait comes after all three.
    #[test]
    fn enqueued_buckets_start_as_they_complete_in_bucket_order() {
        let (params, comm) = (params(), IdenticalPair::new(GradientReduction::Enqueued));
        let grads = gradients(&params);
        let averaged = GradientAveraging::new(&comm, &params, 12)
            .run(|complete| {
                let hand_over = |p: usize| {
                    let var = params[p].1.as_tensor();
                    complete(var.id(), grads.get(var))
                };
                hand_over(1)?;
                hand_over(0)?;
                assert_eq!(comm.reduced(), [] as [usize; 0], "[p1, p0] waits for [p4]");
                hand_over(4)?;
                assert_eq!(comm.reduced(), [7]);
                hand_over(3)?;
                hand_over(2)?;
                assert_eq!(comm.reduced(), [7, 11, 7]);
                assert_eq!(comm.waits(), [] as [usize; 0]);
                Ok(gradients(&params))
            })
            .unwrap();
        assert_eq!(averaged.ready_during_backward, 3);
        assert_eq!(comm.waits(), [3]);
        for (name, var) in &params {
            assert_eq!(values(&averaged.grads, var), values(&grads, var), "{name}");
        }
    }

    /// A failed backward is the error returned; the reducing thread does not wait for gradients
    /// that will not come, and the buckets already enqueued are waited for.
    #[test]
    fn a_failed_backward_ends_the_averaging_with_its_error() {
        for mode in MODES {
            let (params, comm) = (params(), IdenticalPair::new(mode));
            let grads = gradients(&params);
            let e = GradientAveraging::new(&comm, &params, 12)
                .run(|complete| {
                    let last = params[4].1.as_tensor();
                    complete(last.id(), grads.get(last))?;
                    bail!("the backward failed")
                })
                .err()
                .unwrap();
            assert_eq!(e.to_string(), "the backward failed", "{mode:?}");
            if mode == GradientReduction::Enqueued {
                assert_eq!(comm.waits(), [1]);
            }
        }
        let (params, comm) = (params(), IdenticalPair::new(GradientReduction::OnThread));
        let grads = gradients(&params);
        let twice = GradientAveraging::new(&comm, &params, 12)
            .run(|complete| {
                let last = params[4].1.as_tensor();
                complete(last.id(), grads.get(last))?;
                complete(last.id(), grads.get(last))?;
                Ok(gradients(&params))
            })
            .err()
            .unwrap();
        assert!(
            twice.to_string().contains("p4 was handed over twice"),
            "{twice}"
        );
    }

    /// `f64` parameters' gradients travel in `f64`: the mean over two ranks with the same
    /// gradients `1 + k·1e-12` is those gradients exactly (an `f32` message rounds each to 1).
    /// A bucket mixing `f32` and `f64` parameters travels in `f64` too; the `f32` parameter's
    /// gradient comes back in `f32`.
    #[test]
    fn double_precision_gradients_are_averaged_in_double_precision() {
        let dev = Device::Cpu;
        let params: Vec<(String, Var)> = [("single", DType::F32), ("double", DType::F64)]
            .into_iter()
            .map(|(name, dtype)| (name.to_string(), Var::zeros(4, dtype, &dev).unwrap()))
            .collect();
        let fine: Vec<f64> = (0..4).map(|k| 1.0 + k as f64 * 1e-12).collect();
        let gradients = || {
            let mut grads = GradStore::default();
            let single = Tensor::new(&[0.5f32, 1.5, 2.5, 3.5], &dev).unwrap();
            grads.insert(params[0].1.as_tensor(), single);
            grads.insert(
                params[1].1.as_tensor(),
                Tensor::new(fine.as_slice(), &dev).unwrap(),
            );
            grads
        };
        for (bucket_elements, buckets) in [(4, 2), (8, 1)] {
            let comm = IdenticalPair::new(GradientReduction::AfterBackward);
            let averaged = GradientAveraging::new(&comm, &params, bucket_elements)
                .run(|_| Ok(gradients()))
                .unwrap();
            assert_eq!(averaged.buckets, buckets);
            let double = averaged.grads.get(params[1].1.as_tensor()).unwrap();
            assert_eq!(
                double.to_vec1::<f64>().unwrap(),
                fine,
                "{buckets} bucket(s)"
            );
            let single = averaged.grads.get(params[0].1.as_tensor()).unwrap();
            assert_eq!(single.to_vec1::<f32>().unwrap(), [0.5, 1.5, 2.5, 3.5]);
        }
    }

    /// One process: the gradients are left exactly as they are, and nothing is reduced.
    #[test]
    fn one_rank_leaves_gradients_alone() {
        let params = params();
        let (grads, mut ours) = (gradients(&params), gradients(&params));
        reduce_gradients(&SingleProcess, &params, &mut ours, 1).unwrap();
        for (_, var) in &params {
            assert_eq!(values(&ours, var), values(&grads, var));
        }
    }
}
