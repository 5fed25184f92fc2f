//! Atomic checkpoint files: safetensors weights and optimiser state plus a small JSON state.
//!
//! Every file is written to `NAME.tmp` in the same directory and renamed over `NAME`, so a crash
//! leaves either the previous checkpoint or the new one, never a half-written file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

/// Model weights (encoder, projector, objective state, teacher, probe).
pub const MODEL: &str = "model.safetensors";
/// Optimiser moments.
pub const OPTIMIZER: &str = "optimizer.safetensors";
/// Where training stands.
pub const STATE: &str = "trainer_state.json";

/// Progress saved beside the weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainerState {
    /// Epochs completed.
    pub epochs_done: usize,
    /// Optimiser steps taken.
    pub step: usize,
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} into place", path.display()))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Saves tensors as safetensors atomically.
pub fn save_tensors(path: &Path, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let tmp = tmp_path(path);
    candle_core::safetensors::save(tensors, &tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} into place", path.display()))
}

/// Loads a safetensors file onto the CPU, with an error that says which file is bad.
pub fn load_tensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    if !path.exists() {
        anyhow::bail!("checkpoint file {} does not exist", path.display());
    }
    candle_core::safetensors::load(path, &Device::Cpu).with_context(|| {
        format!(
            "{} is not a readable safetensors file (corrupt or truncated); re-run training or point at another checkpoint",
            path.display()
        )
    })
}

/// Saves the whole checkpoint into `dir`.
pub fn save(
    dir: &Path,
    model: &HashMap<String, Tensor>,
    optimizer: &HashMap<String, Tensor>,
    state: &TrainerState,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    save_tensors(&dir.join(MODEL), model)?;
    save_tensors(&dir.join(OPTIMIZER), optimizer)?;
    // The state file goes last: it is what marks the checkpoint as complete.
    write_atomic(
        &dir.join(STATE),
        serde_json::to_string_pretty(state)?.as_bytes(),
    )
}

/// Reads the trainer state of a checkpoint directory.
pub fn load_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("no checkpoint to resume: cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is corrupt", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corrupt_file_error() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let mut m = HashMap::new();
        m.insert("w".to_string(), Tensor::new(&[1f32, 2.0], &Device::Cpu)?);
        save(
            dir.path(),
            &m,
            &HashMap::new(),
            &TrainerState {
                epochs_done: 3,
                step: 30,
            },
        )?;
        assert_eq!(load_state(dir.path())?.step, 30);
        assert_eq!(
            load_tensors(&dir.path().join(MODEL))?["w"].to_vec1::<f32>()?,
            vec![1.0, 2.0]
        );
        assert!(!dir.path().join("model.safetensors.tmp").exists());
        std::fs::write(dir.path().join(MODEL), b"garbage")?;
        let err = format!("{:#}", load_tensors(&dir.path().join(MODEL)).unwrap_err());
        assert!(err.contains("corrupt or truncated"), "{err}");
        let err = format!(
            "{:#}",
            load_tensors(&dir.path().join("missing.safetensors")).unwrap_err()
        );
        assert!(err.contains("does not exist"), "{err}");
        Ok(())
    }
}
