//! VICReg-exp (spec `docs/spec/objectives.md` §2.4, duality paper eq. 12 and pseudocode): the
//! covariance term becomes a log-sum-exp over the off-diagonal entries of each covariance row,
//! `c_exp(Z) = (1/d) Σ_i lse_{j≠i}(C(Z)_{ij} / τ)`, `C` centred and divided by `N − 1`.
//!
//! `L = λ·inv + μ·(1/V)Σ_v v(Z_v) + ν·(1/V)Σ_v c_exp(Z_v)`: both regularisers averaged over the
//! views as in the pseudocode (the paper's eq. 12 sums the two branches, spec §6.2); at V = 2
//! this is `λ·mse + μ·(v_a + v_b)/2 + ν·(c_a + c_b)/2`. Needs B ≥ 2 and d ≥ 2.

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

use crate::vicreg::variance_of_centred;
use crate::{
    centred_dimensions, check_tau, check_weights, gathered, gram_off_diagonal_logsumexp,
    pairwise_invariance, VicregTerms,
};

/// `(1/V) Σ_v c_exp(Z_v)` for `z`: `[V, B, d]`, B ≥ 2, d ≥ 2 (spec §2.4).
///
/// Computed dimension-major (`[V, d, B]`, contiguous, so the product and its gradients need no
/// strided copies of the `d×d` matrices), with the `1/(N − 1)` folded into the temperature so
/// no pass over the `d×d` matrix is spent on scaling.
pub fn mean_covariance_exp(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    covariance_exp_of_centred(&centred_dimensions(z)?, tau)
}

/// [`mean_covariance_exp`] from [`centred_dimensions`] `c`: `[V, d, B]`.
fn covariance_exp_of_centred(c: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let n = c.dim(2)? as f64;
    gram_off_diagonal_logsumexp(c, tau * (n - 1.0))?.mean_all()
}

/// `c_exp(Z) = (1/d) Σ_i lse_{j≠i}(C(Z)_{ij} / τ)` for one view `z`: `[N, d]` (spec §2.4).
pub fn covariance_exp(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    mean_covariance_exp(&z.unsqueeze(0)?, tau)
}

/// The unweighted VICReg-exp terms of `z`: `[V, B, d]`, V ≥ 2: pair-mean invariance,
/// `(1/V) Σ_v v(Z_v)` and `(1/V) Σ_v c_exp(Z_v)`.
pub fn vicreg_exp_terms(z: &Tensor, tau: f64) -> candle_core::Result<VicregTerms> {
    let centred = centred_dimensions(z)?;
    Ok(VicregTerms {
        invariance: pairwise_invariance(z)?,
        variance: variance_of_centred(&centred)?,
        covariance: covariance_exp_of_centred(&centred, tau)?,
    })
}

/// `λ·inv + μ·var + ν·cov_exp` for `z`: `[V, B, d]`.
pub fn vicreg_exp_loss(z: &Tensor, cfg: &VicregExpConfig) -> candle_core::Result<Tensor> {
    vicreg_exp_terms(z, cfg.tau)?.weighted(cfg.lambda, cfg.mu, cfg.nu)
}

/// VICReg-exp hyper-parameters (duality paper Table S6: λ = 1, μ = 1, ν = 2, τ = 0.1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VicregExpConfig {
    /// Invariance weight λ.
    pub lambda: f64,
    /// Variance weight μ.
    pub mu: f64,
    /// Weight ν of the log-sum-exp covariance term.
    pub nu: f64,
    /// Temperature τ dividing the covariances.
    pub tau: f64,
}

impl Default for VicregExpConfig {
    fn default() -> Self {
        Self {
            lambda: 1.0,
            mu: 1.0,
            nu: 2.0,
            tau: 0.1,
        }
    }
}

impl ObjectiveConfig for VicregExpConfig {
    fn validate(&self) -> Result<()> {
        check_weights(&[("lambda", self.lambda), ("mu", self.mu), ("nu", self.nu)])?;
        check_tau(self.tau)
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(VicregExp(self.clone())))
    }
}

/// The VICReg-exp objective.
pub struct VicregExp(pub VicregExpConfig);

impl Objective for VicregExp {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "the variance and covariance terms use unbiased batch statistics",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = gathered(batch, "vicreg-exp", 2)?;
        let c = &self.0;
        Ok(vicreg_exp_terms(&z, c.tau)?.into_output(c.lambda, c.mu, c.nu)?)
    }
}

register_objective! {
    name: "vicreg-exp",
    aliases: &["vicreg_exp"],
    summary: "VICReg with a log-sum-exp covariance term (dimension-contrastive, duality paper)",
    paper: "Garrido, Chen, Bardes, Najman, LeCun. On the duality between contrastive and non-contrastive self-supervised learning. ICLR 2023",
    keys: &[
        ConfigKey { name: "lambda", doc: "invariance weight λ (mean over view pairs)" },
        ConfigKey { name: "mu", doc: "variance weight μ (averaged over views)" },
        ConfigKey { name: "nu", doc: "weight ν of the covariance log-sum-exp (averaged over views)" },
        ConfigKey { name: "tau", doc: "temperature τ > 0 dividing the covariances" },
    ],
    config: VicregExpConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;
    use crate::{invariance, variance};
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    /// `c_exp` with plain loops: covariance by its definition, then the off-diagonal lse.
    fn naive_c_exp(z: &Tensor, tau: f64) -> f64 {
        let z = rows(z);
        let (n, d) = (z.len(), z[0].len());
        let mean: Vec<f64> = (0..d)
            .map(|j| z.iter().map(|r| r[j]).sum::<f64>() / n as f64)
            .collect();
        let cov: Vec<Vec<f64>> = (0..d)
            .map(|i| {
                (0..d)
                    .map(|j| {
                        z.iter()
                            .map(|r| (r[i] - mean[i]) * (r[j] - mean[j]))
                            .sum::<f64>()
                            / (n as f64 - 1.0)
                    })
                    .collect()
            })
            .collect();
        naive_offdiag_lse_mean(&cov, tau)
    }

    #[test]
    fn known_answers_spec_2_4() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        close(scalar(&covariance_exp(&a, 0.1)?), -0.8566937735, 1e-8);
        close(scalar(&covariance_exp(&b, 0.1)?), 2.8355423539, 1e-8);
        let z = Tensor::stack(&[&a, &b], 0)?;
        close(
            scalar(&vicreg_exp_loss(&z, &VicregExpConfig::default())?),
            2.5776564508,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        close(
            scalar(&vicreg_exp_loss(&z, &VicregExpConfig::default())?),
            2.5776564508,
            1e-4,
        );
        Ok(())
    }

    #[test]
    fn two_views_are_the_spec_formula() -> candle_core::Result<()> {
        let a = randn(0f64, 1., (7, 5), &Device::Cpu)?;
        let b = randn(0f64, 1., (7, 5), &Device::Cpu)?;
        let cfg = VicregExpConfig {
            lambda: 1.3,
            mu: 0.7,
            nu: 2.0,
            tau: 0.25,
        };
        let direct = cfg.lambda * scalar(&invariance(&a, &b)?)
            + cfg.mu * (scalar(&variance(&a)?) + scalar(&variance(&b)?)) / 2.0
            + cfg.nu * (naive_c_exp(&a, cfg.tau) + naive_c_exp(&b, cfg.tau)) / 2.0;
        let z = Tensor::stack(&[&a, &b], 0)?;
        close(scalar(&vicreg_exp_loss(&z, &cfg)?), direct, 1e-12);
        Ok(())
    }

    #[test]
    fn multi_view_averages_pairs_and_views() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (4, 6, 5), &Device::Cpu)?;
        let t = vicreg_exp_terms(&z, 0.2)?;
        let mut inv = 0.0;
        for i in 0..4 {
            for j in i + 1..4 {
                inv += scalar(&invariance(&z.get(i)?, &z.get(j)?)?) / 6.0;
            }
        }
        close(scalar(&t.invariance), inv, 1e-12);
        let var: f64 = (0..4)
            .map(|v| scalar(&variance(&z.get(v).unwrap()).unwrap()))
            .sum();
        close(scalar(&t.variance), var / 4.0, 1e-12);
        let cov: f64 = (0..4).map(|v| naive_c_exp(&z.get(v).unwrap(), 0.2)).sum();
        close(scalar(&t.covariance), cov / 4.0, 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = VicregExpConfig::default();
        for views in [2, 3] {
            let z = randn(0f64, 0.5, (views, 5, 3), &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| vicreg_exp_loss(z, &cfg))?;
            assert!(err < 1e-6, "V = {views}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn requirements_and_dimension_checks() {
        let req = VicregExp(VicregExpConfig::default()).requirements();
        let err = req
            .check("vicreg-exp", 2, 1, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unbiased batch statistics"), "{err}");
        assert!(req.check("vicreg-exp", 8, 2, false).is_ok());
        let z = randn(0f64, 1., (2, 4, 1), &Device::Cpu).unwrap();
        assert!(vicreg_exp_loss(&z, &VicregExpConfig::default()).is_err());
    }

    #[test]
    fn registered_with_documented_defaults() {
        assert_documented_defaults(
            "vicreg-exp",
            &[("lambda", 1.0), ("mu", 1.0), ("nu", 2.0), ("tau", 0.1)],
        );
    }

    #[test]
    fn unknown_key_and_bad_values_are_clear_errors() {
        let parse = |text: &str| {
            let value: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            format!(
                "{:#}",
                ssl_core::registry::parse_config::<VicregExpConfig>("vicreg-exp", &value)
                    .unwrap_err()
            )
        };
        let err = parse("temperature: 0.2");
        assert!(err.contains("unknown field `temperature`"), "{err}");
        let err = parse("tau: 0");
        assert!(err.contains("`tau`") && err.contains("> 0"), "{err}");
        let err = parse("nu: -2");
        assert!(err.contains("`nu`"), "{err}");
    }
}
