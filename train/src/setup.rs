//! Builds what a configuration names: device, data set and split, encoder, projector.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use candle_core::{Device, DeviceLocation, Tensor};
use candle_nn::VarBuilder;
use ssl_data::{DataSource, Dataset, Normalization};
use ssl_models::{
    DigitsCnn, Encoder, EncoderSpec, Mlp, Projector, ResNet, ResNetConfig, VisionTransformer,
};

use crate::config::{RunConfig, TrainingSplit};

/// The device named by `--device`.
pub fn device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        n if n == "cuda" || n.starts_with("cuda:") => {
            let ordinal = match n.split_once(':') {
                Some((_, i)) => i
                    .parse()
                    .with_context(|| format!("--device {n}: `{i}` is not a GPU index"))?,
                None => 0,
            };
            let device = Device::new_cuda(ordinal).with_context(|| {
                format!("--device {n}: CUDA is unavailable; build with `--features cuda` on a machine with a GPU")
            })?;
            Ok(untracked(device))
        }
        "metal" => Device::new_metal(0).context(
            "--device metal: Metal is unavailable; build with `--features metal` on macOS",
        ),
        other => bail!("unknown device `{other}`; use cpu, cuda[:N] or metal"),
    }
}

/// The device a rank of `comm` trains on: the one `comm` is bound to (NCCL: `cuda:<local
/// rank>`, which `name` must then be: `cuda`, or `cuda:N` with that N), else [`device`]`(name)`.
pub fn rank_device(name: &str, comm: &dyn ssl_dist::Comm) -> Result<Device> {
    let Some(bound) = comm.device() else {
        return device(name);
    };
    if let DeviceLocation::Cuda { gpu_id } = bound.location() {
        if name != "cuda" && name != format!("cuda:{gpu_id}") {
            bail!(
                "--distributed nccl: rank {} trains on cuda:{gpu_id}, the GPU of its local rank, \
                 but the device asked for is `{name}`; use --device cuda (every rank then takes \
                 its own GPU)",
                comm.rank()
            );
        }
    }
    Ok(untracked(bound.clone()))
}

/// `device`, on CUDA with cudarc's event tracking off for the buffers allocated from here on.
///
/// cudarc gives every buffer a read and a write event, created and destroyed with it (four
/// driver calls a tensor), which it records and waits for only once its context runs more than
/// one stream of cudarc's making (`CudaContext::new_stream`, `CudaStream::fork`). Nothing here
/// makes one: Candle issues its work on the per-thread default stream, and the NCCL back end's
/// second stream is the driver's, wrapped, and ordered by events of its own. So the events are
/// never used, and turning them off takes those calls out of nearly every op of a step (about
/// one allocation per kernel launch) without ordering anything differently.
fn untracked(device: Device) -> Device {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = &device {
        // SAFETY: cudarc's conditions for work on more than one stream: the only other stream
        // is NCCL's (`ssl_dist`), whose all-reduces wait for an event recorded after their bucket
        // is written on Candle's stream, write only the sum Candle's stream reads after waiting
        // for their last event, and whose buckets are freed only after that wait.
        unsafe { cuda.disable_event_tracking() };
    }
    device
}

/// The data set and its stratified train/test split (positions into the data set; for MedMNIST
/// the official train, val and test splits follow each other, so training positions are indices
/// into the official train split). A run records it as `split.json`, the manifest that
/// reproduces its subsets; `seed` redraws the same ones.
#[derive(serde::Serialize)]
pub struct DataSplit {
    #[serde(skip)]
    pub dataset: Arc<Dataset>,
    /// The seed that drew the split and subsets (`data.split_seed`, else the run seed).
    pub seed: u64,
    pub train: Vec<usize>,
    pub test: Vec<usize>,
    /// Images without labels that pretraining draws from besides `train` (STL-10's, under
    /// `data.split: train+unlabeled`); never evaluated on, nor given to the online probe.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unlabeled: Vec<usize>,
    /// Classes subsampled by `data.imbalance` (empty when balanced).
    pub minority_classes: Vec<u32>,
    /// Files of a folder of scans left out under `data.skip_bad`, each with the reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Normalisation of the encoder's inputs (the training views get it from their recipe).
    pub normalize: Normalization,
    /// A multi-label data set's flags (ChestMNIST's 14 findings), whose `dataset.labels` say
    /// only whether an image has any.
    #[serde(skip)]
    pub findings: Option<Arc<Findings>>,
}

impl DataSplit {
    /// The positions pretraining draws from: `train`, then `unlabeled`.
    pub fn pretraining(&self) -> Vec<usize> {
        self.train.iter().chain(&self.unlabeled).copied().collect()
    }

    /// A training split of `instances` samples of `shape` that holds no pixels (labels
    /// `i mod 10`), for benches and tests that draw their own inputs: only its shape, size and
    /// labels are read.
    pub fn shape_only(shape: &[usize], instances: usize) -> Self {
        let dataset = Dataset {
            name: "shape-only".into(),
            samples: ssl_data::Samples::F32(Vec::new()),
            labels: (0..instances as u32).map(|i| i % 10).collect(),
            shape: shape.to_vec(),
            num_classes: 10,
        };
        Self {
            dataset: Arc::new(dataset),
            seed: 0,
            train: (0..instances).collect(),
            test: Vec::new(),
            unlabeled: Vec::new(),
            minority_classes: Vec::new(),
            skipped: Vec::new(),
            normalize: Normalization::None,
            findings: None,
        }
    }
}

/// The 0/1 flags of a multi-label data set, row `i` for sample `i`, row-major.
pub struct Findings {
    pub columns: usize,
    pub matrix: Vec<u32>,
}

impl Findings {
    /// The rows of the samples at `positions`, row-major `positions.len() × columns`.
    pub fn rows(&self, positions: &[usize]) -> Vec<u32> {
        positions
            .iter()
            .flat_map(|&i| &self.matrix[i * self.columns..(i + 1) * self.columns])
            .copied()
            .collect()
    }
}

/// Loads the configured data set, splits it (by `data.split_seed`, else the run seed; the seed
/// also draws the synthetic mixture; MedMNIST keeps its official train and test splits) and
/// narrows the partitions as configured, in this order: classes, the stratified N-subset of
/// the training partition, its own train/test partition, class imbalance (training only).
pub fn data(cfg: &RunConfig) -> Result<DataSplit> {
    split(cfg, None)
}

/// [`data`] of samples given in memory ([`crate::OwnImages`]) in place of `data.name`'s: the
/// labelled ones split into train and test by `data.test_fraction`, then narrowed as
/// configured; the last `unlabelled` join the pretraining only.
pub fn own_data(cfg: &RunConfig, dataset: Dataset, unlabelled: usize) -> Result<DataSplit> {
    check_unlabelled(cfg, unlabelled, "images")?;
    split(cfg, Some((dataset, unlabelled)))
}

/// Samples without a label join the pretraining only, which the online probe (it learns from
/// labels) cannot: such a run needs `train.probe_lr=0`. `what` names the samples.
pub fn check_unlabelled(cfg: &RunConfig, unlabelled: usize, what: &str) -> Result<()> {
    ensure!(
        unlabelled == 0 || cfg.train.probe_lr == 0.0,
        "{unlabelled} of the {what} have no label and join the pretraining, which the online \
         probe cannot learn from; set train.probe_lr=0 (the end-of-run probe and k-NN use the \
         labelled {what})"
    );
    Ok(())
}

fn split(cfg: &RunConfig, own: Option<(Dataset, usize)>) -> Result<DataSplit> {
    let seed = cfg.data.split_seed.unwrap_or(cfg.train.seed);
    let mut findings = None;
    let mut unlabeled = Vec::new();
    let mut skipped = Vec::new();
    let (dataset, mut train, mut test) = match own {
        Some((dataset, unlabelled_count)) => {
            let labelled = dataset.len() - unlabelled_count;
            let (train, test) = ssl_data::stratified_split(
                &dataset.labels[..labelled],
                cfg.data.test_fraction,
                seed,
            )
            .context("data.test_fraction")?;
            unlabeled = (labelled..dataset.len()).collect();
            (dataset, train, test)
        }
        None => match cfg.data.scan_options() {
            Some(options) if cfg.data.name == DataSource::Folder => {
                scan_folder(cfg, &options, seed, &mut unlabeled, &mut skipped)?
            }
            _ => load(cfg, seed, &mut unlabeled, &mut findings)?,
        },
    };
    if !cfg.data.classes.is_empty() {
        let keep = |part: &mut Vec<usize>| {
            part.retain(|&i| cfg.data.classes.contains(&dataset.labels[i]));
        };
        keep(&mut train);
        keep(&mut test);
        if let Some(missing) = cfg
            .data
            .classes
            .iter()
            .find(|&&c| c as usize >= dataset.num_classes)
        {
            bail!(
                "data.classes names class {missing}, but `{}` has classes 0..{}",
                cfg.data.name,
                dataset.num_classes - 1
            );
        }
    }
    if cfg.data.train_size > 0 {
        train = ssl_data::stratified_subset(&dataset.labels, &train, cfg.data.train_size, seed)
            .context("data.train_size")?;
    }
    if cfg.data.subset_test_fraction > 0.0 {
        let labels: Vec<u32> = train.iter().map(|&i| dataset.labels[i]).collect();
        let (inner_train, inner_test) =
            ssl_data::stratified_split(&labels, cfg.data.subset_test_fraction, seed)
                .context("data.subset_test_fraction")?;
        test = inner_test.iter().map(|&k| train[k]).collect();
        train = inner_train.iter().map(|&k| train[k]).collect();
    }
    let (train, minority_classes) =
        ssl_data::imbalanced_subset(&dataset.labels, &train, cfg.data.imbalance, seed)
            .context("data.imbalance")?;
    Ok(DataSplit {
        dataset: Arc::new(dataset),
        seed,
        train,
        test,
        unlabeled,
        minority_classes,
        skipped,
        normalize: cfg.data.normalization(),
        findings,
    })
}

/// The configured data set read from its source, with its train and test positions (and
/// STL-10's unlabeled ones and a multi-label file's findings, where there are).
fn load(
    cfg: &RunConfig,
    seed: u64,
    unlabeled: &mut Vec<usize>,
    findings: &mut Option<Arc<Findings>>,
) -> Result<(Dataset, Vec<usize>, Vec<usize>)> {
    Ok(match cfg.data.name {
        DataSource::Digits | DataSource::GaussianMixture => {
            let dataset = match cfg.data.name {
                DataSource::Digits => ssl_data::digits(cfg.data.size)?,
                _ => ssl_data::gaussian_mixture(seed),
            };
            let (train, test) =
                ssl_data::stratified_split(&dataset.labels, cfg.data.test_fraction, seed)?;
            (dataset, train, test)
        }
        DataSource::Folder => {
            let _loading = ssl_core::progress::spinner(
                "reading the image folder (decoded into the cache on first use)",
            );
            let folder = image_folder(cfg)?;
            match folder.train_len {
                Some(n) => {
                    let len = folder.dataset.len();
                    (folder.dataset, (0..n).collect(), (n..len).collect())
                }
                None => {
                    let (train, test) = ssl_data::stratified_split(
                        &folder.dataset.labels,
                        cfg.data.test_fraction,
                        seed,
                    )?;
                    (folder.dataset, train, test)
                }
            }
        }
        DataSource::Caltech256 => {
            let _loading = ssl_core::progress::spinner(
                "reading Caltech-256 (decoded into the cache on first use)",
            );
            let set = ssl_data::caltech256::load(
                &benchmark_root(cfg),
                cfg.data.size,
                cfg.data.keep_side,
                cfg.data.clutter,
                Some(&cache_dir().join("folders")),
            )
            .context("data.root")?;
            let (train, test) =
                ssl_data::stratified_split(&set.dataset.labels, cfg.data.test_fraction, seed)?;
            (set.dataset, train, test)
        }
        DataSource::Npz => {
            let Some(file) = &cfg.data.root else {
                bail!("data set `npz` needs its file: set data.root (or --data FILE.npz)");
            };
            let _loading = ssl_core::progress::spinner(format!(
                "reading {} (inflated into its image cache on first use)",
                file.display()
            ));
            let m = ssl_data::load_npz(file).context("data.root")?;
            ensure!(
                m.layout.size == cfg.data.size,
                "data.size is {}, but {} holds {side}-pixel images; set --size {side}",
                cfg.data.size,
                file.display(),
                side = m.layout.size
            );
            medmnist_split(m, findings)
        }
        DataSource::Archive(info) => {
            let _loading = ssl_core::progress::spinner(format!(
                "reading {} (decoded into its image cache on first use)",
                info.name
            ));
            let b =
                ssl_data::load_benchmark(info.name, &benchmark_root(cfg)).context("data.root")?;
            if cfg.data.split == TrainingSplit::TrainUnlabeled {
                *unlabeled = b.unlabeled.collect();
            }
            (b.dataset, b.train.collect(), b.test.collect())
        }
        DataSource::MedMnist(info) => {
            let _loading = ssl_core::progress::spinner(format!(
                "reading {} (inflated into its image cache on first use)",
                info.flag
            ));
            let m = medmnist(cfg, info).with_context(|| format!("data set `{}`", info.flag))?;
            medmnist_split(m, findings)
        }
    })
}

/// The folder or manifest of scans at `data.root`, read at full precision as `options` say
/// (docs/data.md, "Your own scans"), decoded into the cache on first use: its samples, their
/// train and test positions (as the manifest or `train/` and `val/` name them, else drawn by
/// `data.test_fraction`), its unlabelled ones and the files left out.
fn scan_folder(
    cfg: &RunConfig,
    options: &ssl_data::scans::ScanOptions,
    seed: u64,
    unlabeled: &mut Vec<usize>,
    skipped: &mut Vec<String>,
) -> Result<(Dataset, Vec<usize>, Vec<usize>)> {
    let Some(root) = &cfg.data.root else {
        bail!("data set `folder` needs its directory or manifest: set data.root (or --root PATH)");
    };
    let _loading = ssl_core::progress::spinner(format!(
        "reading the scans of {} (decoded into the cache on first use)",
        root.display()
    ));
    let volumes = cfg.data.volumes.unwrap_or(false);
    let collection = ssl_data::scans::scan(root, volumes).context("data.root")?;
    let set = ssl_data::scans::load_scans(&collection, options, Some(&cache_dir().join("scans")))
        .context("data.root")?;
    if !set.skipped.is_empty() {
        eprintln!(
            "warning: data.skip_bad: {} files left out (listed in split.json):",
            set.skipped.len()
        );
        for refused in &set.skipped {
            eprintln!("  {refused}");
        }
    }
    *skipped = set.skipped.iter().map(ToString::to_string).collect();
    check_unlabelled(cfg, set.unlabelled.len(), "scans")?;
    let labelled: Vec<usize> = (0..set.dataset.len())
        .filter(|i| set.unlabelled.binary_search(i).is_err())
        .collect();
    let (train, test): (Vec<usize>, Vec<usize>) = match set.splits.iter().any(Option::is_some) {
        true => labelled
            .iter()
            .partition(|&&i| set.splits[i] == Some(ssl_data::scans::Split::Train)),
        false => {
            let labels: Vec<u32> = labelled.iter().map(|&i| set.dataset.labels[i]).collect();
            let (train, test) = ssl_data::stratified_split(&labels, cfg.data.test_fraction, seed)
                .context("data.test_fraction")?;
            (
                train.iter().map(|&k| labelled[k]).collect(),
                test.iter().map(|&k| labelled[k]).collect(),
            )
        }
    };
    ensure!(
        !test.is_empty(),
        "no labelled scan is held out for the evaluation; give some manifest rows the split \
         `test` (or none, to draw data.test_fraction of them)"
    );
    *unlabeled = set.unlabelled;
    Ok((set.dataset, train, test))
}

/// A MedMNIST-layout file's data set with its official train and test splits (val unused), and
/// the findings of a multi-label file.
fn medmnist_split(
    m: ssl_data::MedMnist,
    findings: &mut Option<Arc<Findings>>,
) -> (Dataset, Vec<usize>, Vec<usize>) {
    let [train, _, test] = m.splits;
    if m.layout.multi_label {
        *findings = Some(Arc::new(Findings {
            columns: m.layout.label_columns(),
            matrix: m.label_matrix,
        }));
    }
    (m.dataset, train.collect(), test.collect())
}

/// The image folder at `data.root` (required), decoded at `data.size` (kept at shorter side
/// `data.keep_side` when set).
fn image_folder(cfg: &RunConfig) -> Result<ssl_data::ImageFolder> {
    let Some(root) = &cfg.data.root else {
        bail!("data set `folder` needs its directory: set data.root (or --root PATH)");
    };
    let keep: Vec<String> = match cfg.data.folder_classes.as_slice() {
        [one] if one == "imagenet100" => ssl_data::IMAGENET100.map(String::from).to_vec(),
        names => names.to_vec(),
    };
    let cache = cache_dir().join("folders");
    ssl_data::load_image_folder_kept(
        root,
        cfg.data.size,
        cfg.data.keep_side,
        (!keep.is_empty()).then_some(&keep[..]),
        Some(&cache),
    )
    .context("data.root")
}

/// Where decoded image folders are cached: `$SSL_CACHE`, else [`ssl_data::user_cache`].
pub fn cache_dir() -> PathBuf {
    std::env::var_os("SSL_CACHE").map_or_else(ssl_data::user_cache, PathBuf::from)
}

/// Where the benchmark sets' archives (CIFAR, STL-10, Tiny ImageNet) and the extracted
/// Caltech-256 are looked for: `data.root`, else `~/.cache/candle-ssl/data`, where `ssl data
/// download` puts them.
pub fn benchmark_root(cfg: &RunConfig) -> PathBuf {
    cfg.data
        .root
        .clone()
        .unwrap_or_else(ssl_data::default_benchmark_root)
}

/// Where MedMNIST files are looked for: `data.root`, else the official package's `~/.medmnist`.
pub fn medmnist_root(cfg: &RunConfig) -> PathBuf {
    cfg.data
        .root
        .clone()
        .unwrap_or_else(ssl_data::default_medmnist_root)
}

/// The configured MedMNIST dataset. ChestMNIST's images are labelled by whether they have any
/// finding, the class that training and the run's table use; `ssl eval` scores its 14 findings.
fn medmnist(cfg: &RunConfig, info: &ssl_data::MedMnistInfo) -> Result<ssl_data::MedMnist> {
    info.md5_at(cfg.data.size)
        .with_context(|| format!("set the image size with --size {}", info.sizes()[0]))?;
    ssl_data::load_medmnist(&medmnist_root(cfg), info.flag, cfg.data.size)
}

/// The configured encoder under `vb` (its keys start there, e.g. `encoder.conv1.weight`).
pub fn encoder(cfg: &RunConfig, dataset: &Dataset, vb: VarBuilder) -> Result<Box<dyn Encoder>> {
    encoder_with_bn_momentum(cfg, dataset, Some(0.1), vb)
}

/// The encoder of `store` that `eval.encoder` names, for evaluation (the student's `encoder.…`
/// or the EMA teacher's `teacher.encoder.…`): its parameters handed out detached
/// ([`ssl_core::ParamStore::frozen_var_builder`]), so that a forward pass records no graph, as
/// under PyTorch's `no_grad`, and frees each activation once the next layer has read it (an
/// I-JEPA run on a ViT-T with 8 × 8 patches peaked at 17.6 GB with the graph kept, 6.9 GB
/// without: docs/performance.md). Views of the variables' storage: it computes what the
/// training encoder computes, with its weights as they are now.
pub fn eval_encoder(
    cfg: &RunConfig,
    dataset: &Dataset,
    store: &ssl_core::ParamStore,
    device: &Device,
) -> Result<Box<dyn Encoder>> {
    let vb = store
        .frozen_var_builder(device)
        .pp(cfg.eval.encoder.prefix().trim_end_matches('.'));
    encoder(cfg, dataset, vb)
}

/// The random-init baseline: the run's initial encoder (same seed, so the same weights, frozen
/// as [`eval_encoder`]'s) whose batch-norm running statistics are set to those of the clean
/// train images `x` (one train-mode pass, the statistics a cumulative average over its chunks:
/// the whole set's at once when it fits one chunk, as the digits do).
pub fn calibrated_random_encoder(
    cfg: &RunConfig,
    dataset: &Dataset,
    x: &CleanSamples,
    device: &Device,
) -> Result<Box<dyn Encoder>> {
    let store = ssl_core::ParamStore::new(cfg.train.seed);
    let vb = store.frozen_var_builder(device).pp("encoder");
    let encoder = encoder_with_bn_momentum(cfg, dataset, None, vb)?;
    x.encode(encoder.as_ref(), true)?;
    Ok(encoder)
}

/// Input values per forward pass of [`forward_in_chunks`]: 2²¹ (8 MiB of `f32`), i.e. the
/// whole digits set at once, 41 single-channel images at 224² (whose first convolution's
/// 32-channel output is then 260 MiB).
pub const CHUNK_VALUES: usize = 1 << 21;

/// `encoder` over `x`: `[n, …]` in chunks of at most [`CHUNK_VALUES`] input values, detached
/// (no gradient flows back), so memory does not grow with the data set. In train mode the
/// batch-norm statistics see one chunk at a time (the calibration pass uses a cumulative
/// average over them).
pub fn forward_in_chunks(encoder: &dyn Encoder, x: &Tensor, train: bool) -> Result<Tensor> {
    let n = x.dim(0)?;
    let per_sample = x.elem_count() / n.max(1);
    encode_chunks(encoder, n, per_sample, train, |start, len| {
        Ok(x.narrow(0, start, len)?)
    })
}

/// `encoder` over `n` samples of `per_sample` values, chunk `(start, len)` made by `chunk`.
fn encode_chunks(
    encoder: &dyn Encoder,
    n: usize,
    per_sample: usize,
    train: bool,
    chunk: impl Fn(usize, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    let most = (CHUNK_VALUES / per_sample.max(1)).max(1);
    // Equal chunks, so that no train-mode batch norm sees a lone leftover sample.
    let step = n.div_ceil(n.div_ceil(most).max(1)).max(1);
    let mut parts = Vec::new();
    for start in (0..n).step_by(step) {
        let x = chunk(start, step.min(n - start))?;
        // Detached: an output keeps its whole graph (every activation of the chunk) alive.
        parts.push(encoder.forward_t(&x, train)?.detach());
    }
    Ok(Tensor::cat(&parts, 0)?)
}

/// The clean (un-augmented, normalised) samples at `positions` of a split, read from the data
/// set a chunk at a time when encoded: a 224-px MedMNIST set stays in its memory-mapped
/// cache instead of being copied whole into `f32` tensors (four times its size).
pub struct CleanSamples<'a> {
    data: &'a DataSplit,
    positions: &'a [usize],
    device: Device,
}

impl<'a> CleanSamples<'a> {
    pub fn new(data: &'a DataSplit, positions: &'a [usize], device: &Device) -> Self {
        Self {
            data,
            positions,
            device: device.clone(),
        }
    }

    fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Bytes of the samples as one `f32` tensor.
    pub fn tensor_bytes(&self) -> usize {
        self.len() * self.data.dataset.sample_len() * 4
    }

    /// All the samples as one tensor `[n, sample shape…]`.
    pub fn tensor(&self) -> Result<Tensor> {
        samples(self.data, self.positions, &self.device)
    }

    /// `encoder`'s outputs `[n, F]`, detached, over chunks of at most [`CHUNK_VALUES`] values.
    pub fn encode(&self, encoder: &dyn Encoder, train: bool) -> Result<Tensor> {
        let per_sample = self.data.dataset.sample_len();
        encode_chunks(encoder, self.len(), per_sample, train, |start, len| {
            samples(self.data, &self.positions[start..start + len], &self.device)
        })
    }
}

fn encoder_with_bn_momentum(
    cfg: &RunConfig,
    dataset: &Dataset,
    bn_momentum: Option<f64>,
    vb: VarBuilder,
) -> Result<Box<dyn Encoder>> {
    let name = cfg.model.encoder.as_str();
    let shape = &dataset.shape;
    let needs = |rank: usize, what: &str| -> Result<usize> {
        match shape.len() == rank {
            true => Ok(shape[0]),
            false => bail!(
                "encoder {name} needs {what}, data set `{}` has samples of shape {shape:?}; \
                 use an encoder for its shape (`--set model.encoder=...`: {})",
                dataset.name,
                match shape.len() {
                    3 => "digits_cnn, resnet18, resnet34, resnet50, vit_s16, …",
                    4 => "resnet18_3d",
                    _ => "mlp",
                }
            ),
        }
    };
    let resnet = |depth: usize| -> Result<Box<dyn Encoder>> {
        let mut rc = ResNetConfig::new(depth, cfg.model.stem, needs(3, "images [C, H, W]")?)?;
        rc.zero_init_residual = cfg.model.zero_init_residual;
        rc.bn_momentum = bn_momentum;
        Ok(Box::new(ResNet::new(&rc, vb.clone())?))
    };
    if let Some(mut vit) = cfg.model.vit_config(cfg.data.size) {
        vit.in_channels = needs(3, "images [C, H, W]")?;
        return Ok(Box::new(VisionTransformer::new(&vit, vb)?));
    }
    Ok(match name {
        "digits_cnn" => Box::new(DigitsCnn::with_bn_momentum(
            needs(3, "images [C, H, W]")?,
            bn_momentum,
            vb,
        )?),
        "mlp" => Box::new(Mlp::new(dataset.sample_len(), &cfg.model.mlp, vb)?),
        "resnet18" => resnet(18)?,
        "resnet34" => resnet(34)?,
        "resnet50" => resnet(50)?,
        "resnet18_3d" => {
            let mut rc = ResNetConfig::resnet18_3d();
            rc.in_channels = needs(4, "volumes [C, D, H, W]")?;
            rc.zero_init_residual = cfg.model.zero_init_residual;
            rc.bn_momentum = bn_momentum;
            Box::new(ResNet::new(&rc, vb)?)
        }
        other => match ssl_models::find_encoder(other) {
            Some(registered) => (registered.build)(&EncoderSpec { input_shape: shape }, vb)
                .with_context(|| format!("building the registered encoder `{other}`"))?,
            None => bail!(
                "unknown encoder `{other}`; {}",
                crate::config::known_encoders()
            ),
        },
    })
}

/// The projector on top of an encoder of width `in_dim`.
pub fn projector(cfg: &RunConfig, in_dim: usize, vb: VarBuilder) -> Result<Projector> {
    Ok(Projector::new(in_dim, &cfg.model.projector, vb)?)
}

/// Un-augmented samples at `positions`, normalised as the training views are, as one tensor
/// `[n, sample shape…]`.
pub fn samples(data: &DataSplit, positions: &[usize], device: &Device) -> Result<Tensor> {
    let dataset = &data.dataset;
    let mut shape = vec![positions.len()];
    shape.extend(&dataset.shape);
    let mut values = ssl_data::clean_batch(dataset, positions);
    let channels = dataset.shape.first().copied().unwrap_or(1);
    for sample in values.chunks_mut(dataset.sample_len().max(1)) {
        data.normalize.apply(sample, channels);
    }
    Ok(Tensor::from_vec(values, shape, device)?)
}

/// Labels at `positions` as u32.
pub fn labels(dataset: &Dataset, positions: &[usize]) -> Vec<u32> {
    positions.iter().map(|&i| dataset.labels[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IConE protocol: a stratified N-subset of the train split, partitioned 80/20 by class,
    /// replacing the test split; the same seed draws the same manifest.
    #[test]
    fn the_subset_partition_is_disjoint_stratified_and_seeded() -> Result<()> {
        let mut cfg = RunConfig::default();
        cfg.data.train_size = 100;
        cfg.data.subset_test_fraction = 0.2;
        let split = data(&cfg)?;
        let full = data(&RunConfig::default())?;
        assert_eq!((split.train.len(), split.test.len()), (80, 20));
        let labels = &split.dataset.labels;
        for class in 0..10 {
            let count = |part: &[usize]| part.iter().filter(|&&i| labels[i] == class).count();
            assert_eq!((count(&split.train), count(&split.test)), (8, 2));
        }
        for i in split.train.iter().chain(&split.test) {
            assert!(full.train.contains(i), "{i} is not from the train split");
        }
        assert!(split.test.iter().all(|i| !split.train.contains(i)));
        let again = data(&cfg)?;
        assert_eq!((again.train, again.test), (split.train, split.test));
        Ok(())
    }
}
