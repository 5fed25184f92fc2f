//! Caltech-256 (Griffin, Holub & Perona, Caltech CNS-TR-2007-001) from the official
//! `256_ObjectCategories.tar` (`docs/spec/data.md` §2.5), read as an image folder.
//!
//! The archive (a plain, uncompressed tar of 1.2 GB) holds
//! `256_ObjectCategories/NNN.name/NNN_KKKK.jpg`: 256 object categories `001.ak47` … `256.toad` and
//! the background category `257.clutter`, 30,607 images of varying sizes in all, and two leftovers
//! that hold no image: a file `198.spider/RENAME2` and an empty directory
//! `056.dog/greg/vision309/`.
//!
//! * [`extract`] unpacks it beside itself into a temporary directory, checks that the 256 numbered
//!   categories arrived, and only then renames it to `256_ObjectCategories`, so that a name the
//!   loader reads never holds a half-extracted tree. Members must lie under
//!   `256_ObjectCategories/` as plain files or directories: an absolute path, a `..` component, a
//!   link or a device is refused, naming the member, before anything is written for it.
//! * [`load`] reads the extracted directory through [`crate::folder`] (torchvision `ImageFolder`
//!   order, decoding and cache): the classes are the 256 numbered categories, so class index =
//!   sorted order = folder number − 1; `257.clutter` is left out unless asked for (then index
//!   256), as SAG-VICReg's halves (categories 1–128 and 129–256) leave it out (spec §2.5,
//!   **\[assumption\]**). The set has no official split: the caller draws one.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use tar::EntryType;

use crate::folder::{decode_folder, decode_folder_kept, scan_image_folder, ImageFolder};

/// The name `--data` and `ssl data download` take.
pub const NAME: &str = "caltech256";
/// The official archive's file name.
pub const ARCHIVE: &str = "256_ObjectCategories.tar";
/// Its official address (Caltech's data repository, record `nyy15-4j048`).
pub const URL: &str =
    "https://data.caltech.edu/records/nyy15-4j048/files/256_ObjectCategories.tar?download=1";
/// Its published MD5 (Caltech's record and torchvision's `Caltech256`).
pub const MD5: &str = "67b4f42ca05d46448c6bb8ecd2220f6d";
/// The directory the archive holds, and that [`extract`] leaves beside it.
pub const DIR: &str = "256_ObjectCategories";
/// The numbered object categories (`257.clutter` is not one of them).
pub const CATEGORIES: usize = 256;

/// The category names after their `NNN.` prefix, in folder-number order; the last is `clutter`.
const NAMES: &str = "ak47 american-flag backpack baseball-bat baseball-glove basketball-hoop bat \
    bathtub bear beer-mug billiards binoculars birdbath blimp bonsai-101 boom-box bowling-ball \
    bowling-pin boxing-glove brain-101 breadmaker buddha-101 bulldozer butterfly cactus cake \
    calculator camel cannon canoe car-tire cartman cd centipede cereal-box chandelier-101 \
    chess-board chimp chopsticks cockroach coffee-mug coffin coin comet computer-keyboard \
    computer-monitor computer-mouse conch cormorant covered-wagon cowboy-hat crab-101 desk-globe \
    diamond-ring dice dog dolphin-101 doorknob drinking-straw duck dumb-bell eiffel-tower \
    electric-guitar-101 elephant-101 elk ewer-101 eyeglasses fern fighter-jet fire-extinguisher \
    fire-hydrant fire-truck fireworks flashlight floppy-disk football-helmet french-horn \
    fried-egg frisbee frog frying-pan galaxy gas-pump giraffe goat golden-gate-bridge goldfish \
    golf-ball goose gorilla grand-piano-101 grapes grasshopper guitar-pick hamburger hammock \
    harmonica harp harpsichord hawksbill-101 head-phones helicopter-101 hibiscus homer-simpson \
    horse horseshoe-crab hot-air-balloon hot-dog hot-tub hourglass house-fly human-skeleton \
    hummingbird ibis-101 ice-cream-cone iguana ipod iris jesus-christ joy-stick kangaroo-101 \
    kayak ketch-101 killer-whale knife ladder laptop-101 lathe leopards-101 license-plate \
    lightbulb light-house lightning llama-101 mailbox mandolin mars mattress megaphone \
    menorah-101 microscope microwave minaret minotaur motorbikes-101 mountain-bike mushroom \
    mussels necktie octopus ostrich owl palm-pilot palm-tree paperclip paper-shredder pci-card \
    penguin people pez-dispenser photocopier picnic-table playing-card porcupine pram \
    praying-mantis pyramid raccoon radio-telescope rainbow refrigerator revolver-101 rifle \
    rotary-phone roulette-wheel saddle saturn school-bus scorpion-101 screwdriver segway \
    self-propelled-lawn-mower sextant sheet-music skateboard skunk skyscraper smokestack snail \
    snake sneaker snowmobile soccer-ball socks soda-can spaghetti speed-boat spider spoon \
    stained-glass starfish-101 steering-wheel stirrups sunflower-101 superman sushi swan \
    swiss-army-knife sword syringe tambourine teapot teddy-bear teepee telephone-box tennis-ball \
    tennis-court tennis-racket theodolite toaster tomato tombstone top-hat touring-bike \
    tower-pisa traffic-light treadmill triceratops tricycle trilobite-101 tripod t-shirt \
    tuning-fork tweezer umbrella-101 unicorn vcr video-projector washing-machine watch-101 \
    waterfall watermelon welding-mask wheelbarrow windmill wine-bottle xylophone yarmulke yo-yo \
    zebra airplanes-101 car-side-101 faces-easy-101 greyhound tennis-shoes toad clutter";

/// The category directories in class order: `001.ak47` … `256.toad`, then `257.clutter` when
/// `clutter`.
pub fn categories(clutter: bool) -> Vec<String> {
    NAMES
        .split_whitespace()
        .enumerate()
        .map(|(i, name)| format!("{:03}.{name}", i + 1))
        .take(CATEGORIES + usize::from(clutter))
        .collect()
}

/// What to do when no extracted set is found at `root`.
fn fetch_hint(root: &Path) -> String {
    let dir = match root.file_name() {
        Some(name) if name == DIR => root.parent().unwrap_or(Path::new(".")),
        _ => root,
    };
    format!(
        "run `ssl data download caltech256 --dir {}` (it fetches {ARCHIVE}, MD5 {MD5}, and \
         extracts it there), or point data.root (--root) at an extracted {DIR} or the directory \
         holding it",
        dir.display()
    )
}

/// Sorted names of the directories in `dir` (symlinks followed).
fn subdirectories(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        if fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// The names in `wanted` that are not directories in `dir`.
fn missing_categories(dir: &Path, wanted: &[String]) -> Result<Vec<String>> {
    let present = subdirectories(dir)?;
    Ok(wanted
        .iter()
        .filter(|c| present.binary_search(c).is_err())
        .cloned()
        .collect())
}

/// `names` as a short list: the first six, then how many more.
fn listed(names: &[String]) -> String {
    let mut list = names.iter().take(6).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 6 {
        list.push_str(&format!(" and {} more", names.len() - 6));
    }
    list
}

/// The extracted set under `root`: `root/256_ObjectCategories` when that is a directory, else
/// `root` itself; it must hold the 256 numbered categories (and `257.clutter` when `clutter`).
fn locate(root: &Path, clutter: bool) -> Result<PathBuf> {
    let nested = root.join(DIR);
    let dir = match nested.is_dir() {
        true => nested,
        false => root.to_path_buf(),
    };
    ensure!(
        dir.is_dir(),
        "Caltech-256 not found: {} does not exist; {}",
        root.display(),
        fetch_hint(root)
    );
    let wanted = categories(clutter);
    let missing = missing_categories(&dir, &wanted)?;
    if missing.len() >= CATEGORIES {
        bail!(
            "Caltech-256 not found: {} holds neither {DIR}/ nor its category directories \
             (001.ak47 … 256.toad); {}",
            root.display(),
            fetch_hint(root)
        );
    }
    ensure!(
        missing.is_empty(),
        "{} is not a whole extracted {DIR}: it lacks {} of the category directories Caltech-256 \
         has ({}); remove it and extract the archive again with `ssl data download caltech256 \
         --dir {}`",
        dir.display(),
        missing.len(),
        listed(&missing),
        dir.parent().unwrap_or(Path::new(".")).display()
    );
    Ok(dir)
}

/// Caltech-256 at `root` (`root/256_ObjectCategories`, or `root` itself) as `[3, size, size]`
/// images (shorter side resized to `size`, centre-cropped; [`crate::folder`]'s conventions and
/// cache in `cache`), or with `keep_side > 0` each image kept whole at that shorter side for
/// crops from the whole picture ([`decode_folder_kept`]): the 256 numbered categories, labels
/// 0–255 = folder number − 1, and `257.clutter` as label 256 when `clutter`.
/// [`ImageFolder::train_len`] is `None`: Caltech-256 has no official split. A missing or
/// partial directory is an error naming the fix.
pub fn load(
    root: &Path,
    size: usize,
    keep_side: usize,
    clutter: bool,
    cache: Option<&Path>,
) -> Result<ImageFolder> {
    let dir = locate(root, clutter)?;
    let index = scan_image_folder(&dir, Some(&categories(clutter)))?;
    let dataset = match keep_side {
        0 => decode_folder(&index, size, NAME, cache)?,
        side => decode_folder_kept(&index, size, side, NAME, cache)?,
    };
    Ok(ImageFolder {
        dataset,
        classes: index.classes,
        train_len: None,
    })
}

/// What a temporary extraction directory's name starts with, beside the final [`DIR`].
const PARTIAL_PREFIX: &str = "256_ObjectCategories.ssl-partial-";
/// The file in a temporary extraction directory whose lock its extractor holds.
const LOCK: &str = "extracting.lock";

/// Removes the temporary extraction directories in `dir` that no extractor holds (left by a run
/// that was killed); best effort, as one that cannot be removed now can be on a later run.
fn remove_stale_extractions(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(PARTIAL_PREFIX)
        {
            continue;
        }
        // The lock is held while removing, so an extractor cannot take the directory meanwhile.
        if let Ok(lock) = File::open(entry.path().join(LOCK)) {
            if lock.try_lock().is_ok() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// `name` (a member's path) relative to the extraction directory: its normal components,
/// the first of which must be [`DIR`].
fn member_path(name: &Path) -> Result<PathBuf> {
    let mut path = PathBuf::new();
    for component in name.components() {
        match component {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            _ => bail!(
                "member {} has an absolute path or a `..` component, which would write outside \
                 the extraction directory; refusing to extract it",
                name.display()
            ),
        }
    }
    ensure!(
        path.starts_with(DIR),
        "member {} is not under {DIR}/ (not Caltech-256's archive); refusing to extract it",
        name.display()
    );
    Ok(path)
}

/// Unpacks every member of the tar at `archive` under `into` (see [`member_path`]); a member
/// that is neither a file nor a directory, a member cut short and an archive that ends without
/// its end-of-archive blocks are errors that end with `fix`, unlike those of writing.
fn unpack(archive: &Path, into: &Path, fix: &str) -> Result<()> {
    let file = File::open(archive).with_context(|| format!("cannot read {}", archive.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("cannot read {}", archive.display()))?
        .len();
    let mut tar = tar::Archive::new(Counted {
        inner: BufReader::with_capacity(1 << 20, file),
        bytes: 0,
    });
    let damaged =
        |at: &str, e: io::Error| anyhow!("the archive is damaged or truncated ({at}: {e}); {fix}");
    let mut last = String::from("at its start");
    for entry in tar.entries().map_err(|e| damaged(&last, e))? {
        let mut entry = entry.map_err(|e| damaged(&format!("after {last}"), e))?;
        let name = entry.path().map_err(|e| damaged(&last, e))?.into_owned();
        let path = into.join(member_path(&name).map_err(|e| anyhow!("{e}; {fix}"))?);
        let kind = entry.header().entry_type();
        let written = || {
            format!(
                "cannot write {} (disk full? The set takes 1.2 GB; choose another --dir)",
                path.display()
            )
        };
        // Old (v7) tars mark directories by a trailing `/` on a regular entry.
        if kind.is_dir() || entry.path_bytes().ends_with(b"/") {
            fs::create_dir_all(&path).with_context(written)?;
        } else if matches!(kind, EntryType::Regular | EntryType::Continuous) {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).with_context(written)?;
            }
            let mut out = File::create(&path).with_context(written)?;
            let size = entry.size();
            let copied = io::copy(&mut entry, &mut out)
                .map_err(|e| damaged(&format!("member {}", name.display()), e))?;
            ensure!(
                copied == size,
                "the archive is truncated (member {} has {copied} of its {size} bytes); {fix}",
                name.display()
            );
        } else if !kind.is_pax_global_extensions() {
            bail!(
                "member {} is a {kind:?} entry, not a file or directory (Caltech-256's archive \
                 holds only those); refusing to extract it; {fix}",
                name.display()
            );
        }
        last = format!("member {}", name.display());
    }
    // An archive that ends at a member boundary reads like a complete one: well-formed tars end
    // with two zero blocks, of which the reader consumed only the first.
    let read = tar.into_inner().bytes;
    ensure!(
        read < len,
        "the archive is truncated (it ends after {last} without tar's end-of-archive blocks); \
         {fix}"
    );
    Ok(())
}

/// Extracts the official archive at `archive` to `dir/256_ObjectCategories` (see the module
/// docs) and returns that path. An existing `dir/256_ObjectCategories` is refused (remove it to
/// extract again); temporary directories left in `dir` by a killed extraction are removed first.
/// Errors name the archive, the member and the fix.
pub fn extract(archive: &Path, dir: &Path) -> Result<PathBuf> {
    let target = dir.join(DIR);
    ensure!(
        !target.exists(),
        "{} already exists; remove it to extract {} again",
        target.display(),
        archive.display()
    );
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    remove_stale_extractions(dir);
    let unwritable = |e: io::Error| {
        anyhow!(
            "cannot write to {} ({e}); choose a writable directory with --dir",
            dir.display()
        )
    };
    let temp = tempfile::Builder::new()
        .prefix(PARTIAL_PREFIX)
        .tempdir_in(dir)
        .map_err(unwritable)?;
    let lock = File::create(temp.path().join(LOCK)).map_err(unwritable)?;
    // Where locks are unsupported, cleaners cannot lock it either, so they leave it.
    let _ = lock.lock();
    let fix = format!(
        "remove it and download it again with `ssl data download caltech256 --dir {}`",
        dir.display()
    );
    let stopped = |e: anyhow::Error| anyhow!("{}: nothing was extracted: {e:#}", archive.display());
    unpack(archive, temp.path(), &fix).map_err(stopped)?;
    let extracted = temp.path().join(DIR);
    ensure!(
        extracted.is_dir(),
        "{}: nothing was extracted: the archive holds no {DIR}/ (not Caltech-256's archive); \
         {fix}",
        archive.display()
    );
    let missing = missing_categories(&extracted, &categories(false))?;
    ensure!(
        missing.is_empty(),
        "{}: nothing was extracted: the archive lacks {} of Caltech-256's 256 numbered \
         categories ({}; another or a damaged archive); {fix}",
        archive.display(),
        missing.len(),
        listed(&missing)
    );
    if let Err(e) = fs::rename(&extracted, &target) {
        // Another extraction that finished first has put the same set in place.
        if !target.is_dir() {
            return Err(e).with_context(|| {
                format!(
                    "cannot rename {} to {}",
                    extracted.display(),
                    target.display()
                )
            });
        }
    }
    drop(lock);
    temp.close()
        .with_context(|| format!("cannot remove {}", dir.display()))?;
    Ok(target)
}

/// A `width × height` JPEG of [`crate::synthetic_pixel`]s of image `i`.
fn synthetic_jpeg(i: usize, width: u32, height: u32) -> Result<Vec<u8>> {
    let image = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb(std::array::from_fn(|c| {
            crate::synthetic_pixel(i, c, y as usize, x as usize)
        }))
    });
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90).encode(
        image.as_raw(),
        width,
        height,
        image::ColorType::Rgb8,
    )?;
    Ok(bytes)
}

/// The members of a synthetic set in the official layout, categories in folder-number order:
/// each directory (trailing `/`, no bytes) before its files, `per_class` non-square JPEGs
/// `NNN_KKKK.jpg` (80×64, so that the shorter side is resized and the centre cropped as on the
/// official images) in each of the 257 categories, and the official leftovers `198.spider/RENAME2`
/// and the empty `056.dog/greg/vision309/`.
fn synthetic_members(per_class: usize) -> Result<Vec<(String, Option<Vec<u8>>)>> {
    let mut members = vec![(format!("{DIR}/"), None)];
    for (c, category) in categories(true).iter().enumerate() {
        members.push((format!("{DIR}/{category}/"), None));
        for k in 0..per_class {
            let file = format!("{DIR}/{category}/{:03}_{:04}.jpg", c + 1, k + 1);
            members.push((file, Some(synthetic_jpeg(c * per_class + k, 80, 64)?)));
        }
        if category == "056.dog" {
            members.push((format!("{DIR}/{category}/greg/"), None));
            members.push((format!("{DIR}/{category}/greg/vision309/"), None));
        }
        if category == "198.spider" {
            let note = b"not an image".to_vec();
            members.push((format!("{DIR}/{category}/RENAME2"), Some(note)));
        }
    }
    Ok(members)
}

/// Writes Caltech-256 in the official layout as an extracted tree `dir/256_ObjectCategories`
/// (see [`write_synthetic_archive`]); returns that path. For checks of the code path without the
/// official files.
pub fn write_synthetic(dir: &Path, per_class: usize) -> Result<PathBuf> {
    for (name, bytes) in synthetic_members(per_class)? {
        let path = dir.join(&name);
        let made = match bytes {
            None => fs::create_dir_all(&path),
            Some(bytes) => fs::write(&path, bytes),
        };
        made.with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(dir.join(DIR))
}

/// Writes an uncompressed tar at `path` in the layout of the official `256_ObjectCategories.tar`
/// (ustar headers; member names, directory entries): the 257 categories with
/// `per_class` JPEGs `NNN_KKKK.jpg` each (image `c·per_class + k` of [`crate::synthetic_pixel`]s,
/// 80×64), and the official archive's two leftovers that hold no image.
pub fn write_synthetic_archive(path: &Path, per_class: usize) -> Result<()> {
    let partial = crate::cache::Partial::create(path, "choose a writable directory")?;
    let mut tar = tar::Builder::new(partial.file());
    for (name, bytes) in synthetic_members(per_class)? {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(1_175_000_000);
        match &bytes {
            None => {
                header.set_entry_type(EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
            }
            Some(bytes) => {
                header.set_mode(0o644);
                header.set_size(bytes.len() as u64);
            }
        }
        let data = bytes.as_deref().unwrap_or_default();
        tar.append_data(&mut header, &name, data)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    tar.into_inner()
        .with_context(|| format!("writing {}", path.display()))?;
    partial.persist()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries of `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A tar at `path` of the synthetic members plus one raw member `name` of type `kind`
    /// (`link` its target), written with a header the builder's path checks do not touch.
    fn with_raw_member(path: &Path, name: &str, kind: EntryType, link: &str) {
        let mut tar = tar::Builder::new(File::create(path).unwrap());
        for (member, bytes) in synthetic_members(1).unwrap() {
            let mut header = tar::Header::new_ustar();
            header.set_mode(0o755);
            let data = bytes.unwrap_or_default();
            if member.ends_with('/') {
                header.set_entry_type(EntryType::Directory);
            }
            header.set_size(data.len() as u64);
            tar.append_data(&mut header, &member, &data[..]).unwrap();
        }
        let mut header = tar::Header::new_old();
        let raw = header.as_old_mut();
        raw.name[..name.len()].copy_from_slice(name.as_bytes());
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        header.set_entry_type(kind);
        header.set_mode(0o644);
        let data = b"payload";
        header.set_size(data.len() as u64);
        header.set_cksum();
        tar.append(&header, &data[..]).unwrap();
        tar.finish().unwrap();
    }

    #[test]
    fn categories_are_numbered_in_folder_order() {
        let all = categories(true);
        assert_eq!(all.len(), 257);
        assert_eq!(
            [&all[0], &all[1], &all[127], &all[128], &all[255], &all[256]],
            [
                "001.ak47",
                "002.american-flag",
                "128.lathe",
                "129.leopards-101",
                "256.toad",
                "257.clutter"
            ]
        );
        let mut sorted = all.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted, all,
            "class index = sorted order = folder number − 1"
        );
        assert_eq!(categories(false), all[..CATEGORIES]);
    }

    /// The official layout round trip: extraction leaves the tree and the archive only, and the
    /// loader reads the 256 numbered categories (clutter on request) in folder-number order.
    #[test]
    fn an_archive_in_the_official_layout_extracts_and_loads() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let archive = dir.path().join(ARCHIVE);
        write_synthetic_archive(&archive, 2)?;

        let target = extract(&archive, dir.path())?;

        assert_eq!(target, dir.path().join(DIR));
        assert_eq!(listing(dir.path()), [DIR, ARCHIVE]);
        assert!(target.join("198.spider/RENAME2").is_file());
        assert!(target.join("056.dog/greg/vision309").is_dir());
        for root in [dir.path(), &target] {
            let set = load(root, 8, 0, false, None)?;
            assert_eq!(set.classes, categories(false));
            assert_eq!(set.dataset.name, NAME);
            assert_eq!((set.dataset.len(), set.dataset.num_classes), (512, 256));
            assert_eq!(set.dataset.shape, [3, 8, 8]);
            let labels: Vec<u32> = (0..512).map(|i| i / 2).collect();
            assert_eq!(set.dataset.labels, labels);
            assert_eq!(set.train_len, None);
        }
        let with_clutter = load(dir.path(), 8, 0, true, None)?;
        assert_eq!(with_clutter.dataset.len(), 514);
        assert_eq!(with_clutter.dataset.labels[512..], [256, 256]);
        assert_eq!(with_clutter.classes[256], "257.clutter");
        // Kept at a shorter side of 16 (`data.keep_side`): each 80 × 64 image whole at 20 × 16,
        // the same samples and labels, read as the same [3, 8, 8] evaluation views.
        let kept = load(dir.path(), 8, 16, false, None)?;
        assert_eq!(kept.dataset.shape, [3, 8, 8]);
        assert_eq!(
            kept.dataset.labels,
            load(dir.path(), 8, 0, false, None)?.dataset.labels
        );
        for i in [0, 1, 511] {
            let image = kept.dataset.image(i).expect("a kept image");
            assert_eq!((image.height, image.width), (16, 20), "image {i}");
        }

        let again = format!("{:#}", extract(&archive, dir.path()).unwrap_err());
        assert!(again.contains("already exists; remove it"), "{again}");
        Ok(())
    }

    #[test]
    fn members_outside_the_directory_links_and_devices_are_refused() -> Result<()> {
        for (name, kind, link, needle) in [
            (
                "256_ObjectCategories/../evil.jpg",
                EntryType::Regular,
                "",
                "`..`",
            ),
            ("/tmp/caltech-evil.jpg", EntryType::Regular, "", "absolute"),
            (
                "evil.jpg",
                EntryType::Regular,
                "",
                "not under 256_ObjectCategories/",
            ),
            (
                "256_ObjectCategories/001.ak47/x.jpg",
                EntryType::Symlink,
                "/etc/passwd",
                "Symlink",
            ),
            (
                "256_ObjectCategories/001.ak47/y.jpg",
                EntryType::Link,
                "../../z",
                "Link",
            ),
            (
                "256_ObjectCategories/001.ak47/fifo",
                EntryType::Fifo,
                "",
                "Fifo",
            ),
        ] {
            let dir = tempfile::tempdir()?;
            let archive = dir.path().join(ARCHIVE);
            with_raw_member(&archive, name, kind, link);

            let e = format!("{:#}", extract(&archive, dir.path()).unwrap_err());

            for needle in [name, needle, "refusing", "nothing was extracted"] {
                assert!(e.contains(needle), "`{needle}` missing from: {e}");
            }
            assert_eq!(listing(dir.path()), [ARCHIVE], "{name}");
        }
        assert!(!Path::new("/tmp/caltech-evil.jpg").exists());
        Ok(())
    }

    #[test]
    fn a_truncated_or_corrupt_archive_is_refused_and_leaves_nothing() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let archive = dir.path().join(ARCHIVE);
        write_synthetic_archive(&archive, 1)?;
        let bytes = fs::read(&archive)?;
        let mut flipped = bytes.clone();
        flipped[10] ^= 0x20;
        for (damaged, needle) in [
            (bytes[..bytes.len() / 2 + 100].to_vec(), "truncated"),
            // Whole members only, without the end-of-archive blocks.
            (bytes[..bytes.len() - 1024].to_vec(), "end-of-archive"),
            (flipped, "checksum"),
            (b"<html>not a tar</html>".to_vec(), "damaged or truncated"),
        ] {
            fs::write(&archive, &damaged)?;

            let e = format!("{:#}", extract(&archive, dir.path()).unwrap_err());

            let fix = format!(
                "ssl data download caltech256 --dir {}",
                dir.path().display()
            );
            for needle in [needle, &archive.display().to_string(), &fix] {
                assert!(e.contains(needle), "`{needle}` missing from: {e}");
            }
            assert_eq!(listing(dir.path()), [ARCHIVE]);
        }
        Ok(())
    }

    #[test]
    fn an_archive_without_every_category_is_not_put_in_place() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let archive = dir.path().join(ARCHIVE);
        let mut tar = tar::Builder::new(File::create(&archive)?);
        let mut header = tar::Header::new_ustar();
        header.set_size(3);
        tar.append_data(
            &mut header,
            "256_ObjectCategories/001.ak47/001_0001.jpg",
            &b"abc"[..],
        )?;
        tar.finish()?;
        drop(tar);

        let e = format!("{:#}", extract(&archive, dir.path()).unwrap_err());

        assert!(
            e.contains("lacks 255 of") && e.contains("002.american-flag"),
            "{e}"
        );
        assert_eq!(listing(dir.path()), [ARCHIVE]);
        Ok(())
    }

    #[test]
    fn a_killed_extraction_is_cleaned_up_but_a_running_one_is_not() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let archive = dir.path().join(ARCHIVE);
        write_synthetic_archive(&archive, 1)?;
        let (stale, running) = (
            dir.path().join(format!("{PARTIAL_PREFIX}killed")),
            dir.path().join(format!("{PARTIAL_PREFIX}running")),
        );
        for partial in [&stale, &running] {
            fs::create_dir_all(partial.join(DIR).join("001.ak47"))?;
            File::create(partial.join(LOCK))?;
        }
        let held = File::open(running.join(LOCK))?;
        held.lock()?;

        extract(&archive, dir.path())?;

        let running_name = format!("{PARTIAL_PREFIX}running");
        assert_eq!(listing(dir.path()), [DIR, running_name.as_str(), ARCHIVE]);
        Ok(())
    }

    fn load_error(root: &Path, clutter: bool) -> String {
        match load(root, 8, 0, clutter, None) {
            Ok(_) => panic!("{} loaded", root.display()),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_missing_or_partial_directory_is_named_with_the_fix() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let absent = dir.path().join("nowhere").join(DIR);
        let e = load_error(&absent, false);
        let fix = format!(
            "ssl data download caltech256 --dir {}",
            dir.path().join("nowhere").display()
        );
        for needle in ["does not exist", &fix, "data.root"] {
            assert!(e.contains(needle), "`{needle}` missing from: {e}");
        }
        let e = load_error(dir.path(), false);
        assert!(e.contains("holds neither 256_ObjectCategories/"), "{e}");

        let root = write_synthetic(dir.path(), 1)?;
        fs::remove_dir_all(root.join("017.bowling-ball"))?;
        fs::remove_dir_all(root.join("257.clutter"))?;
        let e = load_error(dir.path(), false);
        assert!(
            e.contains("lacks 1 of") && e.contains("017.bowling-ball"),
            "{e}"
        );
        fs::create_dir(root.join("017.bowling-ball"))?;
        let e = load_error(dir.path(), true);
        assert!(e.contains("257.clutter"), "{e}");
        Ok(())
    }
}
