//! `ssl push`: a run staged as a Hub model repository — the exported encoder, the recipe without
//! local paths, the offline evaluation and a generated model card — then uploaded in one commit.
//!
//! The evaluation file, `eval.json`, is what `ssl eval RUN` writes (an [`offline::Report`]),
//! computed by staging on the run's checkpoint with `ssl eval`'s default metrics (plus the
//! hierarchical Rand index for digits, as `ssl eval` adds it), beside its `knn.csv` and
//! `pca.png`; the weights path in it is made the repository's `model.safetensors` (the same
//! encoder tensors), so that no local path is published. Features are cached beside the
//! checkpoint as `ssl eval` caches them, so staging again only re-runs the augmented-view metrics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::card::{self, model_card, Card, Split};
use ssl_core::atomic;
use ssl_data::DataSource;
use ssl_experiments::offline::{self, MetricSet, SuiteConfig};
use ssl_net::hub::{self, HubOptions};
use ssl_train::config::RunConfig;
use ssl_train::export::{export_encoder, EXPORTED};
use ssl_train::results::Results;

/// The files of a staged repository that `ssl pull` fetches.
pub const FILES: [&str; 4] = [EXPORTED, "config.yaml", "eval.json", "README.md"];

/// What to publish beside the weights.
#[derive(Debug, Clone, Default)]
pub struct StageOptions {
    /// The licence id of the weights (`--license`); `None`: the data set's.
    pub license: Option<String>,
    /// The offline evaluation; `None`: [`default_suite`].
    pub suite: Option<SuiteConfig>,
}

/// `ssl eval`'s default metrics for a run on `data`: all of them, the hierarchical Rand index
/// only for digits (whose class hierarchy is built in).
pub fn default_suite(data: DataSource) -> SuiteConfig {
    let mut suite = SuiteConfig::default();
    if data == DataSource::Digits {
        suite.metrics.push(MetricSet::Hierarchy);
    }
    suite
}

/// Writes the repository for `repo` into `RUN_DIR/hub/` and returns that directory.
pub fn stage(run_dir: &Path, repo: &str, opts: &StageOptions) -> Result<PathBuf> {
    let cfg = RunConfig::load_run(run_dir)?;
    let license = card::license(cfg.data.name, opts.license.as_deref())?;
    let results = Results::read(run_dir)?;
    let split: Split = read_json(&run_dir.join("split.json"), "split")?;
    let dir = run_dir.join("hub");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let exported = export_encoder(run_dir, &dir.join(EXPORTED))?;
    let weights: HashMap<_, _> = ssl_train::checkpoint::load_tensors(&exported.path)?;
    let (recipe, recipe_notes) = card::published_config(&cfg);
    atomic::write(
        &dir.join("config.yaml"),
        serde_yaml::to_string(&recipe)?.as_bytes(),
    )?;
    let suite = match &opts.suite {
        Some(suite) => suite.clone(),
        None => default_suite(cfg.data.name),
    };
    let source = offline::Source {
        label: format!("{} (hf://{repo})", cfg.objective.name),
        cfg: cfg.clone(),
        weights: run_dir
            .join("checkpoint")
            .join(ssl_train::checkpoint::MODEL),
        online_probe: offline::online_probe_accuracy(run_dir),
    };
    let mut report = offline::evaluate(&[source], &suite, &dir)
        .context("the offline evaluation for eval.json failed")?;
    for column in &mut report.columns {
        column.weights = PathBuf::from(EXPORTED);
    }
    atomic::write(
        &dir.join("eval.json"),
        serde_json::to_string_pretty(&report)?.as_bytes(),
    )?;
    let card = model_card(&Card {
        repo,
        cfg: &recipe,
        recipe_notes: &recipe_notes,
        license: &license,
        results: &results,
        split: &split,
        eval: &report,
        weights: &weights,
    })?;
    atomic::write(&dir.join("README.md"), card.as_bytes())?;
    Ok(dir)
}

/// `path` parsed as the run's `what` file, with errors that name it and the way out.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "{} is missing: the run has not finished (finish it with `ssl run --resume ...`)",
            path.display()
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a candle-ssl {what} file", path.display()))
}

/// Stages the run and uploads it to `repo`; returns the commit reference.
pub fn push(
    run_dir: &Path,
    repo: &str,
    stage_opts: &StageOptions,
    opts: &HubOptions,
) -> Result<String> {
    let dir = stage(run_dir, repo, stage_opts)?;
    let cfg = RunConfig::load_run(run_dir)?;
    let message = format!(
        "candle-ssl: {} encoder pretrained with {} on {}",
        cfg.model.encoder, cfg.objective.name, cfg.data.name
    );
    hub::push_folder(repo, &dir, &message, opts)
}

/// Downloads a pushed repository into the Hugging Face cache; returns its local directory.
pub fn pull(repo: &str, opts: &HubOptions) -> Result<PathBuf> {
    hub::pull(repo, &FILES, opts)
}
