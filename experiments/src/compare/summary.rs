//! The summary of a grid's outcomes: mean ± std over seeds per row, with baseline and
//! published rows, as Markdown and CSV.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use ssl_train::results::Metric;

use super::grid::{Cell, Grid};
use super::runs::Outcome;

/// The catalogue entries named by `keys`, in that order; an unknown key is an error that lists
/// the known ones.
pub(super) fn metrics(keys: &[String]) -> Result<Vec<Metric>> {
    if keys.is_empty() {
        bail!("the grid's `metrics` list is empty; name at least one column");
    }
    keys.iter()
        .map(|key| Metric::find(key).map_err(|e| anyhow!("the grid's `metrics`: {e}")))
        .collect()
}

/// A column's heading: the metric's title, with `%` for a percentage (the cells are numbers).
pub(super) fn heading(m: &Metric) -> String {
    match m.is_percent() {
        true => format!("{} %", m.title),
        false => m.title.to_string(),
    }
}

/// Mean and sample standard deviation (0 for a single value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = match values.len() {
        0 | 1 => 0.0,
        _ => values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0),
    };
    (mean, var.sqrt())
}

/// One table row: a label and, per metric (+ wall time), the per-seed values.
pub(super) struct Row {
    pub(super) label: String,
    pub(super) views: Option<usize>,
    pub(super) batch_size: Option<usize>,
    pub(super) values: Vec<Vec<f64>>,
    failures: Vec<String>,
}

impl Row {
    fn cell(&self, k: usize, scale: f64, digits: usize) -> String {
        if self.values[k].is_empty() {
            return "—".to_string();
        }
        let scaled: Vec<f64> = self.values[k].iter().map(|v| v * scale).collect();
        let (m, s) = mean_std(&scaled);
        format!("{m:.digits$} ± {s:.digits$}")
    }
}

/// A grid's table: a row per objective, view count and batch size, the baseline rows, and
/// the published values printed beside them.
pub(super) struct Summary {
    pub(super) metrics: Vec<Metric>,
    pub(super) rows: Vec<Row>,
    pub(super) baselines: Vec<Row>,
    references: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Summary {
    pub(super) fn new(grid: &Grid, cells: &[Cell], outcomes: &[Outcome]) -> Result<Self> {
        let metrics = metrics(&grid.metrics)?;
        let columns = metrics.len() + 1;
        let mut rows: Vec<Row> = Vec::new();
        // One group of baseline rows per distinct setting they depend on (the raw inputs: the
        // data and the evaluation; the random-init encoder: the encoder's configuration too),
        // keyed by (role, group), seeds within.
        let groups = [false, true].map(|random| section_labels(cells, random));
        let mut baselines: BTreeMap<(bool, usize, String), BTreeMap<u64, Vec<f64>>> =
            BTreeMap::new();
        for (cell, outcome) in cells.iter().zip(outcomes) {
            let position = rows.iter().position(|r| {
                r.label == cell.label
                    && r.views == Some(cell.views)
                    && r.batch_size == Some(cell.batch_size)
            });
            let row = match position {
                Some(k) => &mut rows[k],
                None => {
                    rows.push(Row {
                        label: cell.label.clone(),
                        views: Some(cell.views),
                        batch_size: Some(cell.batch_size),
                        values: vec![Vec::new(); columns],
                        failures: Vec::new(),
                    });
                    rows.last_mut().expect("just pushed")
                }
            };
            match outcome {
                Outcome::Done {
                    rows: by_encoder,
                    seconds,
                } => {
                    for (k, m) in metrics.iter().enumerate() {
                        if let Some(v) = by_encoder.get("ours").and_then(|e| e.get(m.key)) {
                            row.values[k].push(*v);
                        }
                    }
                    row.values[metrics.len()].push(*seconds);
                    for (random, role) in [(false, "raw inputs"), (true, "random init")] {
                        if let Some(e) = by_encoder.get(role) {
                            let values = metrics
                                .iter()
                                .map(|m| e.get(m.key).copied().unwrap_or(f64::NAN))
                                .collect();
                            let section = baseline_section(cell, random);
                            let (group, suffix) = &groups[random as usize][&section_key(&section)];
                            baselines
                                .entry((random, *group, format!("{role}{suffix}")))
                                .or_default()
                                .insert(cell.seed, values);
                        }
                    }
                }
                Outcome::Failed(why) => row.failures.push(why.clone()),
            }
        }
        let baselines = baselines
            .into_iter()
            .map(|((_, _, label), by_seed)| {
                let mut values = vec![Vec::new(); columns];
                for per_metric in by_seed.values() {
                    for (k, v) in per_metric.iter().enumerate() {
                        if v.is_finite() {
                            values[k].push(*v);
                        }
                    }
                }
                Row {
                    label,
                    views: None,
                    batch_size: None,
                    values,
                    failures: Vec::new(),
                }
            })
            .collect();
        Ok(Self {
            metrics,
            rows,
            baselines,
            references: grid.reference.clone(),
        })
    }

    pub(super) fn markdown(&self, command_line: &str) -> String {
        let mut s = format!(
            "Made by `{command_line}`; mean ± std over seeds.\n\n| objective | V | B | seeds |"
        );
        for m in &self.metrics {
            s.push_str(&format!(" {} |", heading(m)));
        }
        s.push_str(" wall time (s) |\n|---|---|---|---|");
        s.push_str(&"---|".repeat(self.metrics.len() + 1));
        s.push('\n');
        let mut referenced = std::collections::BTreeSet::new();
        for row in self.baselines.iter().chain(&self.rows) {
            let opt = |v: Option<usize>| v.map_or("—".to_string(), |v| v.to_string());
            s.push_str(&format!(
                "| {} | {} | {} | {} |",
                row.label,
                opt(row.views),
                opt(row.batch_size),
                row.values[0].len()
            ));
            for (k, m) in self.metrics.iter().enumerate() {
                s.push_str(&format!(" {} |", row.cell(k, m.scale, m.decimals)));
            }
            let time = match row.views {
                Some(_) => row.cell(self.metrics.len(), 1.0, 0),
                None => "—".to_string(),
            };
            s.push_str(&format!(" {time} |\n"));
            if let Some(published) = self.references.get(&row.label) {
                if referenced.insert(row.label.clone()) {
                    s.push_str(&format!("| ↳ {} (published) | | | |", row.label));
                    for m in &self.metrics {
                        let v = published.get(m.key).map_or("—".to_string(), |v| {
                            format!("{:.*}", m.decimals, v * m.scale)
                        });
                        s.push_str(&format!(" {v} |"));
                    }
                    s.push_str(" — |\n");
                }
            }
        }
        let failed: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| !r.failures.is_empty())
            .collect();
        if !failed.is_empty() {
            s.push_str("\nNot run or failed:\n");
            for row in failed {
                s.push_str(&format!(
                    "- {} V={} B={}: {}\n",
                    row.label,
                    row.views.unwrap_or(0),
                    row.batch_size.unwrap_or(0),
                    row.failures[0]
                ));
            }
        }
        s
    }

    pub(super) fn csv(&self) -> String {
        let mut s = "objective,views,batch_size,seeds".to_string();
        for m in &self.metrics {
            s.push_str(&format!(",{0}_mean,{0}_std", m.key));
        }
        s.push_str(",seconds_mean,seconds_std,failures\n");
        for row in self.baselines.iter().chain(&self.rows) {
            let opt = |v: Option<usize>| v.map_or(String::new(), |v| v.to_string());
            s.push_str(&format!(
                "{},{},{},{}",
                row.label,
                opt(row.views),
                opt(row.batch_size),
                row.values[0].len()
            ));
            for values in &row.values {
                if values.is_empty() {
                    s.push_str(",,");
                } else {
                    let (m, sd) = mean_std(values);
                    s.push_str(&format!(",{m},{sd}"));
                }
            }
            s.push_str(&format!(",{}\n", row.failures.len()));
        }
        s
    }
}

/// The settings a cell's baseline row depends on besides its seed, as one flat mapping: the
/// data section (its keys bare: ` (imbalance=2)`), the evaluation settings (`eval.…`) and the
/// device and precision; for the random-init encoder also the model section without the
/// projector, which it does not use (`model.…`: ` (model.pool=mean)`).
fn baseline_section(cell: &Cell, random_init: bool) -> serde_yaml::Mapping {
    let config = &cell.config;
    let mapping = |value: serde_yaml::Result<serde_yaml::Value>| match value {
        Ok(serde_yaml::Value::Mapping(m)) => m,
        _ => serde_yaml::Mapping::new(),
    };
    let mut section = mapping(serde_yaml::to_value(&config.data));
    let mut add = |prefix: &str, map: serde_yaml::Mapping, skip: &[&str]| {
        for (k, v) in map {
            let name = k.as_str().unwrap_or_default();
            if !skip.contains(&name) {
                section.insert(format!("{prefix}.{name}").into(), v);
            }
        }
    };
    add("eval", mapping(serde_yaml::to_value(&config.eval)), &[]);
    let mut train = serde_yaml::Mapping::new();
    train.insert("device".into(), config.train.device.clone().into());
    train.insert(
        "precision".into(),
        serde_yaml::to_value(config.train.precision).unwrap_or_default(),
    );
    add("train", train, &[]);
    if random_init {
        let model = mapping(serde_yaml::to_value(&config.model));
        add("model", model, &["projector", "sync_bn"]);
    }
    section
}

/// A baseline section as text, the key of its group.
fn section_key(section: &serde_yaml::Mapping) -> String {
    serde_yaml::to_string(section).unwrap_or_default()
}

/// For each distinct [`baseline_section`] among `cells` (of the random-init rows, or of the
/// raw-input rows): its order of first appearance and a label suffix naming the keys that
/// differ between sections (` (imbalance=2)`), empty when all cells share one. A key a section
/// omits is at its default.
fn section_labels(cells: &[Cell], random_init: bool) -> BTreeMap<String, (usize, String)> {
    let mut sections: Vec<(String, serde_yaml::Mapping)> = Vec::new();
    for cell in cells {
        let map = baseline_section(cell, random_init);
        let key = section_key(&map);
        if !sections.iter().any(|(k, _)| *k == key) {
            sections.push((key, map));
        }
    }
    let mut differing: Vec<serde_yaml::Value> = Vec::new();
    for (_, map) in &sections {
        for k in map.keys() {
            let varies = sections.iter().any(|(_, other)| other.get(k) != map.get(k));
            if varies && !differing.contains(k) {
                differing.push(k.clone());
            }
        }
    }
    let show = |v: Option<&serde_yaml::Value>| match v {
        None => "default".to_string(),
        Some(v) => serde_yaml::to_string(v)
            .unwrap_or_default()
            .trim()
            .to_string(),
    };
    sections
        .iter()
        .enumerate()
        .map(|(group, (key, map))| {
            let suffix = match differing.is_empty() {
                true => String::new(),
                false => format!(
                    " ({})",
                    differing
                        .iter()
                        .map(|k| format!("{}={}", show(Some(k)), show(map.get(k))))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            (key.clone(), (group, suffix))
        })
        .collect()
}
