//! I-VNE+: view invariance plus von Neumann entropy of the embedding auto-correlation.
//!
//! Kim, Kang, Hwang, Shin & Rhee, "VNE: An Effective Method for Improving Deep Representation by
//! Manipulating Eigenvalue Distribution", CVPR 2023 (eq. 2 and the I-VNE+ objective of §4; the
//! official `train_ivne_imagenet100.py`). Spec: `docs/spec/objectives.md` §2.12.
//!
//! Per view `Ẑ_v = row-normalise(Z_v)`, `ρ_v = Ẑ_vᵀẐ_v/N` (trace 1) and
//! `VNE(Z_v) = −Σ_k λ_k log λ_k` over the eigenvalues of `ρ_v`.
//! `L = −(α₁ · mean_pairs cos(z_a, z_b) + α₂ · mean_v VNE(Z_v))`; the cosine pairs are those of the
//! official multi-crop code, (view 0 or 1) × (every later view): one pair at V = 2, `2V − 3`
//! pairs in general. The entropy's eigendecomposition is `min(N, d)` square
//! ([`ssl_linalg::spectral::von_neumann_entropy_of_rows_batched`]), all views in one host round
//! trip. Needs N ≥ 2 (with one instance `ρ` has rank one and the entropy is identically 0).
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! and the spec's known answers (§2.12):
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_ivne::{ivne_loss, von_neumann_entropies, IvneConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let entropies = von_neumann_entropies(&z)?.to_vec1::<f64>()?; // one per view
//! assert!((entropies[0] - 0.8651720274).abs() < 1e-9);
//! let loss = ivne_loss(&z, &IvneConfig::default())?.to_scalar::<f64>()?;
//! assert!((loss + 4.3968641176).abs() < 1e-8);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::spectral::von_neumann_entropy_of_rows_batched;

pub use ssl_linalg::normalize_rows;

/// `VNE(Z_v)` of every view of `z`: `[V, N, d]` → `[V]` (row-normalised inside).
pub fn von_neumann_entropies(z: &Tensor) -> candle_core::Result<Tensor> {
    von_neumann_entropy_of_rows_batched(&normalize_rows(z)?)
}

/// Mean over the official cosine pairs (view 0 or 1) × (every later view) of the batch-mean
/// cosine similarity, for `z`: `[V, N, d]`, V ≥ 2. Cost linear in V.
pub fn mean_pair_cosine(z: &Tensor) -> candle_core::Result<Tensor> {
    mean_pair_dot(&normalize_rows(z)?)
}

/// [`mean_pair_cosine`] of rows already of unit norm.
fn mean_pair_dot(z: &Tensor) -> candle_core::Result<Tensor> {
    let (v, n, _) = z.dims3()?;
    if v < 2 {
        candle_core::bail!("I-VNE cosine pairs need at least 2 views, got {v}");
    }
    let first = z.narrow(0, 1, v - 1)?.broadcast_mul(&z.narrow(0, 0, 1)?)?;
    let mut total = first.sum_all()?;
    if v > 2 {
        let second = z.narrow(0, 2, v - 2)?.broadcast_mul(&z.narrow(0, 1, 1)?)?;
        total = (total + second.sum_all()?)?;
    }
    total / ((2 * v - 3) * n) as f64
}

/// The two I-VNE terms of `z`: `[V, N, d]`, unweighted.
pub struct IvneTerms {
    /// Mean over the cosine pairs of the batch-mean cosine similarity.
    pub cosine: Tensor,
    /// Mean over views of `VNE(Z_v)`.
    pub entropy: Tensor,
}

/// Computes [`IvneTerms`] for `z`: `[V, N, d]`, V ≥ 2 (rows normalised once for both).
pub fn ivne_terms(z: &Tensor) -> candle_core::Result<IvneTerms> {
    let unit = normalize_rows(z)?;
    Ok(IvneTerms {
        cosine: mean_pair_dot(&unit)?,
        entropy: von_neumann_entropy_of_rows_batched(&unit)?.mean(0)?,
    })
}

/// `−(α₁·cosine + α₂·entropy)` for `z`: `[V, N, d]`.
pub fn ivne_loss(z: &Tensor, cfg: &IvneConfig) -> candle_core::Result<Tensor> {
    let t = ivne_terms(z)?;
    ((t.cosine * cfg.alpha_cos)? + (t.entropy * cfg.alpha_vne)?)?.neg()
}

/// I-VNE+ hyper-parameters (official defaults α₁ = 4.16 ≈ log 64, α₂ = 1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IvneConfig {
    /// Weight α₁ of the mean cosine similarity.
    pub alpha_cos: f64,
    /// Weight α₂ of the mean von Neumann entropy.
    pub alpha_vne: f64,
}

impl Default for IvneConfig {
    fn default() -> Self {
        Self {
            alpha_cos: 4.16,
            alpha_vne: 1.0,
        }
    }
}

impl ObjectiveConfig for IvneConfig {
    fn validate(&self) -> Result<()> {
        for (key, value) in [("alpha_cos", self.alpha_cos), ("alpha_vne", self.alpha_vne)] {
            anyhow::ensure!(
                value.is_finite() && value >= 0.0,
                "`{key}` must be a finite weight ≥ 0, got {value}"
            );
        }
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Ivne(self.clone())))
    }
}

/// The I-VNE+ objective.
pub struct Ivne(pub IvneConfig);

impl Objective for Ivne {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason:
                "the von Neumann entropy of a single embedding's spectrum is always 0",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = ivne_terms(&z)?;
        let c = &self.0;
        let loss = ((&t.cosine * c.alpha_cos)? + (&t.entropy * c.alpha_vne)?)?.neg()?;
        Ok(LossOutput::new(loss)
            .with_term("cosine", t.cosine)
            .with_term("entropy", t.entropy))
    }
}

register_objective! {
    name: "ivne",
    aliases: &["i-vne", "i-vne+", "vne"],
    summary: "View invariance plus von Neumann entropy of the embedding auto-correlation (I-VNE+)",
    paper: "Kim, Kang, Hwang, Shin, Rhee. VNE: An Effective Method for Improving Deep Representation by Manipulating Eigenvalue Distribution. CVPR 2023",
    keys: &[
        ConfigKey { name: "alpha_cos", doc: "weight α₁ of the mean cosine similarity over view pairs (4.16 ≈ log of the batch size 64)" },
        ConfigKey { name: "alpha_vne", doc: "weight α₂ of the von Neumann entropy, averaged over views" },
    ],
    config: IvneConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar, spec_za_zb as za_zb};

    #[test]
    fn known_answers_spec_2_12() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?;
        let vne = von_neumann_entropies(&z)?.to_vec1::<f64>()?;
        close(vne[0], 0.8651720274, 1e-8);
        close(vne[1], 0.8171632229, 1e-8);
        close(scalar(&mean_pair_cosine(&z)?), 0.8547347338, 1e-8);
        close(
            scalar(&ivne_loss(&z, &IvneConfig::default())?),
            -4.3968641176,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        let loss = ivne_loss(&z, &IvneConfig::default())?;
        assert_eq!(loss.dtype(), DType::F32);
        close(scalar(&loss), -4.3968641176, 1e-4);
        Ok(())
    }

    /// `−Σ λ log λ` over the squared singular values of `Ẑ/√N` (the official `get_vne`).
    fn naive_vne(z: &Tensor) -> f64 {
        let (n, d) = z.dims2().unwrap();
        let rows = normalize_rows(z).unwrap().to_vec2::<f64>().unwrap();
        let m = nalgebra::DMatrix::from_fn(n, d, |i, j| rows[i][j] / (n as f64).sqrt());
        m.singular_values()
            .iter()
            .map(|s| s * s)
            .filter(|&l| l > 0.0)
            .map(|l| -l * l.ln())
            .sum()
    }

    fn naive_cos(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_vec2::<f64>().unwrap(), b.to_vec2::<f64>().unwrap());
        let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
        a.iter()
            .zip(&b)
            .map(|(x, y)| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>() / (norm(x) * norm(y)))
            .sum::<f64>()
            / a.len() as f64
    }

    #[test]
    fn multi_view_matches_official_pairing_and_view_mean() -> candle_core::Result<()> {
        let (v, n, d) = (6, 5, 8);
        let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
        let (mut cos, mut pairs) = (0.0, 0.0);
        for i in 0..2 {
            for j in i + 1..v {
                cos += naive_cos(&z.get(i)?, &z.get(j)?);
                pairs += 1.0;
            }
        }
        assert_eq!(pairs, 9.0);
        let vne: f64 = (0..v).map(|k| naive_vne(&z.get(k).unwrap())).sum::<f64>() / v as f64;
        let t = ivne_terms(&z)?;
        close(scalar(&t.cosine), cos / pairs, 1e-12);
        close(scalar(&t.entropy), vne, 1e-10);
        let cfg = IvneConfig {
            alpha_cos: 2.0,
            alpha_vne: 0.5,
        };
        close(
            scalar(&ivne_loss(&z, &cfg)?),
            -(2.0 * cos / pairs + 0.5 * vne),
            1e-10,
        );
        Ok(())
    }

    #[test]
    fn entropy_is_maximal_for_orthonormal_rows() -> candle_core::Result<()> {
        // N orthonormal rows give ρ with N eigenvalues 1/N: VNE = log N, whatever the scale.
        let rows = (Tensor::eye(4, DType::F64, &Device::Cpu)? * 3.0)?;
        let z = Tensor::stack(&[&rows, &rows], 0)?;
        close(
            scalar(&von_neumann_entropies(&z)?.mean(0)?),
            4f64.ln(),
            1e-12,
        );
        close(scalar(&mean_pair_cosine(&z)?), 1.0, 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = IvneConfig::default();
        for (v, n, d) in [(2, 4, 6), (3, 6, 4)] {
            let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| ivne_loss(z, &cfg))?;
            assert!(
                err < 1e-6,
                "V={v} N={n} d={d}: relative gradient error {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn requirements_need_two_instances() {
        let req = Ivne(IvneConfig::default()).requirements();
        assert!(req.check("ivne", 2, 2, false).is_ok());
        assert!(req.check("ivne", 6, 64, false).is_ok());
        let err = format!("{:#}", req.check("ivne", 2, 1, false).unwrap_err());
        assert!(err.contains("von Neumann entropy"), "{err}");
        assert!(req.check("ivne", 1, 8, false).is_err());
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("I-VNE+").unwrap();
        assert_eq!(reg.name, "ivne");
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["alpha_cos"].as_f64(), Some(4.16));
        assert_eq!(defaults["alpha_vne"].as_f64(), Some(1.0));
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let bad: serde_yaml::Value = serde_yaml::from_str("alpha: 3").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<IvneConfig>("ivne", &bad).unwrap_err()
        );
        assert!(
            err.contains("unknown field `alpha`") && err.contains("alpha_cos"),
            "{err}"
        );
        let neg: serde_yaml::Value = serde_yaml::from_str("alpha_vne: -1").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<IvneConfig>("ivne", &neg).unwrap_err()
        );
        assert!(err.contains("`alpha_vne`"), "{err}");
    }
}
