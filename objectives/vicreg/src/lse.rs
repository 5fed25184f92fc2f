//! Row-wise log-sum-exp over the off-diagonal entries of a Gram matrix, fused on the CPU.
//!
//! VICReg-exp takes it over the `d×d` covariance (d = 512 in the main job: 2 × 512² entries per
//! step), VICReg-ctr over the `N×N` sample Gram. Built from Candle's ops it costs the Gram, about
//! ten full passes over it forward and fifteen backward, each allocating, and an `R×R` gradient
//! accumulated by autograd; the fused op is a GEMM and one pass each way (rows spread over
//! Candle's CPU workers, `exp` vectorised). Other devices use the composed ops, which are also the
//! reference the tests hold the fused op to.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, WithDType, D};
use ssl_linalg::for_each_chunk_mut;

/// Added to the masked (diagonal) logits of the composed reference.
const MASKED: f64 = -1e9;

/// Row-wise `lse_{j≠i}(m_ij / τ)` of square matrices `m`: `[…, R, R]` → `[…, R]`, R ≥ 2
/// (spec §2.4/§2.5: the diagonal is left out), from Candle's ops on any device: mask the
/// diagonal, subtract the detached row max, `exp`, sum, `log`.
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
/// autograd's accumulation. Elsewhere it is [`ssl_linalg::gram`] then
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
            gram: Mutex::new(None),
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

/// `exp(x)` in f32, branch-free so that loops over slices of it vectorise (`f32::exp` is a libm
/// call per element and was half of this op's time). Cody–Waite reduction `x = n·ln 2 + r`,
/// |r| ≤ ln 2 / 2, Cephes' polynomial for `eʳ`, and `2ⁿ` applied as two normal powers of two so
/// overflow gives +∞ and underflow gradual denormals then 0, as `f32::exp` does; NaN stays NaN.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding and subtracting it rounds to an integer
    let x = x.clamp(-104.0, 89.0);
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // The integer n sits in the low mantissa bits of `shifted` (a float-to-int cast would be
    // scalarised).
    let n_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_2e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 0.166_666_65)
        * r
        + 0.5;
    let e_r = p * r * r + r + 1.0;
    let power_of_two = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let half = n_int >> 1;
    e_r * power_of_two(half) * power_of_two(n_int - half)
}

/// `values[j] ↦ values[j]/τ − shift` into `out`, then `exp` in place.
fn shifted_exp<T: Real>(values: &[T], inv_tau: T, shift: T, out: &mut [T]) {
    for (o, &v) in out.iter_mut().zip(values) {
        *o = v * inv_tau - shift;
    }
    T::exp_in_place(out);
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

fn forward_rows<T: Real>(m: &[T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    let mut out = vec![T::zero(); m.len() / r];
    for_each_chunk_mut(&mut out, 1, Vec::new, |scratch, row, out| {
        let (before, after) = around_diagonal(&m[row * r..(row + 1) * r], row % r);
        // τ > 0, so the largest logit is the largest entry over τ.
        let max = lane_max(&[lane_max(before), lane_max(after)]) * inv_tau;
        scratch.resize(r - 1, T::zero());
        let (lo, hi) = scratch.split_at_mut(before.len());
        shifted_exp(before, inv_tau, max, lo);
        shifted_exp(after, inv_tau, max, hi);
        out[0] = T::from_f64(lane_sum(scratch).ln() + max.to_f64());
    });
    out
}

/// The fused Gram + off-diagonal log-sum-exp: `[…, R, K]` → `[…, R]`. The forward's Gram is
/// kept for the backward (recomputed if the backward runs without it).
struct GramLse {
    tau: f64,
    gram: Mutex<Option<CpuStorage>>,
}

/// `X Xᵀ` of a contiguous `[…, R, K]` on the CPU: (Gram, R).
fn cpu_gram(storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, usize)> {
    let dims = layout.dims();
    let (rank, r, k) = (dims.len(), dims[dims.len() - 2], dims[dims.len() - 1]);
    let batch = dims[..rank - 2].iter().product();
    let transposed = layout.transpose(rank - 2, rank - 1)?;
    Ok((
        storage.matmul(storage, (batch, r, r, k), layout, &transposed)?,
        r,
    ))
}

/// `S` of [`gram_off_diagonal_logsumexp`]'s backward from the Gram `m`, the forward's `lse` and
/// the incoming gradient `g`, rows in parallel.
fn symmetric_softmax_gradient<T: Real>(m: &[T], lse: &[T], g: &[T], r: usize, tau: f64) -> Vec<T> {
    let inv_tau = T::from_f64(1.0 / tau);
    let scaled_g: Vec<T> = g.iter().map(|&g| g * inv_tau).collect();
    let mut s = vec![T::zero(); m.len()];
    for_each_chunk_mut(&mut s, r, Vec::new, |scratch, row, s| {
        let (block, i) = (row / r * r, row % r);
        let values = &m[row * r..(row + 1) * r];
        // (g_j/τ)·exp(m_ij/τ − lse_j): row i of softmax_j, read down the symmetric column.
        scratch.resize(r, T::zero());
        for ((e, &v), &l) in scratch.iter_mut().zip(values).zip(&lse[block..block + r]) {
            *e = v * inv_tau - l;
        }
        T::exp_in_place(scratch);
        shifted_exp(values, inv_tau, lse[row], s);
        let gi = scaled_g[row];
        for ((s, &e), &gj) in s
            .iter_mut()
            .zip(scratch.iter())
            .zip(&scaled_g[block..block + r])
        {
            *s = gi * *s + gj * e;
        }
        s[i] = T::zero();
    });
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
        let (gram, r) = cpu_gram(storage, layout)?;
        let out = match &gram {
            CpuStorage::F32(m) => CpuStorage::F32(forward_rows(m, r, self.tau)),
            CpuStorage::F64(m) => CpuStorage::F64(forward_rows(m, r, self.tau)),
            _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
        };
        *self.gram.lock().expect("gram cache") = Some(gram);
        let dims = layout.dims();
        Ok((out, Shape::from(&dims[..dims.len() - 1])))
    }

    fn bwd(&self, x: &Tensor, lse: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let cached = self.gram.lock().expect("gram cache").take();
        let gram = match cached {
            Some(gram) => gram,
            None => {
                let (storage, layout) = x.storage_and_layout();
                match &*storage {
                    candle_core::Storage::Cpu(s) => cpu_gram(s, layout)?.0,
                    _ => candle_core::bail!("ssl-gram-off-diagonal-lse runs on the CPU"),
                }
            }
        };
        let r = x.dim(D::Minus2)?;
        let mut shape = x.dims()[..x.rank() - 1].to_vec();
        shape.push(r);
        fn gradient<T: Real>(
            m: &[T],
            lse: &Tensor,
            g: &Tensor,
            r: usize,
            tau: f64,
        ) -> Result<Vec<T>> {
            let (lse, g) = (contiguous_slice::<T>(lse)?, contiguous_slice::<T>(g)?);
            Ok(symmetric_softmax_gradient(m, &lse, &g, r, tau))
        }
        let s = match &gram {
            CpuStorage::F32(m) => {
                Tensor::from_vec(gradient(m, lse, grad, r, self.tau)?, shape, x.device())?
            }
            CpuStorage::F64(m) => {
                Tensor::from_vec(gradient(m, lse, grad, r, self.tau)?, shape, x.device())?
            }
            _ => candle_core::bail!("off-diagonal log-sum-exp supports f32 and f64"),
        };
        Ok(Some(s.matmul(x)?))
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
    fn fused_gram_matches_composed_value_and_gradient() -> Result<()> {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let base = Tensor::randn(0f64, 0.5, (2, 4, 9, 6), &Device::Cpu)?.to_dtype(dtype)?;
            // A strided input: the op must make it contiguous itself.
            let x = Var::from_tensor(&base.transpose(2, 3)?)?;
            let w = Tensor::randn(0f64, 1.0, (2, 4, 6), &Device::Cpu)?.to_dtype(dtype)?;
            let fused = value_and_grad(|x| gram_off_diagonal_logsumexp(x, 0.3), &x, &w)?;
            let composed =
                value_and_grad(|x| off_diagonal_logsumexp(&x.matmul(&x.t()?)?, 0.3), &x, &w)?;
            assert_close(&fused.0, &composed.0, tol);
            assert_close(&fused.1, &composed.1, tol);
        }
        // Gram entries whose exp(m/τ) overflows without the max shift.
        let x = Var::from_tensor(&(Tensor::randn(0f64, 1.0, (2, 5, 3), &Device::Cpu)? * 30.0)?)?;
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
    fn fast_exp_matches_f64_exp_to_a_few_ulp() {
        let mut worst_ulps = 0.0f64;
        for step in 0..2_000_000 {
            let x = -103.0 + step as f32 * 1e-4 * 1.91;
            let (ours, exact) = (exp_f32(x) as f64, (x as f64).exp());
            if exact > f32::MAX as f64 {
                assert_eq!(ours, f64::INFINITY, "exp({x})");
            } else if exact >= f32::MIN_POSITIVE as f64 {
                let ulp = (exact as f32).to_bits();
                let ulp = (f32::from_bits(ulp + 1) - f32::from_bits(ulp)) as f64;
                worst_ulps = worst_ulps.max((ours - exact).abs() / ulp);
            } else {
                assert!(
                    (ours - exact).abs() <= 2.0 * f32::from_bits(1) as f64,
                    "exp({x})"
                );
            }
        }
        assert!(worst_ulps <= 2.0, "{worst_ulps} ulp");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn rejects_non_square_and_tiny_matrices() {
        let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        assert!(off_diagonal_logsumexp(&z(&[3, 4]), 0.1).is_err());
        assert!(off_diagonal_logsumexp(&z(&[1, 1]), 0.1).is_err());
    }
}
