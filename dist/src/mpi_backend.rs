//! The MPI back end: [`MpiCollective`] over the system OpenMPI (`mpi` crate).
//!
//! `all_gather` is a Candle custom op whose backward all-reduces (sums) the gradient of the
//! gathered tensor over the ranks and keeps this rank's rows. Every rank's loss is a function of
//! the gathered batch, so the gradient of the global loss `Σ_r L_r` with respect to this rank's
//! rows is `Σ_r ∂L_r/∂gathered[own rows]`; taking the local slice of the local gradient alone
//! (lightly's bug before its PR #979) drops the other ranks' terms. The trainer then averages
//! parameter gradients over the ranks ([`crate::reduce_gradients`]): when every rank computes the
//! same global loss `L` (all gathering objectives here), the sum gives `world · ∂L/∂rows` and the
//! mean brings it back to `∂L/∂θ`, exactly one process's gradient on the global batch.
//!
//! Gradient buckets travel over a duplicate of the world communicator, on a thread of their own
//! while the backward pass goes on ([`crate::GradientAveraging`]); that needs MPI's thread level
//! `Multiple`, which OpenMPI offers (Debian's and Ubuntu's builds do). A library that offers only
//! `Serialized` still trains: its buckets are reduced after the backward.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{bail, ensure, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor, WithDType};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use ssl_core::Collective;

use crate::{Comm, GradientReduction};

/// How long the gradient thread sleeps between two tests of its all-reduce; a bucket completes
/// at most this much after the slowest rank's share arrives.
const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_micros(200);

/// The world communicator, usable from any thread one call at a time.
struct World(SimpleCommunicator);

// SAFETY: MPI is initialised with `Threading::Serialized` or higher (checked in
// `MpiCollective::init`), which allows calls from any thread as long as no two run at once on one
// communicator (at `Multiple`, two communicators may be used at once); every use of a
// communicator goes through its `Mutex` in `Shared`.
unsafe impl Send for World {}

/// What the collective and the custom ops in a graph share. The universe finalises MPI when the
/// last reference goes, so a graph that outlives the trainer still has a live MPI.
struct Shared {
    world: Mutex<World>,
    /// The gradient buckets' communicator, a duplicate of the world's: at thread level
    /// `Multiple` only.
    gradients: Option<Mutex<World>>,
    rank: usize,
    size: usize,
    _universe: Universe,
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    /// Every rank's `local` concatenated in rank order; all must have the same length.
    fn all_gather<T: Equivalence + Copy + Default>(&self, local: &[T]) -> Vec<T> {
        let mut out = vec![T::default(); local.len() * self.size];
        self.world().0.all_gather_into(local, &mut out[..]);
        out
    }

    /// The element-wise sum of every rank's `local`.
    fn all_reduce_sum<T: Equivalence + Copy + Default>(&self, local: &[T]) -> Vec<T> {
        sum_over(&self.world(), local)
    }
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The element-wise sum over the ranks of `world` of every rank's `local`.
fn sum_over<T: Equivalence + Copy + Default>(world: &World, local: &[T]) -> Vec<T> {
    let mut out = vec![T::default(); local.len()];
    world
        .0
        .all_reduce_into(local, &mut out[..], SystemOperation::sum());
    out
}

/// Data-parallel collectives over MPI's world communicator (one process per rank, started by
/// `mpirun` or `srun`).
pub struct MpiCollective {
    shared: Arc<Shared>,
}

impl MpiCollective {
    /// Initialises MPI (once per process) at thread level `Multiple` where the library offers
    /// it (`Serialized` at least) and joins the world communicator.
    pub fn init() -> Result<Self> {
        let Some((universe, threading)) = mpi::initialize_with_threading(Threading::Multiple)
        else {
            bail!(
                "MPI is already initialised in this process; create one MpiCollective per process"
            );
        };
        ensure!(
            threading >= Threading::Serialized,
            "this MPI library offers thread level {threading:?}, and training calls MPI from its \
             worker threads (one at a time), which needs Serialized; use an OpenMPI built with \
             thread support (Debian's openmpi-bin is)"
        );
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let gradients =
            (threading == Threading::Multiple).then(|| Mutex::new(World(world.duplicate())));
        Ok(Self {
            shared: Arc::new(Shared {
                world: Mutex::new(World(world)),
                gradients,
                rank,
                size,
                _universe: universe,
            }),
        })
    }
}

impl Collective for MpiCollective {
    fn world_size(&self) -> usize {
        self.shared.size
    }

    /// Gathers along `dim` on the host: a tensor on another device is copied to the CPU and the
    /// result back (both copies are differentiable). Every rank's `t` must have the same shape.
    fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
        if self.shared.size == 1 {
            return Ok(t.clone());
        }
        let device = t.device().clone();
        let front = t.to_device(&Device::Cpu)?.transpose(0, dim)?.contiguous()?;
        let gathered = front.apply_op1(AllGather(Arc::clone(&self.shared)))?;
        gathered.transpose(0, dim)?.contiguous()?.to_device(&device)
    }
}

impl Comm for MpiCollective {
    fn rank(&self) -> usize {
        self.shared.rank
    }
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let sum = self.shared.all_reduce_sum(buf);
        buf.copy_from_slice(&sum);
        Ok(())
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        let sum = self.shared.all_reduce_sum(buf);
        buf.copy_from_slice(&sum);
        Ok(())
    }
    /// On the host in `f32`, over the gradients' own communicator where there is one.
    fn all_reduce_gradients(&self, bucket: &Tensor) -> Result<Tensor> {
        let Some(gradients) = &self.shared.gradients else {
            return self.all_reduce_sum_tensor(bucket);
        };
        let local = bucket
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let mut sum = vec![0f32; local.len()];
        let world = lock(gradients);
        // Started, then polled with pauses: a blocking all-reduce would spin on a core the
        // backward pass is using while it waits for the other ranks.
        mpi::request::scope(|scope| {
            let mut request = world.0.immediate_all_reduce_into(
                scope,
                &local[..],
                &mut sum[..],
                SystemOperation::sum(),
            );
            while let Err(pending) = request.test() {
                request = pending;
                std::thread::sleep(POLL_INTERVAL);
            }
        });
        Ok(Tensor::from_vec(sum, bucket.shape(), bucket.device())?.to_dtype(bucket.dtype())?)
    }
    fn gradient_reduction(&self) -> GradientReduction {
        match self.shared.gradients {
            Some(_) => GradientReduction::OnThread,
            None => GradientReduction::AfterBackward,
        }
    }
    fn barrier(&self) -> Result<()> {
        self.shared.world().0.barrier();
        Ok(())
    }
    fn abort(&self, code: i32) -> ! {
        self.shared.world().0.abort(code)
    }
    fn as_collective(&self) -> &dyn Collective {
        self
    }
}

/// Concatenation along dim 0 of every rank's tensor; backward: the sum over ranks of the
/// gathered gradient, this rank's rows.
struct AllGather(Arc<Shared>);

impl AllGather {
    fn gather<T: WithDType + Equivalence + Default>(
        &self,
        values: &[T],
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let dims = layout.dims();
        let shapes = self
            .0
            .all_gather(&[dims[0] as u64, dims[1..].iter().product::<usize>() as u64]);
        crate::check_gather_shapes(&shapes)?;
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("all_gather: input not contiguous".into()))?;
        let out = self.0.all_gather(&values[start..end]);
        let mut shape = dims.to_vec();
        shape[0] *= self.0.size;
        Ok((T::to_cpu_storage_owned(out), Shape::from(shape)))
    }

    fn reduce<T: WithDType + Equivalence + Default>(
        &self,
        grad: &Tensor,
        rows: usize,
    ) -> candle_core::Result<Tensor> {
        let sum = self.0.all_reduce_sum(&grad.flatten_all()?.to_vec1::<T>()?);
        Tensor::from_vec(sum, grad.shape(), grad.device())?.narrow(0, self.0.rank * rows, rows)
    }
}

impl CustomOp1 for AllGather {
    fn name(&self) -> &'static str {
        "mpi-all-gather"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        match storage {
            CpuStorage::F32(v) => self.gather(v, layout),
            CpuStorage::F64(v) => self.gather(v, layout),
            CpuStorage::U32(v) => self.gather(v, layout),
            CpuStorage::I64(v) => self.gather(v, layout),
            other => candle_core::bail!(
                "all_gather over MPI takes f32, f64, u32 or i64 tensors, got {:?}; convert it first",
                other.dtype()
            ),
        }
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let rows = arg.dim(0)?;
        let grad = match grad_res.dtype() {
            DType::F32 => self.reduce::<f32>(grad_res, rows)?,
            DType::F64 => self.reduce::<f64>(grad_res, rows)?,
            other => candle_core::bail!("all_gather backward: unexpected gradient dtype {other:?}"),
        };
        Ok(Some(grad))
    }
}
