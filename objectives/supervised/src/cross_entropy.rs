//! The supervised cross-entropy baseline (spec `docs/spec/objectives.md` §2.25): backbone output →
//! linear classifier → `CE(onehot(y), logits)`, averaged over all `B·V` crops (each view is a
//! separate sample with its instance's label), no label smoothing.

use anyhow::Result;
use candle_nn::{Linear, Module};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, LossOutput, Objective, ObjectiveConfig, Requirements,
};

use crate::{crops, per_crop, soft_cross_entropy};

/// The cross-entropy baseline has no hyper-parameters of its own (the classifier's width is the
/// data set's number of classes; optimiser settings are the run's).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CrossEntropyConfig {}

impl ObjectiveConfig for CrossEntropyConfig {
    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let Some(classes) = ctx.num_classes else {
            anyhow::bail!(
                "objective `cross-entropy` needs the number of classes of the data set to size its \
                 classifier, but the data set has no labels; use a labelled data set"
            );
        };
        anyhow::ensure!(
            classes >= 1,
            "objective `cross-entropy` needs at least one class, the data set has 0"
        );
        let classifier = candle_nn::linear(ctx.feature_dim, classes, ctx.vb.pp("classifier"))?;
        Ok(Box::new(CrossEntropy {
            classifier,
            classes,
        }))
    }
}

/// The cross-entropy objective with its linear classifier (`objective.classifier`).
pub struct CrossEntropy {
    classifier: Linear,
    classes: usize,
}

impl Objective for CrossEntropy {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 1,
            min_batch: 1,
            labels: true,
            projector: false,
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let labels = batch.require_labels("cross-entropy")?;
        let classes = self.classes;
        labels.check_below(classes, |y| {
            format!(
                "class label {y} outside the {classes}-class classifier of objective `cross-entropy`"
            )
        })?;
        let logits = self.classifier.forward(&crops(batch.projections)?)?;
        let targets = per_crop(labels.tensor(), batch.views())?;
        Ok(LossOutput::new(soft_cross_entropy(&logits, &targets, 0.0)?))
    }
}

register_objective! {
    name: "cross-entropy",
    aliases: &["ce"],
    summary: "Supervised baseline: linear classifier on the backbone, cross-entropy over every crop",
    paper: "Standard supervised training with the cross-entropy loss (the supervised baseline of the IConE study, spec §2.25)",
    keys: &[],
    config: CrossEntropyConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_documented, build, config_error, run, run_err};
    use candle_core::{Device, Tensor};
    use ssl_core::testing::{close, randn, scalar};
    use ssl_core::ParamStore;

    #[test]
    fn registered_without_keys() {
        assert_documented("cross-entropy");
        assert_eq!(ssl_core::find("CE").unwrap().name, "cross-entropy");
    }

    #[test]
    fn loss_is_the_classifier_cross_entropy_over_every_crop() -> Result<()> {
        let store = ParamStore::new(7);
        let mut objective = build(&store, "cross-entropy", "{}", 8, Some(3), 4)?;
        let req = objective.requirements();
        assert!(req.labels && !req.projector);
        assert_eq!((req.min_views, req.min_batch), (1, 1));
        let z = randn(0f64, 1., (2, 3, 4), &Device::Cpu)?;
        let labels = [2u32, 0, 1];
        let loss = scalar(&run(objective.as_mut(), &z, &[5, 6, 7], Some(&labels))?.loss);

        let vars = store.tensors();
        let w = vars["objective.classifier.weight"].clone();
        let b = vars["objective.classifier.bias"].clone();
        assert_eq!((w.dims(), b.dims()), (&[3, 4][..], &[3][..]));
        let logits = z.reshape((6, 4))?.matmul(&w.t()?)?.broadcast_add(&b)?;
        let targets = Tensor::new(&[2u32, 0, 1, 2, 0, 1], &Device::Cpu)?;
        close(
            loss,
            scalar(&candle_nn::loss::cross_entropy(&logits, &targets)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn works_with_one_instance_and_one_view() -> Result<()> {
        let store = ParamStore::new(7);
        let mut objective = build(&store, "ce", "", 8, Some(3), 4)?;
        let z = randn(0f64, 1., (1, 1, 4), &Device::Cpu)?;
        let loss = scalar(&run(objective.as_mut(), &z, &[0], Some(&[1]))?.loss);
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        Ok(())
    }

    #[test]
    fn missing_labels_and_classes_are_clear_errors() -> Result<()> {
        let store = ParamStore::new(7);
        let mut objective = build(&store, "cross-entropy", "{}", 8, Some(3), 4)?;
        let z = randn(0f64, 1., (2, 2, 4), &Device::Cpu)?;
        let err = run_err(objective.as_mut(), &z, &[0, 1], None);
        assert!(err.contains("labels"), "{err}");
        let err = run_err(objective.as_mut(), &z, &[0, 1], Some(&[0, 3]));
        assert!(
            err.contains("class label 3") && err.contains("3-class"),
            "{err}"
        );
        let err = match build(&ParamStore::new(7), "cross-entropy", "{}", 8, None, 4) {
            Ok(_) => panic!("built without a number of classes"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains("number of classes"), "{err}");
        Ok(())
    }

    #[test]
    fn unknown_key_is_rejected() {
        let err = config_error("cross-entropy", "label_smoothing: 0.1");
        assert!(err.contains("unknown field `label_smoothing`"), "{err}");
    }
}
