//! Training diagnostics written beside the metrics: the covariance eigenvalue trajectories that
//! the FroSSL paper reads collapse and "stepwise" learning from (`docs/spec/metrics.md` §12).
//!
//! Every `eval.spectrum_every` steps the top `eval.spectrum_top` eigenvalues of each view's
//! projector-output covariance, raw and trace-normalised, are appended to `spectrum.csv`
//! (`step,view,rank,eigenvalue,normalized`); at the end of the run [`crate::figures::spectrum`]
//! draws them (feature `plots`).

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use ssl_eval::Features;

/// File names in the run directory.
pub const SPECTRUM_CSV: &str = "spectrum.csv";
const HEADER: &str = "step,view,rank,eigenvalue,normalized";

/// Appends eigenvalue rows to `spectrum.csv`.
pub struct SpectrumLog {
    out: BufWriter<File>,
    top: usize,
}

impl SpectrumLog {
    /// Opens the log in `dir`: a fresh file, or (on resume) the existing one to append to.
    pub fn open(dir: &Path, resume: bool, top: usize) -> Result<Self> {
        let path = dir.join(SPECTRUM_CSV);
        let fresh = !resume || !path.exists();
        let file = OpenOptions::new()
            .create(true)
            .write(true)
            .append(!fresh)
            .truncate(fresh)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let mut out = BufWriter::new(file);
        if fresh {
            writeln!(out, "{HEADER}")?;
        }
        Ok(Self { out, top })
    }

    /// Logs the spectrum of every view of `projections`: `[V, B, D]`.
    pub fn record(&mut self, step: usize, projections: &Tensor) -> Result<()> {
        let (views, b, d) = projections.dims3()?;
        if b < 2 {
            return Ok(());
        }
        let all = projections
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for (view, chunk) in all.chunks_exact(b * d).enumerate().take(views) {
            let s = ssl_eval::covariance_spectrum(&Features::new(chunk.to_vec(), b, d)?, self.top)?;
            for (rank, (value, normalized)) in s.eigenvalues.iter().zip(&s.normalized).enumerate() {
                writeln!(
                    self.out,
                    "{step},{view},{},{value:e},{normalized:e}",
                    rank + 1
                )?;
            }
        }
        Ok(())
    }

    /// Flushes buffered rows to disk.
    pub fn flush(&mut self) -> Result<()> {
        Ok(self.out.flush()?)
    }
}
