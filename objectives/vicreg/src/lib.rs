//! The VICReg family: VICReg and the duality paper's VICReg-exp and VICReg-ctr.
//!
//! * Bardes, Ponce & LeCun, "VICReg: Variance-Invariance-Covariance Regularization for
//!   Self-Supervised Learning", ICLR 2022 — spec `docs/spec/objectives.md` §2.3, objective
//!   `vicreg` ([`vicreg`](mod@vicreg)).
//! * Garrido, Chen, Bardes, Najman & LeCun, "On the duality between contrastive and
//!   non-contrastive self-supervised learning", ICLR 2023, eq. 12 and appendix pseudocode —
//!   spec §2.4, objective `vicreg-exp` ([`exp`]), and spec §2.5, objective `vicreg-ctr`
//!   ([`ctr`]).
//!
//! All three take `Z`: `[V, B, d]` (view-major, no normalisation) and share the invariance term:
//! the mean over the `V(V−1)/2` view pairs of `mse` (spec §4), computed in `O(V)` by
//! [`pairwise_invariance`]. The regularisers are per view; VICReg weights its covariance term
//! `2/V` (the official two-branch sum), VICReg-exp/-ctr average both regularisers over the views
//! (the pseudocode's `(a + b)/2` at `V = 2`, spec §6.2). Every per-view term is evaluated for all
//! views at once with batched tensor ops. All need B ≥ 2; VICReg-exp and -ctr also need d ≥ 2.
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! and the spec's known answers:
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_vicreg::{vicreg_loss, vicreg_terms, VicregConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let terms = vicreg_terms(&z)?;
//! // (Z_a − Z_b)² holds six ones among its twelve entries.
//! assert!((terms.invariance.to_scalar::<f64>()? - 0.5).abs() < 1e-12);
//! // The paper's weights λ = μ = 25, ν = 1.
//! let loss = vicreg_loss(&z, &VicregConfig::default())?.to_scalar::<f64>()?;
//! assert!((loss - 15.5072337985).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod ctr;
pub mod exp;
mod fused;
pub mod lse;
pub mod vicreg;

pub use ctr::{
    mean_sample_covariance_ctr, mean_sample_variance, sample_covariance_ctr, sample_variance,
    vicreg_ctr_loss, vicreg_ctr_terms, VicregCtr, VicregCtrConfig,
};
pub use exp::{
    covariance_exp, mean_covariance_exp, vicreg_exp_loss, vicreg_exp_terms, VicregExp,
    VicregExpConfig,
};
pub use lse::{gram_off_diagonal_logsumexp, off_diagonal_logsumexp};
pub use vicreg::{
    covariance, invariance, mean_covariance, mean_variance, variance, vicreg_loss, vicreg_terms,
    Vicreg, VicregConfig,
};

use anyhow::Result;
use candle_core::Tensor;
use ssl_core::LossOutput;

/// The three unweighted terms of a VICReg-family loss of `z`: `[V, B, d]`.
pub struct VicregTerms {
    /// Mean over the `V(V−1)/2` view pairs of `mse` ([`pairwise_invariance`]).
    pub invariance: Tensor,
    /// The variance regulariser over the views (VICReg, -exp: per dimension; -ctr: per sample).
    pub variance: Tensor,
    /// The covariance regulariser over the views, scaled as the objective weights it.
    pub covariance: Tensor,
}

impl VicregTerms {
    /// `λ·invariance + μ·variance + ν·covariance`.
    pub fn weighted(&self, lambda: f64, mu: f64, nu: f64) -> candle_core::Result<Tensor> {
        (&self.invariance * lambda)? + (&self.variance * mu)? + (&self.covariance * nu)?
    }

    fn into_output(self, lambda: f64, mu: f64, nu: f64) -> candle_core::Result<LossOutput> {
        Ok(LossOutput::new(self.weighted(lambda, mu, nu)?)
            .with_term("invariance", self.invariance)
            .with_term("variance", self.variance)
            .with_term("covariance", self.covariance))
    }
}

/// Mean over the `V(V−1)/2` view pairs of `mse(Z_u, Z_v)` (spec §4), `z`: `[V, B, d]`, V ≥ 2.
///
/// Uses `Σ_{u<v} ‖Z_u − Z_v‖² = V Σ_v ‖Z_v − Z̄‖²` (`Z̄` the mean view), so the cost is linear in
/// `V`; at `V = 2` it is `mse(Z_a, Z_b)`.
pub fn pairwise_invariance(z: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    if v < 2 {
        candle_core::bail!("the invariance term needs at least 2 views, got {v}");
    }
    // View by view: a broadcast over the view axis would make the backward reduce over it,
    // strided and single-threaded.
    let views = (0..v)
        .map(|view| z.get(view))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let mut view_sum = views[0].clone();
    for view in &views[1..] {
        view_sum = (view_sum + view)?;
    }
    let mean = (view_sum / v as f64)?;
    let mut squares = (&views[0] - &mean)?.sqr()?.sum_all()?;
    for view in &views[1..] {
        squares = (squares + (view - &mean)?.sqr()?.sum_all()?)?;
    }
    squares * (2.0 / ((v - 1) * b * d) as f64)
}

/// Each view of `z`: `[V, B, d]` centred over the batch, dimension-major: `[V, d, B]`,
/// contiguous, so every per-dimension statistic reduces over the last axis (Candle's reductions
/// over a middle axis are strided and single-threaded: they were most of VICReg's loss time).
pub(crate) fn centred_dimensions(z: &Tensor) -> candle_core::Result<Tensor> {
    let dimensions = z.transpose(1, 2)?.contiguous()?;
    dimensions.broadcast_sub(&dimensions.mean_keepdim(2)?)
}

/// Gathers the projections over workers and checks the shape the family needs.
fn gathered(batch: &ssl_core::Batch<'_>, objective: &str, min_dim: usize) -> Result<Tensor> {
    let z = batch.collective.all_gather(batch.projections, 1)?;
    let d = z.dim(2)?;
    anyhow::ensure!(
        d >= min_dim,
        "objective `{objective}` needs a projection width d ≥ {min_dim} (its covariance \
         log-sum-exp runs over off-diagonal entries), got d = {d}"
    );
    Ok(z)
}

fn check_weights(weights: &[(&str, f64)]) -> Result<()> {
    for &(key, value) in weights {
        anyhow::ensure!(
            value.is_finite() && value >= 0.0,
            "`{key}` must be a finite weight ≥ 0, got {value}"
        );
    }
    Ok(())
}

fn check_tau(tau: f64) -> Result<()> {
    anyhow::ensure!(
        tau.is_finite() && tau > 0.0,
        "`tau` must be a finite temperature > 0, got {tau}"
    );
    Ok(())
}

#[cfg(test)]
pub(crate) mod test_util {
    use candle_core::Tensor;
    pub use ssl_core::testing::{close, scalar, spec_za_zb as za_zb};

    /// Rows of an `[N, d]` f64 tensor.
    pub fn rows(z: &Tensor) -> Vec<Vec<f64>> {
        z.to_vec2::<f64>().unwrap()
    }

    /// `(1/R) Σ_i log Σ_{j≠i} exp(m_ij / τ)` with plain loops.
    pub fn naive_offdiag_lse_mean(m: &[Vec<f64>], tau: f64) -> f64 {
        let r = m.len();
        (0..r)
            .map(|i| {
                (0..r)
                    .filter(|&j| j != i)
                    .map(|j| (m[i][j] / tau).exp())
                    .sum::<f64>()
                    .ln()
            })
            .sum::<f64>()
            / r as f64
    }

    /// The registration of `name` documents every default key, and `key` defaults to `value`.
    pub fn assert_documented_defaults(name: &str, defaults: &[(&str, f64)]) {
        let reg = ssl_core::find(name).unwrap();
        let config = ssl_core::testing::documented_defaults(reg.name);
        for &(key, value) in defaults {
            assert_eq!(config[key].as_f64(), Some(value), "default of {key}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use candle_core::Device;
    use ssl_core::testing::randn;

    #[test]
    fn pairwise_invariance_is_the_mean_over_pairs() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z2 = Tensor::stack(&[&a, &b], 0)?;
        close(scalar(&pairwise_invariance(&z2)?), 0.5, 1e-12);
        let z = randn(0f64, 1., (5, 4, 3), &Device::Cpu)?;
        let mut pairs = Vec::new();
        for u in 0..5 {
            for v in u + 1..5 {
                pairs.push(scalar(&invariance(&z.get(u)?, &z.get(v)?)?));
            }
        }
        let naive = pairs.iter().sum::<f64>() / pairs.len() as f64;
        close(scalar(&pairwise_invariance(&z)?), naive, 1e-12);
        assert!(pairwise_invariance(&z.narrow(0, 0, 1)?).is_err());
        Ok(())
    }

    #[test]
    fn off_diagonal_logsumexp_skips_the_diagonal() -> candle_core::Result<()> {
        let m = randn(0f64, 3., (2, 4, 4), &Device::Cpu)?;
        let lse = off_diagonal_logsumexp(&m, 0.1)?.to_vec2::<f64>()?;
        for (v, row_lse) in lse.iter().enumerate() {
            let naive = naive_offdiag_lse_mean(&rows(&m.get(v)?), 0.1);
            close(row_lse.iter().sum::<f64>() / 4.0, naive, 1e-12);
        }
        let one = Tensor::ones((1, 1), candle_core::DType::F64, &Device::Cpu)?;
        assert!(off_diagonal_logsumexp(&one, 0.1).is_err());
        Ok(())
    }
}
