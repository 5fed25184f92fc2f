//! Reporting for candle-ssl runs.
//!
//! [`tensorboard`] writes (and reads back) TensorBoard event files: scalars per step and PNG
//! images, resumable without duplicated steps. [`plot`] (feature `plots`, on by default) draws
//! the PNG figures of runs and grids: line panels, bar panels and scatter panels.
//!
//! # Example
//!
//! Scalars written to a TensorBoard directory and read back; a run resumed from step 2 drops
//! what the killed run logged from step 2 on, so each step is logged once:
//!
//! ```
//! use ssl_report::tensorboard::{read_dir, EventWriter};
//!
//! let dir = tempfile::tempdir()?;
//! let mut writer = EventWriter::open(dir.path(), None)?;
//! for step in 0..3 {
//!     writer.scalar("train/loss", step, 1.0 / (step + 1) as f64)?;
//! }
//! writer.flush()?;
//! drop(writer);
//! assert_eq!(read_dir(dir.path())?.scalar_at("train/loss", 1), [0.5]);
//!
//! let mut resumed = EventWriter::open(dir.path(), Some(2))?;
//! resumed.scalar("train/loss", 2, 0.25)?;
//! resumed.flush()?;
//! let events = read_dir(dir.path())?;
//! assert_eq!(events.scalars.len(), 3);
//! assert_eq!(events.scalar_at("train/loss", 2), [0.25]);
//! # Ok::<(), anyhow::Error>(())
//! ```

#[cfg(feature = "plots")]
pub mod plot;
pub mod tensorboard;
