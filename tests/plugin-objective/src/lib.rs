//! A minimal out-of-tree objective: the squared distance of each view to the mean view, plus a
//! hinge on each dimension's standard deviation (a two-term VICReg-like criterion). It exists to
//! prove that an objective needs only `ssl-core` and candle to be listed and trained by `ssl`.
//!
//! Linking the crate is all it takes to register `mean-align`:
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_core::{BuildContext, Ids, ParamStore};
//! use ssl_plugin_objective as _;
//!
//! let registration = ssl_core::find("mean-align")?;
//! let store = ParamStore::new(0);
//! let ctx = BuildContext {
//!     vb: store.var_builder(&Device::Cpu),
//!     num_instances: 2,
//!     num_classes: None,
//!     instance_labels: None,
//!     projection_dim: 1,
//!     feature_dim: 1,
//!     views: 2,
//!     global_views: 2,
//!     batch_size: 2,
//!     patches: None,
//! };
//! let defaults = (registration.default_config)(); // std_weight: 1.0
//! let mut objective = (registration.build)(&defaults, &ctx)?;
//!
//! // Views [0, 2] and [2, 0] (B = 2, D = 1): each value is 1 from the mean view [1, 1], so the
//! // alignment is 1; each view's standard deviation √2 clears the hinge at 1.
//! let z = Tensor::new(&[[[0f32], [2.]], [[2.], [0.]]], &Device::Cpu)?;
//! let ids = Ids::range(2, &Device::Cpu)?;
//! let out = objective.loss(&ssl_core::testing::batch(&z, &ids, None))?;
//! assert_eq!(out.terms[0].0, "align");
//! assert_eq!(out.terms[0].1.to_scalar::<f32>()?, 1.0);
//! assert_eq!(out.terms[1].1.to_scalar::<f32>()?, 0.0);
//! assert_eq!(out.loss.to_scalar::<f32>()?, 1.0);
//! # Ok::<(), anyhow::Error>(())
//! ```

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
