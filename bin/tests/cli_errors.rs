//! The `ssl` binary on bad input: every case ends with exit code 1 and a message naming the key
//! and what it may be, before anything trains; a closed stdout ends it quietly.

use std::process::{Command, Output, Stdio};

/// Runs `ssl args` in a fresh directory, so that a run directory made before a refusal (the
/// default is `./runs`) is not left in the source tree.
fn ssl(args: &[&str]) -> Output {
    let cwd = tempfile::tempdir().expect("a temporary directory");
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .current_dir(cwd.path())
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("the ssl binary runs")
}

/// Runs `args`, expecting exit code 1 and every one of `expected` in stderr (no panic).
fn fails_with(args: &[&str], expected: &[&str]) {
    let o = ssl(args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for text in expected {
        assert!(stderr.contains(text), "{args:?}: `{text}` not in\n{stderr}");
    }
}

/// `ssl list | head -1`, with the reader gone before the first line: no panic, no message.
#[test]
fn a_closed_stdout_ends_quietly() {
    for args in [&["list"][..], &["describe", "vicreg"]] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_ssl"))
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .expect("the ssl binary runs");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{args:?}");
        }
    }
}

/// A negative count is a value, refused naming the key it sets (clap's usage error, exit 2),
/// and an empty objective name is named as such.
#[test]
fn negative_counts_and_empty_names_are_refused_naming_the_key() {
    for (flag, key) in [
        ("--epochs", "train.epochs"),
        ("--batch-size", "train.batch_size"),
    ] {
        let o = ssl(&["run", flag, "-1"]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("{key} takes a whole number ≥ 0, got -1")),
            "{flag}: {stderr}"
        );
    }
    fails_with(
        &["run", "--objective", ""],
        &["objective.name is empty", "ssl list"],
    );
}

/// Values out of range, each refused by `ssl run` with its key, value and range.
#[test]
fn out_of_range_values_are_refused_before_training() {
    let cases: &[(&str, &[&str])] = &[
        (
            "train.betas=[0.9, 1.0]",
            &["train.betas[1] must be in [0, 1)", "got 1"],
        ),
        ("train.lr=-0.1", &["train.lr must be > 0", "got -0.1"]),
        (
            "train.min_lr=0.5",
            &["train.min_lr must be in [0, train.lr]", "got 0.5"],
        ),
        (
            "train.weight_decay=-1",
            &["train.weight_decay must be ≥ 0", "got -1"],
        ),
        (
            "train.probe_lr=.nan",
            &["train.probe_lr must be ≥ 0", "got NaN"],
        ),
        (
            "train.warmup_epochs=60",
            &["train.warmup_epochs must be ≤ train.epochs (50)"],
        ),
        (
            "model.mlp=[64, 0]",
            &["model.mlp must list widths ≥ 1", "[64, 0]"],
        ),
        (
            "model.projector=[0]",
            &["model.projector widths must be ≥ 1"],
        ),
        ("eval.knn_k=0", &["eval.knn_k must be ≥ 1"]),
        (
            "data.classes=[3]",
            &["data.classes keeps the single class [3]"],
        ),
    ];
    for (set, expected) in cases {
        fails_with(&["run", "--set", set], expected);
    }
    fails_with(&["run", "--size", "0"], &["data.size must be ≥ 1"]);
    fails_with(
        &["run", "--data", "folder", "--root", "/nonexistent"],
        &["data.root: image folder /nonexistent does not exist"],
    );
}

/// A type error names its key; a later `--set` of a mapping keeps an earlier key inside it, and
/// cannot silently replace one.
#[test]
fn type_errors_name_the_key_and_later_sets_merge() {
    fails_with(
        &["run", "--set", "train.lr=abc"],
        &[r#"train.lr: expected a number, got "abc""#],
    );
    // Merged: the earlier lr reaches validation and is refused there.
    fails_with(
        &["run", "--set", "train.lr=-1", "--set", "train={epochs: 3}"],
        &["train.lr must be > 0", "got -1"],
    );
    fails_with(
        &["run", "--set", "train={lr: 0.1}", "--set", "train=3"],
        &["--set train=3", "`train` holds the keys `{lr: 0.1}`"],
    );
}

/// Too many threads are capped with a warning (here shown before a refused value ends the run).
#[test]
fn thread_counts_are_capped_with_a_warning() {
    fails_with(
        &["run", "--threads", "100000", "--set", "train.lr=0"],
        &["warning: 100000 threads asked for", "train.lr must be > 0"],
    );
}

/// `SSL_BF16_KERNEL` (which bf16 GEMM kernel a CPU run uses) naming no kernel is refused with
/// the names it takes, before the run directory is made.
#[test]
fn an_unknown_bf16_kernel_is_refused() {
    let cwd = tempfile::tempdir().expect("a temporary directory");
    let o = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["run", "--epochs", "1", "--set", "train.precision=bf16"])
        .current_dir(cwd.path())
        .env("RAYON_NUM_THREADS", "1")
        .env("SSL_BF16_KERNEL", "tiles")
        .output()
        .expect("the ssl binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("SSL_BF16_KERNEL=tiles names no bf16 kernel: use one of amx, avx512, f32"),
        "{stderr}"
    );
    assert!(
        !cwd.path().join("runs").exists(),
        "a run directory was made"
    );
}

/// Recipes, grids and generalisation recipes are read up to 1 MiB.
#[test]
fn oversized_config_files_are_refused() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let big = dir.path().join("big.yaml");
    std::fs::write(&big, "# padding\n".repeat(110_000)).expect("written");
    let path = big.to_str().expect("a UTF-8 path");
    let expected = ["is larger than 1 MiB"];
    fails_with(&["run", "--config", path], &expected);
    fails_with(&["compare", path], &expected);
    fails_with(&["generalise", path], &expected);
}

/// The objectives that encode the views' patches themselves (MAE, I-JEPA) refuse an encoder
/// without patches and local crops, and I-JEPA's official blocks on a 4 × 4 grid, naming the
/// fix; the ViT-only keys are refused on another encoder.
#[test]
fn masked_objectives_name_what_they_need() {
    fails_with(
        &["run", "--objective", "mae"],
        &["objective `mae`", "--set model.encoder=vit_t16"],
    );
    fails_with(
        &["run", "--objective", "ijepa"],
        &["objective `ijepa`", "model.encoder `digits_cnn` has none"],
    );
    let vit = ["--encoder", "vit_t16", "--set", "model.patch_size=4"];
    fails_with(
        &[
            &["run", "--objective", "mae", "--local-views", "2"][..],
            &vit,
            &["--set", "train.local_size=8"],
        ]
        .concat(),
        &["--local-views 0"],
    );
    fails_with(
        &[&["run", "--objective", "ijepa", "--views", "1"][..], &vit].concat(),
        &["objective.params.min_keep"],
    );
    for key in ["model.pool=mean", "model.pos_embed=sincos"] {
        fails_with(
            &["run", "--set", key],
            &["model.pos_embed apply to ViT encoders", "`digits_cnn`"],
        );
    }
    fails_with(
        &["run", "--set", "model.pos_embed=fixed"],
        &["unknown variant `fixed`", "learned", "sincos"],
    );
}

/// `eval.encoder: teacher` needs an objective with an EMA teacher and no online probe (which
/// learns the student's features); `ssl eval --encoder` picks a network of a run checkpoint,
/// not of an export.
#[test]
fn evaluating_the_teacher_names_what_it_needs() {
    fails_with(
        &[
            "run",
            "--objective",
            "byol",
            "--set",
            "eval.encoder=teacher",
        ],
        &[
            "eval.encoder: teacher",
            "train.probe_lr 0.1",
            "--set train.probe_lr=0",
        ],
    );
    fails_with(
        &[
            "run",
            "--set",
            "eval.encoder=teacher",
            "--set",
            "train.probe_lr=0",
        ],
        &["objective `vicreg` keeps none", "byol", "dino", "ijepa"],
    );
    fails_with(
        &["run", "--set", "eval.encoder=ema"],
        &["unknown variant `ema`", "student", "teacher"],
    );
    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("model.safetensors");
    std::fs::write(dir.path().join("config.yaml"), "objective:\n  name: byol\n").unwrap();
    std::fs::write(&export, b"").unwrap();
    fails_with(
        &["eval", export.to_str().unwrap(), "--encoder", "teacher"],
        &["is an exported encoder", "give the run directory"],
    );
}
