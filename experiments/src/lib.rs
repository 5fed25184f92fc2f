//! Experiments over candle-ssl runs.
//!
//! [`compare`] runs a grid of configurations (objectives × encoders × seeds × …) and tabulates
//! and plots their evaluations; [`generalise`] is the generalisation protocol on two halves of
//! the classes; [`offline`] evaluates saved checkpoints; [`sgd_probe`] is the papers' linear probe
//! trained by SGD on augmented images.

pub mod compare;
pub mod generalise;
pub mod offline;
pub mod sgd_probe;
