//! Log-determinant of a symmetric positive-definite matrix, with gradient `A^{-T}` (spec
//! `docs/spec/objectives.md` §3), for TCR (§2.10) and CorInfoMax (§2.14).
//!
//! The value and `A⁻¹` come from a Cholesky factorisation `A = LLᵀ` on the host in f64
//! (nalgebra): `log det A = 2 Σ_i log L_ii`. The derivative is put into the graph with a
//! *surrogate* built from ordinary Candle ops, so autograd works on any device:
//!
//! `logdet(A) := c + (⟨sg(A⁻¹), A⟩ − sg(⟨A⁻¹, A⟩))`, with `c` the host value and
//! `⟨G, A⟩ = Σ_ij G_ij A_ij = tr(GᵀA)`.
//!
//! The bracket is exactly zero in the forward pass, and its derivative with respect to `A` is
//! `sg(A⁻¹)`, which is `A^{−T}` for a symmetric `A` — the log-determinant's gradient. The host
//! returns `L⁻¹`; `A⁻¹ = L⁻ᵀL⁻¹` is one f64 GEMM on Candle's workers. Only the
//! symmetric part `(A + Aᵀ)/2` is factorised (rounding can make a computed Gram matrix slightly
//! asymmetric); `A⁻¹` is symmetric, so the gradient of a symmetric perturbation is unchanged.
//! Second derivatives are not supported (`A⁻¹` is a constant in the graph).
//!
//! Cost: one host round trip of the `d×d` matrices per call (batched), `d³/2` flops on the host
//! (Cholesky + triangular inverse) per matrix — negligible for `d ≤ 128`, tens of milliseconds
//! per matrix at `d = 512`.

use candle_core::{bail, Device, Result, Tensor};
use nalgebra::{Cholesky, DMatrix};

/// `log det A` of a symmetric positive-definite `a`: `[d, d]` (f32 or f64) → scalar of the same
/// dtype, with gradient `A⁻¹`. Cholesky in f64 on the host; see the module documentation for
/// the surrogate that carries the gradient. A matrix that is not positive definite is an error.
pub fn logdet_spd(a: &Tensor) -> Result<Tensor> {
    logdet_spd_shifted(a, 0.0)
}

/// `log det(A + shift·I)` for `a`: `[d, d]` → scalar, with gradient `(A + shift·I)⁻¹`. The shift
/// is added on the host in f64, so a tiny ridge (CorInfoMax's ε = 1e-8) is not lost when `a` is
/// f32, and no identity matrix is built on the device.
pub fn logdet_spd_shifted(a: &Tensor, shift: f64) -> Result<Tensor> {
    logdet_spd_batched(&a.unsqueeze(0)?, shift)?.squeeze(0)
}

/// [`logdet_spd_shifted`] of each of `k` matrices: `a`: `[k, d, d]` → `[k]`, one host round trip
/// for all factorisations.
pub fn logdet_spd_batched(a: &Tensor, shift: f64) -> Result<Tensor> {
    let (k, d, d2) = a.dims3()?;
    if d != d2 {
        bail!("log-determinant needs square matrices, got {d}×{d2}");
    }
    if d == 0 {
        bail!("log-determinant of an empty (0×0) matrix");
    }
    if !shift.is_finite() {
        bail!("log-determinant: the diagonal shift must be finite, got {shift}");
    }
    let values = crate::spectral::host_values(a, "log-determinant")?;
    let results = crate::spectral::map_blocks(&values, d * d, |index, m| {
        logdet_host(m, d, shift).map_err(|e| match k {
            1 => e,
            _ => candle_core::Error::msg(format!("matrix {index} of the batch: {e}")),
        })
    })?;
    let (logdets, factors): (Vec<f64>, Vec<Vec<f64>>) = results.into_iter().unzip();
    let w = Tensor::from_vec(factors.concat(), (k, d, d), &Device::Cpu)?;
    let inverse = crate::matmul_detached(&w.transpose(1, 2)?.contiguous()?, &w)?;
    let constant = |t: Tensor| -> Result<Tensor> { t.to_dtype(a.dtype())?.to_device(a.device()) };
    let inverse = constant(inverse)?;
    let linear = (inverse * a)?.sum((1, 2))?;
    let value = constant(Tensor::from_vec(logdets, k, &Device::Cpu)?)?;
    value + (&linear - linear.detach())?
}

/// `(log det S, L⁻¹)` with `S = (A + Aᵀ)/2 + shift·I = LLᵀ`, `a` and `L⁻¹` row-major `[d, d]`.
/// `S⁻¹ = L⁻ᵀL⁻¹` is one GEMM after it, which keeps this at the factorisation (`d³/3`) and the
/// triangular inverse (`d³/6`).
fn logdet_host(a: &[f64], d: usize, shift: f64) -> Result<(f64, Vec<f64>)> {
    let m = DMatrix::from_row_slice(d, d, a);
    let s = (&m + m.transpose()) * 0.5 + DMatrix::identity(d, d) * shift;
    let Some(chol) = Cholesky::new(s) else {
        let smallest = ((&m + m.transpose()) * 0.5).symmetric_eigenvalues().min() + shift;
        bail!(
            "log-determinant: the {d}×{d} matrix is not positive definite (Cholesky failed; \
             smallest eigenvalue {smallest:e}); the covariance is (numerically) singular — use a \
             larger ε (the regulariser added to the diagonal)"
        );
    };
    let l = chol.l_dirty();
    let value = chol.ln_determinant();
    // Rows of W = L⁻¹ from W_i = (e_i − Σ_{k<i} L_ik W_k) / L_ii (contiguous row updates).
    let mut w = vec![0f64; d * d];
    for i in 0..d {
        let (done, rest) = w.split_at_mut(i * d);
        let row = &mut rest[..d];
        row[i] = 1.0;
        for k in 0..i {
            let lik = l[(i, k)];
            for (x, y) in row[..=k].iter_mut().zip(&done[k * d..k * d + k + 1]) {
                *x -= lik * y;
            }
        }
        let pivot = l[(i, i)];
        for x in &mut row[..=i] {
            *x /= pivot;
        }
    }
    Ok((value, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use ssl_core::testing::{close, max_gradient_error, randn};

    fn scalar(t: &Tensor) -> f64 {
        t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
    }

    /// `XᵀX + I` for `x`: `[n, d]`, symmetric positive definite.
    fn spd_from(x: &Tensor) -> Result<Tensor> {
        let d = x.dim(1)?;
        x.t()?.matmul(x)? + Tensor::eye(d, x.dtype(), x.device())?
    }

    fn host(t: &Tensor) -> Result<DMatrix<f64>> {
        let (r, c) = t.dims2()?;
        let v = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        Ok(DMatrix::from_row_slice(r, c, &v))
    }

    #[test]
    fn value_is_the_log_of_the_product_of_eigenvalues() -> Result<()> {
        for (n, d) in [(7, 4), (3, 5), (20, 1)] {
            let x = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let a = spd_from(&x)?;
            let direct: f64 = host(&a)?
                .symmetric_eigenvalues()
                .iter()
                .map(|l| l.ln())
                .sum();
            close(scalar(&logdet_spd(&a)?), direct, 1e-12);
        }
        let diag = Tensor::new(&[[2f64, 0., 0.], [0., 3., 0.], [0., 0., 0.5]], &Device::Cpu)?;
        close(scalar(&logdet_spd(&diag)?), 3f64.ln(), 1e-14);
        Ok(())
    }

    #[test]
    fn shift_is_added_to_the_diagonal() -> Result<()> {
        let x = randn(0f64, 1., (6, 4), &Device::Cpu)?;
        let a = spd_from(&x)?;
        let shifted = (&a + (Tensor::eye(4, DType::F64, &Device::Cpu)? * 0.3)?)?;
        close(
            scalar(&logdet_spd_shifted(&a, 0.3)?),
            scalar(&logdet_spd(&shifted)?),
            1e-12,
        );
        // A singular PSD matrix becomes definite with a shift: det(ε I) on the null space.
        let singular = Tensor::new(&[[1f64, 1.], [1., 1.]], &Device::Cpu)?;
        close(
            scalar(&logdet_spd_shifted(&singular, 1e-8)?),
            (2.0 + 1e-8f64).ln() + 1e-8f64.ln(),
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> Result<()> {
        for (n, d) in [(6, 4), (2, 5), (9, 1)] {
            let x = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let err = max_gradient_error(&x, |x| logdet_spd(&spd_from(x)?))?;
            assert!(err < 1e-6, "{n}×{d}: relative gradient error {err}");
            let err = max_gradient_error(&x, |x| {
                let g = x.t()?.matmul(x)?;
                logdet_spd_shifted(&g, 0.7)
            })?;
            assert!(err < 1e-6, "{n}×{d} shifted: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn gradient_is_the_inverse() -> Result<()> {
        let x = randn(0f64, 1., (8, 3), &Device::Cpu)?;
        let a = candle_core::Var::from_tensor(&spd_from(&x)?)?;
        let grads = logdet_spd(a.as_tensor())?.backward()?;
        let g = host(grads.get(a.as_tensor()).unwrap())?;
        let inv = host(a.as_tensor())?.try_inverse().unwrap();
        assert!((g - inv).abs().max() < 1e-12);
        Ok(())
    }

    #[test]
    fn batched_matches_one_at_a_time() -> Result<()> {
        let x = randn(0f64, 1., (3, 5, 4), &Device::Cpu)?;
        let a = x.transpose(1, 2)?.matmul(&x)?;
        let all = logdet_spd_batched(&a, 0.1)?.to_vec1::<f64>()?;
        for (k, v) in all.iter().enumerate() {
            close(*v, scalar(&logdet_spd_shifted(&a.get(k)?, 0.1)?), 1e-13);
        }
        let w = Tensor::new(&[1f64, -2., 0.5], &Device::Cpu)?;
        let err = max_gradient_error(&x, |x| {
            let a = x.transpose(1, 2)?.matmul(x)?;
            logdet_spd_batched(&a, 0.1)?.mul(&w)?.sum_all()
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    #[test]
    fn not_positive_definite_is_a_clear_error() -> Result<()> {
        let dev = Device::Cpu;
        let indefinite = Tensor::new(&[[1f64, 2.], [2., 1.]], &dev)?;
        let err = logdet_spd(&indefinite).unwrap_err().to_string();
        assert!(
            err.contains("not positive definite") && err.contains("larger ε"),
            "{err}"
        );
        let singular = Tensor::new(&[[1f64, 1.], [1., 1.]], &dev)?;
        let err = logdet_spd(&singular).unwrap_err().to_string();
        assert!(err.contains("not positive definite"), "{err}");
        let batch = Tensor::stack(&[&Tensor::eye(2, DType::F64, &dev)?, &indefinite], 0)?;
        let err = logdet_spd_batched(&batch, 0.0).unwrap_err().to_string();
        assert!(err.contains("matrix 1 of the batch"), "{err}");
        let nan = Tensor::new(&[[1f64, f64::NAN], [f64::NAN, 1.]], &dev)?;
        let err = logdet_spd(&nan).unwrap_err().to_string();
        assert!(err.contains("NaN"), "{err}");
        let rect = Tensor::zeros((1, 2, 3), DType::F64, &dev)?;
        let err = logdet_spd_batched(&rect, 0.0).unwrap_err().to_string();
        assert!(err.contains("square"), "{err}");
        Ok(())
    }

    #[test]
    fn works_in_f32() -> Result<()> {
        let x = randn(0f64, 1., (10, 4), &Device::Cpu)?;
        let a = spd_from(&x)?;
        let want = scalar(&logdet_spd(&a)?);
        let a32 = candle_core::Var::from_tensor(&a.to_dtype(DType::F32)?)?;
        let value = logdet_spd(a32.as_tensor())?;
        assert_eq!(value.dtype(), DType::F32);
        close(scalar(&value), want, 1e-5);
        let grads = value.backward()?;
        let g = grads.get(a32.as_tensor()).unwrap();
        assert_eq!(g.dtype(), DType::F32);
        let inv = host(&a)?.try_inverse().unwrap();
        assert!((host(g)? - inv).abs().max() < 1e-5);
        // ε = 1e-8 survives in f32 because the shift is added in f64.
        let singular = Tensor::new(&[[1f32, 1.], [1., 1.]], &Device::Cpu)?;
        close(
            scalar(&logdet_spd_shifted(&singular, 1e-8)?),
            (2.0 + 1e-8f64).ln() + 1e-8f64.ln(),
            1e-6,
        );
        Ok(())
    }
}
