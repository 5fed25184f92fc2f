//! NumPy arrays and Python values in and out: feature matrices, labels, images, and Python
//! values as YAML (the configuration's values).

use anyhow::{bail, ensure, Result};
use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{
    PyArrayDyn, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use ssl_eval::Features;

/// A `[N, D]` float32 array as a feature matrix (copied, row-major).
pub fn features(x: &PyReadonlyArray2<'_, f32>, what: &str) -> Result<Features> {
    let view = x.as_array();
    let (n, d) = view.dim();
    ensure!(
        n > 0 && d > 0,
        "{what}: features must be a non-empty [N, D] matrix, got shape [{n}, {d}]"
    );
    let data: Vec<f32> = view.iter().copied().collect();
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        bail!(
            "{what}: row {} holds a non-finite value ({}) in column {}",
            i / d,
            data[i],
            i % d
        );
    }
    Ok(Features { data, n, d })
}

/// Class labels `0, 1, …` from an int64 array; `what` names the argument in errors.
pub fn labels(y: &PyReadonlyArray1<'_, i64>, what: &str) -> Result<Vec<u32>> {
    y.as_array()
        .iter()
        .enumerate()
        .map(|(i, &v)| match u32::try_from(v) {
            Ok(label) => Ok(label),
            Err(_) => bail!("{what}: label {v} at position {i} is not a class number 0, 1, …"),
        })
        .collect()
}

/// Samples (`[N, …]`, float32 values as they are, uint8 scaled to `[0, 1]`), with one sample's
/// shape.
pub struct Samples {
    pub values: Vec<f32>,
    pub shape: Vec<usize>,
    pub count: usize,
}

/// Reads `x`, a float32 or uint8 array of `N` samples.
pub fn samples(x: &Bound<'_, PyAny>, what: &str) -> Result<Samples> {
    let (values, dims): (Vec<f32>, Vec<usize>) =
        if let Ok(a) = x.extract::<PyReadonlyArrayDyn<'_, f32>>() {
            (a.as_array().iter().copied().collect(), a.shape().to_vec())
        } else if let Ok(a) = x.extract::<PyReadonlyArrayDyn<'_, u8>>() {
            let scaled = a.as_array().iter().map(|&v| f32::from(v) / 255.0).collect();
            (scaled, a.shape().to_vec())
        } else {
            let dtype = x
                .getattr("dtype")
                .map_or_else(|_| "not an array".to_string(), |d| d.to_string());
            bail!("{what} must be a NumPy array of uint8 or float32 values, got {dtype}");
        };
    ensure!(
        dims.len() >= 2 && dims.iter().all(|&d| d > 0),
        "{what} must be [N, C, H, W] images, [N, C, D, H, W] volumes or [N, F] vectors with no \
         empty side, got shape {dims:?}"
    );
    Ok(Samples {
        values,
        shape: dims[1..].to_vec(),
        count: dims[0],
    })
}

/// `values` as a float32 array of shape `dims`.
pub fn to_numpy<'py>(
    py: Python<'py>,
    values: Vec<f32>,
    dims: &[usize],
) -> Result<Bound<'py, PyArrayDyn<f32>>> {
    let array = ArrayD::from_shape_vec(IxDyn(dims), values)?;
    Ok(PyArrayDyn::from_owned_array(py, array))
}

/// A Python value as YAML: `None`, `bool`, `int`, `float`, `str`, and lists, tuples and dicts
/// of them (the Python side turns NumPy scalars and paths into these first); `key` names the
/// setting in errors.
pub fn to_yaml(value: &Bound<'_, PyAny>, key: &str) -> Result<serde_yaml::Value> {
    use serde_yaml::Value;
    if value.is_none() {
        Ok(Value::Null)
    } else if value.is_instance_of::<PyBool>() {
        Ok(Value::Bool(value.extract()?))
    } else if value.is_instance_of::<PyString>() {
        Ok(Value::String(value.extract()?))
    } else if value.is_instance_of::<PyInt>() {
        match (value.extract::<i64>(), value.extract::<u64>()) {
            (Ok(v), _) => Ok(Value::Number(v.into())),
            (_, Ok(v)) => Ok(Value::Number(v.into())),
            _ => bail!("{key}: {value} does not fit in 64 bits"),
        }
    } else if value.is_instance_of::<PyFloat>() {
        Ok(Value::Number(value.extract::<f64>()?.into()))
    } else if let Ok(dict) = value.cast::<PyDict>() {
        let mut out = serde_yaml::Mapping::new();
        for (k, v) in dict.iter() {
            let Ok(name) = k.extract::<String>() else {
                bail!("{key}: dict keys must be strings, got {k}");
            };
            let item = to_yaml(&v, &format!("{key}.{name}"))?;
            out.insert(Value::String(name), item);
        }
        Ok(Value::Mapping(out))
    } else if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let items = value
            .try_iter()?
            .map(|item| to_yaml(&item?, key))
            .collect::<Result<Vec<_>>>()?;
        Ok(Value::Sequence(items))
    } else {
        bail!(
            "{key}: a {} cannot be a setting; give a number, string, bool, None, list or dict",
            value.get_type().name()?
        )
    }
}
