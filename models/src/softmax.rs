//! Softmax over the last axis as a fused CPU custom op with its backward.
//!
//! `candle_nn::ops::softmax` composes five passes over the input (max, subtract, exp, sum,
//! divide), each a broadcast op with its own backward; `softmax_last_dim` is fused but has no
//! backward. [`softmax_last_dim`] computes `y = exp(x − max x) / Σ exp(x − max x)` per row in one
//! pass and its gradient `dx = y ⊙ (g − ⟨g, y⟩)` in another, over row blocks on Candle's workers.
//! On CUDA (feature `cuda`) the same two ops run our kernels (`cuda.rs`, a warp per row). Other
//! devices and dtypes compose Candle ops.

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, D};
use ssl_linalg::map_chunks_mut;

use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{contiguous_slice, Float};

/// Rows per parallel block.
const BLOCK_ROWS: usize = 64;

/// Softmax of `x`: `[…, K]` over its last axis (`torch.softmax(x, -1)`).
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    let ours = fused_kernels(x.device()) || cuda_ops(x.device());
    if ours && matches!(x.dtype(), DType::F32 | DType::F64) {
        x.contiguous()?.apply_op1(SoftmaxFwd)
    } else {
        candle_nn::ops::softmax(x, D::Minus1)
    }
}

/// The gradient `y ⊙ (g − ⟨g, y⟩)` (per row) of [`softmax_last_dim`]'s input, from its output `y`
/// and the output's gradient `g`, outside autograd.
pub(crate) fn softmax_last_dim_backward(y: &Tensor, g: &Tensor) -> Result<Tensor> {
    let ours = fused_kernels(y.device()) || cuda_ops(y.device());
    if ours && matches!(y.dtype(), DType::F32 | DType::F64) && y.dtype() == g.dtype() {
        y.contiguous()?
            .apply_op2_no_bwd(&g.contiguous()?, &SoftmaxBwd)
    } else {
        let dot = (g * y)?.sum_keepdim(D::Minus1)?;
        y * g.broadcast_sub(&dot)?
    }
}

/// Rows of `len` in `l`'s shape (its last axis), at least 1.
fn row_len(l: &Layout) -> usize {
    l.shape().dims().last().copied().unwrap_or(1).max(1)
}

fn softmax_kernel<T: Float>(x: &[T], k: usize) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    map_chunks_mut(&mut out, BLOCK_ROWS * k, |block, dst| {
        let src = &x[block * BLOCK_ROWS * k..][..dst.len()];
        for (row, out) in src.chunks(k).zip(dst.chunks_mut(k)) {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, v| m.max(v.to_f64()));
            let mut sum = 0.0;
            for (o, v) in out.iter_mut().zip(row) {
                let e = (v.to_f64() - max).exp();
                sum += e;
                *o = T::from_f64(e);
            }
            let inv = T::from_f64(1.0 / sum);
            for o in out.iter_mut() {
                *o *= inv;
            }
        }
    });
    out
}

fn softmax_bwd_kernel<T: Float>(y: &[T], g: &[T], k: usize) -> Vec<T> {
    let mut out = vec![T::zero(); y.len()];
    map_chunks_mut(&mut out, BLOCK_ROWS * k, |block, dst| {
        let start = block * BLOCK_ROWS * k;
        let (ys, gs) = (&y[start..][..dst.len()], &g[start..][..dst.len()]);
        for ((yr, gr), out) in ys.chunks(k).zip(gs.chunks(k)).zip(dst.chunks_mut(k)) {
            let dot = yr
                .iter()
                .zip(gr)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum::<f64>();
            let dot = T::from_f64(dot);
            for ((o, &yv), &gv) in out.iter_mut().zip(yr).zip(gr) {
                *o = yv * (gv - dot);
            }
        }
    });
    out
}

struct SoftmaxFwd;

impl candle_core::CustomOp1 for SoftmaxFwd {
    fn name(&self) -> &'static str {
        "ssl-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let k = row_len(l);
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(softmax_kernel(contiguous_slice(s, l)?, k)),
            CpuStorage::F64(_) => CpuStorage::F64(softmax_kernel(contiguous_slice(s, l)?, k)),
            _ => candle_core::bail!("ssl-softmax supports f32 and f64 only"),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_rows("softmax", &[(s, l)])
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxBwd)?))
    }
}

/// `y ⊙ (g − ⟨g, y⟩)` per row, from the softmax output `y` and the output gradient `g`.
struct SoftmaxBwd;

impl candle_core::CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "ssl-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let k = row_len(l1);
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(softmax_bwd_kernel(
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                k,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(softmax_bwd_kernel(
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                k,
            )),
            _ => candle_core::bail!("ssl-softmax supports f32 and f64 only"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_rows("softmax_backward", &[(s1, l1), (s2, l2)])
    }
}

/// Our CUDA row `kernel` over contiguous f32 or f64 operands of one shape, rows along the last
/// axis.
#[cfg(feature = "cuda")]
fn cuda_rows(
    kernel: &str,
    operands: &[(&candle_core::CudaStorage, &Layout)],
) -> Result<(candle_core::CudaStorage, Shape)> {
    use crate::cuda::{float_dtype, row_kernel, view};
    use candle_core::backend::BackendStorage;
    let (s, l) = operands[0];
    let k = row_len(l);
    let rows = l.shape().elem_count() / k;
    let out = float_dtype!(s.dtype(), T => {
        let views = operands
            .iter()
            .map(|&(s, l)| view::<T>(s, l))
            .collect::<Result<Vec<_>>>()?;
        row_kernel(&s.device, kernel, &views, (rows, k))?
    });
    Ok((out, l.shape().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{max_abs_diff, rand_tensor};
    use candle_core::Var;

    #[test]
    fn fused_softmax_and_its_gradient_equal_the_composed_one() {
        // 150 rows of 9: three parallel blocks, the last partial; large logits test the
        // max shift.
        let x =
            Var::from_tensor(&(rand_tensor(1, &[3, 50, 9], DType::F64) * 40.0).unwrap()).unwrap();
        let r = rand_tensor(2, &[3, 50, 9], DType::F64);
        let fused = softmax_last_dim(x.as_tensor()).unwrap();
        let composed = candle_nn::ops::softmax(x.as_tensor(), D::Minus1).unwrap();
        assert!(max_abs_diff(&fused, &composed) < 1e-14);
        let gradient = |y: &Tensor| {
            let grads = (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
            grads.get(x.as_tensor()).unwrap().clone()
        };
        assert!(max_abs_diff(&gradient(&fused), &gradient(&composed)) < 1e-14);
    }

    #[test]
    fn the_gradient_outside_autograd_is_the_same_on_both_paths() {
        // Our op and, under `composed_only`, the composed formula, against autograd's gradient.
        let x = Var::from_tensor(&(rand_tensor(4, &[6, 11], DType::F64) * 5.0).unwrap()).unwrap();
        let r = rand_tensor(5, &[6, 11], DType::F64);
        let y = softmax_last_dim(x.as_tensor()).unwrap();
        let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let autograd = grads.get(x.as_tensor()).unwrap();
        let ours = softmax_last_dim_backward(&y.detach(), &r).unwrap();
        let composed = {
            let _composed = crate::dispatch::composed_only();
            softmax_last_dim_backward(&y.detach(), &r).unwrap()
        };
        assert!(max_abs_diff(&ours, autograd) < 1e-15);
        assert!(max_abs_diff(&composed, autograd) < 1e-14);
    }

    #[test]
    fn rows_sum_to_one_in_f32() {
        let y = softmax_last_dim(&rand_tensor(3, &[7, 197], DType::F32)).unwrap();
        let sums: Vec<f32> = y.sum(1).unwrap().to_vec1().unwrap();
        assert!(sums.iter().all(|s| (s - 1.0).abs() < 1e-6), "{sums:?}");
    }
}
