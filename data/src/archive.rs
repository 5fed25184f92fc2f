//! The benchmark sets read from their official archives — CIFAR-10 and CIFAR-100 ([`cifar`]),
//! STL-10 ([`stl10`]), Tiny ImageNet ([`tiny_imagenet`]) — and the 8-bit cache each is decoded
//! into once.
//!
//! An archive is decoded on first use into `{stem}.images.u8` beside it
//! (`cifar-10-python.images.u8` for `cifar-10-python.tar.gz`) and memory-mapped from there by every
//! later run, as MedMNIST's `.npz` files are. The cache holds a header (the split sizes and the
//! layout), every image as `[3, S, S]` bytes (channels first), then the label columns of every
//! image, and is keyed by the archive's size and the MD5 of its first and last MiB (content, not
//! modification times): a replaced archive is decoded anew. Images are in official split order:
//! train, test, then (STL-10) the unlabeled images.
//!
//! [`cifar`]: crate::cifar
//! [`stl10`]: crate::stl10
//! [`tiny_imagenet`]: crate::tiny_imagenet

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};
use md5::{Digest, Md5};

use crate::cache::{self, CacheBytes, Placed};
use crate::{Dataset, Normalization, Samples};

/// One benchmark set: its official archive and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveInfo {
    /// The name `--data` and `ssl data download` take.
    pub name: &'static str,
    /// The official archive's file name.
    pub file: &'static str,
    /// Its official address.
    pub url: &'static str,
    /// Its published MD5 (torchvision's, and the other loaders').
    pub md5: &'static str,
    /// Image side (square RGB images).
    pub side: usize,
    /// Classes of the labels this name reads.
    pub classes: usize,
    /// Images in the official train, test and unlabeled splits.
    pub splits: [usize; 3],
    /// The input normalisation its recipes use.
    pub normalization: Normalization,
}

/// The benchmark sets; `cifar100-coarse` is CIFAR-100's archive read with its 20 superclass
/// labels.
pub static ARCHIVES: [ArchiveInfo; 5] = [
    ArchiveInfo {
        name: "cifar10",
        file: "cifar-10-python.tar.gz",
        url: "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5: "c58f30108f718f92721af3b95e74349a",
        side: 32,
        classes: 10,
        splits: [50_000, 10_000, 0],
        normalization: Normalization::Cifar10,
    },
    ArchiveInfo {
        name: "cifar100",
        file: "cifar-100-python.tar.gz",
        url: "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5: "eb9058c3a382ffc7106e4002c42a8d85",
        side: 32,
        classes: 100,
        splits: [50_000, 10_000, 0],
        normalization: Normalization::Cifar100,
    },
    ArchiveInfo {
        name: "cifar100-coarse",
        file: "cifar-100-python.tar.gz",
        url: "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5: "eb9058c3a382ffc7106e4002c42a8d85",
        side: 32,
        classes: 20,
        splits: [50_000, 10_000, 0],
        normalization: Normalization::Cifar100,
    },
    ArchiveInfo {
        name: "stl10",
        file: "stl10_binary.tar.gz",
        url: "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz",
        md5: "91f7769df0f17e558f3565bffb0c7dfb",
        side: 96,
        classes: 10,
        splits: [5_000, 8_000, 100_000],
        normalization: Normalization::Stl10,
    },
    ArchiveInfo {
        name: "tiny-imagenet",
        file: "tiny-imagenet-200.zip",
        url: "http://cs231n.stanford.edu/tiny-imagenet-200.zip",
        md5: "90528d7ca1a48142e341f4ef8d21d0de",
        side: 64,
        classes: 200,
        splits: [100_000, 10_000, 0],
        normalization: Normalization::Imagenet,
    },
];

/// The benchmark set called `name` (case-insensitive), if it is one.
pub fn archive_info(name: &str) -> Option<&'static ArchiveInfo> {
    let lower = name.to_ascii_lowercase();
    ARCHIVES.iter().find(|a| a.name == lower)
}

/// A benchmark set read from its archive: train, test and unlabeled images one after another.
#[derive(Debug, Clone)]
pub struct Benchmark {
    pub info: &'static ArchiveInfo,
    /// Every image, `[3, S, S]`; the unlabeled images carry label 0, which nothing may read.
    pub dataset: Dataset,
    /// Positions of the official train split.
    pub train: Range<usize>,
    /// Positions of the official test split (Tiny ImageNet: its labelled `val` split).
    pub test: Range<usize>,
    /// Positions of the images without labels (STL-10's 100,000; empty for the others).
    pub unlabeled: Range<usize>,
}

/// Where the archive of `info` is under `root`: `root` itself when it is a file, else
/// `root/{file}`.
pub fn archive_path(root: &Path, info: &ArchiveInfo) -> PathBuf {
    match root.is_file() {
        true => root.to_path_buf(),
        false => root.join(info.file),
    }
}

/// The cache an archive is decoded into: `{stem}.images.u8` beside it.
pub fn archive_cache_path(archive: &Path) -> PathBuf {
    let name = archive.file_name().unwrap_or_default().to_string_lossy();
    let stem = name
        .strip_suffix(".tar.gz")
        .or_else(|| name.strip_suffix(".zip"))
        .unwrap_or(&name);
    archive.with_file_name(format!("{stem}.images.u8"))
}

/// Reads benchmark set `name` from `root` (a directory holding its official archive, or the
/// archive itself), decoding it into its cache on first use (see the module docs).
pub fn load_benchmark(name: &str, root: &Path) -> Result<Benchmark> {
    let Some(info) = archive_info(name) else {
        bail!(
            "unknown benchmark set `{name}`; known: {}",
            ARCHIVES
                .iter()
                .map(|a| a.name)
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let path = archive_path(root, info);
    let dir = path.parent().unwrap_or(Path::new("."));
    let fix = format!(
        "download it again with `ssl data download {} --dir {}`",
        info.name,
        dir.display()
    );
    ensure!(
        path.is_file(),
        "{} not found; fetch it with `ssl data download {} --dir {}` or from {} (MD5 {}), or \
         point data.root (--root) at the directory or the file",
        path.display(),
        info.name,
        root.display(),
        info.url,
        info.md5
    );
    let key = archive_key(&path, info)?;
    let cache_path = archive_cache_path(&path);
    let found = Layout::read(&cache_path)
        .and_then(|layout| Some((cache::open_cached(&cache_path, layout.len(), &key)?, layout)));
    let (bytes, layout) = match found {
        Some(found) => found,
        None => {
            let decoded = match info.file {
                "cifar-10-python.tar.gz" | "cifar-100-python.tar.gz" => {
                    crate::cifar::decode(&path, info)
                }
                "stl10_binary.tar.gz" => crate::stl10::decode(&path, info),
                _ => crate::tiny_imagenet::decode(&path, info),
            };
            let refused = |e: anyhow::Error| anyhow!("{}: {e:#}; {fix}", path.display());
            let (layout, fill) = decoded.map_err(refused)?;
            let unwritable = format!(
                "make {} writable, or copy the archive into a writable directory and point \
                 --root there",
                dir.display()
            );
            let bytes =
                cache::cached_placed(&cache_path, layout.len(), &key, &unwritable, |out| {
                    out.write_at(0, &layout.header())?;
                    fill(&layout, out).map_err(refused)
                })?;
            (bytes, layout)
        }
    };
    layout.benchmark(info, bytes, &cache_path)
}

/// The cache key of an archive: the format version, its size, and the MD5 of its first and last
/// MiB.
fn archive_key(path: &Path, info: &ArchiveInfo) -> Result<Vec<u8>> {
    const SPAN: u64 = 1 << 20;
    let read = || -> std::io::Result<Vec<u8>> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        let mut hasher = Md5::new();
        let mut head = Vec::new();
        (&mut file).take(SPAN).read_to_end(&mut head)?;
        hasher.update(&head);
        if size > SPAN {
            let mut tail = Vec::new();
            file.seek(SeekFrom::Start(size.saturating_sub(SPAN).max(SPAN)))?;
            file.read_to_end(&mut tail)?;
            hasher.update(&tail);
        }
        let mut key = format!("archive v1 {} {size} ", info.file).into_bytes();
        key.extend(hasher.finalize());
        Ok(key)
    };
    read().with_context(|| format!("cannot read {}", path.display()))
}

/// How a decoded archive is laid out in its cache: a [`Layout::HEADER`]-byte header, the images,
/// then the label columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Images in the train, test and unlabeled splits.
    pub(crate) counts: [usize; 3],
    /// Image side.
    pub(crate) side: usize,
    /// Label bytes per image (CIFAR-100: fine, coarse).
    pub(crate) label_columns: usize,
}

/// The first bytes of a decoded archive's cache.
const LAYOUT_MAGIC: &[u8; 8] = b"ssl-arc1";

/// What fills a cache after its header: the images and labels of a [`Layout`].
pub(crate) type Fill = Box<dyn FnOnce(&Layout, &mut Placed) -> Result<()>>;

impl Layout {
    const HEADER: usize = 48;

    fn images(&self) -> usize {
        self.counts.iter().sum()
    }

    fn image_len(&self) -> usize {
        3 * self.side * self.side
    }

    /// Bytes of the cache's data.
    fn len(&self) -> usize {
        Self::HEADER + self.images() * (self.image_len() + self.label_columns)
    }

    /// Where image `i` (over all splits, in order) starts.
    pub(crate) fn image_at(&self, i: usize) -> usize {
        Self::HEADER + i * self.image_len()
    }

    /// Where the labels of image `i` start.
    pub(crate) fn labels_at(&self, i: usize) -> usize {
        Self::HEADER + self.images() * self.image_len() + i * self.label_columns
    }

    fn header(&self) -> Vec<u8> {
        let mut h = LAYOUT_MAGIC.to_vec();
        for v in [
            self.counts[0],
            self.counts[1],
            self.counts[2],
            self.side,
            self.label_columns,
        ] {
            h.extend((v as u64).to_le_bytes());
        }
        h
    }

    /// The layout in the header of the cache at `path`, if there is one.
    fn read(path: &Path) -> Option<Self> {
        let mut h = [0u8; Self::HEADER];
        File::open(path).ok()?.read_exact(&mut h).ok()?;
        if &h[..8] != LAYOUT_MAGIC {
            return None;
        }
        let v: Vec<usize> = h[8..]
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
            .collect();
        (v[3] > 0 && v[3] <= 4096 && v[4] <= 2 && v[..3].iter().all(|&n| n <= 1 << 28)).then(|| {
            Self {
                counts: [v[0], v[1], v[2]],
                side: v[3],
                label_columns: v[4],
            }
        })
    }

    /// The data set in the cache `bytes` (laid out as `self`), labelled by `info`.
    fn benchmark(
        self,
        info: &'static ArchiveInfo,
        bytes: CacheBytes,
        path: &Path,
    ) -> Result<Benchmark> {
        // CIFAR-100's coarse labels are its second column.
        let column = usize::from(info.name == "cifar100-coarse");
        ensure!(
            column < self.label_columns && self.side == info.side,
            "{} does not hold {} (a cache of another layout); remove it and run again",
            path.display(),
            info.name
        );
        let [train, test, unlabeled] = self.counts;
        let labelled = train + test;
        let data = bytes.as_ref();
        let labels = (0..self.images())
            .map(|i| match i < labelled {
                true => u32::from(data[self.labels_at(i) + column]),
                false => 0,
            })
            .collect();
        let images = Self::HEADER..self.labels_at(0);
        Ok(Benchmark {
            info,
            dataset: Dataset {
                name: info.name.to_string(),
                samples: Samples::U8 {
                    bytes: Arc::new(Window { bytes, images }),
                    channels_last: None,
                },
                labels,
                shape: vec![3, self.side, self.side],
                num_classes: info.classes,
            },
            train: 0..train,
            test: train..labelled,
            unlabeled: labelled..labelled + unlabeled,
        })
    }
}

/// The images of a cache: a window of its bytes.
struct Window {
    bytes: CacheBytes,
    images: Range<usize>,
}

impl AsRef<[u8]> for Window {
    fn as_ref(&self) -> &[u8] {
        &self.bytes.as_ref()[self.images.clone()]
    }
}

/// Checks that `labels` (read from `member`) are in `0..classes`, as bytes.
pub(crate) fn label_bytes(labels: &[i64], classes: usize, member: &str) -> Result<Vec<u8>> {
    labels
        .iter()
        .map(|&l| match usize::try_from(l) {
            Ok(v) if v < classes => Ok(v as u8),
            _ => bail!("{member} holds label {l}, outside 0..{classes}"),
        })
        .collect()
}

/// Calls `each` with the path and reader of every member of the `.tar.gz` at `path`, in archive
/// order; a damaged stream is an error naming the member it broke in.
pub(crate) fn each_tar_member(
    path: &Path,
    mut each: impl FnMut(&str, &mut dyn Read, u64) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let gz = flate2::read::GzDecoder::new(std::io::BufReader::with_capacity(1 << 20, file));
    let mut tar = tar::Archive::new(gz);
    let damaged = |at: &str, e: std::io::Error| {
        anyhow::anyhow!("the archive is damaged or truncated ({at}: {e})")
    };
    let mut last = String::from("at its start");
    for entry in tar.entries().map_err(|e| damaged(&last, e))? {
        let mut entry = entry.map_err(|e| damaged(&format!("after {last}"), e))?;
        let name = entry.path().map_err(|e| damaged(&last, e))?;
        let name = name.to_string_lossy().trim_start_matches("./").to_string();
        let size = entry.size();
        each(&name, &mut entry, size).with_context(|| format!("member {name}"))?;
        last = format!("member {name}");
    }
    Ok(())
}

/// Reads all of `reader` (a member of `size` bytes), naming a short read as a damaged archive.
pub(crate) fn read_member(reader: &mut dyn Read, size: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(size as usize);
    reader
        .read_to_end(&mut bytes)
        .context("the archive is damaged or truncated")?;
    ensure!(
        bytes.len() as u64 == size,
        "the archive is truncated ({} of {size} bytes)",
        bytes.len()
    );
    Ok(bytes)
}

/// Writes `members` (path, bytes) as a gzip-compressed tar file at `path`, the way the official
/// archives are packed (ustar headers, mode 0644).
pub(crate) fn write_tar_gz(path: &Path, members: &[(String, Vec<u8>)]) -> Result<()> {
    let partial = crate::cache::Partial::create(path, "choose a writable directory")?;
    let gz = flate2::write::GzEncoder::new(partial.file(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    for (name, bytes) in members {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(1_244_000_000);
        tar.append_data(&mut header, name, &bytes[..])
            .with_context(|| format!("writing {}", path.display()))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .with_context(|| format!("writing {}", path.display()))?;
    partial.persist()
}

/// The value the synthetic archives of [`write_synthetic_archive`] give channel `c`, row `y`,
/// column `x` of image `i` (counted over the train, test and unlabeled splits in order).
pub fn synthetic_pixel(i: usize, c: usize, y: usize, x: usize) -> u8 {
    ((i * 7 + c * 80 + y * 5 + x * 3) % 256) as u8
}

/// Writes an archive in the exact official layout of benchmark set `name` (member names, file
/// formats, pixel order) holding `counts` train, test and unlabeled images of
/// [`synthetic_pixel`]s, labelled `i mod classes` (CIFAR-100's coarse label: fine mod 20): the
/// official files' code path without them, for tests.
pub fn write_synthetic_archive(name: &str, path: &Path, counts: [usize; 3]) -> Result<()> {
    let Some(info) = archive_info(name) else {
        bail!("unknown benchmark set `{name}`");
    };
    match info.file {
        "cifar-10-python.tar.gz" | "cifar-100-python.tar.gz" => {
            crate::cifar::write_synthetic(path, info, counts)
        }
        "stl10_binary.tar.gz" => crate::stl10::write_synthetic(path, counts),
        _ => crate::tiny_imagenet::write_synthetic(path, counts),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Checks image `i` of `d` against [`synthetic_pixel`] of `image` at a few positions.
    pub(crate) fn assert_pixels(d: &Dataset, i: usize, image: usize) {
        let side = d.shape[1];
        let sample = d.sample(i);
        for (c, y, x) in [(0, 0, 0), (0, 0, 1), (1, 2, 0), (2, side - 1, side - 2)] {
            let want = f32::from(synthetic_pixel(image, c, y, x)) / 255.0;
            let got = sample[(c * side + y) * side + x];
            assert_eq!(got, want, "image {i}, channel {c}, row {y}, column {x}");
        }
    }

    #[test]
    fn names_files_and_caches() {
        assert_eq!(archive_info("CIFAR10").unwrap().classes, 10);
        assert_eq!(archive_info("cifar100-coarse").unwrap().classes, 20);
        assert!(archive_info("cifar1000").is_none());
        let cache = archive_cache_path(Path::new("/d/stl10_binary.tar.gz"));
        assert_eq!(cache, Path::new("/d/stl10_binary.images.u8"));
        let cache = archive_cache_path(Path::new("tiny-imagenet-200.zip"));
        assert_eq!(cache, Path::new("tiny-imagenet-200.images.u8"));
        let layout = Layout {
            counts: [3, 2, 1],
            side: 4,
            label_columns: 2,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.u8");
        std::fs::write(&path, layout.header()).unwrap();
        assert_eq!(Layout::read(&path), Some(layout));
        assert_eq!(layout.len(), 48 + 6 * (48 + 2));
    }

    #[test]
    fn a_missing_archive_names_the_download() {
        let dir = tempfile::tempdir().unwrap();
        let e = format!("{:#}", load_benchmark("stl10", dir.path()).unwrap_err());
        assert!(
            e.contains("stl10_binary.tar.gz not found")
                && e.contains("ssl data download stl10")
                && e.contains("91f7769df0f17e558f3565bffb0c7dfb"),
            "{e}"
        );
        let e = format!("{:#}", load_benchmark("svhn", dir.path()).unwrap_err());
        assert!(e.contains("known: cifar10, cifar100"), "{e}");
    }
}
