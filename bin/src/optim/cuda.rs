//! Launching the optimisers' kernels ([`adamw.cu`](adamw.cu), [`sgd.cu`](sgd.cu)): one thread
//! per value (grid-stride) of a contiguous buffer updated in place, compiled by NVRTC on first
//! use through `ssl_models::cuda::function`.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{DType, Layout, Result, WithDType};

/// Threads per block (`THREADS` in sgd.cu).
const THREADS: u32 = 256;
/// Blocks a grid-stride kernel launches at most.
const MAX_BLOCKS: usize = 65_535;

/// A CUDA C++ source and the module name NVRTC compiles it under.
#[derive(Clone, Copy)]
pub(super) struct Kernels {
    pub module: &'static str,
    pub source: &'static str,
}

/// A kernel argument after the updated buffer, in the kernel's order.
pub(super) enum Arg<'a> {
    /// A contiguous tensor of the step's dtype, read only.
    Values(&'a CudaStorage, &'a Layout),
    /// A contiguous f64 tensor (LARS's squared norms), read only.
    Sums(&'a CudaStorage, &'a Layout),
    /// The count of values the kernel runs over (`long long`).
    Count,
    F64(f64),
    I32(i32),
}

/// An [`Arg`] as the launch takes it.
enum Pushed<'a, T> {
    Values(CudaView<'a, T>),
    Sums(CudaView<'a, f64>),
    I64(i64),
    F64(f64),
    I32(i32),
}

fn range(l: &Layout) -> Result<std::ops::Range<usize>> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(start..end),
        None => candle_core::bail!("an in-place optimiser step takes contiguous tensors"),
    }
}

/// Launches `kernels`' function `name` for `dtype` (suffix `_f32` or `_f64`) over `count`
/// values: `out` (updated in place; of `dtype`, or f64 for a sum) first, then `args`.
pub(super) fn launch(
    kernels: Kernels,
    name: &str,
    dtype: DType,
    (out, lo): (&mut CudaStorage, &Layout),
    count: usize,
    args: &[Arg<'_>],
) -> Result<()> {
    match dtype {
        DType::F32 => typed::<f32>(kernels, &format!("{name}_f32"), (out, lo), count, args),
        DType::F64 => typed::<f64>(kernels, &format!("{name}_f64"), (out, lo), count, args),
        other => candle_core::bail!("the optimisers' CUDA kernels take f32 or f64, got {other:?}"),
    }
}

fn typed<T: CudaDType + WithDType>(
    kernels: Kernels,
    name: &str,
    (out, lo): (&mut CudaStorage, &Layout),
    count: usize,
    args: &[Arg<'_>],
) -> Result<()> {
    let dev = out.device().clone();
    let function = ssl_models::cuda::function(&dev, kernels.module, kernels.source, name)?;
    let pushed = args
        .iter()
        .map(|a| {
            Ok(match a {
                Arg::Values(s, l) => Pushed::Values(s.as_cuda_slice::<T>()?.slice(range(l)?)),
                Arg::Sums(s, l) => Pushed::Sums(s.as_cuda_slice::<f64>()?.slice(range(l)?)),
                Arg::Count => Pushed::I64(count as i64),
                Arg::F64(v) => Pushed::F64(*v),
                Arg::I32(v) => Pushed::I32(*v),
            })
        })
        .collect::<Result<Vec<Pushed<T>>>>()?;
    let range = range(lo)?;
    let (mut values, mut sums);
    let stream = dev.cuda_stream();
    let mut launch = stream.launch_builder(&function);
    match out.dtype() == T::DTYPE {
        true => {
            values = out.as_cuda_slice_mut::<T>()?.slice_mut(range);
            launch.arg(&mut values);
        }
        false => {
            sums = out.as_cuda_slice_mut::<f64>()?.slice_mut(range);
            launch.arg(&mut sums);
        }
    }
    for p in &pushed {
        match p {
            Pushed::Values(v) => launch.arg(v),
            Pushed::Sums(v) => launch.arg(v),
            Pushed::I64(v) => launch.arg(v),
            Pushed::F64(v) => launch.arg(v),
            Pushed::I32(v) => launch.arg(v),
        };
    }
    let config = LaunchConfig {
        grid_dim: (
            count.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments are the kernel's, in its order and types (the caller's `args`).
    unsafe { launch.launch(config) }?;
    Ok(())
}
