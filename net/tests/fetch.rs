//! `ssl_net::fetch`: the resumable, MD5-verified download (`fetch_verified`, `part_path`)
//! against the local file server of `file_server`: a bit-identical file and no part left, files
//! already there, wrong sums, transfers cut short and resumed with a `Range`, servers that ignore
//! it, error statuses, an unreachable server and a directory that cannot be made.

use std::net::TcpListener;

use ssl_net::fetch::{fetch_verified, part_path};

mod file_server;

use file_server::{listing, md5_hex, sample, Mode, Seen, Server, OFFICIAL_BREASTMNIST_MD5};

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
