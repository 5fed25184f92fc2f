//! Max pooling of channel-major activations in 2D and 3D, as PyTorch's `MaxPool2d` / `MaxPool3d`
//! (`ceil_mode=False`, padding with −∞, padding at most half the window).
//!
//! Candle's `max_pool2d` has no padding and no backward for overlapping windows (kernel ≠
//! stride), which the ResNet stem (3×3, stride 2, padding 1) needs. On the CPU the forward is a
//! custom op that records the flat input index of each window's first maximum; the backward
//! routes every output gradient to that index. Both run over disjoint (channel, image) volumes
//! on Candle's workers. On CUDA (feature `cuda`) the same op runs our kernels (`cuda.rs`, one
//! thread per output; the backward adds atomically). Other devices take the maximum over
//! gathered windows with Candle ops. Global average pooling is a mean where the activations lie.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use ssl_linalg::{for_each_chunk_mut, map_chunks_mut};

use crate::conv::{gather_windows, Geom};
use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{batch_major_in_memory, contiguous_slice, vectorized, Float};

/// Max pooling of `x`: `[C, N, *S]` (spatial rank 2 or 3) with a cubic window of side
/// `kernel`, giving `[C, N, *S_out]`, `S_out = ⌊(S + 2·padding − kernel)/stride⌋ + 1`.
pub fn max_pool_channel_major(
    x: &Tensor,
    kernel: usize,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    if kernel == 0 || stride == 0 {
        candle_core::bail!("max pool: kernel and stride must be positive");
    }
    if 2 * padding > kernel {
        candle_core::bail!(
            "max pool: padding {padding} exceeds half the window {kernel} (PyTorch refuses it too)"
        );
    }
    if let Some(batch_major) = batch_major_in_memory(x)? {
        // Each (channel, image) plane is pooled alike, so the batch-major view is pooled as is.
        return max_pool_channel_major(&batch_major, kernel, stride, padding)?.transpose(0, 1);
    }
    let g = Geom::new("max pool", x.dims(), kernel, stride, padding)?;
    let out_dims = g.out_dims(g.c, x.rank() - 2);
    if !fused_kernels(x.device()) && !cuda_ops(x.device()) {
        let volumes = x.reshape((g.c, g.n, g.size[0], g.size[1], g.size[2]))?;
        return gather_windows(&volumes, g, f64::NEG_INFINITY)?
            .max(0)?
            .reshape(out_dims);
    }
    let x = match x.dtype() {
        DType::F32 | DType::F64 => x.contiguous()?,
        _ => x.to_dtype(DType::F32)?.contiguous()?,
    };
    let op = MaxPool {
        g,
        argmax: Arc::new(Mutex::new(Argmax::Pending)),
    };
    x.apply_op1(op)?.reshape(out_dims)
}

/// Global average pooling of channel-major activations: `[C, N, *S]` → `[N, C]`, the mean over
/// the positions of each (channel, image) plane, read where the activations lie (batch-major in
/// memory on CUDA, channel-major on the CPU) without a copy.
pub fn global_average_pool_channel_major(x: &Tensor) -> Result<Tensor> {
    if x.rank() < 3 {
        candle_core::bail!(
            "global average pool: expected [C, N, *S], got {:?}",
            x.dims()
        );
    }
    match batch_major_in_memory(x)? {
        Some(batch_major) => batch_major.flatten_from(2)?.mean(2),
        None => x.flatten_from(2)?.mean(2)?.t(),
    }
}

/// Per output: the flat index of its maximum within its (channel, image) input volume.
enum Argmax {
    /// The forward has not run.
    Pending,
    Host(Vec<u32>),
    #[cfg(feature = "cuda")]
    Device(candle_core::cuda_backend::cudarc::driver::CudaSlice<u32>),
}

/// Forward: `[C·N·V_in]` → `[C·N·V_out]` flat, recording each window's first maximum.
struct MaxPool {
    g: Geom,
    argmax: Arc<Mutex<Argmax>>,
}

/// Backward: output gradient → input gradient through the recorded maxima.
struct MaxPoolBwd {
    g: Geom,
    argmax: Arc<Mutex<Argmax>>,
}

/// `g` as our CUDA kernels take it.
#[cfg(feature = "cuda")]
fn pool_geom(g: &Geom) -> crate::cuda::PoolGeom {
    let int = |v: [usize; 3]| v.map(|x| x as i32);
    crate::cuda::PoolGeom {
        size: int(g.size),
        out: int(g.out()),
        k: int(g.k),
        stride: int(g.stride),
        pad: int(g.pad),
    }
}

/// The pooled volumes of `x` and, per output, the flat index of its window's first maximum
/// within its (channel, image) volume.
fn pool_kernel<T: Float>(g: Geom, x: &[T]) -> (Vec<T>, Vec<u32>) {
    let volume = g.size.iter().product::<usize>();
    let per_volume = g.out().iter().product::<usize>();
    let mut out = vec![T::from_f64(0.0); g.c * g.n * per_volume];
    let argmax = map_chunks_mut(&mut out, per_volume.max(1), |idx, dst| {
        let mut arg = vec![0u32; per_volume];
        vectorized(
            #[inline(always)]
            || pool_volume(&g, &x[idx * volume..][..volume], dst, &mut arg),
        );
        arg
    });
    (out, argmax.concat())
}

/// Max pooling of one `[D, H, W]` volume, one axis at a time: the maximum over a window is the
/// maximum over its depth of the maxima over its height of the maxima over its width. Each pass
/// keeps the first maximum in its scan order, so the three keep the window's first in
/// PyTorch's (d, h, w) order; a NaN replaces any value, so the window's last NaN propagates.
/// Writes the maxima to `dst` and their flat indices in the volume to `arg`.
#[inline(always)]
fn pool_volume<T: Float>(g: &Geom, src: &[T], dst: &mut [T], arg: &mut [u32]) {
    let [depth, height, width] = g.size;
    let [_, h_out, w_out] = g.out();
    let window = |axis: usize, o: usize, n: usize| {
        let start = o * g.stride[axis];
        start.saturating_sub(g.pad[axis])..(start + g.k[axis] - g.pad[axis]).min(n)
    };
    // Along the width: [D, H, W_out].
    let rows_out = depth * height * w_out;
    let mut by_width = (Vec::with_capacity(rows_out), Vec::with_capacity(rows_out));
    for (r, row) in src.chunks(width).enumerate() {
        for ow in 0..w_out {
            let taps = window(2, ow, width);
            let mut best = (row[taps.start], taps.start);
            for (iw, &value) in row.iter().enumerate().take(taps.end).skip(taps.start + 1) {
                if replaces(value, best.0) {
                    best = (value, iw);
                }
            }
            by_width.0.push(best.0);
            by_width.1.push((r * width + best.1) as u32);
        }
    }
    // Along the height: [D, H_out, W_out].
    let plane = h_out * w_out;
    let mut by_height = (
        vec![T::from_f64(0.0); depth * plane],
        vec![0u32; depth * plane],
    );
    for d in 0..depth {
        for oh in 0..h_out {
            let rows = window(1, oh, height).map(|ih| {
                let at = (d * height + ih) * w_out;
                at..at + w_out
            });
            let at = (d * h_out + oh) * w_out;
            let best = (
                &mut by_height.0[at..][..w_out],
                &mut by_height.1[at..][..w_out],
            );
            merge_rows(best, &by_width, rows);
        }
    }
    // Along the depth, into the output.
    for (od, (dst, arg)) in dst.chunks_mut(plane).zip(arg.chunks_mut(plane)).enumerate() {
        let planes = window(0, od, depth).map(|id| id * plane);
        merge_rows((dst, arg), &by_height, planes.map(|at| at..at + plane));
    }
}

/// Whether `value` replaces the maximum `best` found earlier in a scan: a larger value or a NaN.
#[inline(always)]
fn replaces<T: Float>(value: T, best: T) -> bool {
    #[allow(clippy::eq_op)] // a NaN is the value unequal to itself
    let nan = value != value;
    value > best || nan
}

/// The element-wise first maximum of the rows `ranges` of `from` (values and indices), in order,
/// into `best`.
#[inline(always)]
fn merge_rows<T: Float>(
    (best_v, best_i): (&mut [T], &mut [u32]),
    (from_v, from_i): &(Vec<T>, Vec<u32>),
    mut ranges: impl Iterator<Item = std::ops::Range<usize>>,
) {
    let first = ranges.next().expect("every window holds an input");
    best_v.copy_from_slice(&from_v[first.clone()]);
    best_i.copy_from_slice(&from_i[first]);
    for range in ranges {
        let (vs, is) = (&from_v[range.clone()], &from_i[range]);
        for (((bv, bi), &v), &i) in best_v.iter_mut().zip(best_i.iter_mut()).zip(vs).zip(is) {
            if replaces(v, *bv) {
                (*bv, *bi) = (v, i);
            }
        }
    }
}

fn pool_bwd_kernel<T: Float>(g: Geom, grad: &[T], argmax: &[u32]) -> Vec<T> {
    let volume = g.size.iter().product::<usize>();
    let per_volume = g.out().iter().product::<usize>();
    let mut dx = vec![T::from_f64(0.0); g.c * g.n * volume];
    for_each_chunk_mut(
        &mut dx,
        volume.max(1),
        || (),
        |_, idx, dst| {
            let range = idx * per_volume..(idx + 1) * per_volume;
            for (&gv, &a) in grad[range.clone()].iter().zip(&argmax[range]) {
                dst[a as usize] += gv;
            }
        },
    );
    dx
}

impl candle_core::CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "ssl-max-pool"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (out, argmax) = match s {
            CpuStorage::F32(_) => {
                let (o, a) = pool_kernel::<f32>(self.g, contiguous_slice(s, l)?);
                (CpuStorage::F32(o), a)
            }
            CpuStorage::F64(_) => {
                let (o, a) = pool_kernel::<f64>(self.g, contiguous_slice(s, l)?);
                (CpuStorage::F64(o), a)
            }
            _ => candle_core::bail!("max pool supports f32 and f64 only"),
        };
        let n = argmax.len();
        *self.argmax.lock().expect("max-pool argmax lock") = Argmax::Host(argmax);
        Ok((out, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{float_dtype, max_pool, view};
        use candle_core::backend::BackendStorage;
        let volumes = self.g.c * self.g.n;
        let (out, argmax) = float_dtype!(s.dtype(), T => {
            max_pool(&s.device, view::<T>(s, l)?, volumes, pool_geom(&self.g))?
        });
        let n = volumes * self.g.out().iter().product::<usize>();
        *self.argmax.lock().expect("max-pool argmax lock") = Argmax::Device(argmax);
        Ok((out, Shape::from(n)))
    }
    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = MaxPoolBwd {
            g: self.g,
            argmax: self.argmax.clone(),
        };
        Ok(Some(
            grad.contiguous()?
                .apply_op1_no_bwd(&op)?
                .reshape(arg.shape())?,
        ))
    }
}

impl candle_core::CustomOp1 for MaxPoolBwd {
    fn name(&self) -> &'static str {
        "ssl-max-pool-bwd"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let saved = self.argmax.lock().expect("max-pool argmax lock");
        let argmax: &[u32] = match &*saved {
            Argmax::Host(argmax) => argmax,
            Argmax::Pending => candle_core::bail!("max pool: backward before the forward"),
            #[cfg(feature = "cuda")]
            Argmax::Device(_) => candle_core::bail!("a CUDA max pool's backward got CPU tensors"),
        };
        let out = match s {
            CpuStorage::F32(_) => {
                CpuStorage::F32(pool_bwd_kernel(self.g, contiguous_slice(s, l)?, argmax))
            }
            CpuStorage::F64(_) => {
                CpuStorage::F64(pool_bwd_kernel(self.g, contiguous_slice(s, l)?, argmax))
            }
            _ => candle_core::bail!("max pool supports f32 and f64 only"),
        };
        let n = self.g.c * self.g.n * self.g.size.iter().product::<usize>();
        Ok((out, Shape::from(n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{float_dtype, max_pool_backward, view};
        use candle_core::backend::BackendStorage;
        let Argmax::Device(argmax) = &*self.argmax.lock().expect("max-pool argmax lock") else {
            candle_core::bail!("a CPU max pool's backward got CUDA tensors");
        };
        let volumes = self.g.c * self.g.n;
        let dx = float_dtype!(s.dtype(), T => {
            max_pool_backward(&s.device, view::<T>(s, l)?, argmax, volumes, pool_geom(&self.g))?
        });
        Ok((
            dx,
            Shape::from(volumes * self.g.size.iter().product::<usize>()),
        ))
    }
}

#[cfg(test)]
mod tests;
