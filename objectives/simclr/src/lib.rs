//! SimCLR's NT-Xent loss in its multi-view form.
//!
//! Chen, Kornblith, Norouzi & Hinton, "A Simple Framework for Contrastive Learning of Visual
//! Representations", ICML 2020, eq. 1. Spec: `shared/spec/objectives.md` §2.6 (practical form).
//!
//! All `V·B` embeddings are row-normalised and stacked; for anchor `a` with positives `P(a)` (the
//! other views of its instance), `ℓ_a = −log(Σ_{p∈P(a)} e^{s_ap} / Σ_{b≠a} e^{s_ab})`,
//! `s_ab = ⟨z_a, z_b⟩/τ`, and the loss is the mean over anchors. Needs B ≥ 2 (a negative).

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

/// Added to logits that must not count (the anchor itself, non-positives in the numerator).
const MASKED: f64 = -1e9;

/// Rows of `x` scaled to unit L2 norm (`x / max(‖x‖, 1e-12)`).
pub fn normalize_rows(x: &Tensor) -> candle_core::Result<Tensor> {
    let norm = x
        .sqr()?
        .sum_keepdim(D::Minus1)?
        .sqrt()?
        .clamp(1e-12, f64::INFINITY)?;
    x.broadcast_div(&norm)
}

/// Row-wise `log Σ exp(x)`, stable. `x`: `[R, C]` → `[R]`.
pub fn logsumexp_rows(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    x.broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        .add(&max)?
        .squeeze(D::Minus1)
}

/// Masks for `V·B` stacked embeddings (row `v·B + i`): `(self, positives)` as additive masks
/// (`0` where the entry counts, [`MASKED`] where it does not) of shape `[VB, VB]`.
fn masks(
    views: usize,
    batch: usize,
    dtype: DType,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let n = views * batch;
    let mut not_self = vec![0f64; n * n];
    let mut positive = vec![MASKED; n * n];
    for a in 0..n {
        for b in 0..n {
            if a == b {
                not_self[a * n + b] = MASKED;
            } else if a % batch == b % batch {
                positive[a * n + b] = 0.0;
            }
        }
    }
    let to = |v: Vec<f64>| Tensor::from_vec(v, (n, n), dev)?.to_dtype(dtype);
    Ok((to(not_self)?, to(positive)?))
}

/// NT-Xent over `z`: `[V, B, d]` with temperature `tau`.
pub fn nt_xent(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    let z = normalize_rows(&z.reshape((v * b, d))?)?;
    let logits = (z.matmul(&z.t()?)? / tau)?;
    let (not_self, positive) = masks(v, b, z.dtype(), z.device())?;
    let logits = (logits + not_self)?;
    let denominator = logsumexp_rows(&logits)?;
    let numerator = logsumexp_rows(&(logits + positive)?)?;
    (denominator - numerator)?.mean_all()
}

/// SimCLR hyper-parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimclrConfig {
    /// Temperature τ (0.5 as in the SimCLR CIFAR setting and the IConE baselines).
    pub temperature: f64,
}

impl Default for SimclrConfig {
    fn default() -> Self {
        Self { temperature: 0.5 }
    }
}

impl ObjectiveConfig for SimclrConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.temperature.is_finite() && self.temperature > 0.0,
            "`temperature` must be > 0, got {}",
            self.temperature
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Simclr(self.clone())))
    }
}

/// The SimCLR objective.
pub struct Simclr(pub SimclrConfig);

impl Objective for Simclr {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "each anchor needs at least one negative from another instance",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let loss = nt_xent(&z, self.0.temperature)?;
        Ok(LossOutput::new(loss.clone()).with_term("nt_xent", loss))
    }
}

register_objective! {
    name: "simclr",
    aliases: &["nt-xent", "ntxent"],
    summary: "Normalised temperature-scaled cross-entropy over all views (sample-contrastive)",
    paper: "Chen, Kornblith, Norouzi, Hinton. A Simple Framework for Contrastive Learning of Visual Representations. ICML 2020",
    keys: &[ConfigKey { name: "temperature", doc: "softmax temperature τ" }],
    config: SimclrConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views() -> candle_core::Result<Tensor> {
        let dev = Device::Cpu;
        let x1 = Tensor::new(&[[1f64, 0.], [0., 1.], [-1., 1.]], &dev)?;
        let x2 = Tensor::new(&[[1f64, 0.2], [0.1, 1.], [-1., 0.5]], &dev)?;
        Tensor::stack(&[&x1, &x2], 0)
    }

    fn scalar(t: &Tensor) -> f64 {
        t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
    }

    #[test]
    fn known_answers_spec_2_6() -> candle_core::Result<()> {
        let z = views()?;
        assert!((scalar(&nt_xent(&z, 0.5)?) - 0.6129270798).abs() < 1e-9);
        assert!((scalar(&nt_xent(&z, 0.1)?) - 0.0371517277).abs() < 1e-9);
        let z32 = z.to_dtype(DType::F32)?;
        assert!((scalar(&nt_xent(&z32, 0.5)?) - 0.6129270798).abs() < 1e-4 * 0.62);
        Ok(())
    }

    #[test]
    fn single_instance_gives_zero_loss() -> candle_core::Result<()> {
        // Spec §2.6: at N = 1 every anchor's only candidate is its positive.
        let z = Tensor::randn(0f64, 1., (2, 1, 4), &Device::Cpu)?;
        assert!(scalar(&nt_xent(&z, 0.5)?).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn invariant_to_row_rescaling() -> candle_core::Result<()> {
        let z = views()?;
        let scale = Tensor::new(&[[[2f64], [0.5], [3.]], [[1.], [7.], [0.1]]], &Device::Cpu)?;
        let scaled = z.broadcast_mul(&scale)?;
        assert!((scalar(&nt_xent(&z, 0.5)?) - scalar(&nt_xent(&scaled, 0.5)?)).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn multi_view_matches_direct_sum_of_positives() -> candle_core::Result<()> {
        let z = Tensor::randn(0f64, 1., (3, 4, 5), &Device::Cpu)?;
        let tau = 0.3;
        let flat = normalize_rows(&z.reshape((12, 5))?)?.to_vec2::<f64>()?;
        let dot = |a: usize, b: usize| (0..5).map(|k| flat[a][k] * flat[b][k]).sum::<f64>() / tau;
        let mut total = 0.0;
        for a in 0..12 {
            let den: f64 = (0..12).filter(|&b| b != a).map(|b| dot(a, b).exp()).sum();
            let num: f64 = (0..12)
                .filter(|&b| b != a && b % 4 == a % 4)
                .map(|b| dot(a, b).exp())
                .sum();
            total += -(num / den).ln();
        }
        assert!((scalar(&nt_xent(&z, tau)?) - total / 12.0).abs() < 1e-10);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let z = Tensor::randn(0f64, 1., (2, 3, 4), &Device::Cpu)?;
        let err = ssl_core::testing::max_gradient_error(&z, |z| nt_xent(z, 0.5))?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    #[test]
    fn registered_and_rejects_bad_temperature() {
        let reg = ssl_core::find("NT-Xent").unwrap();
        assert_eq!(reg.name, "simclr");
        let bad: serde_yaml::Value = serde_yaml::from_str("temperature: 0").unwrap();
        let err = format!(
            "{:#}",
            ssl_core::registry::parse_config::<SimclrConfig>("simclr", &bad).unwrap_err()
        );
        assert!(err.contains("`temperature` must be > 0"), "{err}");
    }
}
