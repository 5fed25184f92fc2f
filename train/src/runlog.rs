//! A run's logs, a listener on the run's [`StepEvent`]s and [`EpochEvent`]s: `metrics.jsonl` (one
//! JSON record per optimiser step and per monitored epoch end), `spectrum.csv`, and the same values
//! as TensorBoard event files in `tb/` (`tensorboard --logdir runs`), with the spectrum and
//! embedding plots as images.
//!
//! On resume every log is cut back to the checkpoint, so that after a kill and a resume each step
//! is logged once: step records from the checkpoint's step on, and epoch-end records from its first
//! unfinished epoch on, are dropped (and a line torn by the kill with them).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Tensor;
use serde_json::json;

use crate::callbacks::{EpochEvent, StepEvent};
use crate::checkpoint::TrainerState;
use crate::config::RunConfig;
use crate::diagnostics::{self, SpectrumLog};
use ssl_core::atomic;
use ssl_report::tensorboard::EventWriter;

/// The per-step log in the run directory.
pub const METRICS: &str = "metrics.jsonl";
/// The TensorBoard directory in the run directory.
pub const BOARD: &str = "tb";

/// The open logs of a run.
pub struct RunLog {
    dir: PathBuf,
    metrics: File,
    spectrum: Option<SpectrumLog>,
    board: EventWriter,
}

impl RunLog {
    /// Opens the logs in `dir`: fresh ones for a new run, or (`resumed`: the checkpoint a run
    /// continues from) the run's own, cut back to that checkpoint.
    pub fn open(dir: &Path, cfg: &RunConfig, resumed: Option<&TrainerState>) -> Result<Self> {
        let metrics_path = dir.join(METRICS);
        match resumed {
            Some(state) => {
                cut_lines(&metrics_path, |line| keeps_record(line, state))?;
                cut_lines(&dir.join(diagnostics::SPECTRUM_CSV), |line| {
                    keeps_spectrum_row(line, state.step)
                })?;
            }
            None => {
                for name in [METRICS, diagnostics::SPECTRUM_CSV] {
                    if dir.join(name).exists() {
                        std::fs::remove_file(dir.join(name))
                            .with_context(|| format!("cannot remove the old {name}"))?;
                    }
                }
            }
        }
        let metrics = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .with_context(|| format!("cannot open {}", metrics_path.display()))?;
        let spectrum = match cfg.eval.spectrum_every {
            0 => None,
            _ => Some(SpectrumLog::open(
                dir,
                resumed.is_some(),
                cfg.eval.spectrum_top,
            )?),
        };
        let board = EventWriter::open(&dir.join(BOARD), resumed.map(|s| s.step as u64))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            metrics,
            spectrum,
            board,
        })
    }

    /// Logs one optimiser step: a `metrics.jsonl` record, and each of its values as the
    /// TensorBoard scalar of the same name.
    pub fn step(&mut self, r: &StepEvent<'_>) -> Result<()> {
        let mut record = json!({"step": r.step, "epoch": r.epoch, "loss": r.loss, "lr": r.lr,
            "images_per_s": r.images_per_s, "data_wait_ms": r.data_wait_ms});
        for (name, value) in r.terms {
            record[name.as_str()] = json!(value);
        }
        if let Some(ce) = r.probe_ce {
            record["probe_ce"] = json!(ce);
        }
        self.write(&record, r.step)
    }

    /// Logs the monitor of a finished epoch where it ran (nothing otherwise). The epoch's last
    /// optimiser step was `steps - 1`: the record carries `step` (steps taken), TensorBoard
    /// draws it at `steps - 1`, the step whose weights it measured (so a resume at `steps`
    /// keeps it).
    pub fn epoch_end(&mut self, e: &EpochEvent) -> Result<()> {
        let Some(knn_accuracy) = e.knn_accuracy else {
            return Ok(());
        };
        let record = json!({"epoch_end": e.epoch, "step": e.steps, "knn_accuracy": knn_accuracy,
            "online_probe_accuracy": e.probe_accuracy});
        self.write(&record, e.steps.saturating_sub(1))
    }

    /// The `metrics.jsonl` line of `record`, and its numbers but `step` and `epoch*` as
    /// TensorBoard scalars at `board_step`.
    fn write(&mut self, record: &serde_json::Value, board_step: usize) -> Result<()> {
        writeln!(self.metrics, "{record}").context("cannot write metrics.jsonl")?;
        for (key, value) in record.as_object().into_iter().flatten() {
            if let (false, Some(v)) = (key == "step" || key.starts_with("epoch"), value.as_f64()) {
                self.board.scalar(key, board_step as u64, v)?;
            }
        }
        Ok(())
    }

    /// Logs the covariance spectrum of `projections` (`[V, B, D]`) at `step`.
    pub fn spectrum(&mut self, step: usize, projections: &Tensor) -> Result<()> {
        match self.spectrum.as_mut() {
            Some(log) => log.record(step, projections),
            None => Ok(()),
        }
    }

    /// Whether `step` logs the spectrum.
    pub fn logs_spectrum(&self, cfg: &RunConfig, step: usize) -> bool {
        self.spectrum.is_some() && step.is_multiple_of(cfg.eval.spectrum_every)
    }

    /// Writes what is buffered to disk (at each epoch's end).
    pub fn flush(&mut self) -> Result<()> {
        if let Some(log) = self.spectrum.as_mut() {
            log.flush()?;
        }
        self.board.flush()
    }

    /// Draws `spectrum.png` (feature `plots`) and adds it, and `embedding.png` if the run drew
    /// one, to TensorBoard at `last_step`.
    pub fn finish(&mut self, last_step: usize) -> Result<()> {
        if let Some(log) = self.spectrum.as_mut() {
            log.flush()?;
        }
        #[cfg(feature = "plots")]
        crate::figures::spectrum(&self.dir)?;
        for (tag, name) in [("spectrum", "spectrum.png"), ("embedding", "embedding.png")] {
            let path = self.dir.join(name);
            if path.exists() {
                let png = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                self.board.image(tag, last_step as u64, &png)?;
            }
        }
        self.board.flush()
    }
}

/// Whether a `metrics.jsonl` line was logged before the checkpoint `state`: a step record
/// before its step, an epoch-end record of an epoch it completed. A torn line is not.
fn keeps_record(line: &str, state: &TrainerState) -> bool {
    let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
        return false;
    };
    let field = |key: &str| record.get(key).and_then(serde_json::Value::as_u64);
    match (field("epoch_end"), field("step")) {
        (Some(epoch), _) => (epoch as usize) < state.epochs_done,
        (None, Some(step)) => (step as usize) < state.step,
        (None, None) => false,
    }
}

/// Whether a `spectrum.csv` line is the header or a whole row of a step before `step`.
fn keeps_spectrum_row(line: &str, step: usize) -> bool {
    let fields: Vec<&str> = line.split(',').collect();
    if fields.first() == Some(&"step") {
        return true;
    }
    fields.len() == 5
        && fields.iter().skip(1).all(|f| f.parse::<f64>().is_ok())
        && fields[0].parse::<usize>().is_ok_and(|s| s < step)
}

/// Rewrites `path` (if it exists) with only the lines `keep` accepts, atomically.
fn cut_lines(path: &Path, keep: impl Fn(&str) -> bool) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let kept: String = text
        .lines()
        .filter(|line| keep(line))
        .map(|line| format!("{line}\n"))
        .collect();
    atomic::write(path, kept.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_cuts_the_logs_back_to_the_checkpoint() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let metrics = [
            r#"{"step":0,"epoch":0,"loss":1.0}"#,
            r#"{"step":1,"epoch":0,"loss":0.9}"#,
            r#"{"epoch_end":0,"step":2,"knn_accuracy":0.5}"#,
            r#"{"step":2,"epoch":1,"loss":0.8}"#,
            r#"{"step":3,"epoch":1,"loss":0.7}"#,
            r#"{"epoch_end":1,"step":4,"knn_accuracy":0.6}"#,
            r#"{"step":4,"epoch":2,"lo"#,
        ];
        std::fs::write(dir.path().join(METRICS), metrics.join("\n"))?;
        let spectrum = "step,view,rank,eigenvalue,normalized\n0,0,1,1e0,5e-1\n2,0,1,1e0,5e-1\n4,0,1,1e0,5e-1\n4,0,";
        std::fs::write(dir.path().join(diagnostics::SPECTRUM_CSV), spectrum)?;
        // The checkpoint after epoch 0 (2 steps): step 2 on, epoch 1 on, and the torn lines go.
        let state = TrainerState {
            epochs_done: 1,
            step: 2,
        };
        let cfg = RunConfig::default();
        let mut log = RunLog::open(dir.path(), &cfg, Some(&state))?;
        log.step(&StepEvent {
            step: 2,
            epoch: 1,
            loss: 0.75,
            terms: &[("invariance".into(), 0.5)],
            probe_ce: None,
            lr: 1e-3,
            images_per_s: 10.0,
            data_wait_ms: 0.0,
        })?;
        log.flush()?;
        let text = std::fs::read_to_string(dir.path().join(METRICS))?;
        let steps: Vec<String> = text
            .lines()
            .map(|l| {
                let r: serde_json::Value = serde_json::from_str(l).unwrap();
                match r.get("epoch_end") {
                    Some(e) => format!("end{e}"),
                    None => format!("{}", r["step"]),
                }
            })
            .collect();
        assert_eq!(steps, ["0", "1", "end0", "2"]);
        let rows = std::fs::read_to_string(dir.path().join(diagnostics::SPECTRUM_CSV))?;
        assert_eq!(
            rows,
            "step,view,rank,eigenvalue,normalized\n0,0,1,1e0,5e-1\n"
        );
        // A fresh run starts every log anew.
        drop(log);
        RunLog::open(dir.path(), &cfg, None)?;
        assert_eq!(std::fs::read_to_string(dir.path().join(METRICS))?, "");
        Ok(())
    }
}
