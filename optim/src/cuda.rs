//! The optimisers' CUDA steps over every parameter at once ([`adamw.cu`](adamw.cu),
//! [`sgd.cu`](sgd.cu) in the frame of [`multi_tensor.cuh`](multi_tensor.cuh)), as PyTorch's
//! `foreach`/fused optimisers and apex's `multi_tensor_apply`: a table of each parameter's
//! buffers and scalars and a list of chunks go to the device in one copy, and one launch gives
//! each chunk of [`CHUNK`] values a block. A step is then one or two launches where it was
//! three per parameter (about 200 in `train_step` row 1), each costing the host a few
//! microseconds. Kernels are compiled by NVRTC on first use through `ssl_models::cuda::function`.

use candle_core::cuda_backend::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{bail, DType, Device, Result, Storage, Tensor, WithDType};

/// Values a block updates.
const CHUNK: usize = 1 << 14;
/// Threads per block (`THREADS` in multi_tensor.cuh).
const THREADS: u32 = 256;
/// Buffers a table entry holds (`Operands::p`).
const BUFFERS: usize = 4;
/// Scalars a table entry holds (`Operands::s`).
const SCALARS: usize = 7;
/// 64-bit words of a table entry: the buffers, the gradient's factor, the count, the scalars.
const ENTRY_WORDS: usize = BUFFERS + 2 + SCALARS;

/// A CUDA C++ source (after the frame of multi_tensor.cuh) and the module name NVRTC compiles
/// it under.
#[derive(Clone, Copy)]
pub(super) struct Kernels {
    pub module: &'static str,
    pub source: &'static str,
}

/// One parameter's part of a launch.
pub(super) struct Entry {
    /// Contiguous CUDA tensors of one dtype and size, in the kernel's order (`Operands::p`;
    /// those it updates are written in place).
    pub buffers: Vec<Tensor>,
    /// The one-value f64 tensor the gradient is multiplied by first (its clipping factor).
    pub grad_factor: Option<Tensor>,
    /// The kernel's scalars for this parameter (`Operands::s`).
    pub scalars: Vec<f64>,
}

/// `(parameter, first value)` of each block: every parameter of `counts` values cut into chunks
/// of `chunk` values, in order (a parameter without values gets none).
fn chunks(counts: &[usize], chunk: usize) -> Vec<[u64; 2]> {
    let mut out = Vec::new();
    for (t, &n) in counts.iter().enumerate() {
        out.extend((0..n).step_by(chunk).map(|start| [t as u64, start as u64]));
    }
    out
}

/// The device address of the values of `t`, a contiguous CUDA tensor of `T`.
///
/// The address outlives the storage's lock: the caller holds `t` until the kernel that uses it
/// is enqueued, and a later free is ordered after it on the stream. The kernels write through
/// some of these addresses as an in-place op would; candle-ssl runs a device's work on one
/// stream, so there is nothing to order (`ssl::setup::device`).
fn address<T: CudaDType>(
    t: &Tensor,
    stream: &candle_core::cuda_backend::cudarc::driver::CudaStream,
) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        bail!(
            "the optimiser's CUDA step takes CUDA tensors, got one on {:?}",
            t.device()
        );
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("the optimiser's CUDA step takes contiguous tensors");
    };
    let view = cuda.as_cuda_slice::<T>()?.slice(start..end);
    let (ptr, _) = view.device_ptr(stream);
    Ok(ptr)
}

/// Launches `kernels`' function `name` for the entries' dtype (suffix `_f32` or `_f64`) once
/// over `entries`, with `sums`, a contiguous f64 CUDA tensor, as its last argument (null where
/// `None`).
pub(super) fn launch(
    kernels: Kernels,
    name: &str,
    entries: &[Entry],
    sums: Option<&Tensor>,
) -> Result<()> {
    let Some(first) = entries.first().and_then(|e| e.buffers.first()) else {
        return Ok(());
    };
    match first.dtype() {
        DType::F32 => typed::<f32>(kernels, &format!("{name}_f32"), entries, sums),
        DType::F64 => typed::<f64>(kernels, &format!("{name}_f64"), entries, sums),
        other => bail!("the optimisers' CUDA kernels take f32 or f64, got {other:?}"),
    }
}

fn typed<T: CudaDType + WithDType>(
    kernels: Kernels,
    name: &str,
    entries: &[Entry],
    sums: Option<&Tensor>,
) -> Result<()> {
    let Device::Cuda(dev) = entries[0].buffers[0].device() else {
        bail!("the optimiser's CUDA step takes CUDA tensors");
    };
    let stream = dev.cuda_stream();
    let mut table = Vec::with_capacity(entries.len() * ENTRY_WORDS);
    let mut counts = Vec::with_capacity(entries.len());
    for e in entries {
        let n = e.buffers[0].elem_count();
        if e.buffers.len() > BUFFERS || e.scalars.len() > SCALARS {
            bail!("an optimiser kernel takes at most {BUFFERS} buffers and {SCALARS} scalars");
        }
        let mut words = [0u64; ENTRY_WORDS];
        for (word, b) in words.iter_mut().zip(&e.buffers) {
            if b.dtype() != T::DTYPE || b.elem_count() != n {
                bail!("an optimiser step's buffers share one dtype and size");
            }
            *word = address::<T>(b, &stream)?;
        }
        if let Some(f) = &e.grad_factor {
            if f.dtype() != DType::F64 || f.elem_count() != 1 {
                bail!("a gradient's factor is one f64 value");
            }
            words[BUFFERS] = address::<f64>(f, &stream)?;
        }
        words[BUFFERS + 1] = n as u64;
        for (word, s) in words[BUFFERS + 2..].iter_mut().zip(&e.scalars) {
            *word = s.to_bits();
        }
        table.extend(words);
        counts.push(n);
    }
    let blocks = chunks(&counts, CHUNK);
    if blocks.is_empty() {
        return Ok(());
    }
    let chunk_offset = table.len();
    table.extend(blocks.iter().flatten());
    let table = stream
        .clone_htod(&table)
        .map_err(candle_core::Error::wrap)?;
    let sums = sums.map(|s| address::<f64>(s, &stream)).transpose()?;
    let function = ssl_models::cuda::function(dev, kernels.module, kernels.source, name)?;
    let (operands, chunk_list) = (table.slice(..chunk_offset), table.slice(chunk_offset..));
    let (chunk, sums) = (CHUNK as i64, sums.unwrap_or(0));
    let mut launch = stream.launch_builder(&function);
    launch
        .arg(&operands)
        .arg(&chunk_list)
        .arg(&chunk)
        .arg(&sums);
    let config = LaunchConfig {
        grid_dim: (blocks.len() as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments are the kernel's, in its order: the table of `Operands<T>` (every
    // address a live buffer of `T` or of one f64, as built above), the chunks, the chunk size
    // and the sums' address (or null, which only kernels that take none get).
    unsafe { launch.launch(config) }.map_err(candle_core::Error::wrap)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::chunks;

    /// Every value of every parameter falls in exactly one chunk, chunks start at multiples of
    /// the chunk size within their parameter, and empty parameters get none.
    #[test]
    fn chunks_cover_every_value_once() {
        let counts = [3, 0, 8, 9, 1];
        let list = chunks(&counts, 4);
        assert_eq!(
            list,
            [[0, 0], [2, 0], [2, 4], [3, 0], [3, 4], [3, 8], [4, 0]]
        );
        for (t, &n) in counts.iter().enumerate() {
            let mut covered = vec![0; n];
            for &[p, start] in list.iter().filter(|c| c[0] == t as u64) {
                for c in covered.iter_mut().skip(start as usize).take(4) {
                    *c += 1;
                }
                assert_eq!(p, t as u64);
            }
            assert!(
                covered.iter().all(|&c| c == 1),
                "parameter {t}: {covered:?}"
            );
        }
    }
}
