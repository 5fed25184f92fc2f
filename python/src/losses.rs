//! `candle_ssl.losses`: an objective's loss and its gradient with respect to the embeddings,
//! for every registered objective that takes no network or parameters of its own (no teacher,
//! prototypes, queue, instance table or pixels), so a PyTorch user can check their own
//! implementation against ours.

use std::sync::OnceLock;

use anyhow::{bail, ensure, Result};
use candle_core::{Device, Tensor, Var};
use numpy::{PyArrayDyn, PyReadonlyArray3};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ssl_core::{
    Batch, BuildContext, Ids, Objective, ParamStore, Progress, Registration, SingleProcess,
};

use crate::arrays;
use crate::errors::IntoPy;
use crate::pools;

/// `registration` built with `params` for `[views, batch, dim]` embeddings, if it takes no
/// network of its own; `Ok(None)` if it does.
fn build(
    registration: &Registration,
    params: &serde_yaml::Value,
    [views, batch, dim]: [usize; 3],
) -> Result<Option<Box<dyn Objective>>> {
    let store = ParamStore::new(0);
    let ctx = BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: batch,
        num_classes: None,
        instance_labels: None,
        projection_dim: dim,
        feature_dim: dim,
        views,
        global_views: views,
        batch_size: batch,
        patches: None,
    };
    let objective = (registration.build)(params, &ctx)?;
    let needs = objective.requirements();
    let own_network =
        !store.vars().is_empty() || needs.teacher.is_some() || needs.pixels || needs.labels;
    Ok((!own_network).then_some(objective))
}

/// The objectives [`loss`] takes: those whose default build creates no parameters and asks for
/// no teacher, labels or pixels.
#[pyfunction]
pub fn loss_objectives() -> Vec<&'static str> {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            ssl_core::registry()
                .into_iter()
                .filter(|r| {
                    let defaults = serde_yaml::Value::Null;
                    matches!(build(r, &defaults, [2, 8, 16]), Ok(Some(_)))
                })
                .map(|r| r.name)
                .collect()
        })
        .clone()
}

/// The loss of objective `name` (its `objective.params` given as `params`) on the embeddings
/// `z` `[V, B, D]` at the first step of a run, and its gradient with respect to `z` (float32,
/// `z`'s shape). Computed in float64.
#[pyfunction]
#[pyo3(signature = (name, z, params = None))]
pub fn loss<'py>(
    py: Python<'py>,
    name: &str,
    z: PyReadonlyArray3<'py, f32>,
    params: Option<Bound<'py, PyDict>>,
) -> PyResult<(f64, Bound<'py, PyArrayDyn<f32>>)> {
    let registration = ssl_core::find(name).or_value()?;
    let params = match params {
        Some(p) => arrays::to_yaml(p.as_any(), "params").or_value()?,
        None => serde_yaml::Value::Null,
    };
    let (v, b, d) = z.as_array().dim();
    let values: Vec<f64> = z.as_array().iter().map(|&x| f64::from(x)).collect();
    let (value, grad) = pools::run(py, || {
        ensure!(
            v > 0 && b > 0 && d > 0,
            "z must be [V, B, D] with no empty side, got [{v}, {b}, {d}]"
        );
        let Some(mut objective) = build(registration, &params, [v, b, d])? else {
            bail!(
                "{} trains a network or parameters of its own (a teacher, prototypes, a queue or \
                 an instance table), so its loss is not a function of z alone; these are: {}",
                registration.name,
                loss_objectives().join(", ")
            );
        };
        objective
            .requirements()
            .check(registration.name, v, b, false)?;
        let z = Var::from_tensor(&Tensor::from_vec(values, (v, b, d), &Device::Cpu)?)?;
        let ids = Ids::range(b, &Device::Cpu)?;
        let batch = Batch {
            projections: z.as_tensor(),
            features: z.as_tensor(),
            global_views: v,
            indices: &ids,
            labels: None,
            teacher: None,
            progress: Progress {
                step: 0,
                epoch: 0,
                steps_per_epoch: 1,
                total_steps: 1,
                seed: 0,
            },
            train: true,
            collective: &SingleProcess,
        };
        let out = objective.loss(&batch)?;
        let value = out
            .loss
            .to_dtype(candle_core::DType::F64)?
            .to_scalar::<f64>()?;
        let grads = out.loss.backward()?;
        let grad = match grads.get(z.as_tensor()) {
            Some(g) => g
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?,
            None => vec![0.0; v * b * d],
        };
        Ok((value, grad))
    })
    .or_value()?;
    Ok((value, arrays::to_numpy(py, grad, &[v, b, d]).or_runtime()?))
}
