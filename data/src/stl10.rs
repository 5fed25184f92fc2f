//! STL-10 (Coates, Lee & Ng, "An analysis of single-layer networks in unsupervised feature
//! learning", AISTATS 2011) from the official binary archive `stl10_binary.tar.gz`.
//!
//! `stl10_binary/train_X.bin` (5,000 images), `test_X.bin` (8,000) and `unlabeled_X.bin`
//! (100,000) hold 96×96 RGB images of 27,648 bytes each, every channel's plane stored
//! **column-major** (read as `[N, 3, 96, 96]`, the last two axes are `[x, y]`, so they are
//! swapped here into `[3, 96, 96]` rows); `train_y.bin` and `test_y.bin` hold one label byte per
//! image in `1..=10`, read as `0..10`. The unlabeled images have no labels: they are what
//! self-supervised pretraining adds (`data.split: train+unlabeled`), never evaluated on. The
//! archive is read twice on first use — its labels and sizes, then the images streamed into the
//! cache — so its 2.6 GB of pixels are never in memory.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

use crate::archive::{
    each_tar_member, read_member, synthetic_note, Corrupt, Expected, Fill, Layout, SYNTHETIC_MEMBER,
};

const SIDE: usize = 96;
/// Bytes of one image.
const IMAGE: usize = 3 * SIDE * SIDE;
const DIR: &str = "stl10_binary";
/// The image files of the train, test and unlabeled splits, and the label files of the first two.
const IMAGES: [&str; 3] = ["train_X.bin", "test_X.bin", "unlabeled_X.bin"];
const LABELS: [&str; 2] = ["train_y.bin", "test_y.bin"];

/// Reads the labels and split sizes of the archive at `path`, checks them against the table (see
/// [`Expected`]: the published 5,000 train, 8,000 test and 100,000 unlabeled images, each file a
/// whole number of 27,648-byte images, one label in `1..=10` per labelled image), and returns its
/// layout and what streams its images (a second pass) into the cache.
pub(crate) fn decode(path: &Path, info: &'static crate::ArchiveInfo) -> Result<(Layout, Fill)> {
    let synthetic_member = format!("{DIR}/{SYNTHETIC_MEMBER}");
    let mut synthetic = None;
    let mut sizes: [Option<u64>; 3] = [None; 3];
    let mut labels: [Option<Vec<u8>>; 2] = [None, None];
    each_tar_member(path, |name, reader, size| {
        if name == synthetic_member {
            synthetic = Some(read_member(reader, size)?);
            return Ok(());
        }
        let Some(file) = name.strip_prefix(DIR).and_then(|n| n.strip_prefix('/')) else {
            return Ok(());
        };
        if let Some(s) = IMAGES.iter().position(|&f| f == file) {
            ensure!(
                size % IMAGE as u64 == 0,
                "{size} bytes, not a whole number of 96×96 RGB images ({IMAGE} bytes each)"
            );
            sizes[s] = Some(size);
        } else if let Some(s) = LABELS.iter().position(|&f| f == file) {
            let bytes = read_member(reader, size)?;
            if let Some((i, &l)) = bytes
                .iter()
                .enumerate()
                .find(|(_, &l)| !(1..=10).contains(&l))
            {
                bail!("label {i} is {l}, outside the classes 1..=10");
            }
            labels[s] = Some(bytes.iter().map(|l| l - 1).collect());
        }
        Ok(())
    })?;
    let expected = Expected::new(
        info,
        synthetic.as_deref().map(|b| (synthetic_member.as_str(), b)),
    )?;
    let missing = |file: &str| {
        format!(
            "the archive has no member {DIR}/{file} (another or a damaged archive: \
             stl10_binary.tar.gz holds {DIR}/{{train,test,unlabeled}}_X.bin and \
             {DIR}/{{train,test}}_y.bin)"
        )
    };
    let mut counts = [0usize; 3];
    for (s, file) in IMAGES.iter().enumerate() {
        counts[s] = (sizes[s].with_context(|| missing(file))? / IMAGE as u64) as usize;
    }
    let labels: Vec<Vec<u8>> = (0..LABELS.len())
        .map(|s| labels[s].take().with_context(|| missing(LABELS[s])))
        .collect::<Result<_>>()?;
    // Every member is there: now their sizes, split by split.
    for (s, file) in IMAGES.iter().enumerate() {
        let member = format!("{DIR}/{file}");
        expected.check(&member, counts[s], expected.splits[s], "images")?;
        if let (Some(found), Some(file)) = (labels.get(s), LABELS.get(s)) {
            let member = format!("{DIR}/{file}");
            expected.check(&member, found.len(), expected.splits[s], "labels")?;
        }
    }
    let columns = labels.concat();
    let layout = Layout {
        counts,
        side: SIDE,
        label_columns: 1,
    };
    let path = path.to_path_buf();
    let fill: Fill = Box::new(move |layout, out| {
        out.write_at(layout.labels_at(0), &columns)?;
        // The unlabeled images' label bytes, never read.
        out.write_at(layout.labels_at(columns.len()), &vec![0; layout.counts[2]])?;
        let starts = [0, layout.counts[0], layout.counts[0] + layout.counts[1]];
        let mut stored = vec![0u8; IMAGE];
        let mut rows = vec![0u8; IMAGE];
        each_tar_member(&path, |name, reader, _| {
            let Some(s) = name
                .strip_prefix(DIR)
                .and_then(|n| n.strip_prefix('/'))
                .and_then(|file| IMAGES.iter().position(|&f| f == file))
            else {
                return Ok(());
            };
            for k in 0..layout.counts[s] {
                reader
                    .read_exact(&mut stored)
                    .map_err(|e| Corrupt(format!("truncated ({e})")))?;
                to_rows(&stored, &mut rows);
                out.write_at(layout.image_at(starts[s] + k), &rows)?;
            }
            Ok(())
        })
    });
    Ok((layout, fill))
}

/// One image's column-major channel planes (`[c][x][y]`) as rows (`[c][y][x]`).
fn to_rows(stored: &[u8], rows: &mut [u8]) {
    let plane = SIDE * SIDE;
    for (src, dst) in stored.chunks_exact(plane).zip(rows.chunks_exact_mut(plane)) {
        for x in 0..SIDE {
            for y in 0..SIDE {
                dst[y * SIDE + x] = src[x * SIDE + y];
            }
        }
    }
}

/// An archive in the official layout (see [`crate::write_synthetic_archive`]).
pub(crate) fn write_synthetic(path: &Path, counts: [usize; 3]) -> Result<()> {
    let starts = [0, counts[0], counts[0] + counts[1]];
    let mut members = vec![(format!("{DIR}/{SYNTHETIC_MEMBER}"), synthetic_note(counts))];
    members.push((
        format!("{DIR}/class_names.txt"),
        b"airplane\nbird\ncar\ncat\ndeer\ndog\nhorse\nmonkey\nship\ntruck\n".to_vec(),
    ));
    for (s, file) in IMAGES.iter().enumerate() {
        let mut bytes = Vec::with_capacity(counts[s] * IMAGE);
        for i in starts[s]..starts[s] + counts[s] {
            for c in 0..3 {
                for x in 0..SIDE {
                    for y in 0..SIDE {
                        bytes.push(crate::synthetic_pixel(i, c, y, x));
                    }
                }
            }
        }
        members.push((format!("{DIR}/{file}"), bytes));
        if let Some(labels) = LABELS.get(s) {
            let l = (starts[s]..starts[s] + counts[s]).map(|i| (i % 10) as u8 + 1);
            members.push((format!("{DIR}/{labels}"), l.collect()));
        }
    }
    crate::archive::write_tar_gz(path, &members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::tests::{
        assert_corrupt, assert_flipped_bytes_are_corrupt, assert_pixels, load_error,
    };
    use crate::{load_benchmark, write_synthetic_archive};

    #[test]
    fn column_major_planes_become_rows_in_split_order() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("stl10_binary.tar.gz");
        write_synthetic_archive("stl10", &path, [4, 3, 5])?;
        let b = load_benchmark("stl10", &path)?;
        assert_eq!(
            (b.train.clone(), b.test.clone(), b.unlabeled.clone()),
            (0..4, 4..7, 7..12)
        );
        assert_eq!(b.dataset.shape, [3, 96, 96]);
        for i in 0..12 {
            assert_pixels(&b.dataset, i, i);
        }
        // Labels 1..=10 read as 0..10; the unlabeled images' are never read (0).
        let labels: Vec<u32> = (0..7).map(|i| (i % 10) as u32).collect();
        assert_eq!(b.dataset.labels[..7], labels[..]);
        Ok(())
    }

    #[test]
    fn wrong_sizes_labels_and_members_are_clear_errors() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("stl10_binary.tar.gz");
        let error = |members: &[(String, Vec<u8>)]| {
            crate::archive::write_tar_gz(&path, members).unwrap();
            load_error("stl10", dir.path())
        };
        let member = |file: &str, bytes: Vec<u8>| (format!("{DIR}/{file}"), bytes);
        let mut members = vec![
            member("train_X.bin", vec![0; 2 * IMAGE]),
            member("train_y.bin", vec![1, 10]),
            member("test_X.bin", vec![0; IMAGE]),
            member("test_y.bin", vec![3]),
        ];
        let e = error(&members);
        assert!(
            e.contains("no member stl10_binary/unlabeled_X.bin")
                && e.contains("ssl data download stl10"),
            "{e}"
        );
        // The official members, short of the published 5,000 / 8,000 / 100,000.
        members.push(member("unlabeled_X.bin", vec![0; IMAGE]));
        let e = error(&members);
        assert!(
            e.contains(
                "stl10_binary/train_X.bin holds 2 images; the published STL-10 has 5,000 \
                 (another release, or a damaged archive); download it again with `ssl data \
                 download stl10 --dir"
            ),
            "{e}"
        );
        // From here on a synthetic archive of 2, 1 and 1 images.
        members.push(member(SYNTHETIC_MEMBER, synthetic_note([2, 1, 1])));
        members[4].1.extend([0; 5]);
        let e = error(&members);
        assert!(
            e.contains("member stl10_binary/unlabeled_X.bin: 27653 bytes, not a whole number"),
            "{e}"
        );
        members[4].1.truncate(IMAGE);
        members[1].1 = vec![1, 11];
        let e = error(&members);
        assert!(
            e.contains(
                "member stl10_binary/train_y.bin: label 1 is 11, outside the classes 1..=10"
            ),
            "{e}"
        );
        members[1].1 = vec![1];
        let e = error(&members);
        assert!(
            e.contains(
                "stl10_binary/train_y.bin holds 1 labels; this synthetic archive's \
                 stl10_binary/SYNTHETIC.txt declares 2"
            ),
            "{e}"
        );
        members[1].1 = vec![1, 2];
        members[4].1.extend(vec![0; IMAGE]);
        let e = error(&members);
        assert!(
            e.contains("stl10_binary/unlabeled_X.bin holds 2 images; this synthetic archive's"),
            "{e}"
        );
        members[4].1.truncate(IMAGE);
        crate::archive::write_tar_gz(&path, &members)?;
        assert_eq!(load_benchmark("stl10", dir.path())?.dataset.len(), 4);
        Ok(())
    }

    #[test]
    fn a_flipped_or_truncated_archive_is_called_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("stl10_binary.tar.gz");
        write_synthetic_archive("stl10", &path, [2, 1, 1])?;
        assert_flipped_bytes_are_corrupt("stl10", &path, 8);
        let bytes = std::fs::read(&path)?;
        std::fs::write(&path, &bytes[..bytes.len() * 2 / 3])?;
        let e = load_error("stl10", dir.path());
        assert_corrupt(
            &e,
            &path,
            "stl10",
            "truncated: its gzip stream ends early, after member",
        );
        Ok(())
    }
}
