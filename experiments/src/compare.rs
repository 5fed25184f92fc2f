//! `ssl compare`: a grid of runs — objectives × views × batch sizes × seeds — trained one after
//! another with the same protocol, summarised as mean ± std over seeds.
//!
//! Every cell is an ordinary run directory under `OUT/runs/LABEL/vV-bB-sS`. A cell whose
//! `results.json` exists and whose `config.yaml` equals the cell's resolved configuration (every
//! objective parameter included, so a changed default retrains) is reused;
//! an interrupted cell with a checkpoint of the same configuration is resumed. Cells an objective
//! refuses (e.g. a two-view method at V = 8) and runs that fail are reported in the table, not
//! fatal. Outputs: `OUT/NAME.md`, `OUT/NAME.csv`, `OUT/NAME.png`, NAME being the grid file's stem
//! (`compare` without one) — so grids sharing an output directory share their finished runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde::Deserialize;

use ssl_report::plot::{self, Bar, BarPanel, LineAxes, Panel, ScatterPanel, Series};
use ssl_train::config::{apply_set, RunConfig};
use ssl_train::progress;
use ssl_train::results::{Metric, Results, RESULTS};
use ssl_train::Trainer;
use ssl_train::{atomic, checkpoint};

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

/// Largest batch a smoke run trains with (`ssl compare --smoke`).
pub const SMOKE_BATCH: usize = 4;
/// Instances a smoke run pretrains on (a stratified subset of any data set).
pub const SMOKE_TRAIN_SIZE: usize = 16;
/// Side a smoke run shrinks an image folder's images to (a multiple of a ViT's 16-px patches).
pub const SMOKE_SIZE: usize = 32;
/// Classes a smoke run keeps of each half of a halves grid (the first listed): the protocol's
/// training, pairs and trees run on 8 classes as on 50, and the evaluation embeds a sixth of
/// the images (a ViT-B cell's evaluation was most of its smoke run). The synthesised archives
/// and folders hold 2 training images a class, so 8 classes give the [`SMOKE_TRAIN_SIZE`]
/// pretraining images.
pub const SMOKE_HALF_CLASSES: usize = 8;
const _: () = assert!(2 * SMOKE_HALF_CLASSES >= SMOKE_TRAIN_SIZE);
/// Widest projector layer a smoke run keeps: the papers' 8192-wide expanders (about 150 M
/// parameters behind a ResNet-50) are most of a smoke run's time and none of what it checks.
pub const SMOKE_WIDTH: usize = 256;

/// An objective entry as a mapping (a bare name becomes `{name: NAME}`).
fn entry_map(value: &mut serde_yaml::Value) -> Result<&mut serde_yaml::Mapping> {
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
fn entry_set(value: &mut serde_yaml::Value) -> Result<&mut serde_yaml::Sequence> {
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
    fn parse(value: &serde_yaml::Value) -> Result<Self> {
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

    fn label(&self) -> &str {
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

    /// Turns the grid into its smoke test (`ssl compare --smoke`): every objective entry and view
    /// count at one batch size (the smallest listed, at most [`SMOKE_BATCH`], at least the
    /// objective's smallest, on as many images where that is more), the first seed
    /// only, one epoch (the last partial batch kept; all warm-up where the recipe warms up), no
    /// accumulation, on the CPU, on data synthesised under `OUT/data` in the exact format of the
    /// recipe's data set — MedMNIST `.npz` of digits, CIFAR/STL-10/Tiny ImageNet archives in
    /// their official layouts, Caltech-256's extracted tree, or an ImageNet-style JPEG folder
    /// with the recipe's class directories — so that every cell's configuration, data path,
    /// encoder and objective is exercised in seconds. Pretraining sees a stratified subset of
    /// [`SMOKE_TRAIN_SIZE`] images; where the reader takes any size, images are shrunk to
    /// [`SMOKE_SIZE`] px (MedMNIST 2D: its 64-px files; volumes keep theirs); projector layers
    /// wider than [`SMOKE_WIDTH`] are cut to it; each half of a halves grid keeps its first
    /// [`SMOKE_HALF_CLASSES`] classes; the encoder, the projector's depth and the
    /// objective stay the recipe's. These overrides go after every entry's own `set`. `OUT`
    /// defaults to `runs/smoke/NAME`. Every cell must then finish.
    pub fn smoke(&mut self, out: Option<&Path>) -> Result<()> {
        self.smoke = true;
        // The one epoch is the warm-up where the recipe has one (its first steps then run at a
        // small learning rate, as the real run's do), else none.
        let recipe_cells = self.cells()?;
        let warmup = recipe_cells
            .iter()
            .any(|c| c.config.train.warmup_epochs > 0);
        self.out = match out {
            Some(out) => out.to_path_buf(),
            None => PathBuf::from("runs/smoke").join(self.stem()),
        };
        self.seeds.truncate(1);
        if let Some(halves) = &mut self.halves {
            for half in halves {
                half.truncate(SMOKE_HALF_CLASSES);
            }
        }
        // One batch size per entry and view count: the smallest it lists, capped (so that
        // IConE's B = 1 path runs).
        let cap = |list: &mut Vec<usize>| {
            if let Some(&b) = list.iter().min() {
                *list = vec![b.min(SMOKE_BATCH)];
            }
        };
        match self.batch_sizes.is_empty() {
            true => self.batch_sizes = vec![SMOKE_BATCH],
            false => cap(&mut self.batch_sizes),
        }
        for entry in &mut self.objectives {
            if let Some(serde_yaml::Value::Sequence(list)) = entry.get_mut("batch_sizes") {
                let mut sizes: Vec<usize> = list
                    .iter()
                    .map(|v| v.as_u64().map(|v| v as usize))
                    .collect::<Option<_>>()
                    .context("an objective's `batch_sizes` must be a list of integers")?;
                cap(&mut sizes);
                *list = sizes.into_iter().map(|b| (b as u64).into()).collect();
            }
        }
        // Everything from here on is the smoke run's: it also goes after each entry's own `set`
        // (below), which would otherwise win (an entry's `train.epochs=400`).
        let first = self.set.len();
        self.set.extend(
            [
                "train.epochs=1",
                if warmup {
                    "train.warmup_epochs=1"
                } else {
                    "train.warmup_epochs=0"
                },
                "train.accumulate=1",
                "train.drop_last=false",
                "train.device=cpu",
                "train.checkpoint_every=1",
                "train.stop_after_epochs=0",
                "eval.spectrum_every=0",
            ]
            .map(String::from),
        );
        let cells = match &self.halves {
            None => self.cells()?,
            // A halves grid (`ssl generalise`) trains each half on its own classes.
            Some(halves) => {
                let mut cells = Vec::new();
                for h in 0..2 {
                    cells.extend(self.half(halves, h).cells()?);
                }
                cells
            }
        };
        let mut data_sets: Vec<(String, usize)> = cells
            .iter()
            .map(|c| (c.config.data.name.clone(), c.config.data.size))
            .collect();
        data_sets.sort();
        data_sets.dedup();
        if data_sets.len() > 1 {
            bail!(
                "a smoke run needs every cell on one data set and size, got {}",
                data_sets
                    .iter()
                    .map(|(n, s)| format!("{n} at {s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let (name, size) = data_sets.pop().context("the grid has no cells")?;
        let pairs = self.halves.is_some();
        let data = self.out.join("data");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        let mut root = data.clone();
        if let Some(info) = ssl_data::archive_info(&name) {
            let path = data.join(info.file);
            if !path.exists() {
                // Two training images per class (pretraining takes a small stratified subset of
                // them); one test image per class, two of the first two (labels cycle), which the
                // evaluation's pairs need — two of every class for a halves grid, whose runs
                // each evaluate on their own classes.
                let unlabeled = if info.splits[2] > 0 {
                    2 * info.classes
                } else {
                    0
                };
                let test = match pairs {
                    true => 2 * info.classes,
                    false => info.classes + 2,
                };
                let counts = [2 * info.classes, test, unlabeled];
                ssl_data::write_synthetic_archive(&name, &path, counts)?;
            }
        } else if name == "folder" {
            // The recipe's class directories (`data.folder_classes`, `imagenet100`: CMC's list),
            // else ImageNet-like synset names, as many as the recipe's `data.classes` reach.
            let wanted = &cells[0].config.data.folder_classes;
            let names: Vec<String> = match wanted.as_slice() {
                [one] if one == "imagenet100" => ssl_data::IMAGENET100.map(String::from).to_vec(),
                [] => {
                    let reach = cells
                        .iter()
                        .flat_map(|c| c.config.data.classes.iter())
                        .map(|&c| c as usize + 1)
                        .max()
                        .unwrap_or(0);
                    (0..reach.max(4)).map(|c| format!("n{c:08}")).collect()
                }
                names => names.to_vec(),
            };
            let classes = names.len();
            root = data.join("folder");
            if !root.exists() {
                // Non-square JPEGs, so that the resize of the shorter side and the centre crop
                // run as they do on ImageNet's files; enough training images for the subset, one
                // of each class to evaluate on and a second of the first (the evaluation's pair;
                // two of every class for a halves grid).
                let train = SMOKE_TRAIN_SIZE.div_ceil(classes).max(2);
                let val = 1 + usize::from(pairs);
                ssl_data::write_synthetic_folder(&root, &names, [train, val], 80, 64)?;
                let first = root.join("val").join(&names[0]);
                std::fs::copy(first.join("0.JPEG"), first.join(format!("{val}.JPEG")))
                    .with_context(|| format!("cannot write {}", first.display()))?;
            }
            if size > SMOKE_SIZE {
                self.shrink(&cells, SMOKE_SIZE);
            }
        } else if name == ssl_data::caltech256::NAME {
            // The 257 official category directories, ten JPEGs each: a 0.2 test fraction (the
            // recipes') holds out two of every class, the evaluation's pairs.
            root = data.join("caltech256");
            if !root.exists() {
                ssl_data::caltech256::write_synthetic(&root, 10)?;
            }
            if size > SMOKE_SIZE {
                self.shrink(&cells, SMOKE_SIZE);
            }
        } else if let Ok(info) = ssl_data::medmnist_info(&name) {
            // Volumes keep their size: at 28³ a 3D ResNet-18's last map is 1×1×1, and a B = 1
            // step (each view forwarded alone) leaves its batch norm one value per channel.
            let small = match info.volumetric {
                true => size,
                false => 64,
            };
            let size = match size > small && info.md5_at(small).is_ok() {
                true => {
                    self.shrink(&cells, small);
                    small
                }
                false => size,
            };
            let path = data.join(info.file_name(size));
            if !path.exists() {
                ssl_data::write_digits_as_medmnist(&path, info.flag, size)?;
            }
        }
        // digits and gmm are built in: nothing to write. Every data set pretrains on the
        // subset, the built-in ones too: their 1,437 or so instances would leave a last batch
        // of one, which a batch-normed projector refuses. (The probe learns the classes the
        // subset has; the others score 0, which a smoke run does not look at.)
        self.set.push(format!("data.train_size={SMOKE_TRAIN_SIZE}"));
        self.set.push(format!("data.root='{}'", root.display()));
        for value in &mut self.objectives {
            let label = ObjectiveEntry::parse(value)?.label().to_string();
            let Some(cell) = cells.iter().find(|c| c.label == label) else {
                continue;
            };
            let widths = &cell.config.model.projector;
            if widths.iter().any(|&w| w > SMOKE_WIDTH) {
                let capped: Vec<String> = widths
                    .iter()
                    .map(|&w| w.min(SMOKE_WIDTH).to_string())
                    .collect();
                let set = format!("model.projector=[{}]", capped.join(","));
                entry_set(value)?.push(set.into());
            }
        }
        let forced = self.set[first..].to_vec();
        for entry in &mut self.objectives {
            if let Some(serde_yaml::Value::Sequence(list)) = entry.get_mut("set") {
                list.extend(forced.iter().map(|s| s.as_str().into()));
            }
        }
        // An entry that needs a larger batch than the smoke's (W-MSE whitens sub-batches of
        // `w_size`; a batch-normed projector needs 2 where IConE's grids go down to 1) trains
        // one batch of its smallest, on as many images: the built-in sets hold them; a
        // synthesised file holds [`SMOKE_TRAIN_SIZE`], and the run says so. The limit is read
        // from the recipe's largest batch of the entry, as the real run builds it.
        for value in &mut self.objectives {
            let label = ObjectiveEntry::parse(value)?.label().to_string();
            let smoke = cells.iter().find(|c| c.label == label);
            let recipe = recipe_cells
                .iter()
                .filter(|c| c.label == label)
                .max_by_key(|c| c.batch_size);
            let (Some(smoke), Some(recipe)) = (smoke, recipe) else {
                continue;
            };
            let need = ssl_train::model::smallest_batch(&recipe.config)
                .with_context(|| format!("objective entry `{label}`"))?;
            if need > smoke.batch_size {
                entry_map(value)?.insert("batch_sizes".into(), vec![need as u64].into());
                let set = format!("data.train_size={}", need.max(SMOKE_TRAIN_SIZE));
                entry_set(value)?.push(set.into());
            }
        }
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

    /// Smoke runs at `size` px instead of the recipe's: multi-crop's local views at half of it,
    /// a folder's kept side (`data.keep_side`) in the same proportion (rounded up).
    fn shrink(&mut self, cells: &[Cell], size: usize) {
        self.set.push(format!("data.size={size}"));
        if cells.iter().any(|c| c.config.train.local_views > 0) {
            self.set.push(format!("train.local_size={}", size / 2));
        }
        if let Some(data) = cells
            .iter()
            .map(|c| &c.config.data)
            .find(|d| d.keep_side > 0)
        {
            let side = (data.keep_side * size).div_ceil(data.size);
            self.set.push(format!("data.keep_side={side}"));
        }
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

/// What became of a cell.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Finished (now or earlier): metrics per encoder row, and wall time in seconds.
    Done {
        rows: BTreeMap<String, BTreeMap<String, f64>>,
        seconds: f64,
    },
    /// The objective refuses this V or B, or the run failed; the message says why.
    Failed(String),
}

/// The configuration as a cell and a stored run are compared. The online probe's learning rate
/// is left out: the probe reads detached features with optimiser slots of its own, so it moves no
/// encoder weight and no number in the table (a CLI test trains both ways and compares weights).
fn config_text(cfg: &RunConfig) -> Result<String> {
    let mut cfg = cfg.clone();
    cfg.train.probe_lr = 0.0;
    Ok(serde_yaml::to_string(&cfg)?)
}

/// Whether `dir/config.yaml` resolves to exactly `cfg`. Stored objective parameters are
/// resolved against this build's defaults like the cell's, so a run recorded before its
/// parameters were written out in full still matches while those defaults hold.
fn same_config(dir: &Path, cfg: &RunConfig) -> Result<bool> {
    let path = dir.join("config.yaml");
    if !path.exists() {
        return Ok(false);
    }
    // An unreadable or invalid record is not this run's: the cell retrains over it.
    let mut stored = match RunConfig::from_file(&path).and_then(RunConfig::from_yaml_value) {
        Ok(stored) => stored,
        Err(_) => return Ok(false),
    };
    // What the run fitted to its data (CARP's prototypes on a small set, say) is not a change
    // of configuration: the cell asks for the paper defaults the record names.
    stored.objective = stored.objective.as_requested();
    Ok(config_text(&stored)? == config_text(cfg)?)
}

/// Reads a finished cell's results, if its directory holds them for exactly this configuration.
fn finished(cell: &Cell) -> Result<Option<Outcome>> {
    let dir = &cell.config.out;
    if !dir.join(RESULTS).exists() || !same_config(dir, &cell.config)? {
        return Ok(None);
    }
    let results = Results::read(dir)?;
    let rows = (results.rows.into_iter())
        .map(|row| match row.encoder.ends_with("(ours)") {
            true => ("ours".to_string(), row.metrics),
            false => (row.encoder, row.metrics),
        })
        .collect();
    Ok(Some(Outcome::Done {
        rows,
        seconds: results.seconds,
    }))
}

pub fn run_cell(cell: &Cell) -> Result<Outcome> {
    if let Some(done) = finished(cell)? {
        return Ok(done);
    }
    let dir = &cell.config.out;
    let resume =
        dir.join("checkpoint").join(checkpoint::STATE).exists() && same_config(dir, &cell.config)?;
    // The cell's directory is the grid's: a run of another configuration in it is replaced.
    let start = match resume {
        true => ssl_train::rundir::Start::Resume,
        false => ssl_train::rundir::Start::Overwrite,
    };
    match Trainer::new(cell.config.clone()).start(start).fit() {
        Ok(_) => Ok(finished(cell)?
            .unwrap_or_else(|| Outcome::Failed("the run ended without results.json".to_string()))),
        Err(e) => Ok(Outcome::Failed(format!("{e:#}"))),
    }
}

/// Runs (or reuses) every cell with a progress bar over the grid, then writes the tables and
/// the chart. Returns the Markdown table. A grid with `halves` is the generalisation
/// protocol's, which [`crate::generalise::run_grid`] runs.
pub fn run(grid: &Grid, command_line: &str) -> Result<String> {
    ensure!(
        grid.halves.is_none(),
        "a grid with `halves` runs the generalisation protocol (generalise::run_grid)"
    );
    let cells = grid.cells()?;
    std::fs::create_dir_all(&grid.out)
        .with_context(|| format!("cannot create {}", grid.out.display()))?;
    let bar = progress::bar(
        cells.len() as u64,
        "{spinner} grid [{bar:30}] {pos}/{len} runs {msg} (elapsed {elapsed})",
    );
    let mut outcomes = Vec::with_capacity(cells.len());
    for cell in &cells {
        bar.set_message(format!(
            "{} V={} B={} seed {}",
            cell.label, cell.views, cell.batch_size, cell.seed
        ));
        let outcome = run_cell(cell)?;
        if let Outcome::Failed(why) = &outcome {
            progress::println(format!(
                "warning: {} V={} B={} seed {}: {why}",
                cell.label, cell.views, cell.batch_size, cell.seed
            ));
        }
        outcomes.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if grid.smoke {
        let failed: Vec<String> = cells
            .iter()
            .zip(&outcomes)
            .filter_map(|(cell, outcome)| match outcome {
                Outcome::Failed(why) => Some(format!(
                    "{} V={} B={}: {why}",
                    cell.label, cell.views, cell.batch_size
                )),
                Outcome::Done { .. } => None,
            })
            .collect();
        if !failed.is_empty() {
            bail!(
                "the smoke run of {} failed in {} of {} cells (fix the recipe or the code it names):\n{}",
                grid.stem(),
                failed.len(),
                cells.len(),
                failed.join("\n")
            );
        }
    }
    let summary = Summary::new(grid, &cells, &outcomes)?;
    let markdown = summary.markdown(command_line);
    let file = |ext: &str| grid.out.join(format!("{}.{ext}", grid.stem()));
    atomic::write(&file("md"), markdown.as_bytes())?;
    atomic::write(&file("csv"), summary.csv().as_bytes())?;
    summary.chart(&file("png"))?;
    embeddings_figure(
        &cells,
        &grid.out.join(format!("{}-embeddings.png", grid.stem())),
    )?;
    Ok(markdown)
}

/// The catalogue entries named by `keys`, in that order; an unknown key is an error that lists
/// the known ones.
fn metrics(keys: &[String]) -> Result<Vec<Metric>> {
    if keys.is_empty() {
        bail!("the grid's `metrics` list is empty; name at least one column");
    }
    keys.iter()
        .map(|key| Metric::find(key).map_err(|e| anyhow!("the grid's `metrics`: {e}")))
        .collect()
}

/// A column's heading: the metric's title, with `%` for a percentage (the cells are numbers).
fn heading(m: &Metric) -> String {
    match m.percent() {
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
struct Row {
    label: String,
    views: Option<usize>,
    batch_size: Option<usize>,
    values: Vec<Vec<f64>>,
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

struct Summary {
    metrics: Vec<Metric>,
    rows: Vec<Row>,
    baselines: Vec<Row>,
    references: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Summary {
    fn new(grid: &Grid, cells: &[Cell], outcomes: &[Outcome]) -> Result<Self> {
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

    fn markdown(&self, command_line: &str) -> String {
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

    fn csv(&self) -> String {
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

    /// Bars of the first two metrics; when the grid varies the batch size, lines of them
    /// against log₂ B instead (one line per objective and view count).
    fn chart(&self, path: &Path) -> Result<()> {
        let shown = self.metrics.len().min(2);
        let batch_sizes: std::collections::BTreeSet<_> =
            self.rows.iter().filter_map(|r| r.batch_size).collect();
        if batch_sizes.len() > 1 {
            let panels: Vec<Panel> = (0..shown).map(|k| self.batch_panel(k)).collect();
            return plot::line_panels(
                path,
                &panels,
                &LineAxes {
                    x_label: "log₂ batch size",
                    y_label: "mean over seeds",
                    log_y: false,
                },
            );
        }
        let panel = |k: usize| {
            let m = self.metrics[k];
            BarPanel {
                title: heading(&m),
                x_label: heading(&m),
                bars: self
                    .rows
                    .iter()
                    .filter(|r| !r.values[k].is_empty())
                    .map(|r| {
                        let scaled: Vec<f64> = r.values[k].iter().map(|v| v * m.scale).collect();
                        let (mean, std) = mean_std(&scaled);
                        Bar {
                            label: format!(
                                "{} V={} B={}",
                                r.label,
                                r.views.unwrap_or(0),
                                r.batch_size.unwrap_or(0)
                            ),
                            mean,
                            std,
                        }
                    })
                    .collect(),
                references: self
                    .baselines
                    .iter()
                    .filter(|r| !r.values[k].is_empty())
                    .map(|r| (r.label.clone(), mean_std(&r.values[k]).0 * m.scale))
                    .collect(),
            }
        };
        let panels: Vec<BarPanel> = (0..shown).map(panel).collect();
        plot::bar_panels(path, &panels)
    }

    /// Metric `k` against log₂ B: one series per (label, V).
    fn batch_panel(&self, k: usize) -> Panel {
        let m = self.metrics[k];
        let mut series: Vec<Series> = Vec::new();
        for row in self.rows.iter().filter(|r| !r.values[k].is_empty()) {
            let name = format!("{} V={}", row.label, row.views.unwrap_or(0));
            let b = row.batch_size.unwrap_or(1) as f64;
            let scaled: Vec<f64> = row.values[k].iter().map(|v| v * m.scale).collect();
            let point = (b.log2(), mean_std(&scaled).0);
            match series.iter_mut().find(|s| s.label == name) {
                Some(s) => s.points.push(point),
                None => series.push(Series {
                    label: name,
                    points: vec![point],
                }),
            }
        }
        Panel {
            title: heading(&m),
            series,
        }
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

/// The unit-circle test embeddings (`embedding.csv`, written by runs whose encoder outputs 2
/// dimensions) of the first seed of each label, one panel per label. Returns whether any run
/// had one.
fn embeddings_figure(cells: &[Cell], path: &Path) -> Result<bool> {
    let mut panels: Vec<ScatterPanel> = Vec::new();
    for cell in cells {
        if panels
            .iter()
            .any(|p| p.title.starts_with(&format!("{} ", cell.label)))
        {
            continue;
        }
        let file = cell.config.out.join("embedding.csv");
        if !file.exists() {
            continue;
        }
        let points = ssl_train::evaluate::read_embedding(&file)?;
        panels.push(ScatterPanel {
            title: format!("{} (seed {})", cell.label, cell.seed),
            points,
        });
    }
    if panels.is_empty() {
        return Ok(false);
    }
    plot::scatter_panels(path, &panels)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(yaml: &str) -> Result<Grid> {
        Ok(serde_yaml::from_str(yaml)?)
    }

    /// `--smoke` keeps every entry and view count at one small batch (but not below what the
    /// entry trains at), the first seed, one epoch and a small pretraining subset, even where an
    /// entry's own `set` asks for more; a halves grid checks both halves.
    #[test]
    fn a_smoke_run_keeps_every_entry_and_view_at_one_small_cheap_cell() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut g = grid(
            "objectives:\n  - vicreg\n  - {name: simclr, label: long, set: [train.epochs=400, \
             train.accumulate=16, 'model.projector=[8192,8192,64]'], batch_sizes: [128, 64]}\n  \
             - {name: wmse, set: ['model.projector=[64,32]']}\n\
             views: [2, 4]\nbatch_sizes: [256, 1]\nseeds: [3, 4]\nset: ['model.projector=[512,300]']",
        )?;
        g.smoke(Some(dir.path()))?;
        let cells = g.cells()?;
        let shape: Vec<(&str, usize, usize)> = cells
            .iter()
            .map(|c| (c.label.as_str(), c.views, c.batch_size))
            .collect();
        assert_eq!(
            shape,
            [
                // The grid's smallest, 1, is one instance in the projector's batch norm.
                ("vicreg", 2, 2),
                ("vicreg", 4, 2),
                ("long", 2, 4),
                ("long", 4, 4),
                // W-MSE whitens sub-batches of w_size = 128.
                ("wmse", 2, 128),
                ("wmse", 4, 128)
            ]
        );
        for c in &cells {
            assert_eq!((c.seed, c.config.train.epochs), (3, 1));
            assert_eq!(c.config.train.accumulate, 1);
            // The built-in digits too: their 1,437 instances at B = 4 would end on a batch of 1.
            let train_size = match c.label.as_str() {
                "wmse" => 128,
                _ => SMOKE_TRAIN_SIZE,
            };
            assert_eq!(c.config.data.train_size, train_size, "{}", c.label);
            assert!(c.config.out.starts_with(dir.path()));
            // Projector layers cut to SMOKE_WIDTH, the grid's and an entry's own alike.
            let widths = match c.label.as_str() {
                "vicreg" => [256, 256].as_slice(),
                "wmse" => &[64, 32],
                _ => &[256, 256, 64],
            };
            assert_eq!(c.config.model.projector, widths, "{}", c.label);
        }
        let mut halves =
            grid("objectives: [vicreg]\nhalves: [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11]]")?;
        halves.smoke(Some(dir.path()))?;
        let [a, b] = halves.halves.clone().expect("halves");
        assert_eq!((a.len(), b.len()), (SMOKE_HALF_CLASSES, 2));
        let a = halves.half(&[a, b], 0).cells()?;
        assert_eq!(a[0].config.data.classes, [0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(a[0].config.out.starts_with(dir.path().join("half-a")));
        Ok(())
    }

    #[test]
    fn stored_runs_match_only_their_resolved_configuration() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = RunConfig::from_yaml_value(serde_yaml::Value::Mapping(Default::default()))?;
        assert!(!same_config(dir.path(), &cfg)?);
        let write = |text: &str| std::fs::write(dir.path().join("config.yaml"), text);
        // Written in full: matches; one parameter off: retrains.
        write(&config_text(&cfg)?)?;
        assert!(same_config(dir.path(), &cfg)?);
        write(&config_text(&cfg)?.replace("lambda: 25.0", "lambda: 24.0"))?;
        assert!(!same_config(dir.path(), &cfg)?);
        // Another online-probe learning rate trains the same encoder: still this cell's run.
        let mut other_probe = cfg.clone();
        other_probe.train.probe_lr = 1e-3;
        write(&serde_yaml::to_string(&other_probe)?)?;
        assert!(same_config(dir.path(), &cfg)?);
        // Recorded without its parameters: resolved against these defaults.
        let mut legacy: serde_yaml::Value = serde_yaml::from_str(&config_text(&cfg)?)?;
        legacy["objective"]["params"] = serde_yaml::Value::Mapping(Default::default());
        write(&serde_yaml::to_string(&legacy)?)?;
        assert!(same_config(dir.path(), &cfg)?);
        write("not: [valid")?;
        assert!(!same_config(dir.path(), &cfg)?);
        Ok(())
    }

    #[test]
    fn cells_expand_in_table_order_with_entry_overrides() -> Result<()> {
        let g = grid(
            "objectives: [vicreg, {name: simclr, label: simclr-t02, params: {temperature: 0.2}, views: [2, 4]}]\nseeds: [0, 1]\nbatch_sizes: [64]\nout: /tmp/x\nset: ['train.epochs=3']",
        )?;
        let cells = g.cells()?;
        let keys: Vec<(String, usize, u64)> = cells
            .iter()
            .map(|c| (c.label.clone(), c.views, c.seed))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("vicreg".into(), 2, 0),
                ("vicreg".into(), 2, 1),
                ("simclr-t02".into(), 2, 0),
                ("simclr-t02".into(), 2, 1),
                ("simclr-t02".into(), 4, 0),
                ("simclr-t02".into(), 4, 1),
            ]
        );
        let c = &cells[4];
        assert_eq!(c.config.objective.name, "simclr");
        assert_eq!(c.config.objective.params["temperature"].as_f64(), Some(0.2));
        assert_eq!((c.config.train.batch_size, c.config.train.epochs), (64, 3));
        assert_eq!(
            c.config.out,
            PathBuf::from("/tmp/x/runs/simclr-t02/v4-b64-s0")
        );
        Ok(())
    }

    /// `--objectives` over a grid keeps the grid's entries for those objectives (by label or
    /// by name, aliases resolved), in the order asked, and adds the others with defaults.
    #[test]
    fn selecting_objectives_keeps_their_grid_entries() -> Result<()> {
        let mut g = grid(
            "objectives: [vicreg, {name: simclr, label: simclr-t02, params: {temperature: 0.2}}, {name: mae, set: ['train.epochs=5']}]\nseeds: [0]",
        )?;
        let names = ["masked-autoencoder", "simclr-t02", "barlow-twins"].map(String::from);
        g.select_objectives(&names)?;
        let cells = g.cells()?;
        let labels: Vec<&str> = cells.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["mae", "simclr-t02", "barlow-twins"]);
        assert_eq!(cells[0].config.train.epochs, 5);
        assert_eq!(
            cells[1].config.objective.params["temperature"].as_f64(),
            Some(0.2)
        );
        assert!(g.select_objectives(&["vicregg".into()]).is_err());
        // By objective, a labelled entry is selected too.
        let mut g = grid("objectives: [vicreg, {name: simclr, label: simclr-t02}]")?;
        g.select_objectives(&["simclr".into()])?;
        let labels: Vec<String> = g.cells()?.into_iter().map(|c| c.label).collect();
        assert_eq!(labels, ["simclr-t02"; 3]);
        Ok(())
    }

    #[test]
    fn a_batch_size_set_by_override_is_kept_without_a_batch_list() -> Result<()> {
        let g = grid(
            "objectives: [vicreg, {name: simclr, set: ['train.batch_size=16']}]\nseeds: [0]\nset: ['train.batch_size=64']",
        )?;
        let batches: Vec<usize> = g.cells()?.iter().map(|c| c.batch_size).collect();
        assert_eq!(batches, [64, 16]);
        Ok(())
    }

    #[test]
    fn unknown_metrics_are_refused_before_anything_trains() {
        let e = grid("objectives: [vicreg]\nmetrics: [knn_acc]")
            .unwrap()
            .cells()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown metric `knn_acc`") && e.contains("knn_accuracy"),
            "{e}"
        );
    }

    #[test]
    fn grid_errors_name_the_problem() {
        let err = |yaml: &str| format!("{:#}", grid(yaml).and_then(|g| g.cells()).unwrap_err());
        assert!(err("objectives: [vicregg]").contains("did you mean"));
        assert!(err("objectives: []").contains("no objectives"));
        assert!(err("objectives: [{name: vicreg, lable: x}]").contains("unknown field `lable`"));
        assert!(err("objective: [vicreg]").contains("unknown field `objective`"));
    }

    /// A cell of seed 0 at V = 2, B = 64 running `config`.
    fn cell_of(label: &str, config: RunConfig) -> Cell {
        Cell {
            label: label.into(),
            views: 2,
            batch_size: 64,
            seed: 0,
            config,
        }
    }

    #[test]
    fn baselines_are_reported_per_data_set() {
        let cell = |label: &str, imbalance: usize| {
            let mut config = RunConfig::default();
            config.data.imbalance = imbalance;
            cell_of(label, config)
        };
        let done = |acc: f64| {
            let mut m = BTreeMap::new();
            m.insert("probe_balanced_accuracy".to_string(), acc);
            let rows = ["ours", "raw inputs", "random init"]
                .map(|r| (r.to_string(), m.clone()))
                .into_iter()
                .collect();
            Outcome::Done { rows, seconds: 1.0 }
        };
        let cells = [cell("k=1", 1), cell("k=5", 5)];
        let g = grid("objectives: [vicreg]").unwrap();
        let md = Summary::new(&g, &cells, &[done(0.9), done(0.6)])
            .unwrap()
            .markdown("ssl compare");
        assert!(
            md.contains("| raw inputs (imbalance=default) | — | — | 1 | 90.0 ± 0.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| raw inputs (imbalance=5) | — | — | 1 | 60.0 ± 0.0 |"),
            "{md}"
        );
        assert!(md.contains("| random init (imbalance=5) |"), "{md}");
    }

    /// The random-init rows follow the encoder's configuration (not its projector), the
    /// raw-input rows do not: a grid whose entries pool a ViT two ways has one raw-input row
    /// and a random-init row per pooling, each from its own cells (before, the last cell of a
    /// seed stood for every encoder).
    #[test]
    fn random_init_rows_are_reported_per_encoder_configuration() {
        use ssl_models::VitPool::{self, Class, Mean};
        let cell = |label: &str, pool: VitPool, projector: usize| {
            let mut config = RunConfig::default();
            config.model.pool = pool;
            config.model.projector = vec![projector];
            cell_of(label, config)
        };
        let done = |raw: f64, random: f64| {
            let row = |v: f64| BTreeMap::from([("probe_balanced_accuracy".to_string(), v)]);
            let rows = BTreeMap::from([
                ("ours".to_string(), row(0.5)),
                ("raw inputs".to_string(), row(raw)),
                ("random init".to_string(), row(random)),
            ]);
            Outcome::Done { rows, seconds: 1.0 }
        };
        let cells = [
            cell("a", Class, 8),
            cell("b", Class, 16),
            cell("c", Mean, 8),
        ];
        let outcomes = [done(0.9, 0.7), done(0.9, 0.7), done(0.9, 0.8)];
        let g = grid("objectives: [vicreg]").unwrap();
        let md = Summary::new(&g, &cells, &outcomes)
            .unwrap()
            .markdown("ssl compare");
        assert!(
            md.contains("| raw inputs | — | — | 1 | 90.0 ± 0.0 |"),
            "{md}"
        );
        for (pool, acc) in [("class", "70.0"), ("mean", "80.0")] {
            let row = format!("| random init (model.pool={pool}) | — | — | 1 | {acc} ± 0.0 |");
            assert!(md.contains(&row), "{row} not in\n{md}");
        }
        assert_eq!(md.matches("| random init").count(), 2, "{md}");
    }

    #[test]
    fn summary_gives_mean_and_sample_std_and_lists_failures() {
        let cell = |seed| Cell {
            label: "vicreg".into(),
            views: 2,
            batch_size: 8,
            seed,
            config: RunConfig::default(),
        };
        let done = |acc: f64| {
            let mut ours = BTreeMap::new();
            ours.insert("probe_balanced_accuracy".to_string(), acc);
            let mut rows = BTreeMap::new();
            rows.insert("ours".to_string(), ours.clone());
            rows.insert("raw inputs".to_string(), ours);
            Outcome::Done {
                rows,
                seconds: 10.0,
            }
        };
        let cells = [cell(0), cell(1), cell(2)];
        let outcomes = [
            done(0.9),
            done(0.8),
            Outcome::Failed("NaN at step 3".into()),
        ];
        let grid =
            grid("objectives: [vicreg]\nreference: {vicreg: {probe_balanced_accuracy: 0.875}}")
                .unwrap();
        let s = Summary::new(&grid, &cells, &outcomes).unwrap();
        let md = s.markdown("ssl compare");
        assert!(md.contains("| ↳ vicreg (published) | | | | 87.5 |"), "{md}");
        assert!(md.contains("| vicreg | 2 | 8 | 2 | 85.0 ± 7.1 |"), "{md}");
        assert!(md.contains("vicreg V=2 B=8: NaN at step 3"), "{md}");
        assert!(
            md.contains("| raw inputs | — | — | 2 | 85.0 ± 7.1 |"),
            "{md}"
        );
        let csv = s.csv();
        assert!(
            csv.lines().nth(2).unwrap().starts_with("vicreg,2,8,2,0.85"),
            "{csv}"
        );
    }
}
