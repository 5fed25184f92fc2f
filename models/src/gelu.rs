//! The exact (erf) GELU, `x·Φ(x) = x/2 · (1 + erf(x/√2))` (Hendrycks & Gimpel, 2016; PyTorch's
//! `nn.GELU()`), as a CPU custom op with a one-pass backward `g · (Φ(x) + x·φ(x))`.
//!
//! The backward reads `Φ(x)` off the forward's output `y = x·Φ(x)` as `y / x` (exact to f32
//! rounding wherever `x` and `y` are normal floats; `1/2` at `|x| ≤ 10⁻³⁰`), so that it
//! evaluates only `φ`'s exponential, not `Φ`'s polynomial and second exponential as well.
//!
//! Candle's `gelu_erf` differentiates through a dozen elementwise passes over the input (and with
//! `1/√(2π)` rounded to 0.398942); a ViT-S/16 MLP activation at batch 32 is 39 MB, twelve times
//! per step. In f32, `Φ` and `φ` are branch-free approximations within 2·10⁻⁷ that vectorise
//! (`normal_cdf_f32`); f64 uses Candle's `erf`. On CUDA (feature
//! `cuda`) the same two ops run our kernels (`cuda.rs`), `Φ` through CUDA's `erfc`. Other
//! devices and dtypes use Candle's op.

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use ssl_linalg::extend_by_chunks;

use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{contiguous_slice, vectorized, Float, ELEMENTWISE_BLOCK};

/// `GELU(x)` elementwise (the erf form).
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    let ours = fused_kernels(x.device()) || cuda_ops(x.device());
    if ours && matches!(x.dtype(), DType::F32 | DType::F64) {
        x.contiguous()?.apply_op1(GeluFwd)
    } else {
        x.gelu_erf()
    }
}

fn gelu_kernel<T: Float>(x: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    // SAFETY: each chunk's loop writes all of it (`src` has its length).
    unsafe {
        extend_by_chunks(&mut out, x.len(), ELEMENTWISE_BLOCK, |block, dst| {
            let src = &x[block * ELEMENTWISE_BLOCK..][..dst.len()];
            vectorized(
                #[inline(always)]
                || {
                    for (o, &v) in dst.iter_mut().zip(src) {
                        o.write(v * v.normal_cdf());
                    }
                },
            )
        })
    };
    out
}

/// Below this `|x|`, `Φ(x)` is `1/2` to f32 and f64 rounding and `y / x` may lose bits to
/// subnormal `y`.
const CDF_FROM_OUTPUT_BELOW: f64 = 1e-30;

/// `g · (Φ(x) + x·φ(x))` with `Φ(x) = y / x` from the forward's output `y`.
fn gelu_bwd_kernel<T: Float>(x: &[T], y: &[T], g: &[T]) -> Vec<T> {
    let (tiny, half) = (T::from_f64(CDF_FROM_OUTPUT_BELOW), T::from_f64(0.5));
    let minus_tiny = T::from_f64(-CDF_FROM_OUTPUT_BELOW);
    let mut out = Vec::new();
    // SAFETY: each chunk's loop writes all of it (`x`, `y` and `g` have its length).
    unsafe {
        extend_by_chunks(&mut out, x.len(), ELEMENTWISE_BLOCK, |block, dst| {
            let start = block * ELEMENTWISE_BLOCK;
            let (x, y, g) = (
                &x[start..][..dst.len()],
                &y[start..][..dst.len()],
                &g[start..][..dst.len()],
            );
            vectorized(
                #[inline(always)]
                || {
                    for (((o, &x), &y), &g) in dst.iter_mut().zip(x).zip(y).zip(g) {
                        let cdf = if x > tiny || x < minus_tiny {
                            y / x
                        } else {
                            half
                        };
                        o.write(g * (cdf + x * x.normal_density()));
                    }
                },
            )
        })
    };
    out
}

struct GeluFwd;

impl candle_core::CustomOp1 for GeluFwd {
    fn name(&self) -> &'static str {
        "ssl-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(gelu_kernel::<f32>(contiguous_slice(s, l)?)),
            CpuStorage::F64(_) => CpuStorage::F64(gelu_kernel::<f64>(contiguous_slice(s, l)?)),
            _ => candle_core::bail!("ssl-gelu supports f32 and f64 only"),
        };
        Ok((out, l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_elementwise("gelu", &[(s, l)])
    }

    fn bwd(&self, x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op3_no_bwd(
            y,
            &grad.contiguous()?,
            &GeluBwd,
        )?))
    }
}

/// `g · GELU'(x)` from the input `x`, the output `y` and the output gradient `g`.
struct GeluBwd;

impl candle_core::CustomOp3 for GeluBwd {
    fn name(&self) -> &'static str {
        "ssl-gelu-bwd"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        lx: &Layout,
        y: &CpuStorage,
        ly: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        fn run<T: Float>(
            (x, lx): (&CpuStorage, &Layout),
            (y, ly): (&CpuStorage, &Layout),
            (g, lg): (&CpuStorage, &Layout),
        ) -> Result<Vec<T>> {
            Ok(gelu_bwd_kernel(
                contiguous_slice(x, lx)?,
                contiguous_slice(y, ly)?,
                contiguous_slice(g, lg)?,
            ))
        }
        let out = match x {
            CpuStorage::F32(_) => CpuStorage::F32(run((x, lx), (y, ly), (g, lg))?),
            CpuStorage::F64(_) => CpuStorage::F64(run((x, lx), (y, ly), (g, lg))?),
            _ => candle_core::bail!("ssl-gelu supports f32 and f64 only"),
        };
        Ok((out, lx.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        lx: &Layout,
        y: &candle_core::CudaStorage,
        ly: &Layout,
        g: &candle_core::CudaStorage,
        lg: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_elementwise("gelu_backward", &[(x, lx), (y, ly), (g, lg)])
    }
}

/// Our CUDA elementwise `kernel` over contiguous f32 or f64 operands of one shape.
#[cfg(feature = "cuda")]
fn cuda_elementwise(
    kernel: &str,
    operands: &[(&candle_core::CudaStorage, &Layout)],
) -> Result<(candle_core::CudaStorage, Shape)> {
    use crate::cuda::{elementwise, float_dtype, view};
    use candle_core::backend::BackendStorage;
    let (s, l) = operands[0];
    let n = l.shape().elem_count();
    let out = float_dtype!(s.dtype(), T => {
        let views = operands
            .iter()
            .map(|&(s, l)| view::<T>(s, l))
            .collect::<Result<Vec<_>>>()?;
        elementwise(&s.device, kernel, &views, n)?
    });
    Ok((out, l.shape().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{finite_diff, max_abs_diff, rand_tensor};
    use candle_core::Var;

    #[test]
    fn forward_equals_candle_and_known_values() {
        let x = (rand_tensor(1, &[40_000], DType::F64) * 4.0).unwrap();
        assert!(max_abs_diff(&gelu_erf(&x).unwrap(), &x.gelu_erf().unwrap()) < 1e-15);
        // torch.nn.functional.gelu(torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64))
        let known = Tensor::new(&[-1.0f64, 0.5, 2.0], &candle_core::Device::Cpu).unwrap();
        let want = Tensor::new(
            &[
                -0.15865525393145702f64,
                0.34573123063700656,
                1.9544997361036416,
            ],
            &candle_core::Device::Cpu,
        )
        .unwrap();
        assert!(max_abs_diff(&gelu_erf(&known).unwrap(), &want) < 1e-15);
    }

    #[test]
    fn f32_values_and_gradients_match_f64_to_f32_rounding() {
        let x = Var::from_tensor(
            &(rand_tensor(4, &[ELEMENTWISE_BLOCK + 5], DType::F64) * 6.0).unwrap(),
        )
        .unwrap();
        let x32 = Var::from_tensor(&x.to_dtype(DType::F32).unwrap()).unwrap();
        let value_and_grad = |x: &Var| {
            let y = gelu_erf(x.as_tensor()).unwrap();
            let grad = y.sum_all().unwrap().backward().unwrap();
            (y, grad.get(x.as_tensor()).unwrap().clone())
        };
        let ((y, g), (y32, g32)) = (value_and_grad(&x), value_and_grad(&x32));
        assert!(max_abs_diff(&y, &y32) < 2e-6, "{}", max_abs_diff(&y, &y32));
        assert!(max_abs_diff(&g, &g32) < 2e-6, "{}", max_abs_diff(&g, &g32));
    }

    #[test]
    fn gradient_at_zero_tiny_and_tail_inputs_matches_the_density_form() {
        // Where `y / x` would be 0/0 (zero), lose bits (subnormal `y`) or `Φ` is tiny.
        let xs = [
            0.0, -0.0, 1e-35, -1e-35, 1e-31, 3e-7, -3e-7, -9.0, -16.0, 7.0, 40.0,
        ];
        for dtype in [DType::F32, DType::F64] {
            let x = Var::from_tensor(
                &Tensor::new(&xs, &candle_core::Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            )
            .unwrap();
            let grads = gelu_erf(x.as_tensor())
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            let grad = grads.get(x.as_tensor()).unwrap();
            let grad: Vec<f64> = grad.to_dtype(DType::F64).unwrap().to_vec1().unwrap();
            for (&x, &g) in xs.iter().zip(&grad) {
                let want = x.normal_cdf() + x * x.normal_density();
                assert!(
                    (g - want).abs() < 2e-7,
                    "{dtype:?} GELU'({x:e}) = {g:e}, want {want:e}"
                );
            }
        }
    }

    #[test]
    fn gradient_matches_finite_differences() {
        // Two parallel blocks and a partial one.
        let x = (rand_tensor(2, &[2 * ELEMENTWISE_BLOCK + 17], DType::F64) * 4.0).unwrap();
        let r = rand_tensor(3, &[2 * ELEMENTWISE_BLOCK + 17], DType::F64);
        let var = Var::from_tensor(&x).unwrap();
        let grads = (gelu_erf(var.as_tensor()).unwrap() * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let grad: Vec<f64> = grads.get(var.as_tensor()).unwrap().to_vec1().unwrap();
        let loss = |t: &Tensor| {
            (gelu_erf(t).unwrap() * &r)
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        for i in [0, 5, ELEMENTWISE_BLOCK + 3, 2 * ELEMENTWISE_BLOCK + 16] {
            let fd = finite_diff(&x, i, &loss);
            assert!(
                (grad[i] - fd).abs() < 1e-7,
                "index {i}: {} vs {fd}",
                grad[i]
            );
        }
    }
}
