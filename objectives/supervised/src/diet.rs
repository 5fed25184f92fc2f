//! DIET: the datum index is the target (spec `docs/spec/objectives.md` §2.23).
//!
//! Backbone output → linear classifier with one output per training instance (no projector);
//! target = the instance's stable data-set index; loss = cross-entropy with label smoothing ε
//! (default 0.8) and target `(1 − ε)·onehot + ε/N` (the uniform mass includes the true class),
//! averaged over all `B·V` crops. Works at `B = 1` and `V = 1`.

use anyhow::Result;
use candle_core::Tensor;
use candle_nn::{Linear, Module};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, Ids, LossOutput, Objective,
    ObjectiveConfig, Requirements,
};

use crate::{crops, per_crop, soft_cross_entropy};

/// DIET's loss: mean over the rows of `logits`: `[R, N]` of the label-smoothed cross-entropy
/// with instance targets `targets`: `[R]` u32 in `0..N`.
pub fn diet_loss(
    logits: &Tensor,
    targets: &Tensor,
    label_smoothing: f64,
) -> candle_core::Result<Tensor> {
    soft_cross_entropy(logits, targets, label_smoothing)
}

/// Checks that every instance id of `indices` has a row in a classifier of `rows` outputs.
pub fn check_instance_ids(indices: &Ids, rows: usize) -> Result<()> {
    indices.check_below(rows, |id| {
        format!(
            "objective `diet`: instance id {id} outside the {rows}-row classifier; the classifier \
             was built for a data set of {rows} training instances"
        )
    })
}

/// DIET hyper-parameters (the paper's defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DietConfig {
    /// Label smoothing ε of the instance cross-entropy, in `[0, 1)`.
    pub label_smoothing: f64,
}

impl Default for DietConfig {
    fn default() -> Self {
        Self {
            label_smoothing: 0.8,
        }
    }
}

impl ObjectiveConfig for DietConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.label_smoothing.is_finite() && (0.0..1.0).contains(&self.label_smoothing),
            "`label_smoothing` must be in [0, 1) (0 = plain cross-entropy; the paper uses 0.8), got {}",
            self.label_smoothing
        );
        Ok(())
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        anyhow::ensure!(
            ctx.num_instances >= 1,
            "objective `diet` needs at least one training instance"
        );
        let classifier =
            candle_nn::linear(ctx.feature_dim, ctx.num_instances, ctx.vb.pp("classifier"))?;
        Ok(Box::new(Diet {
            classifier,
            instances: ctx.num_instances,
            label_smoothing: self.label_smoothing,
        }))
    }
}

/// The DIET objective with its `N`-output classifier (`objective.classifier`).
pub struct Diet {
    classifier: Linear,
    instances: usize,
    label_smoothing: f64,
}

impl Objective for Diet {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 1,
            min_batch: 1,
            labels: false,
            projector: false,
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        check_instance_ids(batch.indices, self.instances)?;
        let logits = self.classifier.forward(&crops(batch.projections)?)?;
        let targets = per_crop(batch.indices.tensor(), batch.views())?;
        Ok(LossOutput::new(diet_loss(
            &logits,
            &targets,
            self.label_smoothing,
        )?))
    }
}

register_objective! {
    name: "diet",
    aliases: &["datum-index-as-target"],
    summary: "Classify every training image as its own class (datum index as target, label smoothing)",
    paper: "Ibrahim, Bordes, Balestriero et al. Occam's razor for self supervised learning: what is sufficient to learn good representations? (DIET), 2024",
    keys: &[
        ConfigKey { name: "label_smoothing", doc: "label smoothing ε in [0, 1): target (1−ε)·onehot + ε/N over the N training instances (paper: 0.8)" },
    ],
    config: DietConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_documented, build, config_error, kat_logits, run, run_err};
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, max_gradient_error, randn, scalar};
    use ssl_core::ParamStore;

    #[test]
    fn known_answer_spec_2_23() -> candle_core::Result<()> {
        let (logits, targets) = kat_logits()?;
        close(
            scalar(&diet_loss(&logits, &targets, 0.8)?),
            1.7165090116,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (logits, targets) = kat_logits()?;
        let loss = diet_loss(&logits.to_dtype(DType::F32)?, &targets, 0.8)?;
        assert_eq!(loss.dtype(), DType::F32);
        close(scalar(&loss), 1.7165090116, 1e-4);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let logits = randn(0f64, 1., (6, 9), &Device::Cpu)?;
        let targets = Tensor::new(&[8u32, 0, 3, 3, 5, 1], &Device::Cpu)?;
        for eps in [0.8, 0.0, 0.3] {
            let err = max_gradient_error(&logits, |x| diet_loss(x, &targets, eps))?;
            assert!(err < 1e-6, "ε={eps}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let defaults = assert_documented("diet");
        assert_eq!(defaults["label_smoothing"].as_f64(), Some(0.8));
    }

    #[test]
    fn built_objective_classifies_instances_at_batch_one() -> Result<()> {
        let store = ParamStore::new(7);
        let mut objective = build(&store, "diet", "label_smoothing: 0.5", 10, None, 4)?;
        let req = objective.requirements();
        assert!(!req.labels && !req.projector);
        assert_eq!((req.min_views, req.min_batch), (1, 1));
        assert!(req.check("diet", 1, 1, false).is_ok());

        let z = randn(0f64, 1., (2, 1, 4), &Device::Cpu)?;
        let loss = scalar(&run(objective.as_mut(), &z, &[7], None)?.loss);
        let vars = store.tensors();
        let w = vars["objective.classifier.weight"].clone();
        let b = vars["objective.classifier.bias"].clone();
        assert_eq!(w.dims(), &[10, 4]);
        let logits = z.reshape((2, 4))?.matmul(&w.t()?)?.broadcast_add(&b)?;
        let targets = Tensor::new(&[7u32, 7], &Device::Cpu)?;
        close(loss, scalar(&diet_loss(&logits, &targets, 0.5)?), 1e-12);
        Ok(())
    }

    #[test]
    fn instance_id_outside_the_classifier_is_an_error() -> Result<()> {
        let store = ParamStore::new(7);
        let mut objective = build(&store, "diet", "{}", 10, None, 4)?;
        let z = randn(0f64, 1., (2, 2, 4), &Device::Cpu)?;
        let err = run_err(objective.as_mut(), &z, &[3, 10], None);
        assert!(
            err.contains("instance id 10") && err.contains("10 training instances"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn invalid_configuration_is_rejected() {
        for bad in [
            "label_smoothing: 1.0",
            "label_smoothing: -0.1",
            "label_smoothing: .nan",
        ] {
            let err = config_error("diet", bad);
            assert!(
                err.contains("`label_smoothing`") && err.contains("[0, 1)"),
                "{err}"
            );
        }
        let err = config_error("diet", "smoothing: 0.1");
        assert!(
            err.contains("unknown field `smoothing`") && err.contains("label_smoothing"),
            "{err}"
        );
    }
}
