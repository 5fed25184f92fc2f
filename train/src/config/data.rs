//! `data:` — which data set, its split, its views and how its samples are read.

use std::ops::Bound::Excluded;
use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use serde::{Deserialize, Serialize};
use ssl_data::scans::Intensity;
use ssl_data::{DataSource, ImageAugment, Normalization, Recipe, ViewTypes, VolumeAugment};

use super::*;

/// The side of a folder of scans' images (and volumes) unless `data.size` is given:
/// MedMNIST+'s 64, small enough for a CPU, large enough for a 3D ResNet-18's five strides.
pub const SCAN_SIZE: usize = 64;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `digits` (embedded scikit-learn digits), `gmm` (IConE's 2-D Gaussian mixture), a
    /// MedMNIST dataset (`bloodmnist`, `organmnist3d`, …) read from `root`, a benchmark set read
    /// from its official archive in `root` (`cifar10`, `cifar100`, `cifar100-coarse`, `stl10`,
    /// `tiny-imagenet`), `caltech256` (the extracted `256_ObjectCategories` in `root`, or `root`
    /// itself), or `folder`: an ImageNet-style image folder at `root`.
    pub name: DataSource,
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
    pub task: Option<ssl_data::MedMnistTask>,
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
    pub(super) fn resolve_scans(&mut self, size_given: bool) {
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
        self.name == DataSource::Folder && self.intensity.is_some() && self.volumes == Some(true)
    }

    /// Fills `augment` and `normalize` with the data set's defaults, so the run's
    /// `config.yaml` names the recipe it trained with.
    pub fn resolve(&mut self) {
        self.augment = Some(self.recipe());
        self.normalize = Some(self.normalization());
    }

    /// `augment`, or the data set's recipe.
    pub fn recipe(&self) -> Recipe {
        self.augment.unwrap_or(match self.name {
            DataSource::Digits => Recipe::Digits,
            DataSource::GaussianMixture => Recipe::Noise,
            DataSource::Folder if self.intensity.is_some() => match self.volumes {
                Some(true) => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
            DataSource::Folder | DataSource::Caltech256 | DataSource::Archive(_) => Recipe::Simclr,
            DataSource::Npz => match self.npz_geometry() {
                Some((_, true)) => Recipe::Icone3d,
                _ => Recipe::Icone,
            },
            DataSource::MedMnist(info) if info.volumetric => Recipe::Icone3d,
            DataSource::MedMnist(_) => Recipe::Icone,
        })
    }

    /// The side of a `npz` file's images and whether they are volumes; `None` when the file
    /// cannot be read yet (loading it then says why).
    pub(super) fn npz_geometry(&self) -> Option<(usize, bool)> {
        self.root
            .as_deref()
            .and_then(|f| ssl_data::npz_geometry(f).ok())
    }

    /// `normalize`, or the benchmark set's statistics under a photo recipe, or the recipe's.
    pub fn normalization(&self) -> Normalization {
        self.normalize.unwrap_or_else(
            || match (self.recipe().default_normalization(), self.name) {
                (Normalization::Imagenet, DataSource::Archive(info)) => info.normalization,
                (recipe, _) => recipe,
            },
        )
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            name: DataSource::Digits,
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

    pub(super) fn validate(&self) -> Result<()> {
        at_least_one("data.size", self.size, " (the image side in pixels)")?;
        if self.keep_side > 0 {
            ensure!(
                matches!(self.name, DataSource::Folder | DataSource::Caltech256),
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
        if let DataSource::Archive(info) = self.name {
            ensure!(
                self.size == info.side,
                "data.size is {}, but {} holds {side}×{side} images; set --size {side}",
                self.size,
                self.name,
                side = info.side
            );
        }
        if self.name == DataSource::Npz {
            ensure!(
                self.root.is_some(),
                "data set `npz` needs its file: set data.root (or --root FILE.npz, or give the \
                 file as --data FILE.npz)"
            );
        }
        ensure!(
            self.task.is_none() || self.name == DataSource::Npz,
            "data.task names the task of a `npz` file's labels; `{}` has its own, so drop it",
            self.name
        );
        ensure!(
            !self.clutter || self.name == DataSource::Caltech256,
            "data.clutter adds Caltech-256's 257.clutter category, but data.name is `{}`; drop it",
            self.name
        );
        ensure!(
            self.split == TrainingSplit::Train
                || matches!(self.name, DataSource::Archive(info) if info.splits[2] > 0),
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
        let scans = self.name == DataSource::Folder && self.intensity.is_some();
        for (key, set) in [
            ("data.intensity", self.intensity.is_some()),
            ("data.volumes", self.volumes.is_some()),
            ("data.skip_bad", self.skip_bad),
            ("data.spacing", self.spacing.is_some()),
        ] {
            ensure!(
                !set || self.name == DataSource::Folder,
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
