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
    /// The official task string: `multi-class`, `binary-class`, `multi-label, binary-class` or
    /// `ordinal-regression`.
    pub task: &'static str,
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
        self.task.starts_with("multi-label")
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
    task: &'static str,
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

const MC: &str = "multi-class";
const BIN: &str = "binary-class";

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
        "multi-label, binary-class",
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
        "ordinal-regression",
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
fn check_label_range(layout: &NpzLayout, split: &str, values: &[i64], task: &str) -> Result<()> {
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
mod tests {
    use super::*;
    use crate::cache::tests::names;

    #[test]
    fn the_table_matches_the_spec() -> Result<()> {
        assert_eq!(DATASETS.len(), 18);
        assert_eq!(DATASETS.iter().filter(|d| d.volumetric).count(), 6);
        let blood = medmnist_info("BloodMNIST")?;
        assert_eq!(
            (blood.channels, blood.classes, blood.splits),
            (3, 8, [11_959, 1_712, 3_421])
        );
        assert_eq!(blood.file_name(28), "bloodmnist.npz");
        assert_eq!(blood.file_name(224), "bloodmnist_224.npz");
        assert_eq!(
            blood.url(64),
            "https://zenodo.org/records/10519652/files/bloodmnist_64.npz?download=1"
        );
        assert_eq!(blood.md5_at(224)?, "b718ff6835fcbdb22ba9eacccd7b2601");
        let organ = medmnist_info("organmnist3d")?;
        assert_eq!(organ.sizes(), [28, 64]);
        assert_eq!(organ.sample_shape(28), [1, 28, 28, 28]);
        let e = format!("{:#}", organ.md5_at(128).unwrap_err());
        assert!(e.contains("[28, 64]"), "{e}");
        assert_eq!(medmnist_info("chestmnist")?.label_columns(), 14);
        let e = format!("{:#}", medmnist_info("bloodmnst").unwrap_err());
        assert!(e.contains("did you mean `bloodmnist`"), "{e}");
        Ok(())
    }

    #[test]
    fn rgb_grey_volume_and_multi_label_files_load_channels_first() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let digits = crate::digits(28)?;
        // RGB (ordinal), grey (binary) and a volume; ChestMNIST's 112,120 images are left to
        // the label test below.
        for flag in ["retinamnist", "breastmnist", "nodulemnist3d"] {
            write_digits_as_medmnist(&dir.path().join(format!("{flag}.npz")), flag, 28)?;
            let m = load_medmnist(dir.path(), flag, 28)?;
            let info = m.info.expect("an official file");
            assert_eq!(m.layout, info.layout(28));
            assert_eq!(m.dataset.len(), info.splits.iter().sum::<usize>());
            assert_eq!(m.splits[1], info.splits[0]..info.splits[0] + info.splits[1]);
            assert_eq!(m.dataset.shape, info.sample_shape(28));
            // Image 0 is digit 0: channel c is its grey image tinted (stored HWC); a volume's
            // middle slice (D = 14) is the image unfaded.
            let plane = 28 * 28;
            let middle = if info.volumetric { 14 * plane } else { 0 };
            let first = m.dataset.sample(0);
            let first = &first[middle..];
            let expect = |v: f32, t: f32| (v * t * 255.0).round() / 255.0;
            for p in [0, 300, 407] {
                let grey = digits.sample(0)[p];
                assert!((first[p] - expect(grey, 1.0)).abs() < 1e-6, "{flag}");
                if info.channels == 3 {
                    assert!((first[2 * plane + p] - expect(grey, 0.6)).abs() < 1e-6);
                }
            }
            assert_eq!(m.dataset.labels[7], 7 % info.classes as u32);
        }
        Ok(())
    }

    #[test]
    fn images_are_decoded_once_into_a_memory_mapped_cache() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("breastmnist.npz");
        write_digits_as_medmnist(&path, "breastmnist", 28)?;
        let first = load_medmnist(dir.path(), "breastmnist", 28)?;
        let cache = image_cache_path(&path);
        assert_eq!(
            std::fs::metadata(&cache)?.len(),
            (780 * 28 * 28 + crate::cache::TRAILER_LEN) as u64
        );
        assert!(matches!(first.dataset.samples, Samples::U8 { .. }));
        // Copied out before the test edits the mapped file in place (ssl itself only ever
        // renames a complete cache into place, which leaves live maps untouched).
        let expected = first.dataset.sample(0).into_owned();
        drop(first);
        // The cache is reused as it is (a marker byte survives) while the .npz is the same.
        let mut bytes = std::fs::read(&cache)?;
        bytes[0] = 255;
        std::fs::write(&cache, &bytes)?;
        let again = load_medmnist(dir.path(), "breastmnist", 28)?;
        assert_eq!(again.dataset.sample(0)[0], 1.0);
        // A rewritten .npz, or a cache of the wrong length, is decoded afresh.
        std::fs::write(&cache, &bytes[..100])?;
        let fresh = load_medmnist(dir.path(), "breastmnist", 28)?;
        assert_eq!(*fresh.dataset.sample(0), *expected);
        let names: Vec<String> = std::fs::read_dir(dir.path())?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        assert_eq!(names.len(), 2, "only the .npz and its cache: {names:?}");
        Ok(())
    }

    /// A BreastMNIST-layout file at `path` whose every pixel is `value`.
    fn flat_breastmnist(path: &Path, value: u8) -> Result<()> {
        let info = medmnist_info("breastmnist")?;
        let splits = info.splits.map(|n| {
            let images = NpyData::Bytes(vec![value; n * 28 * 28].into());
            (images, NpyData::Bytes(vec![1u8; n].into()))
        });
        write_medmnist_npz(path, &info.layout(28), splits)
    }

    #[test]
    fn a_replaced_npz_is_cached_anew_even_with_an_older_mtime() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("breastmnist.npz");
        flat_breastmnist(&path, 51)?;
        assert_eq!(
            load_medmnist(&path, "breastmnist", 28)?.dataset.sample(0)[0],
            0.2
        );
        // Another file of the same layout, dated a day after the epoch: older than the cache.
        flat_breastmnist(&path, 204)?;
        let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
        std::fs::File::options()
            .write(true)
            .open(&path)?
            .set_modified(long_ago)?;
        assert_eq!(
            load_medmnist(&path, "breastmnist", 28)?.dataset.sample(0)[0],
            0.8
        );
        assert_eq!(
            names(dir.path())?,
            ["breastmnist.images.u8", "breastmnist.npz"]
        );
        Ok(())
    }

    #[test]
    fn a_corrupt_npz_is_refused_with_the_member_and_the_download_command() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("breastmnist.npz");
        write_digits_as_medmnist(&path, "breastmnist", 28)?;
        let good = std::fs::read(&path)?;
        // A cache made from the intact file does not hide a corrupt replacement.
        load_medmnist(dir.path(), "breastmnist", 28)?;
        std::fs::remove_file(image_cache_path(&path))?;
        let fix = format!(
            "download it again with `ssl data download breastmnist --size 28 --dir {}`",
            dir.path().display()
        );
        let refused = |bytes: &[u8], member: &str, cached: bool| -> Result<()> {
            if cached {
                std::fs::write(&path, &good)?;
                load_medmnist(dir.path(), "breastmnist", 28)?;
            }
            std::fs::write(&path, bytes)?;
            let e = format!(
                "{:#}",
                load_medmnist(dir.path(), "breastmnist", 28).unwrap_err()
            );
            let named = format!("{}: member {member} ", path.display());
            for needle in [named.as_str(), "corrupt", &fix] {
                assert!(e.contains(needle), "`{needle}` missing from: {e}");
            }
            // Nothing partial is left behind; a cache is there only if it was before.
            let mut expected = vec!["breastmnist.npz"];
            if cached {
                expected.insert(0, "breastmnist.images.u8");
            }
            assert_eq!(names(dir.path())?, expected);
            if cached {
                std::fs::remove_file(image_cache_path(&path))?;
            }
            Ok(())
        };
        // Wrong CRC-32s in the directory: of the images (with and without a cache from the
        // intact file), and of the labels.
        for (member, cached) in [
            ("train_images.npy", false),
            ("test_images.npy", true),
            ("val_labels.npy", false),
        ] {
            let mut bytes = good.clone();
            let at = crate::npy::tests::directory_crc_at(&bytes, member);
            bytes[at] ^= 1;
            refused(&bytes, member, cached)?;
        }
        // A flipped byte inside the compressed images.
        let mut bytes = good.clone();
        bytes[good.len() / 3] ^= 0x10;
        refused(&bytes, "train_images.npy", false)?;
        Ok(())
    }

    #[test]
    fn a_partial_cache_left_by_a_killed_run_is_removed_on_the_next_load() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("breastmnist.npz");
        write_digits_as_medmnist(&path, "breastmnist", 28)?;
        let partial = dir
            .path()
            .join("breastmnist.images.u8.ssl-partial-4194304-3");
        std::fs::write(&partial, vec![9u8; 4096])?;
        load_medmnist(dir.path(), "breastmnist", 28)?;
        assert_eq!(
            names(dir.path())?,
            ["breastmnist.images.u8", "breastmnist.npz"]
        );
        // Also when the cache is already there and nothing is built.
        std::fs::write(&partial, vec![9u8; 4096])?;
        load_medmnist(dir.path(), "breastmnist", 28)?;
        assert!(!partial.exists());
        Ok(())
    }

    #[test]
    fn wrong_sizes_labels_and_missing_files_are_clear_errors() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let e = format!(
            "{:#}",
            load_medmnist(dir.path(), "breastmnist", 28).unwrap_err()
        );
        assert!(e.contains("not found") && e.contains("zenodo.org"), "{e}");
        // A breastmnist-named file with another dataset's split sizes.
        let path = dir.path().join("breastmnist.npz");
        write_digits_as_medmnist(&path, "pneumoniamnist", 28)?;
        let e = format!("{:#}", load_medmnist(&path, "breastmnist", 28).unwrap_err());
        assert!(
            e.contains("train_labels has shape [4708, 1]")
                && e.contains("file of your own")
                && e.contains("--data npz --root FILE"),
            "{e}"
        );
        // Labels outside the classes.
        let info = medmnist_info("breastmnist")?;
        let splits = info.splits.map(|n| {
            let images = NpyData::Bytes(vec![0u8; n * 28 * 28].into());
            (images, NpyData::Bytes(vec![2u8; n].into()))
        });
        write_medmnist_npz(&path, &info.layout(28), splits)?;
        let e = format!(
            "{:#}",
            load_medmnist(dir.path(), "breastmnist", 28).unwrap_err()
        );
        assert!(e.contains("holds 2, outside 0..2"), "{e}");
        // A size the dataset is not published at.
        let e = format!(
            "{:#}",
            load_medmnist(dir.path(), "breastmnist", 32).unwrap_err()
        );
        assert!(e.contains("not 32"), "{e}");
        Ok(())
    }

    /// `n` images of `layout` (pixel = image index + position, mod 256) and their labels.
    fn own_split(
        layout: &NpzLayout,
        n: usize,
        label: impl Fn(usize) -> u8,
    ) -> (NpyData<'static>, NpyData<'static>) {
        let per: usize = layout.stored_shape().iter().product();
        let images = (0..n * per)
            .map(|i| ((i / per + i % per) % 256) as u8)
            .collect::<Vec<_>>();
        let labels = (0..n * layout.label_columns())
            .map(label)
            .collect::<Vec<_>>();
        (NpyData::Bytes(images.into()), NpyData::Bytes(labels.into()))
    }

    #[test]
    fn a_file_of_your_own_loads_with_its_own_sizes_classes_and_channels() -> Result<()> {
        let dir = tempfile::tempdir()?;
        // A balanced binary subset of grey 28-px images without a val split.
        let grey = NpzLayout {
            name: "balanced".into(),
            size: 28,
            channels: 1,
            volumetric: false,
            splits: [6, 0, 4],
            classes: 2,
            multi_label: false,
        };
        let path = dir.path().join("balanced.npz");
        write_medmnist_npz(
            &path,
            &grey,
            [6, 0, 4].map(|n| own_split(&grey, n, |i| (i % 2) as u8)),
        )?;
        let m = load_npz(&path)?;
        assert_eq!((m.info, &m.layout), (None, &grey));
        assert_eq!(m.splits, [0..6, 6..6, 6..10]);
        assert_eq!(m.dataset.labels, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(m.dataset.shape, [1, 28, 28]);
        assert_eq!(m.dataset.sample(7)[5], 6.0 / 255.0);
        // RGB with five classes, a 3D volume, and multi-label flags: each read off the file.
        for layout in [
            NpzLayout {
                name: "rgb".into(),
                channels: 3,
                splits: [10, 3, 5],
                classes: 5,
                ..grey.clone()
            },
            NpzLayout {
                name: "volumes".into(),
                size: 8,
                volumetric: true,
                splits: [4, 2, 2],
                ..grey.clone()
            },
            NpzLayout {
                name: "flags".into(),
                splits: [4, 2, 2],
                classes: 3,
                multi_label: true,
                ..grey.clone()
            },
        ] {
            let path = dir.path().join(format!("{}.npz", layout.name));
            let classes = layout.classes;
            let label = |i: usize| match layout.multi_label {
                true => (i % 2) as u8,
                false => (i % classes) as u8,
            };
            let splits = layout.splits.map(|n| own_split(&layout, n, label));
            write_medmnist_npz(&path, &layout, splits)?;
            let m = load_npz(&path)?;
            assert_eq!(m.layout, layout);
            assert_eq!(m.dataset.shape, layout.sample_shape());
            let rows: usize = layout.splits.iter().sum();
            assert_eq!(m.label_matrix.len(), rows * layout.label_columns());
        }
        Ok(())
    }

    #[test]
    fn a_file_of_your_own_that_breaks_the_layout_is_named_clearly() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("mine.npz");
        let error = || format!("{:#}", load_npz(&path).unwrap_err());
        assert!(error().contains("not found"), "{}", error());
        let write = |arrays: Vec<(&str, Vec<usize>, Dtype)>| -> Result<()> {
            let arrays = arrays
                .into_iter()
                .map(|(name, shape, dtype)| {
                    let header = NpyHeader { dtype, shape };
                    let bytes = NpyData::Bytes(vec![0u8; header.data_bytes()].into());
                    (name, header, bytes)
                })
                .collect();
            crate::npy::write_npz(std::fs::File::create(&path)?, arrays, false)
        };
        let labels = |n: usize| ("train_labels", vec![n, 1], Dtype::U8);
        write(vec![
            ("train_images", vec![4, 28, 28], Dtype::U8),
            labels(4),
            ("test_images", vec![2, 32, 32], Dtype::U8),
            ("test_labels", vec![2, 1], Dtype::U8),
        ])?;
        assert!(
            error().contains("every split must hold one shape"),
            "{}",
            error()
        );
        write(vec![
            ("train_images", vec![4, 28, 20], Dtype::U8),
            labels(4),
            ("test_images", vec![2, 28, 20], Dtype::U8),
            ("test_labels", vec![2, 1], Dtype::U8),
        ])?;
        assert!(error().contains("none of MedMNIST's"), "{}", error());
        write(vec![
            ("train_images", vec![4, 28, 28], Dtype::F32),
            labels(4),
            ("test_images", vec![2, 28, 28], Dtype::U8),
            ("test_labels", vec![2, 1], Dtype::U8),
        ])?;
        assert!(error().contains("stores u8 images"), "{}", error());
        write(vec![
            ("train_images", vec![4, 28, 28], Dtype::U8),
            labels(3),
            ("test_images", vec![2, 28, 28], Dtype::U8),
            ("test_labels", vec![2, 1], Dtype::U8),
        ])?;
        assert!(
            error().contains("train_labels has shape [3, 1], expected [4, 1]"),
            "{}",
            error()
        );
        write(vec![
            ("train_images", vec![4, 28, 28], Dtype::U8),
            labels(4),
            ("test_images", vec![2, 28, 28], Dtype::U8),
            ("test_labels", vec![2, 1], Dtype::U8),
        ])?;
        assert!(error().contains("at least two classes"), "{}", error());
        write(vec![
            ("train_images", vec![4, 28, 28], Dtype::U8),
            labels(4),
        ])?;
        assert!(error().contains("no array `test_images`"), "{}", error());
        // Labels that are no class, and flags that are not 0/1.
        let with_labels = |shape: Vec<usize>, labels: Vec<u8>, dtype: Dtype| -> Result<()> {
            let images = |n: usize| NpyData::Bytes(vec![0u8; n * 28 * 28].into());
            let arrays = ["train", "test"].map(|split| {
                let n = shape[0];
                let images_header = NpyHeader {
                    dtype: Dtype::U8,
                    shape: vec![n, 28, 28],
                };
                let labels_header = NpyHeader {
                    dtype,
                    shape: shape.clone(),
                };
                (
                    split,
                    images_header,
                    images(n),
                    labels_header,
                    labels.clone(),
                )
            });
            let names = ["train", "test"].map(|s| [format!("{s}_images"), format!("{s}_labels")]);
            let mut members = Vec::new();
            for ((_, ih, i, lh, l), [image_name, label_name]) in arrays.into_iter().zip(&names) {
                members.push((image_name.as_str(), ih, i));
                members.push((label_name.as_str(), lh, NpyData::Bytes(l.into())));
            }
            crate::npy::write_npz(std::fs::File::create(&path)?, members, false)
        };
        with_labels(
            vec![2],
            [-1i64, 1].iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::I64,
        )?;
        assert!(error().contains("train_labels holds -1"), "{}", error());
        with_labels(vec![2, 2], vec![0, 1, 2, 0], Dtype::U8)?;
        assert!(
            error().contains("outside 0..2 for its multi-label task"),
            "{}",
            error()
        );
        Ok(())
    }

    #[test]
    fn multi_label_rows_keep_every_flag() -> Result<()> {
        let info = medmnist_info("chestmnist")?;
        let h = NpyHeader {
            dtype: Dtype::U8,
            shape: vec![2, 14],
        };
        let mut bytes = vec![0u8; 28];
        bytes[3] = 1;
        bytes[14 + 13] = 1;
        let labels = label_values(&info.layout(28), "test", 2, &h, &bytes)?;
        assert_eq!(labels.len(), 28);
        assert_eq!((labels[3], labels[27], labels[0]), (1, 1, 0));
        let wide = NpyHeader {
            dtype: Dtype::I64,
            shape: vec![1, 1],
        };
        let blood = medmnist_info("bloodmnist")?;
        assert_eq!(
            label_values(&blood.layout(28), "train", 1, &wide, &7i64.to_le_bytes())?,
            [7]
        );
        Ok(())
    }
}
