//! `ssl_data::download` (feature `download`) against the local file server of ssl-net's tests:
//! names and sizes refused before any request, the benchmark archives and Caltech-256 fetched
//! from a mirror, verified, extracted and loaded, and the modes of the files it creates.

use std::path::Path;

use ssl_data::caltech256;
use ssl_data::download::{download_data_set, download_medmnist, fetch_and_extract_caltech256};
use ssl_net::fetch::fetch_verified;

// ssl-net's fetch tests (net/tests/fetch.rs) use the rest of it.
#[allow(dead_code)]
#[path = "../../net/tests/file_server/mod.rs"]
mod file_server;

use file_server::{listing, md5_hex, sample, Mode, Server};

#[test]
fn unknown_flag_or_size_fails_before_any_request() {
    let server = Server::start(Vec::new(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();

    let err = download_medmnist("breastmnst", 28, dir.path(), Some(&server.base), false);
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains("did you mean `breastmnist`"), "{msg}");

    let err = download_medmnist("breastmnist", 32, dir.path(), Some(&server.base), false);
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains("[28, 64, 128, 224]"), "{msg}");

    assert!(server.requests().is_empty());
    assert!(listing(dir.path()).is_empty());
}

/// Sets the process's umask, restoring the previous one when dropped (also on a failed
/// assertion). The umask is process-wide: no other test here looks at modes.
#[cfg(unix)]
struct Umask(libc::mode_t);

#[cfg(unix)]
impl Umask {
    fn set(mask: libc::mode_t) -> Self {
        // SAFETY: umask cannot fail; it only swaps the process's file-creation mask.
        Self(unsafe { libc::umask(mask) })
    }
}

#[cfg(unix)]
impl Drop for Umask {
    fn drop(&mut self) {
        // SAFETY: as in `Umask::set`.
        unsafe { libc::umask(self.0) };
    }
}

/// Every file ssl creates for the user (a download, a MedMNIST-layout file, the decoded-image
/// caches of MedMNIST and of image folders) gets `0o666 & !umask`, not a temporary file's 0600.
#[cfg(unix)]
#[test]
fn created_files_follow_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    for (mask, expected) in [(0o022, 0o644), (0o027, 0o640)] {
        let _umask = Umask::set(mask);
        let dir = tempfile::tempdir().unwrap();

        let downloaded = dir.path().join("download").join("breastmnist.npz");
        fetch_verified(&server.url(), &downloaded, md5, false).unwrap();
        let written = dir.path().join("breastmnist.npz");
        ssl_data::write_digits_as_medmnist(&written, "breastmnist", 28).unwrap();
        ssl_data::load_medmnist(&written, "breastmnist", 28).unwrap();
        let images = ssl_data::medmnist::image_cache_path(&written);
        let root = dir.path().join("folder");
        for class in ["a", "b"] {
            std::fs::create_dir_all(root.join(class)).unwrap();
            let mut ppm = b"P6\n2 2\n255\n".to_vec();
            ppm.extend([90u8; 12]);
            std::fs::write(root.join(class).join("0.ppm"), ppm).unwrap();
        }
        let cache = dir.path().join("cache");
        ssl_data::load_image_folder(&root, 2, None, Some(&cache)).unwrap();
        let folder_cache = std::fs::read_dir(&cache).unwrap().next().unwrap().unwrap();

        for path in [downloaded, written, images, folder_cache.path()] {
            assert_eq!(
                mode(&path),
                expected,
                "{} under umask {mask:03o}",
                path.display()
            );
        }
    }
}

/// The benchmark sets: an archive synthesised in the official layout is fetched through the
/// same verified download (with its own MD5: the official one cannot match synthetic bytes) and
/// read by `ssl run`'s loader; `download_data_set` asks the mirror for the official file name
/// and refuses anything but the published MD5.
#[test]
fn benchmark_archives_download_from_a_mirror_and_load() {
    for (name, file, counts) in [
        ("cifar10", "cifar-10-python.tar.gz", [10, 4, 0]),
        ("cifar100", "cifar-100-python.tar.gz", [6, 2, 0]),
        ("stl10", "stl10_binary.tar.gz", [3, 2, 4]),
        ("tiny-imagenet", "tiny-imagenet-200.zip", [200, 2, 0]),
    ] {
        let staging = tempfile::tempdir().unwrap();
        let made = staging.path().join(file);
        ssl_data::write_synthetic_archive(name, &made, counts).unwrap();
        let bytes = std::fs::read(&made).unwrap();
        let server = Server::start(bytes.clone(), Mode::Serve);
        let dir = tempfile::tempdir().unwrap();
        let url = format!("{}/{file}", server.base);
        fetch_verified(&url, &dir.path().join(file), &md5_hex(&bytes), false).unwrap();
        let b = ssl_data::load_benchmark(name, dir.path()).unwrap();
        assert_eq!(b.dataset.len(), counts.iter().sum::<usize>(), "{name}");
        assert_eq!(b.unlabeled.len(), counts[2], "{name}");

        let official = ssl_data::archive_info(name).unwrap().md5;
        let err = download_data_set(name, None, Some(dir.path()), Some(&server.base), false);
        let msg = format!("{:#}", err.unwrap_err());
        for needle in [official, &url] {
            assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
        }
        // The synthetic archive already there stays as it was.
        assert_eq!(std::fs::read(dir.path().join(file)).unwrap(), bytes);
    }
}

#[test]
fn benchmark_names_and_sizes_are_checked_before_any_request() {
    let server = Server::start(Vec::new(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let err = download_data_set(
        "cifar10",
        Some(64),
        Some(dir.path()),
        Some(&server.base),
        false,
    );
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains("32×32 only, not 64; drop --size"), "{msg}");
    let err = download_data_set("cifar11", None, Some(dir.path()), Some(&server.base), false);
    let msg = format!("{:#}", err.unwrap_err());
    assert!(
        msg.contains("cifar10, cifar100, cifar100-coarse, stl10, tiny-imagenet"),
        "{msg}"
    );
    assert!(server.requests().is_empty());
    assert!(listing(dir.path()).is_empty());
}

/// Caltech-256 has no single image size to download; an unknown name lists it.
#[test]
fn caltech256_takes_no_size_and_is_listed() {
    let server = Server::start(Vec::new(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let err = download_data_set(
        "caltech256",
        Some(224),
        Some(dir.path()),
        Some(&server.base),
        false,
    );
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains("drop it"), "{msg}");
    let err = download_data_set(
        "caltech101",
        None,
        Some(dir.path()),
        Some(&server.base),
        false,
    );
    let msg = format!("{:#}", err.unwrap_err());
    assert!(msg.contains("did you mean `caltech256`?"), "{msg}");
    assert!(
        msg.contains("tiny-imagenet") && msg.contains("bloodmnist"),
        "{msg}"
    );
    assert!(server.requests().is_empty());
    assert!(listing(dir.path()).is_empty());
}

/// A built-in set or data of your own has nothing to download: refused by name, with no
/// request and nothing written.
#[test]
fn built_in_and_own_data_have_nothing_to_download() {
    let server = Server::start(Vec::new(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    for (name, says) in [
        ("digits", "is built in"),
        ("gmm", "is built in"),
        ("folder", "data of your own"),
        ("npz", "data of your own"),
    ] {
        let err = download_data_set(name, None, Some(dir.path()), Some(&server.base), false);
        let msg = format!("{:#}", err.unwrap_err());
        assert!(
            msg.contains(says) && msg.contains("nothing to download"),
            "{name}: {msg}"
        );
    }
    assert!(server.requests().is_empty());
    assert!(listing(dir.path()).is_empty());
}

/// A verified download that is not a whole tar (here: cut after half its bytes, with the MD5 of
/// what is served) is refused at extraction naming the archive, with nothing put in place; the
/// archive is kept, so the fix it names is to remove it and download again.
#[test]
fn a_truncated_caltech256_archive_is_refused_at_extraction() {
    let staging = tempfile::tempdir().unwrap();
    let made = staging.path().join(caltech256::ARCHIVE);
    caltech256::write_synthetic_archive(&made, 1).unwrap();
    let mut bytes = std::fs::read(&made).unwrap();
    bytes.truncate(bytes.len() / 2 + 100);
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}/{}", server.base, caltech256::ARCHIVE);

    let err = fetch_and_extract_caltech256(&url, dir.path(), &md5_hex(&bytes), false);

    let msg = format!("{:#}", err.unwrap_err());
    let archive = dir.path().join(caltech256::ARCHIVE);
    for needle in [
        archive.display().to_string().as_str(),
        "truncated",
        "nothing was extracted",
        "ssl data download caltech256",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert_eq!(listing(dir.path()), [caltech256::ARCHIVE]);
}
