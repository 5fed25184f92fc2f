//! Frozen-feature evaluation on the held-out split, and the baselines every run is compared with.
//!
//! Protocol (`docs/spec/metrics.md` §1, §3–5): features from the backbone in eval mode on clean
//! images; linear probe on standardised features (L-BFGS, L2 with C, balanced accuracy); weighted
//! k-NN (cosine, k, T); RankMe and effective rank of the standardised test features;
//! class-conditional alignment, uniformity and the silhouette of the classes on the L2-normalised
//! test features (§7, §13); with an imbalanced training set, the probe's balanced accuracy over the
//! minority classes.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use anyhow::{ensure, Context, Result};
use candle_core::{Device, Tensor};
use serde::Serialize;
use ssl_eval::{Features, LinearProbeConfig};

use crate::config::{ModelConfig, RunConfig};
use crate::model::Model;
use crate::results::table_metrics;
use crate::setup::{self, CleanSamples, DataSplit};
use ssl_core::atomic;

/// The result table: each encoder's name and its row.
pub type Rows = Vec<(String, Evaluation)>;

/// One row of the result table.
#[derive(Debug, Clone, Serialize)]
pub struct Evaluation {
    pub probe_balanced_accuracy: f64,
    pub knn_accuracy: f64,
    pub rankme: f64,
    pub effective_rank: f64,
    /// Mean squared distance between same-class test embeddings (unit rows).
    pub class_alignment: f64,
    /// `log mean exp(−2‖z̃_i − z̃_j‖²)` over test pairs.
    pub uniformity: f64,
    pub silhouette: f64,
    /// Spherical k-means (k = number of training classes) fitted on the training features and
    /// scored on the test features against the labels (CARP protocol, spec metrics §9).
    pub kmeans_nmi: f64,
    pub kmeans_ami: f64,
    pub kmeans_ari: f64,
    /// Probe recall averaged over the minority classes of `data.imbalance`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minority_balanced_accuracy: Option<f64>,
}

impl Evaluation {
    /// Metric key → value, as `results.json` records them (a metric absent from this
    /// evaluation is left out; one that could not be computed is NaN).
    pub fn metrics(&self) -> std::collections::BTreeMap<String, f64> {
        let value = serde_json::to_value(self).expect("an evaluation serialises to JSON");
        (value.as_object().into_iter().flatten())
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
            .collect()
    }
}

/// Clean train or test samples with their labels.
pub struct Inputs<'a> {
    pub x: CleanSamples<'a>,
    pub y: Vec<u32>,
}

/// The un-augmented train and test sets, read from the data set when encoded.
pub fn clean_inputs<'a>(data: &'a DataSplit, device: &Device) -> (Inputs<'a>, Inputs<'a>) {
    let make = |positions: &'a [usize]| Inputs {
        x: CleanSamples::new(data, positions, device),
        y: setup::labels(&data.dataset, positions),
    };
    (make(&data.train), make(&data.test))
}

/// Checks, before training, that the final evaluation can score the split: the linear probe
/// needs two classes among the training instances; uniformity, silhouette and class alignment
/// need two test samples, two test classes and a test class with two samples.
pub fn check_split(data: &DataSplit) -> Result<()> {
    let classes = |positions: &[usize]| {
        let mut counts = std::collections::BTreeMap::<u32, usize>::new();
        for &i in positions {
            *counts.entry(data.dataset.labels[i]).or_default() += 1;
        }
        counts
    };
    let (train, test) = (classes(&data.train), classes(&data.test));
    let fix = "check data.classes, data.train_size and data.subset_test_fraction";
    ensure!(
        train.len() >= 2,
        "the training partition holds {} class(es) {:?}; the evaluation's linear probe needs at \
         least 2 ({fix})",
        train.len(),
        train.keys().collect::<Vec<_>>()
    );
    ensure!(
        test.len() >= 2 && test.values().any(|&n| n >= 2),
        "the test partition holds {} image(s) of {} class(es); the evaluation needs at least 2 \
         classes and 2 images of one class ({fix})",
        data.test.len(),
        test.len()
    );
    Ok(())
}

/// Most bytes of raw pixels (train and test together) the raw-inputs baseline takes as
/// features: beyond it (e.g. MedMNIST at 128 or 224 px) that row is left out with a note.
pub const RAW_INPUT_BYTES: usize = 1 << 30;

/// A `[n, …]` tensor as an `n × d` f32 feature matrix.
pub fn to_features(t: &Tensor) -> Result<Features> {
    let t = t.flatten_from(1)?.to_dtype(candle_core::DType::F32)?;
    let (n, d) = t.dims2()?;
    Features::new(t.flatten_all()?.to_vec1::<f32>()?, n, d)
}

/// Restarts of the k-means scores (CARP's code: 10; its paper: 20).
const KMEANS_RESTARTS: usize = 10;

/// Evaluates frozen features; `minority` lists the classes whose mean probe recall is reported
/// separately (empty: none).
pub fn evaluate_features(
    cfg: &RunConfig,
    train: &Tensor,
    train_y: &[u32],
    test: &Tensor,
    test_y: &[u32],
    minority: &[u32],
) -> Result<Evaluation> {
    let (train, test) = (to_features(train)?, to_features(test)?);
    let probe = ssl_eval::linear_probe(
        &train,
        train_y,
        &test,
        test_y,
        &LinearProbeConfig {
            c: cfg.eval.probe_c,
            ..LinearProbeConfig::default()
        },
    )?;
    let knn = ssl_eval::knn_accuracy(
        &train,
        train_y,
        &test,
        test_y,
        cfg.eval.knn_k,
        cfg.eval.knn_t,
    )?;
    let standardized = ssl_eval::standardize(&test);
    let (rankme, effective_rank) = ssl_eval::centred_ranks(&standardized, ssl_eval::RANKME_EPS)?;
    let mut classes = train_y.to_vec();
    classes.sort_unstable();
    classes.dedup();
    let kmeans = ssl_eval::clustering_scores(
        &train,
        None,
        &test,
        test_y,
        classes.len(),
        KMEANS_RESTARTS,
        cfg.train.seed,
    )?
    .val;
    Ok(Evaluation {
        probe_balanced_accuracy: probe.balanced_accuracy,
        knn_accuracy: knn,
        rankme,
        effective_rank,
        class_alignment: ssl_eval::class_conditional_alignment(&test, test_y)?,
        uniformity: ssl_eval::uniformity(&test)?,
        silhouette: ssl_eval::silhouette(&test, test_y)?,
        kmeans_nmi: kmeans.nmi,
        kmeans_ami: kmeans.ami,
        kmeans_ari: kmeans.ari,
        minority_balanced_accuracy: minority_balanced_accuracy(
            test_y,
            &probe.predictions,
            minority,
        ),
    })
}

/// Balanced accuracy restricted to the test samples of the `minority` classes (the mean recall
/// over those classes); `None` without minority classes.
fn minority_balanced_accuracy(y_true: &[u32], y_pred: &[u32], minority: &[u32]) -> Option<f64> {
    let (y, p): (Vec<u32>, Vec<u32>) = y_true
        .iter()
        .zip(y_pred)
        .filter(|(y, _)| minority.contains(y))
        .unzip();
    (!minority.is_empty()).then(|| ssl_eval::balanced_accuracy(&y, &p))
}

/// The trained encoder's eval-mode features `[n, D]` of the clean train and test inputs.
pub struct Embeddings {
    pub train: Tensor,
    pub test: Tensor,
}

/// The epoch-end monitor: k-NN accuracy of eval-mode features and the online probe's accuracy,
/// with the features they were computed from (after the last epoch, the final evaluation's).
pub fn monitor(
    cfg: &RunConfig,
    model: &Model,
    train: &Inputs,
    test: &Inputs,
) -> Result<(f64, Option<f64>, Embeddings)> {
    let f_train = model.embed(&train.x)?;
    let f_test = model.embed(&test.x)?;
    let knn = ssl_eval::knn_accuracy(
        &to_features(&f_train)?,
        &train.y,
        &to_features(&f_test)?,
        &test.y,
        cfg.eval.knn_k,
        cfg.eval.knn_t,
    )?;
    let probe = model.probe_predictions(&f_test, &f_train)?.map(|pred| {
        pred.iter().zip(&test.y).filter(|(p, y)| p == y).count() as f64 / test.y.len() as f64
    });
    let features = Embeddings {
        train: f_train,
        test: f_test,
    };
    Ok((knn, probe, features))
}

/// The baseline rows (raw inputs, random init) computed so far in this process, by
/// [`baseline_key`]: the cells of an `ssl compare` grid that differ only in objective or
/// projector compute them once.
static BASELINES: LazyLock<Mutex<HashMap<String, Rows>>> = LazyLock::new(Default::default);

/// Everything the baseline rows depend on: the data set and its split, the encoder's
/// configuration (not the projector, which they do not use), the seed of its random weights
/// and of k-means, the device and precision, and the evaluation settings.
fn baseline_key(cfg: &RunConfig, data: &DataSplit) -> Result<String> {
    let encoder = ModelConfig {
        projector: Vec::new(),
        sync_bn: false,
        ..cfg.model.clone()
    };
    let t = &cfg.train;
    let key = (
        &cfg.data,
        &data.dataset.name,
        data,
        encoder,
        t.seed,
        &t.device,
        t.precision,
        &cfg.eval,
    );
    Ok(serde_json::to_string(&key)?)
}

/// Rows for raw inputs, the random-init encoder (batch-norm statistics calibrated on the clean
/// train images) and the trained encoder. `trained`: the trained encoder's features where the
/// last epoch's monitor computed them (with these weights), else they are computed here.
pub fn with_baselines(
    cfg: &RunConfig,
    data: &DataSplit,
    model: &Model,
    device: &Device,
    trained: Option<Embeddings>,
) -> Result<Rows> {
    let (train, test) = clean_inputs(data, device);
    let minority = data.minority_classes.as_slice();
    let bar = ssl_core::progress::bar(3, "{spinner} evaluating [{bar:30}] {pos}/{len} {msg}");
    let key = baseline_key(cfg, data)?;
    let cached = BASELINES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .cloned();
    let mut rows = match cached {
        Some(rows) => {
            bar.inc(2);
            rows
        }
        None => {
            let rows = baselines(cfg, data, &train, &test, &bar)?;
            BASELINES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, rows.clone());
            rows
        }
    };
    bar.set_message("trained encoder");
    let trained = match trained {
        Some(features) => features,
        None => Embeddings {
            train: model.embed(&train.x)?,
            test: model.embed(&test.x)?,
        },
    };
    rows.push((
        format!("{} (ours)", cfg.objective.name),
        evaluate_features(
            cfg,
            &trained.train,
            &train.y,
            &trained.test,
            &test.y,
            minority,
        )?,
    ));
    bar.finish_and_clear();
    Ok(rows)
}

/// The raw-inputs row (unless its features would exceed [`RAW_INPUT_BYTES`]) and the
/// random-init row.
fn baselines(
    cfg: &RunConfig,
    data: &DataSplit,
    train: &Inputs,
    test: &Inputs,
    bar: &indicatif::ProgressBar,
) -> Result<Rows> {
    let minority = data.minority_classes.as_slice();
    let device = train.x.device();
    bar.set_message("raw inputs");
    let mut rows = Vec::new();
    let raw_bytes = train.x.tensor_bytes() + test.x.tensor_bytes();
    if raw_bytes <= RAW_INPUT_BYTES {
        rows.push((
            "raw inputs".to_string(),
            evaluate_features(
                cfg,
                &train.x.tensor()?,
                &train.y,
                &test.x.tensor()?,
                &test.y,
                minority,
            )?,
        ));
    } else {
        bar.suspend(|| {
            eprintln!(
                "note: no raw-inputs row: its features would be {:.1} GiB of pixels (the limit \
                 is {} GiB); the random-init row is the baseline",
                raw_bytes as f64 / (1u64 << 30) as f64,
                RAW_INPUT_BYTES >> 30
            )
        });
    }
    bar.inc(1);
    bar.set_message("random init");
    let random = setup::calibrated_random_encoder(cfg, &data.dataset, &train.x, device)?;
    rows.push((
        "random init".to_string(),
        evaluate_features(
            cfg,
            &train.x.encode(random.as_ref(), false)?,
            &train.y,
            &test.x.encode(random.as_ref(), false)?,
            &test.y,
            minority,
        )?,
    ));
    bar.inc(1);
    Ok(rows)
}

/// The trained encoder's test embeddings scaled to unit length, as `x,y,...,label` rows (the
/// IConE synthetic study plots its 2-D embeddings on the unit circle).
pub fn write_embedding(
    path: &std::path::Path,
    data: &DataSplit,
    model: &Model,
    device: &Device,
) -> Result<()> {
    let (_, test) = clean_inputs(data, device);
    let z = ssl_linalg::normalize_rows(&model.embed(&test.x)?)?.to_vec2::<f32>()?;
    let mut csv = String::new();
    for (row, label) in z.iter().zip(&test.y) {
        for v in row {
            csv.push_str(&format!("{v},"));
        }
        csv.push_str(&format!("{label}\n"));
    }
    atomic::write(path, csv.as_bytes())
}

/// The `(x, y, label)` rows of a 2-D `embedding.csv` ([`write_embedding`]).
pub fn read_embedding(path: &std::path::Path) -> Result<Vec<(f64, f64, u32)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut points = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(',').collect();
        let parsed = match fields[..] {
            [x, y, label] => x
                .parse()
                .ok()
                .zip(y.parse().ok())
                .zip(label.parse().ok())
                .map(|((x, y), label)| (x, y, label)),
            _ => None,
        };
        points.push(parsed.with_context(|| {
            format!(
                "{}: expected `x,y,label` rows, got `{line}`",
                path.display()
            )
        })?);
    }
    Ok(points)
}

/// The result table as Markdown.
pub fn table(rows: &[(String, Evaluation)], cfg: &RunConfig) -> String {
    let columns = table_metrics();
    let mut s = String::from("| encoder |");
    for metric in columns {
        s += &format!(" {} |", metric.title);
    }
    s += &format!("\n|---|{}\n", "---|".repeat(columns.len()));
    for (name, e) in rows {
        let metrics = e.metrics();
        s += &format!("| {name} |");
        for metric in columns {
            s += &format!(" {} |", metric.show(metrics[metric.key]));
        }
        s += "\n";
    }
    s + &format!(
        "\nk-NN: k = {}, T = {} (cosine); probe: logistic regression, C = {}\n",
        cfg.eval.knn_k, cfg.eval.knn_t, cfg.eval.probe_c
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A split the final evaluation cannot score is refused before training: one training
    /// class, or test images too few to hold two classes and a pair of one class.
    #[test]
    fn splits_the_evaluation_cannot_score_are_refused() -> Result<()> {
        check_split(&setup::data(&RunConfig::default())?)?;
        // Labels are `i mod 10`.
        let mut data = DataSplit::shape_only(&[1, 2, 2], 40);
        data.test = vec![1, 2, 11];
        check_split(&data)?;
        let refused = |data: &DataSplit| format!("{:#}", check_split(data).unwrap_err());
        data.train = vec![0, 10, 20];
        let e = refused(&data);
        assert!(
            e.contains(
                "the training partition holds 1 class(es) [0]; the evaluation's linear probe"
            ),
            "{e}"
        );
        data.train = (0..20).collect();
        for test in [vec![], vec![1, 2], vec![1, 11]] {
            data.test = test;
            let e = refused(&data);
            assert!(e.contains("the evaluation needs at least 2 classes"), "{e}");
        }
        Ok(())
    }

    /// Cells that differ in objective, its parameters or projector share the baseline rows;
    /// anything the random encoder, the split or the metrics depend on tells them apart.
    #[test]
    fn baselines_are_shared_exactly_where_they_cannot_differ() -> Result<()> {
        let key = |sets: &[&str]| -> Result<String> {
            let mut root = serde_yaml::Value::Mapping(Default::default());
            for s in sets {
                crate::config::apply_set(&mut root, s)?;
            }
            let cfg = RunConfig::from_yaml_value(root)?;
            baseline_key(&cfg, &setup::data(&cfg)?)
        };
        let base = key(&[])?;
        for same in [
            &["objective.name=simclr"][..],
            &["objective.name=vicreg", "objective.params.lambda=5"],
            &["model.projector=[64,64]", "train.lr=0.5", "train.epochs=3"],
        ] {
            assert_eq!(key(same)?, base, "{same:?}");
        }
        for differs in [
            "train.seed=1",
            "data.split_seed=7",
            "data.train_size=500",
            "model.mlp=[32,2]",
            "model.encoder=mlp",
            "eval.knn_k=5",
            "train.precision=bf16",
        ] {
            assert_ne!(key(&[differs])?, base, "{differs}");
        }
        Ok(())
    }

    #[test]
    fn minority_accuracy_is_the_mean_recall_over_minority_classes() {
        // Class 1: 1 of 2 right; class 2: 2 of 2; class 0 (majority) is ignored.
        let y = [0, 0, 1, 1, 2, 2];
        let p = [1, 1, 1, 0, 2, 2];
        assert_eq!(minority_balanced_accuracy(&y, &p, &[1, 2]), Some(0.75));
        assert_eq!(minority_balanced_accuracy(&y, &p, &[]), None);
    }
}
