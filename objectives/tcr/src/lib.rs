//! Total coding rate (TCR) and the EMP-SSL objective built on it.
//!
//! * Tong, Chen, Ma & LeCun, "EMP-SSL: Towards Self-Supervised Learning in One Training Epoch",
//!   arXiv:2304.03977, 2023 — the objective `tcr` (alias `emp-ssl`).
//! * Li, Chen, LeCun & Sommer, "Neural Manifold Clustering and Embedding", 2022, and Yu, Chan,
//!   You, Song & Ma, "Learning Diverse and Discriminative Representations via the Principle of
//!   Maximal Coding Rate Reduction", NeurIPS 2020 — the total coding rate.
//!
//! Spec: `docs/spec/objectives.md` §2.10, disagreements §6 point 9.
//!
//! Per view `v`, with `Ẑ_v ∈ R^{N×d}` the row-normalised embeddings,
//! `TCR(Ẑ) = −½ logdet(I_d + (d/(N·ε)) ẐᵀẐ)` (negative coding rate, to be minimised), and
//!
//! `L = tcr_weight · (1/V) Σ_v TCR(Ẑ_v) + invariance_weight · (−(1/V) Σ_v mean_i cos(ẑ_{v,i}, z̄_i))`,
//!
//! `z̄_i = (1/V) Σ_v ẑ_{v,i}` the mean of instance `i`'s normalised views (not detached), exactly
//! the reference code's `cal_TCR` and `Similarity_Loss`. Cost is linear in `V`.
//!
//! Points where the sources disagree (§6 point 9), and the choice made here:
//! * `ε` is used **unsquared** (`d/(N·ε)`, ε = 0.2) as in the EMP-SSL reference code; the paper
//!   writes `d/(N·ε²)`. To reproduce the paper's formula set `eps` to `ε_paper²`.
//! * The returned TCR is `−½ logdet` (minimised), as in the reference; one library returns
//!   `+½ logdet`.
//!
//! The log-determinant is taken of the smaller of the `d×d` and `N×N` matrices: by Sylvester's
//! identity `det(I_d + c ẐᵀẐ) = det(I_N + c ẐẐᵀ)`. It is computed in f64 on the host
//! ([`ssl_linalg::logdet`]), one round trip for all views.
//!
//! The smallest batch is `B = 1` (spec §5): `I + c ẐᵀẐ` is always positive definite. With one
//! instance, however, the coding rate only sees a single direction per view and cannot spread a
//! batch; it is meaningful for `B ≥ 2`.
//!
//! # Example
//!
//! Spec §2.10's known answer: the total coding rate of `Z_a` (`[4, 3]`) at `ε = 0.2`. Rows are
//! normalised inside, so scaling them changes nothing.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_tcr::total_coding_rate;
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let rate = total_coding_rate(&za, 0.2)?.to_scalar::<f64>()?;
//! assert!((rate + 2.4479065349).abs() < 1e-9);
//! let scaled = za.broadcast_mul(&Tensor::new(&[[2f64], [0.5], [7.], [1.]], dev)?)?;
//! assert!((total_coding_rate(&scaled, 0.2)?.to_scalar::<f64>()? - rate).abs() < 1e-12);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::logdet::logdet_spd_batched;

pub use ssl_linalg::normalize_rows;

/// Which matrix the log-determinant of the coding rate is taken of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GramForm {
    /// The smaller of the two (same value by Sylvester's identity).
    Smaller,
    /// `I_d + c ẐᵀẐ` (`d×d`), the formula as written.
    Dimension,
    /// `I_N + c ẐẐᵀ` (`N×N`).
    Sample,
}

/// Per-view TCR of embeddings that are **already row-normalised**: `z_hat`: `[V, N, d]` → `[V]`,
/// `TCR(Ẑ_v) = −½ logdet(I + (d/(N·ε)) ẐᵀẐ)` (spec §2.10), through the Gram matrix chosen by
/// `form`.
pub fn coding_rate_of_normalized(
    z_hat: &Tensor,
    eps: f64,
    form: GramForm,
) -> candle_core::Result<Tensor> {
    let (_, n, d) = z_hat.dims3()?;
    if n == 0 {
        candle_core::bail!("total coding rate: the batch is empty");
    }
    let scale = d as f64 / (n as f64 * eps);
    let dimension = match form {
        GramForm::Smaller => d <= n,
        GramForm::Dimension => true,
        GramForm::Sample => false,
    };
    let gram = match dimension {
        true => ssl_linalg::gram_of_columns(z_hat)?,
        false => ssl_linalg::gram(z_hat)?,
    };
    logdet_spd_batched(&(gram * scale)?, 1.0)? * -0.5
}

/// `TCR(Z) = −½ logdet(I_d + (d/(N·ε)) ẐᵀẐ)` of `z`: `[N, d]` → scalar, `Ẑ` = `z` row-normalised
/// (spec §2.10; ε unsquared, see the crate documentation).
pub fn total_coding_rate(z: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let z_hat = normalize_rows(&z.unsqueeze(0)?)?;
    coding_rate_of_normalized(&z_hat, eps, GramForm::Smaller)?.squeeze(0)
}

/// EMP-SSL invariance of already row-normalised `z_hat`: `[V, N, d]` → scalar,
/// `−(1/V) Σ_v mean_i cos(ẑ_{v,i}, z̄_i)` with `z̄_i = (1/V) Σ_v ẑ_{v,i}` (gradient flows through
/// `z̄` too, as in the reference).
pub fn invariance(z_hat: &Tensor) -> candle_core::Result<Tensor> {
    let mean = normalize_rows(&ssl_linalg::mean_of_views(z_hat)?)?;
    z_hat
        .broadcast_mul(&mean)?
        .sum(D::Minus1)?
        .mean_all()?
        .neg()
}

/// The two unweighted EMP-SSL terms of `z`: `[V, B, d]`.
pub struct TcrTerms {
    /// `(1/V) Σ_v TCR(Ẑ_v)`.
    pub tcr: Tensor,
    /// `−(1/V) Σ_v mean_i cos(ẑ_{v,i}, z̄_i)`, in `[−1, 0]`.
    pub invariance: Tensor,
}

/// Computes [`TcrTerms`] for `z`: `[V, B, d]` (rows normalised here).
pub fn tcr_terms(z: &Tensor, eps: f64) -> candle_core::Result<TcrTerms> {
    let z_hat = normalize_rows(z)?;
    Ok(TcrTerms {
        tcr: coding_rate_of_normalized(&z_hat, eps, GramForm::Smaller)?.mean(0)?,
        invariance: invariance(&z_hat)?,
    })
}

/// `tcr_weight · tcr + invariance_weight · invariance` for `z`: `[V, B, d]`.
pub fn tcr_loss(z: &Tensor, cfg: &TcrConfig) -> candle_core::Result<Tensor> {
    let t = tcr_terms(z, cfg.eps)?;
    (t.tcr * cfg.tcr_weight)? + (t.invariance * cfg.invariance_weight)?
}

/// EMP-SSL hyper-parameters (reference-code defaults: ε = 0.2, TCR weight 1, invariance 200).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcrConfig {
    /// Distortion ε in `d/(N·ε)` (unsquared, as in the reference code).
    pub eps: f64,
    /// Weight of the mean TCR over views.
    pub tcr_weight: f64,
    /// Weight of the invariance term (−mean cosine to the view average).
    pub invariance_weight: f64,
}

impl Default for TcrConfig {
    fn default() -> Self {
        Self {
            eps: 0.2,
            tcr_weight: 1.0,
            invariance_weight: 200.0,
        }
    }
}

impl ObjectiveConfig for TcrConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.eps.is_finite() && self.eps > 0.0,
            "`eps` must be a finite distortion > 0, got {}",
            self.eps
        );
        for (key, value) in [
            ("tcr_weight", self.tcr_weight),
            ("invariance_weight", self.invariance_weight),
        ] {
            anyhow::ensure!(
                value.is_finite() && value >= 0.0,
                "`{key}` must be a finite weight ≥ 0, got {value}"
            );
        }
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Tcr(self.clone())))
    }
}

/// The EMP-SSL objective (TCR + invariance to the view average).
pub struct Tcr(pub TcrConfig);

impl Objective for Tcr {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 1,
            min_batch_reason: "I + c·ZᵀZ is definite for any batch; the coding rate is only \
                               meaningful for B ≥ 2",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = tcr_terms(&z, self.0.eps)?;
        let loss = ((&t.tcr * self.0.tcr_weight)? + (&t.invariance * self.0.invariance_weight)?)?;
        Ok(LossOutput::new(loss)
            .with_term("tcr", t.tcr)
            .with_term("invariance", t.invariance))
    }
}

register_objective! {
    name: "tcr",
    aliases: &["emp-ssl", "emp_ssl"],
    summary: "EMP-SSL: total coding rate per view + cosine invariance to the view average",
    paper: "Tong, Chen, Ma, LeCun. EMP-SSL: Towards Self-Supervised Learning in One Training Epoch. arXiv:2304.03977, 2023 (TCR: Li et al. 2022)",
    keys: &[
        ConfigKey { name: "eps", doc: "distortion ε in d/(N·ε) (unsquared as in the reference code; the paper's ε² form: set eps = ε²)" },
        ConfigKey { name: "tcr_weight", doc: "weight of the mean over views of TCR = −½ logdet(I + d/(Nε) ZᵀZ)" },
        ConfigKey { name: "invariance_weight", doc: "weight of −mean cosine of each view to the view average" },
    ],
    config: TcrConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar, spec_za_zb};
    use ssl_core::Ids;

    fn z_a() -> candle_core::Result<Tensor> {
        Ok(spec_za_zb()?.0)
    }

    const KAT_TCR: f64 = -2.4479065349;

    #[test]
    fn known_answer_spec_2_10() -> candle_core::Result<()> {
        close(scalar(&total_coding_rate(&z_a()?, 0.2)?), KAT_TCR, 1e-9);
        // Row normalisation happens inside: scaling rows changes nothing.
        let scaled =
            z_a()?.broadcast_mul(&Tensor::new(&[[2f64], [0.5], [7.], [1.]], &Device::Cpu)?)?;
        close(scalar(&total_coding_rate(&scaled, 0.2)?), KAT_TCR, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let value = total_coding_rate(&z_a()?.to_dtype(DType::F32)?, 0.2)?;
        assert_eq!(value.dtype(), DType::F32);
        close(scalar(&value), KAT_TCR, 1e-4);
        Ok(())
    }

    #[test]
    fn known_answer_with_a_direct_determinant() -> candle_core::Result<()> {
        // 3×3 determinant by cofactors, independent of the Cholesky path.
        let z = normalize_rows(&z_a()?)?;
        let m = ((z.t()?.matmul(&z)? * (3.0 / (4.0 * 0.2)))?
            + Tensor::eye(3, DType::F64, &Device::Cpu)?)?
        .to_vec2::<f64>()?;
        let det = m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
        close(-0.5 * det.ln(), KAT_TCR, 1e-9);
        Ok(())
    }

    #[test]
    fn sylvester_forms_agree() -> candle_core::Result<()> {
        for (n, d) in [(4, 9), (9, 4), (5, 5)] {
            let z = normalize_rows(&randn(0f64, 1., (3, n, d), &Device::Cpu)?)?;
            let forms: Vec<Vec<f64>> = [GramForm::Dimension, GramForm::Sample, GramForm::Smaller]
                .iter()
                .map(|&f| coding_rate_of_normalized(&z, 0.2, f)?.to_vec1::<f64>())
                .collect::<candle_core::Result<_>>()?;
            for ((dim, sample), smaller) in forms[0].iter().zip(&forms[1]).zip(&forms[2]) {
                close(*dim, *sample, 1e-10);
                close(*smaller, *sample, 1e-10);
            }
            // The gradients agree too.
            let x = randn(0f64, 1., (2, n, d), &Device::Cpu)?;
            let grad = |form| -> candle_core::Result<Tensor> {
                let var = candle_core::Var::from_tensor(&x)?;
                let v = coding_rate_of_normalized(&normalize_rows(var.as_tensor())?, 0.2, form)?;
                Ok(v.sum_all()?
                    .backward()?
                    .get(var.as_tensor())
                    .unwrap()
                    .clone())
            };
            let diff = (grad(GramForm::Dimension)? - grad(GramForm::Sample)?)?
                .abs()?
                .max_all()?;
            assert!(scalar(&diff) < 1e-10, "{n}×{d}: gradients differ by {diff}");
        }
        Ok(())
    }

    #[test]
    fn invariance_is_minus_one_for_identical_views_and_bounded() -> candle_core::Result<()> {
        let a = z_a()?;
        let same = Tensor::stack(&[&a, &(&a * 3.0)?, &a], 0)?;
        close(scalar(&tcr_terms(&same, 0.2)?.invariance), -1.0, 1e-12);
        let z = randn(0f64, 1., (4, 6, 5), &Device::Cpu)?;
        let inv = scalar(&tcr_terms(&z, 0.2)?.invariance);
        assert!((-1.0..0.0).contains(&inv), "{inv}");
        Ok(())
    }

    #[test]
    fn multi_view_matches_a_naive_computation() -> candle_core::Result<()> {
        let (v, n, d) = (5, 6, 4);
        let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
        let t = tcr_terms(&z, 0.2)?;
        let rows: Vec<Vec<Vec<f64>>> = (0..v)
            .map(|k| normalize_rows(&z.get(k)?)?.to_vec2::<f64>())
            .collect::<candle_core::Result<_>>()?;
        let mut cos_sum = 0.0;
        for i in 0..n {
            let mean: Vec<f64> = (0..d)
                .map(|j| rows.iter().map(|r| r[i][j]).sum::<f64>() / v as f64)
                .collect();
            let mean_norm = mean.iter().map(|x| x * x).sum::<f64>().sqrt();
            for r in &rows {
                let dot: f64 = r[i].iter().zip(&mean).map(|(a, b)| a * b).sum();
                cos_sum += dot / mean_norm;
            }
        }
        close(scalar(&t.invariance), -cos_sum / (v * n) as f64, 1e-12);
        let tcr: f64 = (0..v)
            .map(|k| scalar(&total_coding_rate(&z.get(k).unwrap(), 0.2).unwrap()))
            .sum::<f64>()
            / v as f64;
        close(scalar(&t.tcr), tcr, 1e-12);
        let cfg = TcrConfig::default();
        close(
            scalar(&tcr_loss(&z, &cfg)?),
            tcr + 200.0 * (-cos_sum / (v * n) as f64),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn coding_rate_rewards_spread() -> candle_core::Result<()> {
        // Collapsed rows (all equal) have a higher (worse) TCR than orthogonal rows.
        let collapsed = Tensor::ones((4, 4), DType::F64, &Device::Cpu)?;
        let spread = Tensor::eye(4, DType::F64, &Device::Cpu)?;
        let c = scalar(&total_coding_rate(&collapsed, 0.2)?);
        let s = scalar(&total_coding_rate(&spread, 0.2)?);
        // Orthonormal rows: every eigenvalue of I + (d/(Nε)) ẐᵀẐ is 1 + 1/ε = 6.
        close(s, -0.5 * 4.0 * 6f64.ln(), 1e-12);
        // Collapsed: one eigenvalue 1 + d/ε = 21.
        close(c, -0.5 * 21f64.ln(), 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = TcrConfig::default();
        for shape in [(2, 5, 3), (3, 3, 6)] {
            let z = randn(0f64, 1., shape, &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| tcr_loss(z, &cfg))?;
            assert!(err < 1e-6, "{shape:?}: relative gradient error {err}");
        }
        Ok(())
    }

    fn build(overrides: &str) -> anyhow::Result<Box<dyn Objective>> {
        let ctx = BuildContext {
            vb: ssl_core::ParamStore::new(7)
                .var_builder(&Device::Cpu)
                .set_dtype(DType::F64)
                .pp("objective"),
            num_instances: 10,
            num_classes: None,
            instance_labels: None,
            projection_dim: 3,
            feature_dim: 3,
            views: 2,
            global_views: 2,
            batch_size: 4,
            patches: None,
        };
        let value: serde_yaml::Value = serde_yaml::from_str(overrides)?;
        (ssl_core::find("tcr")?.build)(&value, &ctx)
    }

    #[test]
    fn objective_reports_terms_and_matches_the_pure_function() -> anyhow::Result<()> {
        let mut objective = build("invariance_weight: 10")?;
        let z = randn(0f64, 1., (3, 4, 3), &Device::Cpu)?;
        let indices = Ids::range(4, &Device::Cpu)?;
        let batch = ssl_core::testing::batch(&z, &indices, None);
        let out = objective.loss(&batch)?;
        let cfg = TcrConfig {
            invariance_weight: 10.0,
            ..TcrConfig::default()
        };
        close(scalar(&out.loss), scalar(&tcr_loss(&z, &cfg)?), 1e-12);
        let names: Vec<&str> = out.terms.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names, ["tcr", "invariance"]);
        Ok(())
    }

    #[test]
    fn requirements_allow_one_instance_and_need_two_views() -> anyhow::Result<()> {
        let req = build("")?.requirements();
        assert_eq!(req.min_batch, 1);
        req.check("tcr", 2, 1, false)?;
        req.check("tcr", 8, 1, false)?;
        let err = req.check("tcr", 1, 8, false).unwrap_err().to_string();
        assert!(err.contains("at least 2 views"), "{err}");
        // B = 1 is defined: the loss is finite.
        let z = randn(0f64, 1., (2, 1, 4), &Device::Cpu)?;
        assert!(scalar(&tcr_loss(&z, &TcrConfig::default())?).is_finite());
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("tcr").unwrap();
        assert!(ssl_core::find("emp-ssl").unwrap().name == "tcr");
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["eps"].as_f64(), Some(0.2));
        assert_eq!(defaults["tcr_weight"].as_f64(), Some(1.0));
        assert_eq!(defaults["invariance_weight"].as_f64(), Some(200.0));
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let parse = |text: &str| {
            let v: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            format!(
                "{:#}",
                ssl_core::registry::parse_config::<TcrConfig>("tcr", &v).unwrap_err()
            )
        };
        let err = parse("epsilon: 0.1");
        assert!(
            err.contains("unknown field `epsilon`") && err.contains("eps"),
            "{err}"
        );
        let err = parse("eps: 0");
        assert!(err.contains("`eps`") && err.contains("got 0"), "{err}");
        let err = parse("invariance_weight: -1");
        assert!(err.contains("`invariance_weight`"), "{err}");
    }
}
