//! The candle-ssl training library.
//!
//! `config` (typed run configuration) → `setup` (device, data, networks) → `trainer` (the fit
//! loop, checkpoints, resume) → `evaluate` (the end-of-run table). The built-in objectives are
//! linked here, so every program using this crate can name them.
//!
//! # Example
//!
//! A run configured in code, resolved as its YAML recipe would be (nothing is trained here;
//! `Trainer::new(cfg).start(Start::Fresh).fit()` would train it):
//!
//! ```
//! use ssl_data::Recipe;
//! use ssl_train::RunConfig;
//!
//! let cfg = RunConfig::builder().objective("vicreg").data("gmm").epochs(1).build()?;
//! assert_eq!((cfg.objective.name.as_str(), cfg.data.name.as_str()), ("vicreg", "gmm"));
//! assert_eq!(cfg.train.epochs, 1);
//! assert_eq!(cfg.train.warmup_epochs, 1); // the default 2, cut to the run's length
//! assert_eq!(cfg.data.augment, Some(Recipe::Noise)); // the mixture's own views
//! // The objective's paper defaults are filled in, so the run records every hyperparameter.
//! assert_eq!(cfg.objective.params["lambda"].as_f64(), Some(25.0));
//!
//! // A misspelt key, or an objective parameter out of range, is an error naming it.
//! let err = RunConfig::builder().set("train.epoch", 3).build().unwrap_err();
//! assert!(format!("{err:#}").contains("epoch"));
//! let err = RunConfig::builder().objective_param("lambda", -1.0).build().unwrap_err();
//! assert!(format!("{err:#}").contains("lambda"));
//!
//! // Every built-in objective is linked.
//! assert!(ssl_core::find("dino").is_ok() && ssl_core::find("lejepa").is_ok());
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod builder;
pub mod callbacks;
pub mod checkpoint;
pub mod config;
pub mod describe;
pub mod diagnostics;
pub mod evaluate;
pub mod export;
#[cfg(feature = "plots")]
pub mod figures;
pub mod model;
pub mod online_probe;
pub mod own_data;
pub mod phases;
pub mod pretrained;
pub mod request;
pub mod results;
pub mod run;
pub mod rundir;
pub mod runlog;
pub mod setup;
pub mod staging;
pub mod trainer;

pub use builder::RunConfigBuilder;
pub use callbacks::{Callbacks, EpochEvent, StepEvent};
pub use config::RunConfig;
pub use own_data::OwnImages;
pub use run::{RunOutcome, TrainedEncoder, Trainer};
pub use rundir::Start;
pub use ssl_models::{register_encoder, Encoder, EncoderSpec, ModuleEncoder};

// Link the built-in objective crates so their registrations are collected.
use ssl_barlow as _;
use ssl_byol as _;
use ssl_carp as _;
use ssl_corinfomax as _;
use ssl_dino as _;
use ssl_duality as _;
use ssl_frossl as _;
use ssl_icone as _;
use ssl_ijepa as _;
use ssl_ivne as _;
use ssl_lejepa as _;
use ssl_mae as _;
use ssl_mmcr as _;
use ssl_moco as _;
use ssl_sagvicreg as _;
use ssl_simclr as _;
use ssl_supervised as _;
use ssl_swav as _;
use ssl_tcr as _;
use ssl_vicreg as _;
use ssl_wmse as _;
