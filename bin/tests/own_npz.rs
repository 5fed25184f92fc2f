//! A `.npz` of your own in MedMNIST's layout trains end to end through `ssl run`, as a user
//! would give it (`--data FILE.npz`, or `--data npz --root FILE`), and `ssl eval` scores it with
//! MedMNIST's ACC/AUC when `data.task` names its task. Also: every default photo recipe trains
//! on flat images with saturated pixels on black, which used to stop at step 0 with a NaN.

use std::path::Path;
use std::process::{Command, Output};

use ssl_data::npy::NpyData;
use ssl_data::NpzLayout;

/// Runs `ssl` with the words of `line` (the test's paths hold no spaces).
fn ssl(line: &str, cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(line.split(' '))
        .env("SSL_CACHE", cache)
        .output()
        .expect("the ssl binary runs")
}

fn succeeded(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The row `encoder`'s metric `name` in a run's `results.json`.
fn result(run: &Path, encoder: &str, name: &str) -> f64 {
    let text = std::fs::read_to_string(run.join("results.json")).expect("results.json");
    let results: serde_json::Value = serde_json::from_str(&text).unwrap();
    let row = results["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["encoder"] == encoder)
        .unwrap_or_else(|| panic!("no row {encoder} in {text}"));
    row["metrics"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("no {name} in {row}"))
}

/// A class-balanced two-class subset of the digits (3s and 8s, the most alike), 28 px grey,
/// with train and test splits and no val, as a researcher would save their own subset.
fn balanced_subset(path: &Path) {
    let digits = ssl_data::digits(28).unwrap();
    let pick = |digit: u32, skip: usize, n: usize| -> Vec<usize> {
        (0..digits.len())
            .filter(|&i| digits.labels[i] == digit)
            .skip(skip)
            .take(n)
            .collect()
    };
    let split = |skip: usize, n: usize| {
        let (threes, eights) = (pick(3, skip, n), pick(8, skip, n));
        let order: Vec<usize> = threes
            .iter()
            .zip(&eights)
            .flat_map(|(&a, &b)| [a, b])
            .collect();
        let pixels: Vec<u8> = order
            .iter()
            .flat_map(|&i| {
                digits
                    .sample(i)
                    .iter()
                    .map(|v| (v * 255.0).round() as u8)
                    .collect::<Vec<_>>()
            })
            .collect();
        let labels: Vec<u8> = order
            .iter()
            .map(|&i| u8::from(digits.labels[i] == 8))
            .collect();
        (NpyData::Bytes(pixels.into()), NpyData::Bytes(labels.into()))
    };
    let layout = NpzLayout {
        name: "balanced".into(),
        size: 28,
        channels: 1,
        volumetric: false,
        splits: [2 * 120, 0, 2 * 50],
        classes: 2,
        multi_label: false,
    };
    let empty = (
        NpyData::Bytes(Vec::new().into()),
        NpyData::Bytes(Vec::new().into()),
    );
    ssl_data::write_medmnist_npz(path, &layout, [split(0, 120), empty, split(120, 50)]).unwrap();
}

#[test]
fn a_balanced_subset_of_your_own_trains_and_is_scored_with_its_task() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("threes_and_eights.npz");
    balanced_subset(&file);
    let run = dir.path().join("run");
    let out = ssl(
        &format!(
            "run --data {} --epochs 8 --batch-size 32 --set data.task=binary-class --out {}",
            file.display(),
            run.display()
        ),
        dir.path(),
    );
    let table = succeeded(&out, "ssl run --data FILE.npz");
    assert!(table.contains("vicreg (ours)"), "{table}");
    let config = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(
        config.contains("name: npz") && config.contains("size: 28"),
        "{config}"
    );
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("split.json")).unwrap()).unwrap();
    assert_eq!(
        split["train"].as_array().map(Vec::len),
        Some(240),
        "{split}"
    );
    // Pretrained features separate 3s from 8s better than the same network at random init.
    let ours = result(&run, "vicreg (ours)", "probe_balanced_accuracy");
    let random = result(&run, "random init", "probe_balanced_accuracy");
    assert!(
        ours > 0.85 && ours > random,
        "ours {ours}, random init {random}"
    );
    let eval = succeeded(
        &ssl(&format!("eval {}", run.display()), dir.path()),
        "ssl eval",
    );
    assert!(
        eval.contains("MedMNIST ACC (probe)") && eval.contains("MedMNIST AUC (probe)"),
        "{eval}"
    );

    // The same file named as data set `npz` with --root; a wrong --size is refused, naming it.
    let again = dir.path().join("again");
    let out = ssl(
        &format!(
            "run --data npz --root {} --size 32 --epochs 1 --out {}",
            file.display(),
            again.display()
        ),
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("holds 28-pixel images; set --size 28"),
        "{stderr}"
    );
}

/// Mostly flat images (grey or black) with a few saturated primaries, 32 px RGB: the bicubic
/// crop rings below 0 beside them, which the hue jitter then divided by zero.
fn flat_and_saturated(path: &Path) {
    let layout = NpzLayout {
        name: "flat".into(),
        size: 32,
        channels: 3,
        volumetric: false,
        splits: [64, 0, 32],
        classes: 2,
        multi_label: false,
    };
    let split = |n: usize| {
        let mut pixels = vec![0u8; n * 32 * 32 * 3];
        for (i, image) in pixels.chunks_mut(32 * 32 * 3).enumerate() {
            if i % 2 == 1 {
                image.fill(128);
            }
            for k in 0..6 {
                let at = ((i * 37 + k * 101) % (32 * 32)) * 3;
                image[at..at + 3].copy_from_slice(&[0, 0, 0]);
                image[at + (i + k) % 3] = 255;
            }
        }
        let labels: Vec<u8> = (0..n).map(|i| (i % 2) as u8).collect();
        (NpyData::Bytes(pixels.into()), NpyData::Bytes(labels.into()))
    };
    ssl_data::write_medmnist_npz(path, &layout, [split(64), split(0), split(32)]).unwrap();
}

#[test]
fn every_default_photo_recipe_trains_on_flat_and_saturated_images() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flat_saturated.npz");
    flat_and_saturated(&file);
    for recipe in [
        "simclr", "byol", "vicreg", "moco-v2", "icone", "dino", "swav",
    ] {
        let run = dir.path().join(recipe);
        let out = ssl(
            &format!(
                "run --data {} --epochs 1 --batch-size 16 --set data.augment={recipe} --out {}",
                file.display(),
                run.display()
            ),
            dir.path(),
        );
        succeeded(&out, recipe);
    }
}
