//! SIGReg, the sketched isotropic Gaussian regulariser of LeJEPA (spec `docs/spec/objectives.md`
//! §2.26), and the Epps–Pulley statistic it slices.
//!
//! The Epps–Pulley statistic of a sample `x_1..x_N` measures, in a Gaussian-weighted L2 norm, how
//! far its empirical characteristic function `φ̂(t) = (1/N) Σ_n e^{i t x_n}` is from the standard
//! normal's `φ(t) = e^{−t²/2}`:
//!
//! `T = N ∫_{−R}^{R} |φ̂(t) − φ(t)|² φ(t) dt`.
//!
//! The integrand is even, so the integral is taken on `[0, R]` and doubled ([`Quadrature`]).
//! SIGReg projects `D`-dimensional embeddings on `M` random unit directions and averages the
//! statistic over the directions (and, in LeJEPA, over the views): an isotropic Gaussian scores
//! `O(1)` whatever `N`, a collapsed batch `O(N)`.

use candle_core::{DType, Device, Result, Tensor};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use ssl_core::{Collective, SingleProcess};

/// The trapezoid rule of the official LeJEPA code for `∫_{−R}^{R} f(t) dt` of an even `f`:
/// `K` evenly spaced knots `t_k = kΔ` on `[0, R]`, `Δ = R/(K − 1)`, weights
/// `w = [Δ, 2Δ, …, 2Δ, Δ]` (the trapezoid weights of `[0, R]`, doubled for `[−R, 0]`).
///
/// `K` knots on the half line are the trapezoid rule with `2K − 1` knots on `[−R, R]`; the
/// paper's Algorithm 1 (`linspace(−5, 5, 17)`) is `Quadrature { t_max: 5.0, knots: 9 }`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quadrature {
    /// `R`, the end of the integration range.
    pub t_max: f64,
    /// `K`, knots on `[0, R]` with both ends (≥ 2).
    pub knots: usize,
}

impl Quadrature {
    /// The official code's default (`EppsPulley(t_max=3, n_points=17)`, also IConE-SIG's).
    pub const LEJEPA: Self = Self {
        t_max: 3.0,
        knots: 17,
    };

    /// A checked quadrature: `t_max` finite and positive, at least 2 knots.
    pub fn new(t_max: f64, knots: usize) -> Result<Self> {
        if !(t_max.is_finite() && t_max > 0.0) {
            candle_core::bail!("the Epps–Pulley range t_max must be finite and > 0, got {t_max}");
        }
        if knots < 2 {
            candle_core::bail!("the Epps–Pulley quadrature needs at least 2 knots, got {knots}");
        }
        Ok(Self { t_max, knots })
    }

    /// The knot spacing `Δ = R/(K − 1)`.
    pub fn step(&self) -> f64 {
        self.t_max / (self.knots - 1) as f64
    }

    /// `(t_k, W_k = w_k φ(t_k), φ(t_k))` for `k = 1..K−1`. The `k = 0` knot is left out: there
    /// `φ̂ = φ = 1` exactly, so it adds nothing to the statistic or its gradient.
    fn nonzero_knots(&self) -> Vec<(f64, f64, f64)> {
        let delta = self.step();
        (1..self.knots)
            .map(|k| {
                let t = k as f64 * delta;
                let w = if k == self.knots - 1 {
                    delta
                } else {
                    2.0 * delta
                };
                let phi = (-t * t / 2.0).exp();
                (t, w * phi, phi)
            })
            .collect()
    }
}

impl Default for Quadrature {
    fn default() -> Self {
        Self::LEJEPA
    }
}

/// `cos(kΔx)`, `sin(kΔx)` for `k = 1, 2, …` from one cosine and one sine of `Δx` by angle
/// addition (the knots are evenly spaced), elementwise on a detached `x`.
struct Harmonics {
    cos_1: Tensor,
    sin_1: Tensor,
}

impl Harmonics {
    fn new(x: &Tensor, step: f64) -> Result<Self> {
        let theta = (x.detach() * step)?;
        Ok(Self {
            cos_1: theta.cos()?,
            sin_1: theta.sin()?,
        })
    }

    /// Calls `visit(k, cos(kΔx), sin(kΔx))` for `k = 1..=count` in order.
    fn for_each(
        &self,
        count: usize,
        mut visit: impl FnMut(usize, &Tensor, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let (mut cos_k, mut sin_k) = (self.cos_1.clone(), self.sin_1.clone());
        for k in 1..=count {
            if k > 1 {
                let next_cos = ((&cos_k * &self.cos_1)? - (&sin_k * &self.sin_1)?)?;
                sin_k = ((&sin_k * &self.cos_1)? + (&cos_k * &self.sin_1)?)?;
                cos_k = next_cos;
            }
            visit(k, &cos_k, &sin_k)?;
        }
        Ok(())
    }
}

/// The Epps–Pulley statistic of every column of every view of `x`: `[V, N, M]` → `[V, M]`,
/// with the empirical characteristic function taken over the **global** batch of `collective`
/// (every worker holding `N` rows):
///
/// `T_vm = N_g Σ_k W_k [(C̄_vmk − φ_k)² + S̄_vmk²]`, `N_g = N·world_size`,
/// `C̄_vmk = (1/N_g) Σ_n cos(t_k x_vnm)`, `S̄_vmk = (1/N_g) Σ_n sin(t_k x_vnm)` (sums over every
/// worker's rows), `W_k = w_k e^{−t_k²/2}`, `φ_k = e^{−t_k²/2}` ([`Quadrature`]).
///
/// Only the sums `Σ_n cos`, `Σ_n sin` (`[2(K−1), V, M]`) cross workers, the all-reduce of the
/// official code. The gradient with respect to the local rows,
/// `∂T_vm/∂x_vnm = 2 Σ_k W_k t_k [S̄_vmk cos(t_k x_vnm) − (C̄_vmk − φ_k) sin(t_k x_vnm)]`, is formed
/// from the same cosines and sines and attached through a linear surrogate (exact to first
/// order, which is all backpropagation uses). On one process it is accumulated in the sweep that
/// computes the means; across workers the means are known only after the gather, so a second
/// sweep recomputes the cosines and sines rather than storing `K` of them.
///
/// Across workers the local rows get `world_size ·` that gradient, as a [`Collective`]'s
/// gather gives them (its backward sums every worker's gradient of the same global statistic):
/// the trainer's mean of the parameter gradients over the workers then brings it back to the
/// gradient of one process on the global batch.
///
/// On one CPU process the value and gradient come from [`fused_sweeps`]; elsewhere, and in the
/// tests that check the two agree, from [`epps_pulley_composed`].
pub fn epps_pulley_views(
    x: &Tensor,
    quadrature: &Quadrature,
    collective: &dyn Collective,
) -> Result<Tensor> {
    let fused = collective.world_size() == 1
        && x.device().is_cpu()
        && matches!(x.dtype(), DType::F32 | DType::F64);
    if !fused {
        return epps_pulley_composed(x, quadrature, collective);
    }
    let x = x.contiguous()?;
    let (value, gradient) = match x.dtype() {
        DType::F32 => fused_tensors::<f32>(&x, quadrature)?,
        _ => fused_tensors::<f64>(&x, quadrature)?,
    };
    attach(&x, &gradient, value)
}

/// [`fused_sweeps`] of `x`: `[V, N, M]`, contiguous, of dtype `T`, as tensors beside it.
fn fused_tensors<T: Trig>(x: &Tensor, quadrature: &Quadrature) -> Result<(Tensor, Tensor)> {
    let (v, n, m) = x.dims3()?;
    let values = x.flatten_all()?.to_vec1::<T>()?;
    let (value, gradient) = fused_sweeps(&values, (v, n, m), quadrature);
    Ok((
        Tensor::from_vec(value, (v, m), x.device())?,
        Tensor::from_vec(gradient, (v, n, m), x.device())?,
    ))
}

/// `value`, carrying `∂/∂x = gradient` through a linear surrogate (exact to first order, which is
/// all backpropagation uses).
fn attach(x: &Tensor, gradient: &Tensor, value: Tensor) -> Result<Tensor> {
    let linear = (x * gradient)?.sum(1)?;
    (&linear - linear.detach())? + value
}

/// The float types [`fused_sweeps`] runs in.
trait Trig: candle_core::WithDType {
    fn cos_sin(self) -> (Self, Self);
}

impl Trig for f32 {
    fn cos_sin(self) -> (f32, f32) {
        let (sin, cos) = self.sin_cos();
        (cos, sin)
    }
}

impl Trig for f64 {
    fn cos_sin(self) -> (f64, f64) {
        let (sin, cos) = self.sin_cos();
        (cos, sin)
    }
}

/// The statistic `[V, M]` of [`epps_pulley_views`] on one process, and its gradient
/// `[V, N, M]`, in two sweeps over `x`: `[V, N, M]` (row-major), each sample's cosines and
/// sines at the knots made by angle addition from one cosine and one sine, a row of `M` values
/// at a time. The first sweep sums them over the samples; the second forms the gradient from
/// the same harmonics and the means. The Candle-op form ([`epps_pulley_composed`]) makes about a
/// dozen `[V, N, M]` tensors a knot (LeJEPA's defaults: 192 of 1 MB a step, 67 ms of the
/// digits step's loss).
fn fused_sweeps<T: Trig>(
    x: &[T],
    (v, n, m): (usize, usize, usize),
    quadrature: &Quadrature,
) -> (Vec<T>, Vec<T>) {
    let knots = quadrature.nonzero_knots();
    let cast = |f: f64| T::from_f64(f);
    let step = cast(quadrature.step());
    let zero = cast(0.0);
    let mut value = vec![zero; v * m];
    let mut gradient = vec![zero; v * n * m];
    // Per knot, the sums of cos and sin over the samples, then the gradient's coefficients.
    let mut sums = vec![[zero; 2]; knots.len() * m];
    let (mut first, mut current) = (vec![[zero; 2]; m], vec![[zero; 2]; m]);
    // Calls `visit(k, row of [cos, sin] at knot k)` for knots k = 0.. of sample row `row`.
    let mut harmonics = |row: &[T], visit: &mut dyn FnMut(usize, &[[T; 2]])| {
        for (f, &value) in first.iter_mut().zip(row) {
            let (cos, sin) = (value * step).cos_sin();
            *f = [cos, sin];
        }
        current.copy_from_slice(&first);
        for k in 0..knots.len() {
            if k > 0 {
                for (c, f) in current.iter_mut().zip(&first) {
                    *c = [c[0] * f[0] - c[1] * f[1], c[1] * f[0] + c[0] * f[1]];
                }
            }
            visit(k, &current);
        }
    };
    let n_samples = cast(n as f64);
    for view in 0..v {
        let rows = &x[view * n * m..][..n * m];
        sums.fill([zero; 2]);
        for row in rows.chunks(m) {
            harmonics(row, &mut |k, cs| {
                for (sum, c) in sums[k * m..][..m].iter_mut().zip(cs) {
                    sum[0] += c[0];
                    sum[1] += c[1];
                }
            });
        }
        // The value, and in place of the sums the coefficients of cos and sin in the gradient.
        let value = &mut value[view * m..][..m];
        for (k, &(t, weight, phi)) in knots.iter().enumerate() {
            let (share, scale) = (cast(weight * n as f64), cast(2.0 * weight * t));
            for (sum, total) in sums[k * m..][..m].iter_mut().zip(value.iter_mut()) {
                let real = sum[0] / n_samples - cast(phi);
                let imaginary = sum[1] / n_samples;
                *total += (real * real + imaginary * imaginary) * share;
                *sum = [imaginary * scale, zero - real * scale];
            }
        }
        let gradient = &mut gradient[view * n * m..][..n * m];
        for (row, out) in rows.chunks(m).zip(gradient.chunks_mut(m)) {
            harmonics(row, &mut |k, cs| {
                for ((g, c), coefficient) in out.iter_mut().zip(cs).zip(&sums[k * m..][..m]) {
                    *g += c[0] * coefficient[0] + c[1] * coefficient[1];
                }
            });
        }
    }
    (value, gradient)
}

/// [`epps_pulley_views`] as Candle ops, on any device and any number of workers.
fn epps_pulley_composed(
    x: &Tensor,
    quadrature: &Quadrature,
    collective: &dyn Collective,
) -> Result<Tensor> {
    let (v, n, m) = x.dims3()?;
    let knots = quadrature.nonzero_knots();
    let harmonics = Harmonics::new(x, quadrature.step())?;
    let n_global = (n * collective.world_size()) as f64;
    let mut value = Tensor::zeros((v, m), x.dtype(), x.device())?;
    let mut gradient = Tensor::zeros((v, n, m), x.dtype(), x.device())?;
    // Knot `k`'s share of the value, and its coefficients of cos(t_k x) and sin(t_k x) in the
    // gradient (`[V, 1, M]`), from the global means `C̄_k`, `S̄_k` (`[V, M]`).
    let knot_terms = |k: usize, cos_mean: &Tensor, sin_mean: &Tensor| -> Result<[Tensor; 3]> {
        let (t, weight, phi) = knots[k - 1];
        let real = (cos_mean - phi)?;
        let error = (real.sqr()? + sin_mean.sqr()?)?;
        let scale = 2.0 * weight * t;
        Ok([
            (error * (weight * n_global))?,
            (sin_mean * scale)?.unsqueeze(1)?,
            (real * -scale)?.unsqueeze(1)?,
        ])
    };
    let gradient_term = |cos_k: &Tensor, sin_k: &Tensor, of_cos: &Tensor, of_sin: &Tensor| {
        cos_k.broadcast_mul(of_cos)? + sin_k.broadcast_mul(of_sin)?
    };
    if collective.world_size() == 1 {
        harmonics.for_each(knots.len(), |k, cos_k, sin_k| {
            let [share, of_cos, of_sin] = knot_terms(k, &cos_k.mean(1)?, &sin_k.mean(1)?)?;
            value = (&value + share)?;
            gradient = (&gradient + gradient_term(cos_k, sin_k, &of_cos, &of_sin)?)?;
            Ok(())
        })?;
    } else {
        let mut local_sums = Vec::with_capacity(2 * knots.len());
        harmonics.for_each(knots.len(), |_, cos_k, sin_k| {
            local_sums.push(cos_k.sum(1)?);
            local_sums.push(sin_k.sum(1)?);
            Ok(())
        })?;
        let local_sums = Tensor::stack(&local_sums, 0)?;
        let global_sums = collective
            .all_gather(&local_sums.unsqueeze(0)?, 0)?
            .sum(0)?;
        let means = (global_sums / n_global)?;
        let mut coefficients = Vec::with_capacity(knots.len());
        for k in 1..=knots.len() {
            let [share, of_cos, of_sin] =
                knot_terms(k, &means.get(2 * k - 2)?, &means.get(2 * k - 1)?)?;
            value = (&value + share)?;
            coefficients.push((of_cos, of_sin));
        }
        harmonics.for_each(knots.len(), |k, cos_k, sin_k| {
            let (of_cos, of_sin) = &coefficients[k - 1];
            gradient = (&gradient + gradient_term(cos_k, sin_k, of_cos, of_sin)?)?;
            Ok(())
        })?;
        gradient = (gradient * collective.world_size() as f64)?;
    }
    attach(x, &gradient, value)
}

/// The Epps–Pulley statistic of each column of `x`: `[N, M]` → `[M]`, on one process with
/// [`Quadrature::LEJEPA`] (`R = 3`, 17 knots): [`epps_pulley_views`] of a single view.
pub fn epps_pulley(x: &Tensor) -> Result<Tensor> {
    epps_pulley_views(&x.unsqueeze(0)?, &Quadrature::LEJEPA, &SingleProcess)?.squeeze(0)
}

/// `M` directions `a_m ~ N(0, I_d)` scaled to unit length, as the columns of `[d, M]` (f32).
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

/// SIGReg of LeJEPA: `(1/(V·M)) Σ_v Σ_m T(z_v a_m)` of the views `z`: `[V, B, D]` projected on
/// the unit `directions`: `[D, M]`, every view tested on its own against `N(0, 1)` on the same
/// directions, the characteristic function over the global batch of `collective` (the paper's
/// `mean(SIGReg(emb) for emb in views)`). The embeddings are used as they are, neither centred
/// nor standardised.
pub fn sigreg(
    z: &Tensor,
    directions: &Tensor,
    quadrature: &Quadrature,
    collective: &dyn Collective,
) -> Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    let (rows, m) = directions.dims2()?;
    if rows != d {
        candle_core::bail!(
            "SIGReg directions are [{rows}, {m}] but the embeddings are {d}-dimensional; draw \
             them as [D, M] = [{d}, {m}]"
        );
    }
    let projected = z
        .reshape((v * b, d))?
        .matmul(&directions.to_dtype(z.dtype())?)?
        .reshape((v, b, m))?;
    epps_pulley_views(&projected, quadrature, collective)?.mean_all()
}

/// IConE-SIG's regulariser: `(1/M) Σ_m T_m` of the raw table `e`: `[N, d]`, standardised per
/// dimension (std with `N−1`), projected on the unit `directions`: `[d, M]`, on one process with
/// [`Quadrature::LEJEPA`]. Unlike [`sigreg`] (LeJEPA's), the columns are standardised first, so
/// only the shape of the distribution is tested, not its mean and scale.
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
    fn sliced_epps_pulley_gradient_matches_finite_differences() -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let raw: Vec<f64> = (0..7 * 3)
            .map(|_| StandardNormal.sample(&mut rng))
            .collect();
        let e = Tensor::from_vec(raw, (7, 3), &Device::Cpu)?;
        let dirs = random_directions(3, 5, &mut rng, &Device::Cpu)?.to_dtype(DType::F64)?;
        assert!(max_gradient_error(&e, |x| sliced_epps_pulley(x, &dirs))? < 1e-6);
        Ok(())
    }

    /// The fused sweeps give the Candle-op form's value and gradient, in f64 to rounding and in
    /// f32 to f32's, over views, samples, slices and knot counts of several sizes.
    #[test]
    fn the_fused_sweeps_equal_the_composed_form() -> Result<()> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for (dims, quadrature) in [
            ((1, 6, 1), Quadrature::LEJEPA),
            ((2, 9, 5), Quadrature::LEJEPA),
            ((3, 4, 7), Quadrature::new(5.0, 41)?),
            ((2, 33, 3), Quadrature::new(1.0, 2)?),
        ] {
            let (v, n, m) = dims;
            let raw: Vec<f64> = (0..v * n * m)
                .map(|_| 1.5 * Distribution::<f64>::sample(&StandardNormal, &mut rng))
                .collect();
            for (dtype, tolerance) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                let x = candle_core::Var::from_tensor(
                    &Tensor::from_vec(raw.clone(), dims, &Device::Cpu)?.to_dtype(dtype)?,
                )?;
                let weights = Tensor::from_vec(
                    (0..v * m)
                        .map(|i| 1.0 + i as f64 / 10.0)
                        .collect::<Vec<_>>(),
                    (v, m),
                    &Device::Cpu,
                )?
                .to_dtype(dtype)?;
                let mut results = Vec::new();
                for fused in [true, false] {
                    let statistic = match fused {
                        true => epps_pulley_views(&x, &quadrature, &SingleProcess)?,
                        false => epps_pulley_composed(&x, &quadrature, &SingleProcess)?,
                    };
                    let loss = (&statistic * &weights)?.sum_all()?;
                    let gradient = loss.backward()?.get(&x).expect("a gradient").clone();
                    results.push([statistic, gradient].map(|t| {
                        t.to_dtype(DType::F64)
                            .and_then(|t| t.flatten_all())
                            .and_then(|t| t.to_vec1::<f64>())
                    }));
                }
                let [fused, composed] = [results.remove(0), results.remove(0)];
                for (what, (a, b)) in ["value", "gradient"]
                    .iter()
                    .zip(fused.into_iter().zip(composed))
                {
                    let (a, b) = (a?, b?);
                    let scale = b.iter().fold(1f64, |s, v| s.max(v.abs()));
                    let worst = a
                        .iter()
                        .zip(&b)
                        .fold(0f64, |w, (a, b)| w.max((a - b).abs()));
                    assert!(
                        worst <= tolerance * scale,
                        "{dims:?} {dtype:?} {what}: {worst} of {scale}"
                    );
                }
            }
        }
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

    #[test]
    fn the_recurrence_matches_direct_cosines_and_sines_over_many_knots() -> Result<()> {
        // 41 knots on [0, 5] (the paper's largest ablation), angles up to 5·4 = 20 rad.
        let x = Tensor::new(&[[-4f64, 0.3, 2.5, 4.0]], &Device::Cpu)?;
        let q = Quadrature::new(5.0, 41)?;
        let mut worst = 0f64;
        Harmonics::new(&x, q.step())?.for_each(40, |k, cos_k, sin_k| {
            let t = k as f64 * q.step();
            let direct = ((&x * t)?.cos()?, (&x * t)?.sin()?);
            for (a, b) in [(cos_k, &direct.0), (sin_k, &direct.1)] {
                let error = (a - b)?.abs()?.max_all()?.to_scalar::<f64>()?;
                worst = worst.max(error);
            }
            Ok(())
        })?;
        assert!(worst < 1e-13, "{worst}");
        Ok(())
    }

    #[test]
    fn quadrature_weights_integrate_the_gaussian_window() -> Result<()> {
        // Σ_k W_k over all knots ≈ ∫_{−R}^{R} e^{−t²/2} dt = √(2π)·erf(R/√2); at R = 5 the tail
        // is 6e-7 and the trapezoid error of 17 knots far smaller.
        let q = Quadrature::new(5.0, 17)?;
        let sum = q.step() + q.nonzero_knots().iter().map(|k| k.1).sum::<f64>();
        close(sum, (2.0 * std::f64::consts::PI).sqrt(), 1e-6);
        for (t_max, knots) in [(0.0, 17), (f64::NAN, 17), (3.0, 1)] {
            assert!(Quadrature::new(t_max, knots).is_err(), "{t_max}, {knots}");
        }
        Ok(())
    }
}
