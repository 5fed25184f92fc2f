//! `ssl run` on an image folder kept at full resolution (`data.keep_side`, docs/data.md "Image
//! folders"): it trains and evaluates, records the setting, and writes the kept cache once.

use std::path::Path;
use std::process::Command;

/// Trains 2 epochs on a synthetic 80 × 56 JPEG folder at `--size 32`, with the images kept at
/// shorter side 48 under `cache`.
fn run(root: &Path, out: &Path, cache: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["run", "--data", "folder", "--size", "32", "--epochs", "2"])
        .args([
            "--batch-size",
            "8",
            "--set",
            "data.keep_side=48",
            "--overwrite",
        ])
        .arg("--root")
        .arg(root)
        .arg("--out")
        .arg(out)
        .env("SSL_CACHE", cache)
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .expect("the ssl binary runs")
}

#[test]
fn a_folder_kept_at_full_resolution_trains_and_evaluates() {
    let dir = tempfile::tempdir().unwrap();
    let (root, out, cache) = (
        dir.path().join("folder"),
        dir.path().join("run"),
        dir.path().join("cache"),
    );
    let classes: Vec<String> = ["n01", "n02", "n03"].map(String::from).to_vec();
    ssl_data::write_synthetic_folder(&root, &classes, [8, 3], 80, 56).unwrap();
    let o = run(&root, &out, &cache);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let config = std::fs::read_to_string(out.join("config.yaml")).unwrap();
    assert!(config.contains("keep_side: 48"), "{config}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("linear probe"),
        "no evaluation table:\n{stdout}"
    );
    // One kept cache of the 33 images (80 × 56 → 68 × 48), not an S × S one.
    let files: Vec<String> = std::fs::read_dir(cache.join("folders"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].starts_with("folder-keep48px-"), "{files:?}");
    let file = cache.join("folders").join(&files[0]);
    let len = std::fs::metadata(&file).unwrap().len();
    assert_eq!(len, 33 * (68 * 48 * 3 + 8) + 8 + 32);
    // A second run maps it as it is.
    let written = std::fs::metadata(&file).unwrap().modified().unwrap();
    assert!(run(&root, &out, &cache).status.success());
    assert_eq!(
        std::fs::metadata(&file).unwrap().modified().unwrap(),
        written
    );
}
