//! Eigenvalue and singular-value functions with gradients: the nuclear norm (MMCR, spec
//! `docs/spec/objectives.md` §2.13) and the von Neumann entropy (I-VNE, spec §2.12); backward rules
//! of spec §3.
//!
//! Candle has no SVD or eigendecomposition, so the decomposition runs on the host in f64 (faer's
//! blocked symmetric eigensolver; one transfer of the detached inputs per call, batched, the
//! matrices of a batch spread over the cores) and its result re-enters the graph through a
//! *surrogate* `v + tr(sg(G)ᵀX) − sg(tr(GᵀX))`: ordinary Candle ops whose value is the host value
//! `v` and whose gradient with respect to the input `X` is the host gradient `G`. Autograd then
//! carries that gradient on through whatever Candle ops produced `X`, on any device and in any
//! float dtype. Second derivatives are not supported.
//!
//! * Nuclear norm `‖C‖_* = Σσ` of `C = UΣVᵀ` (thin SVD): gradient `G = UVᵀ`. (`tr(GᵀC) = Σσ`
//!   exactly since `UᵀCV = Σ`, so the surrogate is the plain `tr(sg(UVᵀ)ᵀC)` up to rounding in
//!   the working dtype; the constant form keeps the f64 value.) The SVD is taken from the
//!   eigendecomposition of the smaller Gram matrix, `UVᵀ = (CCᵀ)^{-1/2}C`, ~7× faster than
//!   nalgebra's SVD at `128×512`. Singular values up to `10⁻⁶·σ_max` (which the Gram matrix cannot
//!   resolve accurately) count as zero in value and gradient; at rank-deficient `C`, where
//!   `‖C‖_*` is not differentiable, this gives the subgradient `U_r V_rᵀ` of the range.
//! * Von Neumann entropy `S(ρ) = −Σλ log λ` (`0·log 0 = 0`) of a symmetric PSD `ρ = UΛUᵀ`:
//!   gradient `G = −(log ρ + I) = −U(log Λ + I)Uᵀ`. Inside the logarithm of the gradient
//!   eigenvalues are clamped to `λ ≥ 1e-12` ([`EIGENVALUE_FLOOR`]): the true derivative
//!   `−(log λ + 1)` diverges at `λ → 0`, and the clamp caps it at ≈ 26.6 per unit eigenvector.
//!   Eigenvalues ≤ 0 (rounding on a PSD input) count as zero in the value.
//!
//! For `ρ = ẐᵀẐ/N` with `Ẑ: [N, d]`, the `d×d` matrix `ẐᵀẐ/N` and the `N×N` Gram `ẐẐᵀ/N` have
//! the same non-zero eigenvalues, so [`von_neumann_entropy_of_rows`] decomposes the smaller of
//! the two. The Gram is formed with Candle ops, so the gradient with respect to `Ẑ` follows from
//! the chain rule (`∂S/∂Ẑ = 2ẐG_d/N = 2G_N Ẑ/N`) and is the same for either choice.

use candle_core::{bail, DType, Device, Result, Tensor};
use faer::diag::Diag;
use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::evd;
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, MatRef, Par};
use std::sync::Mutex;

/// Smallest eigenvalue used inside `log λ` of the von Neumann entropy's gradient.
pub const EIGENVALUE_FLOOR: f64 = 1e-12;

/// Gram eigenvalues at or below this fraction of the largest (singular values up to
/// `1e-6 · σ_max`) count as zero in the nuclear norm's value and gradient: the squared matrix
/// resolves them only to about `1e-8 · σ_max`, and `1/σ` would amplify that error.
const GRAM_CUTOFF: f64 = 1e-12;

/// The values of `t` (detached) as f64 on the host, row-major. (Widening in Rust: Candle's own
/// f32 → f64 conversion is several times slower.)
pub(crate) fn host_values(t: &Tensor, what: &str) -> Result<Vec<f64>> {
    let t = t.detach().to_device(&Device::Cpu)?.flatten_all()?;
    let values: Vec<f64> = match t.dtype() {
        DType::F64 => t.to_vec1::<f64>()?,
        DType::F32 => t.to_vec1::<f32>()?.into_iter().map(f64::from).collect(),
        _ => t.to_dtype(DType::F64)?.to_vec1::<f64>()?,
    };
    if values.iter().any(|v| !v.is_finite()) {
        bail!("{what}: the input contains NaN or infinite values");
    }
    Ok(values)
}

/// A constant tensor with `like`'s dtype and device from row-major host values.
fn constant(values: Vec<f64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    let host = match like.dtype() {
        DType::F32 => {
            let narrowed: Vec<f32> = values.into_iter().map(|v| v as f32).collect();
            Tensor::from_vec(narrowed, shape, &Device::Cpu)?
        }
        dtype => Tensor::from_vec(values, shape, &Device::Cpu)?.to_dtype(dtype)?,
    };
    host.to_device(like.device())
}

/// `f(index, block)` for consecutive `len`-element blocks of `values`, the blocks spread over
/// Candle's own CPU workers (the decompositions are independent and single-threaded). Running them
/// there rather than on threads of our own keeps one thread per core: Candle's workers spin for a
/// while after each op, and a thread beside them would share a core with a spinning one. `f` must
/// not run Candle ops (see [`crate::for_each_chunk_mut`]).
pub(crate) fn map_blocks<T: Send>(
    values: &[f64],
    len: usize,
    f: impl Fn(usize, &[f64]) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let blocks: Vec<&[f64]> = values.chunks_exact(len).collect();
    if blocks.len() <= 1 {
        return blocks.into_iter().map(|b| f(0, b)).collect();
    }
    let slots: Vec<Mutex<Option<Result<T>>>> = blocks.iter().map(|_| Mutex::new(None)).collect();
    candle_core::utils::barrier_pool().execute_chunked(blocks.len(), |range| {
        for i in range {
            let result = f(i, blocks[i]);
            *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        }
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| bail!("a host decomposition did not run"))
        })
        .collect()
}

/// Eigenvalues (ascending) and eigenvectors (columns) of a symmetric `k×k` matrix given by its
/// row-major `values` (only the lower triangle is read), with an error instead of a panic.
/// faer's blocked tridiagonalisation and divide and conquer, on the calling thread: the matrices
/// of a batch are already spread over the cores ([`map_blocks`]).
fn symmetric_eigen(values: &[f64], k: usize, what: &str) -> Result<(Vec<f64>, Mat<f64>)> {
    // Row-major and symmetric: the column-major view of the transpose is the matrix itself.
    let m = MatRef::from_column_major_slice(values, k, k);
    let mut u = Mat::<f64>::zeros(k, k);
    let mut s = Diag::<f64>::zeros(k);
    let par = Par::Seq;
    let scratch = evd::self_adjoint_evd_scratch::<f64>(
        k,
        evd::ComputeEigenvectors::Yes,
        par,
        Default::default(),
    );
    let solved = evd::self_adjoint_evd(
        m,
        s.as_mut(),
        Some(u.as_mut()),
        par,
        MemStack::new(&mut MemBuffer::new(scratch)),
        Default::default(),
    );
    if solved.is_err() {
        bail!("{what}: the eigendecomposition of a {k}×{k} matrix did not converge");
    }
    Ok((s.column_vector().iter().copied().collect(), u))
}

/// `U diag(w) Uᵀ` for the eigenvectors `U` (columns), row-major.
fn spectral_function(u: &Mat<f64>, w: &[f64]) -> Vec<f64> {
    let k = u.nrows();
    let mut scaled = u.clone();
    for (j, &wj) in w.iter().enumerate() {
        scaled.col_mut(j).iter_mut().for_each(|x| *x *= wj);
    }
    let mut out = Mat::<f64>::zeros(k, k);
    matmul(
        out.as_mut(),
        Accum::Replace,
        scaled.as_ref(),
        u.transpose(),
        1.0,
        Par::Seq,
    );
    (0..k)
        .flat_map(|i| (0..k).map(move |j| (i, j)))
        .map(|(i, j)| out[(i, j)])
        .collect()
}

/// `(Σσ, (G⁺)^{1/2})` of one `k×k` Gram matrix `G = CCᵀ` (or `CᵀC`), row-major: the singular
/// values of `C` are `σ = √λ(G)`, and `UVᵀ = (CCᵀ)^{-1/2}C = C(CᵀC)^{-1/2}` with the
/// pseudo-inverse square root ignoring eigenvalues below [`GRAM_CUTOFF`] of the largest.
fn gram_inverse_root(values: &[f64], k: usize) -> Result<(f64, Vec<f64>)> {
    let (lambda, u) = symmetric_eigen(values, k, "nuclear norm")?;
    let floor = lambda.iter().copied().fold(0.0, f64::max) * GRAM_CUTOFF;
    let sigma: Vec<f64> = lambda
        .iter()
        .map(|&l| if l > floor { l.sqrt() } else { 0.0 })
        .collect();
    let w: Vec<f64> = sigma
        .iter()
        .map(|&s| if s > 0.0 { 1.0 / s } else { 0.0 })
        .collect();
    Ok((sigma.iter().sum(), spectral_function(&u, &w)))
}

/// `(S(ρ), −(log ρ + I))` of one symmetric `k×k` row-major matrix (symmetrised first).
fn entropy_host(values: &[f64], k: usize) -> Result<(f64, Vec<f64>)> {
    let symmetric: Vec<f64> = (0..k * k)
        .map(|ij| 0.5 * (values[ij] + values[(ij % k) * k + ij / k]))
        .collect();
    let (lambda, u) = symmetric_eigen(&symmetric, k, "von Neumann entropy")?;
    let entropy: f64 = lambda
        .iter()
        .filter(|&&l| l > 0.0)
        .map(|&l| -l * l.ln())
        .sum();
    let w: Vec<f64> = lambda
        .iter()
        .map(|&l| -(l.max(EIGENVALUE_FLOOR).ln() + 1.0))
        .collect();
    Ok((entropy, spectral_function(&u, &w)))
}

/// `value + tr(sg(G)ᵀX) − sg(tr(GᵀX))` per matrix: value `values[i]`, gradient `grad[i]` (f64,
/// on the host, `x`'s shape) with respect to `x`: `[b, n, d]` → `[b]`.
fn surrogate(x: &Tensor, values: Vec<f64>, grad: &Tensor) -> Result<Tensor> {
    let b = values.len();
    let grad = match x.dtype() {
        DType::F64 => grad.clone(),
        DType::F32 => {
            let narrowed: Vec<f32> = grad
                .flatten_all()?
                .to_vec1::<f64>()?
                .iter()
                .map(|&v| v as f32)
                .collect();
            Tensor::from_vec(narrowed, grad.shape(), &Device::Cpu)?
        }
        dtype => grad.to_dtype(dtype)?,
    };
    let linear = (grad.to_device(x.device())? * x)?.sum((1, 2))?;
    constant(values, &[b], x)? + (&linear - linear.detach())?
}

/// Splits per-matrix host results into their values and their row-major gradients stacked as
/// an f64 host tensor of `shape`.
fn values_and_gradient(
    results: Vec<(f64, Vec<f64>)>,
    shape: &[usize],
) -> Result<(Vec<f64>, Tensor)> {
    let (values, grads): (Vec<f64>, Vec<Vec<f64>>) = results.into_iter().unzip();
    Ok((
        values,
        Tensor::from_vec(grads.concat(), shape, &Device::Cpu)?,
    ))
}

/// Nuclear norm `‖C‖_* = Σ_k σ_k(C)` of `c`: `[n, d]` → scalar, with gradient `UVᵀ` (spec §3).
/// Decomposed on the host in f64; see the module documentation.
pub fn nuclear_norm(c: &Tensor) -> Result<Tensor> {
    nuclear_norm_batched(&c.unsqueeze(0)?)?.squeeze(0)
}

/// [`nuclear_norm`] of each of `b` matrices: `c`: `[b, n, d]` → `[b]`. One host round trip.
///
/// With `k = min(n, d)` the thin SVD comes from the `k×k` Gram matrices: the two products (`CCᵀ`,
/// then `(CCᵀ)^{-1/2}C`) run as f64 GEMMs on Candle's workers ([`crate::matmul_detached`]), only
/// the eigendecompositions in faer. At `128×512` this was ~7× faster than an SVD with singular
/// vectors (nalgebra's).
pub fn nuclear_norm_batched(c: &Tensor) -> Result<Tensor> {
    let (b, n, d) = c.dims3()?;
    let host = Tensor::from_vec(host_values(c, "nuclear norm")?, (b, n, d), &Device::Cpu)?;
    let wide = n <= d;
    let gram = match wide {
        true => crate::matmul_detached(&host, &host.t()?)?,
        false => crate::matmul_detached(&host.t()?.contiguous()?, &host)?,
    };
    let k = n.min(d);
    let gram = gram.flatten_all()?.to_vec1::<f64>()?;
    let (values, inverse_root) = values_and_gradient(
        map_blocks(&gram, k * k, |_, m| gram_inverse_root(m, k))?,
        &[b, k, k],
    )?;
    let grad = match wide {
        true => crate::matmul_detached(&inverse_root, &host)?,
        false => crate::matmul_detached(&host, &inverse_root)?,
    };
    surrogate(c, values, &grad)
}

/// Von Neumann entropy `S(ρ) = −Σ λ log λ` (`0·log 0 = 0`) of a symmetric positive semi-definite
/// `rho`: `[d, d]` (a density matrix when its trace is 1) → scalar, with gradient
/// `−(log ρ + I)` (spec §3; eigenvalues clamped to ≥ [`EIGENVALUE_FLOOR`] inside the log).
/// Only the symmetric part `(ρ + ρᵀ)/2` is decomposed.
pub fn von_neumann_entropy(rho: &Tensor) -> Result<Tensor> {
    von_neumann_entropy_batched(&rho.unsqueeze(0)?)?.squeeze(0)
}

/// [`von_neumann_entropy`] of each of `b` matrices: `rho`: `[b, k, k]` → `[b]`. One host round
/// trip.
pub fn von_neumann_entropy_batched(rho: &Tensor) -> Result<Tensor> {
    let (_, k, k2) = rho.dims3()?;
    if k != k2 {
        bail!("von Neumann entropy needs square matrices, got {k}×{k2}");
    }
    let values = host_values(rho, "von Neumann entropy")?;
    let results = map_blocks(&values, k * k, |_, m| entropy_host(m, k))?;
    let (values, grad) = values_and_gradient(results, rho.dims())?;
    surrogate(rho, values, &grad)
}

/// Von Neumann entropy of `ρ = ẐᵀẐ/N` for `z_hat`: `[N, d]` → scalar, without forming the
/// `d×d` matrix when `d > N`: the `N×N` Gram `ẐẐᵀ/N` has the same non-zero spectrum. Rows
/// are used as given; row-normalise them first for a trace-one `ρ` (spec §2.12).
pub fn von_neumann_entropy_of_rows(z_hat: &Tensor) -> Result<Tensor> {
    von_neumann_entropy_of_rows_batched(&z_hat.unsqueeze(0)?)?.squeeze(0)
}

/// [`von_neumann_entropy_of_rows`] of each of `b` matrices: `z_hat`: `[b, N, d]` → `[b]`; each
/// decomposition is `min(N, d)` square.
pub fn von_neumann_entropy_of_rows_batched(z_hat: &Tensor) -> Result<Tensor> {
    let (_, n, d) = z_hat.dims3()?;
    if n == 0 {
        bail!("von Neumann entropy of rows: the batch is empty");
    }
    let gram = match d > n {
        true => crate::gram(z_hat)?,
        false => crate::gram_of_columns(z_hat)?,
    };
    von_neumann_entropy_batched(&(gram / n as f64)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;
    use ssl_core::testing::{close, max_gradient_error, randn};

    fn scalar(t: &Tensor) -> f64 {
        t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
    }

    /// A random `n×n` orthogonal matrix (Q of a Gaussian matrix's QR).
    fn orthogonal(n: usize) -> Result<DMatrix<f64>> {
        let g = randn(0f64, 1., (n, n), &Device::Cpu)?;
        let g = DMatrix::from_row_slice(n, n, &g.flatten_all()?.to_vec1::<f64>()?);
        Ok(g.qr().q())
    }

    fn to_tensor(m: &DMatrix<f64>) -> Result<Tensor> {
        let rows: Vec<f64> = (0..m.nrows())
            .flat_map(|i| (0..m.ncols()).map(move |j| m[(i, j)]))
            .collect();
        Tensor::from_vec(rows, (m.nrows(), m.ncols()), &Device::Cpu)
    }

    /// `Q₁ diag(s) Q₂ᵀ` restricted to `n×d`: singular values exactly `s`.
    fn with_singular_values(n: usize, d: usize, s: &[f64]) -> Result<Tensor> {
        let (q1, q2) = (orthogonal(n)?, orthogonal(d)?);
        let mut sigma = DMatrix::zeros(n, d);
        for (k, &v) in s.iter().enumerate() {
            sigma[(k, k)] = v;
        }
        to_tensor(&(q1 * sigma * q2.transpose()))
    }

    /// `Q diag(p) Qᵀ`: a symmetric matrix with eigenvalues exactly `p`.
    fn with_eigenvalues(p: &[f64]) -> Result<Tensor> {
        let q = orthogonal(p.len())?;
        let lambda = DMatrix::from_diagonal(&nalgebra::DVector::from_column_slice(p));
        to_tensor(&(&q * lambda * q.transpose()))
    }

    /// Row-major values of a matrix.
    fn row_major(m: &DMatrix<f64>) -> Vec<f64> {
        (0..m.nrows())
            .flat_map(|i| (0..m.ncols()).map(move |j| m[(i, j)]))
            .collect()
    }

    /// The host results with nalgebra's one-thread `SymmetricEigen` (the solver before faer):
    /// `(Σ f(λ), U diag(w(λ)) Uᵀ)` of a row-major symmetric `k×k` matrix.
    fn nalgebra_reference(
        values: &[f64],
        k: usize,
        f: impl Fn(f64) -> f64,
        w: impl Fn(f64) -> f64,
    ) -> (f64, Vec<f64>) {
        let eig = nalgebra::SymmetricEigen::new(DMatrix::from_row_slice(k, k, values));
        let mut scaled = eig.eigenvectors.clone();
        for (mut column, &l) in scaled.column_iter_mut().zip(eig.eigenvalues.iter()) {
            column *= w(l);
        }
        let value = eig.eigenvalues.iter().map(|&l| f(l)).sum();
        (value, row_major(&(scaled * eig.eigenvectors.transpose())))
    }

    /// `ZZᵀ/d` of a Gaussian `k×d` matrix, row-major.
    fn random_gram(k: usize, d: usize) -> Result<Vec<f64>> {
        let z = randn(0f64, 1., (k, d), &Device::Cpu)?;
        (z.matmul(&z.t()?)? / d as f64)?
            .flatten_all()?
            .to_vec1::<f64>()
    }

    fn max_difference(a: &[f64], b: &[f64]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0., f64::max)
    }

    #[test]
    fn faer_host_results_match_the_nalgebra_solver() -> Result<()> {
        // The objectives' shapes: 128 and 256 square, plus a small one.
        for (k, d) in [(5, 9), (128, 512), (256, 512)] {
            let gram = random_gram(k, d)?;
            let trace: f64 = (0..k).map(|i| gram[i * k + i]).sum();
            let rho: Vec<f64> = gram.iter().map(|v| v / trace).collect();
            let (entropy, grad) = entropy_host(&rho, k)?;
            let (want, want_grad) = nalgebra_reference(
                &rho,
                k,
                |l| if l > 0.0 { -l * l.ln() } else { 0.0 },
                |l| -(l.max(EIGENVALUE_FLOOR).ln() + 1.0),
            );
            close(entropy, want, 1e-12);
            let worst = max_difference(&grad, &want_grad);
            assert!(worst < 1e-10, "{k}: entropy gradients differ by {worst}");

            let (nuclear, root) = gram_inverse_root(&gram, k)?;
            let (want, want_root) =
                nalgebra_reference(&gram, k, |l| l.max(0.0).sqrt(), |l| 1.0 / l.sqrt());
            close(nuclear, want, 1e-12);
            let worst = max_difference(&root, &want_root);
            assert!(worst < 1e-10, "{k}: inverse roots differ by {worst}");
        }
        Ok(())
    }

    fn entropy_of(p: &[f64]) -> f64 {
        p.iter().filter(|&&l| l > 0.0).map(|&l| -l * l.ln()).sum()
    }

    #[test]
    fn nuclear_norm_is_the_sum_of_known_singular_values() -> Result<()> {
        for (n, d) in [(4, 6), (6, 4), (5, 5)] {
            let s = [3.0, 1.5, 0.7, 0.2];
            let c = with_singular_values(n, d, &s)?;
            close(scalar(&nuclear_norm(&c)?), s.iter().sum(), 1e-12);
        }
        Ok(())
    }

    /// Thin SVD `(σ, UVᵀ)` straight from nalgebra, keeping the first `rank` singular triplets.
    fn svd_reference(c: &Tensor, rank: usize) -> Result<(Vec<f64>, Vec<f64>)> {
        let (n, d) = c.dims2()?;
        let m = DMatrix::from_row_slice(n, d, &c.flatten_all()?.to_vec1::<f64>()?);
        let svd = nalgebra::SVD::new(m, true, true);
        let (u, v_t) = (svd.u.unwrap(), svd.v_t.unwrap());
        let mut order: Vec<usize> = (0..svd.singular_values.len()).collect();
        order.sort_by(|&a, &b| svd.singular_values[b].total_cmp(&svd.singular_values[a]));
        let mut uv = DMatrix::<f64>::zeros(n, d);
        for &k in &order[..rank] {
            uv += u.column(k) * v_t.row(k);
        }
        Ok((
            svd.singular_values.iter().copied().collect(),
            row_major(&uv),
        ))
    }

    fn gradient_of(f: impl Fn(&Tensor) -> Result<Tensor>, x: &Tensor) -> Result<Vec<f64>> {
        let var = candle_core::Var::from_tensor(x)?;
        let grads = f(var.as_tensor())?.backward()?;
        grads
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()?
            .to_vec1::<f64>()
    }

    #[test]
    fn nuclear_norm_and_gradient_agree_with_a_direct_svd() -> Result<()> {
        for (n, d) in [(5, 8), (8, 5), (64, 256)] {
            let c = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let (sigma, uv) = svd_reference(&c, n.min(d))?;
            close(scalar(&nuclear_norm(&c)?), sigma.iter().sum(), 1e-10);
            let grad = gradient_of(nuclear_norm, &c)?;
            let worst = grad
                .iter()
                .zip(&uv)
                .map(|(a, b)| (a - b).abs())
                .fold(0., f64::max);
            assert!(
                worst < 1e-9,
                "{n}×{d}: gradient differs from UVᵀ by {worst}"
            );
        }
        Ok(())
    }

    #[test]
    fn rank_deficient_nuclear_norm_uses_the_range_only() -> Result<()> {
        let s = [2.0, 1.0, 0.5];
        for (n, d) in [(5, 7), (7, 5)] {
            let c = with_singular_values(n, d, &s)?;
            close(scalar(&nuclear_norm(&c)?), 3.5, 1e-12);
            let (_, uv) = svd_reference(&c, 3)?;
            let grad = gradient_of(nuclear_norm, &c)?;
            let worst = grad
                .iter()
                .zip(&uv)
                .map(|(a, b)| (a - b).abs())
                .fold(0., f64::max);
            assert!(
                worst < 1e-9,
                "{n}×{d}: gradient differs from U_r V_rᵀ by {worst}"
            );
        }
        Ok(())
    }

    #[test]
    fn nuclear_norm_gradient_is_u_v_transposed() -> Result<()> {
        for (n, d) in [(4, 6), (6, 3), (4, 4)] {
            let c = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let err = max_gradient_error(&c, nuclear_norm)?;
            assert!(err < 1e-6, "{n}×{d}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn batched_nuclear_norm_matches_one_by_one() -> Result<()> {
        let c = randn(0f64, 1., (3, 4, 5), &Device::Cpu)?;
        let all = nuclear_norm_batched(&c)?.to_vec1::<f64>()?;
        for (k, v) in all.iter().enumerate() {
            close(*v, scalar(&nuclear_norm(&c.get(k)?)?), 1e-12);
        }
        let err = max_gradient_error(&c, |c| {
            nuclear_norm_batched(c)?
                .mul(&Tensor::new(&[1f64, -2., 0.5], c.device())?)?
                .sum_all()
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    #[test]
    fn nuclear_norm_in_f32() -> Result<()> {
        let s = [2.0, 1.0, 0.25];
        let c = with_singular_values(3, 5, &s)?.to_dtype(DType::F32)?;
        let value = nuclear_norm(&c)?;
        assert_eq!(value.dtype(), DType::F32);
        close(scalar(&value), 3.25, 1e-5);
        Ok(())
    }

    #[test]
    fn entropy_of_known_spectrum_with_zero_eigenvalues() -> Result<()> {
        let p = [0.5, 0.3, 0.2, 0.0, 0.0];
        let rho = with_eigenvalues(&p)?;
        close(scalar(&von_neumann_entropy(&rho)?), entropy_of(&p), 1e-10);
        let uniform = (Tensor::eye(4, DType::F64, &Device::Cpu)? / 4.0)?;
        close(scalar(&von_neumann_entropy(&uniform)?), 4f64.ln(), 1e-12);
        Ok(())
    }

    #[test]
    fn entropy_gradient_is_minus_log_rho_plus_identity() -> Result<()> {
        let p = [0.4, 0.25, 0.2, 0.1, 0.05];
        let rho = with_eigenvalues(&p)?;
        let err = max_gradient_error(&rho, von_neumann_entropy)?;
        assert!(err < 1e-6, "relative gradient error {err}");
        // Not trace-one: the formula holds for any positive-definite matrix.
        let err = max_gradient_error(&(rho * 3.0)?, von_neumann_entropy)?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    fn normalize_rows(z: &Tensor) -> Result<Tensor> {
        z.broadcast_div(&z.sqr()?.sum_keepdim(1)?.sqrt()?)
    }

    #[test]
    fn entropy_of_rows_equals_entropy_of_the_d_by_d_matrix() -> Result<()> {
        for (n, d) in [(4, 7), (7, 4), (5, 5)] {
            let z = normalize_rows(&randn(0f64, 1., (n, d), &Device::Cpu)?)?;
            let rho = (z.t()?.matmul(&z)? / n as f64)?;
            let direct = scalar(&von_neumann_entropy(&rho)?);
            close(scalar(&von_neumann_entropy_of_rows(&z)?), direct, 1e-10);
            let via_svd: f64 = {
                let m = DMatrix::from_row_slice(n, d, &z.flatten_all()?.to_vec1::<f64>()?);
                let l: Vec<f64> = m
                    .singular_values()
                    .iter()
                    .map(|s| s * s / n as f64)
                    .collect();
                entropy_of(&l)
            };
            close(direct, via_svd, 1e-10);
        }
        Ok(())
    }

    #[test]
    fn entropy_of_rows_gradient_through_either_gram() -> Result<()> {
        for (n, d) in [(4, 7), (7, 4)] {
            let z = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let small = |z: &Tensor| von_neumann_entropy_of_rows(&normalize_rows(z)?);
            let err = max_gradient_error(&z, small)?;
            assert!(err < 1e-6, "{n}×{d}: relative gradient error {err}");
            // The d×d route (with d − N zero eigenvalues when d > N) gives the same gradient.
            let var = candle_core::Var::from_tensor(&z)?;
            let g_small = small(var.as_tensor())?.backward()?;
            let zh = normalize_rows(var.as_tensor())?;
            let big = von_neumann_entropy(&(zh.t()?.matmul(&zh)? / n as f64)?)?;
            let g_big = big.backward()?;
            let diff = (g_small.get(var.as_tensor()).unwrap()
                - g_big.get(var.as_tensor()).unwrap())?
            .abs()?
            .max_all()?;
            assert!(scalar(&diff) < 1e-8, "{n}×{d}: gradients differ by {diff}");
        }
        Ok(())
    }

    #[test]
    fn batched_entropy_of_rows_matches_one_by_one() -> Result<()> {
        let z = randn(0f64, 1., (3, 4, 6), &Device::Cpu)?;
        let all = von_neumann_entropy_of_rows_batched(&z)?.to_vec1::<f64>()?;
        for (k, v) in all.iter().enumerate() {
            close(*v, scalar(&von_neumann_entropy_of_rows(&z.get(k)?)?), 1e-12);
        }
        Ok(())
    }

    #[test]
    fn entropy_in_f32() -> Result<()> {
        let p = [0.6, 0.3, 0.1];
        let rho = with_eigenvalues(&p)?.to_dtype(DType::F32)?;
        let value = von_neumann_entropy(&rho)?;
        assert_eq!(value.dtype(), DType::F32);
        close(scalar(&value), entropy_of(&p), 1e-5);
        let var = candle_core::Var::from_tensor(&rho)?;
        let grads = von_neumann_entropy(var.as_tensor())?.backward()?;
        assert_eq!(grads.get(var.as_tensor()).unwrap().dtype(), DType::F32);
        Ok(())
    }

    #[test]
    fn rejects_non_finite_and_non_square_input() -> Result<()> {
        let bad = Tensor::new(&[[1f64, f64::NAN], [0., 1.]], &Device::Cpu)?;
        let err = nuclear_norm(&bad).unwrap_err().to_string();
        assert!(err.contains("NaN"), "{err}");
        let rect = Tensor::zeros((1, 2, 3), DType::F64, &Device::Cpu)?;
        let err = von_neumann_entropy_batched(&rect).unwrap_err().to_string();
        assert!(err.contains("square"), "{err}");
        Ok(())
    }
}
