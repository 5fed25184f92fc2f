//! The join of a residual block, `relu(h + shortcut)` (He et al., "Deep Residual Learning for
//! Image Recognition", 2016, eq. 1 and Fig. 2), as a CPU custom op whose backward is one pass,
//! `g · [y > 0]`, handed to both inputs (PyTorch's convention: no gradient where `y = 0`).
//!
//! Composed of Candle ops it is an add and a ReLU forward, and a backward of five passes over
//! the block's output (the ReLU's zeros, comparison, mask cast and product, then the sum's
//! gradient added into zeros). A CIFAR ResNet-18 at 128 images joins 8 blocks of 4 to 34 MB,
//! each view, every step. On CUDA (feature `cuda`) the op runs our kernels (`cuda.rs`); other
//! devices and dtypes use Candle's ops.

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};

use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{batch_major_in_memory, contiguous_slice, zip_map, Float};

/// `relu(h + shortcut)` of two tensors of one shape.
pub fn residual_relu(h: &Tensor, shortcut: &Tensor) -> Result<Tensor> {
    let fused = (fused_kernels(h.device()) || cuda_ops(h.device()))
        && matches!(h.dtype(), DType::F32 | DType::F64)
        && h.dtype() == shortcut.dtype()
        && h.shape() == shortcut.shape();
    if !fused {
        return (h + shortcut)?.relu();
    }
    if let (Some(h), Some(shortcut)) = (batch_major_in_memory(h)?, batch_major_in_memory(shortcut)?)
    {
        // Elementwise: the batch-major views join as they lie.
        return residual_relu(&h, &shortcut)?.transpose(0, 1);
    }
    h.contiguous()?
        .apply_op2(&shortcut.contiguous()?, ResidualRelu)
}

/// `max(a + b, 0)` elementwise.
fn forward_kernel<T: Float>(a: &[T], b: &[T]) -> Vec<T> {
    let zero = T::from_f64(0.0);
    zip_map(a, b, |a, b| if a + b > zero { a + b } else { zero })
}

/// `g · [y > 0]` elementwise.
fn backward_kernel<T: Float>(y: &[T], g: &[T]) -> Vec<T> {
    let zero = T::from_f64(0.0);
    zip_map(y, g, |y, g| if y > zero { g } else { zero })
}

/// Applies `kernel` to two f32 or f64 storages of one dtype.
fn apply_kernel(
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    kernel32: fn(&[f32], &[f32]) -> Vec<f32>,
    kernel64: fn(&[f64], &[f64]) -> Vec<f64>,
) -> Result<(CpuStorage, Shape)> {
    let out = match (s1, s2) {
        (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(kernel32(
            contiguous_slice(s1, l1)?,
            contiguous_slice(s2, l2)?,
        )),
        (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(kernel64(
            contiguous_slice(s1, l1)?,
            contiguous_slice(s2, l2)?,
        )),
        _ => candle_core::bail!("ssl-residual-relu takes two f32 or two f64 tensors"),
    };
    Ok((out, l1.shape().clone()))
}

/// `relu(h + shortcut)`; its backward passes `g · [y > 0]` to both inputs.
struct ResidualRelu;

impl candle_core::CustomOp2 for ResidualRelu {
    fn name(&self) -> &'static str {
        "ssl-residual-relu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        apply_kernel((s1, l1), (s2, l2), forward_kernel, forward_kernel)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_kernel("residual_relu", (s1, l1), (s2, l2))
    }

    fn bwd(
        &self,
        _h: &Tensor,
        _shortcut: &Tensor,
        y: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let masked = y.apply_op2_no_bwd(&grad.contiguous()?, &MaskByOutput)?;
        Ok((Some(masked.clone()), Some(masked)))
    }
}

/// `g · [y > 0]` from the output `y` and its gradient `g`.
struct MaskByOutput;

impl candle_core::CustomOp2 for MaskByOutput {
    fn name(&self) -> &'static str {
        "ssl-residual-relu-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        apply_kernel((s1, l1), (s2, l2), backward_kernel, backward_kernel)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_kernel("residual_relu_backward", (s1, l1), (s2, l2))
    }
}

/// Our CUDA `kernel` over two contiguous f32 or f64 operands of one shape.
#[cfg(feature = "cuda")]
fn cuda_kernel(
    kernel: &str,
    (s1, l1): (&candle_core::CudaStorage, &Layout),
    (s2, l2): (&candle_core::CudaStorage, &Layout),
) -> Result<(candle_core::CudaStorage, Shape)> {
    use crate::cuda::{elementwise, float_dtype, view};
    use candle_core::backend::BackendStorage;
    let n = l1.shape().elem_count();
    let out = float_dtype!(s1.dtype(), T => {
        elementwise(&s1.device, kernel, &[view::<T>(s1, l1)?, view::<T>(s2, l2)?], n)?
    });
    Ok((out, l1.shape().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};
    use candle_core::Var;

    #[test]
    fn forward_and_gradients_equal_candles_add_and_relu() {
        // Two parallel blocks and a partial one; both inputs track gradients.
        let shape = [3, 2 * crate::util::ELEMENTWISE_BLOCK / 3 + 7];
        let h = Var::from_tensor(&rand_tensor(1, &shape, DType::F64)).unwrap();
        let s = Var::from_tensor(&rand_tensor(2, &shape, DType::F64)).unwrap();
        let r = rand_tensor(3, &shape, DType::F64);
        let fused = residual_relu(h.as_tensor(), s.as_tensor()).unwrap();
        let composed = (h.as_tensor() + s.as_tensor()).unwrap().relu().unwrap();
        assert_eq!(max_abs_diff(&fused, &composed), 0.0);
        let grads = |y: &Tensor| (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let (ours, candle) = (grads(&fused), grads(&composed));
        for v in [&h, &s] {
            let d = max_abs_diff(ours.get(v).unwrap(), candle.get(v).unwrap());
            assert_eq!(d, 0.0, "gradient diff {d}");
        }
    }

    #[test]
    fn gradient_matches_finite_differences_and_is_zero_where_the_sum_is_negative() {
        let h = rand_tensor(4, &[50], DType::F64);
        let s = rand_tensor(5, &[50], DType::F64);
        let r = rand_tensor(6, &[50], DType::F64);
        let var = Var::from_tensor(&h).unwrap();
        let grads = (residual_relu(var.as_tensor(), &s).unwrap() * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let grad: Vec<f64> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
        let sum: Vec<f64> = (&h + &s).unwrap().to_vec1().unwrap();
        let rs: Vec<f64> = r.to_vec1().unwrap();
        let loss = |t: &Tensor| {
            (residual_relu(t, &s).unwrap() * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        assert!(sum.iter().any(|&v| v < 0.0) && sum.iter().any(|&v| v > 0.0));
        for i in 0..50 {
            let want = if sum[i] > 0.0 { rs[i] } else { 0.0 };
            assert_eq!(grad[i], want, "index {i}");
            if sum[i].abs() > 1e-3 {
                let fd = finite_diff(&h, i, &loss);
                assert!(
                    (grad[i] - fd).abs() < 1e-7,
                    "index {i}: {} vs {fd}",
                    grad[i]
                );
            }
        }
    }

    /// Activations that lie batch-major in memory (as on CUDA) join where they lie: the result
    /// lies batch-major too, with the values and gradients of the channel-major join.
    #[test]
    fn inputs_that_lie_batch_major_join_in_place_with_the_same_values_and_gradients() {
        // Variables held batch-major ([N, C, …]); the join sees their channel-major views.
        let h = Var::from_tensor(&rand_tensor(10, &[4, 3, 5, 2], DType::F64)).unwrap();
        let s = Var::from_tensor(&rand_tensor(11, &[4, 3, 5, 2], DType::F64)).unwrap();
        let (hc, sc) = (h.transpose(0, 1).unwrap(), s.transpose(0, 1).unwrap());
        assert!(!hc.is_contiguous());
        let r = rand_tensor(12, &[3, 4, 5, 2], DType::F64);
        let y = residual_relu(&hc, &sc).unwrap();
        assert!(
            y.transpose(0, 1).unwrap().is_contiguous(),
            "the join copied"
        );
        let composed = (&hc + &sc).unwrap().relu().unwrap();
        assert_eq!(max_abs_diff(&y, &composed), 0.0);
        let grads = |y: &Tensor| (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
        let (ours, candle) = (grads(&y), grads(&composed));
        for v in [&h, &s] {
            let d = max_abs_diff(ours.get(v).unwrap(), candle.get(v).unwrap());
            assert_eq!(d, 0.0, "gradient diff {d}");
        }
    }

    #[test]
    fn f32_equals_candle_and_mismatched_inputs_fall_back() {
        let h = rand_tensor(7, &[4, 5], DType::F32);
        let s = rand_tensor(8, &[4, 5], DType::F32);
        let composed = (&h + &s).unwrap().relu().unwrap();
        assert_eq!(
            max_abs_diff(&residual_relu(&h, &s).unwrap(), &composed),
            0.0
        );
        // A broadcast shortcut is Candle's add: its shape error, not a wrong result.
        let row = rand_tensor(9, &[5], DType::F32);
        assert!(residual_relu(&h, &row).is_err());
    }
}
