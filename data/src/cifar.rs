//! CIFAR-10 and CIFAR-100 (Krizhevsky, "Learning multiple layers of features from tiny images",
//! 2009) from the official Python archives.
//!
//! `cifar-10-python.tar.gz` holds `cifar-10-batches-py/data_batch_1` … `data_batch_5` (10,000
//! train images each) and `test_batch` (10,000); `cifar-100-python.tar.gz` holds
//! `cifar-100-python/train` (50,000) and `test` (10,000). Each is a Python 2 pickle of a dict
//! (see [`crate::pickle`]): `data`, a `uint8` array `[N, 3072]` whose rows are the red, green and
//! blue 32×32 planes, row-major (already `[3, 32, 32]`), and `labels` (CIFAR-10) or
//! `fine_labels` and `coarse_labels` (CIFAR-100, both kept: `cifar100` reads the 100 fine
//! classes, `cifar100-coarse` the 20 superclasses). Members may come in any order (the official
//! CIFAR-10 archive is not sorted); the other members (`batches.meta`, `readme.html`, `meta`) are
//! not read.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

use crate::archive::{each_tar_member, label_bytes, read_member, ArchiveInfo, Fill, Layout};
use crate::pickle;

/// Bytes of one image.
const IMAGE: usize = 3 * 32 * 32;

/// The batches of an archive in split order, each with its split (0 train, 1 test).
fn members(info: &ArchiveInfo) -> Vec<(String, usize)> {
    match info.file {
        "cifar-10-python.tar.gz" => (1..=5)
            .map(|b| (format!("cifar-10-batches-py/data_batch_{b}"), 0))
            .chain([("cifar-10-batches-py/test_batch".to_string(), 1)])
            .collect(),
        _ => vec![
            ("cifar-100-python/train".to_string(), 0),
            ("cifar-100-python/test".to_string(), 1),
        ],
    }
}

/// The label keys of an archive's batches, one cache column each.
fn label_keys(info: &ArchiveInfo) -> &'static [&'static str] {
    match info.file {
        "cifar-10-python.tar.gz" => &["labels"],
        _ => &["fine_labels", "coarse_labels"],
    }
}

/// One batch read: its images (rows of [`IMAGE`] bytes) and label columns, interleaved per image.
struct Batch {
    images: Vec<u8>,
    labels: Vec<u8>,
}

/// Reads every batch of the archive at `path` (one pass, in memory: 184 MB for the official
/// files) and returns its layout and what writes it into the cache.
pub(crate) fn decode(path: &Path, info: &'static ArchiveInfo) -> Result<(Layout, Fill)> {
    let wanted = members(info);
    let keys = label_keys(info);
    let mut batches: Vec<Option<Batch>> = wanted.iter().map(|_| None).collect();
    each_tar_member(path, |name, reader, size| {
        let Some(slot) = wanted.iter().position(|(m, _)| m == name) else {
            return Ok(());
        };
        ensure!(batches[slot].is_none(), "the archive holds it twice");
        let bytes = read_member(reader, size)?;
        batches[slot] = Some(read_batch(&bytes, keys).context(
            "not a CIFAR batch (expected a pickled dict with a uint8 `data` array [N, 3072])",
        )?);
        Ok(())
    })?;
    let mut counts = [0usize; 3];
    let mut found = Vec::with_capacity(batches.len());
    for ((member, split), batch) in wanted.iter().zip(batches) {
        let Some(batch) = batch else {
            bail!(
                "the archive has no member {member} (another or a damaged archive: {} holds {})",
                info.file,
                wanted
                    .iter()
                    .map(|(m, _)| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        counts[*split] += batch.images.len() / IMAGE;
        found.push(batch);
    }
    let layout = Layout {
        counts,
        side: 32,
        label_columns: keys.len(),
    };
    let fill: Fill = Box::new(move |layout, out| {
        let mut i = 0;
        for batch in found {
            let n = batch.images.len() / IMAGE;
            out.write_at(layout.image_at(i), &batch.images)?;
            out.write_at(layout.labels_at(i), &batch.labels)?;
            i += n;
        }
        Ok(())
    });
    Ok((layout, fill))
}

/// The images and labels of one pickled batch, checked.
fn read_batch(bytes: &[u8], keys: &[&str]) -> Result<Batch> {
    let dict = pickle::read_dict(bytes)?;
    let (shape, data) = dict.u8_array("data")?;
    ensure!(
        shape.len() == 2 && shape[1] == IMAGE,
        "its `data` has shape {shape:?}, not [N, {IMAGE}] (32×32 RGB rows)"
    );
    let n = shape[0];
    let mut columns = Vec::with_capacity(keys.len());
    for (k, key) in keys.iter().enumerate() {
        let labels = dict.ints(key)?;
        ensure!(
            labels.len() == n,
            "it has {} `{key}` for {n} images",
            labels.len()
        );
        // CIFAR-100's second column: its 20 superclasses.
        let classes = match (k, keys.len()) {
            (0, 1) => 10,
            (0, _) => 100,
            _ => 20,
        };
        columns.push(label_bytes(&labels, classes, key)?);
    }
    let labels = (0..n)
        .flat_map(|i| columns.iter().map(move |c| c[i]))
        .collect();
    Ok(Batch {
        images: data.to_vec(),
        labels,
    })
}

/// An archive of `info` in the official layout (see [`crate::write_synthetic_archive`]); the
/// train images are spread over the five CIFAR-10 batches, and the members are in the official
/// CIFAR-10 archive's (unsorted) order.
pub(crate) fn write_synthetic(path: &Path, info: &ArchiveInfo, counts: [usize; 3]) -> Result<()> {
    let wanted = members(info);
    let keys = label_keys(info);
    let train_batches = wanted.len() - 1;
    let mut start = 0;
    let mut pickles = Vec::new();
    for (b, (member, split)) in wanted.iter().enumerate() {
        let n = match split {
            0 => counts[0] / train_batches + usize::from(b < counts[0] % train_batches),
            _ => counts[1],
        };
        let images = start..start + n;
        let mut data = Vec::with_capacity(n * IMAGE);
        for i in images.clone() {
            for c in 0..3 {
                for y in 0..32 {
                    for x in 0..32 {
                        data.push(crate::synthetic_pixel(i, c, y, x));
                    }
                }
            }
        }
        let fine: Vec<u32> = images.clone().map(|i| (i % info.classes) as u32).collect();
        let mut dict = pickle::Writer::dict().text(
            "batch_label",
            &match split {
                0 => format!("training batch {} of {train_batches}", b + 1),
                _ => "testing batch 1 of 1".into(),
            },
        );
        dict = match keys {
            [labels] => dict.ints(labels, &fine),
            _ => dict.ints("fine_labels", &fine).ints(
                "coarse_labels",
                &fine.iter().map(|l| l % 20).collect::<Vec<_>>(),
            ),
        };
        pickles.push((
            member.clone(),
            dict.u8_array("data", &[n, IMAGE], &data).finish(),
        ));
        start += n;
    }
    // Out of order, as the official CIFAR-10 archive is (data_batch_4, readme.html,
    // test_batch, data_batch_3, batches.meta, data_batch_2, data_batch_5, data_batch_1).
    let order = match pickles.len() {
        6 => [3, 5, 2, 1, 4, 0].map(|i| pickles[i].clone()).to_vec(),
        _ => vec![pickles[1].clone(), pickles[0].clone()],
    };
    let dir = wanted[0].0.rsplit_once('/').map_or("", |(d, _)| d);
    let readme = (format!("{dir}/readme.html"), b"<html></html>\n".to_vec());
    crate::archive::write_tar_gz(path, &[vec![readme], order].concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::archive_cache_path;
    use crate::archive::tests::assert_pixels;
    use crate::{load_benchmark, write_synthetic_archive};

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn cifar10_reads_every_batch_in_split_order_with_planes_as_rows() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-10-python.tar.gz");
        write_synthetic_archive("cifar10", &path, [12, 5, 0])?;
        let b = load_benchmark("cifar10", dir.path())?;
        assert_eq!(
            (b.train.clone(), b.test.clone(), b.unlabeled.len()),
            (0..12, 12..17, 0)
        );
        let d = &b.dataset;
        assert_eq!(
            (d.shape.clone(), d.num_classes, d.len()),
            (vec![3, 32, 32], 10, 17)
        );
        // Batch 1 holds images 0–2, batch 5 images 9–11, test_batch 12–16.
        for i in [0, 2, 3, 9, 11, 12, 16] {
            assert_pixels(d, i, i);
            assert_eq!(d.labels[i], (i % 10) as u32);
        }
        let cache = archive_cache_path(&path);
        assert_eq!(
            std::fs::metadata(&cache)?.len() as usize,
            48 + 17 * (3072 + 1) + crate::cache::TRAILER_LEN
        );
        // The second load maps the cache (the archive is not read: it may even be unreadable
        // now, as long as its size and ends are the same).
        drop(b);
        let again = load_benchmark("cifar10", &path)?;
        assert_pixels(&again.dataset, 16, 16);
        assert_eq!(
            names(dir.path()),
            ["cifar-10-python.images.u8", "cifar-10-python.tar.gz"]
        );
        Ok(())
    }

    #[test]
    fn cifar100_keeps_fine_and_coarse_labels() -> Result<()> {
        let dir = tempfile::tempdir()?;
        write_synthetic_archive(
            "cifar100",
            &dir.path().join("cifar-100-python.tar.gz"),
            [130, 4, 0],
        )?;
        let fine = load_benchmark("cifar100", dir.path())?;
        let coarse = load_benchmark("cifar100-coarse", dir.path())?;
        assert_eq!(
            (fine.dataset.num_classes, coarse.dataset.num_classes),
            (100, 20)
        );
        for i in [0, 99, 101, 129, 133] {
            assert_eq!(fine.dataset.labels[i], (i % 100) as u32);
            assert_eq!(coarse.dataset.labels[i], (i % 100 % 20) as u32);
            assert_pixels(&coarse.dataset, i, i);
        }
        assert_eq!(fine.test, 130..134);
        Ok(())
    }

    #[test]
    fn damaged_or_foreign_archives_are_clear_errors() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-10-python.tar.gz");
        let error = || format!("{:#}", load_benchmark("cifar10", dir.path()).unwrap_err());
        let fix = format!("ssl data download cifar10 --dir {}", dir.path().display());
        // Truncated.
        write_synthetic_archive("cifar10", &path, [10, 2, 0])?;
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() / 2])?;
        let e = error();
        for needle in [path.to_str().unwrap(), "damaged or truncated", fix.as_str()] {
            assert!(e.contains(needle), "`{needle}` missing from: {e}");
        }
        // A member missing, or a batch of another shape.
        let batch = |n: usize, width: usize| {
            let dict = pickle::Writer::dict().ints("labels", &vec![1; n]);
            dict.u8_array("data", &[n, width], &vec![0; n * width])
                .finish()
        };
        let mut members: Vec<(String, Vec<u8>)> = (1..=5)
            .map(|b| {
                (
                    format!("cifar-10-batches-py/data_batch_{b}"),
                    batch(2, IMAGE),
                )
            })
            .collect();
        members.push(("cifar-10-batches-py/test_batch".into(), batch(2, IMAGE)));
        let missing: Vec<_> = members
            .iter()
            .filter(|(m, _)| !m.ends_with("_3"))
            .cloned()
            .collect();
        crate::archive::write_tar_gz(&path, &missing)?;
        let e = error();
        assert!(
            e.contains("no member cifar-10-batches-py/data_batch_3") && e.contains(&fix),
            "{e}"
        );
        members[5].1 = batch(2, 3071);
        crate::archive::write_tar_gz(&path, &members)?;
        let e = error();
        assert!(
            e.contains("member cifar-10-batches-py/test_batch")
                && e.contains("[2, 3071], not [N, 3072]"),
            "{e}"
        );
        members[5].1 = pickle::Writer::dict().ints("labels", &[10]).finish();
        crate::archive::write_tar_gz(&path, &members)?;
        assert!(error().contains("no `data` entry"), "{}", error());
        // Nothing is left behind but the archive.
        assert_eq!(names(dir.path()), ["cifar-10-python.tar.gz"]);
        Ok(())
    }
}
