//! Layer normalisation over the last axis as a fused CPU custom op with its backward.
//!
//! `candle_nn::LayerNorm` takes a fused path for contiguous inputs that has **no backward**
//! (`apply_op3_no_bwd`): a transformer trained through it gets no gradient for anything before
//! its first norm. [`LayerNorm`] computes `y = (x − μ)/√(σ² + ε) · γ + β` per row (population
//! variance, as `torch.nn.LayerNorm`) in one pass and its gradient
//! `dx = (γ·g − mean(γ·g) − x̂·mean(γ·g·x̂)) / √(σ² + ε)`, `dγ = Σ g·x̂`, `dβ = Σ g` in another,
//! over row blocks on Candle's workers. On CUDA (feature `cuda`) the same two ops run our kernels
//! (`cuda.rs`: a warp per row, the parameter gradients summed over row segments). Other devices
//! and dtypes compose Candle ops.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor, D};
use candle_nn::{Init, VarBuilder};
use ssl_linalg::map_chunks_mut;

use crate::dispatch::{cuda_ops, fused_kernels};
use crate::util::{contiguous_slice, lane_sum, owned_part, vectorized, Float};

/// Rows per parallel block.
const BLOCK_ROWS: usize = 32;

/// `weight` (γ) and `bias` (β) of width `D`, as `torch.nn.LayerNorm(D, eps)`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

/// A [`LayerNorm`] of width `dim` (weight 1, bias 0).
pub fn layer_norm(dim: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm {
        weight: vb.get_with_hints(dim, "weight", Init::Const(1.0))?,
        bias: vb.get_with_hints(dim, "bias", Init::Const(0.0))?,
        eps,
    })
}

impl LayerNorm {
    /// Normalises `x`: `[…, D]` over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = self.weight.elem_count();
        if x.dim(D::Minus1)? != d {
            candle_core::bail!("layer norm of width {d} got input {:?}", x.dims());
        }
        let fused = (fused_kernels(x.device()) || cuda_ops(x.device()))
            && matches!(x.dtype(), DType::F32 | DType::F64);
        if !fused {
            return self.forward_composed(x);
        }
        let dt = x.dtype();
        let op = LnFwd {
            eps: self.eps,
            saved: Arc::new(Mutex::new(Saved::Host(Vec::new()))),
        };
        x.contiguous()?.apply_op3(
            &self.weight.to_dtype(dt)?.contiguous()?,
            &self.bias.to_dtype(dt)?.contiguous()?,
            op,
        )
    }

    /// The same normalisation composed of Candle ops (other devices and dtypes; the tests'
    /// reference).
    fn forward_composed(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        centred
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.weight.to_dtype(dt)?)?
            .broadcast_add(&self.bias.to_dtype(dt)?)
    }
}

/// Per row, the mean and 1/√(σ² + ε) the forward leaves for the backward.
enum Saved {
    /// From the CPU op.
    Host(Vec<(f64, f64)>),
    /// On the CUDA device, from our kernel: `[mean, inv]` per row, `2R` doubles.
    #[cfg(feature = "cuda")]
    Device(candle_core::cuda_backend::cudarc::driver::CudaSlice<f64>),
}

impl Saved {
    /// The statistics of the CPU op.
    fn host(&self) -> Result<&[(f64, f64)]> {
        match self {
            Saved::Host(stats) => Ok(stats),
            #[cfg(feature = "cuda")]
            Saved::Device(_) => candle_core::bail!("a CUDA layer norm's backward got CPU tensors"),
        }
    }
}

struct LnFwd {
    eps: f64,
    saved: Arc<Mutex<Saved>>,
}

fn ln_fwd_kernel<T: Float>(x: &[T], g: &[T], b: &[T], eps: f64) -> (Vec<T>, Vec<(f64, f64)>) {
    let d = g.len();
    let mut out = vec![T::from_f64(0.0); x.len()];
    let stats = map_chunks_mut(&mut out, BLOCK_ROWS * d, |block, dst| {
        let src = &x[block * BLOCK_ROWS * d..][..dst.len()];
        vectorized(
            #[inline(always)]
            || {
                src.chunks(d)
                    .zip(dst.chunks_mut(d))
                    .map(|(row, out)| {
                        let mean = lane_sum(row, row, row, |v, _, _| v.to_f64()) / d as f64;
                        let var = lane_sum(row, row, row, |v, _, _| (v.to_f64() - mean).powi(2))
                            / d as f64;
                        let inv = 1.0 / (var + eps).sqrt();
                        let (mean_t, inv_t) = (T::from_f64(mean), T::from_f64(inv));
                        for ((o, &v), (&gi, &bi)) in out.iter_mut().zip(row).zip(g.iter().zip(b)) {
                            *o = (v - mean_t) * inv_t * gi + bi;
                        }
                        (mean, inv)
                    })
                    .collect::<Vec<_>>()
            },
        )
    });
    (out, stats.concat())
}

impl candle_core::CustomOp3 for LnFwd {
    fn name(&self) -> &'static str {
        "ssl-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (out, stats) = match s1 {
            CpuStorage::F32(_) => {
                let (o, s) = ln_fwd_kernel::<f32>(
                    contiguous_slice(s1, l1)?,
                    contiguous_slice(s2, l2)?,
                    contiguous_slice(s3, l3)?,
                    self.eps,
                );
                (CpuStorage::F32(o), s)
            }
            CpuStorage::F64(_) => {
                let (o, s) = ln_fwd_kernel::<f64>(
                    contiguous_slice(s1, l1)?,
                    contiguous_slice(s2, l2)?,
                    contiguous_slice(s3, l3)?,
                    self.eps,
                );
                (CpuStorage::F64(o), s)
            }
            _ => candle_core::bail!("layer norm supports f32 and f64 only"),
        };
        *self.saved.lock().expect("layer-norm stats lock") = Saved::Host(stats);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{float_dtype, layer_norm, view};
        use candle_core::backend::BackendStorage;
        let d = l2.shape().elem_count();
        let rows = (l1.shape().elem_count() / d.max(1), d);
        let (y, saved) = float_dtype!(s1.dtype(), T => {
            let operands = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
            layer_norm(&s1.device, operands, rows, self.eps)?
        });
        *self.saved.lock().expect("layer-norm stats lock") = Saved::Device(saved);
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d = gamma.elem_count();
        let n = x.elem_count();
        let op = LnBwd {
            saved: self.saved.clone(),
        };
        let all = x.apply_op3_no_bwd(gamma, &grad.contiguous()?, &op)?;
        let dx = all.narrow(0, 0, n)?.reshape(x.shape())?;
        let dgamma = owned_part(&all, n, d)?;
        let dbeta = owned_part(&all, n + d, d)?;
        Ok((Some(dx), Some(dgamma), Some(dbeta)))
    }
}

/// Backward of [`LnFwd`]: inputs (x, γ, grad), output flat `[dx (R·D), dγ (D), dβ (D)]`.
struct LnBwd {
    saved: Arc<Mutex<Saved>>,
}

fn ln_bwd_kernel<T: Float>(x: &[T], gamma: &[T], g: &[T], stats: &[(f64, f64)]) -> Vec<T> {
    let d = gamma.len();
    let n = x.len();
    let mut out = vec![T::from_f64(0.0); n + 2 * d];
    let (dx, _) = out.split_at_mut(n);
    let partial = map_chunks_mut(dx, BLOCK_ROWS * d, |block, dst| {
        let first = block * BLOCK_ROWS;
        let mut dgamma = vec![0.0f64; d];
        let mut dbeta = vec![0.0f64; d];
        vectorized(
            #[inline(always)]
            || {
                for (r, out) in dst.chunks_mut(d).enumerate() {
                    let row = first + r;
                    let (mean, inv) = stats[row];
                    let xs = &x[row * d..][..d];
                    let gs = &g[row * d..][..d];
                    let xhat = |v: T| (v.to_f64() - mean) * inv;
                    let sum_dy = lane_sum(gs, gamma, xs, |gv, gm, _| gv.to_f64() * gm.to_f64());
                    let sum_dy_xhat = lane_sum(gs, gamma, xs, |gv, gm, xv| {
                        gv.to_f64() * gm.to_f64() * xhat(xv)
                    });
                    for (((dg, db), &gv), &xv) in
                        dgamma.iter_mut().zip(dbeta.iter_mut()).zip(gs).zip(xs)
                    {
                        *dg += gv.to_f64() * xhat(xv);
                        *db += gv.to_f64();
                    }
                    // dx = inv·(γ·g − a − x̂·b) with x̂ = (x − mean)·inv
                    let (a, b) = (sum_dy / d as f64, sum_dy_xhat / d as f64);
                    let [mean_t, inv_t, a, b] = [mean, inv, a, b].map(T::from_f64);
                    for (((o, &gv), &gm), &xv) in out.iter_mut().zip(gs).zip(gamma).zip(xs) {
                        *o = inv_t * (gv * gm - a - (xv - mean_t) * inv_t * b);
                    }
                }
            },
        );
        (dgamma, dbeta)
    });
    for (dgamma, dbeta) in partial {
        for j in 0..d {
            out[n + j] += T::from_f64(dgamma[j]);
            out[n + d + j] += T::from_f64(dbeta[j]);
        }
    }
    out
}

impl candle_core::CustomOp3 for LnBwd {
    fn name(&self) -> &'static str {
        "ssl-layer-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let saved = self.saved.lock().expect("layer-norm stats lock");
        let stats = saved.host()?;
        let len = l1.shape().elem_count() + 2 * l2.shape().elem_count();
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(ln_bwd_kernel::<f32>(
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                contiguous_slice(s3, l3)?,
                stats,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(ln_bwd_kernel::<f64>(
                contiguous_slice(s1, l1)?,
                contiguous_slice(s2, l2)?,
                contiguous_slice(s3, l3)?,
                stats,
            )),
            _ => candle_core::bail!("layer norm supports f32 and f64 only"),
        };
        Ok((out, Shape::from(len)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::cuda::{float_dtype, layer_norm_backward, view};
        use candle_core::backend::BackendStorage;
        let saved = self.saved.lock().expect("layer-norm stats lock");
        let Saved::Device(stats) = &*saved else {
            candle_core::bail!("a CPU layer norm's backward got CUDA tensors")
        };
        let d = l2.shape().elem_count();
        let rows = (l1.shape().elem_count() / d.max(1), d);
        let out = float_dtype!(s1.dtype(), T => {
            let operands = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
            layer_norm_backward(&s1.device, operands, stats, rows)?
        });
        Ok((out, Shape::from(l1.shape().elem_count() + 2 * d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::testing::{max_abs_diff, rand_tensor};
    use candle_core::Var;

    #[test]
    fn fused_op_and_its_gradients_equal_the_composed_norm() {
        let store = ssl_core::ParamStore::new(2);
        let ln = layer_norm(7, 1e-6, store.var_builder(&candle_core::Device::Cpu)).unwrap();
        for (k, v) in store.vars() {
            v.set(&rand_tensor(
                if k == "weight" { 3 } else { 4 },
                &[7],
                DType::F32,
            ))
            .unwrap();
        }
        // 70 rows: more than two parallel blocks, the last one partial.
        let x = Var::from_tensor(&rand_tensor(5, &[2, 35, 7], DType::F64)).unwrap();
        let r = rand_tensor(6, &[2, 35, 7], DType::F64);
        let fused = ln.forward(x.as_tensor()).unwrap();
        let composed = ln.forward_composed(x.as_tensor()).unwrap();
        assert!(max_abs_diff(&fused, &composed) < 1e-12);
        let gf = (&fused * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let gc = (&composed * &r)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        for t in [x.as_tensor(), &ln.weight, &ln.bias] {
            let d = max_abs_diff(gf.get(t).unwrap(), gc.get(t).unwrap());
            assert!(d < 1e-5, "gradient diff {d}");
        }
    }

    #[test]
    fn rows_are_normalised_and_widths_checked() {
        let store = ssl_core::ParamStore::new(2);
        let ln = layer_norm(16, 1e-6, store.var_builder(&candle_core::Device::Cpu)).unwrap();
        let y = ln.forward(&rand_tensor(7, &[3, 16], DType::F32)).unwrap();
        let mean: Vec<f32> = y.mean(1).unwrap().to_vec1().unwrap();
        let var: Vec<f32> = y.sqr().unwrap().mean(1).unwrap().to_vec1().unwrap();
        assert!(mean.iter().all(|m| m.abs() < 1e-6));
        assert!(var.iter().all(|v| (v - 1.0).abs() < 1e-4));
        assert!(ln.forward(&rand_tensor(7, &[3, 15], DType::F32)).is_err());
    }
}
