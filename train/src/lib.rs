//! The candle-ssl training library.
//!
//! `config` (typed run configuration) → `setup` (device, data, networks) → `trainer` (the fit
//! loop, checkpoints, resume) → `evaluate` (the end-of-run table). The built-in objectives are
//! linked here, so every program using this crate can name them.

pub mod atomic;
pub mod builder;
pub mod callbacks;
pub mod checkpoint;
pub mod config;
pub mod diagnostics;
pub mod evaluate;
pub mod export;
#[cfg(feature = "plots")]
pub mod figures;
pub mod model;
pub mod own_data;
pub mod pretrained;
pub mod progress;
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
use ssl_ivne as _;
use ssl_lejepa as _;
use ssl_mmcr as _;
use ssl_moco as _;
use ssl_sagvicreg as _;
use ssl_simclr as _;
use ssl_supervised as _;
use ssl_swav as _;
use ssl_tcr as _;
use ssl_vicreg as _;
use ssl_wmse as _;
