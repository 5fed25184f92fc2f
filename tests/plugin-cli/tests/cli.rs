//! End-to-end tests of the fixture binary that adds an out-of-tree objective to the `ssl` CLI:
//! the objective is listed beside the built-in ones, trains and evaluates. The CLI's own
//! end-to-end tests run the `ssl` binary (`bin/tests/cli.rs`).

use std::process::{Command, Output};

fn ssl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl-plugin"))
        .args(args)
        .env("RAYON_NUM_THREADS", "2")
        .env("SSL_CACHE", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("the fixture binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn lists_builtin_and_out_of_tree_objectives() {
    let o = ssl(&["list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for name in ["vicreg", "simclr", "mean-align"] {
        assert!(s.contains(name), "`ssl list` lacks {name}:\n{s}");
    }
}

#[test]
fn trains_the_out_of_tree_objective_and_evaluates_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = ssl(&[
        "run",
        "--objective",
        "mean-align",
        "--out",
        out.to_str().unwrap(),
        "--set",
        "model.projector=[64, 32]",
        "--set",
        "train.warmup_epochs=0",
        "--epochs",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("raw inputs") && s.contains("random init") && s.contains("mean-align (ours)"),
        "{s}"
    );
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert!(
        metrics.contains("\"align\"")
            && metrics.contains("\"std_hinge\"")
            && metrics.contains("images_per_s")
    );
    assert!(out.join("config.yaml").exists() && out.join("checkpoint/model.safetensors").exists());
    let e = ssl(&[
        "eval",
        out.to_str().unwrap(),
        "--metrics",
        "probe,knn,rankme",
    ]);
    assert!(e.status.success(), "{}", stderr(&e));
    let table = stdout(&e);
    assert!(table.contains("| mean-align (run) |") && table.contains("| k-NN best acc. |"));
    assert!(out.join("eval/eval.json").exists() && out.join("eval/pca.png").exists());
}
