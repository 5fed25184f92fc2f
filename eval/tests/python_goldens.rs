//! The values the Python package's `candle_ssl.eval` must give: every metric it offers, computed
//! here on seeded features and written to `python/tests/goldens/eval.json`, which its pytest
//! suite reads. This test recomputes them and compares with the committed file, so a change to
//! a metric fails here until the file is rewritten (`UPDATE_GOLDENS=1 cargo test -p ssl-eval
//! --test python_goldens`), and then in Python until the binding agrees.

use std::path::PathBuf;

use anyhow::Result;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use ssl_data::MedMnistTask;
use ssl_eval::{Features, LidarConfig, LinearProbeConfig};

/// `n` rows of `d` values: class `i % classes` centred at `shift · e_class`, plus noise.
fn clustered(
    rng: &mut ChaCha8Rng,
    n: usize,
    d: usize,
    classes: u32,
    shift: f32,
) -> (Vec<Vec<f32>>, Vec<u32>) {
    let labels: Vec<u32> = (0..n as u32).map(|i| i % classes).collect();
    let rows = labels
        .iter()
        .map(|&c| {
            (0..d)
                .map(|j| {
                    rng.random_range(-1.0f32..1.0) + if j == c as usize % d { shift } else { 0.0 }
                })
                .collect()
        })
        .collect();
    (rows, labels)
}

fn features(rows: &[Vec<f32>]) -> Result<Features> {
    Features::from_rows(rows)
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../python/tests/goldens/eval.json")
}

/// The inputs, arguments and results, as the Python test reads them.
fn goldens() -> Result<Value> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (train_x, train_y) = clustered(&mut rng, 60, 8, 3, 1.5);
    let (test_x, test_y) = clustered(&mut rng, 30, 8, 3, 1.5);
    let (z, z_labels) = clustered(&mut rng, 40, 6, 4, 2.0);
    let views: Vec<Vec<Vec<f32>>> = {
        let (base, _) = clustered(&mut rng, 20, 5, 5, 1.0);
        (0..3)
            .map(|_| {
                (base.iter())
                    .map(|row| {
                        row.iter()
                            .map(|v| v + rng.random_range(-0.3f32..0.3))
                            .collect()
                    })
                    .collect()
            })
            .collect()
    };
    let (a, _) = clustered(&mut rng, 30, 4, 2, 1.0);
    let b: Vec<Vec<f32>> = (a.iter())
        .map(|row| {
            row.iter()
                .map(|v| v + rng.random_range(-0.5f32..0.5))
                .collect()
        })
        .collect();
    let (x, _) = clustered(&mut rng, 25, 6, 3, 1.0);
    let y: Vec<Vec<f32>> = x
        .iter()
        .map(|r| vec![r[0] + r[1], r[2] * 2.0, rng.random_range(-1.0f32..1.0)])
        .collect();
    let (scores, medmnist_labels): (Vec<Vec<f64>>, Vec<u32>) = (0..40)
        .map(|i| {
            let label = i % 3;
            let mut s: Vec<f64> = (0..3).map(|_| rng.random_range(0.0..1.0)).collect();
            s[label as usize] += 0.6;
            let total: f64 = s.iter().sum();
            (s.iter().map(|v| v / total).collect(), label)
        })
        .unzip();

    let (train, test) = (features(&train_x)?, features(&test_x)?);
    let probe = ssl_eval::linear_probe(
        &train,
        &train_y,
        &test,
        &test_y,
        &LinearProbeConfig::default(),
    )?;
    let zf = features(&z)?;
    let view_features = views
        .iter()
        .map(|v| features(v))
        .collect::<Result<Vec<_>>>()?;
    let (af, bf) = (features(&a)?, features(&b)?);
    let kmeans = ssl_eval::clustering_scores(&zf, None, &zf, &z_labels, 4, 10, 0)?;
    let flat_scores: Vec<f64> = scores.iter().flatten().copied().collect();
    let medmnist =
        ssl_eval::medmnist_metrics(MedMnistTask::MultiClass, &medmnist_labels, &flat_scores, 3)?;
    let lidar = LidarConfig::default();
    Ok(json!({
        "train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y,
        "z": z, "z_labels": z_labels, "views": views, "a": a, "b": b, "x": x, "y": y,
        "scores": scores, "medmnist_labels": medmnist_labels,
        "args": {
            "linear_probe": {"c": 1.0},
            "knn": {"k": 20, "temperature": 0.07},
            "rankme": {"eps": ssl_eval::RANKME_EPS},
            "lidar": {"delta": lidar.delta, "eps": lidar.eps},
            "alignment_uniformity": {"alpha": 2.0, "t": 2.0},
            "kmeans_scores": {"k": 4, "seed": 0},
            "medmnist_metrics": {"task": "multi-class"},
        },
        "results": {
            "linear_probe": {"balanced_accuracy": probe.balanced_accuracy, "accuracy": probe.accuracy, "c": 1.0},
            "knn": ssl_eval::knn_accuracy(&train, &train_y, &test, &test_y, 20, 0.07)?,
            "rankme": ssl_eval::rankme(&zf, ssl_eval::RANKME_EPS)?,
            "effective_rank": ssl_eval::effective_rank(&zf)?,
            "lidar": ssl_eval::lidar(&view_features, lidar)?,
            "alignment_uniformity": [ssl_eval::alignment_alpha(&af, &bf, 2.0)?, ssl_eval::uniformity_t(&af, 2.0)?],
            "cka": ssl_eval::linear_cka(&features(&x)?, &features(&y)?)?,
            "kmeans_scores": {"nmi": kmeans.val.nmi, "ami": kmeans.val.ami, "ari": kmeans.val.ari},
            "medmnist_metrics": {"acc": medmnist.acc, "auc": medmnist.auc},
        },
    }))
}

#[test]
fn the_python_goldens_are_what_the_rust_metrics_give() -> Result<()> {
    let fresh = goldens()?;
    let path = golden_path();
    if std::env::var_os("UPDATE_GOLDENS").is_some() {
        std::fs::create_dir_all(path.parent().expect("a directory"))?;
        std::fs::write(&path, serde_json::to_string_pretty(&fresh)? + "\n")?;
    }
    let committed: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    if let Some(at) = first_difference(&committed, &fresh, String::new()) {
        panic!(
            "{} is stale at {at}: rewrite it with UPDATE_GOLDENS=1 cargo test -p ssl-eval \
             --test python_goldens",
            path.display()
        );
    }
    Ok(())
}

/// Where `a` and `b` first differ (numbers beyond 1e-12 relative: JSON's decimal text need not
/// parse back to the last bit), as a JSON path.
fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64()?, y.as_f64()?);
            ((x - y).abs() > 1e-12 * x.abs().max(y.abs())).then_some(at)
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => (x.iter().zip(y))
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, format!("{at}[{i}]"))),
        (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
            x.iter().find_map(|(k, v)| match y.get(k) {
                Some(w) => first_difference(v, w, format!("{at}.{k}")),
                None => Some(format!("{at}.{k}")),
            })
        }
        _ => (a != b).then_some(at),
    }
}
