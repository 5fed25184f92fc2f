//! Row-wise log-sum-exp over the off-diagonal entries of square matrices, fused on the CPU.
//!
//! VICReg-exp takes it over the `d×d` covariance (d = 512 in the main job: 2 × 512² entries per
//! step), VICReg-ctr over the `N×N` Gram. Built from Candle's elementwise ops it costs about ten
//! full passes forward and fifteen backward, each allocating; this op makes one pass forward
//! (max, Σexp, log per row) and one backward (`∂lse_i/∂m_ij = softmax_ij / τ`, zero on the
//! diagonal), rows spread over the rayon pool. Other devices use the composed ops, which are
//! also the reference the tests hold the fused op to.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor, WithDType, D};
use rayon::prelude::*;

/// Added to the masked (diagonal) logits of the composed reference.
const MASKED: f64 = -1e9;

/// Row-wise `lse_{j≠i}(m_ij / τ)` of square matrices `m`: `[…, R, R]` → `[…, R]`, R ≥ 2
/// (spec §2.4/§2.5: the diagonal is left out). Fused on the CPU, composed elsewhere.
pub fn off_diagonal_logsumexp(m: &Tensor, tau: f64) -> Result<Tensor> {
    let r = m.dim(D::Minus1)?;
    if r < 2 || m.dim(D::Minus2)? != r {
        candle_core::bail!(
            "a log-sum-exp over off-diagonal entries needs square matrices of size ≥ 2, got {:?}",
            m.dims()
        );
    }
    match m.device().is_cpu() {
        true => m.contiguous()?.apply_op1(OffDiagonalLse { tau }),
        false => off_diagonal_logsumexp_composed(m, tau),
    }
}

/// The same from Candle's elementwise ops (any device): mask the diagonal, subtract the
/// detached row max, `exp`, sum, `log`.
pub fn off_diagonal_logsumexp_composed(m: &Tensor, tau: f64) -> Result<Tensor> {
    let r = m.dim(D::Minus1)?;
    let mask = (Tensor::eye(r, m.dtype(), m.device())? * MASKED)?;
    let logits = (m / tau)?.broadcast_add(&mask)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    logits
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        .add(&max)?
        .squeeze(D::Minus1)
}

/// The fused op: `[…, R, R]` → `[…, R]`; its backward is [`OffDiagonalLseBackward`].
struct OffDiagonalLse {
    tau: f64,
}

/// Backward of the fused op: `(m, lse, g)` ↦ `g_i · exp(m_ij/τ − lse_i) / τ`, zero on the diagonal.
struct OffDiagonalLseBackward {
    tau: f64,
}

fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("off-diagonal log-sum-exp expects contiguous inputs"),
    }
}

/// The float types the fused op runs in; `exp` in the input's own precision (f32 `exp` is about
/// twice as fast as f64's), sums accumulated in f64.
trait Real: WithDType {
    fn exp(self) -> Self;
}

impl Real for f32 {
    fn exp(self) -> Self {
        f32::exp(self)
    }
}

impl Real for f64 {
    fn exp(self) -> Self {
        f64::exp(self)
    }
}

fn forward_rows<T: Real>(m: &[T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    let mut out = vec![T::zero(); m.len() / r];
    out.par_iter_mut().enumerate().for_each(|(row, out)| {
        let i = row % r;
        let values = &m[row * r..(row + 1) * r];
        let off_diagonal = || {
            values
                .iter()
                .enumerate()
                .filter(move |&(j, _)| j != i)
                .map(|(_, &v)| v * inv_tau)
        };
        let max = off_diagonal()
            .map(|l| l.to_f64())
            .fold(f64::NEG_INFINITY, f64::max);
        let shift = T::from_f64(max);
        let sum: f64 = off_diagonal().map(|l| (l - shift).exp().to_f64()).sum();
        *out = T::from_f64(sum.ln() + max);
    });
    out
}

fn backward_rows<T: Real>(m: &[T], lse: &[T], g: &[T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    let mut grad = vec![T::zero(); m.len()];
    grad.par_chunks_mut(r).enumerate().for_each(|(row, grad)| {
        let i = row % r;
        let (lse, scale) = (lse[row], T::from_f64(g[row].to_f64() / tau));
        let values = &m[row * r..(row + 1) * r];
        for (j, (grad, &value)) in grad.iter_mut().zip(values).enumerate() {
            if j != i {
                *grad = scale * (value * inv_tau - lse).exp();
            }
        }
    });
    grad
}

impl CustomOp1 for OffDiagonalLse {
    fn name(&self) -> &'static str {
        "ssl-off-diagonal-lse"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let dims = l.dims();
        let r = dims[dims.len() - 1];
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(forward_rows(slice(s, l)?, r, self.tau)),
            CpuStorage::F64(_) => CpuStorage::F64(forward_rows(slice(s, l)?, r, self.tau)),
            _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
        };
        Ok((out, Shape::from(&dims[..dims.len() - 1])))
    }
    fn bwd(&self, arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let grad = Tensor::apply_op3_no_bwd(
            &arg.contiguous()?,
            &res.contiguous()?,
            &grad.contiguous()?,
            &OffDiagonalLseBackward { tau: self.tau },
        )?;
        Ok(Some(grad))
    }
}

impl CustomOp3 for OffDiagonalLseBackward {
    fn name(&self) -> &'static str {
        "ssl-off-diagonal-lse-backward"
    }
    fn cpu_fwd(
        &self,
        m: &CpuStorage,
        lm: &Layout,
        lse: &CpuStorage,
        llse: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let r = lm.dims()[lm.dims().len() - 1];
        let out = match m {
            CpuStorage::F32(_) => CpuStorage::F32(backward_rows(
                slice(m, lm)?,
                slice(lse, llse)?,
                slice(g, lg)?,
                r,
                self.tau,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(backward_rows(
                slice(m, lm)?,
                slice(lse, llse)?,
                slice(g, lg)?,
                r,
                self.tau,
            )),
            _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
        };
        Ok((out, lm.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    /// Value and gradient of `Σ_i w_i · f(m)_i` (random weights so every row's gradient differs).
    fn value_and_grad(
        f: impl Fn(&Tensor) -> Result<Tensor>,
        m: &Var,
        w: &Tensor,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let lse = f(m.as_tensor())?;
        let loss = (&lse * w)?.sum_all()?;
        let grad = loss.backward()?.get(m).expect("gradient").clone();
        let flat =
            |t: &Tensor| -> Result<Vec<f64>> { t.flatten_all()?.to_dtype(DType::F64)?.to_vec1() };
        Ok((flat(&lse)?, flat(&grad)?))
    }

    fn assert_close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn fused_matches_composed_value_and_gradient() -> Result<()> {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let m = Var::from_tensor(
                &Tensor::randn(0f64, 0.5, (3, 7, 7), &Device::Cpu)?.to_dtype(dtype)?,
            )?;
            let w = Tensor::randn(0f64, 1.0, (3, 7), &Device::Cpu)?.to_dtype(dtype)?;
            let fused = value_and_grad(|m| off_diagonal_logsumexp(m, 0.1), &m, &w)?;
            let composed = value_and_grad(|m| off_diagonal_logsumexp_composed(m, 0.1), &m, &w)?;
            assert_close(&fused.0, &composed.0, tol);
            assert_close(&fused.1, &composed.1, tol);
        }
        Ok(())
    }

    #[test]
    fn non_contiguous_input_and_large_logits() -> Result<()> {
        // A transposed view, and entries whose exp(m/τ) overflows without the max shift.
        let base = (Tensor::randn(0f64, 1.0, (2, 5, 5), &Device::Cpu)? * 200.0)?;
        let m = Var::from_tensor(&base.transpose(1, 2)?)?;
        let w = Tensor::ones((2, 5), DType::F64, &Device::Cpu)?;
        let fused = value_and_grad(|m| off_diagonal_logsumexp(m, 0.1), &m, &w)?;
        let composed = value_and_grad(|m| off_diagonal_logsumexp_composed(m, 0.1), &m, &w)?;
        assert!(fused.0.iter().chain(&fused.1).all(|v| v.is_finite()));
        assert_close(&fused.0, &composed.0, 1e-12);
        assert_close(&fused.1, &composed.1, 1e-12);
        // Each row's gradient is a softmax / τ: it sums to 1/τ and is zero on the diagonal.
        for row in 0..10 {
            let g = &fused.1[row * 5..(row + 1) * 5];
            assert_eq!(g[row % 5], 0.0);
            assert!((g.iter().sum::<f64>() - 10.0).abs() < 1e-9);
        }
        Ok(())
    }

    #[test]
    fn rejects_non_square_and_tiny_matrices() {
        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        assert!(off_diagonal_logsumexp(&z(&[3, 4]), 0.1).is_err());
        assert!(off_diagonal_logsumexp(&z(&[1, 1]), 0.1).is_err());
    }
}
