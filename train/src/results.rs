//! A run's `results.json`: the table's rows, the run's seconds and where they went. The trainer
//! writes it at the end of a run; `ssl compare`, the Hub card and `ssl push` read it back
//! through [`Results`].

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Deserializer, Serialize};

use crate::evaluate::Evaluation;
use crate::phases::PhaseSeconds;
use ssl_core::atomic;

/// The file's name in a run directory.
pub const RESULTS: &str = "results.json";

/// What a finished run measured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Results {
    /// Seconds from the start of training to the end of the evaluation.
    pub seconds: f64,
    /// Those seconds by phase ([`crate::phases::Phase::key`] → seconds); empty in runs written
    /// before the phases were kept.
    #[serde(default)]
    pub phases: BTreeMap<String, f64>,
    /// The baselines' rows, then the trained encoder's.
    pub rows: Vec<ResultRow>,
}

/// One row of the table: an encoder and its metrics.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResultRow {
    /// `raw inputs`, `random init`, or the trained encoder (`NAME (ours)`).
    pub encoder: String,
    /// Metric key → value. JSON has no NaN: a metric that could not be computed is written as
    /// `null` and read back as NaN.
    #[serde(deserialize_with = "nan_for_null")]
    pub metrics: BTreeMap<String, f64>,
}

fn nan_for_null<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
    let values = BTreeMap::<String, Option<f64>>::deserialize(d)?;
    Ok(values
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or(f64::NAN)))
        .collect())
}

impl Results {
    /// The record of `evaluation`, `seconds` and `phases`.
    pub fn new(evaluation: &[(String, Evaluation)], seconds: f64, phases: &PhaseSeconds) -> Self {
        let rows = evaluation
            .iter()
            .map(|(encoder, e)| ResultRow {
                encoder: encoder.clone(),
                metrics: e.metrics(),
            })
            .collect();
        Self {
            seconds,
            phases: phases.to_map(),
            rows,
        }
    }

    /// Reads `dir/results.json`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(RESULTS);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a run's results (rerun the run to rewrite it)",
                path.display()
            )
        })
    }

    /// Writes `dir/results.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        atomic::write(
            &dir.join(RESULTS),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )
    }

    /// The trained encoder's row (the one named `… (ours)`).
    pub fn trained(&self) -> Option<&ResultRow> {
        self.rows.iter().find(|r| r.encoder.ends_with("(ours)"))
    }
}

/// A metric of the end-of-run table: its `results.json` key, its title, and how a table shows
/// it (accuracies are recorded as fractions and shown in percent). Every table of the project
/// (`ssl run`'s, `ssl compare`'s, the Hub card's) takes its columns from [`METRICS`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    pub key: &'static str,
    pub title: &'static str,
    /// Shown as `value × scale` (100 for a percentage).
    pub scale: f64,
    pub decimals: usize,
}

impl Metric {
    /// An accuracy: recorded as a fraction, shown in percent to one decimal.
    pub const fn percent(key: &'static str, title: &'static str) -> Self {
        Self {
            key,
            title,
            scale: 100.0,
            decimals: 1,
        }
    }

    /// A value shown as it is, to `decimals` decimals.
    pub const fn fixed(key: &'static str, title: &'static str, decimals: usize) -> Self {
        Self {
            key,
            title,
            scale: 1.0,
            decimals,
        }
    }

    /// Whether a table shows it in percent.
    pub fn is_percent(&self) -> bool {
        self.scale == 100.0
    }

    /// `value` as a table shows it: scaled, rounded, with ` %` for a percentage.
    pub fn show(&self, value: f64) -> String {
        let unit = if self.is_percent() { " %" } else { "" };
        format!("{:.*}{unit}", self.decimals, value * self.scale)
    }

    /// The metric whose key is `key`; an unknown key is an error listing the known ones.
    pub fn find(key: &str) -> Result<Metric> {
        METRICS
            .iter()
            .find(|m| m.key == key)
            .copied()
            .with_context(|| {
                let known: Vec<&str> = METRICS.iter().map(|m| m.key).collect();
                format!("unknown metric `{key}` (known: {})", known.join(", "))
            })
    }
}

/// Every metric of [`Evaluation`], in table order: the first four are `ssl run`'s table.
pub const METRICS: [Metric; 11] = [
    Metric::percent("probe_balanced_accuracy", "linear probe (balanced acc.)"),
    Metric::percent("knn_accuracy", "k-NN acc."),
    Metric::fixed("rankme", "RankMe", 1),
    Metric::fixed("effective_rank", "effective rank", 1),
    Metric::fixed("class_alignment", "class alignment ↓", 3),
    Metric::fixed("uniformity", "uniformity ↓", 3),
    Metric::fixed("silhouette", "silhouette", 3),
    Metric::fixed("kmeans_nmi", "k-means NMI", 3),
    Metric::fixed("kmeans_ami", "k-means AMI", 3),
    Metric::fixed("kmeans_ari", "k-means ARI", 3),
    Metric::percent(
        "minority_balanced_accuracy",
        "minority classes (probe balanced acc.)",
    ),
];

/// The columns of `ssl run`'s table and the Hub card's.
pub fn table_metrics() -> &'static [Metric] {
    &METRICS[..4]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_equal_and_a_null_metric_reads_as_nan() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let results = Results {
            seconds: 12.5,
            phases: BTreeMap::from([("forward".to_string(), 3.25)]),
            rows: vec![ResultRow {
                encoder: "vicreg (ours)".into(),
                metrics: BTreeMap::from([("knn_accuracy".to_string(), 0.5)]),
            }],
        };
        results.write(dir.path())?;
        assert_eq!(Results::read(dir.path())?, results);
        assert_eq!(results.trained().unwrap().metrics["knn_accuracy"], 0.5);

        let old = r#"{"seconds": 1.0, "rows": [{"encoder": "random init",
            "metrics": {"silhouette": null, "rankme": 3.0}}]}"#;
        std::fs::write(dir.path().join(RESULTS), old)?;
        let read = Results::read(dir.path())?;
        assert!(read.phases.is_empty() && read.trained().is_none());
        assert!(read.rows[0].metrics["silhouette"].is_nan());

        std::fs::write(dir.path().join(RESULTS), "{\"rows\": 3}")?;
        let err = format!("{:#}", Results::read(dir.path()).unwrap_err());
        assert!(
            err.contains("results.json") && err.contains("rerun"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn every_evaluation_field_is_a_metric_of_the_catalogue_and_no_other() -> Result<()> {
        let evaluation = Evaluation {
            probe_balanced_accuracy: 0.5,
            knn_accuracy: 0.25,
            rankme: 3.0,
            effective_rank: 2.0,
            class_alignment: 0.1,
            uniformity: -1.0,
            silhouette: 0.2,
            kmeans_nmi: 0.3,
            kmeans_ami: 0.3,
            kmeans_ari: 0.3,
            minority_balanced_accuracy: Some(0.4),
        };
        let keys: Vec<String> = evaluation.metrics().into_keys().collect();
        let mut catalogue: Vec<String> = METRICS.iter().map(|m| m.key.to_string()).collect();
        catalogue.sort();
        assert_eq!(keys, catalogue);
        assert_eq!(Metric::find("knn_accuracy")?.show(0.25), "25.0 %");
        assert_eq!(Metric::find("rankme")?.show(3.0), "3.0");
        let err = Metric::find("knn").unwrap_err().to_string();
        assert!(
            err.contains("unknown metric `knn`") && err.contains("knn_accuracy"),
            "{err}"
        );
        Ok(())
    }
}
