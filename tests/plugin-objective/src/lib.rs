//! A minimal out-of-tree objective: cosine alignment of each view with the mean view, plus a
//! hinge on each dimension's standard deviation (a two-term VICReg-like criterion). It exists to
//! prove that an objective needs only `ssl-core` and candle to be listed and trained by `ssl`.

use anyhow::Result;
use candle_core::D;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

/// Configuration of the fixture objective.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeanAlignConfig {
    /// Weight of the standard-deviation hinge.
    pub std_weight: f64,
}

impl Default for MeanAlignConfig {
    fn default() -> Self {
        Self { std_weight: 1.0 }
    }
}

impl ObjectiveConfig for MeanAlignConfig {
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(MeanAlign(self.clone())))
    }
}

/// The fixture objective.
pub struct MeanAlign(MeanAlignConfig);

impl Objective for MeanAlign {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "the hinge uses a batch standard deviation",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.projections; // [V, B, D]
        let mean = z.mean_keepdim(0)?;
        let align = z.broadcast_sub(&mean)?.sqr()?.sum(D::Minus1)?.mean_all()?;
        let std = (z.var(1)? + 1e-4)?.sqrt()?; // [V, D]
        let hinge = (1.0 - std)?.relu()?.mean_all()?;
        let loss = (&align + (&hinge * self.0.std_weight)?)?;
        Ok(LossOutput::new(loss)
            .with_term("align", align)
            .with_term("std_hinge", hinge))
    }
}

register_objective! {
    name: "mean-align",
    aliases: &[],
    summary: "Fixture: align views with their mean, hinge on per-dimension std",
    paper: "(test fixture, no paper)",
    keys: &[ConfigKey { name: "std_weight", doc: "weight of the std hinge" }],
    config: MeanAlignConfig,
}
