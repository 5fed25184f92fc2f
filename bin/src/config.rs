//! The run configuration: typed, with the main job's values as defaults, unknown keys rejected.
//!
//! Layering: defaults ← recipe YAML (`--config`) ← `--set key=value` ← plain flags.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use ssl_data::{ImageAugment, Normalization, Recipe, VolumeAugment};
use ssl_models::autocast::Precision;
use ssl_models::Stem;

/// Everything a run needs; written resolved to `RUN_DIR/config.yaml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    pub data: DataConfig,
    pub model: ModelConfig,
    pub objective: ObjectiveSection,
    pub train: TrainConfig,
    pub eval: EvalConfig,
    /// Run directory.
    pub out: PathBuf,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            data: DataConfig::default(),
            model: ModelConfig::default(),
            objective: ObjectiveSection::default(),
            train: TrainConfig::default(),
            eval: EvalConfig::default(),
            out: PathBuf::from("runs/latest"),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `digits` (embedded scikit-learn digits), `gmm` (IConE's 2-D Gaussian mixture), a
    /// MedMNIST dataset (`bloodmnist`, `organmnist3d`, …) read from `root`, or `folder`: an
    /// ImageNet-style image folder at `root`.
    pub name: String,
    /// Side length the digits are upsampled to; the MedMNIST file's size (28, 64, 128, 224);
    /// the side a folder's images are resized (shorter side) and centre-cropped to.
    pub size: usize,
    /// Directory of MedMNIST `.npz` files (or one file); absent: `~/.medmnist`, the official
    /// package's cache. For `folder`, the folder (`root/train` + `root/val`, or `root/<class>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<PathBuf>,
    /// Held-out fraction (stratified); MedMNIST keeps its official test split instead.
    pub test_fraction: f64,
    /// Seed of the train/test split and of the subsets below; absent: the run seed. Fix it to
    /// compare model seeds on one split (IConE protocol, data.md §5.2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split_seed: Option<u64>,
    /// Train on a stratified subset of this many instances of the training partition
    /// (0: all of it).
    #[serde(skip_serializing_if = "is_zero")]
    pub train_size: usize,
    /// Partition the training (sub)set itself, stratified, into train and test by this test
    /// fraction, replacing the test partition (IConE's 80/20 of each N-subset of the official
    /// train split, data.md §5.2: `0.2`); 0: keep the official test split (MedMNIST, folders
    /// with `val/`) or the `test_fraction` split.
    #[serde(skip_serializing_if = "is_zero_f64")]
    pub subset_test_fraction: f64,
    /// Class imbalance factor k: half of the classes keep `ceil(n/k)` of their training
    /// instances (data.md §5.3); 1 = balanced. The test partition is untouched.
    #[serde(skip_serializing_if = "is_one")]
    pub imbalance: usize,
    /// Keep only these classes in both partitions (empty: all), e.g. one of SAG-VICReg's
    /// disjoint class halves (data.md §5.4); labels keep their original values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub classes: Vec<u32>,
    /// For `folder`: keep only these class directories (labels follow their sorted order);
    /// `[imagenet100]` is CMC's ImageNet-100 list. Empty: every class.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub folder_classes: Vec<String>,
    /// Augmentation recipe: digits, noise, none, icone, simclr, frossl, moco-v2, byol, vicreg,
    /// dino, swav (2D, torchvision semantics) or icone3d (volumes). Absent: by data set —
    /// digits → digits, gmm → noise, MedMNIST 2D → icone, MedMNIST 3D → icone3d,
    /// folder → simclr; the run's `config.yaml` records the choice.
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
}

impl DataConfig {
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
            "folder" => Recipe::Simclr,
            name => match ssl_data::medmnist_info(name) {
                Ok(info) if info.volumetric => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
        })
    }

    /// `normalize`, or the recipe's.
    pub fn normalization(&self) -> Normalization {
        self.normalize
            .unwrap_or_else(|| self.recipe().default_normalization())
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
            augment: None,
            normalize: None,
            augment_views: Vec::new(),
            augment_volume: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// One of [`ENCODERS`] (default: `digits_cnn`; `resnet18_3d` for MedMNIST volumes).
    pub encoder: String,
    /// MLP widths (hidden…, output) when `encoder: mlp`.
    pub mlp: Vec<usize>,
    /// Stem of the 2D ResNets: `imagenet` (7×7 stride-2 conv + max-pool) or `cifar` (3×3
    /// stride-1 conv, no pool; for images of 32 px and less).
    pub stem: Stem,
    /// Start the last batch norm of every residual block at weight 0 (Goyal et al. 2017).
    pub zero_init_residual: bool,
    /// Initial encoder weights: a safetensors file with PyTorch state-dict keys, or
    /// `torchvision:resnet50` / `timm:vit_small_patch16_224` for a converted file in the weights
    /// directory (see `ssl run --help`).
    pub init: Option<String>,
    /// Projector widths: Linear–BN–ReLU for all but the last, then Linear.
    pub projector: Vec<usize>,
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

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            encoder: "digits_cnn".into(),
            mlp: vec![64, 64, 2],
            stem: Stem::Imagenet,
            zero_init_residual: false,
            init: None,
            projector: vec![512, 512],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectiveSection {
    pub name: String,
    /// Objective keys (see `ssl describe NAME`); absent keys take the paper's defaults.
    pub params: serde_yaml::Value,
}

impl ObjectiveSection {
    /// Fills the keys absent from `params` with the objective's defaults, so the resolved
    /// `config.yaml` records every hyperparameter the run used (and `ssl compare` notices when a
    /// default changes). Keys the objective does not know are kept for its build to reject by
    /// name.
    pub fn resolve(&mut self) -> Result<()> {
        let registration = ssl_core::find(&self.name)?;
        let mut resolved = match (registration.default_config)() {
            serde_yaml::Value::Mapping(defaults) => defaults,
            _ => serde_yaml::Mapping::new(),
        };
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
        Ok(())
    }
}

impl Default for ObjectiveSection {
    fn default() -> Self {
        Self {
            name: "vicreg".into(),
            params: serde_yaml::Value::Mapping(Default::default()),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Adamw,
    Sgd,
    Lars,
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
    /// CPU threads (0 = all cores).
    pub threads: usize,
    /// `cpu`, `cuda[:N]` or `metal`.
    pub device: String,
    /// Online linear probe learning rate (0 disables the probe), with the backbone's optimiser
    /// and schedule and no weight decay. Spec metrics §2 gives 0.1–0.3 as typical; on digits
    /// after 50 epochs 1e-3 left the probe 16 pt under the offline one, 0.1 about 2 pt.
    pub probe_lr: f64,
    /// Checkpoint every N epochs (the last epoch is always saved).
    pub checkpoint_every: usize,
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
            device: "cpu".into(),
            probe_lr: 0.1,
            checkpoint_every: 10,
            stop_after_epochs: 0,
            accumulate: 1,
            precision: Precision::F32,
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
        let (encoder_given, local_scale_given) =
            (given("model", "encoder"), given("train", "local_scale"));
        let mut config: RunConfig =
            serde_yaml::from_value(value).map_err(|e| anyhow::anyhow!("{e}"))?;
        config.objective.resolve()?;
        config.data.resolve();
        // Volumes get IConE's 3D ResNet-18 unless an encoder is named (the digits CNN is 2D).
        let volumes = ssl_data::medmnist_info(&config.data.name).is_ok_and(|i| i.volumetric);
        if !encoder_given && volumes {
            config.model.encoder = "resnet18_3d".into();
        }
        if !local_scale_given {
            config.train.local_scale = config.data.recipe().local_crop_scale();
        }
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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        serde_yaml::from_str(&text).with_context(|| format!("{} is not valid YAML", path.display()))
    }

    /// Checks values that types do not.
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        if t.epochs == 0 {
            bail!("train.epochs must be ≥ 1");
        }
        if t.batch_size == 0 {
            bail!("train.batch_size must be ≥ 1");
        }
        if t.views == 0 {
            bail!("train.views must be ≥ 1");
        }
        if t.accumulate == 0 {
            bail!("train.accumulate must be ≥ 1 (1: no gradient accumulation)");
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            bail!("train.lr must be > 0, got {}", t.lr);
        }
        if !(0.0..1.0).contains(&self.data.subset_test_fraction) {
            bail!(
                "data.subset_test_fraction must be in [0, 1) (0: keep the test split; IConE: 0.2), got {}",
                self.data.subset_test_fraction
            );
        }
        if !(0.0..1.0).contains(&self.data.test_fraction) || self.data.test_fraction == 0.0 {
            bail!(
                "data.test_fraction must be in (0, 1), got {}",
                self.data.test_fraction
            );
        }
        if !ENCODERS.contains(&self.model.encoder.as_str()) {
            bail!(
                "unknown model.encoder `{}`; built in: {}",
                self.model.encoder,
                ENCODERS.join(", ")
            );
        }
        if self.model.projector.is_empty() {
            bail!("model.projector needs at least one width (the output), e.g. [512, 512]");
        }
        Ok(())
    }
}

/// Applies `key.path=value` (value parsed as YAML) onto a YAML mapping.
pub fn apply_set(root: &mut serde_yaml::Value, assignment: &str) -> Result<()> {
    let Some((key, raw)) = assignment.split_once('=') else {
        bail!("--set expects key=value (e.g. train.lr=0.01), got `{assignment}`");
    };
    let value: serde_yaml::Value = serde_yaml::from_str(raw)
        .with_context(|| format!("--set {key}: `{raw}` is not a YAML value"))?;
    let mut node = root;
    for part in key.split('.') {
        if !node.is_mapping() {
            *node = serde_yaml::Value::Mapping(Default::default());
        }
        let map = node.as_mapping_mut().expect("just made a mapping");
        node = map
            .entry(serde_yaml::Value::String(part.to_string()))
            .or_insert(serde_yaml::Value::Null);
    }
    *node = value;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objective_params_are_resolved_against_the_defaults() -> Result<()> {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        apply_set(&mut root, "objective.params.lambda=1.5")?;
        apply_set(&mut root, "objective.params.gamma=2")?;
        let c = RunConfig::from_yaml_value(root)?;
        let p = &c.objective.params;
        // Given keys win, absent ones take the paper's values, unknown ones stay for the build
        // to reject by name.
        assert_eq!(
            (p["lambda"].as_f64(), p["mu"].as_f64()),
            (Some(1.5), Some(25.0))
        );
        assert_eq!(p["gamma"].as_i64(), Some(2));
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
        let resolve = |sets: &[&str]| -> Result<RunConfig> {
            let mut root = serde_yaml::Value::Mapping(Default::default());
            for set in sets {
                apply_set(&mut root, set)?;
            }
            RunConfig::from_yaml_value(root)
        };
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
        let types = crate::trainer::view_types(&tuned, &[1, 8, 8, 8])?;
        assert_eq!(types.views.len(), 1);
        let flat = crate::trainer::view_types(&tuned, &[3, 8, 8])
            .err()
            .expect("2D");
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
}
