//! Cholesky whitening with gradients (W-MSE, spec `docs/spec/objectives.md` §2.15 and §3).
//!
//! For a sample matrix `X: [n, d]`: `m = mean`, `Σ = (X−m)ᵀ(X−m)/(n−1)`, `Σ' = (1−ε)Σ + εI`,
//! `Σ' = LLᵀ`, and the whitened rows are `L⁻¹(x_i − m)`, i.e. `Y = X_c L⁻ᵀ`.
//!
//! `L` and `W = L⁻¹` are computed on the host in f64 (one transfer of the `d × d` covariances per
//! call, batched over sub-batches). The dependency of `W` on `X_c` is put back into the graph with
//! a surrogate whose value is exactly `X_c Wᵀ` and whose first derivative is exact:
//! with `A = X_c Wᵀ` (`W` held constant) and `M = (1−ε)/(n−1)·AᵀA` (so `dM = W dΣ' Wᵀ`),
//! forward-mode Cholesky gives `W dL = Φ(W dΣ' Wᵀ)` (`Φ` = lower triangle with the diagonal
//! halved; Murray 2016, "Differentiation of the Cholesky decomposition"), hence
//! `dY = dX_c Wᵀ − Y Φ(dM)ᵀ`, which is what
//! `Y = A − sg(A)·(Φ(M) − sg(Φ(M)))ᵀ` differentiates to. The centring is an ordinary Candle op,
//! so the gradient through the mean comes from autograd. Second derivatives are not supported.

use candle_core::{bail, DType, Result, Tensor};

/// Pivots whose residual variance is below this fraction of the dimension's variance are treated
/// as singular (a condition number beyond ~1e12 leaves no usable whitening in f64).
const SINGULAR_RELATIVE: f64 = 1e-12;

/// Cholesky-whitens the rows of `x`: `[n, d]` → `[n, d]`, rows `L⁻¹(x_i − m)` with
/// `(1−ε)Σ + εI = LLᵀ` and `Σ` the unbiased covariance (spec §2.15). Differentiable through the
/// mean, the covariance and the Cholesky factor. Computes in f64 and returns `x`'s dtype.
///
/// Errors when `n < 2`, when `ε = 0` and `n < d + 1`, when `ε ∉ [0, 1]`, or when the covariance
/// is numerically singular.
pub fn cholesky_whiten(x: &Tensor, eps: f64) -> Result<Tensor> {
    cholesky_whiten_batched(&x.unsqueeze(0)?, eps)?.squeeze(0)
}

/// [`cholesky_whiten`] applied independently to each of `K` sample matrices: `x`: `[K, n, d]`
/// → `[K, n, d]`. One host round trip for all `K` factorisations.
pub fn cholesky_whiten_batched(x: &Tensor, eps: f64) -> Result<Tensor> {
    let (k, n, d) = x.dims3()?;
    if !(0.0..=1.0).contains(&eps) {
        bail!("Cholesky whitening: eps must be in [0, 1], got {eps}");
    }
    if n < 2 {
        bail!(
            "Cholesky whitening needs at least 2 samples for an unbiased covariance, got n = {n}"
        );
    }
    if eps == 0.0 && n < d + 1 {
        bail!(
            "Cholesky whitening of {n} samples in {d} dimensions: the covariance is singular; \
             the number of samples n must be ≥ d + 1 = {} (or use eps > 0)",
            d + 1
        );
    }
    let dtype = x.dtype();
    let dev = x.device();
    let x = x.to_dtype(DType::F64)?;
    let xc = x.broadcast_sub(&x.mean_keepdim(1)?)?;
    let scale = (1.0 - eps) / (n as f64 - 1.0);

    let xd = xc.detach();
    let cov = (xd.t()?.matmul(&xd)? * scale)?;
    let cov = cov.flatten_all()?.to_vec1::<f64>()?;
    let mut w = Vec::with_capacity(k * d * d);
    for sigma in cov.chunks_exact(d * d) {
        let l = cholesky(sigma, d, eps, n)?;
        w.extend(lower_inverse(&l, d));
    }
    let w = Tensor::from_vec(w, (k, d, d), dev)?;

    let a = xc.matmul(&w.t()?)?;
    let phi = Tensor::from_vec(phi_mask(d), (d, d), dev)?;
    let m = (a.t()?.matmul(&a)? * scale)?.broadcast_mul(&phi)?;
    let zero = (&m - m.detach())?;
    let y = (&a - a.detach().matmul(&zero.t()?)?)?;
    y.to_dtype(dtype)
}

/// `Φ` as a mask: 1 below the diagonal, ½ on it, 0 above. Row-major `[d, d]`.
fn phi_mask(d: usize) -> Vec<f64> {
    (0..d * d)
        .map(|ij| match (ij / d).cmp(&(ij % d)) {
            std::cmp::Ordering::Greater => 1.0,
            std::cmp::Ordering::Equal => 0.5,
            std::cmp::Ordering::Less => 0.0,
        })
        .collect()
}

/// Lower Cholesky factor of `(sigma + eps·I)` (`sigma` row-major `[d, d]`, already scaled by
/// `1 − eps`).
fn cholesky(sigma: &[f64], d: usize, eps: f64, n: usize) -> Result<Vec<f64>> {
    let mut l = vec![0f64; d * d];
    for j in 0..d {
        let diag = sigma[j * d + j] + eps;
        let s = diag - (0..j).map(|k| l[j * d + k].powi(2)).sum::<f64>();
        if !s.is_finite() {
            bail!(
                "Cholesky whitening: the covariance is not finite (NaN or infinity in the input)"
            );
        }
        if s <= SINGULAR_RELATIVE * diag {
            bail!(
                "Cholesky whitening of {n} samples in {d} dimensions: the covariance is singular \
                 (not positive definite; dimension {j} has residual variance {s:e} given the \
                 previous ones); it needs n ≥ d + 1 affinely independent samples with no constant \
                 or collinear dimensions, or eps > 0"
            );
        }
        let pivot = s.sqrt();
        l[j * d + j] = pivot;
        for i in j + 1..d {
            let dot: f64 = (0..j).map(|k| l[i * d + k] * l[j * d + k]).sum();
            l[i * d + j] = (sigma[i * d + j] - dot) / pivot;
        }
    }
    Ok(l)
}

/// Inverse of the lower-triangular `l` (row-major `[d, d]`), itself lower triangular.
fn lower_inverse(l: &[f64], d: usize) -> Vec<f64> {
    let mut w = vec![0f64; d * d];
    for j in 0..d {
        w[j * d + j] = 1.0 / l[j * d + j];
        for i in j + 1..d {
            let dot: f64 = (j..i).map(|k| l[i * d + k] * w[k * d + j]).sum();
            w[i * d + j] = -dot / l[i * d + i];
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use ssl_core::testing::randn;

    fn spec_a() -> Result<Tensor> {
        Tensor::new(
            &[[1f64, 0.], [0., 1.], [2., 1.], [1., 3.], [0., 0.]],
            &Device::Cpu,
        )
    }

    const WHITENED_A: [[f64; 2]; 5] = [
        [0.2390457219, -0.902077169],
        [-0.9561828875, 0.2405539117],
        [1.4342743312, -0.3608308676],
        [0.2390457219, 1.6237389042],
        [-0.9561828875, -0.6013847793],
    ];

    fn unbiased_cov(y: &Tensor) -> Result<Vec<Vec<f64>>> {
        let y = y.to_dtype(DType::F64)?;
        let n = y.dim(0)? as f64;
        let c = y.broadcast_sub(&y.mean_keepdim(0)?)?;
        (c.t()?.matmul(&c)? / (n - 1.0))?.to_vec2::<f64>()
    }

    fn assert_identity(c: &[Vec<f64>], tol: f64) {
        for (i, row) in c.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < tol, "cov[{i}][{j}] = {v}");
            }
        }
    }

    #[test]
    fn known_answer_spec_2_15() -> Result<()> {
        let y = cholesky_whiten(&spec_a()?, 0.0)?.to_vec2::<f64>()?;
        for (row, want) in y.iter().zip(WHITENED_A) {
            for (v, w) in row.iter().zip(want) {
                assert!((v - w).abs() < 1e-9 * w.abs().max(1.0), "{v} vs {w}");
            }
        }
        assert_identity(&unbiased_cov(&cholesky_whiten(&spec_a()?, 0.0)?)?, 1e-12);
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> Result<()> {
        let y = cholesky_whiten(&spec_a()?.to_dtype(DType::F32)?, 0.0)?;
        assert_eq!(y.dtype(), DType::F32);
        for (row, want) in y.to_vec2::<f32>()?.iter().zip(WHITENED_A) {
            for (v, w) in row.iter().zip(want) {
                assert!((*v as f64 - w).abs() < 1e-5, "{v} vs {w}");
            }
        }
        Ok(())
    }

    #[test]
    fn output_is_white_and_lower_triangular_map() -> Result<()> {
        let x = randn(0f64, 1., (12, 4), &Device::Cpu)?;
        let x = (x.matmul(&randn(0f64, 1., (4, 4), &Device::Cpu)?)? + 3.0)?;
        let y = cholesky_whiten(&x, 0.0)?;
        assert_identity(&unbiased_cov(&y)?, 1e-10);
        // L⁻¹ is lower triangular: output column 0 is input column 0 standardised.
        let col = x.narrow(1, 0, 1)?;
        let c = col.broadcast_sub(&col.mean_keepdim(0)?)?;
        let sd = (c.sqr()?.sum_all()?.to_scalar::<f64>()? / 11.0).sqrt();
        let want = (c / sd)?.flatten_all()?.to_vec1::<f64>()?;
        let got = y.narrow(1, 0, 1)?.flatten_all()?.to_vec1::<f64>()?;
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12);
        }
        Ok(())
    }

    #[test]
    fn full_shrinkage_only_centres_and_eps_allows_few_samples() -> Result<()> {
        // ε = 1 gives Σ' = I, so Y = X_c.
        let x = randn(0f64, 1., (9, 3), &Device::Cpu)?;
        let y = cholesky_whiten(&x, 1.0)?;
        let xc = x.broadcast_sub(&x.mean_keepdim(0)?)?;
        assert!((y - xc)?.abs()?.max_all()?.to_scalar::<f64>()? < 1e-14);
        // Works below d + 1 samples when ε > 0.
        let few = randn(0f64, 1., (3, 5), &Device::Cpu)?;
        let y = cholesky_whiten(&few, 0.1)?;
        assert_eq!(y.dims(), &[3, 5]);
        Ok(())
    }

    #[test]
    fn batched_matches_one_at_a_time() -> Result<()> {
        let x = randn(0f64, 1., (3, 7, 3), &Device::Cpu)?;
        let all = cholesky_whiten_batched(&x, 0.05)?;
        for k in 0..3 {
            let one = cholesky_whiten(&x.get(k)?, 0.05)?;
            let diff = (all.get(k)? - one)?.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(diff < 1e-13, "{diff}");
        }
        Ok(())
    }

    fn check_gradient(shape: &[usize], eps: f64) -> Result<f64> {
        let dev = Device::Cpu;
        let x = randn(0f64, 1., shape, &dev)?;
        let r1 = randn(0f64, 1., shape, &dev)?;
        let r2 = randn(0f64, 1., shape, &dev)?;
        ssl_core::testing::max_gradient_error(&x, |x| {
            let y = if shape.len() == 3 {
                cholesky_whiten_batched(x, eps)?
            } else {
                cholesky_whiten(x, eps)?
            };
            (y.mul(&r1)?.sum_all()? + (y.sqr()?.mul(&r2)?.sum_all()? * 0.3)?)?.sum_all()
        })
    }

    #[test]
    fn gradient_matches_finite_differences() -> Result<()> {
        for (shape, eps) in [
            (&[5, 2][..], 0.0),
            (&[12, 4][..], 0.0),
            (&[12, 4][..], 0.2),
            (&[2, 6, 3][..], 0.0),
        ] {
            let err = check_gradient(shape, eps)?;
            assert!(
                err < 1e-6,
                "shape {shape:?} eps {eps}: relative error {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn gradient_through_spec_example() -> Result<()> {
        let r = randn(0f64, 1., (5, 2), &Device::Cpu)?;
        let err = ssl_core::testing::max_gradient_error(&spec_a()?, |x| {
            cholesky_whiten(x, 0.0)?.mul(&r)?.sum_all()
        })?;
        assert!(err < 1e-6, "relative error {err}");
        Ok(())
    }

    #[test]
    fn singular_covariance_is_a_clear_error() -> Result<()> {
        let dev = Device::Cpu;
        let too_few = randn(0f64, 1., (4, 4), &dev)?;
        let err = cholesky_whiten(&too_few, 0.0).unwrap_err().to_string();
        assert!(err.contains("n must be ≥ d + 1 = 5"), "{err}");
        // Third column = first + second: singular although n > d.
        let x = randn(0f64, 1., (10, 2), &dev)?;
        let sum = x.sum_keepdim(1)?;
        let collinear = Tensor::cat(&[&x, &sum], 1)?;
        let err = cholesky_whiten(&collinear, 0.0).unwrap_err().to_string();
        assert!(
            err.contains("singular") && err.contains("dimension 2"),
            "{err}"
        );
        let constant = Tensor::ones((6, 2), DType::F64, &dev)?;
        let err = cholesky_whiten(&constant, 0.0).unwrap_err().to_string();
        assert!(err.contains("singular"), "{err}");
        let err = cholesky_whiten(&spec_a()?, 1.5).unwrap_err().to_string();
        assert!(err.contains("eps must be in [0, 1]"), "{err}");
        Ok(())
    }
}
