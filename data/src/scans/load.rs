//! A [`Collection`] decoded into a [`Dataset`]: each sample read in its own units, mapped to
//! `[0, 1]` ([`Intensity`]), brought to the run's size ([`super::fit`]) and stored as 16-bit
//! levels ([`Samples::U16`]).
//!
//! Given a cache directory, the samples are decoded once into a file there, memory-mapped on
//! every later load, so a second epoch or run decodes nothing and memory is bounded by the page
//! cache rather than the collection. Its name digests the settings that change the bytes (size,
//! mapping, spacing, 2D or 3D) and every file's length and the CRC-32 of its two ends, as the
//! image folders' caches do. The file holds the samples of the units kept, one after another,
//! then a byte per unit (1 kept, 0 skipped as unreadable under `data.skip_bad`), the channel
//! count as a little-endian `u32` and the unit count as a little-endian `u64`, then the cache
//! trailer.

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};
use rayon::prelude::*;

use super::collection::{Collection, Refused, Source, Split};
use super::{dicom, fit, nifti, raster, Decoded, Intensity};
use crate::dataset::{Dataset, Samples};

/// How a collection's samples are made.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanOptions {
    /// The side of the `[C, S, S]` images or `[C, S, S, S]` volumes.
    pub size: usize,
    pub intensity: Intensity,
    /// Volumes only: the voxel spacing (mm, `[slice, row, column]`) to resample to before the
    /// centre crop or pad to `size`; `None`: each axis resized to `size`.
    pub spacing: Option<[f64; 3]>,
    /// Leave unreadable files out (and say which) rather than stop.
    pub skip_bad: bool,
}

/// A collection's samples, ready for training.
pub struct ScanSet {
    /// The samples of the units kept, in the collection's order; an unlabelled sample has the
    /// placeholder label 0 and its position in `unlabelled`.
    pub dataset: Dataset,
    pub classes: Vec<String>,
    /// Each sample's split as its manifest row or directory names it.
    pub splits: Vec<Option<Split>>,
    /// Positions of the samples without a label (pretraining only).
    pub unlabelled: Vec<usize>,
    /// Files left out: refused when found, or unreadable (with `skip_bad`).
    pub skipped: Vec<Refused>,
}

/// Units decoded at a time while filling the cache (a few volumes' native arrays in memory).
pub(super) const CHUNK: usize = 32;

/// `source` read in its own units: one [`Decoded`] per sample.
pub fn read_source(source: &Source) -> Result<Vec<Decoded>> {
    Ok(match source {
        Source::Raster(path) => vec![raster::read_raster(path)?],
        Source::DicomFrames { path, .. } => dicom::read_frames(path)?.1,
        Source::DicomVolume(path) => vec![dicom::read_volume(path)?],
        Source::Series { files, .. } => vec![dicom::read_series(files)?],
        Source::Nifti(path) => vec![nifti::read_nifti(path)?],
    })
}

/// `source`'s samples mapped and fitted: `[C, S, S]` or `[C, S, S, S]` values in `[0, 1]` each.
pub fn prepare(source: &Source, options: &ScanOptions, volumes: bool) -> Result<Vec<Vec<f32>>> {
    let name = source.name();
    let decoded = read_source(source)?;
    ensure!(
        decoded.len() == source.samples(),
        "{name} holds {} images, its header {}; the file is inconsistent",
        decoded.len(),
        source.samples()
    );
    decoded
        .into_iter()
        .map(|mut scan| {
            options.intensity.apply(&mut scan, &name)?;
            match volumes {
                true => fit::fit_volume(&scan, options.size, options.spacing, &name),
                false => {
                    ensure!(
                        scan.shape.len() == 3,
                        "{name} is a volume of shape {:?} among 2D images",
                        scan.shape
                    );
                    Ok(fit::fit_image(&scan, options.size))
                }
            }
        })
        .collect()
}

/// The key naming a collection's decoded bytes (module docs).
fn cache_key(collection: &Collection, options: &ScanOptions) -> Result<String> {
    let mut key = format!(
        "candle-ssl scans v1\nsize {} intensity {:?} spacing {:?} volumes {}\n",
        options.size, options.intensity, options.spacing, collection.volumes
    );
    let prints: Vec<Vec<(u64, u32)>> = collection
        .entries
        .par_iter()
        .map(|e| {
            e.source
                .files()
                .into_iter()
                .map(crate::folder::fingerprint)
                .collect()
        })
        .collect::<Result<_>>()?;
    for (entry, files) in collection.entries.iter().zip(prints) {
        key.push_str(&format!("{} samples:", entry.source.samples()));
        for (len, crc) in files {
            key.push_str(&format!(" {len} {crc:08x}"));
        }
        key.push('\n');
    }
    Ok(key)
}

/// Decodes every unit of `collection` and hands the cache file's bytes (module docs) to
/// `write`.
fn write_samples(
    collection: &Collection,
    options: &ScanOptions,
    write: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut kept = Vec::with_capacity(collection.entries.len());
    let mut channels: Option<(usize, String)> = None;
    for chunk in collection.entries.chunks(CHUNK) {
        let decoded: Vec<Result<Vec<Vec<f32>>>> = chunk
            .par_iter()
            .map(|e| prepare(&e.source, options, collection.volumes))
            .collect();
        for (entry, samples) in chunk.iter().zip(decoded) {
            let name = entry.source.name();
            let samples = samples.and_then(|samples| {
                let c = samples[0].len() / sample_values(options.size, collection.volumes, 1);
                match &channels {
                    Some((first, first_name)) if *first != c => bail!(
                        "{name} has {c} channel{}, {first_name} has {first}; the samples of a \
                         run need one channel count",
                        if c == 1 { "" } else { "s" }
                    ),
                    _ => Ok((samples, c)),
                }
            });
            match samples {
                Ok((samples, c)) => {
                    channels.get_or_insert((c, name));
                    for sample in samples {
                        let levels: Vec<u8> = sample
                            .iter()
                            .flat_map(|&v| ((v * 65535.0).round() as u16).to_le_bytes())
                            .collect();
                        write(&levels)?;
                    }
                    kept.push(1u8);
                }
                Err(_) if options.skip_bad => kept.push(0),
                Err(e) => {
                    return Err(e.context(format!(
                        "{name} cannot be used; fix or remove it, or set data.skip_bad: true \
                         to leave unreadable files out (`ssl data inspect` lists them all)"
                    )))
                }
            }
        }
    }
    let Some((channels, _)) = channels else {
        bail!(
            "none of the {} files could be read",
            collection.entries.len()
        );
    };
    write(&kept)?;
    write(&(channels as u32).to_le_bytes())?;
    write(&(kept.len() as u64).to_le_bytes())
}

/// Values per sample of `channels` channels.
fn sample_values(size: usize, volumes: bool, channels: usize) -> usize {
    channels * size.pow(if volumes { 3 } else { 2 })
}

/// The kept flags and channel count of a cache file's bytes, when they hold `entries` units
/// whose kept samples add up exactly to the sample bytes; `None` otherwise.
fn unit_table(
    bytes: &[u8],
    collection: &Collection,
    options: &ScanOptions,
) -> Option<(Vec<bool>, usize)> {
    let (rest, count) = bytes.split_last_chunk::<8>()?;
    let units = collection.entries.len();
    if u64::from_le_bytes(*count) != units as u64 {
        return None;
    }
    let (rest, channels) = rest.split_last_chunk::<4>()?;
    let channels = u32::from_le_bytes(*channels) as usize;
    let flags = &rest[rest.len().checked_sub(units)?..];
    let kept: Vec<bool> = flags.iter().map(|&f| f == 1).collect();
    let samples: usize = collection
        .entries
        .iter()
        .zip(&kept)
        .filter(|(_, &k)| k)
        .map(|(e, _)| e.source.samples())
        .sum();
    let pixels = rest.len() - units;
    let per_sample = 2 * sample_values(options.size, collection.volumes, channels);
    (channels > 0 && pixels == samples * per_sample).then_some((kept, channels))
}

/// The samples of `collection` made as `options` says, decoded into memory or through the cache
/// file in `cache` (module docs). Refused files stop the load unless `options.skip_bad`.
pub fn load_scans(
    collection: &Collection,
    options: &ScanOptions,
    cache: Option<&Path>,
) -> Result<ScanSet> {
    options.intensity.validate()?;
    ensure!(options.size > 0, "data.size must be positive");
    if !collection.refused.is_empty() && !options.skip_bad {
        let listed: Vec<String> = collection
            .refused
            .iter()
            .take(5)
            .map(|r| format!("  {r}"))
            .collect();
        bail!(
            "{} files cannot be used:\n{}{}\nremove them, or set data.skip_bad: true to train \
             without them (`ssl data inspect` lists them all)",
            collection.refused.len(),
            listed.join("\n"),
            if collection.refused.len() > 5 {
                "\n  …"
            } else {
                ""
            }
        );
    }
    ensure!(
        !collection.entries.is_empty(),
        "no file can be used ({} refused)",
        collection.refused.len()
    );
    let bytes: Arc<dyn AsRef<[u8]> + Send + Sync> = match cache {
        None => {
            let mut bytes = Vec::new();
            write_samples(collection, options, &mut |b| {
                bytes.extend_from_slice(b);
                Ok(())
            })?;
            Arc::new(bytes)
        }
        Some(dir) => {
            let key = cache_key(collection, options)?;
            let dims = if collection.volumes { "vol" } else { "px" };
            let path = dir.join(format!(
                "scans-{}{dims}-{}.u16",
                options.size,
                crate::folder::md5_hex(&key)
            ));
            Arc::new(crate::cache::cached_unsized(
                &path,
                key.as_bytes(),
                "set SSL_CACHE to a writable directory",
                |bytes| unit_table(bytes, collection, options).is_some(),
                |out| {
                    write_samples(collection, options, &mut |b| {
                        out.write_all(b)
                            .with_context(|| format!("writing {} (disk full?)", path.display()))
                    })
                },
            )?)
        }
    };
    let (kept, channels) = unit_table((*bytes).as_ref(), collection, options)
        .ok_or_else(|| anyhow!("the decoded scans do not match their table"))?;
    let mut skipped = collection.refused.clone();
    let (mut labels, mut splits, mut unlabelled) = (Vec::new(), Vec::new(), Vec::new());
    for (entry, &keep) in collection.entries.iter().zip(&kept) {
        if !keep {
            let reason = match prepare(&entry.source, options, collection.volumes) {
                Err(e) => format!("{e:#}"),
                Ok(_) => "could not be read when the cache was built".into(),
            };
            skipped.push(Refused {
                path: entry.source.files()[0].to_path_buf(),
                reason,
            });
            continue;
        }
        for _ in 0..entry.source.samples() {
            if entry.label.is_none() {
                unlabelled.push(labels.len());
            }
            labels.push(entry.label.unwrap_or(0));
            splits.push(entry.split);
        }
    }
    for (class, name) in collection.classes.iter().enumerate() {
        ensure!(
            collection
                .entries
                .iter()
                .zip(&kept)
                .any(|(e, &k)| k && e.label == Some(class as u32)),
            "class `{name}` has no readable file left; fix its files or remove the class"
        );
    }
    let mut shape = vec![channels, options.size, options.size];
    if collection.volumes {
        shape.push(options.size);
    }
    Ok(ScanSet {
        dataset: Dataset {
            name: "folder".into(),
            samples: Samples::U16(bytes),
            labels,
            shape,
            num_classes: collection.classes.len(),
        },
        classes: collection.classes.clone(),
        splits,
        unlabelled,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use tempfile::TempDir;

    use super::super::collection::scan;
    use super::super::fixtures::{
        ct_slice, place_in_series, write_dicom, write_nifti, write_png16,
    };
    use super::*;

    fn options(size: usize, intensity: Intensity) -> ScanOptions {
        ScanOptions {
            size,
            intensity,
            spacing: None,
            skip_bad: false,
        }
    }

    fn error_of<T>(result: Result<T>) -> String {
        match result {
            Ok(_) => panic!("an error expected"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// `dir/name` with its parent directories made.
    fn at(dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        path
    }

    /// A 4 × 4 16-bit PNG whose levels start at `first`, one apart.
    fn png(dir: &Path, name: &str, first: u16) -> Vec<u16> {
        let levels: Vec<u16> = (0..16).map(|i| first + i).collect();
        write_png16(&at(dir, name), &levels, 4, 4);
        levels
    }

    #[test]
    fn sixteen_bit_levels_survive_and_unlabelled_files_pretrain_only() -> Result<()> {
        let dir = TempDir::new()?;
        let root = dir.path();
        let a = png(root, "a/1.png", 40_000);
        png(root, "b/1.png", 1);
        png(root, "b/2.png", 2);
        png(root, "loose.png", 3);
        let collection = scan(root, false)?;
        assert_eq!(collection.classes, ["a", "b"]);
        let set = load_scans(&collection, &options(4, Intensity::Range), None)?;
        assert_eq!(set.dataset.shape, [1, 4, 4]);
        assert_eq!(set.dataset.labels, [0, 1, 1, 0]);
        assert_eq!(set.unlabelled, [3]);
        let read = set.dataset.sample(0);
        let expected: Vec<f32> = a.iter().map(|&v| f32::from(v) / 65535.0).collect();
        for (r, e) in read.iter().zip(&expected) {
            assert!((r - e).abs() < 1e-6, "{r} vs {e}");
        }
        assert_ne!(read[0], read[1], "neighbouring 16-bit levels stay apart");
        Ok(())
    }

    #[test]
    fn a_second_load_reads_the_cache_without_decoding() -> Result<()> {
        let dir = TempDir::new()?;
        let (root, cache) = (dir.path().join("ct"), dir.path().join("cache"));
        let ramp: Vec<f32> = (0..20 * 20 * 20).map(|i| i as f32).collect();
        for class in ["x", "y"] {
            write_nifti(
                &at(&root, &format!("{class}/v.nii")),
                &ramp,
                [20; 3],
                [1.0; 3],
            );
        }
        let collection = scan(&root, true)?;
        let first = load_scans(&collection, &options(8, Intensity::MinMax), Some(&cache))?;
        assert_eq!(first.dataset.shape, [1, 8, 8, 8]);
        // Flip voxels in the middle, which the content key (ends and length) does not read:
        // a load that decoded would see them.
        let file = root.join("x/v.nii");
        let mut bytes = std::fs::read(&file)?;
        let middle = bytes.len() / 2;
        bytes[middle - 400..middle + 400].fill(0x7f);
        std::fs::write(&file, bytes)?;
        let second = load_scans(&collection, &options(8, Intensity::MinMax), Some(&cache))?;
        assert_eq!(first.dataset.sample(0), second.dataset.sample(0));
        let resized = load_scans(&collection, &options(6, Intensity::MinMax), Some(&cache))?;
        let again = load_scans(&collection, &options(6, Intensity::MinMax), None)?;
        assert_eq!(resized.dataset.sample(0), again.dataset.sample(0));
        assert_eq!(std::fs::read_dir(&cache)?.count(), 2, "one file per size");
        Ok(())
    }

    #[test]
    fn manifests_label_split_and_name_their_rows() -> Result<()> {
        let dir = TempDir::new()?;
        let root = dir.path();
        for (name, first) in [
            ("p1.png", 0),
            ("p2.png", 10),
            ("p3.png", 20),
            ("p4.png", 30),
        ] {
            png(root, &format!("scans/{name}"), first);
        }
        let manifest = root.join("labels.csv");
        std::fs::write(
            &manifest,
            "path,label,split\nscans/p1.png,effusion,train\nscans/p2.png,normal,train\n\
             scans/p3.png,normal,test\nscans/p4.png,,\n",
        )?;
        let collection = scan(&manifest, false)?;
        assert_eq!(collection.classes, ["effusion", "normal"]);
        let set = load_scans(&collection, &options(4, Intensity::Range), None)?;
        assert_eq!(set.unlabelled, [3]);
        assert_eq!(
            set.splits,
            [
                Some(Split::Train),
                Some(Split::Train),
                Some(Split::Test),
                None
            ]
        );

        std::fs::write(&manifest, "scans/p1.png,effusion\nscans/gone.png,normal\n")?;
        let message = error_of(scan(&manifest, false));
        assert!(message.contains("labels.csv row 2"), "{message}");
        assert!(message.contains("gone.png does not exist"), "{message}");

        std::fs::write(&manifest, "scans/p1.png,a,train\nscans/p2.png,b\n")?;
        let message = error_of(scan(&manifest, false));
        assert!(
            message.contains("give every labelled row a split"),
            "{message}"
        );
        Ok(())
    }

    #[test]
    fn an_empty_class_is_an_error() -> Result<()> {
        let dir = TempDir::new()?;
        png(dir.path(), "a/1.png", 0);
        std::fs::create_dir(dir.path().join("b"))?;
        let message = error_of(scan(dir.path(), false));
        assert!(message.contains("class `b`"), "{message}");
        assert!(message.contains("holds no files"), "{message}");
        Ok(())
    }

    #[test]
    fn mixed_channel_counts_are_refused_by_name() -> Result<()> {
        let dir = TempDir::new()?;
        png(dir.path(), "a/grey.png", 0);
        let five = at(dir.path(), "a/cells.tif");
        super::super::fixtures::write_tiff16::<5>(&five, &[7; 5 * 16], 4, 4);
        let collection = scan(dir.path(), false)?;
        let message = error_of(load_scans(&collection, &options(4, Intensity::Range), None));
        assert!(message.contains("grey.png has 1 channel,"), "{message}");
        assert!(message.contains("cells.tif has 5"), "{message}");
        Ok(())
    }

    #[test]
    fn bad_files_stop_the_load_unless_skipped_and_then_are_listed() -> Result<()> {
        let dir = TempDir::new()?;
        let root = dir.path();
        let cube: Vec<f32> = (0..64).map(|i| i as f32).collect();
        for name in ["a/1.nii", "a/2.nii", "b/1.nii"] {
            write_nifti(&at(root, name), &cube, [4; 3], [1.0; 3]);
        }
        let mut nan = cube.clone();
        nan[5] = f32::NAN;
        write_nifti(&at(root, "b/nan.nii"), &nan, [4; 3], [1.0; 3]);
        let bytes = std::fs::read(root.join("a/1.nii"))?;
        std::fs::write(at(root, "b/cut.nii"), &bytes[..400])?;
        std::fs::write(at(root, "b/notes.txt"), "reader's notes")?;

        let collection = scan(root, true)?;
        let message = error_of(load_scans(
            &collection,
            &options(4, Intensity::MinMax),
            None,
        ));
        assert!(
            message.contains("notes.txt is not a DICOM, NIfTI or image"),
            "{message}"
        );
        assert!(message.contains("data.skip_bad: true"), "{message}");

        let skip = ScanOptions {
            skip_bad: true,
            ..options(4, Intensity::MinMax)
        };
        let set = load_scans(&collection, &skip, Some(&dir.path().join("cache")))?;
        assert_eq!(set.dataset.len(), 3);
        let skipped: Vec<String> = set.skipped.iter().map(Refused::to_string).collect();
        assert_eq!(skipped.len(), 3, "{skipped:?}");
        let find = |name: &str| skipped.iter().find(|s| s.contains(name)).cloned();
        assert!(find("notes.txt").is_some(), "{skipped:?}");
        assert!(
            find("cut.nii").unwrap().contains("truncated"),
            "{skipped:?}"
        );
        assert!(
            find("nan.nii").unwrap().contains("NaN or infinite"),
            "{skipped:?}"
        );

        let strict = load_scans(&collection, &options(4, Intensity::MinMax), None);
        let message = error_of(strict);
        assert!(!message.is_empty());
        Ok(())
    }

    #[test]
    fn a_dicom_series_with_a_gap_is_an_error_naming_its_directory() -> Result<()> {
        let dir = TempDir::new()?;
        for (class, positions) in [("a", [0.0, 1.0, 2.0, 3.0]), ("b", [0.0, 1.0, 2.0, 5.0])] {
            let series = dir.path().join(class).join("series1");
            std::fs::create_dir_all(&series)?;
            for (i, z) in positions.into_iter().enumerate() {
                let mut slice = ct_slice(
                    &[1000; 16],
                    4,
                    4,
                    dicom_dictionary_std::uids::EXPLICIT_VR_LITTLE_ENDIAN,
                );
                place_in_series(&mut slice, "2.25.9", i as i64 + 1, z);
                write_dicom(
                    &series,
                    &format!("IM{i}"),
                    slice,
                    dicom_dictionary_std::uids::EXPLICIT_VR_LITTLE_ENDIAN,
                );
            }
        }
        let collection = scan(dir.path(), true)?;
        assert_eq!(collection.entries.len(), 2);
        let message = error_of(load_scans(
            &collection,
            &options(4, Intensity::MinMax),
            None,
        ));
        assert!(message.contains("b/series1"), "{message}");
        assert!(message.contains("a slice is missing"), "{message}");
        Ok(())
    }
}
