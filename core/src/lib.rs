//! The shared core of candle-ssl's objectives.
//!
//! An objective crate implements [`Objective`], describes itself with a [`Registration`] and
//! submits it with [`register_objective!`]; the trainer finds every linked objective through
//! [`registry`](fn@registry). Nothing here names a particular objective, so adding one never
//! edits this crate.
//!
//! * [`objective`]: the trait, what a loss receives ([`Batch`]) and returns ([`LossOutput`]), the
//!   limits it declares ([`Requirements`]) and the hook after each optimiser step
//!   ([`StepContext`]).
//! * [`registry`](mod@registry): registration records, lookup by name or alias with "did you mean".
//! * [`collective`]: the one place batch statistics are gathered across devices.
//! * [`groups`]: parameter groups, the optimiser settings an objective or a run gives a part
//!   of the model.
//! * [`params`]: seeded, name-addressed parameter storage behind a candle `VarBuilder`.
//! * [`tokens`]: the patch-token encoder that objectives reading pixels run themselves.
//! * [`testing`]: known-answer inputs, reproducible random tensors and gradient checks for the
//!   objective crates' tests.
//! * [`atomic`]: files replaced whole or not at all, the one write every writer shares.
//! * [`progress`]: the one terminal area for every progress bar.
//! * [`allocator`]: the C allocator tuned for tensor workloads, which `ssl` and the benches
//!   call first.
//!
//! # Example
//!
//! A whole objective — the mean squared difference of two views — registered, found by name
//! (any case) and evaluated on a batch:
//!
//! ```
//! use anyhow::Result;
//! use candle_core::{Device, Tensor};
//! use serde::{Deserialize, Serialize};
//! use ssl_core::{
//!     register_objective, Batch, BuildContext, ConfigKey, Ids, LossOutput, Objective,
//!     ObjectiveConfig, ParamStore, Requirements,
//! };
//!
//! #[derive(Clone, Default, Serialize, Deserialize)]
//! #[serde(deny_unknown_fields, default)]
//! struct ViewMseConfig {
//!     scale: f64,
//! }
//!
//! impl ObjectiveConfig for ViewMseConfig {
//!     fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
//!         Ok(Box::new(ViewMse(self.scale)))
//!     }
//! }
//!
//! struct ViewMse(f64);
//!
//! impl Objective for ViewMse {
//!     fn requirements(&self) -> Requirements {
//!         Requirements { max_views: Some(2), ..Requirements::default() }
//!     }
//!     fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
//!         let z = batch.projections; // [V = 2, B, D]
//!         let mse = (z.get(0)? - z.get(1)?)?.sqr()?.mean_all()?;
//!         Ok(LossOutput::new((&mse * self.0)?).with_term("mse", mse))
//!     }
//! }
//!
//! register_objective! {
//!     name: "view-mse", aliases: &["vmse"], summary: "mean squared difference of two views",
//!     paper: "(example)", keys: &[ConfigKey { name: "scale", doc: "loss weight" }],
//!     config: ViewMseConfig,
//! }
//!
//! fn main() -> Result<()> {
//!     let registration = ssl_core::find("VMSE")?; // by alias, any case
//!     assert_eq!(registration.name, "view-mse");
//!     assert!(ssl_core::find("view-mes").is_err()); // "did you mean `view-mse`?"
//!
//!     let store = ParamStore::new(0);
//!     let ctx = BuildContext {
//!         vb: store.var_builder(&Device::Cpu),
//!         num_instances: 2,
//!         num_classes: None,
//!         instance_labels: None,
//!         projection_dim: 2,
//!         feature_dim: 2,
//!         views: 2,
//!         global_views: 2,
//!         batch_size: 2,
//!         patches: None,
//!     };
//!     let params = serde_yaml::from_str("scale: 2.0")?;
//!     let mut objective = (registration.build)(&params, &ctx)?;
//!     objective.requirements().check("view-mse", 2, 2, false)?;
//!     assert!(objective.requirements().check("view-mse", 3, 2, false).is_err());
//!
//!     // Two views of B = 2 instances, D = 2: they differ by 1 in one of four entries.
//!     let z = Tensor::new(&[[[0f32, 0.], [1., 1.]], [[1., 0.], [1., 1.]]], &Device::Cpu)?;
//!     let ids = Ids::range(2, &Device::Cpu)?;
//!     let out = objective.loss(&ssl_core::testing::batch(&z, &ids, None))?;
//!     assert_eq!(out.terms[0].1.to_scalar::<f32>()?, 0.25);
//!     assert_eq!(out.loss.to_scalar::<f32>()?, 0.5);
//!     Ok(())
//! }
//! ```

pub mod allocator;
pub mod atomic;
pub mod collective;
pub mod groups;
pub mod objective;
pub mod params;
pub mod progress;
pub mod registry;
pub mod testing;
pub mod tokens;

pub use collective::{Collective, SingleProcess};
pub use groups::{ParamGroup, Prefixes, Schedule};
pub use objective::{
    ema_update, paired_parameters, Batch, BuildContext, Ids, LossOutput, Objective,
    ObjectiveConfig, Patches, PixelBatch, PixelLoss, Progress, Requirements, RunFacts, StepContext,
    TeacherSpec,
};
pub use params::{ParamStore, StoreInit};
pub use registry::{find, registry, ConfigKey, Registration};
pub use tokens::{TokenEncoder, Tokens};

#[doc(hidden)]
pub use inventory;
