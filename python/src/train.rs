//! `candle_ssl.train`: a run through the same [`RunRequest`] as `ssl run`, on a named data set,
//! a path, or images held in NumPy arrays.
//!
//! The run goes with the GIL released. Its callbacks, and a check for signals after every
//! logged step and every epoch, take the GIL back on the training thread. A callback's
//! exception stops the run at once and is raised from `train` as it was. A first Ctrl-C lets
//! the epoch in progress finish and write its checkpoint, then raises `KeyboardInterrupt`; the
//! run directory is then one that `resume=True` continues bit-exactly. A second Ctrl-C stops at
//! once, leaving the last checkpoint written (every `train.checkpoint_every` epochs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use ssl_train::request::{Assignment, Flags, RunRequest};
use ssl_train::{OwnImages, Trainer};

use crate::arrays;
use crate::errors::{self, IntoPy};
use crate::pools;

/// One logged optimiser step, as a step callback receives it.
#[pyclass(frozen, module = "candle_ssl._native")]
pub struct StepEvent {
    #[pyo3(get)]
    step: usize,
    #[pyo3(get)]
    epoch: usize,
    #[pyo3(get)]
    loss: f64,
    /// The objective's named loss terms.
    #[pyo3(get)]
    terms: HashMap<String, f64>,
    #[pyo3(get)]
    lr: f64,
    /// The online probe's cross-entropy, if there is a probe.
    #[pyo3(get)]
    probe_ce: Option<f64>,
    #[pyo3(get)]
    images_per_s: f64,
    #[pyo3(get)]
    data_wait_ms: f64,
}

#[pymethods]
impl StepEvent {
    fn __repr__(&self) -> String {
        format!(
            "StepEvent(step={}, epoch={}, loss={:.6}, lr={:.3e})",
            self.step, self.epoch, self.loss, self.lr
        )
    }
}

/// The end of an epoch, as an epoch callback receives it.
#[pyclass(frozen, module = "candle_ssl._native")]
pub struct EpochEvent {
    #[pyo3(get)]
    epoch: usize,
    #[pyo3(get)]
    steps: usize,
    #[pyo3(get)]
    knn_accuracy: Option<f64>,
    #[pyo3(get)]
    probe_accuracy: Option<f64>,
}

#[pymethods]
impl EpochEvent {
    fn __repr__(&self) -> String {
        format!(
            "EpochEvent(epoch={}, steps={}, knn_accuracy={:?}, probe_accuracy={:?})",
            self.epoch, self.steps, self.knn_accuracy, self.probe_accuracy
        )
    }
}

/// The Python exception that stopped a run, kept until the GIL is held again.
type Raised = Arc<Mutex<Option<PyErr>>>;

/// Calls `callback(event)` (if any) and checks for signals, with the GIL held. A callback's
/// exception is kept in `raised` and stops the run now. A first Ctrl-C is kept too and asks
/// the run to stop at the end of its epoch, with a checkpoint there (`stop`); a second one
/// stops it now.
fn call_back(
    raised: &Raised,
    stop: &AtomicBool,
    callback: Option<&Py<PyAny>>,
    event: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
) -> Result<()> {
    Python::attach(|py| {
        let keep = |e: PyErr| {
            let message = e.to_string();
            *raised.lock().expect("no callback panics holding it") = Some(e);
            anyhow!("stopped by Python: {message}")
        };
        // Ctrl-C shows here, or inside the callback when it came while Python code ran.
        let outcome = py.check_signals().and_then(|()| match callback {
            Some(f) => f.call1(py, (event(py)?,)).map(drop),
            None => Ok(()),
        });
        let Err(e) = outcome else {
            return Ok(());
        };
        if !e.is_instance_of::<PyKeyboardInterrupt>(py) || stop.swap(true, Ordering::SeqCst) {
            return Err(keep(e));
        }
        eprintln!(
            "\ninterrupted: stopping at the end of this epoch with a checkpoint, which \
             resume=True continues (Ctrl-C again to stop now)"
        );
        keep(e);
        Ok(())
    })
}

/// Trains; see the module docs and `candle_ssl.train`. Returns the run directory and the
/// table `ssl run` prints.
#[pyfunction]
#[pyo3(signature = (settings, data, images, labels, resume, overwrite, on_step, on_epoch, progress))]
#[allow(clippy::too_many_arguments)]
pub fn train(
    py: Python<'_>,
    settings: Vec<Bound<'_, PyTuple>>,
    data: Option<String>,
    images: Option<Bound<'_, PyAny>>,
    labels: Option<PyReadonlyArray1<'_, i64>>,
    resume: bool,
    overwrite: bool,
    on_step: Option<Py<PyAny>>,
    on_epoch: Option<Py<PyAny>>,
    progress: bool,
) -> PyResult<(String, String)> {
    // `out` is the run directory a resume continues, as `--out` is.
    let mut out = None;
    let mut set = Vec::new();
    for pair in &settings {
        let (key, value): (String, Bound<'_, PyAny>) = pair.extract()?;
        match key.as_str() {
            "out" if !value.is_none() => out = Some(value.extract::<std::path::PathBuf>()?),
            _ => {
                let value = arrays::to_yaml(&value, &key).or_value()?;
                set.push(Assignment::Value { key, value });
            }
        }
    }
    let own = match images {
        Some(images) => Some(own_images(&images, labels).or_value()?),
        None if labels.is_some() => {
            return Err(errors::value(anyhow!(
                "labels were given without images; pass the images as `data`"
            )))
        }
        None => None,
    };
    let request = RunRequest {
        set,
        flags: Flags {
            data,
            out,
            ..Flags::default()
        },
        resume,
        overwrite,
        ..RunRequest::default()
    };
    if resume && overwrite {
        return Err(errors::value(anyhow!(
            "resume=True continues the run in `out`, overwrite=True removes it: give one"
        )));
    }
    let (config, start) = request.config_and_start().or_value()?;
    // The objective's limits (views, batch size) are the configuration's: refused as such here,
    // before any data is read, as the trainer would refuse them later.
    let objective = ssl_core::find(&config.objective.name).or_value()?;
    let views = config.train.views + config.train.local_views;
    (objective.requirements(&config.objective.params, config.train.batch_size))
        .and_then(|needs| needs.check(objective.name, views, config.train.batch_size, true))
        .or_value()?;
    ssl_train::config::use_threads(config.train.threads);
    ssl_core::progress::set_visible(progress);

    let raised: Raised = Arc::default();
    let mut trainer = Trainer::new(config.clone()).start(start);
    let stop = trainer.stop_handle();
    if let Some(images) = own {
        ssl_train::setup::check_unlabelled(&config, images.unlabelled(), "images").or_value()?;
        trainer = trainer.with_data(images);
    }
    let (step_raised, step_stop) = (raised.clone(), stop.clone());
    let trainer = trainer.on_step(move |e| {
        call_back(&step_raised, &step_stop, on_step.as_ref(), |py| {
            let event = StepEvent {
                step: e.step,
                epoch: e.epoch,
                loss: e.loss,
                terms: e.terms.iter().cloned().collect(),
                lr: e.lr,
                probe_ce: e.probe_ce,
                images_per_s: e.images_per_s,
                data_wait_ms: e.data_wait_ms,
            };
            Ok(Py::new(py, event)?.into_any())
        })
    });
    let epoch_raised = raised.clone();
    let trainer = trainer.on_epoch(move |e| {
        call_back(&epoch_raised, &stop, on_epoch.as_ref(), |py| {
            let event = EpochEvent {
                epoch: e.epoch,
                steps: e.steps,
                knn_accuracy: e.knn_accuracy,
                probe_accuracy: e.probe_accuracy,
            };
            Ok(Py::new(py, event)?.into_any())
        })
    });
    let outcome = pools::run(py, || trainer.fit());
    if let Some(e) = raised.lock().expect("the run has ended").take() {
        return Err(e);
    }
    let outcome = outcome.or_runtime()?;
    Ok((
        outcome.dir.to_string_lossy().into_owned(),
        outcome.table(&config),
    ))
}

/// `images` (`[N, C, H, W]` or `[N, C, D, H, W]`, uint8 or float32) with `labels` (`-1`:
/// unlabelled, pretraining only) as a data set: the labelled samples, then the others.
fn own_images(
    images: &Bound<'_, PyAny>,
    labels: Option<PyReadonlyArray1<'_, i64>>,
) -> Result<OwnImages> {
    let samples = arrays::samples(images, "images")?;
    if !(3..=4).contains(&samples.shape.len()) {
        bail!(
            "images must be [N, C, H, W] or [N, C, D, H, W], got a sample shape {:?}",
            samples.shape
        );
    }
    let Some(labels) = labels else {
        bail!(
            "images need labels for the evaluation table: give `labels` (N class numbers, -1 \
             for the images that only pretrain)"
        );
    };
    let labels = labels.as_array();
    if labels.len() != samples.count {
        bail!("{} labels for {} images", labels.len(), samples.count);
    }
    let sample_len: usize = samples.shape.iter().product();
    let (mut labelled, mut classes, mut unlabelled) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (&label, values)) in labels
        .iter()
        .zip(samples.values.chunks(sample_len))
        .enumerate()
    {
        match label {
            -1 => unlabelled.extend_from_slice(values),
            l => {
                let Ok(class) = u32::try_from(l) else {
                    bail!("labels[{i}] is {l}: give a class number 0, 1, … or -1 for none");
                };
                labelled.extend_from_slice(values);
                classes.push(class);
            }
        }
    }
    let own = OwnImages::new(&samples.shape, labelled, classes)?;
    match unlabelled.is_empty() {
        true => Ok(own),
        false => own.with_unlabelled(unlabelled),
    }
}
