//! SupCon: supervised contrastive learning (spec `docs/spec/objectives.md` §2.24).
//!
//! The `V·B` projections are row-normalised and stacked (row `v·B + i` is view `v` of instance
//! `i`); every embedding is an anchor (`contrast_mode='all'`), `s_ab = ⟨z_a, z_b⟩/τ`, and the
//! positives `P(a)` are the other embeddings with the anchor's label (the other views of its own
//! image included).
//!
//! * **Default, `form: out`** (eq. 2 and the reference `SupConLoss`):
//!   `ℓ_a = −(τ/τ_base)·(1/|P(a)|) Σ_{p∈P(a)} [s_ap − lse_{b≠a} s_ab]`.
//!   Unlike the reference, no 1e-9 is added inside the log of the denominator (spec: 1.0501244975
//!   rather than the reference's 1.0501244984).
//! * **Variant, `form: in`** (one framework's SimCLR loss with labels):
//!   `ℓ_a = −log(Σ_{p∈P(a)} e^{s_ap} / Σ_{b≠a} e^{s_ab})`; `base_temperature` plays no part.
//!
//! `L = mean_a ℓ_a`. Both need `V ≥ 2` so that every anchor has a positive; with `V = 1` an
//! anchor without positives contributes 0 to `L_out` (as in the reference) and an enormous value
//! to `L_in`, which is why the objective requires two views.

use anyhow::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

use crate::{normalize_rows, per_crop};
use ssl_linalg::logsumexp_rows;

/// Added to logits excluded from a log-sum-exp.
const MASKED: f64 = -1e9;

/// What both forms share for `z`: `[V, B, d]` and `labels`: `[B]` u32.
struct Pairs {
    /// `s_ab = ⟨ẑ_a, ẑ_b⟩/τ`, `[VB, VB]`.
    logits: Tensor,
    /// `1` where `b ∈ P(a)` (same label, `b ≠ a`), else `0`.
    positives: Tensor,
    /// `lse_{b≠a} s_ab`, `[VB]`.
    denominator: Tensor,
}

fn pairs(z: &Tensor, labels: &Tensor, tau: f64) -> candle_core::Result<Pairs> {
    let (v, b, d) = z.dims3()?;
    if labels.elem_count() != b {
        candle_core::bail!(
            "SupCon: {} labels for a batch of {b} instances",
            labels.elem_count()
        );
    }
    let n = v * b;
    let (dtype, dev) = (z.dtype(), z.device());
    let z = normalize_rows(z)?.reshape((n, d))?;
    let logits = (z.matmul(&z.t()?)? / tau)?;
    let diagonal = Tensor::eye(n, dtype, dev)?;
    let label = per_crop(labels, v)?;
    let same = label
        .unsqueeze(1)?
        .broadcast_eq(&label.unsqueeze(0)?)?
        .to_dtype(dtype)?;
    let positives = (same - &diagonal)?;
    let denominator = logsumexp_rows(&(&logits + (diagonal * MASKED)?)?)?;
    Ok(Pairs {
        logits,
        positives,
        denominator,
    })
}

/// SupCon `L_out` (spec §2.24 Default) of `z`: `[V, B, d]` (rows are normalised here) with
/// labels `[B]` u32, temperature `tau` and base temperature `tau_base`.
pub fn supcon_out(
    z: &Tensor,
    labels: &Tensor,
    tau: f64,
    tau_base: f64,
) -> candle_core::Result<Tensor> {
    let p = pairs(z, labels, tau)?;
    let log_prob = p.logits.broadcast_sub(&p.denominator.unsqueeze(1)?)?;
    let count = p.positives.sum(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
    let mean_log_prob = (&p.positives * log_prob)?.sum(D::Minus1)?.div(&count)?;
    (mean_log_prob * (-tau / tau_base))?.mean_all()
}

/// SupCon `L_in` (spec §2.24 Variant) of `z`: `[V, B, d]` with labels `[B]` u32.
pub fn supcon_in(z: &Tensor, labels: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    let p = pairs(z, labels, tau)?;
    let hide = ((p.positives.ones_like()? - &p.positives)? * MASKED)?;
    let numerator = logsumexp_rows(&(&p.logits + hide)?)?;
    (p.denominator - numerator)?.mean_all()
}

/// Where the sum over positives sits (Khosla et al. eqs. 2 and 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum SupConForm {
    /// `L_out`: mean of the positives' log-probabilities (reference implementation).
    Out,
    /// `L_in`: log of the positives' summed probability.
    In,
}

impl TryFrom<String> for SupConForm {
    type Error = String;
    fn try_from(name: String) -> std::result::Result<Self, String> {
        match name.to_ascii_lowercase().as_str() {
            "out" => Ok(SupConForm::Out),
            "in" => Ok(SupConForm::In),
            _ => Err(format!(
                "`form` must be `out` (mean log-probability over positives) or `in` (log of the \
                 summed positives), got `{name}`"
            )),
        }
    }
}

/// The SupCon loss of `z`: `[V, B, d]` with labels `[B]` in the configured form.
pub fn supcon_loss(z: &Tensor, labels: &Tensor, cfg: &SupConConfig) -> candle_core::Result<Tensor> {
    match cfg.form {
        SupConForm::Out => supcon_out(z, labels, cfg.temperature, cfg.base_temperature),
        SupConForm::In => supcon_in(z, labels, cfg.temperature),
    }
}

/// SupCon hyper-parameters (reference defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupConConfig {
    /// Temperature τ of the similarities.
    pub temperature: f64,
    /// Base temperature τ_base of the `τ/τ_base` factor (`out` form only).
    pub base_temperature: f64,
    /// `out` (default) or `in`.
    pub form: SupConForm,
}

impl Default for SupConConfig {
    fn default() -> Self {
        Self {
            temperature: 0.07,
            base_temperature: 0.07,
            form: SupConForm::Out,
        }
    }
}

fn check_positive(key: &str, value: f64) -> Result<()> {
    anyhow::ensure!(
        value.is_finite() && value > 0.0,
        "`{key}` must be a finite number > 0, got {value}"
    );
    Ok(())
}

impl ObjectiveConfig for SupConConfig {
    fn validate(&self) -> Result<()> {
        check_positive("temperature", self.temperature)?;
        check_positive("base_temperature", self.base_temperature)
    }

    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(SupCon(self.clone())))
    }
}

/// The SupCon objective.
pub struct SupCon(pub SupConConfig);

impl Objective for SupCon {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 2,
            min_batch: 1,
            labels: true,
            projector: true,
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let labels = batch.require_labels("supcon")?;
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let labels = batch.collective.all_gather(labels.tensor(), 0)?;
        Ok(LossOutput::new(supcon_loss(&z, &labels, &self.0)?))
    }
}

register_objective! {
    name: "supcon",
    aliases: &["supervised-contrastive"],
    summary: "Supervised contrastive loss: every same-label embedding is a positive",
    paper: "Khosla, Teterwak, Wang, Sarna, Tian, Isola, Maschinot, Liu, Krishnan. Supervised Contrastive Learning. NeurIPS 2020",
    keys: &[
        ConfigKey { name: "temperature", doc: "temperature τ of the cosine similarities (reference 0.07; 0.1 in many configs)" },
        ConfigKey { name: "base_temperature", doc: "τ_base of the (τ/τ_base) loss scale of the `out` form (reference 0.07)" },
        ConfigKey { name: "form", doc: "`out` (mean log-probability over positives, eq. 2, default) or `in` (log of the summed positives, eq. 3)" },
    ],
    config: SupConConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_documented, build, config_error, run, run_err};
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, max_gradient_error, randn, scalar};
    use ssl_core::ParamStore;

    /// Spec §2.24: per image (view0, view1), stored view-major as `[V = 2, B = 3, d = 2]`.
    fn kat() -> candle_core::Result<(Tensor, Tensor)> {
        let view0 = [[1f64, 0.], [0., 1.], [1., 0.2]];
        let view1 = [[0.9f64, 0.1], [0.2, 1.], [1., 0.]];
        let z = Tensor::new(&[view0, view1], &Device::Cpu)?;
        Ok((z, Tensor::new(&[0u32, 1, 0], &Device::Cpu)?))
    }

    #[test]
    fn known_answers_spec_2_24() -> candle_core::Result<()> {
        let (z, labels) = kat()?;
        let out = scalar(&supcon_out(&z, &labels, 0.1, 0.07)?);
        close(out, 1.0501244975, 1e-8);
        // No 1e-9 in the denominator's log: the reference's 1.0501244984 is 8.6e-10 (relative)
        // away, the spec's rounding at most 4.8e-11.
        close(out, 1.0501244975, 2e-10);
        assert!((out - 1.0501244984).abs() > 5e-10, "{out}");
        // The spec gives L_in to 8 significant digits (rounding error up to 4.5e-8 relative).
        close(scalar(&supcon_in(&z, &labels, 0.1)?), 0.0011248033, 5e-8);
        Ok(())
    }

    #[test]
    fn known_answers_in_f32() -> candle_core::Result<()> {
        let (z, labels) = kat()?;
        let z = z.to_dtype(DType::F32)?;
        let out = supcon_out(&z, &labels, 0.1, 0.07)?;
        assert_eq!(out.dtype(), DType::F32);
        close(scalar(&out), 1.0501244975, 1e-4);
        close(scalar(&supcon_in(&z, &labels, 0.1)?), 0.0011248033, 1e-3);
        Ok(())
    }

    #[test]
    fn invariant_to_row_rescaling_and_scaled_by_base_temperature() -> candle_core::Result<()> {
        let (z, labels) = kat()?;
        let scale = Tensor::new(&[[[2f64], [0.5], [3.]], [[7.], [0.1], [4.]]], &Device::Cpu)?;
        close(
            scalar(&supcon_out(&z.broadcast_mul(&scale)?, &labels, 0.1, 0.07)?),
            1.0501244975,
            1e-8,
        );
        close(
            scalar(&supcon_out(&z, &labels, 0.1, 0.1)?),
            1.0501244975 * 0.07 / 0.1,
            1e-8,
        );
        Ok(())
    }

    /// Plain-loop reference for random inputs, several views and repeated labels.
    fn naive(z: &Tensor, labels: &[u32], tau: f64, tau_base: f64) -> (f64, f64) {
        let z = z.to_vec3::<f64>().unwrap();
        let mut rows = Vec::new();
        let mut lab = Vec::new();
        for view in &z {
            for (row, &l) in view.iter().zip(labels) {
                let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                rows.push(row.iter().map(|x| x / norm).collect::<Vec<_>>());
                lab.push(l);
            }
        }
        let n = rows.len();
        let s = |a: usize, b: usize| {
            rows[a]
                .iter()
                .zip(&rows[b])
                .map(|(x, y)| x * y)
                .sum::<f64>()
                / tau
        };
        let (mut out, mut inn) = (0.0, 0.0);
        for a in 0..n {
            let others: Vec<usize> = (0..n).filter(|&b| b != a).collect();
            let positives: Vec<usize> = others
                .iter()
                .copied()
                .filter(|&b| lab[b] == lab[a])
                .collect();
            let lse = others.iter().map(|&b| s(a, b).exp()).sum::<f64>().ln();
            out -= tau / tau_base * positives.iter().map(|&p| s(a, p) - lse).sum::<f64>()
                / positives.len() as f64;
            inn -= positives.iter().map(|&p| s(a, p).exp()).sum::<f64>().ln() - lse;
        }
        (out / n as f64, inn / n as f64)
    }

    #[test]
    fn multi_view_matches_plain_loops() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (3, 5, 4), &Device::Cpu)?;
        let labels = [1u32, 0, 1, 2, 1];
        let l = Tensor::new(&labels, &Device::Cpu)?;
        let (out, inn) = naive(&z, &labels, 0.5, 0.07);
        close(scalar(&supcon_out(&z, &l, 0.5, 0.07)?), out, 1e-10);
        close(scalar(&supcon_in(&z, &l, 0.5)?), inn, 1e-10);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        for (v, b, d) in [(2, 3, 4), (3, 4, 3)] {
            let z = randn(0f64, 1., (v, b, d), &Device::Cpu)?;
            let labels = Tensor::new(&[0u32, 1, 0, 1][..b], &Device::Cpu)?;
            let out = max_gradient_error(&z, |z| supcon_out(z, &labels, 0.5, 0.07))?;
            assert!(out < 1e-6, "out V={v} B={b}: relative gradient error {out}");
            let inn = max_gradient_error(&z, |z| supcon_in(z, &labels, 0.5))?;
            assert!(inn < 1e-6, "in V={v} B={b}: relative gradient error {inn}");
        }
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let defaults = assert_documented("supcon");
        assert_eq!(defaults["temperature"].as_f64(), Some(0.07));
        assert_eq!(defaults["base_temperature"].as_f64(), Some(0.07));
        assert_eq!(defaults["form"].as_str(), Some("out"));
    }

    #[test]
    fn built_objective_works_at_batch_one_with_two_views() -> Result<()> {
        let (z, labels) = kat()?;
        let labels = labels.to_vec1::<u32>()?;
        for (form, expected) in [("out", 1.0501244975), ("in", 0.0011248033)] {
            let store = ParamStore::new(7);
            let yaml = format!("{{temperature: 0.1, base_temperature: 0.07, form: {form}}}");
            let mut objective = build(&store, "supcon", &yaml, 8, Some(2), 2)?;
            let loss = run(objective.as_mut(), &z, &[0, 1, 2], Some(&labels))?.loss;
            close(scalar(&loss), expected, 5e-8);
        }
        let store = ParamStore::new(7);
        let mut objective = build(&store, "supcon", "", 8, Some(2), 2)?;
        let req = objective.requirements();
        assert!(req.labels && req.projector);
        assert!(req.check("supcon", 2, 1, true).is_ok());
        assert!(req.check("supcon", 1, 4, true).is_err());
        let one = z.narrow(1, 0, 1)?;
        let loss = scalar(&run(objective.as_mut(), &one, &[0], Some(&[0]))?.loss);
        // One image, two views: each anchor's only other embedding is its positive.
        close(loss, 0.0, 1e-12);
        let err = run_err(objective.as_mut(), &z, &[0, 1, 2], None);
        assert!(err.contains("labels"), "{err}");
        Ok(())
    }

    #[test]
    fn invalid_configuration_is_rejected() {
        for (bad, key) in [
            ("temperature: 0", "`temperature`"),
            ("temperature: -0.1", "`temperature`"),
            ("temperature: .inf", "`temperature`"),
            ("base_temperature: 0", "`base_temperature`"),
        ] {
            let err = config_error("supcon", bad);
            assert!(err.contains(key) && err.contains("> 0"), "{bad}: {err}");
        }
        let err = config_error("supcon", "form: both");
        assert!(
            err.contains("form") && err.contains("`out`") && err.contains("`in`"),
            "{err}"
        );
        let err = config_error("supcon", "temprature: 0.1");
        assert!(
            err.contains("unknown field `temprature`") && err.contains("temperature"),
            "{err}"
        );
    }
}
