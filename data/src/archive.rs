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
//! Before anything is cached, every member is checked against the set's published table (its
//! rows or images per member, their shape, its labels' range; see `Expected`), and an archive
//! whose container fails its own checks (a gzip CRC-32 or length, a tar header's checksum, a ZIP
//! member's CRC-32, a stream that ends early) is called corrupt rather than misread (see
//! `Corrupt`); either error names the member and the download command. An archive written by
//! [`write_synthetic_archive`] holds `<top directory>/SYNTHETIC.txt` declaring its split sizes,
//! and is checked as strictly against those.
//!
//! [`write_synthetic_archive`]: crate::write_synthetic_archive
//! [`cifar`]: crate::cifar
//! [`stl10`]: crate::stl10
//! [`tiny_imagenet`]: crate::tiny_imagenet

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use md5::{Digest, Md5};

use crate::cache::{CacheBytes, Placed};
use crate::{Dataset, Normalization, Samples};

/// One benchmark set: its official archive and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchiveInfo {
    /// The name `--data` and `ssl data download` take.
    pub name: &'static str,
    /// The set's name in print ("CIFAR-10").
    pub title: &'static str,
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
        title: "CIFAR-10",
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
        title: "CIFAR-100",
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
        title: "CIFAR-100",
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
        title: "STL-10",
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
        title: "Tiny ImageNet",
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

/// The cache key of an archive: the format version, its size, and the MD5 of its first and last
/// MiB.
pub(crate) fn archive_key(path: &Path, info: &ArchiveInfo) -> Result<Vec<u8>> {
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
        // v2: decoded with every member checked against its table (a v1 cache was not).
        let mut key = format!("archive v2 {} {size} ", info.file).into_bytes();
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
    pub(crate) fn len(&self) -> usize {
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

    pub(crate) fn header(&self) -> Vec<u8> {
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
    pub(crate) fn read(path: &Path) -> Option<Self> {
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
    pub(crate) fn benchmark(
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

/// Checks that `labels` (a member's `key` column) are in `0..classes`, as bytes.
pub(crate) fn label_bytes(labels: &[i64], classes: usize, key: &str) -> Result<Vec<u8>> {
    labels
        .iter()
        .enumerate()
        .map(|(row, &l)| match usize::try_from(l) {
            Ok(v) if v < classes => Ok(v as u8),
            _ => bail!("its `{key}` holds {l} (row {row}), outside the classes 0..{classes}"),
        })
        .collect()
}

/// An archive whose bytes fail the checks of their own container: a gzip stream whose CRC-32 or
/// length does not match its trailer, a stream or member that ends early, a tar header that
/// fails its checksum, a zip member that fails its CRC-32. [`load_benchmark`] reports it as
/// `{archive} is corrupt ({this}); delete it and download it again: …`, unlike a well-formed
/// archive of the wrong content, whose error names what is wrong with it.
#[derive(Debug)]
pub(crate) struct Corrupt(pub(crate) String);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Corrupt {}

/// A reader that keeps the first error its inner reader returned: a gzip decoder's, which the
/// tar reader and a member's parser would otherwise report as their own.
struct Watched<R> {
    inner: R,
    failed: std::rc::Rc<std::cell::RefCell<Option<std::io::Error>>>,
}

impl<R: Read> Read for Watched<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            self.failed
                .borrow_mut()
                .get_or_insert_with(|| std::io::Error::new(e.kind(), e.to_string()));
        })
    }
}

/// What went wrong in the walk over a tar's members.
enum Stop {
    /// The tar stream itself, at a place ("after member X", "at its start").
    Tar(String, std::io::Error),
    /// The callback, on the named member.
    Member(String, anyhow::Error),
}

/// Calls `each` with the path, reader and size of every member of the `.tar.gz` at `path`, in
/// archive order, then reads the gzip stream to its end, so that its CRC-32 and length are
/// checked even when the tar ends before it (its last record's padding) or a member is skipped.
///
/// A flipped byte inside the deflate stream may inflate to wrong bytes without an error until the
/// trailer's CRC-32 is compared, by which time the tar or pickle reader has choked on them. So
/// when the walk fails, the rest of the stream is read as well, and if the gzip decoder failed
/// anywhere the error is a [`Corrupt`] naming the member it showed in, not the member's own
/// complaint; a tar header that fails its checksum (in an intact gzip stream) is [`Corrupt`] too.
/// A callback's error on a member of an intact stream is returned as `member {name}: {error}`.
pub(crate) fn each_tar_member(
    path: &Path,
    mut each: impl FnMut(&str, &mut dyn Read, u64) -> Result<()>,
) -> Result<()> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let failed = std::rc::Rc::default();
    let mut tar = tar::Archive::new(Watched {
        inner: flate2::read::GzDecoder::new(std::io::BufReader::with_capacity(1 << 20, file)),
        failed: std::rc::Rc::clone(&failed),
    });
    let mut last = String::from("at its start");
    let walked = (|| {
        for entry in tar.entries().map_err(|e| Stop::Tar(last.clone(), e))? {
            let mut entry = entry.map_err(|e| Stop::Tar(last.clone(), e))?;
            let name = entry.path().map_err(|e| Stop::Tar(last.clone(), e))?;
            let name = name.to_string_lossy().trim_start_matches("./").to_string();
            let size = entry.size();
            each(&name, &mut entry, size).map_err(|e| Stop::Member(name.clone(), e))?;
            last = format!("after member {name}");
        }
        Ok(())
    })();
    let drained = std::io::copy(&mut tar.into_inner(), &mut std::io::sink());
    let at = match &walked {
        Err(Stop::Member(name, _)) => format!("in member {name}"),
        Err(Stop::Tar(at, _)) => at.clone(),
        Ok(()) => "at its end, after every member was read".into(),
    };
    if let Some(e) = failed.borrow_mut().take() {
        return Err(Corrupt(match (e.kind(), e.to_string()) {
            (std::io::ErrorKind::UnexpectedEof, _) => {
                format!("truncated: its gzip stream ends early, {at}")
            }
            (_, m) if m.contains("checksum") => {
                format!(
                    "its gzip CRC-32 or length does not match its trailer; the damage shows {at}"
                )
            }
            _ => format!("its deflate stream is invalid ({e}), {at}"),
        })
        .into());
    }
    drained.context("cannot read the archive to its end")?;
    match walked {
        Ok(()) => Ok(()),
        Err(Stop::Tar(at, e)) => {
            Err(Corrupt(format!("its tar stream is damaged ({e}), {at}")).into())
        }
        Err(Stop::Member(name, e)) => match e.downcast::<Corrupt>() {
            Ok(Corrupt(what)) => Err(Corrupt(format!("{what}, in member {name}")).into()),
            Err(e) => Err(e.context(format!("member {name}"))),
        },
    }
}

/// Reads all of `reader` (a member of `size` bytes); one that ends short is [`Corrupt`].
pub(crate) fn read_member(reader: &mut dyn Read, size: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(size as usize);
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| Corrupt(format!("truncated ({e})")))?;
    if bytes.len() as u64 != size {
        return Err(Corrupt(format!("truncated: {} of its {size} bytes", bytes.len())).into());
    }
    Ok(bytes)
}

/// `n` with a comma between thousands ("10,000"), as the published tables print counts.
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// The member of a synthetic archive (under the official archive's top directory) that says it
/// is one and declares its split sizes: `splits: TRAIN TEST UNLABELED` on a line.
pub(crate) const SYNTHETIC_MEMBER: &str = "SYNTHETIC.txt";

/// The table an archive's members are checked against: the published split sizes
/// ([`ArchiveInfo::splits`]), or those a synthetic archive declares in its [`SYNTHETIC_MEMBER`].
///
/// The tests and smoke runs need small archives in the official layout that `ssl run` reads
/// through the same code as the official ones, and the published sizes cannot be written small
/// (STL-10's are 3.1 GB of pixels). So [`write_synthetic_archive`] says what it wrote in a member
/// the official archives do not hold, and every member is then checked against that, as strictly
/// as an official archive against the published table. A damaged or short official download
/// cannot gain that member; there is no option, setting or variable that loosens a check.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expected {
    /// Images in the train, test and unlabeled splits.
    pub(crate) splits: [usize; 3],
    /// Who says so, in an error: "the published CIFAR-10 has" or the synthetic member.
    source: String,
    /// What a member that disagrees is.
    disagreeing: &'static str,
}

impl Expected {
    /// The published table of `info`, or the one `synthetic` (the contents of the archive's
    /// [`SYNTHETIC_MEMBER`], if it holds one, at `member`) declares.
    pub(crate) fn new(info: &ArchiveInfo, synthetic: Option<(&str, &[u8])>) -> Result<Self> {
        let Some((member, bytes)) = synthetic else {
            return Ok(Self {
                splits: info.splits,
                source: format!("the published {} has", info.title),
                disagreeing: "another release, or a damaged archive",
            });
        };
        let declared = std::str::from_utf8(bytes).ok().and_then(|text| {
            let line = text.lines().find_map(|l| l.strip_prefix("splits:"))?;
            let v: Vec<usize> = line
                .split_whitespace()
                .map(|n| n.parse().ok())
                .collect::<Option<_>>()?;
            <[usize; 3]>::try_from(v).ok()
        });
        let splits = declared.with_context(|| {
            format!(
                "{member} has no line `splits: TRAIN TEST UNLABELED` (a damaged synthetic archive)"
            )
        })?;
        Ok(Self {
            splits,
            source: format!("this synthetic archive's {member} declares"),
            disagreeing: "a damaged synthetic archive",
        })
    }

    /// Checks that `member` holds `want` `what` (it holds `found`).
    pub(crate) fn check(&self, member: &str, found: usize, want: usize, what: &str) -> Result<()> {
        ensure!(
            found == want,
            "{member} holds {} {what}; {} {} ({})",
            thousands(found),
            self.source,
            thousands(want),
            self.disagreeing
        );
        Ok(())
    }
}

/// The contents of [`SYNTHETIC_MEMBER`] for an archive of `counts` images.
pub(crate) fn synthetic_note(counts: [usize; 3]) -> Vec<u8> {
    format!(
        "A synthetic archive in the official layout, written by ssl_data::write_synthetic_archive \
         for tests and smoke runs; not the published data set.\nsplits: {} {} {}\n",
        counts[0], counts[1], counts[2]
    )
    .into_bytes()
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

/// The value the synthetic archives of [`crate::write_synthetic_archive`] give channel `c`, row
/// `y`, column `x` of image `i` (counted over the train, test and unlabeled splits in order).
pub fn synthetic_pixel(i: usize, c: usize, y: usize, x: usize) -> u8 {
    ((i * 7 + c * 80 + y * 5 + x * 3) % 256) as u8
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::benchmark::load_benchmark;

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

    /// The error loading benchmark set `name` from `dir` gives, printed with its causes.
    pub(crate) fn load_error(name: &str, dir: &Path) -> String {
        format!("{:#}", load_benchmark(name, dir).unwrap_err())
    }

    /// Asserts that `e` calls the archive at `path` corrupt, saying `why`, and gives the command
    /// that downloads `name` again into its directory.
    pub(crate) fn assert_corrupt(e: &str, path: &Path, name: &str, why: &str) {
        let dir = path.parent().unwrap().display();
        for needle in [
            format!("{} is corrupt (", path.display()),
            why.to_string(),
            format!("delete it and download it again: `ssl data download {name} --dir {dir}`"),
        ] {
            assert!(e.contains(&needle), "`{needle}` missing from: {e}");
        }
    }

    /// Flips one byte at each of `flips` places spread over the gzip stream of the archive of
    /// `name` at `path` in turn (each on the intact archive), and asserts that every one is
    /// called corrupt (not a format error of whatever member the damage showed in); restores the
    /// archive.
    pub(crate) fn assert_flipped_bytes_are_corrupt(name: &str, path: &Path, flips: usize) {
        let bytes = std::fs::read(path).unwrap();
        for k in 1..=flips {
            // Past the 10-byte gzip header, into the deflate stream and its 8-byte trailer.
            let at = 10 + (bytes.len() - 10) * k / (flips + 1);
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            std::fs::write(path, &flipped).unwrap();
            let e = load_error(name, path.parent().unwrap());
            assert_corrupt(&e, path, name, "");
            assert!(
                ["gzip", "deflate"].iter().any(|w| e.contains(w)),
                "byte {at} of {}: {e}",
                bytes.len()
            );
        }
        std::fs::write(path, &bytes).unwrap();
    }

    /// Writes `members` as a tar whose second member's header fails its checksum (a byte of its
    /// name flipped), inside an intact gzip stream, at `path`.
    pub(crate) fn write_tar_gz_with_a_bad_header(path: &Path, members: &[(String, Vec<u8>)]) {
        let mut tar = tar::Builder::new(Vec::new());
        for (name, bytes) in members {
            let mut header = tar::Header::new_ustar();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            tar.append_data(&mut header, name, &bytes[..]).unwrap();
        }
        let mut tar = tar.into_inner().unwrap();
        tar[512 + members[0].1.len().div_ceil(512) * 512 + 3] ^= 0x01;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        std::fs::write(path, gz.finish().unwrap()).unwrap();
    }

    #[test]
    fn counts_print_with_thousands_separators() {
        let printed = [0, 999, 1_000, 9_999, 100_000, 1_234_567].map(thousands);
        assert_eq!(
            printed,
            ["0", "999", "1,000", "9,999", "100,000", "1,234,567"]
        );
    }

    #[test]
    fn the_table_is_the_published_one_unless_an_archive_declares_itself_synthetic() {
        let info = archive_info("stl10").unwrap();
        let published = Expected::new(info, None).unwrap();
        assert_eq!(published.splits, [5_000, 8_000, 100_000]);
        let e = format!(
            "{:#}",
            published.check("m", 4_999, 5_000, "images").unwrap_err()
        );
        assert_eq!(
            e,
            "m holds 4,999 images; the published STL-10 has 5,000 (another release, or a \
             damaged archive)"
        );
        assert!(published.check("m", 5_000, 5_000, "images").is_ok());
        let note = synthetic_note([3, 2, 1]);
        let declared = Expected::new(info, Some(("d/SYNTHETIC.txt", &note))).unwrap();
        assert_eq!(declared.splits, [3, 2, 1]);
        let e = format!("{:#}", declared.check("m", 4, 3, "images").unwrap_err());
        assert!(
            e.contains("this synthetic archive's d/SYNTHETIC.txt declares 3"),
            "{e}"
        );
        let e = Expected::new(info, Some(("d/SYNTHETIC.txt", b"splits: 3 2\n"))).unwrap_err();
        assert!(format!("{e}").contains("no line `splits: TRAIN TEST UNLABELED`"));
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
