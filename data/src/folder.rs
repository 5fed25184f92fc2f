//! ImageNet-style image folders (`docs/spec/data.md` §2): `root/<class>/…/<image>` with
//! torchvision `ImageFolder` semantics, decoded once into 8-bit RGB: fixed-size `S × S` samples,
//! or each image kept at its own aspect ratio for crops from the whole picture.
//!
//! * **Classes** are the immediate sub-directories of the split root, sorted by byte order;
//!   the class index is the position in that list (§2.1).
//! * **Samples** are found by walking each class directory recursively (symlinks followed), the
//!   directories in sorted order and each one's files sorted, as torchvision's `os.walk` loop
//!   does; files are kept when their lower-cased name ends with one of [`IMAGE_EXTENSIONS`].
//! * **Decoding** sniffs the content, not the extension (ILSVRC-2012 has a PNG named `.JPEG`),
//!   and converts every mode to RGB: greyscale replicated, alpha dropped, CMYK JPEGs converted
//!   by the `image` crate's decoder (§2.2).
//! * **Size:** the torchvision evaluation convention: `Resize(S)` (shorter side to `S`, the
//!   longer to `int(S·long/short)`), then `CenterCrop(S)` with offsets rounded half to even.
//!   The resize is the `image` crate's separable triangle filter, widened by the scale factor
//!   when shrinking (antialiased like PIL's bilinear); it is not checked bit for bit against PIL.
//! * **Layouts:** `root/train/<class>` + `root/val/<class>` (ImageNet, Imagenette; `val` is the
//!   test split, and the two must list the same classes) or a single `root/<class>`.
//!
//! Samples are stored HWC as [`Samples::U8`] with `channels_last = Some(3)`, read as `[3, S, S]`.
//! Given a cache directory, the decoded bytes are written there once (streamed, a partial file
//! renamed into place) and memory-mapped on every later load, under a name digesting the size
//! and every file's content ([`folder_cache_key`]), so a changed folder decodes anew.
//!
//! **Kept side** (`data.keep_side = R`, [`load_image_folder_kept`]): each image is instead
//! stored whole at its own aspect ratio, downscaled so that its shorter side is `R` (images whose
//! shorter side is `R` or less are kept as they are: FFCV's downscale-only rule; upscaling adds
//! bytes, not detail), by the same resize as above; an image more than [`LONG_SIDE_CAP`] times as
//! long as it is wide is downscaled further, to a longer side of `4R`, so it is still stored
//! whole and no image takes more than `12R²` bytes. The samples are [`Samples::Images`]: the
//! training views draw their random resized crop on the stored image (spec data §3.2) and an
//! evaluation sample is its `Resize(S)` + `CenterCrop(S)` view, the same convention as the
//! `S × S` samples (equal to them when `R = S`). The cache file, keyed by `R` and every file's
//! content ([`kept_cache_key`]), holds the images' pixels one after another (`[H, W, 3]` each),
//! then a table of `(height, width)` as little-endian `u32` pairs, one per image in sample order,
//! then the image count as a little-endian `u64`, then the cache trailer (`crate::cache`); a
//! file whose table does not add up to its pixel bytes is decoded anew.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use image::imageops::FilterType;
use md5::{Digest, Md5};
use rayon::prelude::*;

use crate::cache::CacheBytes;
use crate::crop::{half_rounded_even, shorter_side_to};
use crate::dataset::{Dataset, ImageEntry, Samples};

/// File endings torchvision's `IMG_EXTENSIONS` accepts (compared lower-cased).
pub const IMAGE_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];

/// The 100 ImageNet classes of CMC's ImageNet-100 list (solo-learn, FroSSL), sorted (spec §2.3).
pub const IMAGENET100: [&str; 100] = [
    "n01558993",
    "n01692333",
    "n01729322",
    "n01735189",
    "n01749939",
    "n01773797",
    "n01820546",
    "n01855672",
    "n01978455",
    "n01980166",
    "n01983481",
    "n02009229",
    "n02018207",
    "n02085620",
    "n02086240",
    "n02086910",
    "n02087046",
    "n02089867",
    "n02089973",
    "n02090622",
    "n02091831",
    "n02093428",
    "n02099849",
    "n02100583",
    "n02104029",
    "n02105505",
    "n02106550",
    "n02107142",
    "n02108089",
    "n02109047",
    "n02113799",
    "n02113978",
    "n02114855",
    "n02116738",
    "n02119022",
    "n02123045",
    "n02138441",
    "n02172182",
    "n02231487",
    "n02259212",
    "n02326432",
    "n02396427",
    "n02483362",
    "n02488291",
    "n02701002",
    "n02788148",
    "n02804414",
    "n02859443",
    "n02869837",
    "n02877765",
    "n02974003",
    "n03017168",
    "n03032252",
    "n03062245",
    "n03085013",
    "n03259280",
    "n03379051",
    "n03424325",
    "n03492542",
    "n03494278",
    "n03530642",
    "n03584829",
    "n03594734",
    "n03637318",
    "n03642806",
    "n03764736",
    "n03775546",
    "n03777754",
    "n03785016",
    "n03787032",
    "n03794056",
    "n03837869",
    "n03891251",
    "n03903868",
    "n03930630",
    "n03947888",
    "n04026417",
    "n04067472",
    "n04099969",
    "n04111531",
    "n04127249",
    "n04136333",
    "n04229816",
    "n04238763",
    "n04336792",
    "n04418357",
    "n04429376",
    "n04435653",
    "n04485082",
    "n04493381",
    "n04517823",
    "n04589890",
    "n04592741",
    "n07714571",
    "n07715103",
    "n07753275",
    "n07831146",
    "n07836838",
    "n13037406",
    "n13040303",
];

/// The classes and samples of one split root.
#[derive(Debug, Clone, PartialEq)]
pub struct FolderIndex {
    /// Class directory names, sorted; a label is an index into this list.
    pub classes: Vec<String>,
    /// `(file, label)` in torchvision's order: by class, then directory walk, then file name.
    pub samples: Vec<(PathBuf, u32)>,
}

/// Whether `name` ends with one of [`IMAGE_EXTENSIONS`], ignoring case.
pub fn has_image_extension(name: &str) -> bool {
    let lower = name.to_lowercase();
    IMAGE_EXTENSIONS.iter().any(|ext| lower.ends_with(ext))
}

/// Sorted names of the sub-directories of `dir` (symlinks followed).
fn sorted_subdirectories(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Image files under `dir`, walked as `sorted(os.walk(dir, followlinks=True))` then sorted file
/// names per directory.
fn image_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut directories = vec![dir.to_path_buf()];
    let mut next = 0;
    while next < directories.len() {
        let current = directories[next].clone();
        for sub in sorted_subdirectories(&current)? {
            directories.push(current.join(sub));
        }
        next += 1;
        // Guard against symlink cycles, which os.walk(followlinks=True) would also loop on.
        ensure!(
            directories.len() < 1_000_000,
            "{} holds more than a million directories (a symlink cycle?)",
            dir.display()
        );
    }
    directories.sort();
    let mut files = Vec::new();
    for directory in directories {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&directory)
            .with_context(|| format!("reading {}", directory.display()))?
        {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if has_image_extension(&name)
                && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file())
            {
                names.push(name);
            }
        }
        names.sort();
        files.extend(names.into_iter().map(|name| directory.join(name)));
    }
    Ok(files)
}

/// Scans one split root (`root/<class>/…`), keeping only the classes in `keep` when given
/// (indices then follow the sorted kept classes).
pub fn scan_image_folder(root: &Path, keep: Option<&[String]>) -> Result<FolderIndex> {
    ensure!(
        root.is_dir(),
        "image folder {} does not exist or is not a directory; point data.root at a directory \
         of class sub-directories (root/<class>/<image>) or of train/ and val/",
        root.display()
    );
    let mut classes = sorted_subdirectories(root)?;
    ensure!(
        !classes.is_empty(),
        "image folder {} has no class sub-directories; images go in root/<class>/",
        root.display()
    );
    if let Some(keep) = keep {
        let missing: Vec<&str> = keep
            .iter()
            .filter(|c| !classes.contains(c))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            bail!(
                "image folder {} has no class director{} {}; it has {} classes (e.g. {})",
                root.display(),
                if missing.len() == 1 { "y" } else { "ies" },
                missing.join(", "),
                classes.len(),
                classes
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        classes.retain(|c| keep.contains(c));
    }
    let mut samples = Vec::new();
    for (label, class) in classes.iter().enumerate() {
        let files = image_files(&root.join(class))?;
        ensure!(
            !files.is_empty(),
            "class `{class}` in {} has no image files (kept endings: {}); remove the directory \
             or add images",
            root.display(),
            IMAGE_EXTENSIONS.join(" ")
        );
        samples.extend(files.into_iter().map(|f| (f, label as u32)));
    }
    Ok(FolderIndex { classes, samples })
}

/// The file at `path` decoded by content and converted to RGB.
fn decode_rgb(path: &Path) -> Result<image::RgbImage> {
    let image = image::io::Reader::open(path)
        .with_context(|| format!("opening {}", path.display()))?
        .with_guessed_format()
        .with_context(|| format!("reading {}", path.display()))?
        .decode()
        .with_context(|| {
            format!(
                "decoding {}: not a readable image (JPEG, PNG, BMP, PNM, TIFF or WebP); remove \
                 or replace the file",
                path.display()
            )
        })?
        .to_rgb8();
    let (w, h) = image.dimensions();
    ensure!(w > 0 && h > 0, "{} is an empty image", path.display());
    Ok(image)
}

/// `image` resized to `height × width` by the separable triangle filter (see the module docs);
/// itself when it has that size.
fn resized(image: image::RgbImage, height: usize, width: usize) -> image::RgbImage {
    match (image.height() as usize, image.width() as usize) == (height, width) {
        true => image,
        false => image::imageops::resize(&image, width as u32, height as u32, FilterType::Triangle),
    }
}

/// The file at `path` as `[size, size, 3]` RGB bytes (HWC): decoded by content, converted to
/// RGB, shorter side resized to `size`, centre-cropped.
pub fn decode_resized(path: &Path, size: usize) -> Result<Vec<u8>> {
    let image = decode_rgb(path)?;
    let (nh, nw) = shorter_side_to(image.height() as usize, image.width() as usize, size);
    let image = resized(image, nh, nw);
    let (left, top) = (half_rounded_even(nw - size), half_rounded_even(nh - size));
    let (left, top, s) = (left as u32, top as u32, size as u32);
    let cropped = image::imageops::crop_imm(&image, left, top, s, s).to_image();
    Ok(cropped.into_raw())
}

/// How many times its shorter side a kept image's longer side may be (see the module docs).
pub const LONG_SIDE_CAP: usize = 4;

/// The `(height, width)` a `height × width` image is stored at under `data.keep_side = side`:
/// shorter side downscaled to `side` (the longer to `int(side · long / short)`, as `Resize`),
/// never upscaled, and the longer side at most `LONG_SIDE_CAP · side` ([`LONG_SIDE_CAP`]).
pub fn kept_size(height: usize, width: usize, side: usize) -> (usize, usize) {
    let (short, long) = (height.min(width), height.max(width));
    let cap = LONG_SIDE_CAP * side;
    let (short, long) = if long > LONG_SIDE_CAP * short {
        match long > cap {
            true => ((cap * short / long).max(1), cap),
            false => (short, long),
        }
    } else if short > side {
        (side, side * long / short)
    } else {
        (short, long)
    };
    match width <= height {
        true => (long, short),
        false => (short, long),
    }
}

/// The file at `path` stored for `data.keep_side = side`: `[H, W, 3]` RGB bytes (HWC) of the
/// [`kept_size`] of the decoded image, with `H` and `W`.
pub fn decode_kept(path: &Path, side: usize) -> Result<(Vec<u8>, usize, usize)> {
    let image = decode_rgb(path)?;
    let (h, w) = kept_size(image.height() as usize, image.width() as usize, side);
    Ok((resized(image, h, w).into_raw(), h, w))
}

/// Decodes every sample of `index` at `size` (in parallel, in order) into a [`Dataset`] named
/// `name`: `[3, size, size]` samples, stored HWC; in memory, or through the cache file in
/// `cache` (see the module docs).
pub fn decode_folder(
    index: &FolderIndex,
    size: usize,
    name: &str,
    cache: Option<&Path>,
) -> Result<Dataset> {
    ensure!(size > 0, "the image size must be positive");
    let per_sample = size * size * 3;
    let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = match cache {
        None => {
            let mut bytes = vec![0u8; index.samples.len() * per_sample];
            decode_into(&index.samples, size, &mut bytes)?;
            Arc::new(bytes)
        }
        Some(dir) => Arc::new(cached_decode(index, size, dir)?),
    };
    Ok(Dataset {
        name: name.to_string(),
        samples: Samples::U8 {
            bytes,
            channels_last: Some(3),
        },
        labels: index.samples.iter().map(|(_, label)| *label).collect(),
        shape: vec![3, size, size],
        num_classes: index.classes.len(),
    })
}

fn decode_into(samples: &[(PathBuf, u32)], size: usize, out: &mut [u8]) -> Result<()> {
    out.par_chunks_mut(size * size * 3)
        .zip(samples)
        .try_for_each(|(out, (path, _))| -> Result<()> {
            out.copy_from_slice(&decode_resized(path, size)?);
            Ok(())
        })
}

/// Images decoded per write while filling a cache file.
const CACHE_CHUNK: usize = 512;

/// Bytes read from each end of an image file for its part of the cache key.
const KEY_SPAN: usize = 4096;

/// The length of the file at `path` and the CRC-32 of its first and last [`KEY_SPAN`] bytes
/// (of all of it when it is no longer than both).
pub(crate) fn fingerprint(path: &Path) -> Result<(u64, u32)> {
    let read = || -> std::io::Result<(u64, u32)> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let mut crc = flate2::Crc::new();
        let mut buffer = vec![0u8; 2 * KEY_SPAN];
        match usize::try_from(len).ok().filter(|&n| n <= 2 * KEY_SPAN) {
            Some(n) => {
                file.read_exact(&mut buffer[..n])?;
                crc.update(&buffer[..n]);
            }
            None => {
                let (head, tail) = buffer.split_at_mut(KEY_SPAN);
                file.read_exact(head)?;
                file.seek(SeekFrom::End(-(KEY_SPAN as i64)))?;
                file.read_exact(tail)?;
                crc.update(&buffer);
            }
        }
        Ok((len, crc.sum()))
    };
    read().with_context(|| format!("cannot read {}", path.display()))
}

/// The key of the decoded bytes of `index` at `size`: the size, then each sample's length and
/// the CRC-32 of its first and last 4 KiB, in sample order.
///
/// The decoded bytes depend on the files' contents in that order and on nothing else (not the
/// paths or labels, which are taken from the scan on every load, so a moved or copied folder
/// keeps its cache, and not modification times, which a replaced file may carry from anywhere).
/// Hashing whole files would read the whole folder on every load (some 14 GB for ImageNet-100);
/// the two ends cost two small reads per file and catch a replaced file: the head holds the format
/// header and metadata and the tail the last coded bytes, which for PNG end in CRC-32s and an
/// Adler-32 over all its pixel data. What goes unseen is an edit that keeps the length and both
/// ends of a file longer than 8 KiB, such as a same-length patch inside a JPEG's coded data.
pub fn folder_cache_key(index: &FolderIndex, size: usize) -> Result<String> {
    content_key(index, format!("candle-ssl image folder v2, {size} px\n"))
}

/// The key of the images of `index` kept at shorter side `side` ([`decode_kept`]): as
/// [`folder_cache_key`], under its own first line, so it never names an `S × S` cache.
pub fn kept_cache_key(index: &FolderIndex, side: usize) -> Result<String> {
    content_key(
        index,
        format!("candle-ssl image folder kept v1, shorter side {side} px\n"),
    )
}

/// `first_line`, then each sample's length and the CRC-32 of its ends, in sample order.
fn content_key(index: &FolderIndex, first_line: String) -> Result<String> {
    let prints: Vec<(u64, u32)> = index
        .samples
        .par_iter()
        .map(|(path, _)| fingerprint(path))
        .collect::<Result<_>>()?;
    let mut key = first_line;
    for (len, crc) in prints {
        key.push_str(&format!("{len} {crc:08x}\n"));
    }
    Ok(key)
}

/// The cache file of the content `key` at `size` in `dir`: `folder-{size}px-{MD5 of key}.u8`.
pub fn folder_cache_path(key: &str, size: usize, dir: &Path) -> PathBuf {
    dir.join(format!("folder-{size}px-{}.u8", md5_hex(key)))
}

/// The cache file of the content `key` kept at `side` in `dir`:
/// `folder-keep{side}px-{MD5 of key}.u8`.
pub fn kept_cache_path(key: &str, side: usize, dir: &Path) -> PathBuf {
    dir.join(format!("folder-keep{side}px-{}.u8", md5_hex(key)))
}

pub(crate) fn md5_hex(key: &str) -> String {
    Md5::digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The decoded bytes of `index` memory-mapped from their cache file in `dir`, decoded into it
/// first (a chunk of images at a time) when it does not hold them.
fn cached_decode(index: &FolderIndex, size: usize, dir: &Path) -> Result<CacheBytes> {
    let per_sample = size * size * 3;
    let total = index.samples.len() * per_sample;
    let key = folder_cache_key(index, size)?;
    let path = folder_cache_path(&key, size, dir);
    crate::cache::cached(
        &path,
        total,
        key.as_bytes(),
        "set SSL_CACHE to a writable directory",
        |out| {
            let mut chunk = vec![0u8; CACHE_CHUNK * per_sample];
            for samples in index.samples.chunks(CACHE_CHUNK) {
                let bytes = &mut chunk[..samples.len() * per_sample];
                decode_into(samples, size, bytes)?;
                out.write_all(bytes)
                    .with_context(|| format!("writing {} (disk full?)", path.display()))?;
            }
            Ok(())
        },
    )
}

/// Decodes every sample of `index` kept at shorter side `side` ([`decode_kept`]) into a
/// [`Dataset`] named `name` of [`Samples::Images`] read as `[3, size, size]`; in memory, or
/// through the cache file in `cache` (see the module docs).
pub fn decode_folder_kept(
    index: &FolderIndex,
    size: usize,
    side: usize,
    name: &str,
    cache: Option<&Path>,
) -> Result<Dataset> {
    ensure!(size > 0, "the image size must be positive");
    ensure!(
        side >= size,
        "the kept side ({side} px) is below the image size ({size} px); set data.keep_side to \
         at least data.size, or 0 for {size} × {size} images"
    );
    let count = index.samples.len();
    let (bytes, images): (Arc<dyn AsRef<[u8]> + Send + Sync>, _) = match cache {
        None => {
            let mut bytes = Vec::new();
            write_kept(&index.samples, side, &mut |b| {
                bytes.extend_from_slice(b);
                Ok(())
            })?;
            let images =
                image_table(&bytes, count).context("the kept images do not match their table")?;
            (Arc::new(bytes), images)
        }
        Some(dir) => {
            let key = kept_cache_key(index, side)?;
            let path = kept_cache_path(&key, side, dir);
            let bytes = crate::cache::cached_unsized(
                &path,
                key.as_bytes(),
                "set SSL_CACHE to a writable directory",
                |bytes| image_table(bytes, count).is_some(),
                |out| {
                    write_kept(&index.samples, side, &mut |b| {
                        out.write_all(b)
                            .with_context(|| format!("writing {} (disk full?)", path.display()))
                    })
                },
            )?;
            let images = image_table(bytes.as_ref(), count)
                .with_context(|| format!("{} has no valid image table", path.display()))?;
            (Arc::new(bytes), images)
        }
    };
    Ok(Dataset {
        name: name.to_string(),
        samples: Samples::Images {
            bytes,
            images: images.into(),
        },
        labels: index.samples.iter().map(|(_, label)| *label).collect(),
        shape: vec![3, size, size],
        num_classes: index.classes.len(),
    })
}

/// Hands the kept images of `samples` to `write` in the cache file's layout (module docs),
/// decoding [`CACHE_CHUNK`] of them at a time in parallel.
fn write_kept(
    samples: &[(PathBuf, u32)],
    side: usize,
    write: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut table = Vec::with_capacity(samples.len() * 8 + 8);
    for chunk in samples.chunks(CACHE_CHUNK) {
        let decoded: Vec<(Vec<u8>, usize, usize)> = chunk
            .par_iter()
            .map(|(path, _)| decode_kept(path, side))
            .collect::<Result<_>>()?;
        for (pixels, h, w) in decoded {
            write(&pixels)?;
            table.extend((h as u32).to_le_bytes());
            table.extend((w as u32).to_le_bytes());
        }
    }
    table.extend((samples.len() as u64).to_le_bytes());
    write(&table)
}

/// The [`ImageEntry`]s of a kept folder's bytes (module docs), when they hold `count` RGB images
/// whose sizes add up exactly to the pixel bytes; `None` otherwise.
fn image_table(bytes: &[u8], count: usize) -> Option<Vec<ImageEntry>> {
    let (rest, n) = bytes.split_last_chunk::<8>()?;
    if u64::from_le_bytes(*n) != count as u64 {
        return None;
    }
    let pixels = rest.len().checked_sub(count.checked_mul(8)?)?;
    let mut images = Vec::with_capacity(count);
    let mut offset = 0usize;
    for dims in rest[pixels..].chunks_exact(8) {
        let height = u32::from_le_bytes(dims[..4].try_into().ok()?) as usize;
        let width = u32::from_le_bytes(dims[4..].try_into().ok()?) as usize;
        if height == 0 || width == 0 {
            return None;
        }
        images.push(ImageEntry {
            offset,
            height,
            width,
        });
        offset = offset.checked_add(height.checked_mul(width)?.checked_mul(3)?)?;
    }
    (offset == pixels).then_some(images)
}

/// An image folder decoded at one size, with its split.
pub struct ImageFolder {
    /// Training samples first, then (for the train/val layout) the validation samples.
    pub dataset: Dataset,
    /// Class directory names, in label order.
    pub classes: Vec<String>,
    /// The number of training samples when the folder has `train/` and `val/`: samples
    /// `0..n` are `train`, the rest `val`. `None` for a single `root/<class>` folder.
    pub train_len: Option<usize>,
}

/// Loads `root` (either `root/train` + `root/val`, or `root/<class>`), keeping the classes in
/// `keep` when given, at `size × size`, decoded into memory or through a file in `cache`.
pub fn load_image_folder(
    root: &Path,
    size: usize,
    keep: Option<&[String]>,
    cache: Option<&Path>,
) -> Result<ImageFolder> {
    load_image_folder_kept(root, size, 0, keep, cache)
}

/// [`load_image_folder`] with the images kept at their aspect ratio, shorter side `keep_side`
/// ([`decode_folder_kept`]; `[3, size, size]` samples, views cropped from the stored images);
/// `keep_side = 0`: decoded to `size × size` as [`load_image_folder`] does.
pub fn load_image_folder_kept(
    root: &Path,
    size: usize,
    keep_side: usize,
    keep: Option<&[String]>,
    cache: Option<&Path>,
) -> Result<ImageFolder> {
    let decode = |index: &FolderIndex| match keep_side {
        0 => decode_folder(index, size, "folder", cache),
        side => decode_folder_kept(index, size, side, "folder", cache),
    };
    // One cache file whatever path the folder is reached by.
    let root = &root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let (train, val) = (root.join("train"), root.join("val"));
    if !(train.is_dir() && val.is_dir()) {
        let index = scan_image_folder(root, keep)?;
        return Ok(ImageFolder {
            dataset: decode(&index)?,
            classes: index.classes,
            train_len: None,
        });
    }
    let mut index = scan_image_folder(&train, keep)?;
    let val_index = scan_image_folder(&val, keep)?;
    ensure!(
        index.classes == val_index.classes,
        "{} and {} list different classes ({} against {}); both splits need the same class \
         directories",
        train.display(),
        val.display(),
        index.classes.len(),
        val_index.classes.len()
    );
    let train_len = index.samples.len();
    index.samples.extend(val_index.samples);
    Ok(ImageFolder {
        dataset: decode(&index)?,
        classes: index.classes,
        train_len: Some(train_len),
    })
}

/// Writes an ImageNet-style folder at `root` in the layout [`load_image_folder`] reads:
/// `root/train/<class>/<n>.JPEG` and `root/val/<class>/<n>.JPEG`, one directory per name in
/// `classes` (e.g. ImageNet synsets, or [`IMAGENET100`]), with `[train, val]` JPEG images each,
/// `width × height` RGB of [`crate::synthetic_pixel`]s. For checks of a recipe's code path
/// without ImageNet.
pub fn write_synthetic_folder(
    root: &Path,
    classes: &[String],
    per_class: [usize; 2],
    width: u32,
    height: u32,
) -> Result<()> {
    let mut index = 0;
    for (split, count) in ["train", "val"].into_iter().zip(per_class) {
        for class in classes {
            let dir = root.join(split).join(class);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            for n in 0..count {
                let image = image::RgbImage::from_fn(width, height, |x, y| {
                    image::Rgb(std::array::from_fn(|c| {
                        crate::synthetic_pixel(index, c, y as usize, x as usize)
                    }))
                });
                index += 1;
                let path = dir.join(format!("{n}.JPEG"));
                image
                    .save_with_format(&path, image::ImageFormat::Jpeg)
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
