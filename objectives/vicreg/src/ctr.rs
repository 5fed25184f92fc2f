//! VICReg-ctr (spec `docs/spec/objectives.md` §2.5, duality paper pseudocode): the variance and
//! covariance regularisers act on the transposed embeddings, which makes the method
//! sample-contrastive. Per view `Z`: `[N, d]`:
//! * `v = (1/N) Σ_i relu(1 − sqrt(var_u(Z_{i,:}) + 1e-4))`, the variance over the `d` coordinates
//!   of sample `i` (divided by `d − 1`);
//! * `G = Z_c Z_cᵀ / (N − 1)`, `Z_c` = every sample centred by its own coordinate mean; the
//!   pseudocode divides by `N − 1` although the sum runs over `d` coordinates — kept, as the spec
//!   says (it only rescales τ);
//! * `c = (1/N) Σ_i lse_{j≠i}(G_{ij} / τ)`.
//!
//! `L = λ·inv + μ·(1/V)Σ_v v(Z_v) + ν·(1/V)Σ_v c(Z_v)` (at V = 2: `(a + b)/2`, the pseudocode).
//! Needs B ≥ 2 (off-diagonal Gram entries) and d ≥ 2 (per-sample unbiased variance).

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

use crate::{
    check_tau, check_weights, gathered, gram_off_diagonal_logsumexp, pairwise_invariance,
    VicregTerms,
};

/// Every sample (row, last axis) centred by its own mean over the coordinates.
fn centre_samples(z: &Tensor) -> candle_core::Result<Tensor> {
    z.broadcast_sub(&z.mean_keepdim(candle_core::D::Minus1)?)
}

/// `(1/V) Σ_v v_ctr(Z_v)`, the per-sample variance hinge, for `z`: `[V, B, d]`, d ≥ 2.
pub fn mean_sample_variance(z: &Tensor) -> candle_core::Result<Tensor> {
    let (_, _, d) = z.dims3()?;
    if d < 2 {
        candle_core::bail!("the per-sample variance needs d ≥ 2 coordinates, got d = {d}");
    }
    let var = (centre_samples(z)?.sqr()?.sum(2)? / (d as f64 - 1.0))?;
    (1.0 - (var + 1e-4)?.sqrt()?)?.relu()?.mean_all()
}

/// `v = (1/N) Σ_i relu(1 − sqrt(var_u(Z_{i,:}) + 1e-4))` for one view `z`: `[N, d]` (spec §2.5
/// step 2).
pub fn sample_variance(z: &Tensor) -> candle_core::Result<Tensor> {
    mean_sample_variance(&z.unsqueeze(0)?)
}

/// `(1/V) Σ_v c_ctr(Z_v)` for `z`: `[V, B, d]`, B ≥ 2.
pub fn mean_sample_covariance_ctr(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let (_, n, _) = z.dims3()?;
    gram_off_diagonal_logsumexp(&centre_samples(z)?, tau * (n as f64 - 1.0))?.mean_all()
}

/// `c = (1/N) Σ_i lse_{j≠i}(G_{ij} / τ)`, `G = Z_c Z_cᵀ/(N − 1)`, for one view `z`: `[N, d]`
/// (spec §2.5 steps 3–5).
pub fn sample_covariance_ctr(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    mean_sample_covariance_ctr(&z.unsqueeze(0)?, tau)
}

/// The unweighted VICReg-ctr terms of `z`: `[V, B, d]`, V ≥ 2: pair-mean invariance,
/// `(1/V) Σ_v v_ctr(Z_v)` and `(1/V) Σ_v c_ctr(Z_v)`.
pub fn vicreg_ctr_terms(z: &Tensor, tau: f64) -> candle_core::Result<VicregTerms> {
    Ok(VicregTerms {
        invariance: pairwise_invariance(z)?,
        variance: mean_sample_variance(z)?,
        covariance: mean_sample_covariance_ctr(z, tau)?,
    })
}

/// `λ·inv + μ·var_ctr + ν·cov_ctr` for `z`: `[V, B, d]`.
pub fn vicreg_ctr_loss(z: &Tensor, cfg: &VicregCtrConfig) -> candle_core::Result<Tensor> {
    vicreg_ctr_terms(z, cfg.tau)?.weighted(cfg.lambda, cfg.mu, cfg.nu)
}

/// VICReg-ctr hyper-parameters (duality paper Table S6: λ = μ = ν = 1, τ = 0.15).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VicregCtrConfig {
    /// Invariance weight λ.
    pub lambda: f64,
    /// Weight μ of the per-sample variance term.
    pub mu: f64,
    /// Weight ν of the sample-Gram log-sum-exp term.
    pub nu: f64,
    /// Temperature τ dividing the Gram entries.
    pub tau: f64,
}

impl Default for VicregCtrConfig {
    fn default() -> Self {
        Self {
            lambda: 1.0,
            mu: 1.0,
            nu: 1.0,
            tau: 0.15,
        }
    }
}

impl ObjectiveConfig for VicregCtrConfig {
    fn validate(&self) -> Result<()> {
        check_weights(&[("lambda", self.lambda), ("mu", self.mu), ("nu", self.nu)])?;
        check_tau(self.tau)
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(VicregCtr(self.clone())))
    }
}

/// The VICReg-ctr objective.
pub struct VicregCtr(pub VicregCtrConfig);

impl Objective for VicregCtr {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "the covariance term contrasts each sample with the other samples \
                               of the batch",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = gathered(batch, "vicreg-ctr", 2)?;
        let c = &self.0;
        Ok(vicreg_ctr_terms(&z, c.tau)?.into_output(c.lambda, c.mu, c.nu)?)
    }
}

register_objective! {
    name: "vicreg-ctr",
    aliases: &["vicreg_ctr"],
    summary: "VICReg applied to the transposed embeddings (sample-contrastive, duality paper)",
    paper: "Garrido, Chen, Bardes, Najman, LeCun. On the duality between contrastive and non-contrastive self-supervised learning. ICLR 2023",
    keys: &[
        ConfigKey { name: "lambda", doc: "invariance weight λ (mean over view pairs)" },
        ConfigKey { name: "mu", doc: "weight μ of the per-sample variance term (averaged over views)" },
        ConfigKey { name: "nu", doc: "weight ν of the sample-Gram log-sum-exp (averaged over views)" },
        ConfigKey { name: "tau", doc: "temperature τ > 0 dividing the Gram entries" },
    ],
    config: VicregCtrConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariance;
    use crate::test_util::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    /// Spec §2.5 steps 1–5 with plain loops; returns `(v, c)`.
    fn naive_ctr(z: &Tensor, tau: f64) -> (f64, f64) {
        let z = rows(z);
        let (n, d) = (z.len(), z[0].len());
        let centred: Vec<Vec<f64>> = z
            .iter()
            .map(|r| {
                let m = r.iter().sum::<f64>() / d as f64;
                r.iter().map(|x| x - m).collect()
            })
            .collect();
        let v = centred
            .iter()
            .map(|r| {
                let var = r.iter().map(|x| x * x).sum::<f64>() / (d as f64 - 1.0);
                (1.0 - (var + 1e-4).sqrt()).max(0.0)
            })
            .sum::<f64>()
            / n as f64;
        let gram: Vec<Vec<f64>> = centred
            .iter()
            .map(|ri| {
                centred
                    .iter()
                    .map(|rj| ri.iter().zip(rj).map(|(x, y)| x * y).sum::<f64>() / (n as f64 - 1.0))
                    .collect()
            })
            .collect();
        (v, naive_offdiag_lse_mean(&gram, tau))
    }

    #[test]
    fn known_answers_spec_2_5() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        close(scalar(&sample_variance(&a)?), 0.1056407837, 1e-8);
        close(scalar(&sample_variance(&b)?), 0.3169223511, 1e-8);
        close(
            scalar(&sample_covariance_ctr(&a, 0.15)?),
            0.9260604139,
            1e-8,
        );
        close(
            scalar(&sample_covariance_ctr(&b, 0.15)?),
            1.9064416369,
            1e-8,
        );
        let z = Tensor::stack(&[&a, &b], 0)?;
        close(
            scalar(&vicreg_ctr_loss(&z, &VicregCtrConfig::default())?),
            2.1275325927,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        close(
            scalar(&vicreg_ctr_loss(&z, &VicregCtrConfig::default())?),
            2.1275325927,
            1e-4,
        );
        Ok(())
    }

    #[test]
    fn is_vicreg_exp_regularisers_on_the_transpose_up_to_scaling() -> candle_core::Result<()> {
        // With the per-view Gram divided by N − 1 and the transposed covariance by d − 1, the
        // sample regularisers equal VICReg's dimension regularisers of Zᵀ with τ rescaled.
        let z = randn(0f64, 0.4, (6, 4), &Device::Cpu)?;
        let (n, d) = (6.0, 4.0);
        let zt = z.t()?.contiguous()?;
        close(
            scalar(&sample_variance(&z)?),
            scalar(&crate::variance(&zt)?),
            1e-12,
        );
        let tau = 0.15;
        close(
            scalar(&sample_covariance_ctr(&z, tau)?),
            scalar(&crate::covariance_exp(&zt, tau * (n - 1.0) / (d - 1.0))?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn two_views_are_the_spec_formula() -> candle_core::Result<()> {
        let a = randn(0f64, 1., (7, 5), &Device::Cpu)?;
        let b = randn(0f64, 1., (7, 5), &Device::Cpu)?;
        let cfg = VicregCtrConfig {
            lambda: 1.3,
            mu: 0.7,
            nu: 2.0,
            tau: 0.25,
        };
        let (va, ca) = naive_ctr(&a, cfg.tau);
        let (vb, cb) = naive_ctr(&b, cfg.tau);
        let direct = cfg.lambda * scalar(&invariance(&a, &b)?)
            + cfg.mu * (va + vb) / 2.0
            + cfg.nu * (ca + cb) / 2.0;
        let z = Tensor::stack(&[&a, &b], 0)?;
        close(scalar(&vicreg_ctr_loss(&z, &cfg)?), direct, 1e-12);
        Ok(())
    }

    #[test]
    fn multi_view_averages_pairs_and_views() -> candle_core::Result<()> {
        let z = randn(0f64, 0.5, (4, 6, 5), &Device::Cpu)?;
        let t = vicreg_ctr_terms(&z, 0.2)?;
        let mut inv = 0.0;
        for i in 0..4 {
            for j in i + 1..4 {
                inv += scalar(&invariance(&z.get(i)?, &z.get(j)?)?) / 6.0;
            }
        }
        close(scalar(&t.invariance), inv, 1e-12);
        let per_view: Vec<(f64, f64)> =
            (0..4).map(|v| naive_ctr(&z.get(v).unwrap(), 0.2)).collect();
        let var = per_view.iter().map(|p| p.0).sum::<f64>() / 4.0;
        let cov = per_view.iter().map(|p| p.1).sum::<f64>() / 4.0;
        close(scalar(&t.variance), var, 1e-12);
        close(scalar(&t.covariance), cov, 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = VicregCtrConfig::default();
        for views in [2, 3] {
            let z = randn(0f64, 0.5, (views, 5, 4), &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| vicreg_ctr_loss(z, &cfg))?;
            assert!(err < 1e-6, "V = {views}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn requirements_and_dimension_checks() {
        let req = VicregCtr(VicregCtrConfig::default()).requirements();
        let err = req
            .check("vicreg-ctr", 2, 1, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("other samples"), "{err}");
        assert!(req.check("vicreg-ctr", 8, 2, false).is_ok());
        let z = randn(0f64, 1., (2, 4, 1), &Device::Cpu).unwrap();
        assert!(vicreg_ctr_loss(&z, &VicregCtrConfig::default()).is_err());
        let z = randn(0f64, 1., (2, 1, 4), &Device::Cpu).unwrap();
        assert!(vicreg_ctr_loss(&z, &VicregCtrConfig::default()).is_err());
    }

    #[test]
    fn registered_with_documented_defaults() {
        assert_documented_defaults(
            "vicreg-ctr",
            &[("lambda", 1.0), ("mu", 1.0), ("nu", 1.0), ("tau", 0.15)],
        );
    }

    #[test]
    fn unknown_key_and_bad_values_are_clear_errors() {
        let parse = |text: &str| {
            let value: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            format!(
                "{:#}",
                ssl_core::registry::parse_config::<VicregCtrConfig>("vicreg-ctr", &value)
                    .unwrap_err()
            )
        };
        let err = parse("temp: 0.2");
        assert!(err.contains("unknown field `temp`"), "{err}");
        let err = parse("tau: -0.1");
        assert!(err.contains("`tau`") && err.contains("> 0"), "{err}");
        let err = parse("lambda: .nan");
        assert!(err.contains("`lambda`"), "{err}");
    }
}
