//! Supervised and instance-classification objectives: the cross-entropy baseline, SupCon and
//! DIET.
//!
//! * `cross-entropy` — encoder → linear classifier → `CE(onehot(y), logits)` over all `B·V`
//!   crops (spec `docs/spec/objectives.md` §2.25), the supervised baseline of the IConE study.
//! * `supcon` — Khosla, Teterwak, Wang, Sarna, Tian, Isola, Maschinot, Liu & Krishnan,
//!   "Supervised Contrastive Learning", NeurIPS 2020 (eq. 2 "L_out", the reference
//!   `SupConLoss` with `contrast_mode='all'`; eq. 3 "L_in" as a variant) — spec §2.24.
//! * `diet` — Ibrahim, Bordes, Balestriero et al., "Occam's razor for self supervised learning:
//!   what is sufficient to learn good representations?" (DIET: the datum index is the target),
//!   2024 — spec §2.23.
//!
//! The three objectives work at `B = 1` (spec §5; SupCon needs `V ≥ 2` so that every anchor has a
//! positive). Cross-entropy and DIET read the backbone output (no projector) and own a linear
//! classifier `objective.classifier.{weight,bias}` that the optimiser trains with the encoder;
//! SupCon reads the projector output. Every view is a separate sample with its instance's target.
//!
//! The losses are pure functions of tensors ([`soft_cross_entropy`], [`diet_loss`],
//! [`supcon_out`], [`supcon_in`]) so the known answers of the spec can be checked without a model.
//!
//! # Example
//!
//! Spec §2.24's known answers: SupCon's `L_out` and `L_in` for two views of three images, two of
//! them of class 0.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_supervised::{supcon_in, supcon_out};
//!
//! let dev = &Device::Cpu;
//! let z = Tensor::new(
//!     &[[[1f64, 0.], [0., 1.], [1., 0.2]], [[0.9, 0.1], [0.2, 1.], [1., 0.]]],
//!     dev,
//! )?; // [V = 2, B = 3, d = 2]
//! let labels = Tensor::new(&[0u32, 1, 0], dev)?;
//! let out = supcon_out(&z, &labels, 0.1, 0.07)?.to_scalar::<f64>()?;
//! assert!((out - 1.0501244975).abs() < 1e-9);
//! let inside = supcon_in(&z, &labels, 0.1)?.to_scalar::<f64>()?;
//! assert!((inside - 0.0011248033).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

mod cross_entropy;
mod diet;
mod supcon;

pub use cross_entropy::{CrossEntropy, CrossEntropyConfig};
pub use diet::{check_instance_ids, diet_loss, Diet, DietConfig};
pub use supcon::{supcon_in, supcon_loss, supcon_out, SupCon, SupConConfig, SupConForm};

use candle_core::{Tensor, D};

pub use ssl_linalg::normalize_rows;

/// Mean over rows of `CE(q_r, logits_r)` with the label-smoothed target
/// `q_r = (1 − ε)·onehot(targets_r) + ε/K` (uniform mass includes the true class), computed as
/// `(1 − ε)·(−log p_{r,t_r}) + ε·mean_k(−log p_{r,k})` with a stable log-softmax.
/// `logits`: `[R, K]`, `targets`: `[R]` u32 class indices in `0..K`; `ε = 0` is the plain
/// cross-entropy.
pub fn soft_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    smoothing: f64,
) -> candle_core::Result<Tensor> {
    let log_p = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let true_class = log_p.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    if smoothing == 0.0 {
        return true_class.mean_all();
    }
    let uniform = log_p.mean(D::Minus1)?.neg()?;
    ((true_class * (1.0 - smoothing))? + (uniform * smoothing)?)?.mean_all()
}

/// The `V·B` crops of `x`: `[V, B, F]` as rows `v·B + i` of a `[V·B, F]` matrix.
pub(crate) fn crops(x: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, f) = x.dims3()?;
    x.reshape((v * b, f))
}

/// Per-instance targets `[B]` repeated for every view: `[V·B]`, row `v·B + i` = `t[i]`.
pub(crate) fn per_crop(targets: &Tensor, views: usize) -> candle_core::Result<Tensor> {
    targets.flatten_all()?.repeat(views)
}

#[cfg(test)]
pub(crate) mod test_support {
    use anyhow::Result;
    use candle_core::{DType, Device, Tensor};
    use ssl_core::{BuildContext, Ids, LossOutput, Objective, ParamStore};

    /// Builds `name` from YAML `overrides` with f64 parameters in `store`.
    pub fn build(
        store: &ParamStore,
        name: &str,
        overrides: &str,
        num_instances: usize,
        num_classes: Option<usize>,
        width: usize,
    ) -> Result<Box<dyn Objective>> {
        let ctx = BuildContext {
            vb: store
                .var_builder(&Device::Cpu)
                .set_dtype(DType::F64)
                .pp("objective"),
            num_instances,
            num_classes,
            instance_labels: None,
            projection_dim: width,
            feature_dim: width,
            views: 2,
            global_views: 2,
            batch_size: 4,
            patches: None,
        };
        let value: serde_yaml::Value = serde_yaml::from_str(overrides)?;
        (ssl_core::find(name)?.build)(&value, &ctx)
    }

    /// One loss call with `z` as both projections and features.
    pub fn run(
        objective: &mut dyn Objective,
        z: &Tensor,
        indices: &[u32],
        labels: Option<&[u32]>,
    ) -> Result<LossOutput> {
        let indices = Ids::new(indices, &Device::Cpu)?;
        let labels = labels.map(|l| Ids::new(l, &Device::Cpu)).transpose()?;
        let batch = ssl_core::testing::batch(z, &indices, labels.as_ref());
        objective.loss(&batch)
    }

    /// The message of a loss call that must fail.
    pub fn run_err(
        objective: &mut dyn Objective,
        z: &Tensor,
        indices: &[u32],
        labels: Option<&[u32]>,
    ) -> String {
        match run(objective, z, indices, labels) {
            Ok(_) => panic!("the loss was computed"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// `name` is a canonical name and its documented keys are exactly its default config's
    /// keys; returns the defaults.
    pub fn assert_documented(name: &str) -> serde_yaml::Value {
        assert_eq!(ssl_core::find(name).unwrap().name, name);
        ssl_core::testing::documented_defaults(name)
    }

    /// Spec §2.23's logits `[[2,0,0,1],[0,0,3,0]]` with targets `[0, 2]` (f64).
    pub fn kat_logits() -> candle_core::Result<(Tensor, Tensor)> {
        let logits = Tensor::new(&[[2f64, 0., 0., 1.], [0., 0., 3., 0.]], &Device::Cpu)?;
        let targets = Tensor::new(&[0u32, 2], &Device::Cpu)?;
        Ok((logits, targets))
    }

    /// The message of a failed parse of `yaml` as `name`'s configuration.
    pub fn config_error(name: &str, yaml: &str) -> String {
        let store = ParamStore::new(7);
        match build(&store, name, yaml, 8, Some(3), 4) {
            Ok(_) => panic!("`{yaml}` was accepted by {name}"),
            Err(e) => format!("{e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::kat_logits;
    use super::*;
    use candle_core::Device;
    use ssl_core::testing::{close, max_gradient_error, randn, scalar};

    /// By hand: row 0 `lse = ln(e² + 2 + e) = 2.4938117091`, `−log p₀ = 0.4938117091`;
    /// row 1 `lse = ln(3 + e³) = 3.1392063142`, `−log p₂ = 0.1392063142`; mean `0.3165090116`.
    #[test]
    fn cross_entropy_known_answer_and_candle_agree() -> candle_core::Result<()> {
        let (logits, targets) = kat_logits()?;
        let ours = scalar(&soft_cross_entropy(&logits, &targets, 0.0)?);
        close(ours, 0.316_509_011_645_847_6, 1e-12);
        close(
            ours,
            scalar(&candle_nn::loss::cross_entropy(&logits, &targets)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn smoothing_is_the_soft_target_cross_entropy() -> candle_core::Result<()> {
        let logits = randn(0f64, 2., (5, 7), &Device::Cpu)?;
        let targets = Tensor::new(&[0u32, 6, 3, 3, 1], &Device::Cpu)?;
        let eps = 0.3;
        let rows = logits.to_vec2::<f64>()?;
        let mut expected = 0.0;
        for (row, &t) in rows.iter().zip(&[0usize, 6, 3, 3, 1]) {
            let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
            for (k, x) in row.iter().enumerate() {
                let q = eps / 7.0 + if k == t { 1.0 - eps } else { 0.0 };
                expected -= q * (x - lse);
            }
        }
        close(
            scalar(&soft_cross_entropy(&logits, &targets, eps)?),
            expected / 5.0,
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn cross_entropy_is_stable_for_huge_logits() -> candle_core::Result<()> {
        let logits = Tensor::new(&[[1000f32, 0.], [0., -1000.]], &Device::Cpu)?;
        let targets = Tensor::new(&[1u32, 0], &Device::Cpu)?;
        close(
            scalar(&soft_cross_entropy(&logits, &targets, 0.5)?),
            // row 0: 0.5·1000 + 0.5·500; row 1: 0 + 0.5·500
            (750.0 + 250.0) / 2.0,
            1e-6,
        );
        Ok(())
    }

    #[test]
    fn cross_entropy_gradient_matches_finite_differences() -> candle_core::Result<()> {
        let logits = randn(0f64, 1., (4, 5), &Device::Cpu)?;
        let targets = Tensor::new(&[4u32, 0, 2, 2], &Device::Cpu)?;
        for eps in [0.0, 0.8] {
            let err = max_gradient_error(&logits, |x| soft_cross_entropy(x, &targets, eps))?;
            assert!(err < 1e-6, "ε={eps}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn crops_are_view_major() -> candle_core::Result<()> {
        let x = Tensor::arange(0f64, 12., &Device::Cpu)?.reshape((2, 3, 2))?;
        assert_eq!(
            crops(&x)?.to_vec2::<f64>()?[4],
            x.get(1)?.get(1)?.to_vec1::<f64>()?
        );
        let t = Tensor::new(&[7u32, 8, 9], &Device::Cpu)?;
        assert_eq!(per_crop(&t, 2)?.to_vec1::<u32>()?, [7, 8, 9, 7, 8, 9]);
        Ok(())
    }
}
