//! `candle_ssl.eval`: the evaluation suite on feature matrices from any model, the same
//! functions `ssl run`'s table and `ssl eval` call (ssl-eval), each with the GIL released.

use std::collections::BTreeMap;

use anyhow::{ensure, Result};
use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use ssl_data::MedMnistTask;
use ssl_eval::{Features, LidarConfig, LinearProbeConfig};

use crate::arrays::{features, labels};
use crate::errors::IntoPy;
use crate::pools;

/// Float32 `[N, D]` features, int64 class labels.
type X<'py> = PyReadonlyArray2<'py, f32>;
type Y<'py> = PyReadonlyArray1<'py, i64>;

/// Labelled training and test features.
struct Split {
    train: Features,
    train_y: Vec<u32>,
    test: Features,
    test_y: Vec<u32>,
}

impl Split {
    fn read(train_x: &X<'_>, train_y: &Y<'_>, test_x: &X<'_>, test_y: &Y<'_>) -> Result<Self> {
        Ok(Self {
            train: features(train_x, "train_x")?,
            train_y: labels(train_y, "train_y")?,
            test: features(test_x, "test_x")?,
            test_y: labels(test_y, "test_y")?,
        })
    }
}

/// The §1 linear probe: multinomial logistic regression (L2 strength `1/c`, L-BFGS) fitted on
/// standardised training features, scored on the test split. `c = None` chooses it as `ssl
/// eval` does: from the default grid, on a stratified 20 % validation split of the training
/// features (seed 0).
#[pyfunction]
#[pyo3(signature = (train_x, train_y, test_x, test_y, c = None))]
fn eval_linear_probe(
    py: Python<'_>,
    train_x: X<'_>,
    train_y: Y<'_>,
    test_x: X<'_>,
    test_y: Y<'_>,
    c: Option<f64>,
) -> PyResult<BTreeMap<&'static str, f64>> {
    let Split {
        train,
        train_y,
        test,
        test_y,
    } = Split::read(&train_x, &train_y, &test_x, &test_y).or_value()?;
    let (probe, c) = pools::run(py, || {
        let c = match c {
            Some(c) => c,
            None => ssl_eval::select_c(&train, &train_y, &ssl_eval::DEFAULT_C_GRID, 0.2, 0)?.c,
        };
        let cfg = LinearProbeConfig {
            c,
            ..LinearProbeConfig::default()
        };
        Ok((
            ssl_eval::linear_probe(&train, &train_y, &test, &test_y, &cfg)?,
            c,
        ))
    })
    .or_value()?;
    Ok(BTreeMap::from([
        ("balanced_accuracy", probe.balanced_accuracy),
        ("accuracy", probe.accuracy),
        ("c", c),
    ]))
}

/// Weighted k-NN accuracy (cosine similarity, votes `exp(s / temperature)`).
#[pyfunction]
#[pyo3(signature = (train_x, train_y, test_x, test_y, k = ssl_eval::DEFAULT_KNN_K, temperature = ssl_eval::DEFAULT_KNN_T))]
fn eval_knn(
    py: Python<'_>,
    train_x: X<'_>,
    train_y: Y<'_>,
    test_x: X<'_>,
    test_y: Y<'_>,
    k: usize,
    temperature: f64,
) -> PyResult<f64> {
    let Split {
        train,
        train_y,
        test,
        test_y,
    } = Split::read(&train_x, &train_y, &test_x, &test_y).or_value()?;
    pools::run(py, || {
        ssl_eval::knn_accuracy(&train, &train_y, &test, &test_y, k, temperature)
    })
    .or_value()
}

/// RankMe: `exp` of the entropy of the normalised singular values (plus `eps`).
#[pyfunction]
#[pyo3(signature = (z, eps = ssl_eval::RANKME_EPS))]
fn eval_rankme(py: Python<'_>, z: X<'_>, eps: f64) -> PyResult<f64> {
    let z = features(&z, "z").or_value()?;
    pools::run(py, || ssl_eval::rankme(&z, eps)).or_value()
}

/// The effective rank of the centred covariance's spectrum.
#[pyfunction]
fn eval_effective_rank(py: Python<'_>, z: X<'_>) -> PyResult<f64> {
    let z = features(&z, "z").or_value()?;
    pools::run(py, || ssl_eval::effective_rank(&z)).or_value()
}

/// LiDAR over `V` views `[N, D]` of the same `N` samples (each sample a class).
#[pyfunction]
#[pyo3(signature = (views, delta = LidarConfig::default().delta, eps = LidarConfig::default().eps))]
fn eval_lidar(py: Python<'_>, views: Vec<X<'_>>, delta: f64, eps: f64) -> PyResult<f64> {
    let views = views
        .iter()
        .enumerate()
        .map(|(i, v)| features(v, &format!("views[{i}]")))
        .collect::<Result<Vec<Features>>>()
        .or_value()?;
    let cfg = LidarConfig {
        delta,
        eps,
        ..LidarConfig::default()
    };
    pools::run(py, || ssl_eval::lidar(&views, cfg)).or_value()
}

/// Alignment (`E ‖a − b‖^alpha` over positive pairs) and uniformity (`log E exp(−t ‖z_i −
/// z_j‖²)` over the rows of `a`), on L2-normalised rows.
#[pyfunction]
#[pyo3(signature = (a, b, alpha = ssl_eval::ALIGNMENT_ALPHA, t = ssl_eval::UNIFORMITY_T))]
fn eval_alignment_uniformity(
    py: Python<'_>,
    a: X<'_>,
    b: X<'_>,
    alpha: f64,
    t: f64,
) -> PyResult<(f64, f64)> {
    let (a, b) = (features(&a, "a").or_value()?, features(&b, "b").or_value()?);
    pools::run(py, || {
        Ok((
            ssl_eval::alignment_alpha(&a, &b, alpha)?,
            ssl_eval::uniformity_t(&a, t)?,
        ))
    })
    .or_value()
}

/// Linear CKA between two representations of the same samples.
#[pyfunction]
fn eval_cka(py: Python<'_>, x: X<'_>, y: X<'_>) -> PyResult<f64> {
    let (x, y) = (features(&x, "x").or_value()?, features(&y, "y").or_value()?);
    pools::run(py, || ssl_eval::linear_cka(&x, &y)).or_value()
}

/// CARP's clustering protocol on one set of features: spherical k-means (`k` clusters, default
/// the number of classes; 10 restarts from `seed`) fitted on `z`, its assignment scored by
/// NMI, AMI and ARI against `labels`.
#[pyfunction]
#[pyo3(signature = (z, labels, k = None, seed = 0))]
fn eval_kmeans_scores(
    py: Python<'_>,
    z: X<'_>,
    labels: Y<'_>,
    k: Option<usize>,
    seed: u64,
) -> PyResult<BTreeMap<&'static str, f64>> {
    let (z, y) = (
        features(&z, "z").or_value()?,
        crate::arrays::labels(&labels, "labels").or_value()?,
    );
    let k = k.unwrap_or_else(|| y.iter().max().map_or(0, |&m| m as usize + 1));
    let scores = pools::run(py, || {
        ssl_eval::clustering_scores(&z, None, &z, &y, k, KMEANS_RESTARTS, seed)
    })
    .or_value()?;
    Ok(BTreeMap::from([
        ("nmi", scores.val.nmi),
        ("ami", scores.val.ami),
        ("ari", scores.val.ari),
        ("objective", scores.objective),
    ]))
}

/// Restarts of the k-means, as the run's evaluation uses (CARP's code).
const KMEANS_RESTARTS: usize = 10;

/// MedMNIST's official `getACC` and `getAUC` for `task` on `scores` `[N, K]` (probabilities or
/// logits per class or label) and `labels` (`[N]` class numbers, or `[N, K]` 0/1 flags for a
/// multi-label task).
#[pyfunction]
fn eval_medmnist_metrics(
    py: Python<'_>,
    task: &str,
    labels: &Bound<'_, PyAny>,
    scores: PyReadonlyArray2<'_, f64>,
) -> PyResult<BTreeMap<&'static str, f64>> {
    let task = MedMnistTask::from_official(task).or_value()?;
    let (n, k) = scores.as_array().dim();
    let flat = |a: numpy::ndarray::ArrayViewD<'_, i64>| -> Result<Vec<u32>> {
        a.iter()
            .map(|&v| u32::try_from(v).map_err(|_| anyhow::anyhow!("label {v} is negative")))
            .collect()
    };
    let labels: Vec<u32> = {
        let array = labels.extract::<numpy::PyReadonlyArrayDyn<'_, i64>>()?;
        let view = array.as_array();
        let expected = match task {
            MedMnistTask::MultiLabel => vec![n, k],
            _ => vec![n],
        };
        ensure_shape(view.shape(), &expected).or_value()?;
        flat(view).or_value()?
    };
    let scores: Vec<f64> = scores.as_array().iter().copied().collect();
    let m = pools::run(py, || ssl_eval::medmnist_metrics(task, &labels, &scores, k)).or_value()?;
    Ok(BTreeMap::from([("acc", m.acc), ("auc", m.auc)]))
}

fn ensure_shape(got: &[usize], expected: &[usize]) -> Result<()> {
    ensure!(
        got == expected,
        "labels have shape {got:?}; this task's scores take labels of shape {expected:?}"
    );
    Ok(())
}

/// Adds the functions to the module, named as `candle_ssl.eval` calls them.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(eval_linear_probe, m)?)?;
    m.add_function(wrap_pyfunction!(eval_knn, m)?)?;
    m.add_function(wrap_pyfunction!(eval_rankme, m)?)?;
    m.add_function(wrap_pyfunction!(eval_effective_rank, m)?)?;
    m.add_function(wrap_pyfunction!(eval_lidar, m)?)?;
    m.add_function(wrap_pyfunction!(eval_alignment_uniformity, m)?)?;
    m.add_function(wrap_pyfunction!(eval_cka, m)?)?;
    m.add_function(wrap_pyfunction!(eval_kmeans_scores, m)?)?;
    m.add_function(wrap_pyfunction!(eval_medmnist_metrics, m)?)?;
    Ok(())
}
