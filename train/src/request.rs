//! A run as asked for — a recipe, assignments to its keys, typed flags, and how to open the run
//! directory — resolved into the checked [`RunConfig`] it trains with. `ssl run` and the Python
//! package ask through this one door, so a key, a flag and their errors mean the same in both.
//!
//! The layers, lowest first: the defaults, the recipe (`--config`, or a resumed run's recorded
//! configuration), the assignments (`--set key=value`, or Python's `key=value` settings) in
//! order, then the flags. A flag and an assignment that give one key different values are an
//! error, not an order to guess.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_yaml::Value;

use crate::config::{apply_set, set_key, RunConfig, TrainConfig};
use crate::rundir::{self, Start};

/// One assignment to a dotted key.
#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// `key=value`, the value read as YAML (`--set train.lr=0.01`).
    Text(String),
    /// A key and its value as given (Python's `train__lr=0.01`), never re-read.
    Value { key: String, value: Value },
}

/// The flags of `ssl run` that set one key each, with the types they were parsed to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags {
    /// `objective.name`.
    pub objective: Option<String>,
    /// `data.name`, or a MedMNIST-layout `.npz` file, which also sets `data.root` and
    /// `data.size` ([`DataFile`]).
    pub data: Option<String>,
    pub root: Option<PathBuf>,
    pub size: Option<usize>,
    pub epochs: Option<usize>,
    pub batch_size: Option<usize>,
    pub views: Option<usize>,
    pub encoder: Option<String>,
    pub init: Option<String>,
    pub local_views: Option<usize>,
    pub seed: Option<u64>,
    pub out: Option<PathBuf>,
    pub device: Option<String>,
    pub threads: Option<usize>,
}

/// What a run asks for; see the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRequest {
    /// A YAML recipe (`configs/`).
    pub config: Option<PathBuf>,
    pub set: Vec<Assignment>,
    pub flags: Flags,
    /// Continue the run in `flags.out` (default `runs/latest`) from its last checkpoint.
    pub resume: bool,
    /// Replace the run already in `flags.out`.
    pub overwrite: bool,
    /// With `resume`: keys (or sections) allowed to differ from the recorded configuration.
    pub allow_changed: Vec<String>,
}

impl RunRequest {
    /// The configuration to train with, and how to open the run directory. A resume starts
    /// from the run's recorded configuration (unless `config` names one) and is held against it
    /// ([`rundir::check_resume`]).
    pub fn config_and_start(&self) -> Result<(RunConfig, Start)> {
        if !self.resume {
            let start = match self.overwrite {
                true => Start::Overwrite,
                false => Start::Fresh,
            };
            return Ok((self.resolve(None)?, start));
        }
        let dir = rundir::resume_target(self.flags.out.as_deref())?;
        let recorded = RunConfig::load_run(&dir)?;
        let state = crate::checkpoint::load_state(&dir.join("checkpoint")).with_context(|| {
            format!(
                "{} has no checkpoint to resume from yet; start it again with --out {} \
                 --overwrite",
                dir.display(),
                dir.display()
            )
        })?;
        // `train.stop_after_epochs` counts the epochs of one invocation: it is not carried over.
        let base = match self.config {
            Some(_) => None,
            None => Some(serde_yaml::to_value(RunConfig {
                train: TrainConfig {
                    stop_after_epochs: 0,
                    ..recorded.train.clone()
                },
                ..recorded.clone()
            })?),
        };
        let mut requested = self.resolve(base)?;
        requested.out = dir;
        let cfg = rundir::check_resume(&recorded, &requested, &self.allow_changed, state.step)?;
        Ok((cfg, Start::Resume))
    }

    /// `base` (else the defaults ← `config`) ← the assignments ← the flags, then validation and
    /// the objective's lookup.
    pub fn resolve(&self, base: Option<Value>) -> Result<RunConfig> {
        let mut root = match (base, &self.config) {
            (Some(base), _) => base,
            (None, Some(path)) => RunConfig::from_file(path)?,
            (None, None) => Value::Mapping(Default::default()),
        };
        let mut assigned = Value::Mapping(Default::default());
        for assignment in &self.set {
            for tree in [&mut root, &mut assigned] {
                match assignment {
                    Assignment::Text(text) => apply_set(tree, text)?,
                    Assignment::Value { key, value } => {
                        let shown = format!("{key}={}", yaml_line(value));
                        set_key(tree, key, value.clone(), &shown)?;
                    }
                }
            }
        }
        for (flag, key, value) in self.flags.assignments()? {
            let Some(v) = value else { continue };
            let shown = format!("{flag} {}", yaml_line(&v));
            if let Some(by_set) = lookup(&assigned, key) {
                if *by_set != v {
                    bail!(
                        "{flag} and --set {key} give {key} different values ({} and {}); keep \
                         one",
                        yaml_line(&v),
                        yaml_line(by_set)
                    );
                }
            }
            set_key(&mut root, key, v, &shown)?;
        }
        let cfg = RunConfig::from_yaml_value(root).context(match &self.config {
            Some(p) => format!("invalid configuration in {}", p.display()),
            None => "invalid configuration".to_string(),
        })?;
        ssl_core::find(&cfg.objective.name)?;
        Ok(cfg)
    }
}

impl Flags {
    /// Each flag, the key it sets and its value (`None` when not given), each value the type
    /// it was parsed to, never re-read as YAML.
    fn assignments(&self) -> Result<[(&'static str, &'static str, Option<Value>); 14]> {
        let data_file = self
            .data
            .as_deref()
            .map(DataFile::of)
            .transpose()?
            .flatten();
        let data = match &data_file {
            Some(file) => Some(file.flag.clone()),
            None => self.data.clone(),
        };
        let text = |v: &str| Value::String(v.to_string());
        let path = |p: &Path| text(&p.to_string_lossy());
        let number = |v: usize| Value::Number(v.into());
        let root_dir = match (&self.root, &data_file) {
            (Some(root), Some(file)) => bail!(
                "--data {} is a file, which names its directory; drop --root {}",
                file.path.display(),
                root.display()
            ),
            (Some(dir), None) => Some(path(dir)),
            (None, Some(file)) => Some(path(&file.path)),
            (None, None) => None,
        };
        let size = match (self.size, &data_file) {
            (Some(given), Some(file)) if given != file.size => bail!(
                "--size {given} disagrees with --data {}, a {}-pixel file; drop --size",
                file.path.display(),
                file.size
            ),
            (given, file) => given.or(file.as_ref().map(|f| f.size)),
        };
        Ok([
            (
                "--objective",
                "objective.name",
                self.objective.as_deref().map(text),
            ),
            ("--data", "data.name", data.as_deref().map(text)),
            ("--root", "data.root", root_dir),
            ("--size", "data.size", size.map(number)),
            ("--epochs", "train.epochs", self.epochs.map(number)),
            (
                "--batch-size",
                "train.batch_size",
                self.batch_size.map(number),
            ),
            ("--views", "train.views", self.views.map(number)),
            (
                "--encoder",
                "model.encoder",
                self.encoder.as_deref().map(text),
            ),
            ("--init", "model.init", self.init.as_deref().map(text)),
            (
                "--local-views",
                "train.local_views",
                self.local_views.map(number),
            ),
            (
                "--seed",
                "train.seed",
                self.seed.map(|v| Value::Number(v.into())),
            ),
            ("--out", "out", self.out.as_deref().map(path)),
            ("--device", "train.device", self.device.as_deref().map(text)),
            ("--threads", "train.threads", self.threads.map(number)),
        ])
    }
}

/// The node at dotted `key` of a YAML tree, if there is one.
fn lookup<'v>(root: &'v Value, key: &str) -> Option<&'v Value> {
    key.split('.').try_fold(root, |node, part| node.get(part))
}

/// A YAML value on one line.
fn yaml_line(v: &Value) -> String {
    serde_yaml::to_string(v)
        .map(|s| s.trim().replace('\n', " "))
        .unwrap_or_default()
}

/// A MedMNIST-layout file that `--data` names by path: an official one (its flag and size read
/// off the name `FLAG.npz` (28 px) or `FLAG_SIZE.npz`, checked against the published table), or
/// one of your own (any other name: data set `npz`, its side read from the file).
struct DataFile {
    path: PathBuf,
    /// The MedMNIST flag, or `npz`.
    flag: String,
    size: usize,
}

impl DataFile {
    /// `Some` when `data` is a path to a `.npz` file (not a data set's name); an error when
    /// such a file is missing, or named like an official file at a size it is not published
    /// at.
    fn of(data: &str) -> Result<Option<Self>> {
        let path = Path::new(data);
        if path.extension().is_none_or(|e| e != "npz") {
            return Ok(None);
        }
        if !path.is_file() {
            bail!(
                "--data {data}: no such file; give a .npz file in MedMNIST's layout (e.g. \
                 ~/.medmnist/bloodmnist_64.npz, fetched with `ssl data download bloodmnist \
                 --size 64`, or one of your own) or a data set name"
            );
        }
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let (flag, size) = match stem.rsplit_once('_') {
            Some((flag, size)) => match size.parse::<usize>() {
                Ok(size) => (flag.to_string(), size),
                Err(_) => (stem.to_string(), 28),
            },
            None => (stem.to_string(), 28),
        };
        let Ok(info) = ssl_data::medmnist_info(&flag) else {
            let (size, _) = ssl_data::npz_geometry(path).with_context(|| {
                format!("--data {data}: not an official MedMNIST name, read as a file of your own")
            })?;
            return Ok(Some(Self {
                path: path.to_path_buf(),
                flag: ssl_data::DataSource::Npz.as_str().into(),
                size,
            }));
        };
        info.md5_at(size).with_context(|| {
            format!(
                "--data {data}: {} has no {size}-pixel files (for a file of your own in \
                 MedMNIST's layout, use --data npz --root FILE)",
                info.flag
            )
        })?;
        Ok(Some(Self {
            path: path.to_path_buf(),
            flag: info.flag.to_string(),
            size,
        }))
    }
}
