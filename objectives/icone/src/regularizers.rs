//! The replacements for `L_div` of IConE Appendix C.1 (spec `docs/spec/objectives.md` §2.1), both
//! on the whole table.
//!
//! * IConE-VC (eq. 8): VICReg's variance hinge and covariance penalty on the row-normalised table
//!   `Ẽ: [N, d]`, as **sums** over dimensions (no `1/d`).
//! * IConE-SIG: the sliced Epps–Pulley test of LeJEPA's SIGReg on the per-dimension standardised
//!   raw table, `M` fresh unit directions per step.

use candle_core::{Device, Result, Tensor};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

/// `Σ_j max(0, γ − sqrt(var_u(Ẽ_{:,j}) + ε))` of `e`: `[N, d]`.
pub fn variance_hinge(e: &Tensor, gamma: f64, eps: f64) -> Result<Tensor> {
    let n = e.dim(0)? as f64;
    let centred = e.broadcast_sub(&e.mean_keepdim(0)?)?;
    let var = (centred.sqr()?.sum(0)? / (n - 1.0))?;
    ((var + eps)?.sqrt()?.neg()? + gamma)?.relu()?.sum_all()
}

/// `Σ_{i≠j} Cov(Ẽ)_{ij}²` with `Cov = (Ẽ−mean)ᵀ(Ẽ−mean)/(N−1)` of `e`: `[N, d]`.
pub fn covariance_penalty(e: &Tensor) -> Result<Tensor> {
    let n = e.dim(0)? as f64;
    let centred = e.broadcast_sub(&e.mean_keepdim(0)?)?;
    let cov = (centred.t()?.matmul(&centred)? / (n - 1.0))?;
    let diagonal = (centred.sqr()?.sum(0)? / (n - 1.0))?;
    cov.sqr()?.sum_all()? - diagonal.sqr()?.sum_all()?
}

/// Knots `t_k = kR/16`, `k = 0..16`, with `R = 3`, and the trapezoid weights times the Gaussian
/// window, `w_k e^{−t_k²/2}` with `w = [Δ, 2Δ, …, 2Δ, Δ]`, `Δ = R/16` (the factor 2 of the
/// half-line integral included).
fn quadrature() -> ([f64; 17], [f64; 17]) {
    let delta = 3.0 / 16.0;
    let mut knots = [0.0; 17];
    let mut weights = [0.0; 17];
    for k in 0..17 {
        let t = k as f64 * delta;
        let w = if k == 0 || k == 16 {
            delta
        } else {
            2.0 * delta
        };
        knots[k] = t;
        weights[k] = w * (-t * t / 2.0).exp();
    }
    (knots, weights)
}

/// The Epps–Pulley statistic of each column of `x`: `[N, M]` → `[M]`,
/// `T_m = N Σ_k W_k [(C̄_mk − φ_k)² + S̄_mk²]` with `W_k = w_k e^{−t_k²/2}`, `φ_k = e^{−t_k²/2}`,
/// `C̄_mk = mean_n cos(t_k x_nm)`, `S̄_mk = mean_n sin(t_k x_nm)`.
///
/// The knots are equally spaced (`t_k = kΔ`), so `cos(t_k x)`, `sin(t_k x)` follow from
/// `cos(Δx)`, `sin(Δx)` by angle addition: one cosine and one sine per point instead of 17 each.
/// The gradient is formed from the same values,
/// `∂T_m/∂x_nm = 2 Σ_k W_k t_k [S̄_mk cos(t_k x_nm) − (C̄_mk − φ_k) sin(t_k x_nm)]`, and attached
/// through a linear surrogate per column (first order). The `k = 0` knot contributes nothing
/// (`C̄ = φ = 1`, `S̄ = 0`).
pub fn epps_pulley(x: &Tensor) -> Result<Tensor> {
    let (n, m) = x.dims2()?;
    let (knots, weights) = quadrature();
    let theta = (x.detach() * knots[1])?;
    let (cos_1, sin_1) = (theta.cos()?, theta.sin()?);
    let (mut cos_k, mut sin_k) = (cos_1.clone(), sin_1.clone());
    let mut value = Tensor::zeros(m, x.dtype(), x.device())?;
    let mut gradient = Tensor::zeros((n, m), x.dtype(), x.device())?;
    for k in 1..knots.len() {
        if k > 1 {
            let next_cos = ((&cos_k * &cos_1)? - (&sin_k * &sin_1)?)?;
            sin_k = ((&sin_k * &cos_1)? + (&cos_k * &sin_1)?)?;
            cos_k = next_cos;
        }
        let target = (-knots[k] * knots[k] / 2.0).exp();
        let real = (cos_k.mean_keepdim(0)? - target)?;
        let imag = sin_k.mean_keepdim(0)?;
        value = (value + ((real.sqr()? + imag.sqr()?)?.squeeze(0)? * (weights[k] * n as f64))?)?;
        let scale = 2.0 * weights[k] * knots[k];
        let term = (cos_k.broadcast_mul(&imag)? - sin_k.broadcast_mul(&real)?)?;
        gradient = (gradient + (term * scale)?)?;
    }
    let linear = (x * gradient)?.sum(0)?;
    (&linear - linear.detach())? + value
}

/// `M` directions `a_m ~ N(0, I_d)` scaled to unit length, as the columns of `[d, M]`.
pub fn random_directions(
    d: usize,
    m: usize,
    rng: &mut impl Rng,
    device: &Device,
) -> Result<Tensor> {
    let mut a: Vec<f32> = (0..d * m).map(|_| StandardNormal.sample(rng)).collect();
    for col in 0..m {
        let norm = (0..d)
            .map(|r| a[r * m + col].powi(2))
            .sum::<f32>()
            .sqrt()
            .max(1e-12);
        for r in 0..d {
            a[r * m + col] /= norm;
        }
    }
    Tensor::from_vec(a, (d, m), device)
}

/// `L_sig = (1/M) Σ_m T_m` of the raw table `e`: `[N, d]`, standardised per dimension (std with
/// `N−1`), projected on the unit `directions`: `[d, M]`.
pub fn sliced_epps_pulley(e: &Tensor, directions: &Tensor) -> Result<Tensor> {
    let n = e.dim(0)? as f64;
    let centred = e.broadcast_sub(&e.mean_keepdim(0)?)?;
    let std = (centred.sqr()?.sum_keepdim(0)? / (n - 1.0))?.sqrt()?;
    let standardized = centred.broadcast_div(&std)?;
    let projections = standardized.matmul(&directions.to_dtype(e.dtype())?)?;
    epps_pulley(&projections)?.mean_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use rand::SeedableRng;
    use ssl_core::testing::{close, max_gradient_error, scalar};

    fn spec_table() -> Result<Tensor> {
        let e = Tensor::new(&[[1f64, 0., 1.], [0., 1., 0.], [1., 1., 0.]], &Device::Cpu)?;
        ssl_linalg::normalize_rows(&e)
    }

    #[test]
    fn icone_vc_known_answers() -> Result<()> {
        // Spec §2.1: variance term 1.6690622995, covariance term 0.1412718455.
        let e = spec_table()?;
        close(scalar(&variance_hinge(&e, 1.0, 1e-4)?), 1.6690622995, 1e-9);
        close(scalar(&covariance_penalty(&e)?), 0.1412718455, 1e-9);
        Ok(())
    }

    #[test]
    fn epps_pulley_known_answer() -> Result<()> {
        // Spec §2.1: one slice x = [−1.5, −0.5, 0, 0.5, 1.5, 0.3] → T = 0.0442304216.
        let x = Tensor::new(
            &[[-1.5f64], [-0.5], [0.0], [0.5], [1.5], [0.3]],
            &Device::Cpu,
        )?;
        close(scalar(&epps_pulley(&x)?.get(0)?), 0.0442304216, 1e-8);
        Ok(())
    }

    #[test]
    fn epps_pulley_is_small_for_gaussian_samples_and_large_for_a_point_mass() -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let gauss: Vec<f64> = (0..4000).map(|_| StandardNormal.sample(&mut rng)).collect();
        let gauss =
            scalar(&epps_pulley(&Tensor::from_vec(gauss, (4000, 1), &Device::Cpu)?)?.get(0)?);
        let point =
            scalar(&epps_pulley(&Tensor::zeros((4000, 1), DType::F64, &Device::Cpu)?)?.get(0)?);
        // Under normality N·E|φ̂ − φ|² stays O(1) whatever N; a point mass grows like N.
        assert!(
            gauss < 2.0 && point > 100.0,
            "gaussian {gauss}, point mass {point}"
        );
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let raw: Vec<f64> = (0..7 * 3)
            .map(|_| StandardNormal.sample(&mut rng))
            .collect();
        let e = Tensor::from_vec(raw, (7, 3), &Device::Cpu)?;
        let dirs = random_directions(3, 5, &mut rng, &Device::Cpu)?.to_dtype(DType::F64)?;
        let vc = |x: &Tensor| {
            let x = ssl_linalg::normalize_rows(x)?;
            variance_hinge(&x, 1.0, 1e-4)? + covariance_penalty(&x)?
        };
        assert!(max_gradient_error(&e, vc)? < 1e-6);
        assert!(max_gradient_error(&e, |x| sliced_epps_pulley(x, &dirs))? < 1e-6);
        Ok(())
    }

    #[test]
    fn directions_have_unit_length() -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let a = random_directions(16, 8, &mut rng, &Device::Cpu)?;
        for norm in a.sqr()?.sum(0)?.sqrt()?.to_vec1::<f32>()? {
            assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        }
        Ok(())
    }
}
