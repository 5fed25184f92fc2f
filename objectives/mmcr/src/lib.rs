//! MMCR: Maximum Manifold Capacity Representations.
//!
//! Yerxa, Kuang, Simoncelli & Chung, "Learning Efficient Coding of Natural Images with Maximum
//! Manifold Capacity Representations", NeurIPS 2023 (eq. 2, and the official `MMCR_Loss`).
//! Spec: `docs/spec/objectives.md` §2.13.
//!
//! Every embedding is row-normalised, `c_i = (1/V) Σ_v z_i^(v)` and `C ∈ R^{N×d}` stacks the
//! centroids; `L = −‖C‖_* + λ · (1/N) Σ_i ‖[z_i^(1) … z_i^(V)]‖_*`. λ = 0 (the official
//! CIFAR/STL script) skips the local nuclear norms entirely; for λ > 0 they are computed as one
//! batch of `N` small `V×d` SVDs. Nuclear norms and their gradient `UVᵀ` come from
//! [`ssl_linalg::spectral`] (host SVD in f64, one round trip per term). Apart from the
//! averaging and the local term the cost does not grow with V.
//!
//! Deviation from spec §5: `min_batch` is 2, not the formal 1. With one instance `‖C‖_*` is the
//! centroid's norm, a pure invariance term with nothing that spreads the embeddings, and the
//! batch-norm layers of the MMCR projector are undefined on a single sample.
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! and the spec's known answers (§2.13): without the local term the loss is minus the nuclear
//! norm of the centroids.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_mmcr::{centroid_nuclear_norm, mmcr_loss, MmcrConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let norm = centroid_nuclear_norm(&z)?.to_scalar::<f64>()?;
//! assert!((norm - 3.0914497265).abs() < 1e-9);
//! let loss = mmcr_loss(&z, &MmcrConfig::default())?.to_scalar::<f64>()?;
//! assert!((loss + norm).abs() < 1e-12);
//! let with_local = mmcr_loss(&z, &MmcrConfig { lambda: 5e-3 })?.to_scalar::<f64>()?;
//! assert!((with_local + 3.0828043177).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::spectral::{nuclear_norm, nuclear_norm_batched};

pub use ssl_linalg::normalize_rows;

/// Centroids `C`: `[N, d]` of the row-normalised views of `z`: `[V, N, d]`.
pub fn centroids(z: &Tensor) -> candle_core::Result<Tensor> {
    ssl_linalg::mean_of_views(&normalize_rows(z)?)
}

/// `‖C‖_*`, the nuclear norm of the centroid matrix of `z`: `[V, N, d]`.
pub fn centroid_nuclear_norm(z: &Tensor) -> candle_core::Result<Tensor> {
    nuclear_norm(&centroids(z)?)
}

/// `(1/N) Σ_i ‖[z_i^(1) … z_i^(V)]‖_*` over the row-normalised views of `z`: `[V, N, d]` (the
/// nuclear norm of each instance's `V×d` manifold matrix, averaged over instances).
pub fn mean_local_nuclear_norm(z: &Tensor) -> candle_core::Result<Tensor> {
    let manifolds = normalize_rows(z)?.transpose(0, 1)?;
    nuclear_norm_batched(&manifolds)?.mean(0)
}

/// The MMCR terms of `z`: `[V, N, d]`, unweighted.
pub struct MmcrTerms {
    /// `‖C‖_*`.
    pub centroid: Tensor,
    /// Mean local nuclear norm; `None` when it is not needed (λ = 0).
    pub local: Option<Tensor>,
}

/// Computes [`MmcrTerms`] for `z`: `[V, N, d]`; the local term only when `lambda > 0`.
pub fn mmcr_terms(z: &Tensor, lambda: f64) -> candle_core::Result<MmcrTerms> {
    Ok(MmcrTerms {
        centroid: centroid_nuclear_norm(z)?,
        local: if lambda > 0.0 {
            Some(mean_local_nuclear_norm(z)?)
        } else {
            None
        },
    })
}

/// `−‖C‖_* + λ · mean local nuclear norm` for `z`: `[V, N, d]`.
pub fn mmcr_loss(z: &Tensor, cfg: &MmcrConfig) -> candle_core::Result<Tensor> {
    combine(&mmcr_terms(z, cfg.lambda)?, cfg.lambda)
}

fn combine(t: &MmcrTerms, lambda: f64) -> candle_core::Result<Tensor> {
    let global = t.centroid.neg()?;
    match &t.local {
        Some(local) => global + (local * lambda)?,
        None => Ok(global),
    }
}

/// MMCR hyper-parameters (official CIFAR/STL default λ = 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MmcrConfig {
    /// Weight λ of the mean local (per-instance) nuclear norm.
    pub lambda: f64,
}

impl Default for MmcrConfig {
    fn default() -> Self {
        Self { lambda: 0.0 }
    }
}

impl ObjectiveConfig for MmcrConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.lambda.is_finite() && self.lambda >= 0.0,
            "`lambda` must be a finite weight ≥ 0, got {}",
            self.lambda
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Mmcr(self.clone())))
    }
}

/// The MMCR objective.
pub struct Mmcr(pub MmcrConfig);

impl Objective for Mmcr {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "with one instance the centroid nuclear norm is just the centroid's \
                               length (nothing spreads the embeddings) and the projector's batch \
                               norm is undefined",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = mmcr_terms(&z, self.0.lambda)?;
        let loss = combine(&t, self.0.lambda)?;
        let mut out = LossOutput::new(loss).with_term("centroid_nuclear_norm", t.centroid);
        if let Some(local) = t.local {
            out = out.with_term("local_nuclear_norm", local);
        }
        Ok(out)
    }
}

register_objective! {
    name: "mmcr",
    aliases: &["maximum-manifold-capacity"],
    summary: "Maximise the nuclear norm of the view centroids (maximum manifold capacity)",
    paper: "Yerxa, Kuang, Simoncelli, Chung. Learning Efficient Coding of Natural Images with Maximum Manifold Capacity Representations. NeurIPS 2023",
    keys: &[
        ConfigKey { name: "lambda", doc: "weight λ of the mean per-instance nuclear norm (0 = official CIFAR/STL setting; 5e-3 in the ImageNet momentum variant)" },
    ],
    config: MmcrConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar, spec_za_zb};

    fn views() -> candle_core::Result<Tensor> {
        let (a, b) = spec_za_zb()?;
        Tensor::stack(&[&a, &b], 0)
    }

    #[test]
    fn known_answers_spec_2_13() -> candle_core::Result<()> {
        let z = views()?;
        close(scalar(&centroid_nuclear_norm(&z)?), 3.0914497265, 1e-8);
        close(scalar(&mean_local_nuclear_norm(&z)?), 1.7290817567, 1e-8);
        close(
            scalar(&mmcr_loss(&z, &MmcrConfig::default())?),
            -3.0914497265,
            1e-8,
        );
        close(
            scalar(&mmcr_loss(&z, &MmcrConfig { lambda: 5e-3 })?),
            -3.0828043177,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let z = views()?.to_dtype(DType::F32)?;
        let loss = mmcr_loss(&z, &MmcrConfig { lambda: 5e-3 })?;
        assert_eq!(loss.dtype(), DType::F32);
        close(scalar(&loss), -3.0828043177, 1e-4);
        Ok(())
    }

    #[test]
    fn local_term_only_when_lambda_is_positive() -> candle_core::Result<()> {
        let z = views()?;
        assert!(mmcr_terms(&z, 0.0)?.local.is_none());
        assert!(mmcr_terms(&z, 1e-3)?.local.is_some());
        Ok(())
    }

    /// `Σσ` of an `r×c` matrix given as rows, from the eigenvalues of its Gram matrix.
    fn naive_nuclear(rows: &[Vec<f64>]) -> f64 {
        let r = rows.len();
        let gram = nalgebra::DMatrix::<f64>::from_fn(r, r, |i, j| {
            rows[i].iter().zip(&rows[j]).map(|(a, b)| a * b).sum()
        });
        gram.symmetric_eigenvalues()
            .iter()
            .map(|l| l.max(0.0).sqrt())
            .sum()
    }

    #[test]
    fn multi_view_matches_naive_centroids_and_manifolds() -> candle_core::Result<()> {
        let (v, n, d) = (5, 4, 7);
        let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
        let raw: Vec<Vec<Vec<f64>>> = (0..v)
            .map(|k| z.get(k)?.to_vec2())
            .collect::<candle_core::Result<_>>()?;
        let unit = |x: &[f64]| {
            let norm = x.iter().map(|a| a * a).sum::<f64>().sqrt();
            x.iter().map(|a| a / norm).collect::<Vec<f64>>()
        };
        let centroid_rows: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                (0..d)
                    .map(|j| (0..v).map(|k| unit(&raw[k][i])[j]).sum::<f64>() / v as f64)
                    .collect()
            })
            .collect();
        let global = naive_nuclear(&centroid_rows);
        let local = (0..n)
            .map(|i| naive_nuclear(&(0..v).map(|k| unit(&raw[k][i])).collect::<Vec<_>>()))
            .sum::<f64>()
            / n as f64;
        close(scalar(&centroid_nuclear_norm(&z)?), global, 1e-10);
        close(scalar(&mean_local_nuclear_norm(&z)?), local, 1e-10);
        close(
            scalar(&mmcr_loss(&z, &MmcrConfig { lambda: 0.3 })?),
            -global + 0.3 * local,
            1e-10,
        );
        Ok(())
    }

    #[test]
    fn invariant_to_row_rescaling() -> candle_core::Result<()> {
        let z = views()?;
        let scale = Tensor::new(
            &[[[2f64], [0.5], [3.], [1.]], [[1.], [7.], [0.1], [4.]]],
            &Device::Cpu,
        )?;
        let cfg = MmcrConfig { lambda: 5e-3 };
        close(
            scalar(&mmcr_loss(&z.broadcast_mul(&scale)?, &cfg)?),
            scalar(&mmcr_loss(&z, &cfg)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        for (v, n, d, lambda) in [(2, 4, 6, 0.0), (3, 5, 4, 0.5)] {
            let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
            let cfg = MmcrConfig { lambda };
            let err = ssl_core::testing::max_gradient_error(&z, |z| mmcr_loss(z, &cfg))?;
            assert!(
                err < 1e-6,
                "V={v} N={n} d={d}: relative gradient error {err}"
            );
        }
        Ok(())
    }

    #[test]
    fn requirements_need_two_instances() {
        let req = Mmcr(MmcrConfig::default()).requirements();
        assert!(req.check("mmcr", 2, 2, false).is_ok());
        assert!(req.check("mmcr", 40, 32, false).is_ok());
        let err = format!("{:#}", req.check("mmcr", 2, 1, false).unwrap_err());
        assert!(err.contains("batch norm"), "{err}");
        assert!(req.check("mmcr", 1, 8, false).is_err());
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("mmcr").unwrap();
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["lambda"].as_f64(), Some(0.0));
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let bad: serde_yaml::Value = serde_yaml::from_str("lamda: 3").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<MmcrConfig>("mmcr", &bad).unwrap_err()
        );
        assert!(
            err.contains("unknown field `lamda`") && err.contains("lambda"),
            "{err}"
        );
        let neg: serde_yaml::Value = serde_yaml::from_str("lambda: -0.1").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<MmcrConfig>("mmcr", &neg).unwrap_err()
        );
        assert!(err.contains("`lambda`"), "{err}");
    }
}
