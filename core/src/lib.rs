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

pub mod collective;
pub mod groups;
pub mod objective;
pub mod params;
pub mod registry;
pub mod testing;

pub use collective::{Collective, SingleProcess};
pub use groups::{ParamGroup, Prefixes, Schedule};
pub use objective::{
    ema_update, paired_parameters, Batch, BuildContext, Ids, LossOutput, Objective,
    ObjectiveConfig, Progress, Requirements, StepContext, TeacherSpec,
};
pub use params::{ParamStore, StoreInit};
pub use registry::{find, registry, ConfigKey, Registration};

#[doc(hidden)]
pub use inventory;
