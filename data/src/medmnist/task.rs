//! The four task types of MedMNIST's official `INFO` table, which decide how its labels are read
//! and how ACC and AUC are scored.

use std::fmt;

use anyhow::{anyhow, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::source::ParsedStr;

/// A MedMNIST task type (the `task` field of the official `INFO` table), written in configs and
/// records as its official string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MedMnistTask {
    /// `"multi-class"`: one label in `0..K`, scores `n × K`.
    MultiClass,
    /// `"binary-class"`: one label in `{0, 1}`, scores `n × 2` (softmax) or `n × 1` (`P(1)`).
    Binary,
    /// `"multi-label, binary-class"`: `L` labels in `{0, 1}` per sample, scores `n × L`.
    MultiLabel,
    /// `"ordinal-regression"`: evaluated exactly like [`MedMnistTask::MultiClass`].
    Ordinal,
}

impl MedMnistTask {
    const ALL: [Self; 4] = [
        Self::MultiClass,
        Self::Binary,
        Self::MultiLabel,
        Self::Ordinal,
    ];

    /// Parses the official task string (`"multi-class"`, `"binary-class"`,
    /// `"multi-label, binary-class"`, `"ordinal-regression"`), exactly.
    pub fn from_official(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|task| task.official() == name)
            .ok_or_else(|| {
                let known: Vec<String> = Self::ALL
                    .iter()
                    .map(|t| format!("{:?}", t.official()))
                    .collect();
                anyhow!(
                    "unknown MedMNIST task {name:?}; expected one of {}",
                    known.join(", ")
                )
            })
    }

    /// The official task string.
    pub fn official(self) -> &'static str {
        match self {
            Self::MultiClass => "multi-class",
            Self::Binary => "binary-class",
            Self::MultiLabel => "multi-label, binary-class",
            Self::Ordinal => "ordinal-regression",
        }
    }
}

impl Serialize for MedMnistTask {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.official())
    }
}

impl<'de> Deserialize<'de> for MedMnistTask {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(ParsedStr::new("a MedMNIST task", Self::from_official))
    }
}

impl fmt::Display for MedMnistTask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.official())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_official_names() {
        for (name, task) in [
            ("multi-class", MedMnistTask::MultiClass),
            ("binary-class", MedMnistTask::Binary),
            ("multi-label, binary-class", MedMnistTask::MultiLabel),
            ("ordinal-regression", MedMnistTask::Ordinal),
        ] {
            assert_eq!(MedMnistTask::from_official(name).unwrap(), task);
            assert_eq!(task.to_string(), name);
        }
        for bad in [
            "multiclass",
            "Multi-Class",
            "multi-label",
            " binary-class",
            "",
        ] {
            let e = MedMnistTask::from_official(bad).unwrap_err().to_string();
            assert!(
                e.contains("unknown MedMNIST task") && e.contains("ordinal-regression"),
                "{e}"
            );
        }
    }
}
