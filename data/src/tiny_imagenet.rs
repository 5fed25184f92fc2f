//! Tiny ImageNet (Le & Yang, CS231n, 2015) from the official `tiny-imagenet-200.zip`.
//!
//! `tiny-imagenet-200/wnids.txt` lists the 200 classes (WordNet ids); the train split is
//! `train/<wnid>/images/*.JPEG` (500 per class), the labelled evaluation split is
//! `val/images/*.JPEG` with `val/val_annotations.txt` (`file<TAB>wnid<TAB>box…` per line; 10,000
//! images), which serves as the test split, as in every paper using the set (`test/` has no
//! labels and is not read). Class indices follow the sorted wnids (torchvision's `ImageFolder`
//! order over `train/`); train images are in sorted path order, val images in the order of
//! `val_annotations.txt`. Every image is a 64×64 JPEG (some greyscale, replicated to RGB); one of
//! another size is an error naming it. Images are decoded in parallel, a chunk at a time, and
//! every member is checked against its CRC-32 as it is read.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use rayon::prelude::*;

use crate::archive::{synthetic_note, Corrupt, Expected, Fill, Layout, SYNTHETIC_MEMBER};

const SIDE: usize = 64;
const ROOT: &str = "tiny-imagenet-200";
/// Images decoded per chunk.
const CHUNK: usize = 1024;

type Zip = zip::ZipArchive<BufReader<File>>;

/// The member `name` of `zip`, read whole and checked against its CRC-32.
fn read(zip: &mut Zip, name: &str) -> Result<Vec<u8>> {
    let mut file = zip.by_name(name).with_context(|| {
        format!("the archive has no member {name} (another or a damaged archive)")
    })?;
    let mut bytes = Vec::with_capacity(file.size() as usize);
    file.read_to_end(&mut bytes)
        .map_err(|e| Corrupt(format!("member {name} does not read back intact: {e}")))?;
    Ok(bytes)
}

fn text(zip: &mut Zip, name: &str) -> Result<String> {
    String::from_utf8(read(zip, name)?).with_context(|| format!("member {name} is not text"))
}

/// Train images of class `c` under the table's `train` images: the first classes take
/// `⌈train / 200⌉` each (500, the published count, for all of them) until the images run out.
fn train_of_class(c: usize, train: usize) -> usize {
    let per = train.div_ceil(200).max(1);
    train.saturating_sub(c * per).min(per)
}

/// Val images of class `c` under the table's `val` images, dealt round the classes (50 each,
/// the published count, of 10,000).
fn val_of_class(c: usize, val: usize) -> usize {
    val / 200 + usize::from(c < val % 200)
}

/// Lists the images of the archive at `path` and their labels, checks them against the table
/// (see [`Expected`]: the published 500 train images of each of the 200 classes, 50 val images
/// of each in `val_annotations.txt`, every one present), and returns its layout and what decodes
/// them into the cache (where each image is checked to be 64×64).
pub(crate) fn decode(path: &Path, info: &'static crate::ArchiveInfo) -> Result<(Layout, Fill)> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| {
        Corrupt(format!(
            "not a readable ZIP archive: {e}; truncated, or another file"
        ))
    })?;
    let synthetic_member = format!("{ROOT}/{SYNTHETIC_MEMBER}");
    let synthetic = match zip.index_for_name(&synthetic_member) {
        Some(_) => Some(read(&mut zip, &synthetic_member)?),
        None => None,
    };
    let expected = Expected::new(
        info,
        synthetic.as_deref().map(|b| (synthetic_member.as_str(), b)),
    )?;
    let mut wnids: Vec<String> = text(&mut zip, &format!("{ROOT}/wnids.txt"))?
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    wnids.sort();
    wnids.dedup();
    ensure!(
        wnids.len() == info.classes,
        "{ROOT}/wnids.txt lists {} classes, not {}",
        wnids.len(),
        info.classes
    );
    let class = |wnid: &str| wnids.binary_search_by(|w| w.as_str().cmp(wnid)).ok();
    let mut train: Vec<(String, u8)> = Vec::new();
    let names = zip
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<std::result::Result<Vec<String>, _>>()
        .map_err(|e| Corrupt(format!("its central directory is damaged: {e}")))?;
    for name in &names {
        let Some(rest) = name.strip_prefix(&format!("{ROOT}/train/")) else {
            continue;
        };
        let Some((wnid, file)) = rest.split_once("/images/") else {
            continue;
        };
        if file.is_empty() || file.contains('/') {
            continue;
        }
        let c = class(wnid).with_context(|| {
            format!("{name} is under class {wnid}, which wnids.txt does not list")
        })?;
        train.push((name.clone(), c as u8));
    }
    train.sort();
    let annotations = format!("{ROOT}/val/val_annotations.txt");
    let mut val: Vec<(String, u8)> = Vec::new();
    for (n, line) in text(&mut zip, &annotations)?.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split('\t');
        let (Some(file), Some(wnid)) = (fields.next(), fields.next()) else {
            bail!("{annotations} line {}: not `file<TAB>wnid<TAB>…`", n + 1);
        };
        let c = class(wnid).with_context(|| {
            format!(
                "{annotations} line {}: class {wnid} is not in wnids.txt",
                n + 1
            )
        })?;
        val.push((format!("{ROOT}/val/images/{file}"), c as u8));
    }
    let mut per_class = vec![0usize; wnids.len()];
    for (_, c) in &train {
        per_class[usize::from(*c)] += 1;
    }
    for (c, wnid) in wnids.iter().enumerate() {
        let member = format!("{ROOT}/train/{wnid}/images");
        let want = train_of_class(c, expected.splits[0]);
        expected.check(&member, per_class[c], want, "images")?;
    }
    per_class.fill(0);
    for (_, c) in &val {
        per_class[usize::from(*c)] += 1;
    }
    for (c, wnid) in wnids.iter().enumerate() {
        let what = format!("images of class {wnid}");
        let want = val_of_class(c, expected.splits[1]);
        expected.check(&annotations, per_class[c], want, &what)?;
    }
    let present: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    if let Some((name, _)) = val
        .iter()
        .find(|(name, _)| !present.contains(name.as_str()))
    {
        bail!("the archive has no member {name}, which {annotations} lists");
    }
    let layout = Layout {
        counts: [train.len(), val.len(), 0],
        side: SIDE,
        label_columns: 1,
    };
    let fill: Fill = Box::new(move |layout, out| {
        let all: Vec<(String, u8)> = train.into_iter().chain(val).collect();
        let labels: Vec<u8> = all.iter().map(|(_, l)| *l).collect();
        out.write_at(layout.labels_at(0), &labels)?;
        for (c, chunk) in all.chunks(CHUNK).enumerate() {
            let files = chunk
                .iter()
                .map(|(name, _)| read(&mut zip, name))
                .collect::<Result<Vec<_>>>()?;
            let images = files
                .par_iter()
                .zip(chunk)
                .map(|(bytes, (name, _))| {
                    to_planes(bytes).with_context(|| format!("member {name}"))
                })
                .collect::<Result<Vec<_>>>()?;
            out.write_at(layout.image_at(c * CHUNK), &images.concat())?;
        }
        Ok(())
    });
    Ok((layout, fill))
}

/// A 64×64 image file as RGB planes `[3, 64, 64]`.
fn to_planes(bytes: &[u8]) -> Result<Vec<u8>> {
    let image = image::load_from_memory(bytes)
        .context("not a readable image (a damaged archive)")?
        .to_rgb8();
    ensure!(
        image.dimensions() == (SIDE as u32, SIDE as u32),
        "a {}×{} image, not {SIDE}×{SIDE}",
        image.width(),
        image.height()
    );
    let plane = SIDE * SIDE;
    let mut out = vec![0u8; 3 * plane];
    for (p, rgb) in image.as_raw().chunks_exact(3).enumerate() {
        for c in 0..3 {
            out[c * plane + p] = rgb[c];
        }
    }
    Ok(out)
}

/// An archive in the official layout (see [`crate::write_synthetic_archive`]): 200 classes
/// `n00000000` … `n00000199`, JPEG images at quality 100; train image `i` in class
/// `i / ⌈train / 200⌉` (fewer than ten per class keep file and image order alike), val image `i`
/// in class `i mod 200`, and a greyscale JPEG as the last val image (the official set has some).
pub(crate) fn write_synthetic(path: &Path, counts: [usize; 3]) -> Result<()> {
    use std::io::Write;
    let partial = crate::cache::Partial::create(path, "choose a writable directory")?;
    let mut zip = zip::ZipWriter::new(partial.file());
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    let wnid = |c: usize| format!("n{c:08}");
    let jpeg = |i: usize, grey: bool| -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 100);
        match grey {
            true => {
                let pixels: Vec<u8> = (0..SIDE * SIDE)
                    .map(|p| crate::synthetic_pixel(i, 0, p / SIDE, p % SIDE))
                    .collect();
                encoder.encode(&pixels, SIDE as u32, SIDE as u32, image::ColorType::L8)?;
            }
            false => {
                let pixels: Vec<u8> = (0..SIDE * SIDE * 3)
                    .map(|v| crate::synthetic_pixel(i, v % 3, v / 3 / SIDE, v / 3 % SIDE))
                    .collect();
                encoder.encode(&pixels, SIDE as u32, SIDE as u32, image::ColorType::Rgb8)?;
            }
        }
        Ok(out)
    };
    let mut put = |name: String, bytes: &[u8]| -> Result<()> {
        zip.start_file(name, options)?;
        zip.write_all(bytes)?;
        Ok(())
    };
    put(
        format!("{ROOT}/{SYNTHETIC_MEMBER}"),
        &synthetic_note(counts),
    )?;
    let wnids: String = (0..200).map(|c| wnid(c) + "\n").collect();
    put(format!("{ROOT}/wnids.txt"), wnids.as_bytes())?;
    // Class-major: class c's k-th image is image c·per + k of the sorted train split (as
    // `train_of_class` counts them).
    let per = counts[0].div_ceil(200).max(1);
    for i in 0..counts[0] {
        let (c, k) = (i / per, i % per);
        let name = format!("{ROOT}/train/{w}/images/{w}_{k}.JPEG", w = wnid(c));
        put(name, &jpeg(i, false)?)?;
    }
    let mut annotations = String::new();
    for k in 0..counts[1] {
        let i = counts[0] + k;
        annotations += &format!("val_{k}.JPEG\t{}\t0\t0\t63\t63\n", wnid(i % 200));
        let grey = k + 1 == counts[1];
        put(format!("{ROOT}/val/images/val_{k}.JPEG"), &jpeg(i, grey)?)?;
    }
    put(
        format!("{ROOT}/val/val_annotations.txt"),
        annotations.as_bytes(),
    )?;
    zip.finish()?;
    partial.persist()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::tests::{assert_corrupt, load_error};
    use crate::{load_benchmark, synthetic_pixel, write_synthetic_archive};

    #[test]
    fn train_and_val_images_decode_to_planes_with_their_classes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tiny-imagenet-200.zip");
        write_synthetic_archive("tiny-imagenet", &path, [200, 3, 0])?;
        let b = load_benchmark("tiny-imagenet", dir.path())?;
        let d = &b.dataset;
        assert_eq!(
            (b.train.clone(), b.test.clone(), d.num_classes),
            (0..200, 200..203, 200)
        );
        assert_eq!(d.shape, [3, 64, 64]);
        assert_eq!(d.labels[..3], [0, 1, 2]);
        assert_eq!(d.labels[199..], [199, 0, 1, 2]);
        // JPEG at quality 100: within a few levels of the written pixels.
        for i in [0, 5, 201] {
            let sample = d.sample(i);
            for (c, y, x) in [(0, 1, 1), (1, 2, 5), (2, 6, 3)] {
                let want = f32::from(synthetic_pixel(i, c, y, x)) / 255.0;
                let got = sample[(c * 64 + y) * 64 + x];
                assert!(
                    (got - want).abs() <= 6.0 / 255.0,
                    "{i} {c} {y} {x}: {got} vs {want}"
                );
            }
        }
        // The greyscale val image is replicated to RGB.
        let grey = d.sample(202);
        assert_eq!(grey[64 * 64 + 70], grey[70]);
        Ok(())
    }

    /// Rewrites the zip at `path` without its members `drop`, with `add` appended (stored).
    fn rewrite(path: &Path, drop: &[&str], add: &[(String, Vec<u8>)]) -> Result<()> {
        use std::io::Write;
        let mut from = zip::ZipArchive::new(File::open(path)?)?;
        let copy = path.with_extension("copy");
        let mut to = zip::ZipWriter::new(File::create(&copy)?);
        for i in 0..from.len() {
            let file = from.by_index_raw(i)?;
            if !drop.contains(&file.name()?.as_ref()) {
                to.raw_copy_file(file)?;
            }
        }
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, bytes) in add {
            to.start_file(name.as_str(), options)?;
            to.write_all(bytes)?;
        }
        to.finish()?;
        std::fs::rename(copy, path)?;
        Ok(())
    }

    const NOTE: &str = "tiny-imagenet-200/SYNTHETIC.txt";

    #[test]
    fn images_per_class_are_checked_against_the_published_or_declared_table() -> Result<()> {
        assert_eq!(
            (0..200)
                .map(|c| (train_of_class(c, 100_000), val_of_class(c, 10_000)))
                .min(),
            Some((500, 50))
        );
        assert_eq!(
            (0..200)
                .map(|c| (train_of_class(c, 100_000), val_of_class(c, 10_000)))
                .max(),
            Some((500, 50))
        );
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tiny-imagenet-200.zip");
        write_synthetic_archive("tiny-imagenet", &path, [200, 2, 0])?;
        let bytes = std::fs::read(&path)?;
        // The official layout, one train image per class: short of the published 500.
        rewrite(&path, &[NOTE], &[])?;
        let e = load_error("tiny-imagenet", dir.path());
        assert!(
            e.contains(
                "tiny-imagenet-200/train/n00000000/images holds 1 images; the published Tiny \
                 ImageNet has 500 (another release, or a damaged archive); download it again \
                 with `ssl data download tiny-imagenet --dir"
            ),
            "{e}"
        );
        // A synthetic archive is held to the table it declares.
        for (declared, needle) in [
            (
                "splits: 400 2 0",
                "tiny-imagenet-200/train/n00000000/images holds 1 images; this synthetic \
                 archive's tiny-imagenet-200/SYNTHETIC.txt declares 2",
            ),
            (
                "splits: 200 3 0",
                "tiny-imagenet-200/val/val_annotations.txt holds 0 images of class n00000002; \
                 this synthetic archive's tiny-imagenet-200/SYNTHETIC.txt declares 1",
            ),
        ] {
            std::fs::write(&path, &bytes)?;
            rewrite(&path, &[NOTE], &[(NOTE.into(), declared.into())])?;
            let e = load_error("tiny-imagenet", dir.path());
            assert!(e.contains(needle), "{e}");
        }
        // A val image its annotations list, missing.
        std::fs::write(&path, &bytes)?;
        rewrite(&path, &["tiny-imagenet-200/val/images/val_1.JPEG"], &[])?;
        let e = load_error("tiny-imagenet", dir.path());
        assert!(
            e.contains(
                "the archive has no member tiny-imagenet-200/val/images/val_1.JPEG, which \
                 tiny-imagenet-200/val/val_annotations.txt lists"
            ),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn an_image_of_another_size_or_an_unknown_class_names_the_member() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tiny-imagenet-200.zip");
        write_synthetic_archive("tiny-imagenet", &path, [200, 2, 0])?;
        let bytes = std::fs::read(&path)?;
        let member = "tiny-imagenet-200/train/n00000007/images/n00000007_0.JPEG";
        let mut small = Vec::new();
        image::codecs::jpeg::JpegEncoder::new(&mut small).encode(
            &[128; 32 * 32 * 3],
            32,
            32,
            image::ColorType::Rgb8,
        )?;
        rewrite(&path, &[member], &[(member.into(), small)])?;
        let e = load_error("tiny-imagenet", dir.path());
        assert!(
            e.contains(&format!("member {member}: a 32×32 image, not 64×64")),
            "{e}"
        );
        std::fs::write(&path, &bytes)?;
        let annotations = "tiny-imagenet-200/val/val_annotations.txt";
        let lines = "val_0.JPEG\tn00000000\t0\t0\t63\t63\nval_1.JPEG\tn09999999\t0\t0\t63\t63\n";
        rewrite(&path, &[annotations], &[(annotations.into(), lines.into())])?;
        let e = load_error("tiny-imagenet", dir.path());
        assert!(
            e.contains(&format!(
                "{annotations} line 2: class n09999999 is not in wnids.txt"
            )),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn a_flipped_byte_or_a_truncated_zip_is_called_corrupt() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("tiny-imagenet-200.zip");
        write_synthetic_archive("tiny-imagenet", &path, [200, 2, 0])?;
        let bytes = std::fs::read(&path)?;
        for member in [
            "tiny-imagenet-200/wnids.txt",
            "tiny-imagenet-200/train/n00000003/images/n00000003_0.JPEG",
            "tiny-imagenet-200/val/images/val_1.JPEG",
        ] {
            let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes))?;
            let at = zip.by_name(member)?.data_start().unwrap() as usize + 5;
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            std::fs::write(&path, &flipped)?;
            let e = load_error("tiny-imagenet", dir.path());
            let why = format!("member {member} does not read back intact: Invalid checksum");
            assert_corrupt(&e, &path, "tiny-imagenet", &why);
        }
        std::fs::write(&path, &bytes[..bytes.len() - 100])?;
        let e = load_error("tiny-imagenet", dir.path());
        assert_corrupt(&e, &path, "tiny-imagenet", "not a readable ZIP archive");
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 1);
        Ok(())
    }
}
