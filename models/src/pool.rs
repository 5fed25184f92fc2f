//! Max pooling of channel-major activations in 2D and 3D, as PyTorch's `MaxPool2d` / `MaxPool3d`
//! (`ceil_mode=False`, padding with −∞, padding at most half the window).
//!
//! Candle's `max_pool2d` has no padding and no backward for overlapping windows (kernel ≠
//! stride), which the ResNet stem (3×3, stride 2, padding 1) needs. On the CPU the forward is a
//! custom op that records the flat input index of each window's first maximum; the backward
//! routes every output gradient to that index. Both run over disjoint (channel, image) volumes
//! on Candle's workers. Other devices take the maximum over gathered windows with Candle ops.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use ssl_linalg::{for_each_chunk_mut, map_chunks_mut};

use crate::conv::{gather_windows, Geom};
use crate::util::{contiguous_slice, Float};

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
    let g = Geom::new("max pool", x.dims(), kernel, stride, padding)?;
    let out_dims = g.out_dims(g.c, x.rank() - 2);
    if !x.device().is_cpu() {
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
        argmax: Arc::new(Mutex::new(Vec::new())),
    };
    x.apply_op1(op)?.reshape(out_dims)
}

/// Forward: `[C·N·V_in]` → `[C·N·V_out]` flat, recording each window's first maximum.
struct MaxPool {
    g: Geom,
    /// Per output: the flat index of its maximum within its (channel, image) input volume.
    argmax: Arc<Mutex<Vec<u32>>>,
}

/// Backward: output gradient → input gradient through the recorded maxima.
struct MaxPoolBwd {
    g: Geom,
    argmax: Arc<Mutex<Vec<u32>>>,
}

fn pool_kernel<T: Float>(g: Geom, x: &[T]) -> (Vec<T>, Vec<u32>) {
    let volume = g.size.iter().product::<usize>();
    let per_volume = g.out().iter().product::<usize>();
    let [_, h, w] = g.size;
    let [_, h_out, w_out] = g.out();
    let mut out = vec![T::from_f64(0.0); g.c * g.n * per_volume];
    let argmax = map_chunks_mut(&mut out, per_volume.max(1), |idx, dst| {
        let src = &x[idx * volume..][..volume];
        let mut arg = vec![0u32; per_volume];
        for (o, (d, a)) in dst.iter_mut().zip(arg.iter_mut()).enumerate() {
            let (od, oh, ow) = (o / (h_out * w_out), (o / w_out) % h_out, o % w_out);
            let mut best: Option<(T, usize)> = None;
            for kd in 0..g.k[0] {
                let Some(id) = (od * g.stride[0] + kd).checked_sub(g.pad[0]) else {
                    continue;
                };
                for kh in 0..g.k[1] {
                    let Some(ih) = (oh * g.stride[1] + kh).checked_sub(g.pad[1]) else {
                        continue;
                    };
                    for kw in 0..g.k[2] {
                        let Some(iw) = (ow * g.stride[2] + kw).checked_sub(g.pad[2]) else {
                            continue;
                        };
                        if id >= g.size[0] || ih >= h || iw >= w {
                            continue;
                        }
                        let i = (id * h + ih) * w + iw;
                        let v = src[i];
                        // `>` keeps the first maximum; NaN propagates as in PyTorch.
                        if best.is_none_or(|(b, _)| v > b || v.to_f64().is_nan()) {
                            best = Some((v, i));
                        }
                    }
                }
            }
            // Padding ≤ kernel/2 puts at least one input in every window.
            let (v, i) = best.expect("every window holds an input");
            *d = v;
            *a = i as u32;
        }
        arg
    });
    (out, argmax.concat())
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
        *self.argmax.lock().expect("max-pool argmax lock") = argmax;
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
        let argmax = self.argmax.lock().expect("max-pool argmax lock");
        let out = match s {
            CpuStorage::F32(_) => {
                CpuStorage::F32(pool_bwd_kernel(self.g, contiguous_slice(s, l)?, &argmax))
            }
            CpuStorage::F64(_) => {
                CpuStorage::F64(pool_bwd_kernel(self.g, contiguous_slice(s, l)?, &argmax))
            }
            _ => candle_core::bail!("max pool supports f32 and f64 only"),
        };
        let n = self.g.c * self.g.n * self.g.size.iter().product::<usize>();
        Ok((out, Shape::from(n)))
    }
}

#[cfg(test)]
mod tests;
