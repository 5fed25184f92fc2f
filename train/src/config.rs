//! The run configuration: typed, with the main job's values as defaults, unknown keys rejected.
//!
//! Layering: defaults ← recipe YAML (`--config`) ← `--set key=value` ← plain flags.

use std::io::Read;
use std::ops::Bound::{Excluded, Unbounded};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, ensure, Context, Result};
use serde::{Deserialize, Serialize};
use ssl_data::scans::Intensity;
use ssl_data::{ImageAugment, Normalization, Recipe, ViewTypes, VolumeAugment};
use ssl_models::autocast::Precision;
use ssl_models::{PosEmbed, Stem, VitConfig, VitPool};
pub use ssl_optim::OptimizerKind;
use ssl_optim::OptimizerSettings;

/// Everything a run needs; written resolved to `RUN_DIR/config.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub data: DataConfig,
    pub model: ModelConfig,
    pub objective: ObjectiveSection,
    pub train: TrainConfig,
    pub eval: EvalConfig,
    /// Run directory; empty: a new `runs/<objective>-<time>`, linked from `runs/latest`.
    pub out: PathBuf,
    /// Result-changing keys a `--resume --allow-changed` changed, in order (empty for a run
    /// that kept its configuration).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ConfigChange>,
}

/// One key a resumed run changed, and from which step its new value holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigChange {
    /// Dotted key, e.g. `train.epochs`.
    pub key: String,
    /// The value before and after, as YAML (`~` for a key that was absent).
    pub from: serde_yaml::Value,
    pub to: serde_yaml::Value,
    /// The first optimiser step taken with the new value.
    pub step: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            data: DataConfig::default(),
            model: ModelConfig::default(),
            objective: ObjectiveSection::default(),
            train: TrainConfig::default(),
            eval: EvalConfig::default(),
            out: PathBuf::new(),
            history: Vec::new(),
        }
    }
}

/// The side of a folder of scans' images (and volumes) unless `data.size` is given:
/// MedMNIST+'s 64, small enough for a CPU, large enough for a 3D ResNet-18's five strides.
pub const SCAN_SIZE: usize = 64;

/// `data.name` of a file of your own in MedMNIST's layout.
pub const NPZ: &str = "npz";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `digits` (embedded scikit-learn digits), `gmm` (IConE's 2-D Gaussian mixture), a
    /// MedMNIST dataset (`bloodmnist`, `organmnist3d`, …) read from `root`, a benchmark set read
    /// from its official archive in `root` (`cifar10`, `cifar100`, `cifar100-coarse`, `stl10`,
    /// `tiny-imagenet`), `caltech256` (the extracted `256_ObjectCategories` in `root`, or `root`
    /// itself), or `folder`: an ImageNet-style image folder at `root`.
    pub name: String,
    /// Side length the digits are upsampled to; the MedMNIST file's size (28, 64, 128, 224);
    /// the side a folder's images are resized (shorter side) and centre-cropped to.
    pub size: usize,
    /// Directory of MedMNIST `.npz` files (or one file); absent: `~/.medmnist`, the official
    /// package's cache. For a benchmark set, the directory of its archive (or the archive); absent:
    /// `~/.cache/candle-ssl/data`. For `folder`, the folder (`root/train` + `root/val`, or
    /// `root/<class>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Held-out fraction (stratified); MedMNIST keeps its official test split instead.
    pub test_fraction: f64,
    /// Seed of the train/test split and of the subsets below; absent: the run seed. Fix it to
    /// compare model seeds on one split (IConE protocol, docs/spec/data.md §5.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_seed: Option<u64>,
    /// Train on a stratified subset of this many instances of the training partition
    /// (0: all of it).
    #[serde(skip_serializing_if = "is_zero")]
    pub train_size: usize,
    /// Partition the training (sub)set itself, stratified, into train and test by this test
    /// fraction, replacing the test partition (IConE's 80/20 of each N-subset of the official
    /// train split, spec data §5.2: `0.2`); 0: keep the official test split (MedMNIST, folders
    /// with `val/`) or the `test_fraction` split.
    #[serde(skip_serializing_if = "is_zero_f64")]
    pub subset_test_fraction: f64,
    /// Class imbalance factor k: half of the classes keep `ceil(n/k)` of their training
    /// instances (spec data §5.3); 1 = balanced. The test partition is untouched.
    #[serde(skip_serializing_if = "is_one")]
    pub imbalance: usize,
    /// Keep only these classes in both partitions (empty: all), e.g. one of SAG-VICReg's
    /// disjoint class halves (spec data §5.4); labels keep their original values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<u32>,
    /// For `folder`: keep only these class directories (labels follow their sorted order);
    /// `[imagenet100]` is CMC's ImageNet-100 list. Empty: every class.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub folder_classes: Vec<String>,
    /// For `caltech256`: add the background category `257.clutter` as class 256 (default: the
    /// 256 object categories only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub clutter: bool,
    /// For `folder` and `caltech256`: keep each image whole at its aspect ratio, shorter side
    /// downscaled to this many pixels (≥ `size`; solo-learn/FFCV-style ImageNet: 256), and draw
    /// the training views' random resized crops from it; evaluation still sees `Resize(size)` +
    /// `CenterCrop(size)`. 0: decode each image once to `size × size` (shorter side, centre crop)
    /// and crop from that.
    #[serde(skip_serializing_if = "is_zero")]
    pub keep_side: usize,
    /// Augmentation recipe: digits, noise, none, icone, simclr, frossl, moco-v2, byol, vicreg,
    /// dino, swav (2D, torchvision semantics) or icone3d (volumes). Absent: by data set —
    /// digits → digits, gmm → noise, MedMNIST 2D → icone, MedMNIST 3D → icone3d,
    /// folder and caltech256 → simclr; the run's `config.yaml` records the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augment: Option<Recipe>,
    /// Input normalisation of training views and evaluation inputs alike: none, imagenet,
    /// cifar10, cifar100, stl10 or medmnist. Absent: the recipe's (ImageNet's for the 2D
    /// photo recipes, none otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalize: Option<Normalization>,
    /// Explicit 2D view types replacing the recipe's (view `v` uses entry `v mod n`), each a
    /// mapping of `ImageAugment` fields over torchvision's defaults, e.g.
    /// `[{crop_scale: [0.2, 1.0], jitter: [0.4, 0.4, 0.4, 0.1], jitter_p: 0.8, blur: 1.0}]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub augment_views: Vec<ImageAugment>,
    /// IConE's 3D view type with your values replacing the `icone3d` recipe (volumes only), a
    /// mapping of `VolumeAugment` fields over the paper's, e.g. `{rotate: 0.0, noise: 0.5}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augment_volume: Option<VolumeAugment>,
    /// What pretraining draws from: `train` (the training partition), or for STL-10
    /// `train+unlabeled` (its train split and its 100,000 unlabeled images, as solo-learn
    /// pretrains; the evaluation still uses the labelled train and test splits).
    #[serde(skip_serializing_if = "TrainingSplit::is_train")]
    pub split: TrainingSplit,
    /// For `folder`: read every file at full precision as a scan (DICOM, NIfTI, 16-bit or
    /// multi-channel images; docs/data.md, "Your own scans"), its values mapped to `[0, 1]` by
    /// this: `range` (the stored integer type's), `minmax`, `{window: [lo, hi]}` (in the
    /// modality's units, e.g. CT lung `[-1000, 400]` HU) or `{percentile: [lo, hi]}` (per
    /// image and channel). Absent: by the folder's first file — none for 8-bit photos (read as
    /// RGB), `range` for 16-bit PNG and TIFF, `{percentile: [0.5, 99.5]}` for DICOM, NIfTI and
    /// float TIFF; the run's `config.yaml` records the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intensity: Option<Intensity>,
    /// For a folder of scans: whether its samples are volumes (NIfTI files, DICOM series and
    /// multi-frame DICOM files, brought to `size`³) or images. Absent: by the first file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volumes: Option<bool>,
    /// For volumes: resample to this voxel spacing in mm (`[slice, row, column]`, e.g.
    /// `[1.5, 1.5, 1.5]`) from each header's, then centre-crop or zero-pad to `size`. Absent:
    /// each axis resized to `size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spacing: Option<[f64; 3]>,
    /// For a folder of scans: train without the files that cannot be read, saying how many
    /// and which, rather than stop at the first.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skip_bad: bool,
    /// For `npz`: the MedMNIST task its labels pose (`multi-class`, `binary-class`, `multi-label,
    /// binary-class` or `ordinal-regression`), which `ssl eval` then scores with MedMNIST's
    /// official ACC and AUC. Absent: no ACC/AUC rows (an official file's task is its table's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// The images pretraining draws from (`data.split`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TrainingSplit {
    /// The training partition.
    #[default]
    #[serde(rename = "train")]
    Train,
    /// STL-10's train split and its unlabeled images.
    #[serde(rename = "train+unlabeled")]
    TrainUnlabeled,
}

impl TrainingSplit {
    fn is_train(&self) -> bool {
        *self == Self::Train
    }
}

impl DataConfig {
    /// For `folder`: fills `intensity` and `volumes` from its first file where not given
    /// ([`ssl_data::scans::probe`]), and for scans the side (64 unless `size_given`).
    fn resolve_scans(&mut self, size_given: bool) {
        let Some(root) = self.root.as_deref() else {
            return;
        };
        let manifest = ssl_data::scans::is_manifest(root);
        if self.intensity.is_none() || self.volumes.is_none() {
            // A manifest is read as scans even when its first file cannot be looked at: the
            // loading then names the row.
            let probe = ssl_data::scans::probe(root);
            if self.intensity.is_none() {
                self.intensity = (probe.and_then(|probe| probe.intensity))
                    .or(manifest.then_some(Intensity::Range));
            }
            if self.intensity.is_some() {
                self.volumes
                    .get_or_insert(probe.is_some_and(|probe| probe.volumes));
            }
        }
        if self.intensity.is_some() && !size_given {
            self.size = SCAN_SIZE;
        }
    }

    /// How a folder read as scans makes its samples (`None`: not read as scans).
    pub fn scan_options(&self) -> Option<ssl_data::scans::ScanOptions> {
        Some(ssl_data::scans::ScanOptions {
            size: self.size,
            intensity: self.intensity?,
            spacing: self.spacing,
            skip_bad: self.skip_bad,
        })
    }

    /// Whether the data are a folder of scans read as volumes.
    pub fn scan_volumes(&self) -> bool {
        self.name == "folder" && self.intensity.is_some() && self.volumes == Some(true)
    }

    /// Fills `augment` and `normalize` with the data set's defaults, so the run's
    /// `config.yaml` names the recipe it trained with.
    pub fn resolve(&mut self) {
        self.augment = Some(self.recipe());
        self.normalize = Some(self.normalization());
    }

    /// `augment`, or the data set's recipe.
    pub fn recipe(&self) -> Recipe {
        self.augment.unwrap_or(match self.name.as_str() {
            "digits" => Recipe::Digits,
            "gmm" => Recipe::Noise,
            "folder" if self.intensity.is_some() => match self.volumes {
                Some(true) => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
            "folder" | ssl_data::caltech256::NAME => Recipe::Simclr,
            NPZ => match self.npz_geometry() {
                Some((_, true)) => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
            name if ssl_data::archive_info(name).is_some() => Recipe::Simclr,
            name => match ssl_data::medmnist_info(name) {
                Ok(info) if info.volumetric => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
        })
    }

    /// The side of a `npz` file's images and whether they are volumes; `None` when the file
    /// cannot be read yet (loading it then says why).
    fn npz_geometry(&self) -> Option<(usize, bool)> {
        self.root
            .as_deref()
            .and_then(|f| ssl_data::npz_geometry(f).ok())
    }

    /// `normalize`, or the benchmark set's statistics under a photo recipe, or the recipe's.
    pub fn normalization(&self) -> Normalization {
        self.normalize.unwrap_or_else(|| {
            match (
                self.recipe().default_normalization(),
                ssl_data::archive_info(&self.name),
            ) {
                (Normalization::Imagenet, Some(info)) => info.normalization,
                (recipe, _) => recipe,
            }
        })
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
}
fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}
fn is_one(v: &usize) -> bool {
    *v == 1
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            name: "digits".into(),
            size: 16,
            root: None,
            test_fraction: 0.2,
            split_seed: None,
            train_size: 0,
            subset_test_fraction: 0.0,
            imbalance: 1,
            classes: Vec::new(),
            folder_classes: Vec::new(),
            clutter: false,
            keep_side: 0,
            augment: None,
            normalize: None,
            augment_views: Vec::new(),
            augment_volume: None,
            split: TrainingSplit::Train,
            intensity: None,
            volumes: None,
            spacing: None,
            skip_bad: false,
            task: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// One of [`ENCODERS`], or an encoder a linked crate registered (default: `digits_cnn`;
    /// `resnet18_3d` for MedMNIST volumes).
    pub encoder: String,
    /// MLP widths (hidden…, output) when `encoder: mlp`.
    pub mlp: Vec<usize>,
    /// Stem of the 2D ResNets: `imagenet` (7×7 stride-2 conv + max-pool) or `cifar` (3×3
    /// stride-1 conv, no pool; for images of 32 px and less).
    pub stem: Stem,
    /// Start the last batch norm of every residual block at weight 0 (Goyal et al. 2017).
    pub zero_init_residual: bool,
    /// ViT patch side in pixels; 0: the encoder's own (16). Another side learns the positional
    /// embedding for `data.size` (so timm's 224-px weights no longer fit): ViT-T with 4-px
    /// patches on the 16-px digits is a 4 × 4 grid.
    pub patch_size: usize,
    /// What a ViT's features are: `class`, its class token (timm, MAE), or `mean`, the mean of
    /// its patch tokens (I-JEPA's evaluation).
    pub pool: VitPool,
    /// A ViT's positions: `learned` (ViT, timm) or `sincos`, the fixed 2D sine–cosine
    /// embedding the official MAE and I-JEPA encoders use (not trained, not in the weights).
    pub pos_embed: PosEmbed,
    /// Initial encoder weights: a safetensors file with PyTorch state-dict keys, or
    /// `torchvision:resnet50` / `timm:vit_small_patch16_224` for a converted file in the weights
    /// directory (see `ssl run --help`).
    pub init: Option<String>,
    /// Projector widths: Linear–BN–ReLU for all but the last, then Linear.
    pub projector: Vec<usize>,
    /// Batch norm over the global batch of a data-parallel run (PyTorch's `SyncBatchNorm`): every
    /// train-mode batch norm of encoder, projector, teacher and objective heads normalises with
    /// the statistics of all ranks' rows. Off: each rank's own rows (what one process with the
    /// per-rank batch computes). No effect on one process.
    pub sync_bn: bool,
}

/// The encoders `model.encoder` can name.
pub const ENCODERS: &[&str] = &[
    "digits_cnn",
    "mlp",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet18_3d",
    "vit_t16",
    "vit_s16",
    "vit_b16",
];

/// The encoders `model.encoder` can name in this program, for error messages: the built-in
/// ones and those linked crates registered ([`ssl_models::register_encoder!`]).
pub fn known_encoders() -> String {
    let registered: Vec<&str> = ssl_models::registered_encoders()
        .iter()
        .map(|r| r.name)
        .collect();
    match registered.is_empty() {
        true => format!("built in: {}", ENCODERS.join(", ")),
        false => format!(
            "built in: {}; registered: {}",
            ENCODERS.join(", "),
            registered.join(", ")
        ),
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            encoder: "digits_cnn".into(),
            mlp: vec![64, 64, 2],
            stem: Stem::Imagenet,
            zero_init_residual: false,
            patch_size: 0,
            pool: VitPool::Class,
            pos_embed: PosEmbed::Learned,
            init: None,
            projector: vec![512, 512],
            sync_bn: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectiveSection {
    pub name: String,
    /// Objective keys (see `ssl describe NAME`); absent keys take the paper's defaults.
    pub params: serde_yaml::Value,
    /// The keys [`Self::resolve`] filled with the paper's defaults: the ones
    /// [`Self::fit_to_data`] may change. A resolved `config.yaml` gives every key, so a resumed
    /// run keeps the values it was fitted to.
    #[serde(skip)]
    pub defaulted: Vec<String>,
}

impl ObjectiveSection {
    /// Fills the keys absent from `params` with the objective's defaults, so the resolved
    /// `config.yaml` records every hyperparameter the run used (and `ssl compare` notices when a
    /// default changes), then checks them as the objective's build will: a key it does not
    /// know, or a value out of range, is an error naming it.
    pub fn resolve(&mut self) -> Result<()> {
        ensure!(
            !self.name.trim().is_empty(),
            "objective.name is empty; name an objective (`ssl list` shows them; default vicreg)"
        );
        let registration = ssl_core::find(&self.name)?;
        let mut resolved = match (registration.default_config)() {
            serde_yaml::Value::Mapping(defaults) => defaults,
            _ => serde_yaml::Mapping::new(),
        };
        let given = |key: &serde_yaml::Value| self.params.get(key).is_some();
        self.defaulted = (resolved.keys())
            .filter(|key| !given(key))
            .filter_map(|key| key.as_str().map(str::to_string))
            .collect();
        match &self.params {
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Mapping(given) => {
                for (key, value) in given {
                    resolved.insert(key.clone(), value.clone());
                }
            }
            other => bail!(
                "objective.params must be a mapping of keys (see `ssl describe {}`), got `{}`",
                self.name,
                serde_yaml::to_string(other).unwrap_or_default().trim()
            ),
        }
        self.params = serde_yaml::Value::Mapping(resolved);
        (registration.check)(&self.params)
    }

    /// Fits the defaulted keys that make no sense for `data` (prototypes or a queue beyond
    /// the training set, say) to it; returns what changed, one sentence a change.
    pub fn fit_to_data(&mut self, data: &ssl_core::DataFacts) -> Result<Vec<String>> {
        let registration = ssl_core::find(&self.name)?;
        let defaulted = |key: &str| self.defaulted.iter().any(|k| k == key);
        let (params, notes) = (registration.fit_to_data)(&self.params, data, &defaulted)?;
        self.params = params;
        Ok(notes)
    }
}

impl Default for ObjectiveSection {
    fn default() -> Self {
        Self {
            name: "vicreg".into(),
            params: serde_yaml::Value::Mapping(Default::default()),
            defaulted: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub views: usize,
    /// Multi-crop: extra low-resolution local views per instance (Caron et al. 2020), seen by
    /// the student only; objectives read them as the views after the `views` global ones.
    pub local_views: usize,
    /// Side of a local view in pixels (0: `⌈side · 96/224⌉`, DINO's 96 px at 224).
    pub local_size: usize,
    /// Area fraction range of a local crop (default: the recipe's, SwAV `[0.05, 0.14]`, else
    /// DINO's `[0.05, 0.4]`).
    pub local_scale: (f64, f64),
    pub optimizer: OptimizerKind,
    /// Peak learning rate (after warm-up).
    pub lr: f64,
    /// Final learning rate of the cosine schedule.
    pub min_lr: f64,
    /// Epochs of linear warm-up, at most `epochs` (when not given: 2, or `epochs` if fewer).
    pub warmup_epochs: usize,
    /// Decoupled (AdamW) or L2 (SGD/LARS) weight decay; biases and norm weights are excluded.
    pub weight_decay: f64,
    /// Adam betas.
    pub betas: (f64, f64),
    /// SGD/LARS momentum and Nesterov switch.
    pub momentum: f64,
    pub nesterov: bool,
    /// LARS trust coefficient η.
    pub lars_eta: f64,
    pub drop_last: bool,
    pub seed: u64,
    /// CPU threads (0 = all cores, or under a launcher this rank's share of them; more than
    /// [`MAX_THREADS_PER_CORE`] per core are capped).
    pub threads: usize,
    /// Seconds a data-parallel collective waits for the other ranks before the job ends with an
    /// error naming it, the rank and the step (a rank that never joins it would otherwise hang
    /// the job).
    pub collective_timeout: usize,
    /// `cpu`, `cuda[:N]` or `metal`.
    pub device: String,
    /// Online linear probe learning rate (0 disables the probe), with the backbone's optimiser
    /// and schedule and no weight decay; the probe standardises its features
    /// ([`crate::online_probe`]). Spec metrics §2 gives 0.1–0.3 as typical; the main job's
    /// probe ends at 98.1 % with it (offline 97.8 %), and on a ViT-T after 10 epochs of MAE 0.1
    /// gave 55 %, 0.01 42 % and 0.001 31 %.
    pub probe_lr: f64,
    /// Checkpoint every N epochs (the last epoch is always saved).
    pub checkpoint_every: usize,
    /// Steps between reads of the logged values (loss, its terms, the probe's loss) from the
    /// device: every step is still logged, an interval's steps at once, and a non-finite loss
    /// stops training at the first read after it, naming its step. On a GPU each read waits for
    /// every queued kernel; reading every step would stall the queue once a step.
    pub log_every: usize,
    /// Stop after this many epochs of this invocation (0 = run to the end); for tests of resume.
    pub stop_after_epochs: usize,
    /// Gradient accumulation: one optimiser step per this many batches, on their mean gradient
    /// (effective batch `accumulate × batch_size`; the objective still sees `batch_size`
    /// instances at a time, so batch statistics are the smaller batch's).
    pub accumulate: usize,
    /// `f32`, or `bf16`: the encoder's and projector's matrix products take bf16 operands and
    /// accumulate in f32, everything else stays f32 (as `torch.autocast(dtype=torch.bfloat16)`;
    /// emulated on the CPU, where it is a check, not a speed-up).
    pub precision: Precision,
    /// Gradient clipping over every trainable parameter: their gradients are scaled together
    /// so that their global norm is at most this (0: off). A parameter group clips its own.
    #[serde(skip_serializing_if = "is_off")]
    pub clip_grad_norm: f64,
    /// Optimiser settings by parameter-name prefix, applied after the objective's own groups
    /// (`ssl describe NAME` lists them), e.g. `[{params: projector., lr: 0.05, schedule:
    /// constant, weight_decay: 0, lars: false, clip_grad_norm: 3.0, freeze_epochs: 1}]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub param_groups: Vec<ssl_core::ParamGroup>,
}

fn is_off(x: &f64) -> bool {
    *x == 0.0
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 50,
            batch_size: 128,
            views: 2,
            local_views: 0,
            local_size: 0,
            local_scale: (0.05, 0.4),
            optimizer: OptimizerKind::Adamw,
            lr: 1e-3,
            min_lr: 0.0,
            warmup_epochs: 2,
            weight_decay: 1e-4,
            betas: (0.9, 0.999),
            momentum: 0.9,
            nesterov: false,
            lars_eta: 0.02,
            drop_last: true,
            seed: 0,
            threads: 0,
            collective_timeout: 600,
            device: "cpu".into(),
            probe_lr: 0.1,
            checkpoint_every: 10,
            log_every: 10,
            stop_after_epochs: 0,
            accumulate: 1,
            precision: Precision::F32,
            clip_grad_norm: 0.0,
            param_groups: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// k of the weighted k-NN monitor and final table.
    pub knn_k: usize,
    /// Temperature of the k-NN vote weights.
    pub knn_t: f64,
    /// Inverse L2 strength of the linear probe.
    pub probe_c: f64,
    /// Run the k-NN / online-probe monitor every N epochs (and always after the last).
    pub monitor_every: usize,
    /// Log each view's covariance eigenvalues to `spectrum.csv` every N steps (0: never).
    pub spectrum_every: usize,
    /// How many of the largest eigenvalues to log (the FroSSL paper tracks 20).
    pub spectrum_top: usize,
    /// The network that is evaluated (k-NN monitor, the end-of-run table, `ssl eval`) and
    /// exported: the trained student (default) or, for an objective that keeps an EMA teacher,
    /// the teacher's encoder, which DINO's and I-JEPA's papers evaluate.
    #[serde(skip_serializing_if = "EvaluatedEncoder::is_student")]
    pub encoder: EvaluatedEncoder,
}

/// Which encoder of a run is evaluated and exported (`eval.encoder`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EvaluatedEncoder {
    /// The encoder the optimiser trains (`encoder.*` in a checkpoint).
    #[default]
    Student,
    /// The EMA teacher's encoder (`teacher.encoder.*`), for objectives that keep one.
    Teacher,
}

impl EvaluatedEncoder {
    fn is_student(&self) -> bool {
        *self == Self::Student
    }

    /// `student` or `teacher`, as configured.
    pub fn name(self) -> &'static str {
        match self {
            Self::Student => "student",
            Self::Teacher => "teacher",
        }
    }

    /// The prefix of this encoder's tensor names in a run's store and checkpoint, with its
    /// trailing dot (`encoder.`, `teacher.encoder.`).
    pub const fn prefix(self) -> &'static str {
        match self {
            Self::Student => "encoder.",
            Self::Teacher => "teacher.encoder.",
        }
    }
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            knn_k: 20,
            knn_t: 0.07,
            probe_c: 1.0,
            monitor_every: 5,
            spectrum_every: 5,
            spectrum_top: 20,
            encoder: EvaluatedEncoder::Student,
        }
    }
}

impl RunConfig {
    /// Parses a YAML document (recipe or resolved config) over the defaults.
    /// The objective's parameters are resolved against its defaults (see
    /// [`ObjectiveSection::resolve`]).
    pub fn from_yaml_value(value: serde_yaml::Value) -> Result<Self> {
        let given =
            |section: &str, key: &str| value.get(section).and_then(|m| m.get(key)).is_some();
        let (encoder_given, local_scale_given, warmup_given) = (
            given("model", "encoder"),
            given("train", "local_scale"),
            given("train", "warmup_epochs"),
        );
        let mut config: RunConfig = match serde_yaml::from_value(value.clone()) {
            Ok(config) => config,
            Err(e) => bail!("{}", keyed_error(&value, e)),
        };
        config.objective.resolve()?;
        // A benchmark set's images have one size: the digits' default side becomes it.
        if let Some(info) = ssl_data::archive_info(&config.data.name) {
            if !given("data", "size") {
                config.data.size = info.side;
            }
            if !encoder_given {
                config.model.encoder = "resnet18".into();
                if !given("model", "stem") && info.side == 32 {
                    config.model.stem = Stem::Cifar;
                }
            }
        }
        // Caltech-256's images come in many sizes: ImageNet's 224 px and a ResNet-18 unless given.
        if config.data.name == ssl_data::caltech256::NAME {
            if !given("data", "size") {
                config.data.size = 224;
            }
            if !encoder_given {
                config.model.encoder = "resnet18".into();
            }
        }
        // A folder of scans: full precision, 64 px (or 64³) and the 3D encoder unless given.
        if config.data.name == "folder" {
            config.data.resolve_scans(given("data", "size"));
        }
        // A file of your own has the side of its images.
        let npz = (config.data.name == NPZ)
            .then(|| config.data.npz_geometry())
            .flatten();
        if let Some((side, _)) = npz.filter(|_| !given("data", "size")) {
            config.data.size = side;
        }
        config.data.resolve();
        // Volumes get IConE's 3D ResNet-18 unless an encoder is named (the digits CNN is 2D).
        let volumes = ssl_data::medmnist_info(&config.data.name).is_ok_and(|i| i.volumetric)
            || npz.is_some_and(|(_, volumes)| volumes)
            || config.data.scan_volumes();
        if !encoder_given && volumes {
            config.model.encoder = "resnet18_3d".into();
        }
        if !local_scale_given {
            config.train.local_scale = config.data.recipe().local_crop_scale();
        }
        if !warmup_given {
            config.train.warmup_epochs = config.train.warmup_epochs.min(config.train.epochs);
        }
        config.train.threads = capped_threads(config.train.threads);
        config.validate()?;
        Ok(config)
    }

    /// The resolved configuration a run recorded in `dir/config.yaml`.
    pub fn load_run(dir: &Path) -> Result<Self> {
        let path = dir.join("config.yaml");
        anyhow::ensure!(
            path.exists(),
            "{} has no config.yaml; give a run directory written by `ssl run` (e.g. runs/latest)",
            dir.display()
        );
        Self::from_yaml_value(Self::from_file(&path)?)
            .with_context(|| format!("{} is not a valid run config", path.display()))
    }

    /// Reads a recipe file.
    pub fn from_file(path: &Path) -> Result<serde_yaml::Value> {
        let text = read_config_text(path)?;
        serde_yaml::from_str(&text).with_context(|| format!("{} is not valid YAML", path.display()))
    }

    /// Checks values that types do not, before anything is loaded or trained: every message names
    /// the key, the value and what it may be.
    pub fn validate(&self) -> Result<()> {
        self.train.validate()?;
        self.data.validate()?;
        self.model.validate()?;
        self.eval.validate()?;
        ensure!(
            self.data.split == TrainingSplit::Train || self.train.probe_lr == 0.0,
            "data.split: train+unlabeled pretrains on images without labels, which the online \
             probe cannot learn from; add --set train.probe_lr=0 (the end-of-run linear probe and \
             k-NN still use the labelled train split)"
        );
        ensure!(
            self.eval.encoder == EvaluatedEncoder::Student || self.train.probe_lr == 0.0,
            "eval.encoder: teacher evaluates the EMA teacher, and the online probe learns from the \
             student's features (train.probe_lr {}); add --set train.probe_lr=0 (the end-of-run \
             linear probe and k-NN read the teacher)",
            self.train.probe_lr
        );
        self.check_patches()
    }

    /// A ViT cuts its inputs into patches: the images (and multi-crop's local views) must be a
    /// whole number of them across, or the first step fails. (The mixture's points are no
    /// images: the encoder refuses them by shape.)
    fn check_patches(&self) -> Result<()> {
        if self.data.name == "gmm" {
            return Ok(());
        }
        let Some(patch) = self.model.vit_config(self.data.size).map(|v| v.patch_size) else {
            return Ok(());
        };
        let (size, encoder) = (self.data.size, &self.model.encoder);
        ensure!(
            size.is_multiple_of(patch),
            "model.encoder {encoder} cuts images into {patch}×{patch} patches, so data.size must be \
             a multiple of {patch}, got {size} (e.g. --size {})",
            (size / patch).max(1) * patch
        );
        let local = self.train.local_side(size);
        ensure!(
            self.train.local_views == 0 || local.is_multiple_of(patch),
            "model.encoder {encoder} cuts images into {patch}×{patch} patches, so the local views' \
             side must be a multiple of {patch}, got {local}{}; set train.local_size (DINO: 96 at 224)",
            match self.train.local_size {
                0 => format!(" (train.local_size 0: ⌈{size}·96/224⌉)"),
                _ => String::new(),
            }
        );
        Ok(())
    }
}

/// Most CPU threads per core a run starts (`train.threads`, `--threads`): more only adds
/// contention.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// `requested` CPU threads (0: all cores), capped at [`MAX_THREADS_PER_CORE`] per core with a
/// warning on stderr (once per process: a grid resolves many configurations).
pub fn capped_threads(requested: usize) -> usize {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = MAX_THREADS_PER_CORE * cores;
    if requested <= cap {
        return requested;
    }
    if WARNED.swap(true, Ordering::Relaxed) {
        return cap;
    }
    eprintln!(
        "warning: {requested} threads asked for (train.threads / --threads) on {cores} cores; \
         using {cap} ({MAX_THREADS_PER_CORE} per core)"
    );
    cap
}

/// Starts this process's CPU work on `threads` threads ([`capped_threads`]; 0: all cores):
/// Candle's kernels read `RAYON_NUM_THREADS`, our own ops use rayon's global pool, which is
/// built once per process, so a later call changes Candle's count only.
pub fn use_threads(threads: usize) {
    let threads = capped_threads(threads);
    if threads > 0 {
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
}

/// Largest config file [`read_config_text`] reads: recipes and grids are a few KiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of a configuration file (recipe, grid, generalisation recipe), refused beyond
/// [`MAX_CONFIG_BYTES`].
pub fn read_config_text(path: &Path) -> Result<String> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read config file {} as UTF-8 text", path.display()))?;
    ensure!(
        text.len() as u64 <= MAX_CONFIG_BYTES,
        "config file {} is larger than {} MiB; a recipe is a few KiB of YAML (is it the right file?)",
        path.display(),
        MAX_CONFIG_BYTES >> 20
    );
    Ok(text)
}

/// `Ok` when `value` is finite and in `range`; else an error naming `key`, the value, the range
/// (`shown`, e.g. `[0, 1)`) and `hint` (the paper's default, …).
fn in_range(
    key: &str,
    value: f64,
    range: impl std::ops::RangeBounds<f64>,
    shown: &str,
    hint: &str,
) -> Result<()> {
    ensure!(
        value.is_finite() && range.contains(&value),
        "{key} must be {shown}{hint}, got {value}"
    );
    Ok(())
}

/// `Ok` when `value` is finite and > 0; else an error naming `key` and `hint`.
fn positive(key: &str, value: f64, hint: &str) -> Result<()> {
    in_range(key, value, (Excluded(0.0), Unbounded), "> 0", hint)
}

/// `Ok` when `value` ≥ 1; else an error naming `key` and `hint`.
fn at_least_one(key: &str, value: usize, hint: &str) -> Result<()> {
    ensure!(value >= 1, "{key} must be ≥ 1{hint}, got {value}");
    Ok(())
}

impl TrainConfig {
    /// The optimiser's settings of this run.
    pub fn optimizer_settings(&self) -> OptimizerSettings {
        OptimizerSettings {
            kind: self.optimizer,
            lr: self.lr,
            warmup_epochs: self.warmup_epochs,
            weight_decay: self.weight_decay,
            betas: self.betas,
            momentum: self.momentum,
            nesterov: self.nesterov,
            lars_eta: self.lars_eta,
            clip_grad_norm: self.clip_grad_norm,
        }
    }

    /// Side of a multi-crop local view of images of side `side`: `local_size`, or
    /// `⌈side · 96/224⌉` (DINO's 96 px at 224) when 0.
    pub fn local_side(&self, side: usize) -> usize {
        match self.local_size {
            0 => (side * 96).div_ceil(224).max(1),
            s => s,
        }
    }

    fn validate(&self) -> Result<()> {
        at_least_one("train.epochs", self.epochs, "")?;
        at_least_one("train.batch_size", self.batch_size, "")?;
        at_least_one("train.views", self.views, "")?;
        at_least_one(
            "train.accumulate",
            self.accumulate,
            " (1: no gradient accumulation)",
        )?;
        at_least_one(
            "train.checkpoint_every",
            self.checkpoint_every,
            " (epochs between checkpoints; the last epoch is always saved)",
        )?;
        at_least_one(
            "train.collective_timeout",
            self.collective_timeout,
            " (seconds a data-parallel collective waits for the other ranks; default 600)",
        )?;
        at_least_one(
            "train.log_every",
            self.log_every,
            " (steps between reads of the loss; 1: every step)",
        )?;
        positive("train.lr", self.lr, " (default 1e-3)")?;
        in_range(
            "train.min_lr",
            self.min_lr,
            0.0..=self.lr,
            &format!("in [0, train.lr] = [0, {}]", self.lr),
            " (the cosine schedule's end; default 0)",
        )?;
        ensure!(
            self.warmup_epochs <= self.epochs,
            "train.warmup_epochs must be ≤ train.epochs ({}), got {}",
            self.epochs,
            self.warmup_epochs
        );
        in_range(
            "train.weight_decay",
            self.weight_decay,
            0.0..,
            "≥ 0",
            " (default 1e-4)",
        )?;
        let (b1, b2) = self.betas;
        for (key, beta) in [("train.betas[0]", b1), ("train.betas[1]", b2)] {
            in_range(key, beta, 0.0..1.0, "in [0, 1)", " (Adam: [0.9, 0.999])")?;
        }
        in_range(
            "train.momentum",
            self.momentum,
            0.0..1.0,
            "in [0, 1)",
            " (default 0.9)",
        )?;
        positive("train.lars_eta", self.lars_eta, " (LARS; default 0.02)")?;
        in_range(
            "train.probe_lr",
            self.probe_lr,
            0.0..,
            "≥ 0",
            " (0: no online probe; default 0.1)",
        )?;
        let (lo, hi) = self.local_scale;
        ensure!(
            lo.is_finite() && hi.is_finite() && 0.0 < lo && lo <= hi && hi <= 1.0,
            "train.local_scale must be [a, b] with 0 < a ≤ b ≤ 1 (the local crop's area fraction; \
             DINO: [0.05, 0.4]), got [{lo}, {hi}]"
        );
        in_range(
            "train.clip_grad_norm",
            self.clip_grad_norm,
            0.0..,
            "≥ 0",
            " (0: no clipping)",
        )?;
        for (i, group) in self.param_groups.iter().enumerate() {
            if let Err(e) = group.validate() {
                bail!("train.param_groups[{i}]: {e}");
            }
        }
        Ok(())
    }
}

impl DataConfig {
    /// The training view types for samples of `shape`: `data.augment_views` if given, else
    /// the recipe's (`data.augment`), normalised as `data.normalize` says.
    pub fn view_types(&self, shape: &[usize]) -> Result<ViewTypes> {
        let normalize = self.normalization();
        if let Some(volume) = &self.augment_volume {
            ensure!(
                self.augment_views.is_empty(),
                "data.augment_volume and data.augment_views both replace the recipe; keep one"
            );
            return volume.view_types(shape).context("data.augment_volume");
        }
        let types = match self.augment_views.is_empty() {
            true => self.recipe().view_types(normalize, shape),
            false => ssl_data::Pipeline {
                views: self
                    .augment_views
                    .iter()
                    .map(|v| ImageAugment {
                        normalize,
                        ..v.clone()
                    })
                    .collect(),
                local: None,
            }
            .view_types(shape),
        };
        types.context("data.augment / data.augment_views do not fit this data")
    }

    fn validate(&self) -> Result<()> {
        at_least_one("data.size", self.size, " (the image side in pixels)")?;
        if self.keep_side > 0 {
            ensure!(
                self.name == "folder" || self.name == ssl_data::caltech256::NAME,
                "data.keep_side keeps an image folder's files at full resolution; `{}` is not \
                 one (data.name=folder or caltech256), so drop it",
                self.name
            );
            ensure!(
                self.keep_side >= self.size,
                "data.keep_side ({}) must be at least data.size ({}), or 0 for images decoded \
                 to {} × {}",
                self.keep_side,
                self.size,
                self.size,
                self.size
            );
        }
        at_least_one("data.imbalance", self.imbalance, " (1: balanced)")?;
        in_range(
            "data.subset_test_fraction",
            self.subset_test_fraction,
            0.0..1.0,
            "in [0, 1)",
            " (0: keep the test split; IConE: 0.2)",
        )?;
        in_range(
            "data.test_fraction",
            self.test_fraction,
            (Excluded(0.0), Excluded(1.0)),
            "in (0, 1)",
            " (default 0.2)",
        )?;
        if let Some(info) = ssl_data::archive_info(&self.name) {
            ensure!(
                self.size == info.side,
                "data.size is {}, but {} holds {side}×{side} images; set --size {side}",
                self.size,
                self.name,
                side = info.side
            );
        }
        if self.name == NPZ {
            ensure!(
                self.root.is_some(),
                "data set `npz` needs its file: set data.root (or --root FILE.npz, or give the \
                 file as --data FILE.npz)"
            );
        }
        if let Some(task) = &self.task {
            ensure!(
                self.name == NPZ,
                "data.task names the task of a `npz` file's labels; `{}` has its own, so drop it",
                self.name
            );
            ssl_eval::MedMnistTask::from_official(task).context("data.task")?;
        }
        ensure!(
            !self.clutter || self.name == ssl_data::caltech256::NAME,
            "data.clutter adds Caltech-256's 257.clutter category, but data.name is `{}`; drop it",
            self.name
        );
        ensure!(
            self.split == TrainingSplit::Train || self.name == "stl10",
            "data.split: train+unlabeled is for stl10, the one data set with unlabeled images \
             (`{}` has none); drop it",
            self.name
        );
        self.validate_scans()?;
        let mut classes = self.classes.clone();
        classes.sort_unstable();
        classes.dedup();
        ensure!(
            classes.len() != 1,
            "data.classes keeps the single class {:?}; the evaluation's linear probe and \
             silhouette need at least 2 (empty: all classes)",
            classes
        );
        Ok(())
    }
}

impl DataConfig {
    /// The scan settings apply to a folder read as scans, `spacing` to its volumes.
    fn validate_scans(&self) -> Result<()> {
        let scans = self.name == "folder" && self.intensity.is_some();
        for (key, set) in [
            ("data.intensity", self.intensity.is_some()),
            ("data.volumes", self.volumes.is_some()),
            ("data.skip_bad", self.skip_bad),
            ("data.spacing", self.spacing.is_some()),
        ] {
            ensure!(
                !set || self.name == "folder",
                "{key} is for a folder of scans (data.name=folder); `{}` is not one, so drop it",
                self.name
            );
        }
        if let Some(intensity) = &self.intensity {
            intensity.validate()?;
        }
        ensure!(
            scans || (self.volumes.is_none() && self.spacing.is_none() && !self.skip_bad),
            "data.volumes, data.spacing and data.skip_bad apply to scans, and this folder is \
             read as 8-bit photos; set data.intensity (e.g. range) to read it as scans"
        );
        if let Some(spacing) = self.spacing {
            ensure!(
                self.volumes == Some(true),
                "data.spacing resamples volumes, and this folder's samples are 2D images; drop it"
            );
            ensure!(
                spacing.iter().all(|s| s.is_finite() && *s > 0.0),
                "data.spacing {spacing:?} must be positive millimetres, e.g. [1.5, 1.5, 1.5]"
            );
        }
        ensure!(
            self.keep_side == 0 || !scans,
            "data.keep_side keeps photos at full resolution; scans are stored at data.size, so \
             drop it"
        );
        Ok(())
    }
}

impl ModelConfig {
    /// The ViT `encoder` names for images of side `image_side`, with `patch_size`, `pool` and
    /// `pos_embed` applied; `None` for other encoders.
    pub fn vit_config(&self, image_side: usize) -> Option<VitConfig> {
        let mut vit = match self.encoder.as_str() {
            "vit_t16" => VitConfig::tiny(),
            "vit_s16" => VitConfig::small(),
            "vit_b16" => VitConfig::base(),
            _ => return None,
        };
        if self.patch_size > 0 {
            (vit.patch_size, vit.img_size) = (self.patch_size, image_side);
        }
        (vit.pool, vit.pos_embed) = (self.pool, self.pos_embed);
        Some(vit)
    }

    fn validate(&self) -> Result<()> {
        ensure!(
            self.vit_config(224).is_some()
                || (self.patch_size == 0
                    && self.pool == VitPool::Class
                    && self.pos_embed == PosEmbed::Learned),
            "model.patch_size, model.pool and model.pos_embed apply to ViT encoders (vit_t16, \
             vit_s16, vit_b16), \
             and model.encoder is `{}`; remove them or use a ViT",
            self.encoder
        );
        ensure!(
            ENCODERS.contains(&self.encoder.as_str())
                || ssl_models::find_encoder(&self.encoder).is_some(),
            "unknown model.encoder `{}`; {}",
            self.encoder,
            known_encoders()
        );
        ensure!(
            !self.mlp.is_empty() && !self.mlp.contains(&0),
            "model.mlp must list widths ≥ 1 (hidden…, output; default [64, 64, 2]), got {:?}",
            self.mlp
        );
        ensure!(
            !self.projector.is_empty(),
            "model.projector needs at least one width (the output), e.g. [512, 512]"
        );
        ensure!(
            !self.projector.contains(&0),
            "model.projector widths must be ≥ 1 (default [512, 512]), got {:?}",
            self.projector
        );
        Ok(())
    }
}

impl EvalConfig {
    fn validate(&self) -> Result<()> {
        at_least_one("eval.knn_k", self.knn_k, " (default 20)")?;
        positive(
            "eval.knn_t",
            self.knn_t,
            " (the k-NN temperature; default 0.07)",
        )?;
        positive(
            "eval.probe_c",
            self.probe_c,
            " (the probe's inverse L2 strength; default 1)",
        )?;
        at_least_one(
            "eval.monitor_every",
            self.monitor_every,
            " (epochs between k-NN monitors; the last epoch is always monitored)",
        )?;
        if self.spectrum_every > 0 {
            at_least_one(
                "eval.spectrum_top",
                self.spectrum_top,
                " while eval.spectrum_every > 0 (default 20)",
            )?;
        }
        Ok(())
    }
}

/// The error of deserialising `value` as a [`RunConfig`], with the dotted key it concerns and
/// serde's wording made plain: `train.lr: expected a number, got "abc"`. (Deserialising from a
/// `Value` loses the path; parsing its text keeps it.)
fn keyed_error(value: &serde_yaml::Value, error: serde_yaml::Error) -> String {
    let keyed = serde_yaml::to_string(value)
        .ok()
        .and_then(|text| serde_yaml::from_str::<RunConfig>(&text).err());
    let Some(keyed) = keyed else {
        return plain_serde_message(&error.to_string());
    };
    let mut text = keyed.to_string();
    // The line and column are those of the re-serialised text, not of anything the user wrote.
    if let Some(at) = keyed.location() {
        let suffix = format!(" at line {} column {}", at.line(), at.column());
        if let Some(stripped) = text.strip_suffix(&suffix) {
            text = stripped.to_string();
        }
    }
    plain_serde_message(&text)
}

/// serde's `invalid type: string "abc", expected f64` as `expected a number, got "abc"` (a
/// leading `key: ` kept).
fn plain_serde_message(message: &str) -> String {
    let (key, rest) = match message.split_once(": invalid ") {
        Some((key, rest)) => (format!("{key}: "), format!("invalid {rest}")),
        None => (String::new(), message.to_string()),
    };
    let Some((got, expected)) = rest
        .strip_prefix("invalid type: ")
        .or_else(|| rest.strip_prefix("invalid value: "))
        .and_then(|r| r.split_once(", expected "))
    else {
        return message.to_string();
    };
    let expected = match expected {
        "f64" | "f32" => "a number",
        "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number ≥ 0",
        "i64" | "i32" => "a whole number",
        other => other,
    };
    let got = ["string ", "integer ", "floating point ", "boolean "]
        .iter()
        .find_map(|kind| got.strip_prefix(kind))
        .map_or(got, |v| v.trim_matches('`'))
        .replace("unit value", "null");
    format!("{key}expected {expected}, got {got}")
}

/// Applies `key.path=value` (value parsed as YAML) onto a YAML mapping. A mapping value merges
/// into a mapping already there, key by key (so `--set train={epochs: 3}` keeps an earlier
/// `--set train.lr=0.1`); `~` (null) resets a key; anything else replaces the value. Setting a
/// key under a value that is not a mapping, or a non-mapping over a mapping, is an error naming
/// both.
pub fn apply_set(root: &mut serde_yaml::Value, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        bail!("--set expects key=value (e.g. train.lr=0.01), got `{assignment}`");
    };
    ensure!(
        !key.is_empty() && key.split('.').all(|part| !part.is_empty()),
        "--set {assignment}: `{key}` is not a dotted key (e.g. train.lr)"
    );
    let value: serde_yaml::Value = serde_yaml::from_str(raw)
        .with_context(|| format!("--set {key}: `{raw}` is not a YAML value"))?;
    set_key(root, key, value, assignment)
}

/// Sets dotted `key` of `root` to `value` (merging mappings key by key), as `--set` does;
/// `assignment` is how the caller spelled it, for errors. The value is taken as it is, never
/// parsed: a command-line flag's path or name needs no quoting.
pub fn set_key(
    root: &mut serde_yaml::Value,
    key: &str,
    value: serde_yaml::Value,
    assignment: &str,
) -> Result<()> {
    let mut node = root;
    let mut path = String::new();
    for part in key.split('.') {
        if node.is_null() {
            *node = serde_yaml::Value::Mapping(Default::default());
        }
        let shown = (!node.is_mapping()).then(|| inline_yaml(node));
        let Some(map) = node.as_mapping_mut() else {
            bail!(
                "--set {assignment}: `{}` is `{}` (given earlier), not a mapping with keys",
                match path.is_empty() {
                    true => "the configuration",
                    false => &path,
                },
                shown.unwrap_or_default()
            );
        };
        if !path.is_empty() {
            path.push('.');
        }
        path.push_str(part);
        node = map
            .entry(serde_yaml::Value::String(part.to_string()))
            .or_insert(serde_yaml::Value::Null);
    }
    merge(node, value, &path, assignment)
}

/// Sets `node` (at dotted `path`) to `value`, merging mappings key by key.
fn merge(
    node: &mut serde_yaml::Value,
    value: serde_yaml::Value,
    path: &str,
    assignment: &str,
) -> Result<()> {
    if node.is_mapping() && !value.is_mapping() && !value.is_null() {
        bail!(
            "--set {assignment}: `{path}` holds the keys `{}` (given earlier), which `{}` would \
             replace; set them one by one ({path}.KEY=VALUE), or `{path}=~` first to reset them",
            inline_yaml(node),
            inline_yaml(&value)
        );
    }
    match (node, value) {
        (serde_yaml::Value::Mapping(map), serde_yaml::Value::Mapping(given)) => {
            for (key, value) in given {
                let name = key.as_str().map_or_else(|| inline_yaml(&key), String::from);
                let slot = map.entry(key).or_insert(serde_yaml::Value::Null);
                merge(slot, value, &format!("{path}.{name}"), assignment)?;
            }
        }
        (node, value) => *node = value,
    }
    Ok(())
}

/// A YAML value on one line, for messages (`{"lr":0.1}`, `[1,2]`, `3`).
fn inline_yaml(value: &serde_yaml::Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| {
        serde_yaml::to_string(value)
            .unwrap_or_default()
            .trim()
            .replace('\n', " ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objective_params_are_resolved_against_the_defaults() -> Result<()> {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        apply_set(&mut root, "objective.params.lambda=1.5")?;
        let c = RunConfig::from_yaml_value(root.clone())?;
        let p = &c.objective.params;
        // Given keys win, absent ones take the paper's values, and an unknown one is refused by
        // name before anything is loaded.
        assert_eq!(
            (p["lambda"].as_f64(), p["mu"].as_f64()),
            (Some(1.5), Some(25.0))
        );
        apply_set(&mut root, "objective.params.gamma=2")?;
        let e = format!("{:#}", RunConfig::from_yaml_value(root).unwrap_err());
        assert!(
            e.contains("unknown field `gamma`") && e.contains("ssl describe vicreg"),
            "{e}"
        );
        let mut root = serde_yaml::Value::Mapping(Default::default());
        apply_set(&mut root, "objective.params=3")?;
        let e = RunConfig::from_yaml_value(root).unwrap_err().to_string();
        assert!(e.contains("objective.params must be a mapping"), "{e}");
        let mut root = serde_yaml::Value::Mapping(Default::default());
        apply_set(&mut root, "objective.name=vicrge")?;
        let e = RunConfig::from_yaml_value(root).unwrap_err().to_string();
        assert!(e.contains("did you mean `vicreg`"), "{e}");
        Ok(())
    }

    #[test]
    fn defaults_are_the_main_job() {
        let c = RunConfig::default();
        assert_eq!(
            (c.train.epochs, c.train.batch_size, c.train.lr),
            (50, 128, 1e-3)
        );
        assert_eq!(c.objective.name, "vicreg");
        assert_eq!(c.data.name, "digits");
    }

    /// What the data and recipe imply fills what is not given, and a given value wins.
    #[test]
    fn recipe_and_data_defaults_yield_to_given_values() -> Result<()> {
        let swav = resolve(&["data.augment=swav"])?;
        assert_eq!(swav.train.local_scale, (0.05, 0.14));
        let dino = resolve(&["data.augment=dino"])?;
        assert_eq!(dino.train.local_scale, (0.05, 0.4));
        let given = resolve(&["data.augment=swav", "train.local_scale=[0.1, 0.3]"])?;
        assert_eq!(given.train.local_scale, (0.1, 0.3));
        let volumes = resolve(&["data.name=organmnist3d", "data.size=28"])?;
        assert_eq!(
            (volumes.model.encoder.as_str(), volumes.data.recipe()),
            ("resnet18_3d", Recipe::Icone3d)
        );
        let named = resolve(&["data.name=organmnist3d", "model.encoder=mlp"])?;
        assert_eq!(named.model.encoder, "mlp");
        let tuned = resolve(&[
            "data.name=organmnist3d",
            "data.augment_volume={rotate: 0.0, noise: 0.5}",
        ])?;
        let volume = tuned.data.augment_volume.clone().expect("given");
        assert_eq!((volume.rotate, volume.noise, volume.flip), (0.0, 0.5, 0.5));
        let types = tuned.data.view_types(&[1, 8, 8, 8])?;
        assert_eq!(types.views.len(), 1);
        let flat = tuned.data.view_types(&[3, 8, 8]).err().expect("2D");
        assert!(format!("{flat:#}").contains("[C, D, H, W]"), "{flat:#}");
        let typo = resolve(&["data.augment_volume={rotation: 0.0}"]).unwrap_err();
        assert!(
            typo.to_string().contains("unknown field `rotation`"),
            "{typo}"
        );
        // A resolved config read back is unchanged.
        let again = RunConfig::from_yaml_value(serde_yaml::to_value(&swav)?)?;
        assert_eq!(again.train.local_scale, swav.train.local_scale);
        Ok(())
    }

    #[test]
    fn set_overrides_nested_keys_and_unknown_keys_are_errors() {
        let mut v = serde_yaml::Value::Mapping(Default::default());
        apply_set(&mut v, "train.lr=0.5").unwrap();
        apply_set(&mut v, "objective.params.mu=10").unwrap();
        let c = RunConfig::from_yaml_value(v.clone()).unwrap();
        assert_eq!(c.train.lr, 0.5);
        assert_eq!(c.objective.params["mu"].as_f64(), Some(10.0));
        apply_set(&mut v, "train.learning_rate=1").unwrap();
        let err = RunConfig::from_yaml_value(v).unwrap_err().to_string();
        assert!(err.contains("unknown field `learning_rate`"), "{err}");
        assert!(apply_set(&mut serde_yaml::Value::Null, "novalue").is_err());
    }

    fn resolve(sets: &[&str]) -> Result<RunConfig> {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        for set in sets {
            apply_set(&mut root, set)?;
        }
        RunConfig::from_yaml_value(root)
    }

    /// The error of resolving `sets`, `{:#}`-formatted.
    fn refused(sets: &[&str]) -> String {
        match resolve(sets) {
            Ok(_) => panic!("{sets:?} was accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// Every value the types allow but a run cannot use is refused with its key, the value and
    /// the range.
    #[test]
    fn out_of_range_values_are_refused_naming_key_value_and_range() {
        let cases: &[(&[&str], &str)] = &[
            (&["train.epochs=0"], "train.epochs must be ≥ 1, got 0"),
            (&["train.batch_size=0"], "train.batch_size must be ≥ 1, got 0"),
            (&["train.views=0"], "train.views must be ≥ 1, got 0"),
            (&["train.accumulate=0"], "train.accumulate must be ≥ 1"),
            (&["train.checkpoint_every=0"], "train.checkpoint_every must be ≥ 1"),
            (&["train.log_every=0"], "train.log_every must be ≥ 1"),
            (&["train.lr=0"], "train.lr must be > 0 (default 1e-3), got 0"),
            (&["train.lr=.inf"], "train.lr must be > 0 (default 1e-3), got inf"),
            (&["train.min_lr=-0.1"], "train.min_lr must be in [0, train.lr] = [0, 0.001]"),
            (&["train.min_lr=0.01"], "got 0.01"),
            (&["train.epochs=3", "train.warmup_epochs=4"], "train.warmup_epochs must be ≤ train.epochs (3), got 4"),
            (&["train.weight_decay=-1e-4"], "train.weight_decay must be ≥ 0 (default 1e-4), got -0.0001"),
            (&["train.betas=[1.0, 0.999]"], "train.betas[0] must be in [0, 1) (Adam: [0.9, 0.999]), got 1"),
            (&["train.betas=[0.9, -0.1]"], "train.betas[1] must be in [0, 1)"),
            (&["train.momentum=1"], "train.momentum must be in [0, 1) (default 0.9), got 1"),
            (&["train.lars_eta=0"], "train.lars_eta must be > 0 (LARS; default 0.02), got 0"),
            (&["train.probe_lr=-0.1"], "train.probe_lr must be ≥ 0 (0: no online probe; default 0.1), got -0.1"),
            (&["train.local_scale=[0.0, 0.4]"], "train.local_scale must be [a, b] with 0 < a ≤ b ≤ 1"),
            (&["train.local_scale=[0.5, 0.4]"], "got [0.5, 0.4]"),
            (&["train.local_scale=[0.05, 1.5]"], "got [0.05, 1.5]"),
            (&["train.clip_grad_norm=-1"], "train.clip_grad_norm must be ≥ 0 (0: no clipping), got -1"),
            (&["train.param_groups=[{params: a., lr: 1, lr_scale: 2}]"], "sets both `lr` and `lr_scale`"),
            (&["data.size=0"], "data.size must be ≥ 1 (the image side in pixels), got 0"),
            (&["data.imbalance=0"], "data.imbalance must be ≥ 1 (1: balanced), got 0"),
            (&["data.test_fraction=0"], "data.test_fraction must be in (0, 1) (default 0.2), got 0"),
            (&["data.test_fraction=1"], "data.test_fraction must be in (0, 1)"),
            (&["data.subset_test_fraction=1"], "data.subset_test_fraction must be in [0, 1)"),
            (&["data.classes=[4, 4]"], "data.classes keeps the single class [4]"),
            (&["data.keep_side=256"], "data.keep_side keeps an image folder's files at full resolution; `digits` is not one (data.name=folder or caltech256)"),
            (&["data.name=folder", "data.size=224", "data.keep_side=200"], "data.keep_side (200) must be at least data.size (224)"),
            (&["data.name=npz"], "data set `npz` needs its file: set data.root"),
            (&["data.task=binary-class"], "data.task names the task of a `npz` file's labels; `digits` has its own"),
            (&["data.name=npz", "data.root=x.npz", "data.task=binary"], "data.task: unknown MedMNIST task \"binary\""),
            (&["model.encoder=resnet9"], "unknown model.encoder `resnet9`"),
            (&["model.mlp=[]"], "model.mlp must list widths ≥ 1 (hidden…, output; default [64, 64, 2]), got []"),
            (&["model.mlp=[64, 0, 2]"], "got [64, 0, 2]"),
            (&["model.projector=[]"], "model.projector needs at least one width"),
            (&["model.projector=[512, 0]"], "model.projector widths must be ≥ 1 (default [512, 512]), got [512, 0]"),
            (&["eval.knn_k=0"], "eval.knn_k must be ≥ 1 (default 20), got 0"),
            (&["eval.knn_t=0"], "eval.knn_t must be > 0 (the k-NN temperature; default 0.07), got 0"),
            (&["eval.probe_c=-1"], "eval.probe_c must be > 0 (the probe's inverse L2 strength; default 1), got -1"),
            (&["eval.monitor_every=0"], "eval.monitor_every must be ≥ 1"),
            (&["eval.spectrum_top=0"], "eval.spectrum_top must be ≥ 1 while eval.spectrum_every > 0"),
            (&["model.encoder=vit_t16", "data.size=28"], "data.size must be a multiple of 16, got 28 (e.g. --size 16)"),
            (&["model.encoder=vit_s16", "data.size=40"], "got 40 (e.g. --size 32)"),
            (&["model.encoder=vit_t16", "data.size=32", "train.local_views=2"], "the local views' side must be a multiple of 16, got 14 (train.local_size 0: ⌈32·96/224⌉)"),
        ];
        for (sets, expected) in cases {
            let e = refused(sets);
            assert!(e.contains(expected), "{sets:?}: `{expected}` not in `{e}`");
        }
        // At the edges of their ranges, values are accepted.
        resolve(&[
            "train.min_lr=0.001",
            "train.betas=[0.0, 0.0]",
            "train.momentum=0",
            "train.probe_lr=0",
            "train.weight_decay=0",
            "train.local_scale=[1.0, 1.0]",
            "eval.spectrum_every=0",
            "eval.spectrum_top=0",
            "model.encoder=vit_t16",
            "data.size=32",
            "train.local_views=2",
            "train.local_size=16",
        ])
        .unwrap();
    }

    /// A value of the wrong type names its dotted key and says what was expected, in words.
    #[test]
    fn type_errors_name_the_key() {
        let cases: &[(&str, &str)] = &[
            ("train.lr=abc", r#"train.lr: expected a number, got "abc""#),
            (
                "train.epochs=-1",
                "train.epochs: expected a whole number ≥ 0, got -1",
            ),
            (
                "train.epochs=2.5",
                "train.epochs: expected a whole number ≥ 0, got 2.5",
            ),
            (
                "train.drop_last=maybe",
                r#"train.drop_last: expected a boolean, got "maybe""#,
            ),
            (
                "train.betas=0.9",
                "train.betas: expected a tuple of size 2, got 0.9",
            ),
            (
                "train.optimizer=adam",
                "train.optimizer: unknown variant `adam`",
            ),
            (
                "data.augment_views=[{crop_scale: big}]",
                "data.augment_views[0].crop_scale: ",
            ),
        ];
        for (set, expected) in cases {
            let e = refused(&[set]);
            assert!(e.contains(expected), "{set}: `{expected}` not in `{e}`");
            assert!(!e.contains(" at line "), "{set}: {e}");
        }
    }

    /// A later mapping merges into an earlier one; a value cannot silently replace a mapping,
    /// nor a key be set under a value that is not one.
    #[test]
    fn later_sets_merge_and_never_silently_drop_earlier_ones() -> Result<()> {
        let c = resolve(&["train.lr=0.1", "train={epochs: 3}"])?;
        assert_eq!((c.train.lr, c.train.epochs), (0.1, 3));
        let c = resolve(&["objective.params.mu=10", "objective={params: {lambda: 2}}"])?;
        let p = &c.objective.params;
        assert_eq!(
            (p["mu"].as_f64(), p["lambda"].as_f64()),
            (Some(10.0), Some(2.0))
        );
        // `~` resets a mapping, which a value may then replace; a later scalar replaces a scalar.
        let c = resolve(&[
            "train={lr: 0.1}",
            "train=~",
            "train.epochs=3",
            "train.epochs=4",
        ])?;
        assert_eq!((c.train.lr, c.train.epochs), (1e-3, 4));
        let e = refused(&["train=3", "train.lr=0.1"]);
        assert!(
            e.contains("--set train.lr=0.1: `train` is `3` (given earlier), not a mapping"),
            "{e}"
        );
        let e = refused(&["train.lr=0.1", "train=3"]);
        assert!(
            e.contains(r#"--set train=3: `train` holds the keys `{"lr":0.1}` (given earlier)"#),
            "{e}"
        );
        let e = refused(&["objective.params.mu=10", "objective={params: 5}"]);
        assert!(e.contains("`objective.params` holds the keys"), "{e}");
        for bad in ["=3", "train..lr=3", ".lr=3"] {
            let e = refused(&[bad]);
            assert!(e.contains("is not a dotted key"), "{bad}: {e}");
        }
        Ok(())
    }

    /// The default warm-up fits short runs; a given one longer than the run is refused.
    #[test]
    fn the_default_warmup_fits_the_epochs() -> Result<()> {
        assert_eq!(resolve(&["train.epochs=1"])?.train.warmup_epochs, 1);
        assert_eq!(resolve(&[])?.train.warmup_epochs, 2);
        let e = refused(&["train.epochs=1", "train.warmup_epochs=2"]);
        assert!(
            e.contains("train.warmup_epochs must be ≤ train.epochs (1)"),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn thread_counts_are_capped_at_a_multiple_of_the_cores() -> Result<()> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(capped_threads(0), 0);
        assert_eq!(capped_threads(3), 3);
        assert_eq!(capped_threads(usize::MAX), MAX_THREADS_PER_CORE * cores);
        let c = resolve(&["train.threads=1000000000"])?;
        assert_eq!(c.train.threads, MAX_THREADS_PER_CORE * cores);
        Ok(())
    }

    #[test]
    fn config_files_are_read_up_to_a_size_limit() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("recipe.yaml");
        std::fs::write(&path, "train:\n  lr: 0.5\n")?;
        assert_eq!(
            RunConfig::from_file(&path)?["train"]["lr"].as_f64(),
            Some(0.5)
        );
        std::fs::write(&path, vec![b'#'; MAX_CONFIG_BYTES as usize + 1])?;
        let e = RunConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("is larger than 1 MiB"), "{e}");
        let e = RunConfig::from_file(&dir.path().join("absent.yaml")).unwrap_err();
        assert!(e.to_string().contains("cannot read config file"), "{e}");
        std::fs::write(&path, "train: [unclosed")?;
        let e = RunConfig::from_file(&path).unwrap_err();
        assert!(e.to_string().contains("is not valid YAML"), "{e}");
        Ok(())
    }
}
