//! MedMNIST v2 / MedMNIST+ (Yang et al., "MedMNIST v2 – A large-scale lightweight benchmark for
//! 2D and 3D biomedical image classification", Scientific Data 10, 41, 2023): the 18 datasets'
//! facts from the official `medmnist/info.py` v3.0.2 (docs/spec/data.md §1.3–1.4) and their `.npz`
//! files read into a [`Dataset`].
//!
//! A file `{flag}.npz` (size 28) or `{flag}_{size}.npz` holds `{train,val,test}_{images,labels}`:
//! images `u8` `(N, S, S)` grey, `(N, S, S, 3)` RGB (HWC) or `(N, S, S, S)` 3D; labels `(N, 1)`, or
//! `(N, 14)` 0/1 flags for ChestMNIST. Samples become `[C, S, S]` (channels first) or
//! `[1, S, S, S]` (`D, H, W` as the official 3D loader names them), `f32` in `[0, 1]`. Every
//! split's size is checked against the table, so an older release or a wrong file is an error,
//! not a silently different benchmark.
//!
//! A file of your own in the same layout (a class-balanced subset, your own images saved with
//! `np.savez_compressed`) is read by [`load_npz`]: split sizes, side, channels, 2D or 3D and the
//! classes come from the file itself ([`NpzLayout`]), through the same CRC checks and cache.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cache::{CacheBytes, Partial};
use crate::npy::{Dtype, NpyData, NpyHeader, Npz};
use crate::{Dataset, Samples};
use anyhow::{bail, ensure, Context, Result};

mod task;
pub use task::MedMnistTask;

/// The official record the files are published in (MedMNIST v3.0 data release).
pub const ZENODO_RECORD: &str = "https://zenodo.org/records/10519652/files";

/// Image sizes of the 2D datasets (the 3D ones have the first two).
pub const SIZES: [usize; 4] = [28, 64, 128, 224];

/// One MedMNIST dataset.
#[derive(Debug, Clone, PartialEq)]
pub struct MedMnistInfo {
    /// The flag, e.g. `bloodmnist`.
    pub flag: &'static str,
    /// Imaging modality.
    pub modality: &'static str,
    /// The task type, which says how labels are read and scored.
    pub task: MedMnistTask,
    /// Image channels (1 or 3).
    pub channels: usize,
    /// Classes (ChestMNIST: binary labels).
    pub classes: usize,
    /// Images in the official train, val and test splits.
    pub splits: [usize; 3],
    /// MD5 of the file at each size of [`SIZES`] (`None`: not published).
    pub md5: [Option<&'static str>; 4],
    /// Volumes (`S×S×S`) rather than images.
    pub volumetric: bool,
}

impl MedMnistInfo {
    /// Label columns per image: the classes for the multi-label ChestMNIST, else 1.
    pub fn label_columns(&self) -> usize {
        match self.is_multi_label() {
            true => self.classes,
            false => 1,
        }
    }

    /// Whether each image carries several 0/1 labels (ChestMNIST).
    pub fn is_multi_label(&self) -> bool {
        self.task == MedMnistTask::MultiLabel
    }

    /// The published sizes.
    pub fn sizes(&self) -> Vec<usize> {
        SIZES
            .iter()
            .zip(&self.md5)
            .filter(|(_, md5)| md5.is_some())
            .map(|(&s, _)| s)
            .collect()
    }

    /// The MD5 of the file at `size`, or an error listing the published sizes.
    pub fn md5_at(&self, size: usize) -> Result<&'static str> {
        SIZES
            .iter()
            .position(|&s| s == size)
            .and_then(|i| self.md5[i])
            .with_context(|| {
                format!(
                    "{} is published at sizes {:?}, not {size}",
                    self.flag,
                    self.sizes()
                )
            })
    }

    /// `{flag}.npz` at 28, `{flag}_{size}.npz` otherwise.
    pub fn file_name(&self, size: usize) -> String {
        match size {
            28 => format!("{}.npz", self.flag),
            _ => format!("{}_{size}.npz", self.flag),
        }
    }

    /// The official download address of the file at `size`.
    pub fn url(&self, size: usize) -> String {
        format!("{ZENODO_RECORD}/{}?download=1", self.file_name(size))
    }

    /// The shape of one stored image at `size` (without the leading N).
    pub fn stored_shape(&self, size: usize) -> Vec<usize> {
        match (self.volumetric, self.channels) {
            (true, _) => vec![size, size, size],
            (false, 1) => vec![size, size],
            (false, c) => vec![size, size, c],
        }
    }

    /// The shape of one sample in the [`Dataset`]: `[C, S, S]` or `[1, S, S, S]`.
    pub fn sample_shape(&self, size: usize) -> Vec<usize> {
        match self.volumetric {
            true => vec![1, size, size, size],
            false => vec![self.channels, size, size],
        }
    }
}

impl MedMnistInfo {
    /// What the published table fixes for the file at `size`.
    pub fn layout(&self, size: usize) -> NpzLayout {
        NpzLayout {
            name: self.flag.to_string(),
            size,
            channels: self.channels,
            volumetric: self.volumetric,
            splits: self.splits,
            classes: self.classes,
            multi_label: self.is_multi_label(),
        }
    }
}

/// What a MedMNIST-layout `.npz` holds: for an official file, its row of the published table
/// ([`MedMnistInfo::layout`]); for a file of your own, what its headers and labels say
/// ([`load_npz`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpzLayout {
    /// The name errors and the [`Dataset`] carry: the flag, or the file's stem.
    pub name: String,
    /// Image side `S`.
    pub size: usize,
    /// Image channels (1 or 3; volumes have 1).
    pub channels: usize,
    /// Volumes (`S×S×S`) rather than images.
    pub volumetric: bool,
    /// Images in the train, val and test splits.
    pub splits: [usize; 3],
    /// Classes; for multi-label files the number of 0/1 label columns.
    pub classes: usize,
    /// Whether each image carries several 0/1 labels (ChestMNIST's layout).
    pub multi_label: bool,
}

impl NpzLayout {
    /// Label columns per image: the flags of a multi-label file, else 1.
    pub fn label_columns(&self) -> usize {
        match self.multi_label {
            true => self.classes,
            false => 1,
        }
    }

    /// The shape of one stored image (without the leading N).
    pub fn stored_shape(&self) -> Vec<usize> {
        let s = self.size;
        match (self.volumetric, self.channels) {
            (true, _) => vec![s, s, s],
            (false, 1) => vec![s, s],
            (false, c) => vec![s, s, c],
        }
    }

    /// The shape of one sample in the [`Dataset`]: `[C, S, S]` or `[1, S, S, S]`.
    pub fn sample_shape(&self) -> Vec<usize> {
        match self.volumetric {
            true => vec![1, self.size, self.size, self.size],
            false => vec![self.channels, self.size, self.size],
        }
    }
}

const fn info(
    flag: &'static str,
    modality: &'static str,
    task: MedMnistTask,
    channels: usize,
    classes: usize,
    splits: [usize; 3],
    md5: [Option<&'static str>; 4],
) -> MedMnistInfo {
    MedMnistInfo {
        flag,
        modality,
        task,
        channels,
        classes,
        splits,
        md5,
        volumetric: md5[2].is_none(),
    }
}

const MC: MedMnistTask = MedMnistTask::MultiClass;
const BIN: MedMnistTask = MedMnistTask::Binary;

/// The 18 datasets (spec data §1.3–1.4).
pub static DATASETS: [MedMnistInfo; 18] = [
    info(
        "pathmnist",
        "colon pathology (H&E)",
        MC,
        3,
        9,
        [89_996, 10_004, 7_180],
        [
            Some("a8b06965200029087d5bd730944a56c1"),
            Some("55aa9c1e0525abe5a6b9d8343a507616"),
            Some("ac42d08fb904d92c244187169d1fd1d9"),
            Some("2c51a510bcdc9cf8ddb2af93af1eadec"),
        ],
    ),
    info(
        "chestmnist",
        "chest X-ray",
        MedMnistTask::MultiLabel,
        1,
        14,
        [78_468, 11_219, 22_433],
        [
            Some("02c8a6516a18b556561a56cbdd36c4a8"),
            Some("9de6cd0b934ebb5b7426cfba5efbae16"),
            Some("db107e5590b27930b62dbaf558aebee3"),
            Some("45bd33e6f06c3e8cdb481c74a89152aa"),
        ],
    ),
    info(
        "dermamnist",
        "dermatoscope",
        MC,
        3,
        7,
        [7_007, 1_003, 2_005],
        [
            Some("0744692d530f8e62ec473284d019b0c7"),
            Some("b70a2f5635c6199aeaa28c31d7202e1f"),
            Some("2defd784463fa5243564e855ed717de1"),
            Some("8974907d8e169bef5f5b96bc506ae45d"),
        ],
    ),
    info(
        "octmnist",
        "retinal OCT",
        MC,
        1,
        4,
        [97_477, 10_832, 1_000],
        [
            Some("c68d92d5b585d8d81f7112f81e2d0842"),
            Some("e229e9440236b774d9f0dfef9d07bdaf"),
            Some("0a97e76651ace45c5d943ee3f65b63ae"),
            Some("abc493b6d529d5de7569faaef2773ba3"),
        ],
    ),
    info(
        "pneumoniamnist",
        "paediatric chest X-ray",
        BIN,
        1,
        2,
        [4_708, 524, 624],
        [
            Some("28209eda62fecd6e6a2d98b1501bb15f"),
            Some("8f4eceb4ccffa70c672198ea285246c6"),
            Some("05b46931834c231683c68f40c47b2971"),
            Some("d6a3c71de1b945ea11211b03746c1fe1"),
        ],
    ),
    info(
        "retinamnist",
        "fundus camera",
        MedMnistTask::Ordinal,
        3,
        5,
        [1_080, 120, 400],
        [
            Some("bd4c0672f1bba3e3a89f0e4e876791e4"),
            Some("afda852cc34dcda56f86ad2b2457dbcc"),
            Some("e48e916a24454daf90583d4e6efb1a18"),
            Some("eae7e3b6f3fcbda4ae613ebdcbe35348"),
        ],
    ),
    info(
        "breastmnist",
        "breast ultrasound",
        BIN,
        1,
        2,
        [546, 78, 156],
        [
            Some("750601b1f35ba3300ea97c75c52ff8f6"),
            Some("742edef2a1fd1524b2efff4bd7ba9364"),
            Some("363e4b3f8d712e9b5de15470a2aaadf1"),
            Some("b56378a6eefa9fed602bb16d192d4c8b"),
        ],
    ),
    info(
        "bloodmnist",
        "blood-cell microscopy",
        MC,
        3,
        8,
        [11_959, 1_712, 3_421],
        [
            Some("7053d0359d879ad8a5505303e11de1dc"),
            Some("2b94928a2ae4916078ca51e05b6b800b"),
            Some("adace1e0ed228fccda1f39692059dd4c"),
            Some("b718ff6835fcbdb22ba9eacccd7b2601"),
        ],
    ),
    info(
        "tissuemnist",
        "kidney-cortex microscopy",
        MC,
        1,
        8,
        [165_466, 23_640, 47_280],
        [
            Some("ebe78ee8b05294063de985d821c1c34b"),
            Some("123ece2eba09d0aa5d698fda57103344"),
            Some("61b955355d7425a89687b06cca3ce0c2"),
            Some("b077128c4a949f0a4eb01517f9037b9c"),
        ],
    ),
    info(
        "organamnist",
        "abdominal CT, axial",
        MC,
        1,
        11,
        [34_561, 6_491, 17_778],
        [
            Some("68e3f8846a6bd62f0c9bf841c0d9eacc"),
            Some("2dcccc29b88e6da5a01161ef20cda288"),
            Some("eeae80d0a227a8d099027e1b3cfd3b60"),
            Some("50747347e05c87dd3aaf92c49f9f3170"),
        ],
    ),
    info(
        "organcmnist",
        "abdominal CT, coronal",
        MC,
        1,
        11,
        [12_975, 2_392, 8_216],
        [
            Some("b9ceb9546e10131b32923c5bbeaea2b1"),
            Some("3ce34a8724ea6f548e6db4744d03b6a9"),
            Some("773c1f009daa3fe5d9a2a201b2a7ed94"),
            Some("050f5e875dc056f6768abf94ec9995d1"),
        ],
    ),
    info(
        "organsmnist",
        "abdominal CT, sagittal",
        MC,
        1,
        11,
        [13_932, 2_452, 8_827],
        [
            Some("9ab87b696fb54e2a387ebe992d6ed5f1"),
            Some("53a6d115339d874c25e309a994ff46d3"),
            Some("ded0c5fa01a95dc4978b956f613e9b8e"),
            Some("b354719e553fbbb2513d5533f52a4cb1"),
        ],
    ),
    info(
        "organmnist3d",
        "abdominal CT",
        MC,
        1,
        11,
        [971, 161, 610],
        [
            Some("a0c5a1ff56af4f155c46d46fbb45a2fe"),
            Some("58a2205adf14a9d0a189cb06dc78bf10"),
            None,
            None,
        ],
    ),
    info(
        "nodulemnist3d",
        "chest CT",
        BIN,
        1,
        2,
        [1_158, 165, 310],
        [
            Some("8755a7e9e05a4d9ce80a24c3e7a256f3"),
            Some("c47c5b7d457bf6332200d2ea6d64ecd8"),
            None,
            None,
        ],
    ),
    info(
        "adrenalmnist3d",
        "shape masks from abdominal CT",
        BIN,
        1,
        2,
        [1_188, 98, 298],
        [
            Some("bbd3c5a5576322bc4cdfea780653b1ce"),
            Some("17721accfe9fb005146a47d33bc54b2f"),
            None,
            None,
        ],
    ),
    info(
        "fracturemnist3d",
        "chest CT",
        MC,
        1,
        3,
        [1_027, 103, 240],
        [
            Some("6aa7b0143a6b42da40027a9dda61302f"),
            Some("f01d7e6316aedf4210da0da5b7437b42"),
            None,
            None,
        ],
    ),
    info(
        "vesselmnist3d",
        "shape (voxelised MRA vessel meshes)",
        BIN,
        1,
        2,
        [1_335, 191, 382],
        [
            Some("b41fd4f7e7e2feedddb201585ecafa1b"),
            Some("6bb274a8846e1097066dcd64e2c4520f"),
            None,
            None,
        ],
    ),
    info(
        "synapsemnist3d",
        "electron microscopy",
        BIN,
        1,
        2,
        [1_230, 177, 352],
        [
            Some("1235b78a3cd6280881dd7850a78eadb6"),
            Some("43bd14ebf3af9d3dd072446fedc14d5e"),
            None,
            None,
        ],
    ),
];

/// The dataset called `flag` (case-insensitive), or an error naming the closest flag.
pub fn medmnist_info(flag: &str) -> Result<&'static MedMnistInfo> {
    let lower = flag.to_ascii_lowercase();
    if let Some(info) = DATASETS.iter().find(|d| d.flag == lower) {
        return Ok(info);
    }
    let closest = DATASETS
        .iter()
        .min_by_key(|d| strsim::levenshtein(d.flag, &lower))
        .expect("18 datasets");
    bail!(
        "unknown MedMNIST dataset `{flag}` (did you mean `{}`?); known: {}",
        closest.flag,
        DATASETS
            .iter()
            .map(|d| d.flag)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The official splits in file order.
pub const SPLITS: [&str; 3] = ["train", "val", "test"];

/// A MedMNIST file read into one [`Dataset`]: the train, val and test splits one after another.
#[derive(Debug, Clone)]
pub struct MedMnist {
    /// The published facts of an official file; `None` for a file of your own.
    pub info: Option<&'static MedMnistInfo>,
    /// What the file holds.
    pub layout: NpzLayout,
    /// All three splits; `labels` holds the class, and for ChestMNIST whether the image has
    /// any finding (0 = none of the 14, 1 = at least one; the flags are in `label_matrix`).
    pub dataset: Dataset,
    /// Positions of the train, val and test images in `dataset`.
    pub splits: [Range<usize>; 3],
    /// Every label column, row-major `len × layout.label_columns()` (ChestMNIST's 14 flags).
    pub label_matrix: Vec<u32>,
}

/// Where the file of `flag` at `size` is under `root`: `root` itself when it is a file, else
/// `root/{file name}`.
pub fn medmnist_path(root: &Path, info: &MedMnistInfo, size: usize) -> PathBuf {
    match root.is_file() {
        true => root.to_path_buf(),
        false => root.join(info.file_name(size)),
    }
}

/// Reads `flag` at `size` from `root` (a directory of `.npz` files or the file itself). The
/// images are inflated once, as a stream, into the cache file [`image_cache_path`] beside the
/// `.npz` and memory-mapped from it, so they are never held decoded in memory; the labels are
/// read from the archive. Every member read is checked against its CRC-32, so a corrupt file is
/// refused here, before anything trains, with the command that downloads it again.
pub fn load_medmnist(root: &Path, flag: &str, size: usize) -> Result<MedMnist> {
    let info = medmnist_info(flag)?;
    let md5 = info.md5_at(size)?;
    let path = medmnist_path(root, info, size);
    ensure!(
        path.exists(),
        "{} not found; fetch it with `ssl data download {} --size {size}` or from {} (MD5 \
         {md5}) into {}, or point data.root at the file",
        path.display(),
        info.flag,
        info.url(size),
        root.display()
    );
    let dir = path.parent().unwrap_or(Path::new("."));
    let fix = format!(
        "download it again with `ssl data download {} --size {size} --dir {}`",
        info.flag,
        dir.display()
    );
    let mut npz = Npz::open(&path, &fix)?;
    let layout = info.layout(size);
    let mut label_matrix = Vec::with_capacity(info.splits.iter().sum::<usize>());
    for (s, split) in SPLITS.iter().enumerate() {
        let (header, values) = npz.read(&format!("{split}_labels"))?;
        let values = label_values(&layout, split, layout.splits[s], &header, &values)?;
        check_label_range(&layout, split, &values, info.task)?;
        label_matrix.extend(values.into_iter().map(|v| v as u32));
    }
    let pixels = cached_images(&mut npz, &path, &layout)?;
    Ok(MedMnist::new(Some(info), layout, pixels, label_matrix))
}

/// Reads a `.npz` of your own in MedMNIST's layout: `train_images` and `test_images` (and
/// `val_images` if present) of `u8` `(N, S, S)` grey, `(N, S, S, 3)` RGB or `(N, S, S, S)`
/// volumes, with `{split}_labels` of integers `(N,)` or `(N, 1)` (classes `0..K`, K the largest
/// label + 1), or `(N, K)` 0/1 flags (multi-label, as ChestMNIST). Any split sizes; the images
/// are checked and cached exactly as an official file's ([`load_medmnist`]). The data set is
/// named after the file's stem.
pub fn load_npz(path: &Path) -> Result<MedMnist> {
    ensure!(
        path.is_file(),
        "{} not found; give a .npz file in MedMNIST's layout (train_images, train_labels, \
         val_…, test_…), as np.savez_compressed writes it",
        path.display()
    );
    let fix = "write it again (np.savez_compressed) and check the copy";
    let mut npz = Npz::open(path, fix)?;
    let name = path
        .file_stem()
        .map_or_else(|| "npz".into(), |s| s.to_string_lossy().into_owned());
    let held = npz.names();
    let mut splits = [0usize; 3];
    let mut shape: Option<(&str, Vec<usize>)> = None;
    // Each split's labels; `None` for a val split the file leaves out.
    let mut labels: Vec<Option<(NpyHeader, Vec<u8>)>> = Vec::new();
    for (s, split) in SPLITS.iter().enumerate() {
        let images = format!("{split}_images");
        if *split == "val" && !held.contains(&images) && !held.contains(&"val_labels".into()) {
            labels.push(None);
            continue;
        }
        let h = npz.header(&images)?;
        ensure!(
            h.dtype == Dtype::U8 && !h.shape.is_empty(),
            "{name}: {images} is {:?} of shape {:?}; MedMNIST's layout stores u8 images \
             (N, S, S), (N, S, S, 3) or (N, S, S, S)",
            h.dtype,
            h.shape
        );
        splits[s] = h.shape[0];
        let one = h.shape[1..].to_vec();
        match &shape {
            None => shape = Some((split, one)),
            Some((first, want)) => ensure!(
                *want == one,
                "{name}: {images} holds images of shape {one:?}, {first}_images of {want:?}; \
                 every split must hold one shape"
            ),
        }
        labels.push(Some(npz.read(&format!("{split}_labels"))?));
    }
    let (_, one) = shape.expect("train_images was read");
    let (size, channels, volumetric) = image_geometry(&name, &one)?;
    ensure!(
        size > 0 && splits[0] > 0 && splits[2] > 0,
        "{name}: needs train and test images, holds {} and {}",
        splits[0],
        splits[2]
    );
    let train_labels = &labels[0].as_ref().expect("train_labels was read").0;
    let columns = train_labels.shape.get(1).copied().unwrap_or(1);
    let mut layout = NpzLayout {
        name,
        size,
        channels,
        volumetric,
        splits,
        classes: columns,
        multi_label: columns > 1,
    };
    let mut label_matrix = Vec::new();
    for (s, read) in labels.iter().enumerate() {
        let Some((header, values)) = read else {
            continue;
        };
        let values = label_values(&layout, SPLITS[s], splits[s], header, values)?;
        if let Some(&bad) = values.iter().find(|&&v| v < 0) {
            bail!(
                "{}: {}_labels holds {bad}; labels are classes 0, 1, … or 0/1 flags",
                layout.name,
                SPLITS[s]
            );
        }
        label_matrix.extend(values);
    }
    if !layout.multi_label {
        layout.classes = label_matrix.iter().max().map_or(1, |&m| m as usize + 1);
        ensure!(
            layout.classes >= 2,
            "{}: every label is {}; a probe needs at least two classes",
            layout.name,
            label_matrix[0]
        );
    }
    if layout.multi_label {
        for (s, split) in SPLITS.iter().enumerate() {
            let from = splits[..s].iter().sum::<usize>() * columns;
            let rows = &label_matrix[from..from + splits[s] * columns];
            check_label_range(&layout, split, rows, "multi-label")?;
        }
    }
    let pixels = cached_images(&mut npz, path, &layout)?;
    let label_matrix = label_matrix.into_iter().map(|v| v as u32).collect();
    Ok(MedMnist::new(None, layout, pixels, label_matrix))
}

/// Side, channels and whether volumes, of stored images of shape `one` (without the N).
fn image_geometry(name: &str, one: &[usize]) -> Result<(usize, usize, bool)> {
    Ok(match *one {
        [h, w] if h == w => (h, 1, false),
        [h, w, c] if h == w && (c == 1 || c == 3) => (h, c, false),
        [d, h, w] if d == h && h == w => (d, 1, true),
        _ => bail!(
            "{name}: images of shape {one:?} are none of MedMNIST's: (S, S) grey, (S, S, 3) RGB \
             or (S, S, S) volumes"
        ),
    })
}

/// The image side of a file of your own and whether it holds volumes, from the header of its
/// `train_images` alone (to size a run before [`load_npz`] reads the file).
pub fn npz_geometry(path: &Path) -> Result<(usize, bool)> {
    let mut npz = Npz::open(path, "write it again (np.savez_compressed)")?;
    let h = npz.header("train_images")?;
    let name = path.display().to_string();
    let (size, _, volumetric) = image_geometry(&name, h.shape.get(1..).unwrap_or_default())?;
    Ok((size, volumetric))
}

impl MedMnist {
    /// The data set of `layout` over its cached `pixels` and every label column; a multi-label
    /// image's class is whether it has any finding.
    fn new(
        info: Option<&'static MedMnistInfo>,
        layout: NpzLayout,
        pixels: CacheBytes,
        label_matrix: Vec<u32>,
    ) -> Self {
        let labels = label_matrix
            .chunks_exact(layout.label_columns())
            .map(|row| match layout.multi_label {
                true => u32::from(row.contains(&1)),
                false => row[0],
            })
            .collect();
        let [train, val, _] = layout.splits;
        let total = layout.splits.iter().sum::<usize>();
        let dataset = Dataset {
            name: layout.name.clone(),
            samples: Samples::U8 {
                bytes: Arc::new(pixels),
                channels_last: (!layout.volumetric && layout.channels > 1)
                    .then_some(layout.channels),
            },
            labels,
            shape: layout.sample_shape(),
            num_classes: match layout.multi_label {
                true => 2,
                false => layout.classes,
            },
        };
        Self {
            info,
            dataset,
            splits: [0..train, train..train + val, train + val..total],
            layout,
            label_matrix,
        }
    }
}

/// The decoded-image cache of the `.npz` at `path`: `{path without .npz}.images.u8`, the train,
/// val and test images' stored bytes back to back, then the cache trailer.
pub fn image_cache_path(path: &Path) -> PathBuf {
    path.with_extension("images.u8")
}

/// The memory-mapped image bytes of all three splits, from the cache when it was made from an
/// archive with the same content key as `npz` ([`Npz::content_key`]: its length and each
/// member's CRC-32 and sizes, never its modification time), else inflated into it first, every
/// member's CRC-32 checked (a partial file renamed into place once whole, so a corrupt archive or
/// an interrupted run leaves no cache).
fn cached_images(npz: &mut Npz, path: &Path, layout: &NpzLayout) -> Result<CacheBytes> {
    let per_image: usize = layout.stored_shape().iter().product();
    let total = layout.splits.iter().sum::<usize>() * per_image;
    let cache = image_cache_path(path);
    let key = format!(
        "candle-ssl MedMNIST images v2: {} at {}\n{}",
        layout.name,
        layout.size,
        npz.content_key()
    );
    let fix = "the decoded-image cache goes beside the .npz: copy the file into a writable \
               directory and point data.root there";
    crate::cache::cached(&cache, total, key.as_bytes(), fix, |out| {
        for (s, split) in SPLITS.iter().enumerate() {
            if layout.splits[s] == 0 && !npz.names().contains(&format!("{split}_images")) {
                continue;
            }
            let header = npz.stream(&format!("{split}_images"), |h, chunk| {
                check_images(layout, s, h)?;
                out.write_all(chunk)
                    .with_context(|| format!("writing {} (disk full?)", cache.display()))
            })?;
            check_images(layout, s, &header)?;
        }
        Ok(())
    })
}

/// What a file that fails the published table's check should do instead.
const OWN_FILE: &str = "an older MedMNIST release, or a file of your own? Train on a file of \
                        your own in MedMNIST's layout with `--data npz --root FILE`";

fn check_images(layout: &NpzLayout, split: usize, h: &NpyHeader) -> Result<()> {
    let mut want = vec![layout.splits[split]];
    want.extend(layout.stored_shape());
    let split = SPLITS[split];
    ensure!(
        h.dtype == Dtype::U8,
        "{}: {split}_images has dtype {:?}, MedMNIST stores u8",
        layout.name,
        h.dtype
    );
    ensure!(
        h.shape == want,
        "{}: {split}_images has shape {:?}, expected {:?} for {} at size {} ({OWN_FILE})",
        layout.name,
        h.shape,
        want,
        layout.name,
        layout.size
    );
    Ok(())
}

/// A split's label values, row-major `n × label_columns`, its shape checked.
fn label_values(
    layout: &NpzLayout,
    split: &str,
    n: usize,
    h: &NpyHeader,
    bytes: &[u8],
) -> Result<Vec<i64>> {
    let columns = layout.label_columns();
    ensure!(
        h.shape == [n, columns] || (columns == 1 && h.shape == [n]),
        "{}: {split}_labels has shape {:?}, expected [{n}, {columns}] ({OWN_FILE})",
        layout.name,
        h.shape
    );
    Ok(match h.dtype {
        Dtype::U8 => bytes.iter().map(|&v| i64::from(v)).collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes"))))
            .collect(),
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect(),
        Dtype::F32 => bail!(
            "{}: {split}_labels are float32; MedMNIST labels are integers (u8, i32 or i64)",
            layout.name
        ),
    })
}

/// Refuses a label outside the classes (outside 0/1 for a multi-label file's flags).
fn check_label_range(
    layout: &NpzLayout,
    split: &str,
    values: &[i64],
    task: impl std::fmt::Display,
) -> Result<()> {
    let bound = match layout.multi_label {
        true => 2,
        false => layout.classes as i64,
    };
    if let Some(bad) = values.iter().find(|&&v| !(0..bound).contains(&v)) {
        bail!(
            "{}: {split}_labels holds {bad}, outside 0..{bound} for its {task} task",
            layout.name
        );
    }
    Ok(())
}

/// Writes a MedMNIST-layout `.npz` (DEFLATE, like `np.savez_compressed`) of `layout`: per split
/// (train, val, test) the stored `u8` images (`N × stored_shape`) and `u8` labels
/// (`N × label_columns`). Written to a partial file beside `path` and renamed into place once
/// whole; its mode follows the umask.
pub fn write_medmnist_npz(
    path: &Path,
    layout: &NpzLayout,
    splits: [(NpyData, NpyData); 3],
) -> Result<()> {
    let names = SPLITS.map(|split| [format!("{split}_images"), format!("{split}_labels")]);
    let mut arrays = Vec::new();
    for (((images, labels), [image_name, label_name]), &n) in
        splits.into_iter().zip(&names).zip(&layout.splits)
    {
        let mut shape = vec![n];
        shape.extend(layout.stored_shape());
        let images_header = NpyHeader {
            dtype: Dtype::U8,
            shape,
        };
        let labels_header = NpyHeader {
            dtype: Dtype::U8,
            shape: vec![n, layout.label_columns()],
        };
        arrays.push((image_name.as_str(), images_header, images));
        arrays.push((label_name.as_str(), labels_header, labels));
    }
    let partial = Partial::create(path, "choose a writable directory")?;
    crate::npy::write_npz(partial.file(), arrays, true)
        .with_context(|| format!("writing {}", path.display()))?;
    partial.persist()
}

/// The embedded digits packed in the exact layout and split sizes of MedMNIST dataset `flag` at
/// `size` (digits cycled; label = digit mod the classes, ChestMNIST's flag j = whether the digit
/// is odd and `(digit + j) mod 3 = 0`, so even digits have no finding; RGB tints the grey image
/// per channel; a volume stacks the image `size` times, fading towards the ends), written to
/// `path`: real images through the same code path as the official files, for tests and for
/// trying the pipeline without them. The images are made one at a time as they are written, so
/// a 224-px layout (2.4 GB for BloodMNIST) is never held in memory.
pub fn write_digits_as_medmnist(path: &Path, flag: &str, size: usize) -> Result<()> {
    let info = medmnist_info(flag)?;
    info.md5_at(size)?;
    let digits = crate::digits(size)?;
    let tint = [1.0f32, 0.8, 0.6];
    let pixel = |v: f32| (v * 255.0).round().clamp(0.0, 255.0) as u8;
    // The bytes of the `i`-th image, digit `i` mod the digits' count.
    let image_bytes = |i: usize, out: &mut Vec<u8>| {
        let image = digits.sample(i % digits.len());
        match (info.volumetric, info.channels) {
            (true, _) => {
                for z in 0..size {
                    let fade = 1.0 - (z as f32 - size as f32 / 2.0).abs() / size as f32;
                    out.extend(image.iter().map(|&v| pixel(v * fade)));
                }
            }
            (false, 1) => out.extend(image.iter().map(|&v| pixel(v))),
            (false, c) => {
                for &v in image.iter() {
                    out.extend(tint[..c].iter().map(|t| pixel(v * t)));
                }
            }
        }
    };
    let label_bytes = |i: usize, out: &mut Vec<u8>| {
        let digit = digits.labels[i % digits.len()] as usize;
        match info.is_multi_label() {
            true => out.extend(
                (0..info.classes)
                    .map(|j| u8::from(digit % 2 == 1 && (digit + j).is_multiple_of(3))),
            ),
            false => out.push((digit % info.classes) as u8),
        }
    };
    let [train, val, _] = info.splits;
    let starts = [0, train, train + val];
    let splits = std::array::from_fn(|s| {
        let images = starts[s]..starts[s] + info.splits[s];
        let mut labels = Vec::new();
        for i in images.clone() {
            label_bytes(i, &mut labels);
        }
        let image_bytes = &image_bytes;
        let write_images = move |w: &mut dyn std::io::Write| {
            let mut bytes = Vec::new();
            for i in images.clone() {
                bytes.clear();
                image_bytes(i, &mut bytes);
                w.write_all(&bytes)?;
            }
            Ok(())
        };
        (
            NpyData::Writer(Box::new(write_images)),
            NpyData::Bytes(labels.into()),
        )
    });
    write_medmnist_npz(path, &info.layout(size), splits)
}

#[cfg(test)]
mod tests;
