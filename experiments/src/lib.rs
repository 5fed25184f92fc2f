//! Experiments over candle-ssl runs.
//!
//! [`compare`] runs a grid of configurations (objectives × encoders × seeds × …) and tabulates
//! and plots their evaluations; [`generalise`] is the generalisation protocol on two halves of
//! the classes; [`offline`] evaluates saved checkpoints; [`sgd_probe`] is the papers' linear probe
//! trained by SGD on augmented images.
//!
//! # Example
//!
//! A comparison grid read from YAML and expanded into its cells — one run configuration per
//! objective × views × batch size × seed, each with its own run directory — without training
//! any of them; and the mean ± sample standard deviation a table reports over seeds:
//!
//! ```
//! use ssl_experiments::compare::{mean_std, Grid};
//!
//! let grid: Grid = serde_yaml::from_str(
//!     "objectives: [vicreg, {name: simclr, params: {temperature: 0.2}}]\n\
//!      seeds: [0, 1]\n\
//!      batch_sizes: [64]\n\
//!      out: grid\n\
//!      set: [train.epochs=3]",
//! )?;
//! let cells = grid.cells()?;
//! assert_eq!(cells.len(), 4);
//! let last = &cells[3];
//! assert_eq!((last.label.as_str(), last.views, last.seed), ("simclr", 2, 1));
//! assert_eq!(last.config.objective.params["temperature"].as_f64(), Some(0.2));
//! assert_eq!((last.config.train.batch_size, last.config.train.epochs), (64, 3));
//! assert_eq!(last.config.out, std::path::Path::new("grid/runs/simclr/v2-b64-s1"));
//!
//! let (mean, std) = mean_std(&[0.9, 0.8, 1.0]);
//! assert!((mean - 0.9).abs() < 1e-12 && (std - 0.1).abs() < 1e-12);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod compare;
pub mod generalise;
pub mod offline;
pub mod sgd_probe;
