//! The run configuration: typed, with the main job's values as defaults, unknown keys rejected.
//!
//! Layering: defaults ← recipe YAML (`--config`) ← `--set key=value` ← plain flags.

mod data;
mod eval;
mod layering;
mod model;
mod objective;
#[cfg(test)]
mod tests;
mod train;

pub use data::*;
pub use eval::*;
pub use layering::*;
pub use model::*;
pub use objective::*;
pub use train::*;

use layering::keyed_error;

use std::io::Read;
use std::ops::Bound::{Excluded, Unbounded};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use ssl_data::DataSource;
use ssl_models::Stem;
pub use ssl_optim::OptimizerKind;

/// Everything a run needs; written resolved to `RUN_DIR/config.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub data: DataConfig,
    pub model: ModelConfig,
    pub objective: ObjectiveSection,
    pub train: TrainConfig,
    pub eval: EvalConfig,
    /// Run directory; empty: a new `runs/<objective>-<time>`, linked from `runs/latest`.
    pub out: PathBuf,
    /// Result-changing keys a `--resume --allow-changed` changed, in order (empty for a run
    /// that kept its configuration).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ConfigChange>,
}

/// One key a resumed run changed, and from which step its new value holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigChange {
    /// Dotted key, e.g. `train.epochs`.
    pub key: String,
    /// The value before and after, as YAML (`~` for a key that was absent).
    pub from: serde_yaml::Value,
    pub to: serde_yaml::Value,
    /// The first optimiser step taken with the new value.
    pub step: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            data: DataConfig::default(),
            model: ModelConfig::default(),
            objective: ObjectiveSection::default(),
            train: TrainConfig::default(),
            eval: EvalConfig::default(),
            out: PathBuf::new(),
            history: Vec::new(),
        }
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}
fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}
fn is_one(v: &usize) -> bool {
    *v == 1
}

impl RunConfig {
    /// Parses a YAML document (recipe or resolved config) over the defaults.
    /// The objective's parameters are resolved against its defaults (see
    /// [`ObjectiveSection::resolve`]).
    pub fn from_yaml_value(value: serde_yaml::Value) -> Result<Self> {
        let given =
            |section: &str, key: &str| value.get(section).and_then(|m| m.get(key)).is_some();
        let (encoder_given, local_scale_given, warmup_given) = (
            given("model", "encoder"),
            given("train", "local_scale"),
            given("train", "warmup_epochs"),
        );
        let mut config: RunConfig = match serde_yaml::from_value(value.clone()) {
            Ok(config) => config,
            Err(e) => bail!("{}", keyed_error(&value, e)),
        };
        config.objective.resolve()?;
        // A data set's own geometry and encoder, unless given: a benchmark set's one image side
        // and ResNet-18 (CIFAR's stem at 32 px); Caltech-256 at ImageNet's 224 px; a folder of
        // scans at full precision, 64 px (or 64³); a file of your own at its images' side.
        let mut volumes = false;
        match config.data.name {
            DataSource::Archive(info) => {
                if !given("data", "size") {
                    config.data.size = info.side;
                }
                if !encoder_given {
                    config.model.encoder = "resnet18".into();
                    if !given("model", "stem") && info.side == 32 {
                        config.model.stem = Stem::Cifar;
                    }
                }
            }
            DataSource::Caltech256 => {
                if !given("data", "size") {
                    config.data.size = 224;
                }
                if !encoder_given {
                    config.model.encoder = "resnet18".into();
                }
            }
            DataSource::Folder => {
                config.data.resolve_scans(given("data", "size"));
                volumes = config.data.scan_volumes();
            }
            DataSource::Npz => {
                if let Some((side, npz_volumes)) = config.data.npz_geometry() {
                    if !given("data", "size") {
                        config.data.size = side;
                    }
                    volumes = npz_volumes;
                }
            }
            DataSource::MedMnist(info) => volumes = info.volumetric,
            DataSource::Digits | DataSource::GaussianMixture => {}
        }
        config.data.resolve();
        // Volumes get IConE's 3D ResNet-18 unless an encoder is named (the digits CNN is 2D).
        if !encoder_given && volumes {
            config.model.encoder = "resnet18_3d".into();
        }
        if !local_scale_given {
            config.train.local_scale = config.data.recipe().local_crop_scale();
        }
        if !warmup_given {
            config.train.warmup_epochs = config.train.warmup_epochs.min(config.train.epochs);
        }
        config.train.threads = capped_threads(config.train.threads);
        config.validate()?;
        Ok(config)
    }

    /// The resolved configuration a run recorded in `dir/config.yaml`.
    pub fn load_run(dir: &Path) -> Result<Self> {
        let path = dir.join("config.yaml");
        anyhow::ensure!(
            path.exists(),
            "{} has no config.yaml; give a run directory written by `ssl run` (e.g. runs/latest)",
            dir.display()
        );
        Self::from_yaml_value(Self::from_file(&path)?)
            .with_context(|| format!("{} is not a valid run config", path.display()))
    }

    /// Reads a recipe file.
    pub fn from_file(path: &Path) -> Result<serde_yaml::Value> {
        let text = read_config_text(path)?;
        serde_yaml::from_str(&text).with_context(|| format!("{} is not valid YAML", path.display()))
    }

    /// Checks values that types do not, before anything is loaded or trained: every message names
    /// the key, the value and what it may be.
    pub fn validate(&self) -> Result<()> {
        self.train.validate()?;
        self.data.validate()?;
        self.model.validate()?;
        self.eval.validate()?;
        ensure!(
            self.data.split == TrainingSplit::Train || self.train.probe_lr == 0.0,
            "data.split: train+unlabeled pretrains on images without labels, which the online \
             probe cannot learn from; add --set train.probe_lr=0 (the end-of-run linear probe and \
             k-NN still use the labelled train split)"
        );
        ensure!(
            self.eval.encoder == EvaluatedEncoder::Student || self.train.probe_lr == 0.0,
            "eval.encoder: teacher evaluates the EMA teacher, and the online probe learns from the \
             student's features (train.probe_lr {}); add --set train.probe_lr=0 (the end-of-run \
             linear probe and k-NN read the teacher)",
            self.train.probe_lr
        );
        self.check_patches()
    }

    /// A ViT cuts its inputs into patches: the images (and multi-crop's local views) must be a
    /// whole number of them across, or the first step fails. (The mixture's points are no
    /// images: the encoder refuses them by shape.)
    fn check_patches(&self) -> Result<()> {
        if !self.data.name.is_images() {
            return Ok(());
        }
        let Some(patch) = self.model.vit_config(self.data.size).map(|v| v.patch_size) else {
            return Ok(());
        };
        let (size, encoder) = (self.data.size, &self.model.encoder);
        ensure!(
            size.is_multiple_of(patch),
            "model.encoder {encoder} cuts images into {patch}×{patch} patches, so data.size must be \
             a multiple of {patch}, got {size} (e.g. --size {})",
            (size / patch).max(1) * patch
        );
        let local = self.train.local_side(size);
        ensure!(
            self.train.local_views == 0 || local.is_multiple_of(patch),
            "model.encoder {encoder} cuts images into {patch}×{patch} patches, so the local views' \
             side must be a multiple of {patch}, got {local}{}; set train.local_size (DINO: 96 at 224)",
            match self.train.local_size {
                0 => format!(" (train.local_size 0: ⌈{size}·96/224⌉)"),
                _ => String::new(),
            }
        );
        Ok(())
    }
}

/// Most CPU threads per core a run starts (`train.threads`, `--threads`): more only adds
/// contention.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// `requested` CPU threads (0: all cores), capped at [`MAX_THREADS_PER_CORE`] per core with a
/// warning on stderr (once per process: a grid resolves many configurations).
pub fn capped_threads(requested: usize) -> usize {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = MAX_THREADS_PER_CORE * cores;
    if requested <= cap {
        return requested;
    }
    if WARNED.swap(true, Ordering::Relaxed) {
        return cap;
    }
    eprintln!(
        "warning: {requested} threads asked for (train.threads / --threads) on {cores} cores; \
         using {cap} ({MAX_THREADS_PER_CORE} per core)"
    );
    cap
}

/// Starts this process's CPU work on `threads` threads ([`capped_threads`]; 0: all cores):
/// Candle's kernels read `RAYON_NUM_THREADS`, our own ops use rayon's global pool, which is
/// built once per process, so a later call changes Candle's count only.
pub fn use_threads(threads: usize) {
    let threads = capped_threads(threads);
    if threads > 0 {
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
}

/// Largest config file [`read_config_text`] reads: recipes and grids are a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of a configuration file (recipe, grid, generalisation recipe), refused beyond
/// [`MAX_CONFIG_BYTES`].
pub fn read_config_text(path: &Path) -> Result<String> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read config file {} as UTF-8 text", path.display()))?;
    ensure!(
        text.len() as u64 <= MAX_CONFIG_BYTES,
        "config file {} is larger than {} MiB; a recipe is a few KiB of YAML (is it the right file?)",
        path.display(),
        MAX_CONFIG_BYTES >> 20
    );
    Ok(text)
}

/// `Ok` when `value` is finite and in `range`; else an error naming `key`, the value, the range
/// (`shown`, e.g. `[0, 1)`) and `hint` (the paper's default, …).
fn in_range(
    key: &str,
    value: f64,
    range: impl std::ops::RangeBounds<f64>,
    shown: &str,
    hint: &str,
) -> Result<()> {
    ensure!(
        value.is_finite() && range.contains(&value),
        "{key} must be {shown}{hint}, got {value}"
    );
    Ok(())
}

/// `Ok` when `value` is finite and > 0; else an error naming `key` and `hint`.
fn positive(key: &str, value: f64, hint: &str) -> Result<()> {
    in_range(key, value, (Excluded(0.0), Unbounded), "> 0", hint)
}

/// `Ok` when `value` ≥ 1; else an error naming `key` and `hint`.
fn at_least_one(key: &str, value: usize, hint: &str) -> Result<()> {
    ensure!(value >= 1, "{key} must be ≥ 1{hint}, got {value}");
    Ok(())
}
