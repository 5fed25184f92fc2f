//! `ssl run --data folder` and `ssl data inspect` on the user's own scans (docs/data.md, "Your
//! own scans"): a DICOM folder of mixed transfer syntaxes, NIfTI volumes, 16-bit PNGs, 5-channel
//! TIFFs and a manifest with unlabelled rows, each written here through the formats' crates
//! (`ssl_data::scans::fixtures`), with the digits' 3s and 8s as their content so the probe has
//! something to read.

use std::path::Path;
use std::process::{Command, Output};

use ssl_data::scans::fixtures;

/// `ssl ARGS` with its cache under `dir`, on one thread: the harness runs as many tests at once
/// as there are cores, which one thread a run fills without contention (`tests/cli.rs` measured
/// it).
fn ssl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .env("SSL_CACHE", dir.join("cache"))
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("the ssl binary runs")
}

/// One epoch of `ssl run --data folder` on `root` at side `size`, written to `dir/run`; the
/// run's stdout and `config.yaml`, after asserting it trained and printed its table.
fn train(dir: &Path, root: &Path, size: usize, extra: &[&str]) -> (String, String) {
    let out = dir.join("run");
    let size = size.to_string();
    let mut args = vec!["run", "--data", "folder", "--root", root.to_str().unwrap()];
    args.extend(["--size", &size, "--epochs", "1", "--batch-size", "8"]);
    args.extend(["--out", out.to_str().unwrap(), "--overwrite"]);
    args.extend(extra);
    let o = ssl(dir, &args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ssl run failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(stdout.contains("linear probe"), "no table:\n{stdout}");
    let config = std::fs::read_to_string(out.join("config.yaml")).unwrap();
    (stdout, config)
}

/// The first `per_class` 3s and 8s of the digits at `side`, as (class name, `[side, side]`
/// values in `[0, 1]`).
fn digits(side: usize, per_class: usize) -> Vec<(&'static str, Vec<f32>)> {
    let set = ssl_data::digits(side).unwrap();
    let mut out = Vec::new();
    for (class, label) in [("three", 3), ("eight", 8)] {
        let picked = (0..set.len()).filter(|&i| set.labels[i] == label);
        for i in picked.take(per_class) {
            out.push((class, set.sample(i).into_owned()));
        }
    }
    out
}

/// `write(i, values, dir)` for the `i`-th of the first `per_class` 16 × 16 3s and 8s, `dir`
/// its class directory `ROOT/three` or `ROOT/eight`, made here.
fn write_digits(root: &Path, per_class: usize, write: impl Fn(usize, &[f32], &Path)) {
    for (i, (class, values)) in digits(16, per_class).iter().enumerate() {
        let dir = root.join(class);
        std::fs::create_dir_all(&dir).unwrap();
        write(i, values, &dir);
    }
}

#[test]
fn a_dicom_folder_of_mixed_transfer_syntaxes_trains() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ct");
    write_digits(&root, 12, |i, values, class_dir| {
        let syntax = fixtures::CT_SYNTAXES[i % fixtures::CT_SYNTAXES.len()];
        let stored: Vec<u16> = values.iter().map(|v| (v * 4000.0) as u16).collect();
        // PACS exports name their files without an ending; recognised by content.
        let name = match i % 2 {
            0 => format!("IM{i:04}"),
            _ => format!("slice{i}.dcm"),
        };
        let object = fixtures::ct_slice(&stored, 16, 16, syntax);
        fixtures::write_dicom(class_dir, &name, object, syntax);
    });
    let (_, config) = train(dir.path(), &root, 16, &[]);
    // DICOM's default mapping: the nnU-Net percentile clip, recorded.
    assert!(config.contains("percentile"), "{config}");
    assert!(config.contains("volumes: false"), "{config}");
}

/// A 16³ ball (class 0) or cube (class 1) of Hounsfield-like values around `centre`.
fn solid(shape: usize, centre: [f32; 3], ball: bool) -> Vec<f32> {
    let n = 16;
    let mut out = vec![-1000.0; n * n * n];
    for (i, v) in out.iter_mut().enumerate() {
        let p = [(i / (n * n)) as f32, (i / n % n) as f32, (i % n) as f32];
        let d: Vec<f32> = p.iter().zip(centre).map(|(p, c)| (p - c).abs()).collect();
        let inside = match ball {
            true => d.iter().map(|d| d * d).sum::<f32>().sqrt() < shape as f32,
            false => d.iter().all(|&d| d < shape as f32 * 0.8),
        };
        if inside {
            *v = 40.0;
        }
    }
    out
}

#[test]
fn a_nifti_folder_trains_the_3d_encoder_at_the_resampled_spacing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("volumes");
    for (class, ball) in [("ball", true), ("cube", false)] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..8 {
            let centre = [7.0 + (i % 3) as f32, 8.0 - (i % 2) as f32, 7.5];
            let values = solid(4 + i % 3, centre, ball);
            let name = match i % 2 {
                0 => format!("case{i}.nii"),
                _ => format!("case{i}.nii.gz"),
            };
            fixtures::write_nifti(&root.join(class).join(name), &values, [16; 3], [2.0; 3]);
        }
    }
    let set = ["--set", "data.spacing=[2.5, 2.5, 2.5]", "--set"];
    let extra = [&set[..], &["data.intensity={window: [-1000, 400]}"]].concat();
    let (_, config) = train(dir.path(), &root, 16, &extra);
    assert!(config.contains("encoder: resnet18_3d"), "{config}");
    assert!(config.contains("volumes: true"), "{config}");
    assert!(
        config.contains("- -1000.0"),
        "the window is recorded:\n{config}"
    );
    assert!(
        config.contains("- 2.5"),
        "the spacing is recorded:\n{config}"
    );
}

#[test]
fn sixteen_bit_pngs_train_at_full_precision() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("xray");
    write_digits(&root, 12, |i, values, class_dir| {
        // The digit on a faint ramp below one 8-bit level: only 16 bits keep it.
        let levels: Vec<u16> = (values.iter().enumerate())
            .map(|(k, v)| (v * 60_000.0) as u16 + (k % 16) as u16 * 10)
            .collect();
        fixtures::write_png16(&class_dir.join(format!("{i}.png")), &levels, 16, 16);
    });
    let (_, config) = train(dir.path(), &root, 16, &[]);
    assert!(config.contains("intensity: range"), "{config}");
    // The cache holds 16-bit samples: two bytes a pixel, one channel.
    let cache = dir.path().join("cache").join("scans");
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(files.len(), 1, "one cache file");
    let len = files[0].as_ref().unwrap().metadata().unwrap().len() as usize;
    assert!(len >= 24 * 16 * 16 * 2, "{len} bytes");
}

#[test]
fn five_channel_tiffs_train_a_five_channel_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cells");
    write_digits(&root, 12, |i, values, class_dir| {
        // Five stains, each the digit at its own brightness.
        let pixels: Vec<u16> = (values.iter())
            .flat_map(|v| (1..=5).map(move |c| (v * 12_000.0) as u16 * c))
            .collect();
        fixtures::write_tiff16::<5>(&class_dir.join(format!("{i}.tif")), &pixels, 16, 16);
    });
    train(dir.path(), &root, 16, &[]);
    let weights = std::fs::read(dir.path().join("run/checkpoint/model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&weights).unwrap();
    // The digits CNN's first convolution, `[out, in, k, k]`.
    let stem = tensors.tensor("encoder.conv1.weight").unwrap();
    assert_eq!(stem.shape()[1], 5, "the stem takes the five channels");
}

#[test]
fn a_manifest_with_unlabelled_rows_pretrains_on_all_and_evaluates_the_labelled() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("study");
    std::fs::create_dir_all(root.join("images")).unwrap();
    let mut manifest = String::from("path,label,split\n");
    for (i, (class, values)) in digits(16, 16).iter().enumerate() {
        let levels: Vec<u16> = values.iter().map(|v| (v * 65_535.0) as u16).collect();
        fixtures::write_png16(&root.join(format!("images/{i}.png")), &levels, 16, 16);
        let (label, split) = match i % 16 {
            0..=3 => ("", ""),
            4..=6 => (*class, "test"),
            _ => (*class, "train"),
        };
        manifest += &format!("images/{i}.png,{label},{split}\n");
    }
    let csv = root.join("labels.csv");
    std::fs::write(&csv, &manifest).unwrap();
    // The online probe cannot learn from unlabelled samples: the run says so and how to fix it.
    let out = dir.path().join("run");
    let base = ["run", "--data", "folder", "--size", "16", "--epochs", "1"];
    let args = [&base[..], &["--root", csv.to_str().unwrap()]].concat();
    let o = ssl(
        dir.path(),
        &[&args[..], &["--out", out.to_str().unwrap()]].concat(),
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("8 of the scans have no label"), "{stderr}");
    assert!(stderr.contains("train.probe_lr=0"), "{stderr}");

    train(dir.path(), &csv, 16, &["--set", "train.probe_lr=0"]);
    let split = std::fs::read_to_string(out.join("split.json")).unwrap();
    let split: serde_json::Value = serde_json::from_str(&split).unwrap();
    let count = |key: &str| split[key].as_array().unwrap().len();
    assert_eq!(
        (count("train"), count("test"), count("unlabeled")),
        (18, 6, 8)
    );
}

#[test]
fn data_inspect_reports_the_collection_and_every_refused_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ct");
    write_digits(&root, 3, |i, values, class_dir| {
        let syntax = fixtures::CT_SYNTAXES[i % 2];
        let stored: Vec<u16> = values.iter().map(|v| (v * 4000.0) as u16).collect();
        let object = fixtures::ct_slice(&stored, 16, 16, syntax);
        fixtures::write_dicom(class_dir, &format!("IM{i}"), object, syntax);
    });
    std::fs::write(root.join("three").join("notes.txt"), "reader's remarks").unwrap();
    let good = std::fs::read(root.join("eight").join("IM3")).unwrap();
    let cut = root.join("eight").join("IM9");
    std::fs::write(&cut, &good[..good.len() - 100]).unwrap();

    let o = ssl(dir.path(), &["data", "inspect", root.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for expected in [
        "6 2D images readable, made 64 × 64",
        "percentile",
        "DICOM",
        "eight",
        "three",
        "[1, 16, 16]",
        "spacing (mm): [0.7, 0.7]",
        "2 files refused",
        "notes.txt",
        "IM9",
    ] {
        assert!(stdout.contains(expected), "no `{expected}` in:\n{stdout}");
    }
    // A run stops at the truncated file, naming it and the way around.
    std::fs::remove_file(root.join("three").join("notes.txt")).unwrap();
    let out = dir.path().join("run");
    let run = ["run", "--data", "folder", "--epochs", "1", "--out"];
    let args = [
        &run[..],
        &[out.to_str().unwrap(), "--root", root.to_str().unwrap()],
    ]
    .concat();
    let o = ssl(dir.path(), &args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("IM9"), "{stderr}");
    assert!(stderr.contains("data.skip_bad"), "{stderr}");
    assert!(!out.join("checkpoint").exists());
}

#[test]
fn skipping_bad_files_trains_on_the_rest_and_lists_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("xray");
    write_digits(&root, 8, |i, values, class_dir| {
        let levels: Vec<u16> = values.iter().map(|v| (v * 65_535.0) as u16).collect();
        fixtures::write_png16(&class_dir.join(format!("{i}.png")), &levels, 16, 16);
    });
    let cut = root.join("three").join("broken.png");
    let good = std::fs::read(root.join("three").join("0.png")).unwrap();
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let out = dir.path().join("run");
    let args = [
        "run",
        "--data",
        "folder",
        "--size",
        "16",
        "--epochs",
        "1",
        "--batch-size",
        "8",
    ];
    let args = [
        &args[..],
        &["--set", "data.skip_bad=true", "--overwrite"],
        &[
            "--root",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    ]
    .concat();
    let o = ssl(dir.path(), &args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("1 files left out"), "{stderr}");
    assert!(stderr.contains("broken.png"), "{stderr}");
    let split = std::fs::read_to_string(out.join("split.json")).unwrap();
    assert!(split.contains("broken.png"), "{split}");
}

#[test]
fn a_manifest_naming_a_missing_file_is_an_error_naming_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("labels.csv");
    let levels = vec![1000u16; 16 * 16];
    fixtures::write_png16(&dir.path().join("a.png"), &levels, 16, 16);
    std::fs::write(&csv, "path,label\na.png,healthy\nb.png,nodule\n").unwrap();
    let o = ssl(dir.path(), &["data", "inspect", csv.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("row 3"), "{stderr}");
    assert!(stderr.contains("b.png"), "{stderr}");
}
