//! `candle_ssl.load`: a trained encoder, from a run directory, a pulled repository or
//! `hf://user/repo`, to embed NumPy samples and export PyTorch-keyed weights.
//!
//! The network is built for the sample shape of the first `embed` call (a run's directory
//! records its settings, not its images' channels and side), and again for another shape.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Result};
use numpy::PyArrayDyn;
use pyo3::prelude::*;
use ssl_train::TrainedEncoder;

use crate::arrays;
use crate::errors::IntoPy;
use crate::pools;

/// A trained encoder (see the module docs).
#[pyclass(frozen, module = "candle_ssl._native")]
pub struct Encoder {
    dir: PathBuf,
    /// The network built for each sample shape met so far.
    built: Mutex<HashMap<Vec<usize>, TrainedEncoder>>,
}

#[pymethods]
impl Encoder {
    /// The encoder of `source`: a run directory (its last checkpoint), its `checkpoint/`
    /// directory, a directory holding `config.yaml` and an exported `model.safetensors`, or
    /// `hf://user/repo[@revision]` (downloaded into the Hugging Face cache first).
    #[staticmethod]
    fn load(py: Python<'_>, source: &str) -> PyResult<Self> {
        let dir = pools::run(py, || run_dir(source)).or_value()?;
        Ok(Self {
            dir,
            built: Mutex::default(),
        })
    }

    /// The directory the weights are read from.
    #[getter]
    fn dir(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// Features `[N, F]` (float32) of `x` (`[N, C, H, W]` or `[N, C, D, H, W]`, uint8 read as
    /// v/255 or float32 in `[0, 1]`), normalised as the run's evaluation normalised its inputs,
    /// in evaluation mode, `batch_size` samples at a time.
    #[pyo3(signature = (x, batch_size = 256))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        x: &Bound<'py, PyAny>,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let samples = arrays::samples(x, "x").or_value()?;
        if batch_size == 0 {
            return Err(crate::errors::value(anyhow::anyhow!(
                "batch_size must be at least 1"
            )));
        }
        let (features, width) = pools::run(py, || {
            let mut built = self.built.lock().expect("no embed panics holding it");
            let encoder = match built.entry(samples.shape.clone()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(TrainedEncoder::load(&self.dir, &samples.shape)?)
                }
            };
            let sample_len: usize = samples.shape.iter().product();
            let mut features = Vec::new();
            for chunk in samples.values.chunks(sample_len * batch_size) {
                features.extend(encoder.embed(chunk)?.flatten_all()?.to_vec1::<f32>()?);
            }
            Ok((features, encoder.output_dim()))
        })
        .or_runtime()?;
        arrays::to_numpy(py, features, &[samples.count, width]).or_runtime()
    }

    /// Writes the encoder's weights to `path` as safetensors with PyTorch state-dict keys (as
    /// `ssl export`), atomically; returns the path.
    fn export(&self, py: Python<'_>, path: PathBuf) -> PyResult<String> {
        let exported = pools::run(py, || {
            if !self.dir.join("checkpoint").exists() {
                bail!(
                    "{} holds an exported encoder already ({}); copy that file",
                    self.dir.display(),
                    self.dir.join(ssl_train::export::EXPORTED).display()
                );
            }
            ssl_train::export::export_encoder(&self.dir, &path)
        })
        .or_runtime()?;
        Ok(exported.path.to_string_lossy().into_owned())
    }

    fn __repr__(&self) -> String {
        format!("Encoder({:?})", self.dir)
    }
}

/// The directory of `source` that holds `config.yaml`.
fn run_dir(source: &str) -> Result<PathBuf> {
    if source.starts_with("hf://") {
        let Some((repo, revision)) = ssl_net::hub::parse_hf_path(source) else {
            bail!("{source}: expected hf://user/repo[@revision]");
        };
        let options = ssl_net::hub::HubOptions {
            revision: revision.unwrap_or_else(|| "main".into()),
            ..Default::default()
        };
        return ssl_hub::publish::pull(&repo, &options);
    }
    let path = Path::new(source);
    if !path.exists() {
        bail!(
            "{source} does not exist; give a run directory (e.g. runs/latest), its checkpoint \
             directory, or hf://user/repo"
        );
    }
    let dir = match path.ends_with("checkpoint") {
        true => path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        false => path.to_path_buf(),
    };
    if !dir.join("config.yaml").exists() {
        bail!(
            "{} has no config.yaml: give a run directory written by `ssl run` or \
             `candle_ssl.train`, or a pulled repository",
            dir.display()
        );
    }
    Ok(dir)
}
