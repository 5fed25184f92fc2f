//! The encoder alone, for use anywhere: `ssl export RUN_DIR`.
//!
//! A run's checkpoint holds the encoder, projector, objective state, probe and optimiser. The
//! export keeps the encoder's tensors (buffers included: batch-norm running statistics) with the
//! `encoder.` prefix removed and batch norm's `num_batches_tracked` added, so the keys are the
//! PyTorch state-dict keys of the encoder module (`conv1.weight`, `bn1.running_mean`, …) and
//! `torch.nn.Module.load_state_dict` (strict) or Candle's `VarBuilder` read them directly. The
//! safetensors header's metadata records the architecture, objective, data set and source commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Tensor;

use crate::checkpoint;
use crate::config::{EvaluatedEncoder, RunConfig};
use ssl_core::ParamStore;

/// Prefix of the encoder's tensors in a run's checkpoint.
pub const ENCODER_PREFIX: &str = EvaluatedEncoder::Student.prefix();
/// Prefix of the EMA teacher's encoder tensors in a run's checkpoint.
pub const TEACHER_PREFIX: &str = EvaluatedEncoder::Teacher.prefix();
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
/// encoder's `architecture`, the `objective`, the `network` whose weights these are (`student`
/// or the EMA `teacher`, as `eval.encoder` says), the `dataset` and the source `commit`.
pub fn metadata(cfg: &RunConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".into(), "pt".into()),
        ("library".into(), "candle-ssl".into()),
        ("architecture".into(), cfg.model.encoder.clone()),
        ("objective".into(), cfg.objective.name.clone()),
        ("network".into(), cfg.eval.encoder.name().into()),
        ("dataset".into(), cfg.data.name.to_string()),
        ("commit".into(), env!("SSL_GIT_COMMIT").into()),
    ])
}

/// Writes the encoder of the run in `run_dir` to `out` (atomically: a temporary file, then a
/// rename).
pub fn export_encoder(run_dir: &Path, out: &Path) -> Result<Exported> {
    let cfg = RunConfig::load_run(run_dir)?;
    let weights = run_dir.join("checkpoint").join(checkpoint::MODEL);
    let tensors = checkpoint::load_tensors(&weights)?;
    let prefix = cfg.eval.encoder.prefix();
    let mut encoder: BTreeMap<String, Tensor> = tensors
        .into_iter()
        .filter_map(|(name, t)| Some((name.strip_prefix(prefix)?.to_string(), t)))
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
        "{} holds no `{prefix}*` tensors; is it a candle-ssl run checkpoint?",
        weights.display()
    );
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let metadata = metadata(&cfg);
    checkpoint::write_safetensors(out, &encoder, Some(metadata.clone().into_iter().collect()))?;
    Ok(Exported {
        path: out.to_path_buf(),
        keys: encoder.into_keys().collect(),
        metadata,
    })
}

/// Loads encoder weights into every encoder of `store`: the student's `encoder.*` variables
/// and, where the objective keeps one, the EMA teacher's `teacher.encoder.*`. From a run
/// checkpoint (keys `encoder.*`, other tensors ignored) each from its own keys; weights that hold
/// one encoder (an export, whose keys have no prefix, or a checkpoint without a teacher) set both.
/// Every encoder tensor of the model must be present with its shape. Returns the keys read.
pub fn load_encoder(
    store: &ParamStore,
    tensors: &HashMap<String, Tensor>,
) -> Result<BTreeSet<String>> {
    let exported = !tensors.keys().any(|k| k.starts_with(ENCODER_PREFIX));
    let with_teacher = tensors.keys().any(|k| k.starts_with(TEACHER_PREFIX));
    let encoders = [ENCODER_PREFIX, TEACHER_PREFIX]
        .into_iter()
        .flat_map(|prefix| {
            store
                .vars_with_prefix(prefix)
                .into_iter()
                .map(move |v| (prefix, v))
        });
    let mut read = BTreeSet::new();
    for (prefix, (name, var)) in encoders {
        let key = &name[prefix.len()..];
        let source = match (exported, prefix == TEACHER_PREFIX && with_teacher) {
            (_, true) => name.clone(),
            (true, false) => key.to_string(),
            (false, false) => format!("{ENCODER_PREFIX}{key}"),
        };
        let t = tensors.get(&source).with_context(|| {
            format!("the weights lack `{source}`: they were written for another encoder")
        })?;
        assign(&var, t, &source)?;
        read.insert(source);
    }
    Ok(read)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunConfig, Start, TrainedEncoder, Trainer};
    use candle_core::Device;

    fn tensor(values: &[f32]) -> Tensor {
        Tensor::new(values, &Device::Cpu).unwrap()
    }

    /// A store with a student `encoder.w` and a teacher `teacher.encoder.w`.
    fn student_and_teacher() -> ParamStore {
        let store = ParamStore::new(0);
        let vb = store.var_builder(&Device::Cpu);
        for prefix in ["encoder", "teacher.encoder"] {
            vb.pp(prefix).get(2, "w").unwrap();
        }
        store
    }

    fn value(store: &ParamStore, name: &str) -> Vec<f32> {
        let vars = store.vars_with_prefix(name);
        vars[0].1.as_tensor().to_vec1().unwrap()
    }

    /// A checkpoint with a teacher sets each encoder from its own keys; one without, or an
    /// export (keys without a prefix), sets both from its one encoder; a missing key is named.
    #[test]
    fn every_encoder_of_the_store_is_loaded_from_its_own_keys_or_the_one_encoder() {
        let store = student_and_teacher();
        let both = HashMap::from([
            ("encoder.w".to_string(), tensor(&[1., 2.])),
            ("teacher.encoder.w".to_string(), tensor(&[3., 4.])),
        ]);
        load_encoder(&store, &both).unwrap();
        assert_eq!(value(&store, "encoder.w"), [1., 2.]);
        assert_eq!(value(&store, "teacher.encoder.w"), [3., 4.]);
        let one_encoder = [
            HashMap::from([("encoder.w".to_string(), tensor(&[5., 6.]))]),
            HashMap::from([("w".to_string(), tensor(&[5., 6.]))]),
        ];
        for tensors in one_encoder {
            load_encoder(&store, &tensors).unwrap();
            assert_eq!(value(&store, "encoder.w"), [5., 6.]);
            assert_eq!(value(&store, "teacher.encoder.w"), [5., 6.]);
        }
        let other = HashMap::from([("v".to_string(), tensor(&[0., 0.]))]);
        let e = load_encoder(&store, &other).unwrap_err().to_string();
        assert!(e.contains("lack `w`"), "{e}");
    }

    /// `eval.encoder: teacher` on BYOL: the run's table, `TrainedEncoder` and the export read
    /// the EMA teacher's weights (`teacher.encoder.*` of the checkpoint), which one epoch has
    /// moved apart from the student's; the export says so in its metadata.
    #[test]
    fn a_run_that_evaluates_its_teacher_embeds_and_exports_the_teacher() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RunConfig::builder()
            .objective("byol")
            .epochs(1)
            .set("eval.encoder", "teacher")
            .set("train.probe_lr", 0.0)
            .out(dir.path())
            .build()
            .unwrap();
        let outcome = Trainer::new(cfg.clone())
            .start(Start::Overwrite)
            .fit()
            .unwrap();
        let checkpoint =
            checkpoint::load_tensors(&outcome.dir.join("checkpoint").join(checkpoint::MODEL))
                .unwrap();
        let exported =
            export_encoder(&outcome.dir, &dir.path().join("teacher.safetensors")).unwrap();
        assert_eq!(exported.metadata["network"], "teacher");
        let weights = checkpoint::load_tensors(&exported.path).unwrap();
        let max_diff = |a: &Tensor, b: &Tensor| {
            (a - b)
                .and_then(|d| d.abs()?.max_all()?.to_scalar::<f32>())
                .unwrap()
        };
        let mut moved = 0f32;
        for (name, t) in &checkpoint {
            let Some(key) = name.strip_prefix(TEACHER_PREFIX) else {
                continue;
            };
            assert_eq!(max_diff(&weights[key], t), 0.0, "{key}");
            moved = moved.max(max_diff(&checkpoint[&format!("{ENCODER_PREFIX}{key}")], t));
        }
        assert!(moved > 1e-4, "the teacher is the student: {moved}");

        // The teacher's features: the export loaded into a model that evaluates its student.
        let data = crate::setup::data(&cfg).unwrap();
        let shape = data.dataset.shape.clone();
        let len: usize = shape.iter().product();
        let ssl_data::Samples::F32(images) = &data.dataset.samples else {
            panic!("the digits are stored as f32 values");
        };
        let raw = &images[..16 * len];
        let teacher = TrainedEncoder::load(&outcome.dir, &shape)
            .unwrap()
            .embed(raw)
            .unwrap();
        let mut normalised = raw.to_vec();
        normalised
            .chunks_mut(len)
            .for_each(|s| cfg.data.normalization().apply(s, shape[0]));
        let x = Tensor::from_vec(normalised, [&[16][..], &shape].concat(), &Device::Cpu).unwrap();
        let features = |weights: &HashMap<String, Tensor>| {
            let mut student = cfg.clone();
            student.eval.encoder = crate::config::EvaluatedEncoder::Student;
            let model = crate::model::build_model(&student, &data, &Device::Cpu).unwrap();
            load_encoder(&model.store, weights).unwrap();
            model.features(&x).unwrap()
        };
        assert_eq!(max_diff(&teacher, &features(&weights)), 0.0);
        let student: HashMap<String, Tensor> = checkpoint
            .into_iter()
            .filter(|(name, _)| name.starts_with(ENCODER_PREFIX))
            .collect();
        assert!(max_diff(&teacher, &features(&student)) > 1e-4);
    }
}
