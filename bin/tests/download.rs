//! `ssl data download` and `ssl run` on downloaded sets, run against the built `ssl` and the
//! local file server of ssl-net's tests: the command line's flags reaching the download and its
//! errors, a benchmark archive and Caltech-256 fetched, extracted and trained on, and
//! Caltech-256's configuration defaults.

use std::path::Path;
use std::process::Command;

use ssl_data::caltech256;
use ssl_data::download::fetch_and_extract_caltech256;

// ssl-net's fetch tests (net/tests/fetch.rs) use the rest of it.
#[allow(dead_code)]
#[path = "../../net/tests/file_server/mod.rs"]
mod file_server;

use file_server::{listing, md5_hex, sample, Mode, Seen, Server, OFFICIAL_BREASTMNIST_MD5};

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
