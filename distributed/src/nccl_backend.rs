//! The NCCL back end: [`NcclCollective`], one process per GPU, NCCL (cudarc's, through Candle's
//! `nccl` feature) carrying CUDA tensors from device to device.
//!
//! Two Candle custom ops on the communicator's stream: an all-gather whose backward all-reduces
//! (sums) the gathered gradient over the ranks and keeps this rank's rows, the contract of the
//! MPI back end (see `mpi_backend.rs`: each rank gets the gradient of the global loss with
//! respect to its own rows), and a sum all-reduce, which [`Comm::all_reduce_sum_tensor`] uses so
//! that [`crate::reduce_gradients`] never copies a gradient to the host. Control (rank, barrier,
//! abort, the host reductions of logged losses) goes through another [`Comm`]: MPI for several
//! ranks, [`crate::SingleProcess`] for one. The collectives run at world size 1 too (a device
//! copy), so one GPU exercises every path a multi-GPU run takes.
//!
//! Gradient buckets go over a second communicator, on a stream of its own
//! ([`GradientReduction::Enqueued`], PyTorch DDP's arrangement): each bucket's all-reduce is
//! enqueued there from the backward's thread as soon as the bucket is complete, after an event
//! that marks the bucket written on Candle's stream, and the backward's next kernels go on
//! beside it; [`Comm::gradients_reduced`] makes Candle's stream wait for the last one. The
//! stream is made without switching cudarc's context to its multi-stream mode, in which every
//! kernel launch would record and wait for events on every buffer it touches: the two streams
//! meet only at these events, and a bucket is kept alive until Candle's stream has waited for
//! the all-reduce that reads it.

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    result as driver, CudaContext, CudaEvent, CudaStream, DeviceRepr,
};
use candle_core::cuda_backend::cudarc::nccl::{Comm as NcclComm, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use ssl_core::Collective;

use crate::{Comm, GradientReduction};

/// An NCCL communicator, usable from any thread one call at a time.
struct Communicator(NcclComm);

// SAFETY: NCCL allows a communicator to be used from any thread as long as no two calls on it
// overlap (its "thread safety" notes); every use goes through the `Mutex` in `Shared`.
unsafe impl Send for Communicator {}

/// A non-blocking CUDA stream of our own, made outside cudarc's stream bookkeeping (see the
/// module's documentation) and destroyed with this value.
struct SideStream(Arc<CudaStream>);

impl SideStream {
    fn new(context: &Arc<CudaContext>) -> candle_core::Result<Self> {
        let stream = context
            .bind_to_thread()
            .and_then(|()| driver::stream::create(driver::stream::StreamKind::NonBlocking))
            .map_err(|e| op_error("cuStreamCreate", e))?;
        // SAFETY: the stream belongs to `context`, and `Drop` destroys it only after every
        // holder of the wrapper (the gradient communicator, declared before it) is gone.
        Ok(Self(unsafe { context.wrap_borrowed_stream(stream) }))
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: nothing is enqueued on the stream any more (see `new`); a failure here leaves a
        // stream behind at exit, which is all it could do.
        let _ = unsafe { driver::stream::destroy(self.0.cu_stream()) };
    }
}

/// The communicator of the gradient buckets, on its own stream, and the all-reduces in flight.
/// Fields drop in order: the communicator before its stream.
struct GradientComm {
    comm: Communicator,
    /// Done once every bucket enqueued so far is reduced.
    last: Option<CudaEvent>,
    /// The buckets the enqueued all-reduces read: freed (on Candle's stream) only after it has
    /// waited for them.
    reading: Vec<Tensor>,
    stream: SideStream,
}

/// What the collective and the custom ops in a graph share.
struct Shared {
    nccl: Mutex<Communicator>,
    gradients: Mutex<GradientComm>,
    device: CudaDevice,
    rank: usize,
    size: usize,
}

impl Shared {
    fn nccl(&self) -> MutexGuard<'_, Communicator> {
        self.nccl.lock().unwrap_or_else(PoisonError::into_inner)
    }
    fn gradients(&self) -> MutexGuard<'_, GradientComm> {
        self.gradients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Data-parallel collectives over NCCL for the tensors and over `control` for the rest; every
/// rank's tensors live on its GPU, `cuda:<local rank>` ([`Comm::device`]).
pub struct NcclCollective {
    shared: Arc<Shared>,
    control: Arc<dyn Comm>,
    device: Device,
}

impl NcclCollective {
    /// Opens `cuda:<local_rank>` and joins the two NCCL communicators of `control`'s ranks (the
    /// collectives' and the gradient buckets'): rank 0 creates their unique ids and, at world
    /// size > 1, sends their 2 × 128 bytes to the others through `control` (an all-reduce sum to
    /// which the other ranks add zeros: a broadcast).
    pub fn init(control: Arc<dyn Comm>, local_rank: usize) -> Result<Self> {
        let (rank, size) = (control.rank(), control.world_size());
        let device = Device::new_cuda(local_rank).with_context(|| {
            format!(
                "--distributed nccl: rank {rank} (local rank {local_rank}) cannot open \
                 cuda:{local_rank}; NCCL trains one process per GPU, local rank k on cuda:k, so \
                 start at most as many processes per node as it has GPUs"
            )
        })?;
        let mut bytes = [0f64; 256];
        if rank == 0 {
            for half in bytes.chunks_mut(128) {
                let id = Id::new().map_err(|e| op_error("ncclGetUniqueId", e))?;
                for (b, &c) in half.iter_mut().zip(id.internal()) {
                    *b = f64::from(c as u8);
                }
            }
        }
        if size > 1 {
            control.all_reduce_sum_f64(&mut bytes)?;
        }
        let id = |half: usize| {
            Id::uninit(std::array::from_fn(|i| {
                bytes[128 * half + i] as u8 as c_char
            }))
        };
        let cuda = device.as_cuda_device()?.clone();
        let comm = NcclComm::from_rank(cuda.cuda_stream(), rank, size, id(0))
            .map_err(|e| op_error("ncclCommInitRank", e))?;
        let stream = SideStream::new(cuda.cuda_stream().context())?;
        let gradients = NcclComm::from_rank(Arc::clone(&stream.0), rank, size, id(1))
            .map_err(|e| op_error("ncclCommInitRank (gradient buckets)", e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                nccl: Mutex::new(Communicator(comm)),
                gradients: Mutex::new(GradientComm {
                    comm: Communicator(gradients),
                    last: None,
                    reading: Vec::new(),
                    stream,
                }),
                device: cuda,
                rank,
                size,
            }),
            control,
            device,
        })
    }

    /// Every rank's `[rows, row length]` of an all-gather's operand `dims`, checked equal
    /// ([`crate::check_gather_shapes`]). They are host values, so they go over `control`: a
    /// gather of them over NCCL would have to be read back from the device, a synchronisation in
    /// every synchronised batch norm of every view.
    fn check_shapes(&self, dims: &[usize]) -> candle_core::Result<()> {
        let (rank, size) = (self.shared.rank, self.shared.size);
        if size == 1 {
            return Ok(());
        }
        let mut shapes = vec![0f64; 2 * size];
        shapes[2 * rank] = dims[0] as f64;
        shapes[2 * rank + 1] = dims[1..].iter().product::<usize>() as f64;
        self.control
            .all_reduce_sum_f64(&mut shapes)
            .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
        crate::check_gather_shapes(&shapes.iter().map(|&s| s as u64).collect::<Vec<_>>())
    }

    /// `t` on this rank's GPU, and the device to bring a result back to.
    fn on_gpu(&self, t: &Tensor) -> candle_core::Result<(Tensor, Option<Device>)> {
        if t.device().same_device(&self.device) {
            Ok((t.clone(), None))
        } else {
            Ok((t.to_device(&self.device)?, Some(t.device().clone())))
        }
    }
}

fn op_error(what: &str, e: impl std::fmt::Debug) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "NCCL {what} failed: {e:?}; NCCL_DEBUG=INFO in the environment makes NCCL say why"
    ))
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.shared.rank
    }
    fn world_size(&self) -> usize {
        self.shared.size
    }

    /// Gathers along `dim` on this rank's GPU: a tensor elsewhere is copied there and the result
    /// back (both copies are differentiable). Every rank's `t` must have the same shape.
    fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
        let (t, back) = self.on_gpu(t)?;
        let front = t.transpose(0, dim)?.contiguous()?;
        self.check_shapes(front.dims())?;
        let gathered = front.apply_op1(AllGather(Arc::clone(&self.shared)))?;
        let gathered = gathered.transpose(0, dim)?.contiguous()?;
        match back {
            Some(device) => gathered.to_device(&device),
            None => Ok(gathered),
        }
    }
}

impl Comm for NcclCollective {
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        self.control.all_reduce_sum(buf)
    }
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.control.all_reduce_sum_f64(buf)
    }
    /// On this rank's GPU in `t`'s dtype (f32 or f64); `t` elsewhere is copied there
    /// and the sum back.
    fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<Tensor> {
        let (t, back) = self.on_gpu(t)?;
        let sum = t
            .contiguous()?
            .apply_op1_no_bwd(&AllReduceSum(Arc::clone(&self.shared)))?;
        Ok(match back {
            Some(device) => sum.to_device(&device)?,
            None => sum,
        })
    }
    /// Enqueues the bucket's all-reduce on the gradient stream (see the module's documentation)
    /// and returns its sum, which may be read only after [`Comm::gradients_reduced`].
    fn all_reduce_gradients(&self, bucket: &Tensor) -> Result<Tensor> {
        if !bucket.device().same_device(&self.device) || bucket.dtype() != DType::F32 {
            anyhow::bail!(
                "NCCL all-reduces gradient buckets of f32 on {:?}, got {:?} on {:?}",
                self.device.location(),
                bucket.dtype(),
                bucket.device().location()
            );
        }
        let bucket = bucket.contiguous()?;
        let sum = bucket.apply_op1_no_bwd(&EnqueuedAllReduce(Arc::clone(&self.shared)))?;
        self.shared.gradients().reading.push(bucket);
        Ok(sum)
    }
    fn gradient_reduction(&self) -> GradientReduction {
        GradientReduction::Enqueued
    }
    /// `f32` always: the enqueued all-reduce takes f32 buckets only (an f64 model's gradients
    /// are averaged in f32 on the GPUs).
    fn bucket_dtype(&self, _params: DType) -> DType {
        DType::F32
    }
    fn gradients_reduced(&self) -> Result<()> {
        let mut gradients = self.shared.gradients();
        if let Some(last) = gradients.last.take() {
            self.shared
                .device
                .cuda_stream()
                .wait(&last)
                .map_err(|e| op_error("cuStreamWaitEvent", e))?;
        }
        gradients.reading.clear();
        Ok(())
    }
    fn device(&self) -> Option<&Device> {
        Some(&self.device)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
    }
    fn wait_for_rank_zero(&self) -> Result<()> {
        self.control.wait_for_rank_zero()
    }
    /// Bounds the control's collectives; NCCL's own wait on the GPU streams, unbounded.
    fn set_collective_timeout(&self, limit: Duration) {
        self.control.set_collective_timeout(limit)
    }
    fn abort(&self, code: i32) -> ! {
        self.control.abort(code)
    }
    fn as_collective(&self) -> &dyn Collective {
        self
    }
}

/// The elements of a contiguous CUDA operand, from its layout's start.
fn elements<'a, T: CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    op: &str,
) -> candle_core::Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let (start, end) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: input not contiguous")))?;
    Ok(s.as_cuda_slice::<T>()?.slice(start..end))
}

/// Runs `$body` with `$T` the Rust type of `$dtype`, for the dtypes in brackets; others are
/// refused, naming `$op`.
macro_rules! with_dtype {
    ($dtype:expr, $op:expr, [$($D:ident => $R:ty),*], $T:ident => $body:expr) => {
        match $dtype {
            $(DType::$D => {
                type $T = $R;
                $body
            })*
            other => candle_core::bail!(
                "{} over NCCL takes {} tensors, got {other:?}; convert it first",
                $op,
                [$(stringify!($D)),*].join(", ")
            ),
        }
    };
}

/// Concatenation along dim 0 of every rank's tensor; backward: the sum over ranks of the
/// gathered gradient, this rank's rows.
struct AllGather(Arc<Shared>);

impl AllGather {
    fn gather<T: CudaDType + NcclType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<CudaStorage> {
        let src = elements::<T>(s, l, "all_gather")?;
        // SAFETY: NCCL writes every element (world × the input's count) before any read.
        let mut dst = unsafe { self.0.device.alloc::<T>(src.len() * self.0.size)? };
        self.0
            .nccl()
            .0
            .all_gather(&src, &mut dst)
            .map_err(|e| op_error("all_gather", e))?;
        Ok(CudaStorage::wrap_cuda_slice(dst, self.0.device.clone()))
    }
}

impl CustomOp1 for AllGather {
    fn name(&self) -> &'static str {
        "nccl-all-gather"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("all_gather over NCCL takes CUDA tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let out = with_dtype!(
            s.dtype(),
            "all_gather",
            [F32 => f32, F64 => f64, U8 => u8, U32 => u32, I64 => i64],
            T => self.gather::<T>(s, l)?
        );
        let mut shape = l.dims().to_vec();
        shape[0] *= self.0.size;
        Ok((out, Shape::from(shape)))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let rows = arg.dim(0)?;
        let sum = grad_res
            .contiguous()?
            .apply_op1_no_bwd(&AllReduceSum(Arc::clone(&self.0)))?;
        Ok(Some(sum.narrow(0, self.0.rank * rows, rows)?))
    }
}

/// The element-wise sum over ranks of a tensor of the same shape on every rank.
struct AllReduceSum(Arc<Shared>);

impl AllReduceSum {
    fn reduce<T: CudaDType + NcclType + DeviceRepr>(
        &self,
        s: &CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<CudaStorage> {
        let src = elements::<T>(s, l, "all_reduce")?;
        // SAFETY: NCCL writes every element before any read.
        let mut dst = unsafe { self.0.device.alloc::<T>(src.len())? };
        self.0
            .nccl()
            .0
            .all_reduce(&src, &mut dst, &ReduceOp::Sum)
            .map_err(|e| op_error("all_reduce", e))?;
        Ok(CudaStorage::wrap_cuda_slice(dst, self.0.device.clone()))
    }
}

impl CustomOp1 for AllReduceSum {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-sum"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("all_reduce over NCCL takes CUDA tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let out = with_dtype!(
            s.dtype(),
            "all_reduce",
            [F32 => f32, F64 => f64],
            T => self.reduce::<T>(s, l)?
        );
        Ok((out, l.shape().clone()))
    }
}

/// [`AllReduceSum`] of an `f32` gradient bucket, enqueued on the gradient communicator's stream
/// after Candle's stream has written the bucket; the sum is allocated on Candle's stream, before
/// the event the gradient stream waits for, and written by the all-reduce.
struct EnqueuedAllReduce(Arc<Shared>);

impl CustomOp1 for EnqueuedAllReduce {
    fn name(&self) -> &'static str {
        "nccl-all-reduce-gradients"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("gradient buckets over NCCL are CUDA tensors")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let src = elements::<f32>(s, l, "the gradient all-reduce")?;
        let device = &self.0.device;
        // SAFETY: the all-reduce writes every element before anything reads it (after
        // `gradients_reduced`).
        let mut sum = unsafe { device.alloc::<f32>(src.len())? };
        let mut gradients = self.0.gradients();
        let written = device
            .cuda_stream()
            .record_event(None)
            .map_err(|e| op_error("cuEventRecord", e))?;
        gradients
            .stream
            .0
            .wait(&written)
            .map_err(|e| op_error("cuStreamWaitEvent", e))?;
        gradients
            .comm
            .0
            .all_reduce(&src, &mut sum, &ReduceOp::Sum)
            .map_err(|e| op_error("all_reduce of a gradient bucket", e))?;
        gradients.last = Some(
            gradients
                .stream
                .0
                .record_event(None)
                .map_err(|e| op_error("cuEventRecord", e))?,
        );
        Ok((
            CudaStorage::wrap_cuda_slice(sum, device.clone()),
            l.shape().clone(),
        ))
    }
}
