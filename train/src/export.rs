//! The encoder alone, for use anywhere: `ssl export RUN_DIR`.
//!
//! A run's checkpoint holds the encoder, projector, objective state, probe and optimiser. The
//! export keeps the encoder's tensors (buffers included: batch-norm running statistics) with the
//! `encoder.` prefix removed and batch norm's `num_batches_tracked` added, so the keys are the
//! PyTorch state-dict keys of the encoder module (`conv1.weight`, `bn1.running_mean`, …) and
//! `torch.nn.Module.load_state_dict` (strict) or Candle's `VarBuilder` read them directly. The
//! safetensors header's metadata records the architecture, objective, data set and source commit.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Tensor;

use crate::config::RunConfig;
use crate::{atomic, checkpoint};
use ssl_core::ParamStore;

/// Prefix of the encoder's tensors in a run's checkpoint.
pub const ENCODER_PREFIX: &str = "encoder.";
/// File name of an exported encoder.
pub const EXPORTED: &str = "model.safetensors";

/// What [`export_encoder`] wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The safetensors file.
    pub path: PathBuf,
    /// Tensor names, sorted.
    pub keys: Vec<String>,
    /// The header metadata.
    pub metadata: BTreeMap<String, String>,
}

/// The metadata an export carries: `format` (`pt`, as PyTorch-converted files say), the
/// encoder's `architecture`, the `objective`, the `dataset` and the source `commit`.
pub fn metadata(cfg: &RunConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".into(), "pt".into()),
        ("library".into(), "candle-ssl".into()),
        ("architecture".into(), cfg.model.encoder.clone()),
        ("objective".into(), cfg.objective.name.clone()),
        ("dataset".into(), cfg.data.name.clone()),
        ("commit".into(), env!("SSL_GIT_COMMIT").into()),
    ])
}

/// Writes the encoder of the run in `run_dir` to `out` (atomically: a temporary file, then a
/// rename).
pub fn export_encoder(run_dir: &Path, out: &Path) -> Result<Exported> {
    let cfg = RunConfig::load_run(run_dir)?;
    let weights = run_dir.join("checkpoint").join(checkpoint::MODEL);
    let tensors = checkpoint::load_tensors(&weights)?;
    let mut encoder: BTreeMap<String, Tensor> = tensors
        .into_iter()
        .filter_map(|(name, t)| Some((name.strip_prefix(ENCODER_PREFIX)?.to_string(), t)))
        .collect();
    // PyTorch's batch norm also keeps `num_batches_tracked` (an int64 scalar; it only matters
    // with momentum None), and a strict `load_state_dict` wants it: the train-mode forwards the
    // layer saw, one per view per step.
    let state = checkpoint::load_state(&run_dir.join("checkpoint"))?;
    let forwards = (state.step * cfg.train.views) as i64;
    let batch_norms: Vec<String> = encoder
        .keys()
        .filter_map(|k| k.strip_suffix(".running_mean").map(str::to_string))
        .collect();
    for layer in batch_norms {
        encoder
            .entry(format!("{layer}.num_batches_tracked"))
            .or_insert(Tensor::new(forwards, &candle_core::Device::Cpu)?);
    }
    anyhow::ensure!(
        !encoder.is_empty(),
        "{} holds no `{ENCODER_PREFIX}*` tensors; is it a candle-ssl run checkpoint?",
        weights.display()
    );
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let metadata = metadata(&cfg);
    let bytes = safetensors::serialize(
        encoder.iter().map(|(k, t)| (k.as_str(), t)),
        Some(metadata.clone().into_iter().collect()),
    )
    .with_context(|| format!("cannot serialise the encoder for {}", out.display()))?;
    atomic::write(out, &bytes)?;
    Ok(Exported {
        path: out.to_path_buf(),
        keys: encoder.into_keys().collect(),
        metadata,
    })
}

/// Loads encoder weights into the `encoder.*` variables of `store`: a run checkpoint (keys
/// `encoder.*`, other tensors ignored) or an export (keys without the prefix). Every encoder tensor
/// of the model must be present with its shape.
pub fn load_encoder(store: &ParamStore, tensors: &HashMap<String, Tensor>) -> Result<()> {
    let exported = !tensors.keys().any(|k| k.starts_with(ENCODER_PREFIX));
    for (name, var) in store.vars_with_prefix(ENCODER_PREFIX) {
        let key = &name[ENCODER_PREFIX.len()..];
        let source = if exported { key } else { name.as_str() };
        let t = tensors.get(source).with_context(|| {
            format!("the weights lack `{source}`: they were written for another encoder")
        })?;
        assign(&var, t, source)?;
    }
    Ok(())
}

/// Sets `var` to the stored tensor `t` (named `name` in the errors), which must have its shape;
/// converted to the variable's dtype and device.
pub fn assign(var: &candle_core::Var, t: &Tensor, name: &str) -> Result<()> {
    anyhow::ensure!(
        t.shape() == var.shape(),
        "weights `{name}` have shape {:?}, the model expects {:?}",
        t.dims(),
        var.dims()
    );
    var.set(&t.to_dtype(var.dtype())?.to_device(var.device())?)?;
    Ok(())
}
