//! The candle-ssl trainer and CLI as a library.
//!
//! `config` (typed run configuration) → `setup` (device, data, networks) → `trainer` (the loop,
//! checkpoints, resume) → `evaluate` (the final table); `cli` wires them to `ssl`'s subcommands.
//! The built-in objectives are linked here, so every binary using this crate lists them.

pub mod allocator;
pub mod atomic;
pub mod card;
pub mod checkpoint;
pub mod cli;
pub mod compare;
pub mod config;
pub mod diagnostics;
pub mod download;
pub mod evaluate;
pub mod export;
pub mod generalise;
pub mod hub;
pub mod offline;
pub mod plot;
pub mod pretrained;
pub mod progress;
pub mod publish;
pub mod rundir;
pub mod runlog;
pub mod setup;
pub mod sgd_probe;
pub mod staging;
pub mod tensorboard;
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
