//! The MedMNIST table against the spec, and `.npz` files read, checked and refused.

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
