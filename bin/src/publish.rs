//! `ssl push`: a run staged as a Hub model repository — the exported encoder, the resolved
//! config, the evaluation and a generated model card — then uploaded in one commit.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::card::{model_card, Results};
use crate::checkpoint::write_atomic;
use crate::config::RunConfig;
use crate::export::{export_encoder, EXPORTED};
use crate::hub::{self, HubOptions};

/// The files of a staged repository.
pub const FILES: [&str; 4] = [EXPORTED, "config.yaml", "eval.json", "README.md"];

/// Writes the repository for `repo` into `RUN_DIR/hub/` and returns that directory.
pub fn stage(run_dir: &Path, repo: &str) -> Result<PathBuf> {
    let cfg = RunConfig::load_run(run_dir)?;
    let results_path = run_dir.join("results.json");
    let results_text = std::fs::read_to_string(&results_path).with_context(|| {
        format!(
            "{} is missing: the run has not finished its evaluation (resume it with `ssl run --resume ...`)",
            results_path.display()
        )
    })?;
    let results: Results = serde_json::from_str(&results_text).with_context(|| {
        format!(
            "{} is not a candle-ssl results file",
            results_path.display()
        )
    })?;
    let dir = run_dir.join("hub");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let exported = export_encoder(run_dir, &dir.join(EXPORTED))?;
    let weights = crate::checkpoint::load_tensors(&exported.path)?;
    let mut sorted: Vec<_> = weights.into_iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    write_atomic(
        &dir.join("config.yaml"),
        serde_yaml::to_string(&cfg)?.as_bytes(),
    )?;
    write_atomic(&dir.join("eval.json"), results_text.as_bytes())?;
    let card = model_card(repo, &cfg, &results, &sorted);
    write_atomic(&dir.join("README.md"), card.as_bytes())?;
    Ok(dir)
}

/// Stages the run and uploads it to `repo`; returns the commit reference.
pub fn push(run_dir: &Path, repo: &str, opts: &HubOptions) -> Result<String> {
    let dir = stage(run_dir, repo)?;
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
