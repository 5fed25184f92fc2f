//! The card's sections, licences and snippets, checked against a run's records.

use super::*;
use ssl_train::config::apply_set;
use std::collections::BTreeMap;

fn config(sets: &[&str]) -> RunConfig {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for set in sets {
        apply_set(&mut root, set).unwrap();
    }
    RunConfig::from_yaml_value(root).unwrap()
}

/// The encoder tensors of `cfg` for samples of `shape`, named as an export names them.
fn weights(cfg: &RunConfig, shape: &[usize]) -> HashMap<String, Tensor> {
    let store = ssl_core::ParamStore::new(0);
    let data = ssl_train::setup::DataSplit::shape_only(shape, 1);
    let vb = store.var_builder(&candle_core::Device::Cpu);
    ssl_train::setup::encoder(cfg, &data.dataset, vb.pp("encoder")).unwrap();
    store
        .tensors()
        .into_iter()
        .map(|(k, t)| (k["encoder.".len()..].to_string(), t))
        .collect()
}

fn card(cfg: &RunConfig, shape: &[usize], license: &str) -> String {
    let (recipe, notes) = published_config(cfg);
    let rows =
        ["raw inputs", "random init", "vicreg"].map(|encoder| ssl_train::results::ResultRow {
            encoder: encoder.into(),
            metrics: BTreeMap::from([("knn_accuracy".to_string(), 0.5)]),
        });
    model_card(&Card {
        repo: "user/name",
        cfg: &recipe,
        recipe_notes: &notes,
        license,
        results: &Results {
            seconds: 1.0,
            phases: BTreeMap::new(),
            rows: rows.to_vec(),
        },
        split: &Split {
            seed: 11,
            train: (0..30).collect(),
            test: (0..12).collect(),
        },
        eval: &Report {
            columns: Vec::new(),
            cka: Vec::new(),
            trees: Vec::new(),
        },
        weights: &weights(cfg, shape),
    })
    .unwrap()
}

/// The block of `card` fenced as `lang`.
fn block<'a>(card: &'a str, lang: &str) -> &'a str {
    let rest = card.split(&format!("```{lang}\n")).nth(1).expect(lang);
    rest.split("```").next().unwrap()
}

#[test]
fn licence_comes_from_the_data_set_unless_given() {
    let of = |data: &str, given: Option<&str>| license(DataSource::parse(data)?, given);
    assert_eq!(of("digits", None).unwrap(), "cc-by-4.0");
    assert_eq!(of("bloodmnist", None).unwrap(), "cc-by-4.0");
    assert_eq!(of("organmnist3d", None).unwrap(), "cc-by-4.0");
    assert_eq!(of("dermamnist", None).unwrap(), "cc-by-nc-4.0");
    assert_eq!(of("gmm", None).unwrap(), "apache-2.0");
    // The flag wins, in any case, and is the only way for a folder.
    assert_eq!(of("digits", Some("MIT")).unwrap(), "mit");
    assert_eq!(
        of("folder", Some(" CC-BY-SA-4.0 ")).unwrap(),
        "cc-by-sa-4.0"
    );
    let err = of("folder", None).unwrap_err().to_string();
    assert!(err.contains("pass --license"), "{err}");
    for bad in ["Apache 2", "", "cc-by"] {
        let err = of("digits", Some(bad)).unwrap_err().to_string();
        assert!(err.contains("not a licence id the Hub knows"), "{err}");
        assert!(err.contains("cc-by-4.0"), "lists the known ids: {err}");
    }
    // The card's front matter and licence section say it.
    let digits = card(&config(&[]), &[1, 16, 16], "cc-by-4.0");
    assert!(digits.contains("\nlicense: cc-by-4.0\n"), "{digits}");
    assert!(digits.contains("Optical Recognition of Handwritten Digits"));
    let derma = card(
        &config(&["data.name=dermamnist"]),
        &[3, 28, 28],
        "cc-by-nc-4.0",
    );
    assert!(derma.contains("\nlicense: cc-by-nc-4.0\n"));
    assert!(derma.contains("DermaMNIST is CC BY-NC 4.0"));
}

#[test]
fn datasets_names_medmnist_on_the_hub_and_nothing_else() {
    let of = |name| hub_dataset(DataSource::parse(name).unwrap());
    assert_eq!(of("pathmnist"), Some(MEDMNIST_HUB_DATASET));
    assert_eq!(of("digits"), None);
    assert_eq!(of("folder"), None);
    let medmnist = card(
        &config(&["data.name=bloodmnist"]),
        &[3, 28, 28],
        "cc-by-4.0",
    );
    assert!(
        medmnist.contains("datasets:\n- albertvillanova/medmnist-v2\nmetrics:"),
        "{medmnist}"
    );
    for (sets, shape) in [
        (&["data.name=digits"][..], &[1, 16, 16][..]),
        (&["data.name=gmm", "model.encoder=mlp"], &[2]),
    ] {
        let text = card(&config(sets), shape, "mit");
        assert!(!text.contains("datasets:"), "{text}");
    }
}

#[test]
fn published_recipe_has_no_local_paths() {
    let mut cfg = config(&[
        "out=/home/me/runs/vicreg-1",
        "data.name=bloodmnist",
        "data.root=/home/me/medmnist",
        "model.encoder=resnet18",
        "model.init=/home/me/weights/resnet18.safetensors",
    ]);
    cfg.history.push(ssl_train::config::ConfigChange {
        key: "data.root".into(),
        from: "/home/me/old".into(),
        to: "/home/me/medmnist".into(),
        step: 10,
    });
    let (published, notes) = published_config(&cfg);
    let yaml = serde_yaml::to_string(&published).unwrap();
    assert!(!yaml.contains("/home/me"), "{yaml}");
    assert_eq!(published.out, PathBuf::new());
    assert_eq!(published.data.root, None);
    assert_eq!(
        published.model.init.as_deref(),
        Some("resnet18.safetensors")
    );
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes[1].contains("looked up in ~/.medmnist (`ssl data download bloodmnist`)"),
        "{notes:?}"
    );
    let text = card(&cfg, &[3, 28, 28], "cc-by-4.0");
    assert!(!text.contains("/home/me"), "{text}");
    assert!(text.contains("Local paths of the run were taken out"));
    // Published weights by name and a run without paths are kept as they are.
    let named = config(&["model.encoder=resnet50", "model.init=torchvision:resnet50"]);
    let (published, notes) = published_config(&named);
    assert_eq!(published, named);
    assert!(notes.is_empty());
    assert_eq!(neutral_init("weights/r.safetensors"), "r.safetensors");
    assert_eq!(
        neutral_init("/w/timm:vit.safetensors"),
        "timm:vit.safetensors"
    );
    let folder = config(&["data.name=folder", "data.root=/data/imagenet"]);
    assert!(published_config(&folder).1[0].contains("--root DIR"));
    // A benchmark set's archive is looked up where `ssl data download` puts it.
    let cifar = config(&["data.name=cifar10", "data.size=32", "data.root=/data/cifar"]);
    let note = &published_config(&cifar).1[0];
    assert!(
        note.contains("looked up in ~/.cache/candle-ssl/data (`ssl data download cifar10`)"),
        "{note}"
    );
}

#[test]
fn table_gives_seeds_and_test_set_size() {
    let text = card(&config(&["train.seed=5"]), &[1, 16, 16], "mit");
    assert!(
        text.contains("| encoder | model seed | split seed | test images |"),
        "{text}"
    );
    assert!(
        text.contains("| raw inputs | – | 11 | 12 | – | 50.0 % |"),
        "{text}"
    );
    assert!(text.contains("| random init | 5 | 11 | 12 |"), "{text}");
    assert!(text.contains("the 12 held-out test images"));
    assert!(text.contains("the 30 training images"));
    assert!(text.contains("model seed 5, split seed 11"));
}

#[test]
fn snippets_follow_the_encoder() {
    // (config settings, sample shape, Python parts, Rust parts)
    type Case<'a> = (&'a [&'a str], &'a [usize], &'a [&'a str], &'a [&'a str]);
    let cases: [Case; 7] = [
        (
            &[],
            &[1, 16, 16],
            &[
                "class DigitsCnn",
                "encoder = DigitsCnn(1)",
                "torch.zeros(1, 1, 16, 16)",
            ],
            &[
                "DigitsCnn::new(INPUT[1], vb)",
                "INPUT: &[usize] = &[1, 1, 16, 16]",
            ],
        ),
        (
            &["data.name=gmm", "model.encoder=mlp"],
            &[2],
            &["encoder = Mlp(2, [64, 64, 2])", "(1, 2), features.shape"],
            &["const WIDTHS: &[usize] = &[64, 64, 2];", "Mlp::new("],
        ),
        (
            &["model.encoder=resnet18", "model.stem=cifar"],
            &[1, 16, 16],
            &[
                "torchvision.models.resnet18(weights=None)",
                "encoder.conv1 = torch.nn.Conv2d(1, 64, 3, 1, 1, bias=False)",
                "encoder.maxpool = torch.nn.Identity()",
                "(1, 512)",
            ],
            &[
                "const STEM: Stem = Stem::Cifar;",
                "const DEPTH: usize = 18;",
            ],
        ),
        (
            &[
                "data.name=bloodmnist",
                "data.size=28",
                "model.encoder=resnet50",
            ],
            &[3, 28, 28],
            &["torchvision.models.resnet50(weights=None)", "(1, 2048)"],
            &[
                "const STEM: Stem = Stem::Imagenet;",
                "const DIM: usize = 2048;",
            ],
        ),
        (
            &["model.encoder=resnet34"],
            &[1, 16, 16],
            &["encoder.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)"],
            &["const DEPTH: usize = 34;"],
        ),
        (
            &["data.name=organmnist3d", "data.size=28"],
            &[1, 28, 28, 28],
            &["encoder = ResNet18_3d(1)", "torch.zeros(1, 1, 28, 28, 28)"],
            &[
                "ResNetConfig::resnet18_3d()",
                "INPUT: &[usize] = &[1, 1, 28, 28, 28]",
            ],
        ),
        (
            &[
                "data.name=bloodmnist",
                "data.size=32",
                "model.encoder=vit_t16",
            ],
            &[3, 32, 32],
            &[
                "timm.create_model(\"vit_tiny_patch16_224\", num_classes=0, in_chans=3, \
                 dynamic_img_size=True)",
                "(1, 192)",
            ],
            &["const SIZE: fn() -> VitConfig = VitConfig::tiny;"],
        ),
    ];
    for (sets, shape, python, rust) in cases {
        let text = card(&config(sets), shape, "mit");
        let (py, rs) = (block(&text, "python"), block(&text, "rust"));
        for part in python {
            assert!(py.contains(part), "{sets:?}: `{part}` missing from\n{py}");
        }
        assert!(py.contains("hf_hub_download(\"user/name\", \"model.safetensors\")"));
        assert!(py.contains("strict=True"));
        for part in rust {
            assert!(rs.contains(part), "{sets:?}: `{part}` missing from\n{rs}");
        }
        assert!(rs.contains("fn main() -> anyhow::Result<()> {"), "{rs}");
        assert!(
            rs.starts_with("use candle_core::{DType, Device, Tensor};"),
            "{rs}"
        );
    }
    // The torchvision stem stays where it fits (3-channel ImageNet stem).
    let rgb = card(
        &config(&[
            "data.name=bloodmnist",
            "data.size=28",
            "model.encoder=resnet18",
        ]),
        &[3, 28, 28],
        "mit",
    );
    assert!(!block(&rgb, "python").contains("encoder.conv1"));
}

#[test]
fn weights_of_another_encoder_are_refused() {
    let cfg = config(&["model.encoder=resnet18"]);
    let err = Arch::of(&cfg, &weights(&config(&[]), &[1, 16, 16]))
        .err()
        .expect("digits CNN weights are no ResNet's");
    let text = err.to_string();
    assert!(text.contains("lack `layer4.1.bn2.weight`"), "{text}");
    assert!(text.contains("not a `resnet18` encoder"), "{text}");
}
