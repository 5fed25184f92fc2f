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

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{Context, Result};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::DeviceRepr;
use candle_core::cuda_backend::cudarc::nccl::{Comm as NcclComm, Id, NcclType, ReduceOp};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{CpuStorage, CudaStorage, CustomOp1, DType, Device, Layout, Shape, Tensor};
use ssl_core::Collective;

use crate::Comm;

/// An NCCL communicator, usable from any thread one call at a time.
struct Communicator(NcclComm);

// SAFETY: NCCL allows a communicator to be used from any thread as long as no two calls on it
// overlap (its "thread safety" notes); every use goes through the `Mutex` in `Shared`.
unsafe impl Send for Communicator {}

/// What the collective and the custom ops in a graph share.
struct Shared {
    nccl: Mutex<Communicator>,
    device: CudaDevice,
    rank: usize,
    size: usize,
}

impl Shared {
    fn nccl(&self) -> MutexGuard<'_, Communicator> {
        self.nccl.lock().unwrap_or_else(PoisonError::into_inner)
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
    /// Opens `cuda:<local_rank>` and joins the NCCL communicator of `control`'s ranks: rank 0
    /// creates the NCCL unique id and, at world size > 1, sends its 128 bytes to the others
    /// through `control` (an all-reduce sum to which the other ranks add zeros: a broadcast).
    pub fn init(control: Arc<dyn Comm>, local_rank: usize) -> Result<Self> {
        let (rank, size) = (control.rank(), control.world_size());
        let device = Device::new_cuda(local_rank).with_context(|| {
            format!(
                "--distributed nccl: rank {rank} (local rank {local_rank}) cannot open \
                 cuda:{local_rank}; NCCL trains one process per GPU, local rank k on cuda:k, so \
                 start at most as many processes per node as it has GPUs"
            )
        })?;
        let mut bytes = [0f64; 128];
        if rank == 0 {
            let id = Id::new().map_err(|e| op_error("ncclGetUniqueId", e))?;
            for (b, &c) in bytes.iter_mut().zip(id.internal()) {
                *b = f64::from(c as u8);
            }
        }
        if size > 1 {
            control.all_reduce_sum_f64(&mut bytes)?;
        }
        let id = Id::uninit(bytes.map(|b| b as u8 as c_char));
        let cuda = device.as_cuda_device()?.clone();
        let comm = NcclComm::from_rank(cuda.cuda_stream(), rank, size, id)
            .map_err(|e| op_error("ncclCommInitRank", e))?;
        Ok(Self {
            shared: Arc::new(Shared {
                nccl: Mutex::new(Communicator(comm)),
                device: cuda,
                rank,
                size,
            }),
            control,
            device,
        })
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
    fn world_size(&self) -> usize {
        self.shared.size
    }

    /// Gathers along `dim` on this rank's GPU: a tensor elsewhere is copied there and the result
    /// back (both copies are differentiable). Every rank's `t` must have the same shape.
    fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
        let (t, back) = self.on_gpu(t)?;
        let front = t.transpose(0, dim)?.contiguous()?;
        let gathered = front.apply_op1(AllGather(Arc::clone(&self.shared)))?;
        let gathered = gathered.transpose(0, dim)?.contiguous()?;
        match back {
            Some(device) => gathered.to_device(&device),
            None => Ok(gathered),
        }
    }
}

impl Comm for NcclCollective {
    fn rank(&self) -> usize {
        self.shared.rank
    }
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
    fn device(&self) -> Option<&Device> {
        Some(&self.device)
    }
    fn barrier(&self) -> Result<()> {
        self.control.barrier()
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
    /// Every rank's `[rows, row length]`, checked equal: NCCL gathers the same count from every
    /// rank, and a rank with fewer rows would read past its buffer.
    fn check_shapes(&self, dims: &[usize]) -> candle_core::Result<()> {
        let local = [dims[0] as u64, dims[1..].iter().product::<usize>() as u64];
        let dev = &self.0.device;
        let src = dev.clone_htod(&local)?;
        let mut dst = dev.alloc_zeros::<u64>(2 * self.0.size)?;
        self.0
            .nccl()
            .0
            .all_gather(&src, &mut dst)
            .map_err(|e| op_error("all_gather of the shapes", e))?;
        let shapes = dev.clone_dtoh(&dst)?;
        if let Some(r) = (0..self.0.size).find(|r| shapes[2 * r..2 * r + 2] != shapes[..2]) {
            candle_core::bail!(
                "all_gather needs the same shape on every rank: rank 0 has {} rows of {} values, \
                 rank {r} {} of {}; give every rank batches of the same size (train.drop_last)",
                shapes[0],
                shapes[1],
                shapes[2 * r],
                shapes[2 * r + 1]
            );
        }
        Ok(())
    }

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
        self.check_shapes(l.dims())?;
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
