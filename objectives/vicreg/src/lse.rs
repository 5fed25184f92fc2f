//! Row-wise log-sum-exp over the off-diagonal entries of a Gram matrix, fused on the CPU.
//!
//! VICReg-exp takes it over the `d×d` covariance (d = 512 in the main job: 2 × 512² entries per
//! step), VICReg-ctr over the `N×N` sample Gram. Built from Candle's ops it costs the Gram, about
//! ten full passes over it forward and fifteen backward, each allocating, and an `R×R` gradient
//! accumulated by autograd; the fused op is a GEMM and one pass each way (rows spread over
//! Candle's CPU workers, `exp` vectorised). Other devices use the composed ops, which are also the
//! reference the tests hold the fused op to.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType, D};
use ssl_linalg::{exp_f32, for_each_chunk_mut};

/// Added to the masked (diagonal) logits of the composed reference.
const MASKED: f64 = -1e9;

/// Row-wise `lse_{j≠i}(m_ij / τ)` of square matrices `m`: `[…, R, R]` → `[…, R]`, R ≥ 2
/// (spec `docs/spec/objectives.md` §2.4/§2.5: the diagonal is left out), from Candle's ops on any
/// device: mask the diagonal, subtract the detached row max, `exp`, sum, `log`.
pub fn off_diagonal_logsumexp(m: &Tensor, tau: f64) -> Result<Tensor> {
    let r = m.dim(D::Minus1)?;
    if r < 2 || m.dim(D::Minus2)? != r {
        candle_core::bail!(
            "a log-sum-exp over off-diagonal entries needs square matrices of size ≥ 2, got {:?}",
            m.dims()
        );
    }
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

/// Row-wise `lse_{j≠i}((X Xᵀ)_ij / τ)` for `x`: `[…, R, K]` → `[…, R]`, R ≥ 2: the
/// off-diagonal log-sum-exp of a Gram matrix (VICReg-exp's covariance, `X` the centred
/// dimensions; VICReg-ctr's sample Gram).
///
/// On the CPU one op keeps the `R×R` Gram to itself: the forward is one GEMM and one pass; the
/// backward, `∂/∂X = S X` with `S_ij = (g_i/τ)·softmax_i(j) + (g_j/τ)·softmax_j(i)` (the two
/// uses of the symmetric entry), is one pass and one GEMM, with no `R×R` gradient going through
/// autograd's accumulation. Elsewhere it is [`ssl_linalg::gram`](fn@ssl_linalg::gram) then
/// [`off_diagonal_logsumexp`].
pub fn gram_off_diagonal_logsumexp(x: &Tensor, tau: f64) -> Result<Tensor> {
    let r = x.dim(D::Minus2)?;
    if r < 2 {
        candle_core::bail!(
            "a log-sum-exp over off-diagonal Gram entries needs at least 2 rows, got {:?}",
            x.dims()
        );
    }
    match x.device().is_cpu() {
        true => x.contiguous()?.apply_op1(GramLse {
            tau,
            softmax: Mutex::new(None),
        }),
        false => off_diagonal_logsumexp(&ssl_linalg::gram(x)?, tau),
    }
}

/// The float types the fused op runs in; sums are accumulated in f64.
trait Real: WithDType {
    /// `x ↦ exp(x)` over a slice, in place.
    fn exp_in_place(xs: &mut [Self]);
}

impl Real for f32 {
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = exp_f32(*x));
    }
}

impl Real for f64 {
    fn exp_in_place(xs: &mut [Self]) {
        xs.iter_mut().for_each(|x| *x = x.exp());
    }
}

/// `v ↦ exp(v/τ − shift)` in place.
fn shifted_exp_in_place<T: Real>(values: &mut [T], inv_tau: T, shift: T) {
    for v in values.iter_mut() {
        *v = *v * inv_tau - shift;
    }
    T::exp_in_place(values);
}

/// Row `i` of `m` (in `[R, R]` blocks) without its diagonal entry, as the two slices around it.
fn around_diagonal<T>(values: &[T], i: usize) -> (&[T], &[T]) {
    (&values[..i], &values[i + 1..])
}

/// Lanes of the reductions below: eight independent accumulators, so the loops vectorise.
const LANES: usize = 8;

/// `max(xs)` (−∞ for an empty slice).
fn lane_max<T: Real>(xs: &[T]) -> T {
    let mut lanes = [T::from_f64(f64::NEG_INFINITY); LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = if x > *lane { x } else { *lane };
        }
    }
    tail.iter().chain(&lanes).fold(
        T::from_f64(f64::NEG_INFINITY),
        |m, &x| if x > m { x } else { m },
    )
}

/// `Σ xs` in f64 from eight partial sums in `T`.
fn lane_sum<T: Real>(xs: &[T]) -> f64 {
    let mut lanes = [T::zero(); LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    tail.iter().chain(&lanes).map(|x| x.to_f64()).sum()
}

/// Row-wise `lse_{j≠i}(m_ij / τ)` of the `[R, R]` blocks of `m`, which it overwrites with the
/// row softmax `P_ij = exp(m_ij/τ − lse_i)` (`P_ii = 0`) that the backward reads.
fn softmax_rows<T: Real>(m: &mut [T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    for_each_chunk_mut(
        m,
        r,
        || (),
        |_, row, values| {
            let i = row % r;
            let (before, after) = around_diagonal(values, i);
            // τ > 0, so the largest logit is the largest entry over τ.
            let max = lane_max(&[lane_max(before), lane_max(after)]) * inv_tau;
            shifted_exp_in_place(values, inv_tau, max);
            values[i] = T::zero();
            let sum = lane_sum(values);
            let scale = T::from_f64(1.0 / sum);
            values.iter_mut().for_each(|v| *v *= scale);
            // The diagonal holds the row's lse until the loop below collects it.
            values[i] = T::from_f64(sum.ln() + max.to_f64());
        },
    );
    (0..m.len() / r)
        .map(|row| std::mem::replace(&mut m[row * r + row % r], T::zero()))
        .collect()
}

/// The fused Gram + off-diagonal log-sum-exp: `[…, R, K]` → `[…, R]`. The forward's row
/// softmax is kept for the backward (recomputed if the backward runs without it).
struct GramLse {
    tau: f64,
    softmax: Mutex<Option<CpuStorage>>,
}

/// `[…, R, K]` blocks of a contiguous CPU tensor's values: (values, batch, R, K).
fn cpu_blocks<'a, T: WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
) -> Result<(&'a [T], usize, usize, usize)> {
    let dims = layout.dims();
    let (rank, r, k) = (dims.len(), dims[dims.len() - 2], dims[dims.len() - 1]);
    let batch = dims[..rank - 2].iter().product::<usize>();
    let values = &storage.as_slice::<T>()?[layout.start_offset()..][..batch * r * k];
    Ok((values, batch, r, k))
}

/// The row softmax `P` (see [`softmax_rows`]) and the row lse of the Gram `X Xᵀ` of a
/// contiguous `[…, R, K]` on the CPU.
fn cpu_softmax(
    storage: &CpuStorage,
    layout: &Layout,
    tau: f64,
) -> Result<(CpuStorage, CpuStorage)> {
    fn run<T: Real>(storage: &CpuStorage, layout: &Layout, tau: f64) -> Result<(Vec<T>, Vec<T>)> {
        let (x, batch, r, k) = cpu_blocks::<T>(storage, layout)?;
        let mut m = ssl_linalg::gram_blocks(x, batch, r, k)?;
        let lse = softmax_rows(&mut m, r, tau);
        Ok((m, lse))
    }
    match storage {
        CpuStorage::F32(_) => {
            let (p, lse) = run::<f32>(storage, layout, tau)?;
            Ok((CpuStorage::F32(p), CpuStorage::F32(lse)))
        }
        CpuStorage::F64(_) => {
            let (p, lse) = run::<f64>(storage, layout, tau)?;
            Ok((CpuStorage::F64(p), CpuStorage::F64(lse)))
        }
        _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
    }
}

/// `S` of [`gram_off_diagonal_logsumexp`]'s backward from the forward's row softmax `p` and the
/// incoming gradient `g`: `S_ij = (g_i/τ)·P_ij + (g_j/τ)·P_ji`, rows in parallel.
fn symmetric_softmax_gradient<T: Real>(p: &[T], g: &[T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    let scaled_g: Vec<T> = g.iter().map(|&g| g * inv_tau).collect();
    let mut s = vec![T::zero(); p.len()];
    for_each_chunk_mut(
        &mut s,
        r,
        || (),
        |_, row, s| {
            let (block, i) = (row / r * r, row % r);
            let (gi, row_p, block_p) = (scaled_g[row], &p[row * r..][..r], &p[block * r..]);
            // P_ji: column i of this block, read down the rows.
            for (j, (s, &pij)) in s.iter_mut().zip(row_p).enumerate() {
                *s = gi * pij + scaled_g[block + j] * block_p[j * r + i];
            }
        },
    );
    s
}

fn contiguous_slice<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    t.flatten_all()?.to_vec1::<T>()
}

impl CustomOp1 for GramLse {
    fn name(&self) -> &'static str {
        "ssl-gram-off-diagonal-lse"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (softmax, lse) = cpu_softmax(storage, layout, self.tau)?;
        *self.softmax.lock().expect("softmax cache") = Some(softmax);
        let dims = layout.dims();
        Ok((lse, Shape::from(&dims[..dims.len() - 1])))
    }

    fn bwd(&self, x: &Tensor, _lse: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (storage, layout) = x.storage_and_layout();
        let candle_core::Storage::Cpu(storage) = &*storage else {
            candle_core::bail!("ssl-gram-off-diagonal-lse runs on the CPU")
        };
        let cached = self.softmax.lock().expect("softmax cache").take();
        let softmax = match cached {
            Some(softmax) => softmax,
            None => cpu_softmax(storage, layout, self.tau)?.0,
        };
        fn gradient<T: Real>(
            p: &[T],
            storage: &CpuStorage,
            layout: &Layout,
            grad: &Tensor,
            tau: f64,
        ) -> Result<Vec<T>> {
            let (x, batch, r, k) = cpu_blocks::<T>(storage, layout)?;
            let s = symmetric_softmax_gradient(p, &contiguous_slice::<T>(grad)?, r, tau);
            let mut out = vec![T::zero(); batch * r * k];
            for ((s, x), out) in s
                .chunks_exact(r * r)
                .zip(x.chunks_exact(r * k))
                .zip(out.chunks_exact_mut(r * k))
            {
                ssl_linalg::matmul_rows(s, x, (k, 1), (r, k, r), out)?;
            }
            Ok(out)
        }
        let dx = match &softmax {
            CpuStorage::F32(p) => Tensor::from_vec(
                gradient(p, storage, layout, grad, self.tau)?,
                x.shape(),
                x.device(),
            )?,
            CpuStorage::F64(p) => Tensor::from_vec(
                gradient(p, storage, layout, grad, self.tau)?,
                x.shape(),
                x.device(),
            )?,
            _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
        };
        Ok(Some(dx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};
    use ssl_core::testing::randn;

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
    fn fused_gram_matches_composed_value_and_gradient() -> Result<()> {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let base = randn(0f64, 0.5, (2, 4, 9, 6), &Device::Cpu)?.to_dtype(dtype)?;
            // A strided input: the op must make it contiguous itself.
            let x = Var::from_tensor(&base.transpose(2, 3)?)?;
            let w = randn(0f64, 1.0, (2, 4, 6), &Device::Cpu)?.to_dtype(dtype)?;
            let fused = value_and_grad(|x| gram_off_diagonal_logsumexp(x, 0.3), &x, &w)?;
            let composed =
                value_and_grad(|x| off_diagonal_logsumexp(&x.matmul(&x.t()?)?, 0.3), &x, &w)?;
            assert_close(&fused.0, &composed.0, tol);
            assert_close(&fused.1, &composed.1, tol);
        }
        // Gram entries whose exp(m/τ) overflows without the max shift.
        let x = Var::from_tensor(&(randn(0f64, 1.0, (2, 5, 3), &Device::Cpu)? * 30.0)?)?;
        let w = Tensor::ones((2, 5), DType::F64, &Device::Cpu)?;
        let fused = value_and_grad(|x| gram_off_diagonal_logsumexp(x, 0.1), &x, &w)?;
        let composed =
            value_and_grad(|x| off_diagonal_logsumexp(&x.matmul(&x.t()?)?, 0.1), &x, &w)?;
        assert!(fused.0.iter().chain(&fused.1).all(|v| v.is_finite()));
        assert_close(&fused.0, &composed.0, 1e-10);
        assert_close(&fused.1, &composed.1, 1e-10);
        let one_row = Tensor::zeros((1, 5), DType::F32, &Device::Cpu)?;
        assert!(gram_off_diagonal_logsumexp(&one_row, 0.1).is_err());
        Ok(())
    }

    #[test]
    fn rejects_non_square_and_tiny_matrices() {
        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        assert!(off_diagonal_logsumexp(&z(&[3, 4]), 0.1).is_err());
        assert!(off_diagonal_logsumexp(&z(&[1, 1]), 0.1).is_err());
    }
}
