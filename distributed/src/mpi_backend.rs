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
//!
//! Every collective is started non-blocking and polled: back to back for its first
//! [`SPIN`], then with pauses growing to [`LONGEST_PAUSE`], so that a rank waiting long (while
//! rank 0 evaluates alone) leaves the cores to the ranks that work. A collective that has not
//! completed within the bound ([`Comm::set_collective_timeout`]) fails with a
//! [`CollectiveTimeout`] naming it and the rank; its buffers are left to MPI and every later
//! collective of the rank fails at once, since the communicator can no longer be trusted.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Shape, Tensor, WithDType};
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::{Threading, Universe};
use mpi::request::{Request, Scope};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};
use ssl_core::Collective;

use crate::{Comm, GradientReduction, DEFAULT_COLLECTIVE_TIMEOUT};

/// How long a pending collective is polled back to back: ranks that arrive together (the
/// training step's gathers) complete within it.
const SPIN: Duration = Duration::from_micros(100);
/// The pauses between later polls double from [`FIRST_PAUSE`] to [`LONGEST_PAUSE`]: a
/// collective completes at most that much after the last rank's share arrives.
const FIRST_PAUSE: Duration = Duration::from_micros(10);
const LONGEST_PAUSE: Duration = Duration::from_micros(500);

/// Test hook: `RANK:N` makes rank `RANK` stop before its `N`-th collective (counted from 1) and
/// sleep there, as a rank would that skipped it to work alone, so the other ranks' bound on that
/// collective can be tested.
pub const STALL_VARIABLE: &str = "SSL_TEST_STALL_BEFORE_COLLECTIVE";

/// A collective that did not complete within its bound: another rank never joined it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveTimeout {
    /// The operation, e.g. `all-gather`.
    pub operation: &'static str,
    pub rank: usize,
    pub world_size: usize,
    pub limit: Duration,
}

impl fmt::Display for CollectiveTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MPI {} on rank {} of {} did not complete within {} s: another rank never joined it \
             (it stopped, or runs work that this rank does not take part in); the job ends here \
             instead of hanging. If a rank is only slow, raise train.collective_timeout (seconds)",
            self.operation,
            self.rank,
            self.world_size,
            self.limit.as_secs_f64()
        )
    }
}

impl std::error::Error for CollectiveTimeout {}

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
    /// The barriers' communicator, a duplicate of the world's: a rank waiting at a barrier while
    /// another enters a gather (a bug) leaves the gather pending, to fail by its bound naming
    /// it, where on one communicator MPI may pair the two non-blocking operations' messages.
    barriers: Mutex<World>,
    rank: usize,
    size: usize,
    watch: Watch,
    universe: Universe,
}

/// The bound on this rank's collectives, and what it has seen.
struct Watch {
    /// Milliseconds a collective may wait for the other ranks.
    limit_ms: AtomicU64,
    /// Set by a collective that timed out: its buffers are still MPI's, and the ranks' calls no
    /// longer pair up.
    broken: AtomicBool,
    /// Collectives started on this rank so far, for the test hook.
    started: AtomicU64,
    /// [`STALL_VARIABLE`]'s collective number, on the rank it names.
    stall_at: Option<u64>,
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    /// The bound of a collective `operation` about to start (`bounded`: else none), or the
    /// error of an earlier timeout.
    fn enter(&self, operation: &'static str, bounded: bool) -> Result<Option<Duration>, String> {
        if self.watch.broken.load(Ordering::Relaxed) {
            return Err(format!(
                "MPI {operation} on rank {} refused: an earlier collective of this rank timed out",
                self.rank
            ));
        }
        let n = self.watch.started.fetch_add(1, Ordering::Relaxed) + 1;
        if self.watch.stall_at == Some(n) {
            eprintln!(
                "rank {}: stalling before collective {n} ({operation}), as {STALL_VARIABLE} asks",
                self.rank
            );
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        let limit = Duration::from_millis(self.watch.limit_ms.load(Ordering::Relaxed));
        Ok(bounded.then_some(limit))
    }

    /// `Ok` once a collective has completed (`done`); else its `buffers` are left to MPI (which
    /// may still write them), the rank's communicators marked broken, and the timeout returned.
    fn finish<B>(
        &self,
        operation: &'static str,
        limit: Option<Duration>,
        done: bool,
        buffers: B,
    ) -> Result<B, CollectiveTimeout> {
        if done {
            return Ok(buffers);
        }
        std::mem::forget(buffers);
        self.watch.broken.store(true, Ordering::Relaxed);
        Err(CollectiveTimeout {
            operation,
            rank: self.rank,
            world_size: self.size,
            limit: limit.unwrap_or_default(),
        })
    }

    /// Every rank's `local` concatenated in rank order; all must have the same length.
    fn all_gather<T: Equivalence + Copy + Default>(&self, local: Vec<T>) -> Result<Vec<T>> {
        let op = "all-gather";
        let limit = self.enter(op, true).map_err(anyhow::Error::msg)?;
        let mut out = vec![T::default(); local.len() * self.size];
        let world = self.world();
        let done = mpi::request::scope(|scope| {
            let request = world
                .0
                .immediate_all_gather_into(scope, &local[..], &mut out[..]);
            completes(request, limit)
        });
        drop(world);
        Ok(self.finish(op, limit, done, (local, out))?.1)
    }

    /// The element-wise sum over `world`'s ranks of every rank's `local`.
    fn all_reduce_sum<T: Equivalence + Copy + Default>(
        &self,
        world: &Mutex<World>,
        local: Vec<T>,
    ) -> Result<Vec<T>> {
        let op = "all-reduce";
        let limit = self.enter(op, true).map_err(anyhow::Error::msg)?;
        let mut sum = vec![T::default(); local.len()];
        let world = lock(world);
        let done = mpi::request::scope(|scope| {
            let request = world.0.immediate_all_reduce_into(
                scope,
                &local[..],
                &mut sum[..],
                SystemOperation::sum(),
            );
            completes(request, limit)
        });
        drop(world);
        Ok(self.finish(op, limit, done, (local, sum))?.1)
    }

    /// Returns once every rank has entered it; `bounded`: within the collective timeout.
    fn barrier(&self, bounded: bool) -> Result<()> {
        let op = "barrier";
        let limit = self.enter(op, bounded).map_err(anyhow::Error::msg)?;
        let done = completes(lock(&self.barriers).0.immediate_barrier(), limit);
        Ok(self.finish(op, limit, done, ())?)
    }
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Polls `request` until it completes (`true`) or `limit` has passed (`false`: the request is
/// then left pending, and its buffers must outlive the process).
fn completes<'a, D: ?Sized, S: Scope<'a>>(
    mut request: Request<'a, D, S>,
    limit: Option<Duration>,
) -> bool {
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        request = match request.test() {
            Ok(_) => return true,
            Err(pending) => pending,
        };
        let waited = started.elapsed();
        if limit.is_some_and(|limit| waited >= limit) {
            // SAFETY: the request is never completed nor freed; the caller leaks its buffers
            // (`Shared::finish`), so MPI may use them for as long as the process lives.
            let _ = unsafe { request.into_raw() };
            return false;
        }
        if waited < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(pause);
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// The rank [`STALL_VARIABLE`] names and its collective number, if set.
fn stall_hook(rank: usize) -> Result<Option<u64>> {
    let Ok(value) = std::env::var(STALL_VARIABLE) else {
        return Ok(None);
    };
    let parsed = value.split_once(':').and_then(|(r, n)| {
        Some((
            r.trim().parse::<usize>().ok()?,
            n.trim().parse::<u64>().ok()?,
        ))
    });
    let (stalling, n) = parsed.with_context(|| {
        format!("{STALL_VARIABLE}={value:?} is not RANK:N (a test hook; unset it)")
    })?;
    Ok((stalling == rank).then_some(n))
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
        let watch = Watch {
            limit_ms: AtomicU64::new(DEFAULT_COLLECTIVE_TIMEOUT.as_millis() as u64),
            broken: AtomicBool::new(false),
            started: AtomicU64::new(0),
            stall_at: stall_hook(rank)?,
        };
        Ok(Self {
            shared: Arc::new(Shared {
                barriers: Mutex::new(World(world.duplicate())),
                world: Mutex::new(World(world)),
                gradients,
                rank,
                size,
                watch,
                universe,
            }),
        })
    }
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.shared.rank
    }
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
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let sum = self
            .shared
            .all_reduce_sum(&self.shared.world, buf.to_vec())?;
        buf.copy_from_slice(&sum);
        Ok(())
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        let sum = self
            .shared
            .all_reduce_sum(&self.shared.world, buf.to_vec())?;
        buf.copy_from_slice(&sum);
        Ok(())
    }
    /// On the host in the bucket's dtype (f32 or f64), over the gradients' own communicator
    /// where there is one.
    fn all_reduce_gradients(&self, bucket: &Tensor) -> Result<Tensor> {
        let Some(gradients) = &self.shared.gradients else {
            return self.all_reduce_sum_tensor(bucket);
        };
        // Polled with pauses (`completes`): a blocking all-reduce would spin on a core the
        // backward pass is using while it waits for the other ranks.
        let (shape, device) = (bucket.shape(), bucket.device());
        Ok(match bucket.dtype() {
            DType::F64 => {
                let local = bucket.flatten_all()?.to_vec1::<f64>()?;
                Tensor::from_vec(self.shared.all_reduce_sum(gradients, local)?, shape, device)?
            }
            dtype => {
                let local = bucket
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let sum = self.shared.all_reduce_sum(gradients, local)?;
                Tensor::from_vec(sum, shape, device)?.to_dtype(dtype)?
            }
        })
    }
    fn gradient_reduction(&self) -> GradientReduction {
        match self.shared.gradients {
            Some(_) => GradientReduction::OnThread,
            None => GradientReduction::AfterBackward,
        }
    }
    fn barrier(&self) -> Result<()> {
        self.shared.barrier(true)
    }
    /// Unbounded on the waiting ranks: rank 0's own collectives are bounded, so a rank 0 that
    /// never comes ends the job from its side.
    fn wait_for_rank_zero(&self) -> Result<()> {
        self.shared.barrier(self.shared.rank == 0)
    }
    fn set_collective_timeout(&self, limit: Duration) {
        let ms = limit.as_millis().clamp(1, u64::MAX as u128) as u64;
        self.shared.watch.limit_ms.store(ms, Ordering::Relaxed);
    }
    /// Through a handle of its own on the world communicator: the shared one may be held by a
    /// collective that is still pending.
    fn abort(&self, code: i32) -> ! {
        self.shared.universe.world().abort(code)
    }
    fn as_collective(&self) -> &dyn Collective {
        self
    }
}

/// A collective's error inside a graph op, its message kept whole.
fn gather_error(e: anyhow::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("{e:#}"))
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
        let shape = vec![dims[0] as u64, dims[1..].iter().product::<usize>() as u64];
        let shapes = self.0.all_gather(shape).map_err(gather_error)?;
        crate::check_gather_shapes(&shapes)?;
        let (start, end) = layout
            .contiguous_offsets()
            .ok_or_else(|| candle_core::Error::Msg("all_gather: input not contiguous".into()))?;
        let out = self
            .0
            .all_gather(values[start..end].to_vec())
            .map_err(gather_error)?;
        let mut shape = dims.to_vec();
        shape[0] *= self.0.size;
        Ok((T::to_cpu_storage_owned(out), Shape::from(shape)))
    }

    fn reduce<T: WithDType + Equivalence + Default>(
        &self,
        grad: &Tensor,
        rows: usize,
    ) -> candle_core::Result<Tensor> {
        let local = grad.flatten_all()?.to_vec1::<T>()?;
        let sum = self
            .0
            .all_reduce_sum(&self.0.world, local)
            .map_err(gather_error)?;
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
