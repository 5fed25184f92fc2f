//! The candle-ssl training library.
//!
//! `config` (typed run configuration) → `setup` (device, data, networks) → `trainer` (the fit
//! loop, checkpoints, resume) → `evaluate` (the end-of-run table). The built-in objectives are
//! linked here, so every program using this crate can name them.

pub mod atomic;
pub mod checkpoint;
pub mod config;
pub mod diagnostics;
pub mod evaluate;
pub mod export;
#[cfg(feature = "plots")]
pub mod figures;
pub mod model;
pub mod pretrained;
pub mod progress;
pub mod rundir;
pub mod runlog;
pub mod setup;
pub mod staging;
pub mod trainer;

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
use ssl_mmcr as _;
use ssl_moco as _;
use ssl_sagvicreg as _;
use ssl_simclr as _;
use ssl_supervised as _;
use ssl_swav as _;
use ssl_tcr as _;
use ssl_vicreg as _;
use ssl_wmse as _;
