//! `ssl eval --probe sgd` end to end, through the built binary: a one-epoch digits run, then
//! the SGD probe writes its accuracy under the L-BFGS probe's metric names and its record in
//! `eval.json`; a probe name clap does not know lists the valid ones.

use std::process::{Command, Output};

fn ssl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .output()
        .expect("the ssl binary runs")
}

#[test]
fn sgd_probe_writes_eval_json_with_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_s = run.to_str().unwrap();
    let o = ssl(&["run", "--epochs", "1", "--out", run_s]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = dir.path().join("eval");
    let o = ssl(&[
        "eval",
        run_s,
        "--probe",
        "sgd",
        "--probe-epochs",
        "3",
        "--metrics",
        "probe,knn",
        "--out",
        out.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stderr}");
    assert!(
        stdout.contains("| linear probe (balanced acc.) |"),
        "{stdout}"
    );
    assert!(stdout.contains("SGD probe (--probe sgd)"), "{stdout}");
    let eval: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("eval.json")).unwrap()).unwrap();
    let column = &eval["columns"][0];
    let metrics = &column["metrics"];
    for name in ["probe_balanced_accuracy", "probe_accuracy"] {
        let v = metrics[name].as_f64().unwrap_or(-1.0);
        assert!((0.0..=1.0).contains(&v), "{name}: {metrics}");
    }
    assert!(column["probe_c"].is_null(), "{column}");
    let probe = &column["probe"];
    assert_eq!(probe["kind"], "sgd", "{column}");
    assert_eq!(probe["epochs"], 3);
    assert_eq!(probe["milestones"], serde_json::json!([2]));
    assert_eq!(probe["history"].as_array().unwrap().len(), 3);
    assert!(
        probe["augmentation"]
            .as_str()
            .unwrap()
            .starts_with("random resized crop"),
        "{probe}"
    );
}

#[test]
fn sgd_probe_bad_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none");
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--probe", "adam"],
            &["invalid value 'adam' for '--probe <PROBE>'", "lbfgs, sgd"],
        ),
        (
            &["--probe", "sgd", "--probe-epochs", "0"],
            &["--probe-epochs must be at least 1"],
        ),
        (
            &["--probe", "sgd", "--probe-milestones", "80,60"],
            &["--probe-milestones must be strictly increasing"],
        ),
        (
            &[
                "--probe",
                "sgd",
                "--probe-epochs",
                "50",
                "--probe-milestones",
                "60",
            ],
            &["--probe-milestones must lie in 1..50"],
        ),
        (
            &["--probe-lr", "0.3"],
            &["--probe-lr set(s) the SGD probe; add --probe sgd"],
        ),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["eval", missing.to_str().unwrap()];
        args.extend_from_slice(flags);
        let o = ssl(&args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        for text in *expected {
            assert!(stderr.contains(text), "{args:?}: `{text}` not in\n{stderr}");
        }
    }
}
