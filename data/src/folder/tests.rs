use super::*;
use image::{GrayImage, ImageFormat, Luma, Rgb, RgbImage};

/// A `w × h` RGB image whose red channel is the column index, green the row index.
fn gradient(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| Rgb([x as u8, y as u8, 7]))
}

fn write(path: &Path, image: &RgbImage, format: ImageFormat) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image.save_with_format(path, format).unwrap();
}

#[test]
fn classes_and_samples_follow_torchvision_order() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let img = gradient(8, 8);
    write(&root.join("b/1.png"), &img, ImageFormat::Png);
    write(&root.join("a/x.png"), &img, ImageFormat::Png);
    write(&root.join("a/Y.JPG"), &img, ImageFormat::Jpeg);
    write(&root.join("a/sub/z.png"), &img, ImageFormat::Png);
    std::fs::write(root.join("a/notes.txt"), "not an image")?;
    std::fs::write(
        root.join("stray.png"),
        "a file beside the classes is not a class",
    )?;
    let index = scan_image_folder(root, None)?;
    assert_eq!(index.classes, ["a", "b"]);
    let names: Vec<String> = index
        .samples
        .iter()
        .map(|(p, l)| format!("{}:{l}", p.strip_prefix(root).unwrap().display()))
        .collect();
    // os.walk order: a's own files (byte order: 'Y' < 'x'), then a/sub, then b.
    assert_eq!(
        names,
        ["a/Y.JPG:0", "a/x.png:0", "a/sub/z.png:0", "b/1.png:1"]
    );
    let kept = scan_image_folder(root, Some(&["b".to_string()]))?;
    assert_eq!(
        (kept.classes.as_slice(), kept.samples[0].1),
        (&["b".to_string()][..], 0)
    );
    Ok(())
}

#[test]
fn content_is_sniffed_and_greyscale_becomes_rgb() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("c/png_named.JPEG");
    std::fs::create_dir_all(path.parent().unwrap())?;
    GrayImage::from_fn(6, 6, |x, y| Luma([(10 * x + y) as u8]))
        .save_with_format(&path, ImageFormat::Png)?;
    let rgb = decode_resized(&path, 6)?;
    assert_eq!(rgb.len(), 6 * 6 * 3);
    for (i, px) in rgb.chunks_exact(3).enumerate() {
        let (x, y) = (i % 6, i / 6);
        assert_eq!(px, [(10 * x + y) as u8; 3], "pixel ({x}, {y})");
    }
    Ok(())
}

#[test]
fn centre_crop_offsets_round_half_to_even() -> Result<()> {
    assert_eq!(
        [0, 1, 2, 3, 21, 23].map(half_rounded_even),
        [0, 0, 1, 2, 10, 12]
    );
    let dir = tempfile::tempdir()?;
    // Shorter side already 20: no resize, a crop of columns [left, left + 20).
    for (w, left) in [(40, 10), (41, 10), (43, 12)] {
        let path = dir.path().join(format!("{w}.png"));
        write(&path, &gradient(w, 20), ImageFormat::Png);
        let rgb = decode_resized(&path, 20)?;
        let first_row: Vec<u8> = rgb.chunks_exact(3).take(20).map(|p| p[0]).collect();
        let expected: Vec<u8> = (left..left + 20).map(|x| x as u8).collect();
        assert_eq!(first_row, expected, "width {w}");
    }
    // A tall image resized to a shorter side of 10 keeps its height ratio before the crop.
    let path = dir.path().join("tall.png");
    write(
        &path,
        &RgbImage::from_pixel(20, 60, Rgb([200, 100, 50])),
        ImageFormat::Png,
    );
    let rgb = decode_resized(&path, 10)?;
    assert!(rgb.chunks_exact(3).all(|p| p == [200, 100, 50]));
    Ok(())
}

#[test]
fn train_and_val_layout_decodes_both_splits() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    for (split, count) in [("train", 3), ("val", 2)] {
        for class in ["n01", "n02"] {
            for i in 0..count {
                write(
                    &root.join(format!("{split}/{class}/{i}.png")),
                    &gradient(12, 9),
                    ImageFormat::Png,
                );
            }
        }
    }
    let folder = load_image_folder(root, 8, None, None)?;
    assert_eq!(folder.train_len, Some(6));
    assert_eq!(folder.classes, ["n01", "n02"]);
    assert_eq!(folder.dataset.labels, [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]);
    assert_eq!(folder.dataset.shape, [3, 8, 8]);
    assert_eq!(folder.dataset.sample(0).len(), 3 * 8 * 8);
    Ok(())
}

#[test]
fn bad_folders_are_clear_errors() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    let err = |r: Result<ImageFolder>| format!("{:#}", r.err().expect("an error"));
    let missing = err(load_image_folder(&root.join("nope"), 8, None, None));
    assert!(
        missing.contains("does not exist") && missing.contains("data.root"),
        "{missing}"
    );
    std::fs::create_dir_all(root.join("flat"))?;
    let no_classes = err(load_image_folder(&root.join("flat"), 8, None, None));
    assert!(
        no_classes.contains("no class sub-directories"),
        "{no_classes}"
    );
    write(
        &root.join("flat/a/1.png"),
        &gradient(4, 4),
        ImageFormat::Png,
    );
    std::fs::create_dir_all(root.join("flat/empty"))?;
    let empty = err(load_image_folder(&root.join("flat"), 8, None, None));
    assert!(
        empty.contains("class `empty`") && empty.contains("no image files"),
        "{empty}"
    );
    std::fs::remove_dir(root.join("flat/empty"))?;
    std::fs::write(root.join("flat/a/broken.png"), "not a png")?;
    let broken = err(load_image_folder(&root.join("flat"), 8, None, None));
    assert!(
        broken.contains("broken.png") && broken.contains("not a readable image"),
        "{broken}"
    );
    let unknown = err(load_image_folder(
        &root.join("flat"),
        8,
        Some(&["zebra".to_string()]),
        None,
    ));
    assert!(unknown.contains("no class directory zebra"), "{unknown}");
    write(
        &root.join("split/train/a/1.png"),
        &gradient(4, 4),
        ImageFormat::Png,
    );
    write(
        &root.join("split/val/b/1.png"),
        &gradient(4, 4),
        ImageFormat::Png,
    );
    let mismatch = err(load_image_folder(&root.join("split"), 8, None, None));
    assert!(mismatch.contains("different classes"), "{mismatch}");
    Ok(())
}

#[test]
fn imagenet100_is_sorted_and_unique() {
    assert!(IMAGENET100.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(
        (IMAGENET100[0], IMAGENET100[99]),
        ("n01558993", "n13040303")
    );
}

/// Through a cache directory: the first load decodes into one file, later loads map it (the
/// same bytes as an in-memory decode), and a changed image gets a new file.
#[test]
fn a_cached_folder_is_decoded_once_and_mapped_after() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (root, cache) = (dir.path().join("images"), dir.path().join("cache"));
    for (class, count) in [("a", 3), ("b", 2)] {
        for i in 0..count {
            write(
                &root.join(format!("{class}/{i}.png")),
                &gradient(10 + i, 9),
                ImageFormat::Png,
            );
        }
    }
    let plain = load_image_folder(&root, 6, None, None)?.dataset;
    let cached = load_image_folder(&root, 6, None, Some(&cache))?.dataset;
    let files = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.sort();
        Ok(files)
    };
    let first = files(&cache)?;
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        std::fs::metadata(&first[0])?.len(),
        (5 * 6 * 6 * 3 + crate::cache::TRAILER_LEN) as u64
    );
    assert_eq!(cached.labels, plain.labels);
    for i in 0..plain.len() {
        assert_eq!(cached.sample(i), plain.sample(i));
    }
    // A later load reads the file: marking its first byte shows in the samples.
    let mut bytes = std::fs::read(&first[0])?;
    bytes[0] = 255;
    std::fs::write(&first[0], &bytes)?;
    let again = load_image_folder(&root, 6, None, Some(&cache))?.dataset;
    assert_eq!(again.sample(0)[0], 1.0);
    assert_ne!(plain.sample(0)[0], 1.0);
    // A rewritten image (new length) is a different folder.
    write(&root.join("b/1.png"), &gradient(30, 9), ImageFormat::Png);
    load_image_folder(&root, 6, None, Some(&cache))?;
    assert_eq!(files(&cache)?.len(), 2);
    // An unwritable cache is a clear error naming the fix.
    let blocked = dir.path().join("blocked");
    std::fs::write(&blocked, "a file, not a directory")?;
    let e = load_image_folder(&root, 6, None, Some(&blocked.join("sub")))
        .err()
        .expect("an error");
    assert!(format!("{e:#}").contains("SSL_CACHE"), "{e:#}");
    Ok(())
}

/// A replaced image is decoded anew whatever its modification time says: one of the same byte
/// length (BMP) dated like the original, or older; a partial cache left by a killed run goes.
#[test]
fn a_replaced_image_is_decoded_anew_whatever_its_mtime() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (root, cache) = (dir.path().join("images"), dir.path().join("cache"));
    let image = root.join("a/0.bmp");
    write(&image, &gradient(8, 8), ImageFormat::Bmp);
    write(&root.join("b/0.bmp"), &gradient(8, 8), ImageFormat::Bmp);
    let first = load_image_folder(&root, 8, None, Some(&cache))?.dataset;
    assert_eq!(first.sample(0)[0], 0.0);
    let stale = cache.join("folder-8px-0123.u8.ssl-partial-4194304-0");
    std::fs::write(&stale, b"left by a killed run")?;
    let original = std::fs::metadata(&image)?.modified()?;
    let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
    for (value, modified) in [(90, original), (180, long_ago)] {
        let before = std::fs::metadata(&image)?.len();
        write(
            &image,
            &RgbImage::from_pixel(8, 8, Rgb([value, 0, 0])),
            ImageFormat::Bmp,
        );
        assert_eq!(std::fs::metadata(&image)?.len(), before);
        std::fs::File::options()
            .write(true)
            .open(&image)?
            .set_modified(modified)?;
        let again = load_image_folder(&root, 8, None, Some(&cache))?.dataset;
        assert_eq!(again.sample(0)[0], f32::from(value) / 255.0);
    }
    assert!(!stale.exists());
    // Three contents of the folder, three caches; touching a file changes none.
    assert_eq!(std::fs::read_dir(&cache)?.count(), 3);
    std::fs::File::options()
        .write(true)
        .open(&image)?
        .set_modified(std::time::SystemTime::now())?;
    load_image_folder(&root, 8, None, Some(&cache))?;
    assert_eq!(std::fs::read_dir(&cache)?.count(), 3);
    Ok(())
}

#[test]
fn the_key_reads_both_ends_of_a_long_file() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("long.bin");
    let mut bytes = vec![0u8; 3 * KEY_SPAN];
    std::fs::write(&path, &bytes)?;
    let plain = fingerprint(&path)?;
    assert_eq!(plain.0, 3 * KEY_SPAN as u64);
    for at in [0, bytes.len() - 1] {
        bytes[at] = 1;
        std::fs::write(&path, &bytes)?;
        assert_ne!(fingerprint(&path)?, plain, "a change at byte {at}");
        bytes[at] = 0;
    }
    // The middle is not read (see `folder_cache_key`).
    bytes[KEY_SPAN + 10] = 1;
    std::fs::write(&path, &bytes)?;
    assert_eq!(fingerprint(&path)?, plain);
    let e = format!(
        "{:#}",
        fingerprint(&dir.path().join("gone.png")).unwrap_err()
    );
    assert!(e.contains("cannot read") && e.contains("gone.png"), "{e}");
    Ok(())
}

/// A `w × h` RGB image varying smoothly in both directions (JPEG keeps it nearly exact).
fn smooth(w: u32, h: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        Rgb([
            (40 + 160 * x / w) as u8,
            (30 + 180 * y / h) as u8,
            (200 - 100 * (x + y) / (w + h)) as u8,
        ])
    })
}

#[test]
fn kept_images_have_the_shorter_side_r_and_their_aspect() -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Wide and tall JPEGs: shorter side to 48, the longer `int(48 · long / short)`.
    for ((w, h), (kh, kw)) in [((120, 90), (48, 64)), ((70, 100), (68, 48))] {
        let path = dir.path().join(format!("{w}x{h}.JPEG"));
        write(&path, &smooth(w, h), ImageFormat::Jpeg);
        let (bytes, sh, sw) = decode_kept(&path, 48)?;
        assert_eq!((sh, sw), (kh, kw), "{w}×{h}");
        assert_eq!(bytes.len(), kh * kw * 3);
        let decoded = image::open(&path)?.to_rgb8();
        let direct = image::imageops::resize(&decoded, kw as u32, kh as u32, FilterType::Triangle);
        assert_eq!(bytes, direct.into_raw(), "the resize of `decode_resized`");
    }
    // Never upscaled; an image more than 4 times as long as wide is capped at 4R, kept whole.
    assert_eq!(kept_size(30, 40, 48), (30, 40));
    assert_eq!(kept_size(100, 400, 48), (48, 192));
    assert_eq!(kept_size(48, 300, 48), (30, 192));
    assert_eq!(kept_size(10, 300, 48), (6, 192));
    assert_eq!(kept_size(2000, 40, 48), (192, 3));
    assert_eq!(kept_size(5000, 1, 48), (192, 1));
    Ok(())
}

/// A stored image of the image's own size, as [`Samples::Images`] of one image read `[3, s, s]`.
fn stored(pixels: Vec<u8>, height: usize, width: usize, s: usize) -> Dataset {
    Dataset {
        name: "stored".into(),
        samples: Samples::Images {
            bytes: Arc::new(pixels),
            images: vec![ImageEntry {
                offset: 0,
                height,
                width,
            }]
            .into(),
        },
        labels: vec![0],
        shape: vec![3, s, s],
        num_classes: 1,
    }
}

/// `image` as `[3, H, W]` values `v / 255`.
fn planes(image: &RgbImage) -> Vec<f32> {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let mut out = vec![0f32; 3 * h * w];
    for (x, y, p) in image.enumerate_pixels() {
        for c in 0..3 {
            out[c * h * w + y as usize * w + x as usize] = f32::from(p[c]) / 255.0;
        }
    }
    out
}

#[test]
fn a_crop_of_the_stored_image_is_the_resize_of_that_region() -> Result<()> {
    use crate::crop::resized_image_crop;
    use crate::resample::{resized_crop, Interpolation};
    use crate::stored::CropBox;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("wide.JPEG");
    write(&path, &smooth(120, 90), ImageFormat::Jpeg);
    let (bytes, h, w) = decode_kept(&path, 48)?;
    let data = stored(bytes, h, w, 32);
    let image = data.image(0).expect("a stored image");
    // Decoded and resized directly, read as floats, resampled by the S × S path's function.
    let decoded = image::open(&path)?.to_rgb8();
    let direct = planes(&image::imageops::resize(
        &decoded,
        w as u32,
        h as u32,
        FilterType::Triangle,
    ));
    let whole = CropBox {
        top: 0,
        left: 0,
        height: h,
        width: w,
    };
    let corner = CropBox {
        top: 5,
        left: 17,
        height: 30,
        width: 41,
    };
    for crop in [whole, corner] {
        for interpolation in [Interpolation::Bilinear, Interpolation::Bicubic] {
            let mut ours = vec![0f32; 3 * 32 * 32];
            resized_image_crop(image, crop, 32, interpolation, &mut ours);
            let mut want = vec![0f32; 3 * 32 * 32];
            resized_crop(&direct, h, w, crop, 32, 32, interpolation, &mut want);
            assert_eq!(ours, want, "{crop:?} {interpolation:?}");
        }
    }
    Ok(())
}

/// Views of a 96 × 48 image whose left and right 16 columns are red, centre green: the
/// `S × S` copy has thrown the red away, the kept image still shows it in many crops.
#[test]
fn crops_of_kept_images_reach_the_margins_the_centre_crop_discards() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("images");
    let image = RgbImage::from_fn(96, 48, |x, _| match x {
        16..80 => Rgb([0, 200, 0]),
        _ => Rgb([220, 0, 0]),
    });
    for class in ["a", "b"] {
        write(
            &root.join(format!("{class}/0.png")),
            &image,
            ImageFormat::Png,
        );
    }
    // torchvision's defaults: RandomResizedCrop(scale (0.08, 1)) and a flip.
    let aug = crate::ImageAugment::default();
    let red_views = |keep_side: usize| -> Result<usize> {
        let data = Arc::new(load_image_folder_kept(&root, 32, keep_side, None, None)?.dataset);
        let types = crate::Pipeline {
            views: vec![aug.clone()],
            local: None,
        }
        .view_types(&data.shape)?;
        let loader = crate::ViewLoader::new(data, vec![0, 1], 2, 4, false, 7, types.views)?;
        let mut red = 0;
        for epoch in 0..50 {
            for batch in loader.epoch(epoch) {
                let n = 32 * 32;
                for view in batch.views.chunks_exact(3 * n) {
                    let reddish = (0..n).any(|p| view[p] > 0.5 && view[n + p] < 0.3);
                    red += usize::from(reddish);
                }
            }
        }
        Ok(red)
    };
    assert_eq!(red_views(0)?, 0, "the S × S copy holds no red");
    let kept = red_views(48)?;
    // Of the 400 views, about half reach into a margin (216 with these seeds).
    assert!(kept > 100, "{kept} of 400 views show a margin");
    Ok(())
}

#[test]
fn the_evaluation_view_is_the_square_decode() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("images");
    for (class, (w, h)) in [("a", (120, 90)), ("b", (70, 100)), ("c", (64, 64))] {
        write(
            &root.join(format!("{class}/0.JPEG")),
            &smooth(w, h),
            ImageFormat::Jpeg,
        );
    }
    let square = load_image_folder(&root, 32, None, None)?.dataset;
    // Kept at the view's own side: the same resize, so the same pixels.
    let same = load_image_folder_kept(&root, 32, 32, None, None)?.dataset;
    // Kept larger: resized twice (to 48, then to 32), within a grey level once rounded to 8 bits.
    let larger = load_image_folder_kept(&root, 32, 48, None, None)?.dataset;
    for i in 0..square.len() {
        assert_eq!(same.sample(i), square.sample(i), "image {i}");
        // In grey levels: the view rounded to 8 bits against the stored 8-bit pixels.
        let worst = larger
            .sample(i)
            .iter()
            .zip(square.sample(i).iter())
            .map(|(a, b)| ((a * 255.0).round() - b * 255.0).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1.0 + 1e-3, "image {i}: {worst} grey levels apart");
    }
    Ok(())
}

/// The kept cache: written once and mapped after (its file untouched), a new file for a changed
/// image, and a truncated or corrupted file decoded anew rather than read.
#[test]
fn a_kept_cache_is_reused_renewed_and_never_read_damaged() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (root, cache) = (dir.path().join("images"), dir.path().join("cache"));
    for (class, w) in [("a", 60), ("b", 50)] {
        write(
            &root.join(format!("{class}/0.png")),
            &gradient(w, 40),
            ImageFormat::Png,
        );
    }
    let load = || load_image_folder_kept(&root, 16, 32, None, Some(&cache));
    let plain = load_image_folder_kept(&root, 16, 32, None, None)?.dataset;
    let first = load()?.dataset;
    let files = crate::cache::tests::names(&cache)?;
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("folder-keep32px-"), "{files:?}");
    let path = cache.join(&files[0]);
    // 48 × 32 and 40 × 32 RGB, the table, the count and the trailer.
    let len = (48 + 40) * 32 * 3 + 2 * 8 + 8 + crate::cache::TRAILER_LEN;
    assert_eq!(std::fs::metadata(&path)?.len(), len as u64);
    let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
    std::fs::File::options()
        .write(true)
        .open(&path)?
        .set_modified(long_ago)?;
    let again = load()?.dataset;
    assert_eq!(
        std::fs::metadata(&path)?.modified()?,
        long_ago,
        "not rewritten"
    );
    for i in 0..2 {
        assert_eq!(first.sample(i), plain.sample(i));
        assert_eq!(again.sample(i), plain.sample(i));
        let (a, b) = (again.image(i).unwrap(), plain.image(i).unwrap());
        assert_eq!((a.pixels, a.height, a.width), (b.pixels, b.height, b.width));
    }
    // Truncated (its trailer gone), or a table that no longer adds up under an intact trailer:
    // decoded anew, to the same images.
    let bytes = std::fs::read(&path)?;
    let table = len - crate::cache::TRAILER_LEN - 8 - 2 * 8;
    let mut corrupt = bytes.clone();
    corrupt[table] ^= 0x40;
    for damaged in [bytes[..bytes.len() / 2].to_vec(), corrupt] {
        std::fs::write(&path, &damaged)?;
        let renewed = load()?.dataset;
        assert_eq!(std::fs::read(&path)?, bytes);
        for i in 0..2 {
            assert_eq!(renewed.sample(i), plain.sample(i));
        }
    }
    // A changed image is another folder: another file.
    write(&root.join("b/0.png"), &gradient(70, 40), ImageFormat::Png);
    let changed = load()?.dataset;
    assert_eq!(crate::cache::tests::names(&cache)?.len(), 2);
    assert_eq!(changed.image(1).map(|i| i.width), Some(56));
    Ok(())
}

#[test]
fn a_kept_side_below_the_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("a/0.png"),
        &gradient(8, 8),
        ImageFormat::Png,
    );
    let e = load_image_folder_kept(dir.path(), 16, 8, None, None).err();
    let e = format!("{:#}", e.expect("an error"));
    assert!(
        e.contains("data.keep_side") && e.contains("data.size"),
        "{e}"
    );
}
