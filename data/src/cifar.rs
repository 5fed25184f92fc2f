//! CIFAR-10 and CIFAR-100 (Krizhevsky, "Learning multiple layers of features from tiny images",
//! 2009) from the official Python archives.
//!
//! `cifar-10-python.tar.gz` holds `cifar-10-batches-py/data_batch_1` … `data_batch_5` (10,000
//! train images each) and `test_batch` (10,000); `cifar-100-python.tar.gz` holds
//! `cifar-100-python/train` (50,000) and `test` (10,000). Each is a Python 2 pickle of a dict
//! (see `pickle`): `data`, a `uint8` array `[N, 3072]` whose rows are the red, green and
//! blue 32×32 planes, row-major (already `[3, 32, 32]`), and `labels` (CIFAR-10) or
//! `fine_labels` and `coarse_labels` (CIFAR-100, both kept: `cifar100` reads the 100 fine
//! classes, `cifar100-coarse` the 20 superclasses). Members may come in any order (the official
//! CIFAR-10 archive is not sorted); the other members (`batches.meta`, `readme.html`, `meta`) are
//! not read.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

use crate::archive::{
    each_tar_member, label_bytes, read_member, synthetic_note, ArchiveInfo, Expected, Fill, Layout,
    SYNTHETIC_MEMBER,
};
use crate::pickle;

/// Bytes of one image.
const IMAGE: usize = 3 * 32 * 32;

/// The batches of an archive in split order, each with its split (0 train, 1 test) and its rows
/// under the table `splits` (train, test, unlabeled): the train split spread evenly over the
/// train batches, the first ones taking one more row each where it does not divide (the
/// published 50,000 gives each of CIFAR-10's five 10,000).
fn members(info: &ArchiveInfo, splits: [usize; 3]) -> Vec<(String, usize, usize)> {
    let names: Vec<(String, usize)> = match info.file {
        "cifar-10-python.tar.gz" => (1..=5)
            .map(|b| (format!("cifar-10-batches-py/data_batch_{b}"), 0))
            .chain([("cifar-10-batches-py/test_batch".to_string(), 1)])
            .collect(),
        _ => vec![
            ("cifar-100-python/train".to_string(), 0),
            ("cifar-100-python/test".to_string(), 1),
        ],
    };
    let train_batches = names.len() - 1;
    names
        .into_iter()
        .enumerate()
        .map(|(b, (name, split))| {
            let rows = match split {
                0 => splits[0] / train_batches + usize::from(b < splits[0] % train_batches),
                _ => splits[1],
            };
            (name, split, rows)
        })
        .collect()
}

/// The archive's top directory (`cifar-10-batches-py`, `cifar-100-python`).
fn top(info: &ArchiveInfo) -> &'static str {
    match info.file {
        "cifar-10-python.tar.gz" => "cifar-10-batches-py",
        _ => "cifar-100-python",
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
/// files), checks each against the table (see [`Expected`]): its rows (10,000 in each CIFAR-10
/// batch; CIFAR-100's train 50,000, test 10,000), their width (3,072 bytes) and its labels'
/// range (CIFAR-10 0..10; CIFAR-100 fine 0..100, coarse 0..20), and returns its layout and what
/// writes it into the cache.
pub(crate) fn decode(path: &Path, info: &'static ArchiveInfo) -> Result<(Layout, Fill)> {
    let wanted = members(info, info.splits);
    let keys = label_keys(info);
    let synthetic_member = format!("{}/{SYNTHETIC_MEMBER}", top(info));
    let mut synthetic = None;
    let mut batches: Vec<Option<Batch>> = wanted.iter().map(|_| None).collect();
    each_tar_member(path, |name, reader, size| {
        if name == synthetic_member {
            synthetic = Some(read_member(reader, size)?);
            return Ok(());
        }
        let Some(slot) = wanted.iter().position(|(m, ..)| m == name) else {
            return Ok(());
        };
        ensure!(batches[slot].is_none(), "the archive holds it twice");
        let bytes = read_member(reader, size)?;
        batches[slot] = Some(read_batch(&bytes, keys)?);
        Ok(())
    })?;
    let expected = Expected::new(
        info,
        synthetic.as_deref().map(|b| (synthetic_member.as_str(), b)),
    )?;
    let mut counts = [0usize; 3];
    let mut found = Vec::with_capacity(batches.len());
    for ((member, split, rows), batch) in members(info, expected.splits).iter().zip(batches) {
        let Some(batch) = batch else {
            bail!(
                "the archive has no member {member} (another or a damaged archive: {} holds {})",
                info.file,
                wanted
                    .iter()
                    .map(|(m, ..)| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let n = batch.images.len() / IMAGE;
        expected.check(member, n, *rows, "rows")?;
        counts[*split] += n;
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
    let not_a_batch =
        "not a CIFAR batch (expected a pickled dict with a uint8 `data` array [N, 3072])";
    let dict = pickle::read_dict(bytes).context(not_a_batch)?;
    let (shape, data) = dict.u8_array("data").context(not_a_batch)?;
    ensure!(
        shape.len() == 2 && shape[1] == IMAGE,
        "its `data` has shape {shape:?}, not [N, {IMAGE}] (rows of 32×32 RGB, 3,072 bytes)"
    );
    let n = shape[0];
    let mut columns = Vec::with_capacity(keys.len());
    for (k, key) in keys.iter().enumerate() {
        let labels = dict.ints(key).context(not_a_batch)?;
        ensure!(
            labels.len() == n,
            "its `{key}` has {} entries for its {n} rows",
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
    let wanted = members(info, counts);
    let keys = label_keys(info);
    let train_batches = wanted.len() - 1;
    let mut start = 0;
    let mut pickles = Vec::new();
    for (b, (member, split, n)) in wanted.iter().enumerate() {
        let n = *n;
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
    let dir = top(info);
    let readme = (format!("{dir}/readme.html"), b"<html></html>\n".to_vec());
    let note = (format!("{dir}/{SYNTHETIC_MEMBER}"), synthetic_note(counts));
    crate::archive::write_tar_gz(path, &[vec![note, readme], order].concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::archive_cache_path;
    use crate::archive::tests::{
        assert_corrupt, assert_flipped_bytes_are_corrupt, assert_pixels, load_error,
        write_tar_gz_with_a_bad_header,
    };
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

    /// A pickled CIFAR-10 batch of `n` rows of `width` zero bytes, labelled `label`.
    fn batch(n: usize, width: usize, label: u32) -> Vec<u8> {
        let dict = pickle::Writer::dict().ints("labels", &vec![label; n]);
        dict.u8_array("data", &[n, width], &vec![0; n * width])
            .finish()
    }

    /// CIFAR-10's six batches of `n` rows each (train first), labelled 1.
    fn cifar10_members(n: usize) -> Vec<(String, Vec<u8>)> {
        let info = crate::archive_info("cifar10").unwrap();
        members(info, info.splits)
            .into_iter()
            .map(|(name, ..)| (name, batch(n, IMAGE, 1)))
            .collect()
    }

    fn synthetic(counts: [usize; 3]) -> (String, Vec<u8>) {
        let member = format!("cifar-10-batches-py/{SYNTHETIC_MEMBER}");
        (member, synthetic_note(counts))
    }

    #[test]
    fn published_table_gives_every_batch_its_rows() {
        let info = crate::archive_info("cifar10").unwrap();
        let rows: Vec<usize> = members(info, info.splits).iter().map(|m| m.2).collect();
        assert_eq!(rows, [10_000; 6]);
        let info = crate::archive_info("cifar100").unwrap();
        let rows: Vec<usize> = members(info, info.splits).iter().map(|m| m.2).collect();
        assert_eq!(rows, [50_000, 10_000]);
    }

    #[test]
    fn rows_are_checked_per_member_against_the_published_or_declared_table() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-10-python.tar.gz");
        let fix = format!("ssl data download cifar10 --dir {}", dir.path().display());
        // The official archive's members, 2 rows each: short of the published 10,000.
        crate::archive::write_tar_gz(&path, &cifar10_members(2))?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains(
                "cifar-10-batches-py/data_batch_1 holds 2 rows; the published CIFAR-10 has \
                 10,000 (another release, or a damaged archive)"
            ) && e.contains(&fix),
            "{e}"
        );
        // The case, at the published sizes: data_batch_3 one row short (the check
        // comes before the members after it are looked for).
        let members: Vec<_> = cifar10_members(0)
            .into_iter()
            .take(3)
            .enumerate()
            .map(|(b, (name, _))| (name, batch(10_000 - usize::from(b == 2), IMAGE, 1)))
            .collect();
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains(
                "cifar-10-batches-py/data_batch_3 holds 9,999 rows; the published CIFAR-10 has \
                 10,000"
            ),
            "{e}"
        );
        // A synthetic archive is held to the table it declares: 2 rows in every batch.
        let mut members = cifar10_members(2);
        members[2].1 = batch(3, IMAGE, 1);
        members.insert(0, synthetic([10, 2, 0]));
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains(
                "cifar-10-batches-py/data_batch_3 holds 3 rows; this synthetic archive's \
                 cifar-10-batches-py/SYNTHETIC.txt declares 2"
            ),
            "{e}"
        );
        members[3].1 = batch(2, IMAGE, 1);
        crate::archive::write_tar_gz(&path, &members)?;
        assert_eq!(load_benchmark("cifar10", dir.path())?.dataset.len(), 12);

        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-100-python.tar.gz");
        let batch100 = |n: usize| {
            let dict = pickle::Writer::dict()
                .ints("fine_labels", &vec![99; n])
                .ints("coarse_labels", &vec![19; n]);
            dict.u8_array("data", &[n, IMAGE], &vec![0; n * IMAGE])
                .finish()
        };
        let members = [
            ("cifar-100-python/test".to_string(), batch100(10)),
            ("cifar-100-python/train".to_string(), batch100(10)),
        ];
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar100", dir.path());
        assert!(
            e.contains("cifar-100-python/train holds 10 rows; the published CIFAR-100 has 50,000"),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn rows_of_another_width_and_labels_out_of_range_name_the_member() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-10-python.tar.gz");
        let mut members = cifar10_members(2);
        members.insert(0, synthetic([10, 2, 0]));
        members[6].1 = batch(2, 3071, 1);
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains("member cifar-10-batches-py/test_batch: its `data` has shape [2, 3071], not [N, 3072]"),
            "{e}"
        );
        members[6].1 = batch(2, IMAGE, 1);
        members[2].1 = batch(2, IMAGE, 10);
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains(
                "member cifar-10-batches-py/data_batch_2: its `labels` holds 10 (row 0), outside \
                 the classes 0..10"
            ),
            "{e}"
        );
        // CIFAR-100's coarse labels: 20 superclasses.
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-100-python.tar.gz");
        let batch100 = |coarse: u32| {
            let dict = pickle::Writer::dict()
                .ints("fine_labels", &[3, 99])
                .ints("coarse_labels", &[coarse, 1]);
            dict.u8_array("data", &[2, IMAGE], &[0; 2 * IMAGE]).finish()
        };
        let members = [
            (
                format!("cifar-100-python/{SYNTHETIC_MEMBER}"),
                synthetic_note([2, 2, 0]),
            ),
            ("cifar-100-python/train".to_string(), batch100(19)),
            ("cifar-100-python/test".to_string(), batch100(20)),
        ];
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar100-coarse", dir.path());
        assert!(
            e.contains(
                "member cifar-100-python/test: its `coarse_labels` holds 20 (row 0), outside the \
                 classes 0..20"
            ),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn a_flipped_truncated_or_misbuilt_archive_is_called_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cifar-10-python.tar.gz");
        write_synthetic_archive("cifar10", &path, [10, 2, 0])?;
        assert_flipped_bytes_are_corrupt("cifar10", &path, 12);
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() / 2])?;
        let e = load_error("cifar10", dir.path());
        assert_corrupt(
            &e,
            &path,
            "cifar10",
            "truncated: its gzip stream ends early, in member",
        );
        // The gzip trailer's length, one short.
        let mut short = bytes.clone();
        let n = short.len();
        short[n - 4] = short[n - 4].wrapping_sub(1);
        std::fs::write(&path, &short)?;
        let e = load_error("cifar10", dir.path());
        assert_corrupt(
            &e,
            &path,
            "cifar10",
            "its gzip CRC-32 or length does not match its trailer; the damage shows at its end",
        );
        let mut members = cifar10_members(2);
        members.insert(0, synthetic([10, 2, 0]));
        write_tar_gz_with_a_bad_header(&path, &members);
        let e = load_error("cifar10", dir.path());
        assert_corrupt(&e, &path, "cifar10", "its tar stream is damaged (archive header checksum mismatch), after member cifar-10-batches-py/SYNTHETIC.txt");
        // A member missing, or one that is not a batch, in an intact archive: not corrupt.
        let missing: Vec<_> = members
            .iter()
            .filter(|(m, _)| !m.ends_with("_3"))
            .cloned()
            .collect();
        crate::archive::write_tar_gz(&path, &missing)?;
        let e = load_error("cifar10", dir.path());
        let fix = format!(
            "download it again with `ssl data download cifar10 --dir {}`",
            dir.path().display()
        );
        assert!(
            e.contains("no member cifar-10-batches-py/data_batch_3") && e.contains(&fix),
            "{e}"
        );
        members[6].1 = pickle::Writer::dict().ints("labels", &[1]).finish();
        crate::archive::write_tar_gz(&path, &members)?;
        let e = load_error("cifar10", dir.path());
        assert!(
            e.contains("member cifar-10-batches-py/test_batch: not a CIFAR batch")
                && e.contains("no `data` entry")
                && !e.contains("corrupt"),
            "{e}"
        );
        // Nothing is left behind but the archive.
        assert_eq!(names(dir.path()), ["cifar-10-python.tar.gz"]);
        Ok(())
    }
}
