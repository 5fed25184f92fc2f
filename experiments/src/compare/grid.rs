//! A comparison grid as read from YAML, and its expansion into cells, one run configuration each.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use ssl_train::config::{apply_set, RunConfig};

use super::summary::metrics;

/// A comparison grid, as read from YAML (`configs/compare-*.yaml`) and overridden by flags.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// Recipe every run starts from (default: the built-in main-job defaults).
    #[serde(default)]
    pub base: Option<PathBuf>,
    /// `KEY=VALUE` overrides applied to every run (as `ssl run --set`).
    #[serde(default)]
    pub set: Vec<String>,
    /// Objectives: names, or `{name, label, params, set, views, batch_sizes}` entries.
    pub objectives: Vec<serde_yaml::Value>,
    /// Views per instance (default `[2]`); an entry's own `views` replaces it.
    #[serde(default = "default_views")]
    pub views: Vec<usize>,
    /// Batch sizes (default: the base recipe's).
    #[serde(default)]
    pub batch_sizes: Vec<usize>,
    /// Seeds (default `[0, 1, 2]`).
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Output directory (default `runs/compare`).
    #[serde(default = "default_out")]
    pub out: PathBuf,
    /// Table columns, as `results.json` metric keys (default: probe, k-NN, RankMe, effective
    /// rank); see `ssl_train::results::METRICS`.
    #[serde(default = "default_metrics")]
    pub metrics: Vec<String>,
    /// Published values to print beside a row: label → metric key → value (in the units of
    /// `results.json`, e.g. accuracies as fractions).
    #[serde(default)]
    pub reference: BTreeMap<String, BTreeMap<String, f64>>,
    /// Stem of the table and chart files: the grid file's stem, or `compare`.
    #[serde(skip)]
    pub name: String,
    /// SAG-VICReg's generalisation protocol instead of a table of cells: two disjoint class
    /// sets; each objective and seed trains encoder A on the first and B on the second, both
    /// embed the test images of the first, and their trees are compared (`ssl generalise`;
    /// `reference` keys are then `lca_pearson`, `lca_spearman`, `lca_kendall`,
    /// `cophenetic_d1_p2`, `cophenetic_d2_p1`).
    #[serde(default)]
    pub halves: Option<[Vec<u32>; 2]>,
    /// Set by [`Grid::smoke`]: a failed cell is an error, not a table entry.
    #[serde(skip)]
    pub smoke: bool,
}

/// An objective entry as a mapping (a bare name becomes `{name: NAME}`).
pub(super) fn entry_map(value: &mut serde_yaml::Value) -> Result<&mut serde_yaml::Mapping> {
    if let serde_yaml::Value::String(name) = value {
        let mut entry = serde_yaml::Mapping::new();
        entry.insert("name".into(), name.clone().into());
        *value = serde_yaml::Value::Mapping(entry);
    }
    match value {
        serde_yaml::Value::Mapping(entry) => Ok(entry),
        other => bail!("an objective entry is a name or a mapping with `name`, got {other:?}"),
    }
}

/// The `set` list of an objective entry (a name, or a mapping with `name`), made where absent.
pub(super) fn entry_set(value: &mut serde_yaml::Value) -> Result<&mut serde_yaml::Sequence> {
    match entry_map(value)?
        .entry("set".into())
        .or_insert_with(|| serde_yaml::Value::Sequence(Vec::new()))
    {
        serde_yaml::Value::Sequence(list) => Ok(list),
        other => bail!("an objective entry's `set` must be a list, got {other:?}"),
    }
}

fn default_views() -> Vec<usize> {
    vec![2]
}
fn default_seeds() -> Vec<u64> {
    vec![0, 1, 2]
}
pub fn default_metrics() -> Vec<String> {
    [
        "probe_balanced_accuracy",
        "knn_accuracy",
        "rankme",
        "effective_rank",
    ]
    .map(String::from)
    .to_vec()
}
fn default_out() -> PathBuf {
    PathBuf::from("runs/compare")
}

/// One objective of the grid, with its own overrides.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectiveEntry {
    /// Registered name or alias.
    pub name: String,
    /// Row label (default: the name).
    #[serde(default)]
    pub label: Option<String>,
    /// `objective.params` (default: the objective's own defaults).
    #[serde(default)]
    pub params: Option<serde_yaml::Value>,
    /// Extra `KEY=VALUE` overrides for this objective's runs.
    #[serde(default)]
    pub set: Vec<String>,
    /// Views for this objective (replaces the grid's).
    #[serde(default)]
    pub views: Option<Vec<usize>>,
    /// Batch sizes for this objective (replaces the grid's).
    #[serde(default)]
    pub batch_sizes: Option<Vec<usize>>,
}

impl ObjectiveEntry {
    pub(super) fn parse(value: &serde_yaml::Value) -> Result<Self> {
        match value {
            serde_yaml::Value::String(name) => Ok(Self {
                name: name.clone(),
                label: None,
                params: None,
                set: Vec::new(),
                views: None,
                batch_sizes: None,
            }),
            other => serde_yaml::from_value(other.clone()).map_err(|e| {
                anyhow::anyhow!(
                    "objectives entry `{}`: {e} (an entry is a name or a map with keys name, label, params, set, views, batch_sizes)",
                    serde_yaml::to_string(other).unwrap_or_default().trim()
                )
            }),
        }
    }

    pub(super) fn label(&self) -> &str {
        self.label.as_deref().unwrap_or(&self.name)
    }
}

impl Grid {
    /// Reads a grid file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = ssl_train::config::read_config_text(path)?;
        let mut grid: Self = serde_yaml::from_str(&text)
            .with_context(|| format!("invalid grid file {}", path.display()))?;
        grid.name = path
            .file_stem()
            .map_or("compare".into(), |s| s.to_string_lossy().into_owned());
        Ok(grid)
    }

    /// Keeps the objectives named in `names` (`ssl compare GRID --objectives a,b`), in that
    /// order: every grid entry whose label or objective (aliases resolved) is the name, with its
    /// parameters, overrides, views and batch sizes; a name the grid lacks runs with its
    /// defaults.
    pub fn select_objectives(&mut self, names: &[String]) -> Result<()> {
        let mut selected = Vec::new();
        for name in names {
            // A label need not name an objective; an unmatched name must.
            let wanted = ssl_core::find(name).map(|r| r.name);
            let before = selected.len();
            for value in &self.objectives {
                let entry = ObjectiveEntry::parse(value)?;
                let objective = ssl_core::find(&entry.name)?.name;
                if entry.label() == name || wanted.as_ref().is_ok_and(|w| *w == objective) {
                    selected.push(value.clone());
                }
            }
            if selected.len() == before {
                wanted?;
                selected.push(name.as_str().into());
            }
        }
        self.objectives = selected;
        Ok(())
    }

    /// Half `h` (0 = A, 1 = B) of a halves grid: its cells train on `halves[h]` only, under
    /// `OUT/half-a` or `OUT/half-b`.
    pub fn half(&self, halves: &[Vec<u32>; 2], h: usize) -> Grid {
        let name = ["half-a", "half-b"][h];
        let mut grid = self.clone();
        grid.halves = None;
        grid.set.push(format!("data.classes={:?}", halves[h]));
        grid.out = self.out.join(name);
        grid.name = name.to_string();
        grid
    }

    /// Stem of the table files: the grid file's stem, or `compare`.
    pub fn stem(&self) -> &str {
        match self.name.is_empty() {
            true => "compare",
            false => &self.name,
        }
    }

    /// The grid's cells, in table order (objective, views, batch size, then seed), each with
    /// its fully resolved configuration. Unknown objectives and invalid overrides are errors
    /// here, before anything trains.
    pub fn cells(&self) -> Result<Vec<Cell>> {
        if self.objectives.is_empty() {
            bail!("the grid has no objectives; list some under `objectives:` or pass --objectives");
        }
        if self.seeds.is_empty() || self.views.is_empty() {
            bail!("the grid needs at least one seed and one view count");
        }
        metrics(&self.metrics)?;
        let base = match &self.base {
            Some(path) => RunConfig::from_file(path)?,
            None => serde_yaml::Value::Mapping(Default::default()),
        };
        RunConfig::from_yaml_value(base.clone()).context("invalid base recipe")?;
        let mut cells = Vec::new();
        for value in &self.objectives {
            let entry = ObjectiveEntry::parse(value)?;
            let registration = ssl_core::find(&entry.name)?;
            let views = entry.views.as_ref().unwrap_or(&self.views);
            // Without a batch-size list, the entry's batch size is the one its recipe and `set`
            // overrides give (`set: [train.batch_size=64]` is kept, not replaced by a default).
            let default_batches = match self.batch_sizes.is_empty() {
                true => {
                    let mut root = base.clone();
                    for s in self.set.iter().chain(&entry.set) {
                        apply_set(&mut root, s)?;
                    }
                    let cfg = RunConfig::from_yaml_value(root)
                        .with_context(|| format!("invalid overrides for {}", entry.label()))?;
                    vec![cfg.train.batch_size]
                }
                false => self.batch_sizes.clone(),
            };
            let batches = entry.batch_sizes.as_ref().unwrap_or(&default_batches);
            for &v in views {
                for &b in batches {
                    for &seed in &self.seeds {
                        let mut root = base.clone();
                        for s in self.set.iter().chain(&entry.set) {
                            apply_set(&mut root, s)?;
                        }
                        let dir = self
                            .out
                            .join("runs")
                            .join(entry.label())
                            .join(format!("v{v}-b{b}-s{seed}"));
                        let mut objective = serde_yaml::Mapping::new();
                        objective.insert("name".into(), registration.name.into());
                        objective.insert(
                            "params".into(),
                            entry
                                .params
                                .clone()
                                .unwrap_or(serde_yaml::Value::Mapping(Default::default())),
                        );
                        let map = root
                            .as_mapping_mut()
                            .context("the base recipe must be a YAML mapping")?;
                        map.insert("objective".into(), objective.into());
                        for assignment in [
                            format!("train.views={v}"),
                            format!("train.batch_size={b}"),
                            format!("train.seed={seed}"),
                            format!("out='{}'", dir.display()),
                        ] {
                            apply_set(&mut root, &assignment)?;
                        }
                        let config = RunConfig::from_yaml_value(root).with_context(|| {
                            format!("invalid configuration for {} V={v} B={b}", entry.label())
                        })?;
                        cells.push(Cell {
                            label: entry.label().to_string(),
                            views: v,
                            batch_size: b,
                            seed,
                            config,
                        });
                    }
                }
            }
        }
        Ok(cells)
    }
}

/// One run of the grid.
#[derive(Debug, Clone)]
pub struct Cell {
    pub label: String,
    pub views: usize,
    pub batch_size: usize,
    pub seed: u64,
    pub config: RunConfig,
}
