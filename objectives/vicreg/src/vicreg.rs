//! VICReg (spec `docs/spec/objectives.md` §2.3):
//! `L = λ·inv + μ·(1/V)Σ_v v(Z_v) + ν·(2/V)Σ_v c(Z_v)`, with `inv` the mean over view pairs of
//! `mse`. At V = 2 this is the official code: variance averaged over the branches, covariance
//! summed. Needs B ≥ 2 (unbiased variance).

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

use ssl_linalg::{gram, gram_of_columns};

use crate::{centred_dimensions, check_weights, pairwise_invariance, VicregTerms};

/// `mse(a, b)`: mean over all elements of `(a − b)²`. `a, b`: `[N, d]`.
pub fn invariance(a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    (a - b)?.sqr()?.mean_all()
}

/// `v(Z) = (1/d) Σ_j relu(1 − sqrt(var_u(Z_{:,j}) + 1e-4))`. `z`: `[N, d]`, N ≥ 2.
pub fn variance(z: &Tensor) -> candle_core::Result<Tensor> {
    let n = z.dim(0)? as f64;
    let centred = z.broadcast_sub(&z.mean_keepdim(0)?)?;
    let var = (centred.sqr()?.sum(0)? / (n - 1.0))?;
    let std = (var + 1e-4)?.sqrt()?;
    (1.0 - std)?.relu()?.mean_all()
}

/// `c(Z) = (1/d) Σ_{i≠j} C(Z)_{ij}²`, `C = (Z − mean)ᵀ(Z − mean)/(N − 1)`. `z`: `[N, d]`.
pub fn covariance(z: &Tensor) -> candle_core::Result<Tensor> {
    let (n, d) = z.dims2()?;
    let centred = z.broadcast_sub(&z.mean_keepdim(0)?)?;
    let cov = (centred.t()?.matmul(&centred)? / (n as f64 - 1.0))?;
    let diagonal = (centred.sqr()?.sum(0)? / (n as f64 - 1.0))?;
    let off_diagonal = (cov.sqr()?.sum_all()? - diagonal.sqr()?.sum_all()?)?;
    off_diagonal / d as f64
}

/// `(1/V) Σ_v v(Z_v)` ([`variance`] of every view at once). `z`: `[V, B, d]`, B ≥ 2.
pub fn mean_variance(z: &Tensor) -> candle_core::Result<Tensor> {
    variance_of_centred(&centred_dimensions(z)?)
}

/// [`mean_variance`] from [`centred_dimensions`] `c`: `[V, d, B]`.
pub(crate) fn variance_of_centred(c: &Tensor) -> candle_core::Result<Tensor> {
    let n = c.dim(2)? as f64;
    let var = (c.sqr()?.sum(2)? / (n - 1.0))?;
    (1.0 - (var + 1e-4)?.sqrt()?)?.relu()?.mean_all()
}

/// `(1/V) Σ_v c(Z_v)` ([`covariance`] of every view at once). `z`: `[V, B, d]`, B ≥ 2.
pub fn mean_covariance(z: &Tensor) -> candle_core::Result<Tensor> {
    covariance_of_centred(&centred_dimensions(z)?)
}

/// [`mean_covariance`] from [`centred_dimensions`] `c`: `[V, d, B]`.
///
/// `‖C‖_F² = ‖Z_cᵀZ_c‖_F²/(B−1)² = ‖Z_cZ_cᵀ‖_F²/(B−1)²`, so the squared sum is taken from the
/// smaller of the `d×d` covariance and the `B×B` Gram of the centred rows.
pub(crate) fn covariance_of_centred(c: &Tensor) -> candle_core::Result<Tensor> {
    let (v, d, n) = c.dims3()?;
    let gram = match n < d {
        true => gram_of_columns(c)?,
        false => gram(c)?,
    };
    let scale = (n as f64 - 1.0).powi(2);
    let diagonal = c.sqr()?.sum(2)?;
    let off_diagonal = ((gram.sqr()?.sum_all()? - diagonal.sqr()?.sum_all()?)? / scale)?;
    off_diagonal / (v * d) as f64
}

/// The unweighted VICReg terms of `z`: `[V, B, d]`, V ≥ 2: pair-mean invariance,
/// `(1/V) Σ_v v(Z_v)` and `(2/V) Σ_v c(Z_v)`. On the CPU one op each way (`fused.rs`),
/// elsewhere the composition of [`pairwise_invariance`], [`mean_variance`] and
/// [`mean_covariance`].
pub fn vicreg_terms(z: &Tensor) -> candle_core::Result<VicregTerms> {
    let (v, b, _) = z.dims3()?;
    if !z.device().is_cpu() {
        return composed_terms(z);
    }
    if v < 2 || b < 2 {
        candle_core::bail!("VICReg's terms need at least 2 views of 2 instances, got {v} of {b}");
    }
    let terms = crate::fused::terms(z)?;
    Ok(VicregTerms {
        invariance: terms.get(0)?,
        variance: terms.get(1)?,
        covariance: terms.get(2)?,
    })
}

/// [`vicreg_terms`] as Candle ops.
fn composed_terms(z: &Tensor) -> candle_core::Result<VicregTerms> {
    let centred = centred_dimensions(z)?;
    Ok(VicregTerms {
        invariance: pairwise_invariance(z)?,
        variance: variance_of_centred(&centred)?,
        covariance: (covariance_of_centred(&centred)? * 2.0)?,
    })
}

/// `λ·inv + μ·var + ν·cov` for `z`: `[V, B, d]`.
pub fn vicreg_loss(z: &Tensor, cfg: &VicregConfig) -> candle_core::Result<Tensor> {
    vicreg_terms(z)?.weighted(cfg.lambda, cfg.mu, cfg.nu)
}

/// VICReg hyper-parameters (paper defaults λ = μ = 25, ν = 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VicregConfig {
    /// Invariance weight λ.
    pub lambda: f64,
    /// Variance weight μ.
    pub mu: f64,
    /// Covariance weight ν.
    pub nu: f64,
}

impl Default for VicregConfig {
    fn default() -> Self {
        Self {
            lambda: 25.0,
            mu: 25.0,
            nu: 1.0,
        }
    }
}

impl ObjectiveConfig for VicregConfig {
    fn validate(&self) -> Result<()> {
        check_weights(&[("lambda", self.lambda), ("mu", self.mu), ("nu", self.nu)])
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Vicreg(self.clone())))
    }
}

/// The VICReg objective.
pub struct Vicreg(pub VicregConfig);

impl Objective for Vicreg {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "the variance term uses the unbiased batch variance",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let c = &self.0;
        Ok(vicreg_terms(&z)?.into_output(c.lambda, c.mu, c.nu)?)
    }
}

register_objective! {
    name: "vicreg",
    aliases: &[],
    summary: "Variance-invariance-covariance regularisation (dimension-contrastive)",
    paper: "Bardes, Ponce, LeCun. VICReg: Variance-Invariance-Covariance Regularization for Self-Supervised Learning. ICLR 2022",
    keys: &[
        ConfigKey { name: "lambda", doc: "invariance weight λ" },
        ConfigKey { name: "mu", doc: "variance weight μ (averaged over views)" },
        ConfigKey { name: "nu", doc: "covariance weight ν (summed over the two views)" },
    ],
    config: VicregConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    #[test]
    fn known_answers_spec_2_3() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        close(scalar(&invariance(&a, &b)?), 0.5, 1e-9);
        close(scalar(&variance(&a)?), 0.1222947894, 1e-8);
        close(scalar(&variance(&b)?), 0.0753209515, 1e-8);
        close(scalar(&covariance(&a)?), 4.0 / 27.0, 1e-9);
        close(scalar(&covariance(&b)?), 7.0 / 18.0, 1e-9);
        let z = Tensor::stack(&[&a, &b], 0)?;
        close(
            scalar(&vicreg_loss(&z, &VicregConfig::default())?),
            15.5072337985,
            1e-9,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        close(
            scalar(&vicreg_loss(&z, &VicregConfig::default())?),
            15.5072337985,
            1e-4,
        );
        Ok(())
    }

    #[test]
    fn multi_view_reduces_to_pairwise_means() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (4, 6, 5), &Device::Cpu)?;
        let t = vicreg_terms(&z)?;
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
        let cov: f64 = (0..4)
            .map(|v| scalar(&covariance(&z.get(v).unwrap()).unwrap()))
            .sum();
        close(scalar(&t.covariance), cov * 2.0 / 4.0, 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = VicregConfig::default();
        for views in [2, 3] {
            let z = randn(0f64, 0.5, (views, 5, 3), &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| vicreg_loss(z, &cfg))?;
            assert!(err < 1e-6, "V = {views}: relative gradient error {err}");
        }
        Ok(())
    }

    /// The CPU's fused terms equal the composed ones in value and in gradient (against random
    /// weights on the three terms), for B < d and B ≥ d, two and three views, dimensions on
    /// both sides of the variance hinge and a constant one, in f64 and in f32 at the main
    /// job's `[2, 128, 512]`.
    #[test]
    fn fused_terms_equal_the_composed_ops() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let mut constant_column = randn(0f64, 2.0, (2, 6, 4), &dev)?.to_vec3::<f64>()?;
        for view in &mut constant_column {
            for row in view {
                row[2] = 0.5;
            }
        }
        let cases = [
            (randn(0f64, 0.5, (2, 5, 3), &dev)?, 1e-12),
            (randn(0f64, 2.0, (3, 4, 6), &dev)?, 1e-12),
            (randn(0f64, 1.0, (3, 7, 4), &dev)?.transpose(1, 2)?, 1e-12),
            (Tensor::new(constant_column, &dev)?, 1e-12),
            (randn(0f32, 1.0, (2, 128, 512), &dev)?, 1e-4),
        ];
        let stacked = |t: VicregTerms| Tensor::stack(&[t.invariance, t.variance, t.covariance], 0);
        for (z, tolerance) in cases {
            let (fused, composed) = (
                |z: &Tensor| stacked(vicreg_terms(z)?),
                |z: &Tensor| stacked(composed_terms(z)?),
            );
            ssl_core::testing::assert_fused_matches_composed(&z, tolerance, fused, composed)?;
        }
        Ok(())
    }

    /// The fused terms refuse one view or one instance, naming what they got.
    #[test]
    fn fused_terms_refuse_one_view_or_one_instance() -> candle_core::Result<()> {
        for dims in [(1, 4, 3), (2, 1, 3)] {
            let z = randn(0f64, 1., dims, &Device::Cpu)?;
            let err = vicreg_terms(&z).err().expect("an error").to_string();
            assert!(err.contains("at least 2 views of 2 instances"), "{err}");
        }
        Ok(())
    }

    #[test]
    fn needs_two_samples() {
        let err = Vicreg(VicregConfig::default())
            .requirements()
            .check("vicreg", 2, 1, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unbiased batch variance"), "{err}");
    }

    #[test]
    fn registered_with_documented_defaults() {
        assert_documented_defaults("vicreg", &[("lambda", 25.0), ("mu", 25.0), ("nu", 1.0)]);
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let bad: serde_yaml::Value = serde_yaml::from_str("lamda: 3").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<VicregConfig>("vicreg", &bad).unwrap_err()
        );
        assert!(
            err.contains("unknown field `lamda`") && err.contains("lambda"),
            "{err}"
        );
        let neg: serde_yaml::Value = serde_yaml::from_str("mu: -1").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<VicregConfig>("vicreg", &neg).unwrap_err()
        );
        assert!(err.contains("`mu`"), "{err}");
    }
}
