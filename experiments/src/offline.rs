//! Offline evaluation of frozen checkpoints: `ssl eval A [--compare B …] [--metrics …]`.
//!
//! Each checkpoint's encoder, in eval mode, embeds the clean train and test splits of its run's
//! data once; the features are cached beside the weights (keyed by the weights file and the data
//! settings), so a second evaluation or a comparison only loads them. The metrics follow
//! `docs/spec/metrics.md`: the linear probe with its L2 strength chosen on a stratified validation
//! split of the training features (or the fixed-C protocol, `--probe-c`), or with `--probe sgd`
//! the papers' SGD probe on frozen features of augmented images ([`crate::sgd_probe`]; its
//! settings, augmentation and per-epoch rate and loss go to the column's `probe` object in
//! `eval.json`), the k-NN sweep over the
//! duality paper's k × T grid, RankMe and effective rank of the standardised test features,
//! LiDAR over augmented views of training images (surrogate classes), alignment of two augmented
//! views, uniformity, silhouette, and linear CKA between every two checkpoints. Results go to the
//! terminal, to `eval.json` and `knn.csv`, and a PNG shows each checkpoint's test features
//! projected on their top two principal components, coloured by class.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use candle_core::{Device, Tensor};
use serde::Serialize;
use ssl_data::DataSource;
use ssl_eval::Features;

use crate::sgd_probe::{ProbeKind, SgdProbeConfig, SgdProbeRecord};
use ssl_core::atomic;
use ssl_report::plot::{scatter_panels, ScatterPanel};
use ssl_train::config::{EvaluatedEncoder, RunConfig};
use ssl_train::evaluate::to_features;
use ssl_train::model::{self, Model};
use ssl_train::results::{Metric, METRICS as RUN_METRICS};
use ssl_train::setup::{self, DataSplit, Findings};

/// What `--metrics` names: one computation each, filling one or more rows of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricSet {
    /// The linear probe: its balanced and plain accuracy, its C, MedMNIST's ACC and AUC where
    /// the data set has a task, and the run's online probe.
    Probe,
    /// The k-NN sweep: accuracy at the run's k and T, and the sweep's best cell.
    Knn,
    Rankme,
    EffectiveRank,
    Lidar,
    /// Alignment of two augmented views of the same images.
    Alignment,
    Uniformity,
    Silhouette,
    /// Spherical k-means against the classes: NMI, AMI and ARI.
    Kmeans,
    /// The hierarchical Rand index, level by level of a class tree.
    Hierarchy,
    /// Linear CKA of every two checkpoints' test features.
    Cka,
    /// LCA and cophenetic similarity of every two checkpoints' Ward trees.
    Tree,
}

impl MetricSet {
    /// Every set, in table order.
    pub const ALL: [Self; 12] = [
        Self::Probe,
        Self::Knn,
        Self::Rankme,
        Self::EffectiveRank,
        Self::Lidar,
        Self::Alignment,
        Self::Uniformity,
        Self::Silhouette,
        Self::Kmeans,
        Self::Hierarchy,
        Self::Cka,
        Self::Tree,
    ];

    /// The name `--metrics` takes.
    pub fn key(self) -> &'static str {
        match self {
            Self::Probe => "probe",
            Self::Knn => "knn",
            Self::Rankme => "rankme",
            Self::EffectiveRank => "effective-rank",
            Self::Lidar => "lidar",
            Self::Alignment => "alignment",
            Self::Uniformity => "uniformity",
            Self::Silhouette => "silhouette",
            Self::Kmeans => "kmeans",
            Self::Hierarchy => "hierarchy",
            Self::Cka => "cka",
            Self::Tree => "tree",
        }
    }

    /// The set `--metrics` names `name`, or an error listing them all.
    pub fn parse(name: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|set| set.key() == name)
            .with_context(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|set| set.key()).collect();
                format!("unknown metric `{name}`; known: {}", known.join(", "))
            })
    }
}

/// The metrics only this suite computes; the others are the run's ([`RUN_METRICS`]), under the
/// same keys and titles.
pub const SUITE_METRICS: [Metric; 8] = [
    Metric::percent("probe_accuracy", "linear probe (acc.)"),
    Metric::fixed("medmnist_acc", "MedMNIST ACC (probe)", 3),
    Metric::fixed("medmnist_auc", "MedMNIST AUC (probe)", 3),
    Metric::percent("online_probe_accuracy", "online probe acc. (training log)"),
    Metric::percent("online_probe_recomputed", "online probe acc. (recomputed)"),
    Metric::percent("knn_best_accuracy", "k-NN best acc."),
    Metric::fixed("lidar", "LiDAR", 1),
    Metric::fixed("view_alignment", "view alignment ↓", 3),
];

/// The class hierarchy of the built-in digits, by stroke shape (`configs/digits-hierarchy.yaml`).
pub const DIGITS_HIERARCHY: &str = include_str!("../../configs/digits-hierarchy.yaml");

/// Restarts of the k-means scores (CARP's code: 10; its paper: 20).
const KMEANS_RESTARTS: usize = 10;

/// What to compute.
#[derive(Debug, Clone)]
pub struct SuiteConfig {
    /// What to compute.
    pub metrics: Vec<MetricSet>,
    /// Class tree of the hierarchical Rand index; `None`: [`DIGITS_HIERARCHY`] for digits runs.
    pub hierarchy: Option<ssl_eval::ClassHierarchy>,
    /// Fixed-C probe (spec §1: C = 1); `None`: C chosen on a validation split.
    pub probe_c: Option<f64>,
    /// Which linear probe computes the `probe` metrics.
    pub probe: ProbeKind,
    /// Settings of the SGD probe (`probe: sgd`).
    pub sgd_probe: SgdProbeConfig,
    /// LiDAR's surrogate classes (training images), spec §6: min(1000, train size).
    pub lidar_samples: usize,
    /// Augmented views per surrogate class (spec §6: 50).
    pub lidar_views: usize,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self {
            metrics: MetricSet::ALL
                .into_iter()
                .filter(|&set| set != MetricSet::Hierarchy)
                .collect(),
            hierarchy: None,
            probe_c: None,
            probe: ProbeKind::Lbfgs,
            sgd_probe: SgdProbeConfig::default(),
            lidar_samples: 1000,
            lidar_views: 50,
        }
    }
}

impl SuiteConfig {
    /// Checks the settings, naming the flag to change.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.lidar_views >= 2 && self.lidar_samples >= 2,
            "LiDAR needs at least 2 samples with 2 views each, got {} × {}",
            self.lidar_samples,
            self.lidar_views
        );
        if let Some(c) = self.probe_c {
            ensure!(
                c.is_finite() && c > 0.0,
                "--probe-c must be > 0 (the probe's inverse L2 strength; docs/spec/metrics.md §1: 1), got {c}"
            );
            ensure!(
                self.probe == ProbeKind::Lbfgs,
                "--probe-c sets the L-BFGS probe's regularisation; --probe sgd has none"
            );
        }
        if self.probe == ProbeKind::Sgd {
            self.sgd_probe.validate()?;
        }
        Ok(())
    }

    /// Whether `set` is to be computed.
    pub fn wants(&self, set: MetricSet) -> bool {
        self.metrics.contains(&set)
    }
}

/// A checkpoint to evaluate: its run configuration and weights.
pub struct Source {
    /// Column heading.
    pub label: String,
    pub cfg: RunConfig,
    /// A run checkpoint or an exported encoder.
    pub weights: PathBuf,
    /// The run's last online-probe accuracy, when its training log has one.
    pub online_probe: Option<f64>,
}

/// Frozen features of one checkpoint.
struct Embedded {
    train: Features,
    train_y: Vec<u32>,
    test: Features,
    test_y: Vec<u32>,
}

/// One checkpoint's results.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Column {
    pub label: String,
    pub weights: PathBuf,
    /// Metric key ([`RUN_METRICS`], [`SUITE_METRICS`]) → value.
    pub metrics: BTreeMap<String, f64>,
    /// The L-BFGS probe's inverse L2 strength: chosen on a validation split, or `--probe-c`.
    pub probe_c: Option<f64>,
    /// The run's k and T, at which `knn_accuracy` was read from the sweep (`None`: not in it).
    pub knn_at: Option<(usize, f64)>,
    /// The k and T of the sweep's best cell (`knn_best_accuracy`).
    pub knn_best: Option<(usize, f64)>,
    /// Every (k, T) cell of the k-NN sweep: top-1 accuracy.
    pub knn_sweep: Vec<(usize, f64, f64)>,
    /// The hierarchical Rand index, coarsest level first.
    pub rand_index: Vec<ssl_eval::LevelRandIndex>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub columns: Vec<Column>,
    /// Linear CKA of the test features of every two checkpoints: (a, b, CKA).
    pub cka: Vec<(String, String, f64)>,
    /// LCA and cophenetic similarity of the Ward trees of every two checkpoints' test features.
    pub trees: Vec<(String, String, ssl_eval::TreeSimilarity)>,
}

/// Evaluates `sources` and writes `eval.json`, `knn.csv` and `pca.png` into `out`.
pub fn evaluate(sources: &[Source], suite: &SuiteConfig, out: &Path) -> Result<Report> {
    suite.validate()?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let bar = ssl_core::progress::bar(
        sources.len() as u64,
        "{spinner} evaluating [{bar:30}] {pos}/{len} {msg}",
    );
    let mut columns = Vec::new();
    let mut probes = Vec::new();
    let mut embedded = Vec::new();
    let mut panels = Vec::new();
    for source in sources {
        bar.set_message(source.label.clone());
        let device = setup::device(&source.cfg.train.device)?;
        let data = setup::data(&source.cfg)?;
        let model = model::build_model(&source.cfg, &data, &device)?;
        let weights = ssl_train::checkpoint::load_tensors(&source.weights)?;
        ssl_train::export::load_encoder(&model.store, &weights)?;
        let has_probe = load_online_probe(&model, &weights)?;
        let features = cached_features(source, &data, &model, &device)?;
        let (mut column, probe) = column(source, &features, &data, &model, &device, suite)?;
        probes.push(probe);
        if has_probe && suite.wants(MetricSet::Probe) {
            let accuracy = online_probe_accuracy_of(&model, &features, &device)?;
            column
                .metrics
                .insert("online_probe_recomputed".into(), accuracy);
        }
        columns.push(column);
        let projected = ssl_eval::pca_2d(&features.test)?;
        panels.push(ScatterPanel {
            title: source.label.clone(),
            points: (0..projected.n)
                .map(|i| {
                    let p = projected.row(i);
                    (f64::from(p[0]), f64::from(p[1]), features.test_y[i])
                })
                .collect(),
        });
        embedded.push(features);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut cka = Vec::new();
    let mut trees = Vec::new();
    for (i, a) in embedded.iter().enumerate() {
        for (j, b) in embedded.iter().enumerate().skip(i + 1) {
            if !(suite.wants(MetricSet::Cka) || suite.wants(MetricSet::Tree)) {
                continue;
            }
            anyhow::ensure!(
                a.test_y == b.test_y,
                "CKA and tree similarity compare features of the same images: {} and {} were \
                 evaluated on different test sets (check data.* in their configs)",
                sources[i].label,
                sources[j].label
            );
            let pair = (sources[i].label.clone(), sources[j].label.clone());
            if suite.wants(MetricSet::Cka) {
                let value = ssl_eval::linear_cka(&a.test, &b.test)?;
                cka.push((pair.0.clone(), pair.1.clone(), value));
            }
            if suite.wants(MetricSet::Tree) {
                trees.push((pair.0, pair.1, ssl_eval::tree_similarity(&a.test, &b.test)?));
            }
        }
    }
    let report = Report {
        columns,
        cka,
        trees,
    };
    write_outputs(&report, &probes, &panels, out)?;
    Ok(report)
}

fn column(
    source: &Source,
    f: &Embedded,
    data: &DataSplit,
    model: &Model,
    device: &Device,
    suite: &SuiteConfig,
) -> Result<(Column, Option<SgdProbeRecord>)> {
    let mut column = Column {
        label: source.label.clone(),
        weights: source.weights.clone(),
        ..Column::default()
    };
    let metrics = &mut column.metrics;
    let mut sgd_record = None;
    if suite.wants(MetricSet::Probe) {
        // The L-BFGS probe's C, or `None` for the SGD probe.
        let (probe, c) = match suite.probe {
            ProbeKind::Lbfgs => {
                let c = match suite.probe_c {
                    Some(c) => c,
                    None => {
                        let grid = ssl_eval::DEFAULT_C_GRID;
                        let seed = source.cfg.train.seed;
                        ssl_eval::select_c(&f.train, &f.train_y, &grid, 0.2, seed)?.c
                    }
                };
                let probe = ssl_eval::linear_probe(
                    &f.train,
                    &f.train_y,
                    &f.test,
                    &f.test_y,
                    &ssl_eval::LinearProbeConfig {
                        c,
                        ..Default::default()
                    },
                )?;
                (probe, Some(c))
            }
            ProbeKind::Sgd => {
                let outcome = crate::sgd_probe::train_and_score(
                    model.encoder.as_ref(),
                    data,
                    &f.test,
                    &f.test_y,
                    &suite.sgd_probe,
                    source.cfg.train.seed,
                    device,
                )?;
                sgd_record = Some(outcome.record);
                (outcome.result, None)
            }
        };
        metrics.insert("probe_balanced_accuracy".into(), probe.balanced_accuracy);
        metrics.insert("probe_accuracy".into(), probe.accuracy);
        column.probe_c = c;
        let data_cfg = &source.cfg.data;
        let task = match data_cfg.name {
            DataSource::MedMnist(info) => Some(info.task),
            _ => data_cfg.task,
        };
        if let Some(task) = task {
            let classes = data.dataset.num_classes;
            let official = match (&data.findings, c) {
                (Some(findings), Some(c)) => Some((
                    findings.rows(&data.test),
                    finding_scores(f, findings, data, c)?,
                    findings.columns,
                )),
                (Some(_), None) => {
                    eprintln!(
                        "note: no MedMNIST ACC/AUC for {} with --probe sgd: a multi-label set's \
                         per-finding probes are L-BFGS ones",
                        source.label
                    );
                    None
                }
                (None, _) => Some((f.test_y.clone(), class_scores(&probe, classes), classes)),
            };
            if let Some((labels, scores, columns)) = official {
                match ssl_eval::medmnist_metrics(task, &labels, &scores, columns) {
                    Ok(official) => {
                        metrics.insert("medmnist_acc".into(), official.acc);
                        metrics.insert("medmnist_auc".into(), official.auc);
                    }
                    // A class or finding absent from the test images (a subset, a stand-in
                    // file): the official AUC is undefined there, as in scikit-learn; ACC is not.
                    Err(undefined) => {
                        let acc = ssl_eval::medmnist_acc(task, &labels, &scores, columns)
                            .context("MedMNIST ACC of the probe")?;
                        metrics.insert("medmnist_acc".into(), acc);
                        eprintln!("note: no MedMNIST AUC for {}: {undefined:#}", source.label);
                    }
                }
            }
        }
        if let Some(online) = source.online_probe {
            metrics.insert("online_probe_accuracy".into(), online);
        }
    }
    if suite.wants(MetricSet::Knn) {
        let sweep = ssl_eval::knn_sweep(
            &f.train,
            &f.train_y,
            &f.test,
            &f.test_y,
            &ssl_eval::SWEEP_KS,
            &ssl_eval::SWEEP_TEMPERATURES,
        )?;
        let cfg = &source.cfg.eval;
        if let Some(cell) = sweep
            .cells()
            .iter()
            .find(|c| c.k == cfg.knn_k && (c.t - cfg.knn_t).abs() < 1e-12)
        {
            metrics.insert("knn_accuracy".into(), cell.accuracy);
            column.knn_at = Some((cell.k, cell.t));
        }
        let best = sweep.best();
        metrics.insert("knn_best_accuracy".into(), best.accuracy);
        column.knn_best = Some((best.k, best.t));
        column.knn_sweep = sweep
            .cells()
            .iter()
            .map(|c| (c.k, c.t, c.accuracy))
            .collect();
    }
    let standardized = ssl_eval::standardize(&f.test);
    if suite.wants(MetricSet::Rankme) {
        metrics.insert(
            "rankme".into(),
            ssl_eval::rankme(&standardized, ssl_eval::RANKME_EPS)?,
        );
    }
    if suite.wants(MetricSet::EffectiveRank) {
        metrics.insert(
            "effective_rank".into(),
            ssl_eval::effective_rank(&standardized)?,
        );
    }
    if suite.wants(MetricSet::Lidar) || suite.wants(MetricSet::Alignment) {
        let views = augmented_views(source, data, model, device, suite)?;
        if suite.wants(MetricSet::Lidar) {
            metrics.insert(
                "lidar".into(),
                ssl_eval::lidar(&views, ssl_eval::LidarConfig::default())?,
            );
        }
        if suite.wants(MetricSet::Alignment) {
            metrics.insert(
                "view_alignment".into(),
                ssl_eval::alignment(&views[0], &views[1])?,
            );
        }
    }
    if suite.wants(MetricSet::Uniformity) {
        metrics.insert("uniformity".into(), ssl_eval::uniformity(&f.test)?);
    }
    if suite.wants(MetricSet::Kmeans) {
        let mut classes = f.train_y.clone();
        classes.sort_unstable();
        classes.dedup();
        let scores = ssl_eval::clustering_scores(
            &f.train,
            None,
            &f.test,
            &f.test_y,
            classes.len(),
            KMEANS_RESTARTS,
            source.cfg.train.seed,
        )?
        .val;
        metrics.insert("kmeans_nmi".into(), scores.nmi);
        metrics.insert("kmeans_ami".into(), scores.ami);
        metrics.insert("kmeans_ari".into(), scores.ari);
    }
    if suite.wants(MetricSet::Hierarchy) {
        let builtin;
        let hierarchy = match (&suite.hierarchy, source.cfg.data.name) {
            (Some(h), _) => h,
            (None, DataSource::Digits) => {
                builtin = ssl_eval::ClassHierarchy::parse(DIGITS_HIERARCHY)?;
                &builtin
            }
            (None, other) => bail!(
                "the hierarchical Rand index needs a class hierarchy for `{other}`; give one with \
                 --hierarchy FILE (format: configs/digits-hierarchy.yaml)"
            ),
        };
        column.rand_index = ssl_eval::hierarchical_rand_index(
            &f.test,
            hierarchy,
            &f.test_y,
            source.cfg.train.seed,
        )?;
    }
    if suite.wants(MetricSet::Silhouette) {
        metrics.insert(
            "silhouette".into(),
            ssl_eval::silhouette(&f.test, &f.test_y)?,
        );
    }
    Ok((column, sgd_record))
}

/// `q` augmented views (the run's training augmentation) of the first `n` training instances,
/// embedded in eval mode: `q` matrices `n × d`, row `x` of each is instance `x`.
fn augmented_views(
    source: &Source,
    data: &DataSplit,
    model: &Model,
    device: &Device,
    suite: &SuiteConfig,
) -> Result<Vec<Features>> {
    let n = suite.lidar_samples.min(data.train.len());
    let q = suite.lidar_views;
    // One view of every sample at a time (the loader's "epoch" v draws view v), so memory
    // holds n images, not n·q.
    let loader = ssl_data::ViewLoader::new(
        data.dataset.clone(),
        data.train.clone(),
        n,
        1,
        false,
        source.cfg.train.seed,
        source.cfg.data.view_types(&data.dataset.shape)?.views,
    )?;
    let ids: Vec<u32> = (0..n as u32).collect();
    let mut shape = vec![n];
    shape.extend(&data.dataset.shape);
    (0..q)
        .map(|v| {
            let batch = loader.make_batch(v, &ids);
            let x = Tensor::from_slice(batch.view(0), shape.as_slice(), device)?;
            to_features(&model.features(&x)?)
        })
        .collect()
}

/// Train and test features of `source`, from the cache when its weights and data settings are
/// unchanged, else embedded now and cached (when the directory is writable).
fn cached_features(
    source: &Source,
    data: &DataSplit,
    model: &Model,
    device: &Device,
) -> Result<Embedded> {
    let path = cache_path(source)?;
    if let Ok(tensors) = candle_core::safetensors::load(&path, &Device::Cpu) {
        if let Some(embedded) = from_cache(&tensors) {
            return Ok(embedded);
        }
    }
    let (train, test) = ssl_train::evaluate::clean_inputs(data, device);
    let embedded = Embedded {
        train: to_features(&model.embed(&train.x)?)?,
        train_y: train.y,
        test: to_features(&model.embed(&test.x)?)?,
        test_y: test.y,
    };
    // Where the weights' directory is read-only, nothing is cached: the next evaluation embeds
    // again.
    let writable = path
        .parent()
        .is_some_and(|dir| std::fs::create_dir_all(dir).is_ok());
    if writable {
        ssl_train::checkpoint::save_tensors(&path, &to_cache(&embedded)?).ok();
    }
    Ok(embedded)
}

/// `DIR/features/<key>.safetensors` beside the weights; the key mixes the weights file's size and
/// modification time with the data settings and the evaluated encoder (`eval.encoder`).
fn cache_path(source: &Source) -> Result<PathBuf> {
    let meta = std::fs::metadata(&source.weights)
        .with_context(|| format!("cannot read {}", source.weights.display()))?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    let data = serde_yaml::to_string(&source.cfg.data)?;
    let mut words = vec![meta.len(), modified];
    words.extend(data.bytes().map(u64::from));
    // The student's key is the one it had before a run could evaluate its teacher.
    if source.cfg.eval.encoder != EvaluatedEncoder::Student {
        words.extend(source.cfg.eval.encoder.name().bytes().map(u64::from));
    }
    let key = ssl_data::mix_seed(&words);
    let dir = source.weights.parent().unwrap_or(Path::new("."));
    Ok(dir.join("features").join(format!("{key:016x}.safetensors")))
}

fn to_cache(e: &Embedded) -> Result<HashMap<String, Tensor>> {
    let cpu = Device::Cpu;
    let matrix = |f: &Features| Tensor::from_slice(&f.data, (f.n, f.d), &cpu);
    Ok(HashMap::from([
        ("train".to_string(), matrix(&e.train)?),
        ("test".to_string(), matrix(&e.test)?),
        (
            "train_labels".to_string(),
            Tensor::new(e.train_y.as_slice(), &cpu)?,
        ),
        (
            "test_labels".to_string(),
            Tensor::new(e.test_y.as_slice(), &cpu)?,
        ),
    ]))
}

fn from_cache(t: &HashMap<String, Tensor>) -> Option<Embedded> {
    let features = |name: &str| to_features(t.get(name)?).ok();
    let labels = |name: &str| t.get(name)?.to_vec1::<u32>().ok();
    Some(Embedded {
        train: features("train")?,
        train_y: labels("train_labels")?,
        test: features("test")?,
        test_y: labels("test_labels")?,
    })
}

/// Writes `eval.json` (the report; a column scored by the SGD probe also carries its record as
/// `probe`), `knn.csv` and `pca.png`.
fn write_outputs(
    report: &Report,
    probes: &[Option<SgdProbeRecord>],
    panels: &[ScatterPanel],
    out: &Path,
) -> Result<()> {
    let mut value = serde_json::to_value(report)?;
    if let Some(columns) = value["columns"].as_array_mut() {
        for (column, probe) in columns.iter_mut().zip(probes) {
            if let (Some(column), Some(probe)) = (column.as_object_mut(), probe) {
                column.insert("probe".into(), serde_json::to_value(probe)?);
            }
        }
    }
    let json = serde_json::to_string_pretty(&value)?;
    atomic::write(&out.join("eval.json"), json.as_bytes())?;
    let mut csv = String::from("checkpoint,k,T,accuracy\n");
    for c in &report.columns {
        for (k, t, acc) in &c.knn_sweep {
            csv.push_str(&format!("{},{k},{t},{acc}\n", c.label));
        }
    }
    atomic::write(&out.join("knn.csv"), csv.as_bytes())?;
    scatter_panels(&out.join("pca.png"), panels)
}

/// The report as a Markdown table: one row per metric, one column per checkpoint, in the
/// catalogue's order, then the probe's C, the k-NN cells and the Rand index by level; then the
/// CKA and tree pairs.
pub fn table(report: &Report) -> String {
    let columns = &report.columns;
    let mut text = String::from("| metric |");
    for c in columns {
        text.push_str(&format!(" {} |", c.label));
    }
    text.push_str(&format!("\n|---|{}\n", "---|".repeat(columns.len())));
    let mut row = |title: &str, cell: &dyn Fn(&Column) -> Option<String>| {
        if columns.iter().all(|c| cell(c).is_none()) {
            return;
        }
        text.push_str(&format!("| {title} |"));
        for c in columns {
            text.push_str(&format!(" {} |", cell(c).as_deref().unwrap_or("–")));
        }
        text.push('\n');
    };
    for metric in RUN_METRICS.iter().chain(&SUITE_METRICS) {
        row(metric.title, &|c| {
            c.metrics.get(metric.key).map(|&v| metric.show(v))
        });
    }
    row("probe C", &|c| c.probe_c.map(|v| v.to_string()));
    row("k-NN k, T", &|c| c.knn_at.map(|(k, t)| format!("{k}, {t}")));
    row("k-NN best k, T", &|c| {
        c.knn_best.map(|(k, t)| format!("{k}, {t}"))
    });
    let levels = columns
        .iter()
        .map(|c| c.rand_index.len())
        .max()
        .unwrap_or(0);
    for level in 0..levels {
        let clusters = columns
            .iter()
            .find_map(|c| c.rand_index.get(level))
            .map_or(0, |l| l.clusters);
        row(
            &format!("Rand index, level {} ({clusters} clusters)", level + 1),
            &|c| {
                c.rand_index
                    .get(level)
                    .map(|l| format!("{:.3}", l.rand_index))
            },
        );
    }
    for (a, b, v) in &report.cka {
        text.push_str(&format!("\nlinear CKA({a}, {b}) = {v:.4}"));
    }
    for (a, b, t) in &report.trees {
        text.push_str(&format!(
            "\nWard trees of {a} and {b}: LCA Pearson {:.3}, Spearman {:.3}, Kendall τ-b {:.3}; \
             cophenetic D1→P2 {:.3}, D2→P1 {:.3}",
            t.lca_pearson, t.lca_spearman, t.lca_kendall, t.cophenetic_d1_p2, t.cophenetic_d2_p1
        ));
    }
    text
}

/// The probe's test probabilities as a row-major `n × classes` matrix (a class the training
/// partition lacks scores 0).
fn class_scores(probe: &ssl_eval::ProbeResult, classes: usize) -> Vec<f64> {
    let mut scores = vec![0.0; probe.probabilities.len() * classes];
    for (row, p) in scores.chunks_exact_mut(classes).zip(&probe.probabilities) {
        for (&class, &value) in probe.classes.iter().zip(p) {
            row[class as usize] = value;
        }
    }
    scores
}

/// Scores of a multi-label data set, `n_test × findings`: for each finding, a binary linear
/// probe (at the single-label probe's C) trained on its train flags, and its P(finding) on the
/// test features, as MedMNIST scores ChestMNIST (mean per-finding AUC, ACC at 0.5).
fn finding_scores(f: &Embedded, findings: &Findings, data: &DataSplit, c: f64) -> Result<Vec<f64>> {
    let (train, test) = (findings.rows(&data.train), findings.rows(&data.test));
    let k = findings.columns;
    let mut scores = vec![0.0; f.test_y.len() * k];
    for j in 0..k {
        let flag = |rows: &[u32]| -> Vec<u32> { rows.iter().skip(j).step_by(k).copied().collect() };
        let y = flag(&train);
        ensure!(
            y.contains(&0) && y.contains(&1),
            "finding {j} is {} in every training image, so its probe cannot be fitted; train on \
             more images (data.train_size)",
            y.first().copied().unwrap_or(0)
        );
        let probe = ssl_eval::linear_probe(
            &f.train,
            &y,
            &f.test,
            &flag(&test),
            &ssl_eval::LinearProbeConfig {
                c,
                ..Default::default()
            },
        )?;
        for (row, p) in scores
            .chunks_exact_mut(k)
            .zip(class_scores(&probe, 2).chunks_exact(2))
        {
            row[j] = p[1];
        }
    }
    Ok(scores)
}

/// Sets the model's online probe from a run checkpoint's `probe.*` weights; `false` when the
/// weights have none (an export, or a run trained without the probe).
fn load_online_probe(model: &Model, weights: &HashMap<String, Tensor>) -> Result<bool> {
    let vars = model.store.vars_with_prefix("probe.");
    if model.probe.is_none() || vars.iter().any(|(name, _)| !weights.contains_key(name)) {
        return Ok(false);
    }
    for (name, var) in vars {
        ssl_train::export::assign(&var, &weights[&name], &name)?;
    }
    Ok(true)
}

/// Top-1 accuracy of the checkpoint's own online probe on the frozen test features: what the
/// run logged at its last evaluation, recomputed from the weights.
fn online_probe_accuracy_of(model: &Model, f: &Embedded, device: &Device) -> Result<f64> {
    let matrix = |f: &Features| Tensor::from_slice(&f.data, (f.n, f.d), device);
    let predictions = model
        .probe_predictions(&matrix(&f.test)?, &matrix(&f.train)?)?
        .context("the model has no online probe")?;
    let correct = predictions
        .iter()
        .zip(&f.test_y)
        .filter(|(p, y)| p == y)
        .count();
    Ok(correct as f64 / f.test_y.len() as f64)
}

/// The last `online_probe_accuracy` in a run's `metrics.jsonl`, if any.
pub fn online_probe_accuracy(run_dir: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(run_dir.join("metrics.jsonl")).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v.get("online_probe_accuracy")?.as_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's student and EMA teacher are embedded and cached apart: BYOL after one epoch,
    /// the student evaluated first, then the teacher through `eval.encoder`, whose features
    /// must not come from the student's cache; read again, the teacher's come from its own.
    #[test]
    fn the_teacher_s_features_are_cached_apart_from_the_student_s() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RunConfig::builder()
            .objective("byol")
            .epochs(1)
            .set("train.probe_lr", 0.0)
            .out(dir.path())
            .build()
            .unwrap();
        let outcome = ssl_train::Trainer::new(cfg.clone())
            .start(ssl_train::Start::Overwrite)
            .fit()
            .unwrap();
        let source = |encoder| {
            let mut cfg = cfg.clone();
            cfg.eval.encoder = encoder;
            Source {
                label: String::new(),
                cfg,
                weights: outcome
                    .dir
                    .join("checkpoint")
                    .join(ssl_train::checkpoint::MODEL),
                online_probe: None,
            }
        };
        let data = setup::data(&cfg).unwrap();
        let embedded = |source: &Source| {
            let model = model::build_model(&source.cfg, &data, &Device::Cpu).unwrap();
            let weights = ssl_train::checkpoint::load_tensors(&source.weights).unwrap();
            ssl_train::export::load_encoder(&model.store, &weights).unwrap();
            cached_features(source, &data, &model, &Device::Cpu)
                .unwrap()
                .test
                .data
        };
        let (student, teacher) = (
            source(EvaluatedEncoder::Student),
            source(EvaluatedEncoder::Teacher),
        );
        let student_features = embedded(&student);
        let teacher_features = embedded(&teacher);
        assert_ne!(cache_path(&student).unwrap(), cache_path(&teacher).unwrap());
        assert!(cache_path(&teacher).unwrap().exists());
        assert_ne!(student_features, teacher_features);
        assert_eq!(embedded(&teacher), teacher_features);
    }

    #[test]
    fn every_metric_set_parses_back_and_an_unknown_one_lists_them() -> Result<()> {
        for set in MetricSet::ALL {
            assert_eq!(MetricSet::parse(set.key())?, set);
        }
        let e = MetricSet::parse("accuracy").unwrap_err().to_string();
        assert!(
            e.contains("unknown metric `accuracy`; known: probe, knn,") && e.ends_with("tree"),
            "{e}"
        );
        Ok(())
    }

    /// Each metric's key and title exist once: the suite's own do not repeat the run's.
    #[test]
    fn the_suite_s_metrics_and_the_run_s_share_no_key_or_title() {
        let all: Vec<&Metric> = RUN_METRICS.iter().chain(&SUITE_METRICS).collect();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(a.key != b.key && a.title != b.title, "{a:?} and {b:?}");
            }
        }
    }

    /// The table shows each metric under its catalogue title, in the catalogue's order, the
    /// probe's C and k-NN's cells as found, and a dash where a column lacks a value.
    #[test]
    fn the_table_reads_titles_from_the_catalogue() {
        let column = |label: &str, probe: f64| Column {
            label: label.into(),
            metrics: BTreeMap::from([
                ("rankme".to_string(), 12.31),
                ("probe_balanced_accuracy".to_string(), probe),
            ]),
            probe_c: Some(0.01),
            knn_best: Some((20, 0.07)),
            ..Column::default()
        };
        let mut b = column("b", 0.5);
        b.metrics.insert("lidar".into(), 3.0);
        let report = Report {
            columns: vec![column("a", 0.875), b],
            cka: vec![],
            trees: vec![],
        };
        let table = table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| metric | a | b |");
        assert_eq!(
            lines[2],
            "| linear probe (balanced acc.) | 87.5 % | 50.0 % |"
        );
        assert_eq!(lines[3], "| RankMe | 12.3 | 12.3 |");
        assert_eq!(lines[4], "| LiDAR | – | 3.0 |");
        assert_eq!(lines[5], "| probe C | 0.01 | 0.01 |");
        assert_eq!(lines[6], "| k-NN best k, T | 20, 0.07 | 20, 0.07 |");
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn suite_settings_are_checked_before_anything_is_embedded() {
        let refused = |suite: SuiteConfig| format!("{:#}", suite.validate().unwrap_err());
        SuiteConfig::default().validate().unwrap();
        let e = refused(SuiteConfig {
            lidar_views: 1,
            ..SuiteConfig::default()
        });
        assert!(
            e.contains("LiDAR needs at least 2 samples with 2 views each"),
            "{e}"
        );
        for c in [0.0, -1.0, f64::NAN] {
            let e = refused(SuiteConfig {
                probe_c: Some(c),
                ..SuiteConfig::default()
            });
            assert!(e.contains("--probe-c must be > 0"), "{c}: {e}");
        }
        let e = refused(SuiteConfig {
            probe_c: Some(1.0),
            probe: ProbeKind::Sgd,
            ..SuiteConfig::default()
        });
        assert!(e.contains("--probe sgd has none"), "{e}");
        let e = refused(SuiteConfig {
            probe: ProbeKind::Sgd,
            sgd_probe: SgdProbeConfig {
                epochs: 0,
                ..SgdProbeConfig::default()
            },
            ..SuiteConfig::default()
        });
        assert!(e.contains("--probe-epochs must be at least 1"), "{e}");
    }
}
