//! `eval:` — the monitor, the end-of-run evaluation and which encoder is evaluated.

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::*;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// k of the weighted k-NN monitor and final table.
    pub knn_k: usize,
    /// Temperature of the k-NN vote weights.
    pub knn_t: f64,
    /// Inverse L2 strength of the linear probe.
    pub probe_c: f64,
    /// Run the k-NN / online-probe monitor every N epochs (and always after the last).
    pub monitor_every: usize,
    /// Log each view's covariance eigenvalues to `spectrum.csv` every N steps (0: never).
    pub spectrum_every: usize,
    /// How many of the largest eigenvalues to log (the FroSSL paper tracks 20).
    pub spectrum_top: usize,
    /// The network that is evaluated (k-NN monitor, the end-of-run table, `ssl eval`) and
    /// exported: the trained student (default) or, for an objective that keeps an EMA teacher,
    /// the teacher's encoder, which DINO's and I-JEPA's papers evaluate.
    #[serde(skip_serializing_if = "EvaluatedEncoder::is_student")]
    pub encoder: EvaluatedEncoder,
}

/// Which encoder of a run is evaluated and exported (`eval.encoder`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EvaluatedEncoder {
    /// The encoder the optimiser trains (`encoder.*` in a checkpoint).
    #[default]
    Student,
    /// The EMA teacher's encoder (`teacher.encoder.*`), for objectives that keep one.
    Teacher,
}

impl EvaluatedEncoder {
    fn is_student(&self) -> bool {
        *self == Self::Student
    }

    /// `student` or `teacher`, as configured.
    pub fn name(self) -> &'static str {
        match self {
            Self::Student => "student",
            Self::Teacher => "teacher",
        }
    }

    /// The prefix of this encoder's tensor names in a run's store and checkpoint, with its
    /// trailing dot (`encoder.`, `teacher.encoder.`).
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Student => "encoder.",
            Self::Teacher => "teacher.encoder.",
        }
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            knn_k: 20,
            knn_t: 0.07,
            probe_c: 1.0,
            monitor_every: 5,
            spectrum_every: 5,
            spectrum_top: 20,
            encoder: EvaluatedEncoder::Student,
        }
    }
}

impl EvalConfig {
    pub(super) fn validate(&self) -> Result<()> {
        at_least_one("eval.knn_k", self.knn_k, " (default 20)")?;
        positive(
            "eval.knn_t",
            self.knn_t,
            " (the k-NN temperature; default 0.07)",
        )?;
        positive(
            "eval.probe_c",
            self.probe_c,
            " (the probe's inverse L2 strength; default 1)",
        )?;
        at_least_one(
            "eval.monitor_every",
            self.monitor_every,
            " (epochs between k-NN monitors; the last epoch is always monitored)",
        )?;
        if self.spectrum_every > 0 {
            at_least_one(
                "eval.spectrum_top",
                self.spectrum_top,
                " while eval.spectrum_every > 0 (default 20)",
            )?;
        }
        Ok(())
    }
}
