//! Reporting for candle-ssl runs.
//!
//! [`tensorboard`] writes (and reads back) TensorBoard event files: scalars per step and PNG
//! images, resumable without duplicated steps. [`plot`] (feature `plots`, on by default) draws
//! the PNG figures of runs and grids: line panels, bar panels and scatter panels.

#[cfg(feature = "plots")]
pub mod plot;
pub mod tensorboard;
