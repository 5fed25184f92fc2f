//! `ssl_data::download` and `ssl_net::fetch` against a small HTTP/1.1 server on 127.0.0.1,
//! started by each test, that serves a MedMNIST-format file made from the embedded digits. It
//! honours `Range: bytes=N-` (or ignores it), can close a transfer early or answer with an error
//! status, and records every request so the tests can check what reached it.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use md5::{Digest, Md5};
use ssl_data::caltech256;
use ssl_data::download::{download_data_set, download_medmnist, fetch_and_extract_caltech256};
use ssl_net::fetch::{fetch_verified, part_path};

/// The official MD5 of `breastmnist.npz` (size 28), which the digits stand-in does not have.
const OFFICIAL_BREASTMNIST_MD5: &str = "750601b1f35ba3300ea97c75c52ff8f6";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// Serve the file, answering `Range: bytes=N-` with 206 (or 416 past the end).
    Serve,
    /// Serve the whole file with 200 whatever the request asks.
    IgnoreRange,
    /// Announce the whole file (200) but close the connection after this many bytes of it.
    CloseAfter(usize),
    /// Answer with this status and no body.
    Status(u16),
}

/// One request as it reached the server.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    path: String,
    range: Option<String>,
}

struct State {
    body: Vec<u8>,
    mode: Mode,
    requests: Vec<Seen>,
}

struct Server {
    base: String,
    state: Arc<Mutex<State>>,
}

impl Server {
    fn start(body: Vec<u8>, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the test server");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            body,
            mode,
            requests: Vec::new(),
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Self { base, state }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn url(&self) -> String {
        format!("{}/breastmnist.npz", self.base)
    }

    fn requests(&self) -> Vec<Seen> {
        self.state().requests.clone()
    }
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut range = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() {
            return;
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((key, value)) = header.split_once(':') {
            if key.trim().eq_ignore_ascii_case("range") {
                range = Some(value.trim().to_string());
            }
        }
    }
    let (mode, body) = {
        let mut state = state.lock().unwrap();
        let seen = Seen {
            path,
            range: range.clone(),
        };
        state.requests.push(seen);
        (state.mode, state.body.clone())
    };
    let len = body.len();
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .map(|n| n.parse::<usize>().expect("a Range of the form bytes=N-"));
    let (status, headers, body): (u16, String, &[u8]) = match (mode, start) {
        (Mode::Status(status), _) => (status, String::new(), &[]),
        (Mode::Serve, Some(n)) if n >= len => {
            (416, format!("Content-Range: bytes */{len}\r\n"), &[])
        }
        (Mode::Serve, Some(n)) => (
            206,
            format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1),
            &body[n..],
        ),
        _ => (200, String::new(), &body[..]),
    };
    let head = format!(
        "HTTP/1.1 {status} Test\r\nContent-Length: {}\r\nConnection: close\r\n{headers}\r\n",
        body.len()
    );
    let sent = match mode {
        Mode::CloseAfter(n) => &body[..n],
        _ => body,
    };
    let _ = writer.write_all(head.as_bytes());
    let _ = writer.write_all(sent);
    let _ = writer.flush();
    let _ = writer.shutdown(Shutdown::Both);
}

/// The bytes of a MedMNIST-format `breastmnist.npz` made from the digits, and their MD5.
fn sample() -> &'static (Vec<u8>, String) {
    static SAMPLE: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("breastmnist.npz");
        ssl_data::write_digits_as_medmnist(&path, "breastmnist", 28).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let md5 = md5_hex(&bytes);
        (bytes, md5)
    })
}

fn md5_hex(bytes: &[u8]) -> String {
    Md5::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The entries of `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn downloads_a_bit_identical_file_and_leaves_no_part() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache").join("breastmnist.npz");

    let got = fetch_verified(&server.url(), &path, md5, false).unwrap();

    assert_eq!(got.path, path);
    assert!(!got.already_present);
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert_eq!(listing(&dir.path().join("cache")), ["breastmnist.npz"]);
    let seen = Seen {
        path: "/breastmnist.npz".into(),
        range: None,
    };
    assert_eq!(server.requests(), [seen]);
}

#[test]
fn already_downloaded_file_is_verified_and_not_requested() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    std::fs::write(&path, bytes).unwrap();

    let got = fetch_verified(&server.url(), &path, &md5.to_uppercase(), false).unwrap();

    assert!(got.already_present);
    assert!(
        got.summary().starts_with("already downloaded:"),
        "{}",
        got.summary()
    );
    assert!(
        got.summary().ends_with("(MD5 verified)"),
        "{}",
        got.summary()
    );
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert!(server.requests().is_empty());
}

#[test]
fn corrupt_file_under_the_final_name_is_downloaded_again() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    std::fs::write(&path, &bytes[..1000]).unwrap();

    let got = fetch_verified(&server.url(), &path, md5, false).unwrap();

    assert!(!got.already_present);
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert_eq!(server.requests().len(), 1);
    assert_eq!(listing(dir.path()), ["breastmnist.npz"]);
}

#[test]
fn wrong_md5_deletes_the_download_and_names_both_sums_and_the_url() {
    let (bytes, md5) = sample();
    let mut corrupt = bytes.clone();
    corrupt[bytes.len() / 2] ^= 0xff;
    let corrupt_md5 = md5_hex(&corrupt);
    let server = Server::start(corrupt, Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");

    let err = fetch_verified(&server.url(), &path, md5, false).unwrap_err();

    let msg = format!("{err:#}");
    for needle in [md5.as_str(), &corrupt_md5, &server.url(), "again"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
}

#[test]
fn truncated_transfer_keeps_the_part_and_the_retry_resumes_with_a_range() {
    let (bytes, md5) = sample();
    let cut = bytes.len() / 3;
    let server = Server::start(bytes.clone(), Mode::CloseAfter(cut));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    let part = part_path(&path);

    let err = fetch_verified(&server.url(), &path, md5, false).unwrap_err();

    let msg = format!("{err:#}");
    let kept = format!("{cut} of {} bytes", bytes.len());
    for needle in [
        server.url().as_str(),
        &kept,
        "resumes",
        &part.display().to_string(),
    ] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(!path.exists());
    assert_eq!(std::fs::read(&part).unwrap(), &bytes[..cut]);

    server.state().mode = Mode::Serve;
    let got = fetch_verified(&server.url(), &path, md5, false).unwrap();

    assert!(!got.already_present);
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert!(!part.exists());
    let ranges: Vec<_> = server.requests().into_iter().map(|r| r.range).collect();
    assert_eq!(ranges, [None, Some(format!("bytes={cut}-"))]);
}

#[test]
fn server_that_ignores_the_range_restarts_the_download() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::IgnoreRange);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    let part = part_path(&path);
    std::fs::write(&part, vec![7u8; 5000]).unwrap();

    fetch_verified(&server.url(), &path, md5, false).unwrap();

    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert!(!part.exists());
    let ranges: Vec<_> = server.requests().into_iter().map(|r| r.range).collect();
    assert_eq!(ranges, [Some("bytes=5000-".to_string())]);
}

#[test]
fn complete_part_left_before_the_rename_is_verified_and_kept_without_a_request() {
    let (bytes, md5) = sample();
    // A server that would spoil it: the part must not be truncated for its answer.
    let server = Server::start(b"not the file".to_vec(), Mode::IgnoreRange);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    std::fs::write(part_path(&path), bytes).unwrap();

    let got = fetch_verified(&server.url(), &path, md5, false).unwrap();

    assert!(!got.already_present);
    assert_eq!(&std::fs::read(&path).unwrap(), bytes);
    assert_eq!(listing(dir.path()), ["breastmnist.npz"]);
    assert!(server.requests().is_empty());
}

/// A file already under the final name (here a valid archive, but not the one whose MD5 is
/// asked for) is replaced only by the rename of a verified download: every failed replacement
/// leaves it byte for byte as it was.
#[test]
fn a_failed_replacement_leaves_the_existing_file_as_it_was() {
    let (bytes, _) = sample();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    std::fs::write(&path, bytes).unwrap();
    let mut corrupt = bytes.clone();
    corrupt[100] ^= 1;
    let cut = bytes.len() / 2;
    // A body with another MD5, an error status, a transfer cut short (last: it keeps a part).
    for (body, mode, needle) in [
        (
            corrupt,
            Mode::Serve,
            format!("{} is left as it was", path.display()),
        ),
        (
            bytes.clone(),
            Mode::Status(503),
            "try again later".to_string(),
        ),
        (bytes.clone(), Mode::CloseAfter(cut), "resumes".to_string()),
    ] {
        let server = Server::start(body, mode);

        let err = fetch_verified(&server.url(), &path, OFFICIAL_BREASTMNIST_MD5, false);

        let msg = format!("{:#}", err.unwrap_err());
        assert!(msg.contains(&needle), "`{needle}` missing from: {msg}");
        assert_eq!(&std::fs::read(&path).unwrap(), bytes, "{mode:?}");
        assert_eq!(server.requests().len(), 1, "{mode:?}");
    }
    // What the broken transfer kept is still there for the next attempt.
    assert_eq!(std::fs::read(part_path(&path)).unwrap(), &bytes[..cut]);
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

#[test]
fn server_error_names_the_status_and_the_url_and_leaves_nothing() {
    let (bytes, md5) = sample();
    for status in [404, 500] {
        let server = Server::start(bytes.clone(), Mode::Status(status));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("breastmnist.npz");

        let err = fetch_verified(&server.url(), &path, md5, false).unwrap_err();

        let msg = format!("{err:#}");
        let code = format!("HTTP {status}");
        for needle in [server.url().as_str(), &code] {
            assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
        }
        assert!(listing(dir.path()).is_empty());
    }
}

#[test]
fn unreachable_server_keeps_the_part_and_says_a_retry_resumes() {
    let (bytes, md5) = sample();
    let url = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/breastmnist.npz", listener.local_addr().unwrap())
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("breastmnist.npz");
    let part = part_path(&path);
    std::fs::write(&part, &bytes[..4096]).unwrap();

    let err = fetch_verified(&url, &path, md5, false).unwrap_err();

    let msg = format!("{err:#}");
    for needle in [url.as_str(), "4096 bytes are kept", "resumes"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(!path.exists());
    assert_eq!(std::fs::read(&part).unwrap(), &bytes[..4096]);
}

#[test]
fn unwritable_directory_is_named_with_the_fix() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    let tmp = tempfile::tempdir().unwrap();
    // A directory below a regular file cannot be created, even by root.
    let file = tmp.path().join("not-a-directory");
    std::fs::write(&file, b"").unwrap();
    let dir = file.join("medmnist");

    let err = fetch_verified(&server.url(), &dir.join("breastmnist.npz"), md5, false).unwrap_err();

    let msg = format!("{err:#}");
    for needle in [dir.display().to_string().as_str(), "--dir"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
    assert!(server.requests().is_empty());
}

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

/// The official MD5 is checked, so the digits stand-in is refused; what matters here is the
/// command line: the flag, `--size`, `--dir` and `--url` reach the download and its error.
#[test]
fn cli_fetches_from_the_url_and_refuses_a_file_with_the_wrong_md5() {
    let (bytes, md5) = sample();
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let mirror = format!("{}/mirror/", server.base);

    let out = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["data", "download", "breastmnist", "--size", "28", "--dir"])
        .arg(dir.path())
        .args(["--url", &mirror])
        .output()
        .unwrap();

    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let url = format!("{}/mirror/breastmnist.npz", server.base);
    for needle in [OFFICIAL_BREASTMNIST_MD5, md5, &url, "error: "] {
        assert!(stderr.contains(needle), "`{needle}` missing from: {stderr}");
    }
    let seen = Seen {
        path: "/mirror/breastmnist.npz".into(),
        range: None,
    };
    assert_eq!(server.requests(), [seen]);
    assert!(listing(dir.path()).is_empty());
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

/// `ssl data download stl10 --url` asks the mirror for the official file name, and `ssl run
/// --data cifar10` trains a ResNet-18 (CIFAR stem) end to end on an archive in the official
/// layout, then evaluates on its test split.
#[test]
fn cli_downloads_by_name_and_runs_on_a_benchmark_archive() {
    let server = Server::start(b"not the archive".to_vec(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["data", "download", "stl10", "--dir"])
        .arg(dir.path())
        .args(["--url", &format!("{}/mirror", server.base)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("91f7769df0f17e558f3565bffb0c7dfb"),
        "{stderr}"
    );
    assert_eq!(server.requests()[0].path, "/mirror/stl10_binary.tar.gz");

    ssl_data::write_synthetic_archive(
        "cifar10",
        &dir.path().join("cifar-10-python.tar.gz"),
        [40, 20, 0],
    )
    .unwrap();
    let run = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args([
            "run",
            "--data",
            "cifar10",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--root",
        ])
        .arg(dir.path())
        .arg("--out")
        .arg(&run)
        .args(["--set", "model.projector=[32]"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let config = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    for needle in [
        "name: cifar10",
        "size: 32",
        "encoder: resnet18",
        "stem: cifar",
        "normalize: cifar10",
    ] {
        assert!(config.contains(needle), "`{needle}` missing from: {config}");
    }
    assert!(run.join("results.json").is_file());
}

/// `ssl run` with `args` writing into `out` (decoded images cached under `cache`); its recorded
/// split (`split.json`) and configuration (`config.yaml`).
fn run_recorded(args: &[&str], out: &Path, cache: &Path) -> (serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(out)
        .env("SSL_CACHE", cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(out.join("results.json").is_file());
    let split = std::fs::read(out.join("split.json")).unwrap();
    let config = std::fs::read_to_string(out.join("config.yaml")).unwrap();
    (serde_json::from_slice(&split).unwrap(), config)
}

/// The positions of `split[part]`.
fn positions(split: &serde_json::Value, part: &str) -> Vec<usize> {
    let list = split[part]
        .as_array()
        .unwrap_or_else(|| panic!("no {part} in {split}"));
    list.iter().map(|v| v.as_u64().unwrap() as usize).collect()
}

/// Caltech-256 from its archive to a trained run: `ssl data download caltech256 --url` asks the
/// mirror for the official tar and refuses one in the official layout whose MD5 is not the
/// published one; the same bytes fetched with their own MD5 are extracted in place (a second
/// call requests nothing); `ssl run --data caltech256` trains and evaluates on them, and two runs
/// of different model seeds and one split seed record the same held-out images in `split.json`,
/// two of each of the 256 categories (stratified; 4 images each at test fraction 0.5).
#[test]
fn caltech256_downloads_extracts_and_runs_on_a_stratified_recorded_split() {
    let staging = tempfile::tempdir().unwrap();
    let made = staging.path().join(caltech256::ARCHIVE);
    caltech256::write_synthetic_archive(&made, 4).unwrap();
    let bytes = std::fs::read(&made).unwrap();
    let md5 = md5_hex(&bytes);
    let server = Server::start(bytes.clone(), Mode::Serve);
    let dir = tempfile::tempdir().unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["data", "download", "caltech256", "--dir"])
        .arg(dir.path())
        .args(["--url", &format!("{}/mirror", server.base)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let mirrored = format!("{}/mirror/256_ObjectCategories.tar", server.base);
    for needle in [caltech256::MD5, &md5, &mirrored] {
        assert!(stderr.contains(needle), "`{needle}` missing from: {stderr}");
    }
    assert!(listing(dir.path()).is_empty());

    let url = format!("{}/{}", server.base, caltech256::ARCHIVE);
    let got = fetch_and_extract_caltech256(&url, dir.path(), &md5, false).unwrap();
    assert_eq!(got.path, dir.path().join(caltech256::DIR));
    assert!(!got.already_present);
    assert!(
        got.summary().contains("(MD5 verified)"),
        "{}",
        got.summary()
    );
    assert_eq!(listing(dir.path()), [caltech256::DIR, caltech256::ARCHIVE]);
    let again = fetch_and_extract_caltech256(&url, dir.path(), &md5, false).unwrap();
    assert!(again.already_present);
    // The directory found in place is taken as it is: nothing claims it was verified.
    let summary = again.summary();
    assert!(
        !summary.contains("MD5 verified") && summary.contains("not verified; remove it"),
        "{summary}"
    );
    assert_eq!(server.requests().len(), 2);

    let cache = dir.path().join("cache");
    let root = dir.path().to_str().unwrap();
    let common = [
        "--data",
        "caltech256",
        "--root",
        root,
        // Small: the evaluation's probes over 256 classes dominate the run's time.
        "--size",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "64",
        "--set",
        "data.split_seed=7",
        "--set",
        "data.test_fraction=0.5",
        "--encoder",
        "mlp",
        "--set",
        "model.mlp=[16]",
        "--set",
        "model.projector=[16]",
    ];
    let (first, config) = run_recorded(
        &[&common[..], &["--seed", "0"]].concat(),
        &dir.path().join("run-0"),
        &cache,
    );
    for needle in ["name: caltech256", "size: 8", "normalize: imagenet"] {
        assert!(config.contains(needle), "`{needle}` missing from: {config}");
    }
    let (second, _) = run_recorded(
        &[&common[..], &["--seed", "1"]].concat(),
        &dir.path().join("run-1"),
        &cache,
    );

    let (train, test) = (positions(&first, "train"), positions(&first, "test"));
    assert_eq!(first["seed"], 7);
    assert_eq!(test, positions(&second, "test"));
    assert_eq!(train, positions(&second, "train"));
    // Sample i is image i % 4 of category i / 4.
    let mut held_out = vec![0; 256];
    for &i in &test {
        held_out[i / 4] += 1;
    }
    assert_eq!(held_out, vec![2; 256]);
    assert_eq!(train.len(), 512);
    assert_ne!(
        test.iter().map(|i| i % 4).collect::<Vec<_>>(),
        [0, 1].repeat(256)
    );
}

/// `data.name: caltech256` defaults to ImageNet's side, a ResNet-18, SimCLR's views and ImageNet's
/// normalisation, with a 0.2 stratified test fraction; `data.clutter` is Caltech-256's alone.
#[test]
fn caltech256_defaults_and_the_clutter_key() {
    let parse = |yaml: &str| {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        ssl_train::config::RunConfig::from_yaml_value(value)
    };
    let c = parse("data: {name: caltech256}").unwrap();
    assert_eq!((c.data.size, c.model.encoder.as_str()), (224, "resnet18"));
    assert_eq!(c.data.test_fraction, 0.2);
    assert!(!c.data.clutter);
    let resolved = serde_yaml::to_string(&c).unwrap();
    for needle in ["augment: simclr", "normalize: imagenet"] {
        assert!(
            resolved.contains(needle),
            "`{needle}` missing from: {resolved}"
        );
    }
    let c = parse("data: {name: caltech256, size: 64, clutter: true}").unwrap();
    assert_eq!(c.data.size, 64);
    assert!(c.data.clutter);
    let e = format!(
        "{:#}",
        parse("data: {name: folder, clutter: true}").unwrap_err()
    );
    assert!(e.contains("data.clutter") && e.contains("`folder`"), "{e}");
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
