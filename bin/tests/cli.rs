//! End-to-end tests of the `ssl` CLI: listing, training, resume, evaluation, export and the
//! bad-input errors of a run (those refused before anything trains: `cli_errors.rs`).

use std::path::Path;
use std::process::{Command, Output};

/// Threads of every `ssl` these tests start. The harness runs as many tests at once as there are
/// cores, so one thread a run fills them without contention: on 2 cores this file took 155 s so,
/// and 212 s with two threads a run (back to back; 137 and 238 s before Candle's waits yielded,
/// vendor/README.md).
const THREADS: &str = "1";

fn ssl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .env("RAYON_NUM_THREADS", THREADS)
        .env("SSL_CACHE", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("the ssl binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A short digits run: small projector, 2 epochs unless `extra` sets `train.epochs`.
fn quick(out: &Path, objective: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "run",
        "--objective",
        objective,
        "--out",
        out.to_str().unwrap(),
        "--set",
        "model.projector=[64, 32]",
        "--set",
        "train.warmup_epochs=0",
    ];
    if !extra.iter().any(|a| a.starts_with("train.epochs=")) {
        args.extend(["--epochs", "2"]);
    }
    args.extend_from_slice(extra);
    ssl(&args)
}

/// `ssl eval RUN --metrics probe --out OUT`: its stderr and the run's metrics in eval.json.
fn probe_metrics(run: &Path, out: &Path) -> (String, serde_json::Value) {
    let o = ssl(&[
        "eval",
        run.to_str().unwrap(),
        "--metrics",
        "probe",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
    (stderr(&o), report["columns"][0]["metrics"].clone())
}

#[test]
fn describe_shows_keys_defaults_and_limits() {
    let o = ssl(&["describe", "vicreg"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("lambda") && s.contains("25"), "{s}");
    assert!(s.contains("batch size ≥ 2"), "{s}");
    // Every listed objective describes itself with its limits.
    let list = stdout(&ssl(&["list"]));
    let names: Vec<&str> = list
        .lines()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(names.len() >= 20, "{list}");
    for name in names {
        let o = ssl(&["describe", name]);
        assert!(o.status.success(), "describe {name}: {}", stderr(&o));
        assert!(stdout(&o).contains("limits: views"), "{name}");
    }
    // The pixel objectives say they need a ViT's patches.
    for name in ["mae", "ijepa"] {
        let s = stdout(&ssl(&["describe", name]));
        assert!(s.contains("encodes the views itself"), "{name}: {s}");
    }
}

#[test]
fn resume_reproduces_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let split = dir.path().join("split");
    let a = quick(&whole, "vicreg", &["--set", "train.epochs=3"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let b = quick(
        &split,
        "vicreg",
        &[
            "--set",
            "train.epochs=3",
            "--set",
            "train.stop_after_epochs=1",
        ],
    );
    assert!(b.status.success(), "{}", stderr(&b));
    assert!(stdout(&b).contains("stopped early"));
    let c = quick(&split, "vicreg", &["--set", "train.epochs=3", "--resume"]);
    assert!(c.status.success(), "{}", stderr(&c));
    let read = |p: &Path| std::fs::read(p.join("checkpoint/model.safetensors")).unwrap();
    assert_eq!(
        read(&whole),
        read(&split),
        "resumed weights differ from the uninterrupted run"
    );
}

/// An EMA teacher (BYOL), a teacher with a queue (MoCo v2), LeJEPA's per-step random slices,
/// MAE's per-step masks and decoder, and I-JEPA's masks, predictor and EMA target encoder,
/// killed with SIGKILL mid-run and resumed, end with the weights, teacher and queue of an
/// uninterrupted run. A 640-image subset, 10 steps an epoch: the kill lands after the first
/// epoch's checkpoint, two epochs before the end. MAE and I-JEPA train a ViT-T with 4-px
/// patches on one view, with a light decoder and predictor.
#[test]
fn killed_teacher_runs_resume_to_the_uninterrupted_weights() {
    let dir = tempfile::tempdir().unwrap();
    const VIT: [&str; 3] = [
        "model.encoder=vit_t16",
        "model.patch_size=4",
        "train.views=1",
    ];
    // Each objective, its settings, and a checkpoint tensor (prefix) that only it keeps.
    for (objective, extra, kept) in [
        ("byol", &["objective.params.predictor_hidden=64"][..], "teacher."),
        ("moco", &["objective.params.queue_size=256"], "objective.queue"),
        ("lejepa", &["objective.params.slices=64"], "projector."),
        (
            "mae",
            &[
                VIT[0],
                VIT[1],
                VIT[2],
                "objective.params={decoder_dim: 32, decoder_depth: 1, decoder_heads: 2}",
            ],
            "objective.decoder_pred.",
        ),
        (
            "ijepa",
            &[
                VIT[0],
                VIT[1],
                VIT[2],
                "objective.params={predictor_dim: 32, predictor_depth: 1, predictor_heads: 2, target_scale: [0.25, 0.35], targets: 2, min_keep: 1}",
            ],
            "teacher.encoder.blocks.",
        ),
    ] {
        let args = |out: &Path| -> Vec<String> {
            [
                "run",
                "--objective",
                objective,
                "--epochs",
                "3",
                "--batch-size",
                "64",
                "--out",
                out.to_str().unwrap(),
                "--set",
                "data.train_size=640",
                "--set",
                "model.projector=[64, 32]",
                "--set",
                "train.checkpoint_every=1",
            ]
            .into_iter()
            .chain(extra.iter().flat_map(|set| ["--set", set]))
            .map(String::from)
            .collect()
        };
        let run = |out: &Path, more: &[&str]| {
            let mut a = args(out);
            a.extend(more.iter().map(|s| s.to_string()));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            ssl(&a)
        };
        let whole = dir.path().join(format!("{objective}-whole"));
        let a = run(&whole, &[]);
        assert!(a.status.success(), "{}", stderr(&a));

        let killed = dir.path().join(format!("{objective}-killed"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_ssl"))
            .args(args(&killed))
            .env("RAYON_NUM_THREADS", THREADS)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let state = killed.join("checkpoint/trainer_state.json");
        while !state.exists() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{objective}: the run ended before its first checkpoint"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let finished_early = child.try_wait().unwrap().is_some();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            !finished_early,
            "{objective}: the run finished before the kill"
        );
        let c = run(&killed, &["--resume"]);
        assert!(c.status.success(), "{objective}: {}", stderr(&c));
        let tensors = |p: &Path| {
            let bytes = std::fs::read(p.join("checkpoint/model.safetensors")).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let mut names: Vec<String> = st.names().into_iter().map(|n| n.to_string()).collect();
            names.sort();
            names
                .into_iter()
                .map(|n| (n.clone(), st.tensor(&n).unwrap().data().to_vec()))
                .collect::<Vec<_>>()
        };
        let (a, b) = (tensors(&whole), tensors(&killed));
        assert!(
            a.iter().any(|(n, _)| n.starts_with(kept)),
            "{objective}: no {kept}"
        );
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            assert!(
                x == y,
                "{objective}: `{name}` differs after kill and resume"
            );
        }
        assert_eq!(a.len(), b.len());
        assert_logged_once(&whole, &killed);
    }
}

/// The step records of `metrics.jsonl`: (step, loss bits).
fn step_losses(run: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r.get("loss").is_some())
        .map(|r| {
            (
                r["step"].as_u64().unwrap(),
                r["loss"].as_f64().unwrap().to_bits(),
            )
        })
        .collect()
}

/// A killed and resumed run logged every step once, as the uninterrupted run did, in
/// `metrics.jsonl`, `spectrum.csv` and TensorBoard (whose scalars equal `metrics.jsonl`'s).
fn assert_logged_once(whole: &Path, resumed: &Path) {
    let (a, b) = (step_losses(whole), step_losses(resumed));
    assert_eq!(a, b, "metrics.jsonl after kill and resume");
    let steps: Vec<u64> = b.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (0..steps.len() as u64).collect::<Vec<_>>());
    let spectrum = |p: &Path| std::fs::read_to_string(p.join("spectrum.csv")).unwrap();
    assert_eq!(spectrum(whole), spectrum(resumed), "spectrum.csv");
    let board = ssl_report::tensorboard::read_dir(&resumed.join("tb")).unwrap();
    let mut checked = 0;
    for line in std::fs::read_to_string(resumed.join("metrics.jsonl"))
        .unwrap()
        .lines()
    {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = record["step"].as_u64().unwrap();
        // An epoch's monitor is drawn at the epoch's last step, whose weights it measured.
        let at = match record.get("epoch_end") {
            Some(_) => step - 1,
            None => step,
        };
        for (key, value) in record.as_object().unwrap() {
            if key == "step" || key.starts_with("epoch") {
                continue;
            }
            if let Some(v) = value.as_f64() {
                // TensorBoard's simple_value is an f32.
                assert_eq!(board.scalar_at(key, at), [v as f32], "{key} at step {at}");
                checked += 1;
            }
        }
    }
    assert_eq!(
        board.scalars.len(),
        checked,
        "TensorBoard holds each value once"
    );
    assert!(board.images.iter().any(|i| i.tag == "spectrum"));
}

/// `ssl` run in `cwd`.
fn ssl_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .current_dir(cwd)
        .env("RAYON_NUM_THREADS", THREADS)
        .env("SSL_CACHE", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("the ssl binary runs")
}

/// Without --out every run gets its own directory and runs/latest follows the newest; an
/// explicit --out that holds a run needs --resume or --overwrite.
#[test]
fn runs_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let one_epoch = [
        "run",
        "--epochs",
        "1",
        "--set",
        "model.projector=[64, 32]",
        "--set",
        "train.warmup_epochs=0",
        "--set",
        "eval.spectrum_every=0",
    ];
    let first = ssl_in(dir.path(), &one_epoch);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = ssl_in(dir.path(), &one_epoch);
    assert!(second.status.success(), "{}", stderr(&second));
    let mut runs: Vec<String> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "latest")
        .collect();
    runs.sort();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|r| r.starts_with("vicreg-")), "{runs:?}");
    let latest = std::fs::read_link(dir.path().join("runs/latest")).unwrap();
    assert!(
        stdout(&second).contains(latest.to_str().unwrap()),
        "{}",
        stdout(&second)
    );
    assert!(dir.path().join("runs/latest/results.json").exists());

    let out = dir.path().join("mine");
    let out_s = out.to_str().unwrap();
    let with_out = |more: &[&str]| {
        ssl_in(
            dir.path(),
            &[&one_epoch[..], &["--out", out_s], more].concat(),
        )
    };
    assert!(with_out(&[]).status.success());
    let config = std::fs::read(out.join("config.yaml")).unwrap();
    let again = with_out(&["--seed", "1"]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already holds a run") && stderr(&again).contains("--overwrite"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read(out.join("config.yaml")).unwrap(),
        config,
        "a refused run wrote"
    );
    std::fs::write(out.join("notes.txt"), "the user's").unwrap();
    let replaced = with_out(&["--seed", "1", "--overwrite"]);
    assert!(replaced.status.success(), "{}", stderr(&replaced));
    let text = std::fs::read_to_string(out.join("config.yaml")).unwrap();
    assert!(text.contains("seed: 1"), "{text}");
    assert!(
        out.join("notes.txt").exists(),
        "--overwrite removes only the run's files"
    );
    let o = ssl_in(dir.path(), &["run", "--overwrite"]);
    assert!(
        !o.status.success() && stderr(&o).contains("--out"),
        "{}",
        stderr(&o)
    );
}

/// A resume that would change the result is refused, naming the keys and leaving the run as
/// it was; allowed explicitly, the change is recorded with its step.
#[test]
fn resume_is_refused_when_the_configuration_changes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = quick(
        &out,
        "vicreg",
        &[
            "--set",
            "train.epochs=2",
            "--set",
            "train.stop_after_epochs=1",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let before: Vec<(String, Vec<u8>)> = [
        "config.yaml",
        "metrics.jsonl",
        "checkpoint/model.safetensors",
    ]
    .iter()
    .map(|f| (f.to_string(), std::fs::read(out.join(f)).unwrap()))
    .collect();
    let unchanged = |what: &str| {
        for (f, bytes) in &before {
            assert_eq!(
                &std::fs::read(out.join(f)).unwrap(),
                bytes,
                "{what} changed {f}"
            );
        }
    };
    let resume =
        |more: &[&str]| ssl(&[&["run", "--out", out.to_str().unwrap(), "--resume"], more].concat());
    let o = resume(&["--set", "train.lr=0.01", "--batch-size", "64"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("train.lr: 0.001 → 0.01") && e.contains("train.batch_size: 128 → 64"),
        "{e}"
    );
    assert!(
        e.contains("--allow-changed train.batch_size,train.lr"),
        "{e}"
    );
    unchanged("a refused resume");
    let o = resume(&["--epochs", "3", "--allow-changed", "train.lr"]);
    assert!(
        !o.status.success() && stderr(&o).contains("does not change train.lr"),
        "{}",
        stderr(&o)
    );
    unchanged("a wrong allowance");
    let o = resume(&["--allow-changed", "train.epochs"]);
    assert!(!o.status.success(), "an allowance with no change");
    // Allowed: trains on, and config.yaml says what changed from which step.
    let o = resume(&["--epochs", "3", "--allow-changed", "train.epochs"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(out.join("config.yaml")).unwrap();
    assert!(
        text.contains("history:") && text.contains("key: train.epochs"),
        "{text}"
    );
    let steps = step_losses(&out);
    let per_epoch = steps.len() / 3;
    assert!(text.contains(&format!("step: {per_epoch}")), "{text}");
    // A flag and a --set that disagree are refused, not ordered silently.
    let o = ssl(&["run", "--epochs", "2", "--set", "train.epochs=3"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--epochs and --set train.epochs"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_objective_suggests_the_closest() {
    let o = ssl(&["run", "--objective", "vicrg"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did you mean `vicreg`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn unknown_config_keys_are_errors() {
    let o = ssl(&["run", "--set", "train.learning_rate=0.1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown field `learning_rate`"),
        "{}",
        stderr(&o)
    );
    let o = ssl(&["run", "--set", "objective.params.lamda=3", "--epochs", "1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown field `lamda`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn views_and_batch_the_objective_cannot_take_are_refused() {
    let o = ssl(&["run", "--batch-size", "1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("needs batch size ≥ 2") && e.contains("--batch-size 2"),
        "{e}"
    );
    let o = ssl(&["run", "--objective", "simclr", "--views", "1"]);
    assert!(
        stderr(&o).contains("needs at least 2 views"),
        "{}",
        stderr(&o)
    );
    // Undefined at these V / B: each refusal names the limit and the fix before training.
    for (objective, flag, value, expect) in [
        ("corinfomax", "--views", "4", "at most 2 views"),
        ("frossl", "--batch-size", "1", "needs batch size ≥ 2"),
        ("barlow-twins", "--batch-size", "1", "needs batch size ≥ 2"),
        ("ivne", "--batch-size", "1", "needs batch size ≥ 2"),
        ("dcl", "--batch-size", "1", "needs batch size ≥ 2"),
        ("wmse", "--views", "2", "w_size"),
        (
            "supcon",
            "--batch-size",
            "1",
            "projector, whose batch norm needs at least 2",
        ),
    ] {
        let o = ssl(&["run", "--objective", objective, flag, value]);
        assert!(
            !o.status.success(),
            "{objective} {flag} {value} was accepted"
        );
        let e = stderr(&o);
        assert!(e.contains(expect), "{objective} {flag} {value}: {e}");
    }
    // A last partial batch of one instance would reach the projector's batch norm alone.
    let o = ssl(&[
        "run",
        "--set",
        "data.train_size=129",
        "--set",
        "train.drop_last=false",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("the last batch of every epoch would hold 1 instance"),
        "{e}"
    );
    // Local crops count against an objective's view limit and need images.
    let o = ssl(&["run", "--objective", "corinfomax", "--local-views", "2"]);
    assert!(stderr(&o).contains("at most 2 views"), "{}", stderr(&o));
    let o = ssl(&[
        "run",
        "--data",
        "gmm",
        "--set",
        "model.encoder=mlp",
        "--local-views",
        "2",
    ]);
    let e = stderr(&o);
    assert!(e.contains("local crops need 2D images"), "{e}");
    let o = ssl(&["run", "--set", "data.classes=[0, 12]"]);
    let e = stderr(&o);
    assert!(e.contains("data.classes names class 12"), "{e}");
}

#[test]
fn multi_crop_and_class_subsets_train() {
    let dir = tempfile::tempdir().unwrap();
    // Two 16-px global views and four 7-px local crops in every step.
    let o = quick(dir.path(), "vicreg", &["--local-views", "4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let config = std::fs::read_to_string(dir.path().join("config.yaml")).unwrap();
    assert!(config.contains("local_views: 4"), "{config}");
    // A teacher sees the global crops only (BYOL's loss refuses any other teacher view count).
    let byol = dir.path().join("byol");
    let o = quick(
        &byol,
        "byol",
        &[
            "--local-views",
            "2",
            "--set",
            "objective.params.predictor_hidden=64",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // One class half: only its classes are trained and evaluated.
    let half = dir.path().join("half");
    let o = quick(&half, "vicreg", &["--set", "data.classes=[0, 1, 2, 3, 4]"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(half.join("split.json")).unwrap()).unwrap();
    let digits = ssl_data::digits(16).unwrap();
    for part in ["train", "test"] {
        let ids = split[part].as_array().unwrap();
        assert!(!ids.is_empty());
        assert!(ids
            .iter()
            .all(|i| digits.labels[i.as_u64().unwrap() as usize] < 5));
    }
}

#[test]
fn icone_trains_at_batch_one_and_refuses_what_it_cannot_take() {
    let o = ssl(&["run", "--objective", "icone", "--views", "1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("view_view") && e.contains("--views 2"), "{e}");

    // B = 1 (the paper's claim): the table supplies the repulsion; a 40-image subset.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("icone");
    let subset = [
        "--batch-size",
        "1",
        "--set",
        "data.train_size=40",
        "--set",
        "data.split_seed=0",
    ];
    let o = quick(&out, "icone", &subset);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("| icone (ours) |"), "{}", stdout(&o));
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("split.json")).unwrap()).unwrap();
    assert_eq!(split["train"].as_array().unwrap().len(), 40);

    // Resuming on another subset is refused as a changed configuration; allowed, it is still
    // refused, since the table has one row per training instance.
    let mut other = subset.to_vec();
    other[3] = "data.train_size=60";
    other.push("--resume");
    let o = quick(&out, "icone", &other);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("data.train_size: 40 → 60"), "{e}");
    other.extend(["--allow-changed", "data.train_size"]);
    let o = quick(&out, "icone", &other);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("cannot resume") && e.contains("objective.table") && e.contains("[40, 128]"),
        "{e}"
    );
}

#[test]
fn frossl_at_eight_views_logs_the_eigenvalue_trajectories() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("frossl");
    let o = quick(
        &out,
        "frossl",
        &["--views", "8", "--set", "eval.spectrum_every=3"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = std::fs::read_to_string(out.join("spectrum.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("step,view,rank,eigenvalue,normalized"));
    let rows: Vec<Vec<f64>> = lines
        .map(|l| l.split(',').map(|f| f.parse().unwrap()).collect())
        .collect();
    // 1437 training digits / 128 = 12 steps an epoch (last one partial), 2 epochs: steps 0, 3, …,
    // 21; 8 views; top 20.
    assert_eq!(rows.len(), 8 * 8 * 20, "{csv}");
    for view in 0..8 {
        let first: Vec<&Vec<f64>> = rows
            .iter()
            .filter(|r| r[0] == 0.0 && r[1] == view as f64)
            .collect();
        let normalized: Vec<f64> = first.iter().map(|r| r[4]).collect();
        assert!(
            normalized.windows(2).all(|w| w[0] >= w[1]),
            "{normalized:?}"
        );
        assert!(normalized.iter().sum::<f64>() <= 1.0 + 1e-6);
    }
    let png = std::fs::read(out.join("spectrum.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn compare_runs_a_grid_reuses_finished_runs_and_reports_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cmp");
    let args = [
        "compare",
        "--objectives",
        "vicreg,corinfomax",
        "--views",
        "2,3",
        "--seeds",
        "0,1",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "train.epochs=1",
        "--set",
        "model.projector=[32,16]",
        "--set",
        "eval.spectrum_every=0",
    ];
    let o = ssl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let md = std::fs::read_to_string(out.join("compare.md")).unwrap();
    for row in [
        "| vicreg | 2 | 128 | 2 |",
        "| vicreg | 3 | 128 | 2 |",
        "| corinfomax | 2 | 128 | 2 |",
        "| raw inputs |",
        "| random init |",
    ] {
        assert!(md.contains(row), "missing `{row}` in\n{md}");
    }
    assert!(
        md.contains("corinfomax V=3 B=128") && md.contains("at most 2 views"),
        "{md}"
    );
    let csv = std::fs::read_to_string(out.join("compare.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 + 4, "{csv}");
    assert_eq!(
        &std::fs::read(out.join("compare.png")).unwrap()[..4],
        b"\x89PNG"
    );
    // A second call trains nothing: every finished cell is reused.
    let results = out.join("runs/vicreg/v2-b128-s0/results.json");
    let before = std::fs::metadata(&results).unwrap().modified().unwrap();
    let o = ssl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        std::fs::metadata(&results).unwrap().modified().unwrap(),
        before
    );
    assert_eq!(std::fs::read_to_string(out.join("compare.md")).unwrap(), md);
}

#[test]
fn missing_and_corrupt_files_are_clear_errors() {
    let o = ssl(&["run", "--config", "/nonexistent/recipe.yaml"]);
    assert!(
        stderr(&o).contains("cannot read config file /nonexistent/recipe.yaml"),
        "{}",
        stderr(&o)
    );
    let o = ssl(&["eval", "/nonexistent/run"]);
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    assert!(quick(&out, "vicreg", &["--set", "train.epochs=1"])
        .status
        .success());
    std::fs::write(
        out.join("checkpoint/model.safetensors"),
        b"not a safetensors file",
    )
    .unwrap();
    let o = ssl(&["eval", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("corrupt or truncated"),
        "{}",
        stderr(&o)
    );
    let bad_yaml = dir.path().join("bad.yaml");
    std::fs::write(&bad_yaml, "train: [unclosed").unwrap();
    let o = ssl(&["run", "--config", bad_yaml.to_str().unwrap()]);
    assert!(stderr(&o).contains("is not valid YAML"), "{}", stderr(&o));
}

#[test]
fn a_non_finite_loss_stops_training_naming_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = quick(
        &out,
        "vicreg",
        &[
            "--set",
            "train.epochs=3",
            "--set",
            "train.optimizer=sgd",
            "--set",
            "train.lr=1e30",
            "--set",
            "train.checkpoint_every=1",
        ],
    );
    assert!(!o.status.success(), "a diverging run must fail");
    let e = stderr(&o);
    assert!(e.contains("non-finite") && e.contains("at step"), "{e}");
    assert!(!out.join("results.json").exists());
}

/// A MedMNIST dataset trains end to end from a local `.npz` — the digits packed in RetinaMNIST's
/// exact layout (RGB, 5 ordinal classes), read by the same code as the official files — and
/// `ssl eval` reports the official ACC and AUC of the probe.
#[test]
fn medmnist_files_train_and_evaluate_with_the_official_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("medmnist");
    std::fs::create_dir(&root).unwrap();
    ssl_data::write_digits_as_medmnist(&root.join("retinamnist.npz"), "retinamnist", 28).unwrap();
    let root_set = format!("data.root={}", root.display());
    let run = dir.path().join("run");
    let args = ["--data", "retinamnist", "--size", "28", "--set", &root_set];
    let o = quick(
        &run,
        "vicreg",
        &[&args[..], &["--set", "train.epochs=1"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let config = std::fs::read_to_string(run.join("config.yaml")).unwrap();
    assert!(
        config.contains("augment: icone") && config.contains("normalize: imagenet"),
        "MedMNIST 2D trains with IConE's pipeline and ImageNet's statistics:\n{config}"
    );
    let (_, metrics) = probe_metrics(&run, &dir.path().join("eval"));
    let (acc, auc) = (
        metrics["medmnist_acc"].as_f64().unwrap(),
        metrics["medmnist_auc"].as_f64().unwrap(),
    );
    // Five classes (digit mod 5) of real digits: far above chance (ACC 0.2, AUC 0.5).
    assert!(acc > 0.6 && auc > 0.8, "ACC {acc}, AUC {auc}");
    let accuracy = metrics["probe_accuracy"].as_f64().unwrap();
    assert!((acc - accuracy).abs() < 1e-12, "ACC is the top-1 accuracy");

    // Refusals name the problem and the fix.
    let refused = |extra: &[&str], expected: &[&str]| {
        let o = ssl(&[
            &["run", "--out", dir.path().join("x").to_str().unwrap()],
            extra,
        ]
        .concat());
        assert!(!o.status.success());
        for part in expected {
            assert!(stderr(&o).contains(part), "{part:?} in:\n{}", stderr(&o));
        }
    };
    refused(
        &["--data", "bloodmnist", "--size", "28", "--set", &root_set],
        &["bloodmnist.npz not found", "zenodo.org/records/10519652"],
    );
    refused(
        &["--data", "retinamnist", "--set", &root_set],
        &["not 16", "--size 28"],
    );
    refused(
        &["--set", "data.augment=simclr2"],
        &["unknown variant `simclr2`", "icone3d"],
    );
    refused(
        &["--data", "bloodmnst"],
        &["did you mean `bloodmnist`", "digits, gmm"],
    );
}

/// ChestMNIST (14 findings per image, here the digits' stand-in flags: odd digits have some)
/// trains on whether an image has any finding, and `ssl eval` scores every finding with its
/// own probe: MedMNIST's mean per-finding AUC and ACC over all flags at 0.5.
#[test]
fn chestmnist_trains_on_any_finding_and_evaluates_every_finding() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("medmnist");
    std::fs::create_dir(&root).unwrap();
    ssl_data::write_digits_as_medmnist(&root.join("chestmnist.npz"), "chestmnist", 28).unwrap();
    let root_set = format!("data.root={}", root.display());
    let run = dir.path().join("run");
    let o = quick(
        &run,
        "vicreg",
        &[
            "--data",
            "chestmnist",
            "--size",
            "28",
            "--set",
            &root_set,
            "--set",
            "train.epochs=1",
            "--set",
            "data.train_size=200",
            "--set",
            "data.subset_test_fraction=0.3",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("results.json")).unwrap()).unwrap();
    let raw = &results["rows"][0];
    assert_eq!(raw["encoder"], "raw inputs");
    // Odd against even digits, on raw pixels: well above the 50 % of a single-class guess.
    let balanced = raw["metrics"]["probe_balanced_accuracy"].as_f64().unwrap();
    assert!(balanced > 0.7, "{balanced}");

    let (_, metrics) = probe_metrics(&run, &dir.path().join("eval"));
    let (acc, auc) = (
        metrics["medmnist_acc"].as_f64().unwrap(),
        metrics["medmnist_auc"].as_f64().unwrap(),
    );
    // Each finding is a function of the digit: its probe ranks positives well above chance.
    assert!(auc > 0.75, "AUC {auc}");
    let accuracy = metrics["probe_accuracy"].as_f64().unwrap();
    assert!(
        acc > 0.5 && (acc - accuracy).abs() > 1e-9,
        "ACC {acc} is over 14 flags per image, not the any-finding accuracy {accuracy}"
    );
}

/// The online probe trains on detached features with optimiser slots of its own: its learning
/// rate changes no encoder or projector weight (so `ssl compare` may reuse runs across it).
#[test]
fn the_online_probe_leaves_the_encoder_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let weights = |probe_lr: &str| {
        let run = dir.path().join(probe_lr);
        let set = format!("train.probe_lr={probe_lr}");
        let o = quick(&run, "vicreg", &["--set", "train.epochs=1", "--set", &set]);
        assert!(o.status.success(), "{}", stderr(&o));
        let bytes = std::fs::read(run.join("checkpoint/model.safetensors")).unwrap();
        let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut named: Vec<(String, Vec<u8>)> = tensors
            .tensors()
            .into_iter()
            .filter(|(name, _)| !name.starts_with("probe."))
            .map(|(name, view)| (name, view.data().to_vec()))
            .collect();
        named.sort();
        let probe = tensors.tensor("probe.weight").unwrap().data().to_vec();
        (named, probe)
    };
    let (slow, slow_probe) = weights("0.001");
    let (fast, fast_probe) = weights("0.3");
    assert!(slow.iter().any(|(name, _)| name.starts_with("encoder.")));
    assert_eq!(slow, fast);
    assert_ne!(slow_probe, fast_probe);
}

/// MAE and I-JEPA train in bf16 (finite losses every step), and their export holds the ViT
/// encoder alone: exactly the checkpoint's `encoder.*` tensors, none of the decoder's, the
/// predictor's or the EMA target encoder's.
#[test]
fn masked_objectives_train_in_bf16_and_export_the_encoder_alone() {
    let dir = tempfile::tempdir().unwrap();
    for (objective, params) in [
        ("mae", "{decoder_dim: 32, decoder_depth: 1, decoder_heads: 2}"),
        (
            "ijepa",
            "{predictor_dim: 32, predictor_depth: 1, predictor_heads: 2, target_scale: [0.25, 0.35], targets: 2, min_keep: 1}",
        ),
    ] {
        let run = dir.path().join(objective);
        let params = format!("objective.params={params}");
        let o = quick(
            &run,
            objective,
            &[
                "--encoder",
                "vit_t16",
                "--views",
                "1",
                "--set",
                "model.patch_size=4",
                "--set",
                "train.precision=bf16",
                "--set",
                &params,
                "--set",
                "train.epochs=1",
            ],
        );
        assert!(o.status.success(), "{objective}: {}", stderr(&o));
        let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
        let losses: Vec<f64> = metrics
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
            .collect();
        assert!(!losses.is_empty(), "{objective}: no step logged");
        assert!(losses.iter().all(|l| l.is_finite()), "{objective}: {losses:?}");

        let o = ssl(&["export", run.to_str().unwrap()]);
        assert!(o.status.success(), "{objective}: {}", stderr(&o));
        let exported = std::fs::read(run.join("export/model.safetensors")).unwrap();
        let exported = safetensors::SafeTensors::deserialize(&exported).unwrap();
        let mut keys: Vec<&str> = exported.names();
        keys.sort_unstable();
        let checkpoint = std::fs::read(run.join("checkpoint/model.safetensors")).unwrap();
        let checkpoint = safetensors::SafeTensors::deserialize(&checkpoint).unwrap();
        let mut encoder: Vec<&str> = checkpoint
            .names()
            .into_iter()
            .filter_map(|k| k.strip_prefix("encoder."))
            .collect();
        encoder.sort_unstable();
        assert_eq!(keys, encoder, "{objective}");
        assert!(keys.iter().any(|k| k.starts_with("blocks.")), "{keys:?}");
        assert!(
            checkpoint
                .names()
                .iter()
                .any(|k| k.starts_with("objective.") || k.starts_with("teacher.")),
            "{objective}: the checkpoint should hold the decoder / predictor and teacher"
        );
    }
}

#[test]
fn export_writes_the_encoder_alone_with_pytorch_keys_and_a_staged_repo_evaluates_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    assert!(quick(&run, "vicreg", &["--set", "train.epochs=1"])
        .status
        .success());
    let o = ssl(&["export", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(run.join("export/model.safetensors")).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut keys: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
    keys.sort();
    // The state-dict keys of the same network in PyTorch: conv{i} (no bias), bn{i}, fc.
    let mut expected: Vec<String> = (1..=3)
        .flat_map(|i| {
            let bn = [
                "weight",
                "bias",
                "running_mean",
                "running_var",
                "num_batches_tracked",
            ];
            std::iter::once(format!("conv{i}.weight"))
                .chain(bn.into_iter().map(move |k| format!("bn{i}.{k}")))
        })
        .chain(["fc.weight".into(), "fc.bias".into()])
        .collect();
    expected.sort();
    assert_eq!(keys, expected);
    // PyTorch counts one batch per train-mode forward: every step forwards 2 views.
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("checkpoint/trainer_state.json")).unwrap(),
    )
    .unwrap();
    let tracked = tensors.tensor("bn1.num_batches_tracked").unwrap();
    assert_eq!(tracked.dtype(), safetensors::Dtype::I64);
    assert_eq!(tracked.shape(), &[] as &[usize]);
    let forwards = i64::from_le_bytes(tracked.data().try_into().unwrap());
    assert_eq!(forwards, 2 * state["step"].as_i64().unwrap());
    let metadata = header.metadata().clone().unwrap();
    assert_eq!(metadata["architecture"], "digits_cnn");
    assert_eq!(metadata["objective"], "vicreg");
    assert_eq!(metadata["format"], "pt");
    assert!(!metadata["commit"].is_empty());

    // The repository `ssl push` would upload, staged locally: encoder, config, eval, card.
    let o = ssl(&[
        "push",
        run.to_str().unwrap(),
        "--repo",
        "me/digits-vicreg",
        "--dry-run",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let staged = run.join("hub");
    let card = std::fs::read_to_string(staged.join("README.md")).unwrap();
    assert!(
        card.starts_with("---\nlibrary_name: candle-ssl\n"),
        "{card}"
    );
    for part in [
        "- vicreg",
        "license: cc-by-4.0",
        "| vicreg (ours) |",
        "`bn1.running_mean`",
    ] {
        assert!(card.contains(part), "the card lacks {part:?}:\n{card}");
    }
    // The digits are on no Hub dataset: the card names none.
    assert!(!card.contains("datasets:"), "{card}");
    let eval_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(staged.join("eval.json")).unwrap()).unwrap();
    // `ssl eval`'s schema: one column per checkpoint, its metrics by name.
    assert_eq!(
        eval_json["columns"].as_array().unwrap().len(),
        1,
        "{eval_json}"
    );
    assert!(
        eval_json["columns"][0]["metrics"]["rankme"].is_number(),
        "{eval_json}"
    );
    // The exported encoder evaluates exactly as the run's checkpoint does.
    let metrics = |source: &Path, out: &Path| {
        let o = ssl(&[
            "eval",
            source.to_str().unwrap(),
            "--metrics",
            "probe,knn,rankme,uniformity",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
        report["columns"][0]["metrics"].clone()
    };
    let mut from_run = metrics(&run, &dir.path().join("eval-run"));
    // Only the run directory has the online probe: its logged accuracy, and the same recomputed
    // offline from the checkpoint's probe weights on the eval-mode features (issue 9: within
    // 0.5 pt; the features are the trainer's, so it is exact).
    let mut online = |key: &str| {
        from_run
            .as_object_mut()
            .unwrap()
            .remove(key)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("the run's eval lacks {key:?}"))
    };
    let logged = online("online_probe_accuracy");
    let recomputed = online("online_probe_recomputed");
    assert!(
        (logged - recomputed).abs() <= 0.005,
        "logged {logged} vs recomputed {recomputed}"
    );
    assert_eq!(from_run, metrics(&staged, &dir.path().join("eval-export")));
    assert!(from_run["probe_balanced_accuracy"].as_f64().unwrap() > 0.5);
}

#[test]
fn eval_puts_checkpoints_side_by_side_with_every_metric_and_caches_features() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    assert!(quick(&a, "vicreg", &["--set", "train.epochs=1"])
        .status
        .success());
    assert!(quick(&b, "simclr", &["--set", "train.epochs=1"])
        .status
        .success());
    let out = dir.path().join("side-by-side");
    let args = [
        "eval",
        a.to_str().unwrap(),
        "--compare",
        b.to_str().unwrap(),
        "--lidar-samples",
        "100",
        "--lidar-views",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = ssl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    for row in [
        "| metric | vicreg (a) | simclr (b) |",
        "| probe C |",
        "| LiDAR |",
        "| view alignment ↓ |",
        "| silhouette |",
        "| k-means NMI |",
        "| k-means ARI |",
        "| Rand index, level 1 (3 clusters) |",
        "| Rand index, level 3 (10 clusters) |",
        "linear CKA(vicreg (a), simclr (b)) = 0.",
        "Ward trees of vicreg (a) and simclr (b): LCA Pearson ",
    ] {
        assert!(table.contains(row), "the table lacks {row:?}:\n{table}");
    }
    let csv = std::fs::read_to_string(out.join("knn.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 36, "{csv}");
    assert!(out.join("pca.png").exists());
    // Features were cached beside each checkpoint; a second evaluation reads them back.
    let cached = std::fs::read_dir(a.join("checkpoint/features"))
        .unwrap()
        .count();
    assert_eq!(cached, 1);
    let again = ssl(&args);
    assert_eq!(stdout(&again), table);

    let bad = ssl(&["eval", a.to_str().unwrap(), "--metrics", "probe,lidr"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown metric `lidr`"),
        "{}",
        stderr(&bad)
    );
    let tree = dir.path().join("tree.yaml");
    std::fs::write(&tree, "[[0, 1, 2], [1, 3]]").unwrap();
    let bad = ssl(&[
        "eval",
        a.to_str().unwrap(),
        "--metrics",
        "hierarchy",
        "--hierarchy",
        tree.to_str().unwrap(),
    ]);
    let e = stderr(&bad);
    assert!(
        e.contains("tree.yaml") && e.contains("class id 1 appears more than once"),
        "{e}"
    );
}

/// SAG-VICReg's generalisation protocol as one command: two class halves, both encoders embed
/// the first half, their trees are compared; finished runs are reused.
#[test]
fn generalise_trains_both_halves_and_tabulates_tree_similarity() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("halves.yaml");
    std::fs::write(
        &recipe,
        format!(
            "objectives: [vicreg]\nseeds: [0]\nhalves: [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]\n\
             set: ['train.epochs=1', 'model.projector=[64, 32]']\nout: '{}'\n",
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let o = ssl(&["generalise", recipe.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = stdout(&o);
    assert!(
        table.contains("| objective | LCA Pearson | LCA Spearman | LCA Kendall τ-b |"),
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("| vicreg |")).unwrap();
    let values: Vec<f64> = row
        .split('|')
        .skip(2)
        .filter_map(|c| c.split('±').next()?.trim().parse().ok())
        .collect();
    assert_eq!(values.len(), 5, "{row}");
    assert!(values.iter().all(|v| (-1.0..=1.0).contains(v)), "{row}");
    let config = |half: &str| {
        std::fs::read_to_string(
            dir.path()
                .join(format!("out/{half}/runs/vicreg/v2-b128-s0/config.yaml")),
        )
        .unwrap()
    };
    assert!(config("half-a").contains("- 4\n") && !config("half-a").contains("- 5\n"));
    assert!(config("half-b").contains("- 5\n") && !config("half-b").contains("- 4\n"));
    assert!(dir.path().join("out/generalise.csv").exists());
    // A second call reuses both runs and prints the same table.
    let again = ssl(&["generalise", recipe.to_str().unwrap()]);
    assert_eq!(stdout(&again), table);
}

#[test]
fn trains_from_an_image_folder_and_needs_its_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("digits-folder");
    // The digits as greyscale PNGs in the ImageNet layout: 24 train and 8 val images per class.
    let digits = ssl_data::digits(16).unwrap();
    let mut seen = [0usize; 10];
    for i in 0..digits.len() {
        let label = digits.labels[i] as usize;
        let split = match seen[label] {
            0..24 => "train",
            24..32 => "val",
            _ => continue,
        };
        seen[label] += 1;
        let pixels: Vec<u8> = digits
            .sample(i)
            .iter()
            .map(|v| (v * 255.0).round() as u8)
            .collect();
        let path = root.join(format!("{split}/digit{label}/{i:04}.png"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        image::GrayImage::from_raw(16, 16, pixels)
            .unwrap()
            .save(&path)
            .unwrap();
    }
    let out = dir.path().join("run");
    let root_arg = root.to_str().unwrap();
    let o = quick(
        &out,
        "vicreg",
        &["--data", "folder", "--root", root_arg, "--size", "16"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(results.to_string().contains("probe"), "{results}");
    let split: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("split.json")).unwrap()).unwrap();
    // The folder's own split: 240 training images, then its 80 val images as the test set.
    assert_eq!(split["train"].as_array().unwrap().len(), 240);
    assert_eq!(split["test"].as_array().unwrap()[0], 240);

    let o = ssl(&["run", "--data", "folder", "--epochs", "1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("needs its directory: set data.root (or --root PATH)"));
}

/// Names (without shapes) of a committed state-dict listing of `models/tests/fixtures`.
fn fixture_keys(file: &str) -> Vec<String> {
    let path = format!(
        "{}/../models/tests/fixtures/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut keys: Vec<String> = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('\t').map(|(k, _)| k.to_string()))
        .collect();
    keys.sort();
    keys
}

/// Every encoder family trains an objective end to end on the CPU: ResNet-18 (CIFAR stem, with
/// gradient accumulation) on digits, ViT-T/16 on digits upsampled to 32 px, the 3D ResNet-18
/// on digit volumes. The ResNet's export carries torchvision's keys, and `--init` starts a
/// run from it or refuses it for another architecture.
#[test]
fn resnet_vit_and_3d_resnet_train_end_to_end_and_init_loads_exports() {
    let dir = tempfile::tempdir().unwrap();
    let small = ["--set", "data.train_size=96", "--batch-size", "32"];
    let resnet = ["--encoder", "resnet18", "--set", "model.stem=cifar"];
    let run = dir.path().join("resnet");
    let o = quick(
        &run,
        "vicreg",
        &[&resnet[..], &small, &["--set", "train.accumulate=2"]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // 96 instances in batches of 32, two per optimiser step: one step in each of 2 epochs.
    let steps = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"loss\""))
        .count();
    assert_eq!(steps, 2);

    let o = ssl(&["export", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = run.join("export/model.safetensors");
    let bytes = std::fs::read(&exported).unwrap();
    let mut keys: Vec<String> = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap()
        .names()
        .into_iter()
        .map(str::to_string)
        .collect();
    keys.sort();
    let mut torchvision = fixture_keys("torchvision_resnet18.tsv");
    torchvision.retain(|k| !k.starts_with("fc."));
    assert_eq!(keys, torchvision);

    let init = ["--init", exported.to_str().unwrap()];
    let o = quick(
        &dir.path().join("init"),
        "vicreg",
        &[&resnet[..], &small, &init].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("initialised 100 encoder tensors") && stderr(&o).contains("skipped 20"),
        "{}",
        stderr(&o)
    );
    let o = quick(
        &dir.path().join("refused"),
        "vicreg",
        &[
            &["--encoder", "resnet34", "--set", "model.stem=cifar"][..],
            &init,
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("does not fit the resnet34 encoder"),
        "{}",
        stderr(&o)
    );

    let o = quick(
        &dir.path().join("vit"),
        "icone",
        &[&["--encoder", "vit_t16", "--size", "32"][..], &small].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));

    let root = dir.path().join("medmnist");
    std::fs::create_dir(&root).unwrap();
    ssl_data::write_digits_as_medmnist(&root.join("organmnist3d.npz"), "organmnist3d", 28).unwrap();
    let root_set = format!("data.root={}", root.display());
    let o = quick(
        &dir.path().join("volumes"),
        "icone",
        &[
            &["--data", "organmnist3d", "--size", "28", "--set", &root_set][..],
            &small,
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let config = std::fs::read_to_string(dir.path().join("volumes/config.yaml")).unwrap();
    assert!(
        config.contains("encoder: resnet18_3d")
            && config.contains("augment: icone3d")
            && config.contains("normalize: none"),
        "MedMNIST 3D trains IConE's 3D ResNet-18 under its 3D pipeline:\n{config}"
    );
    // The stand-in's labels (digit mod 11) leave class 10 empty: no AUC, said so; ACC stands.
    let (notes, metrics) = probe_metrics(
        &dir.path().join("volumes"),
        &dir.path().join("volumes-eval"),
    );
    assert!(
        notes.contains("no MedMNIST AUC") && notes.contains("class 10"),
        "{notes}"
    );
    assert!(metrics["medmnist_acc"].as_f64().is_some(), "{metrics}");
    assert!(metrics.get("medmnist_auc").is_none(), "{metrics}");
    // A 2D recipe on volumes is refused by name.
    let o = quick(
        &dir.path().join("simclr3d"),
        "icone",
        &[
            &["--data", "organmnist3d", "--size", "28", "--set", &root_set][..],
            &["--encoder", "resnet18_3d", "--set", "data.augment=simclr"],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("data.augment") && stderr(&o).contains("[C, H, W]"),
        "{}",
        stderr(&o)
    );
    // A 2D encoder on volumes names the one that fits.
    let o = quick(
        &dir.path().join("wrong"),
        "icone",
        &[
            &["--data", "organmnist3d", "--size", "28", "--set", &root_set][..],
            &["--encoder", "resnet18"],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("resnet18_3d"), "{}", stderr(&o));
}
