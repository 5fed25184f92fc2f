//! `ssl push` and `ssl pull` of a run (`ssl_hub::publish`): the staged repository (recipe,
//! licence, card, evaluation file), its push to and pull from the fake Hub of ssl-net's tests, and
//! the card's code snippets loading the export back in Candle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

// The Hub client's tests (net/tests/hub/) use the rest of it.
#[allow(dead_code)]
#[path = "../../net/tests/hub/fake.rs"]
mod fake;

use fake::{assert_mentions, error_text, FakeHub};

/// A finished run in `dir` without training: the config resolved from `sets` (plus `out`), an
/// encoder for samples of `shape` with perturbed weights and batch-norm statistics saved as its
/// checkpoint, `split.json` (the digits' real split for digits, else a shape-only one),
/// `results.json` and a training log. Returns the config and the encoder.
fn fixture_run(
    dir: &Path,
    sets: &[&str],
    shape: &[usize],
) -> (ssl_train::config::RunConfig, Box<dyn ssl_models::Encoder>) {
    use candle_core::{Device, Tensor};
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for set in sets {
        ssl_train::config::apply_set(&mut root, set).unwrap();
    }
    ssl_train::config::apply_set(&mut root, &format!("out='{}'", dir.display())).unwrap();
    let cfg = ssl_train::config::RunConfig::from_yaml_value(root).unwrap();
    let data = match cfg.data.name.as_str() {
        "digits" => ssl_train::setup::data(&cfg).unwrap(),
        _ => ssl_train::setup::DataSplit::shape_only(shape, 40),
    };
    let store = ssl_core::ParamStore::new(cfg.train.seed);
    let encoder = ssl_train::setup::encoder(
        &cfg,
        &data.dataset,
        store.var_builder(&Device::Cpu).pp("encoder"),
    )
    .unwrap();
    for (name, var) in store.vars() {
        // Scaled weights (the activations keep their size) and shifted biases and statistics.
        let noise = || Tensor::rand(-0.5f32, 0.5, var.shape(), &Device::Cpu).unwrap();
        let value = match name.ends_with("running_var") {
            true => (noise() + 1.0).unwrap(),
            false => {
                let factor = ((noise() * 0.2).unwrap() + 1.0).unwrap();
                let scaled = (var.as_tensor() * factor).unwrap();
                (scaled + (noise() * 0.1).unwrap()).unwrap()
            }
        };
        var.set(&value).unwrap();
    }
    std::fs::create_dir_all(dir).unwrap();
    ssl_train::checkpoint::save(
        &dir.join("checkpoint"),
        &store.tensors(),
        &Default::default(),
        &ssl_train::checkpoint::TrainerState {
            epochs_done: 1,
            step: 3,
        },
    )
    .unwrap();
    std::fs::write(
        dir.join("config.yaml"),
        serde_yaml::to_string(&cfg).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("split.json"),
        serde_json::to_string(&data).unwrap(),
    )
    .unwrap();
    let row = |name: &str, acc: f64| {
        json!({"encoder": name, "metrics": {"probe_balanced_accuracy": acc, "knn_accuracy": acc,
               "rankme": 9.5, "effective_rank": 7.25}})
    };
    let results = json!({"seconds": 1.0, "rows": [row("raw inputs", 0.9), row("random init", 0.5),
                         row("vicreg", 0.95)]});
    std::fs::write(dir.join("results.json"), results.to_string()).unwrap();
    std::fs::write(
        dir.join("metrics.jsonl"),
        "{\"epoch\": 1, \"online_probe_accuracy\": 0.8}\n",
    )
    .unwrap();
    (cfg, encoder)
}

/// A quick offline suite (the metrics `ssl eval` computes, LiDAR on fewer views).
fn quick_suite() -> ssl_experiments::offline::SuiteConfig {
    ssl_experiments::offline::SuiteConfig {
        lidar_samples: 64,
        lidar_views: 4,
        ..ssl_hub::publish::default_suite(ssl_data::DataSource::Digits)
    }
}

/// The keys of a JSON object, sorted.
fn keys(value: &Value) -> Vec<String> {
    let map = value.as_object().expect("a JSON object");
    let mut keys: Vec<String> = map.keys().cloned().collect();
    keys.sort();
    keys
}

/// Every string in a JSON document.
fn strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.push(k.clone());
            strings(v, out);
        }),
        _ => {}
    }
}

#[test]
fn staged_repository_has_no_local_paths_and_the_eval_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let init = tmp.path().join("weights").join("start.safetensors");
    fixture_run(
        &run,
        &[
            "train.epochs=1",
            "train.seed=7",
            "data.split_seed=3",
            &format!("data.root='{}'", tmp.path().join("data").display()),
            &format!("model.init='{}'", init.display()),
        ],
        &[],
    );
    let opts = ssl_hub::publish::StageOptions {
        license: None,
        suite: Some(quick_suite()),
    };
    let dir = ssl_hub::publish::stage(&run, "user/digits-vicreg", &opts).unwrap();
    let local = tmp.path().display().to_string();
    for file in ["config.yaml", "README.md", "eval.json"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(
            !text.contains(&local),
            "{file} holds the local path {local}"
        );
    }
    // The recipe: neutral `out`, no `data.root`, the init file by name; it still loads.
    let recipe: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("config.yaml")).unwrap()).unwrap();
    assert_eq!(recipe["out"], json!(""));
    assert!(recipe["data"].get("root").is_none(), "{recipe}");
    assert_eq!(recipe["model"]["init"], json!("start.safetensors"));
    ssl_train::config::RunConfig::load_run(&dir).unwrap();
    let card = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert_mentions(
        &card,
        &[
            "license: cc-by-4.0",
            "`data.root` (a local directory) is removed",
            "`model.init` (a local file) is reduced to its name",
            "| encoder | model seed | split seed | test images |",
            // Digits: 1797 images, a stratified 20 % held out.
            "| random init | 7 | 3 | 360 |",
            "| raw inputs | – | 3 | 360 |",
            "Optical Recognition of Handwritten Digits",
        ],
    );
    assert!(!card.contains("datasets:"), "no Hub data set for digits");
    // eval.json: `ssl eval`'s report, field for field, with the repository's weights file.
    let eval: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("eval.json")).unwrap()).unwrap();
    let report = ssl_experiments::offline::Report {
        columns: vec![ssl_experiments::offline::Column {
            label: "a".into(),
            weights: "w".into(),
            knn_sweep: vec![(20, 0.07, 0.5)],
            ..Default::default()
        }],
        cka: vec![("a".into(), "b".into(), 0.5)],
        trees: Vec::new(),
    };
    let written = serde_json::to_value(&report).unwrap();
    assert_eq!(keys(&eval), keys(&written));
    let column = &eval["columns"][0];
    assert_eq!(keys(column), keys(&written["columns"][0]));
    assert_eq!(eval["columns"].as_array().unwrap().len(), 1);
    assert_eq!(column["weights"], json!("model.safetensors"));
    assert_eq!(column["label"], json!("vicreg (hf://user/digits-vicreg)"));
    for metric in [
        "probe_balanced_accuracy",
        "knn_best_accuracy",
        "lidar",
        "online_probe_accuracy",
    ] {
        assert!(column["metrics"][metric].is_number(), "{metric}: {column}");
    }
    let cell = &column["knn_sweep"][0];
    assert!(
        cell[0].is_u64() && cell[1].is_f64() && cell[2].is_f64(),
        "{cell}"
    );
    let mut texts = Vec::new();
    strings(&eval, &mut texts);
    assert!(texts.iter().all(|s| !s.starts_with('/')), "{texts:?}");
    // `ssl eval`'s other outputs come along; the export is the checkpoint's encoder.
    for file in ["knn.csv", "pca.png", "model.safetensors"] {
        assert!(dir.join(file).is_file(), "{file} not staged");
    }
}

#[test]
fn push_flags_check_the_licence_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    fixture_run(&run, &["train.epochs=1"], &[]);
    let push = |extra: &[&str]| {
        let mut args = vec!["ssl", "push", run.to_str().unwrap(), "--repo", "user/name"];
        args.extend(extra);
        args.push("--dry-run");
        let cli = <ssl::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
        ssl::cli::execute(cli)
    };
    let err = error_text(push(&["--license", "cc-by-4"]));
    assert_mentions(
        &err,
        &["--license `cc-by-4`", "cc-by-4.0", "not a licence id"],
    );
    let err = error_text(push(&["--license", ""]));
    assert_mentions(&err, &["not a licence id"]);
    assert!(!run.join("hub").exists(), "nothing staged on a bad licence");
    // An image folder's terms are unknown to the run: --license is required.
    let folder = tmp.path().join("folder-run");
    fixture_run(
        &folder,
        &["data.name=folder", "data.size=16", "data.root=/images"],
        &[3, 16, 16],
    );
    let cli = <ssl::cli::Cli as clap::Parser>::try_parse_from([
        "ssl",
        "push",
        folder.to_str().unwrap(),
        "--repo",
        "user/name",
        "--dry-run",
    ])
    .unwrap();
    let err = error_text(ssl::cli::execute(cli));
    assert_mentions(&err, &["`folder` data", "pass --license"]);
    assert!(!folder.join("hub").exists());
}

#[test]
fn push_of_a_staged_run_uploads_the_card_eval_and_weights() {
    let hub = FakeHub::start();
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    fixture_run(&run, &["train.epochs=1"], &[]);
    let opts = ssl_hub::publish::StageOptions {
        license: Some("MIT".into()),
        suite: Some(quick_suite()),
    };
    let commit = ssl_hub::publish::push(
        &run,
        "user/digits",
        &opts,
        &hub.options(&tmp.path().join("c")),
    )
    .unwrap();
    assert!(!commit.is_empty());
    let files = hub.head_files("user/digits");
    // (The fake Hub, like the real one, starts a repository with a .gitattributes.)
    let names: Vec<&str> = files
        .keys()
        .map(String::as_str)
        .filter(|name| *name != ".gitattributes")
        .collect();
    assert_eq!(
        names,
        [
            "README.md",
            "config.yaml",
            "eval.json",
            "knn.csv",
            "model.safetensors",
            "pca.png"
        ]
    );
    let card = String::from_utf8(files["README.md"].clone()).unwrap();
    assert_mentions(&card, &["license: mit\n", "The weights: `mit`"]);
    let pulled =
        ssl_hub::publish::pull("user/digits", &hub.options(&tmp.path().join("c"))).unwrap();
    for file in ssl_hub::publish::FILES {
        assert_eq!(
            std::fs::read(pulled.join(file)).unwrap(),
            files[file],
            "{file}"
        );
    }
}

/// Per encoder: a fixture run, its export and card, and `reference.safetensors` (an input and
/// the Candle encoder's eval-mode features of it) in `SSL_CARD_SNIPPETS/<case>/` when that is set
/// (for `tools/card_snippet.py`, which runs the card's Python code on them), else in a
/// temporary directory. Checks that the export, read the way the card's Rust code reads it
/// (`VarBuilder::from_mmaped_safetensors` into a fresh encoder), gives those features.
#[test]
fn card_snippet_fixtures_load_back_in_candle() {
    use candle_core::{DType, Device, Tensor};
    let tmp = tempfile::tempdir().unwrap();
    let out = std::env::var_os("SSL_CARD_SNIPPETS")
        .map_or_else(|| tmp.path().join("snippets"), PathBuf::from);
    let cases: [(&str, &[&str], &[usize]); 7] = [
        ("digits_cnn", &["data.size=16"], &[1, 16, 16]),
        ("mlp", &["data.name=gmm", "model.encoder=mlp"], &[2]),
        (
            "resnet18_cifar",
            &["model.encoder=resnet18", "model.stem=cifar"],
            &[1, 16, 16],
        ),
        (
            "resnet34_gray",
            &["model.encoder=resnet34", "data.size=32"],
            &[1, 32, 32],
        ),
        (
            "resnet50_rgb",
            &[
                "data.name=bloodmnist",
                "data.size=28",
                "model.encoder=resnet50",
            ],
            &[3, 28, 28],
        ),
        (
            "resnet18_3d",
            &["data.name=organmnist3d", "data.size=28"],
            &[1, 28, 28, 28],
        ),
        (
            "vit_t16",
            &[
                "data.name=bloodmnist",
                "data.size=32",
                "model.encoder=vit_t16",
            ],
            &[3, 32, 32],
        ),
    ];
    for (case, sets, shape) in cases {
        let run = tmp.path().join(case);
        let (cfg, encoder) = fixture_run(&run, sets, shape);
        let dir = out.join(case);
        std::fs::create_dir_all(&dir).unwrap();
        let exported =
            ssl_train::export::export_encoder(&run, &dir.join("model.safetensors")).unwrap();
        let weights = ssl_train::checkpoint::load_tensors(&exported.path).unwrap();
        let (recipe, notes) = ssl_hub::card::published_config(&cfg);
        let card = ssl_hub::card::model_card(&ssl_hub::card::Card {
            repo: &format!("user/{case}"),
            cfg: &recipe,
            recipe_notes: &notes,
            license: "mit",
            results: &ssl_train::results::Results {
                seconds: 1.0,
                phases: Default::default(),
                rows: Vec::new(),
            },
            split: &ssl_hub::card::Split {
                seed: 0,
                train: vec![0, 1],
                test: vec![2],
            },
            eval: &ssl_experiments::offline::Report {
                columns: Vec::new(),
                cka: Vec::new(),
                trees: Vec::new(),
            },
            weights: &weights,
        })
        .unwrap();
        std::fs::write(dir.join("README.md"), &card).unwrap();
        let mut input_shape = vec![2];
        input_shape.extend(shape);
        let x = Tensor::randn(0f32, 1.0, input_shape, &Device::Cpu).unwrap();
        let expected = encoder.forward_t(&x, false).unwrap();
        candle_core::safetensors::save(
            &HashMap::from([
                ("input".to_string(), x.clone()),
                ("output".to_string(), expected.clone()),
            ]),
            dir.join("reference.safetensors"),
        )
        .unwrap();
        // The export read back as the card's Rust code reads it.
        let vb = unsafe {
            candle_nn::VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &Device::Cpu,
            )
            .unwrap()
        };
        let dataset = ssl_train::setup::DataSplit::shape_only(shape, 1).dataset;
        let loaded = ssl_train::setup::encoder(&cfg, &dataset, vb).unwrap();
        let got = loaded.forward_t(&x, false).unwrap();
        let diff = (got - &expected)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{case}: reloaded export differs by {diff}");
        let python = card
            .split("```python\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap_or_else(|| panic!("{case}: no Python block"));
        assert!(python.contains("strict=True"), "{case}");
        let dim = expected.dims()[1];
        assert!(
            python.contains(&format!("assert features.shape == (1, {dim})")),
            "{case}: {python}"
        );
    }
}
