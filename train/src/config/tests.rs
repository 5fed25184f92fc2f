use super::*;
use ssl_data::Recipe;

#[test]
fn objective_params_are_resolved_against_the_defaults() -> Result<()> {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    apply_set(&mut root, "objective.params.lambda=1.5")?;
    let c = RunConfig::from_yaml_value(root.clone())?;
    let p = &c.objective.params;
    // Given keys win, absent ones take the paper's values, and an unknown one is refused by
    // name before anything is loaded.
    assert_eq!(
        (p["lambda"].as_f64(), p["mu"].as_f64()),
        (Some(1.5), Some(25.0))
    );
    apply_set(&mut root, "objective.params.gamma=2")?;
    let e = format!("{:#}", RunConfig::from_yaml_value(root).unwrap_err());
    assert!(
        e.contains("unknown field `gamma`") && e.contains("ssl describe vicreg"),
        "{e}"
    );
    let mut root = serde_yaml::Value::Mapping(Default::default());
    apply_set(&mut root, "objective.params=3")?;
    let e = RunConfig::from_yaml_value(root).unwrap_err().to_string();
    assert!(e.contains("objective.params must be a mapping"), "{e}");
    let mut root = serde_yaml::Value::Mapping(Default::default());
    apply_set(&mut root, "objective.name=vicrge")?;
    let e = RunConfig::from_yaml_value(root).unwrap_err().to_string();
    assert!(e.contains("did you mean `vicreg`"), "{e}");
    Ok(())
}

#[test]
fn defaults_are_the_main_job() {
    let c = RunConfig::default();
    assert_eq!(
        (c.train.epochs, c.train.batch_size, c.train.lr),
        (50, 128, 1e-3)
    );
    assert_eq!(c.objective.name, "vicreg");
    assert_eq!(c.data.name, ssl_data::DataSource::Digits);
}

/// What the data and recipe imply fills what is not given, and a given value wins.
#[test]
fn recipe_and_data_defaults_yield_to_given_values() -> Result<()> {
    let swav = resolve(&["data.augment=swav"])?;
    assert_eq!(swav.train.local_scale, (0.05, 0.14));
    let dino = resolve(&["data.augment=dino"])?;
    assert_eq!(dino.train.local_scale, (0.05, 0.4));
    let given = resolve(&["data.augment=swav", "train.local_scale=[0.1, 0.3]"])?;
    assert_eq!(given.train.local_scale, (0.1, 0.3));
    let volumes = resolve(&["data.name=organmnist3d", "data.size=28"])?;
    assert_eq!(
        (volumes.model.encoder.as_str(), volumes.data.recipe()),
        ("resnet18_3d", Recipe::Icone3d)
    );
    let named = resolve(&["data.name=organmnist3d", "model.encoder=mlp"])?;
    assert_eq!(named.model.encoder, "mlp");
    let tuned = resolve(&[
        "data.name=organmnist3d",
        "data.augment_volume={rotate: 0.0, noise: 0.5}",
    ])?;
    let volume = tuned.data.augment_volume.clone().expect("given");
    assert_eq!((volume.rotate, volume.noise, volume.flip), (0.0, 0.5, 0.5));
    let types = tuned.data.view_types(&[1, 8, 8, 8])?;
    assert_eq!(types.views.len(), 1);
    let flat = tuned.data.view_types(&[3, 8, 8]).err().expect("2D");
    assert!(format!("{flat:#}").contains("[C, D, H, W]"), "{flat:#}");
    let typo = resolve(&["data.augment_volume={rotation: 0.0}"]).unwrap_err();
    assert!(
        typo.to_string().contains("unknown field `rotation`"),
        "{typo}"
    );
    // A resolved config read back is unchanged.
    let again = RunConfig::from_yaml_value(serde_yaml::to_value(&swav)?)?;
    assert_eq!(again.train.local_scale, swav.train.local_scale);
    Ok(())
}

#[test]
fn set_overrides_nested_keys_and_unknown_keys_are_errors() {
    let mut v = serde_yaml::Value::Mapping(Default::default());
    apply_set(&mut v, "train.lr=0.5").unwrap();
    apply_set(&mut v, "objective.params.mu=10").unwrap();
    let c = RunConfig::from_yaml_value(v.clone()).unwrap();
    assert_eq!(c.train.lr, 0.5);
    assert_eq!(c.objective.params["mu"].as_f64(), Some(10.0));
    apply_set(&mut v, "train.learning_rate=1").unwrap();
    let err = RunConfig::from_yaml_value(v).unwrap_err().to_string();
    assert!(err.contains("unknown field `learning_rate`"), "{err}");
    assert!(!err.contains("did you mean"), "nothing is near: {err}");
    let mut typo = serde_yaml::Value::Mapping(Default::default());
    apply_set(&mut typo, "train.epoch=3").unwrap();
    let err = RunConfig::from_yaml_value(typo).unwrap_err().to_string();
    assert!(
        err.contains("unknown field `epoch` (did you mean `epochs`?), expected one of"),
        "{err}"
    );
    assert!(apply_set(&mut serde_yaml::Value::Null, "novalue").is_err());
}

fn resolve(sets: &[&str]) -> Result<RunConfig> {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for set in sets {
        apply_set(&mut root, set)?;
    }
    RunConfig::from_yaml_value(root)
}

/// The error of resolving `sets`, `{:#}`-formatted.
fn refused(sets: &[&str]) -> String {
    match resolve(sets) {
        Ok(_) => panic!("{sets:?} was accepted"),
        Err(e) => format!("{e:#}"),
    }
}

/// Every value the types allow but a run cannot use is refused with its key, the value and
/// the range.
#[test]
fn out_of_range_values_are_refused_naming_key_value_and_range() {
    let cases: &[(&[&str], &str)] = &[
        (&["train.epochs=0"], "train.epochs must be ≥ 1, got 0"),
        (&["train.batch_size=0"], "train.batch_size must be ≥ 1, got 0"),
        (&["train.views=0"], "train.views must be ≥ 1, got 0"),
        (&["train.accumulate=0"], "train.accumulate must be ≥ 1"),
        (&["train.checkpoint_every=0"], "train.checkpoint_every must be ≥ 1"),
        (&["train.log_every=0"], "train.log_every must be ≥ 1"),
        (&["train.lr=0"], "train.lr must be > 0 (default 1e-3), got 0"),
        (&["train.lr=.inf"], "train.lr must be > 0 (default 1e-3), got inf"),
        (&["train.min_lr=-0.1"], "train.min_lr must be in [0, train.lr] = [0, 0.001]"),
        (&["train.min_lr=0.01"], "got 0.01"),
        (&["train.epochs=3", "train.warmup_epochs=4"], "train.warmup_epochs must be ≤ train.epochs (3), got 4"),
        (&["train.weight_decay=-1e-4"], "train.weight_decay must be ≥ 0 (default 1e-4), got -0.0001"),
        (&["train.betas=[1.0, 0.999]"], "train.betas[0] must be in [0, 1) (Adam: [0.9, 0.999]), got 1"),
        (&["train.betas=[0.9, -0.1]"], "train.betas[1] must be in [0, 1)"),
        (&["train.momentum=1"], "train.momentum must be in [0, 1) (default 0.9), got 1"),
        (&["train.lars_eta=0"], "train.lars_eta must be > 0 (LARS; default 0.02), got 0"),
        (&["train.probe_lr=-0.1"], "train.probe_lr must be ≥ 0 (0: no online probe; default 0.1), got -0.1"),
        (&["train.local_scale=[0.0, 0.4]"], "train.local_scale must be [a, b] with 0 < a ≤ b ≤ 1"),
        (&["train.local_scale=[0.5, 0.4]"], "got [0.5, 0.4]"),
        (&["train.local_scale=[0.05, 1.5]"], "got [0.05, 1.5]"),
        (&["train.clip_grad_norm=-1"], "train.clip_grad_norm must be ≥ 0 (0: no clipping), got -1"),
        (&["train.param_groups=[{params: a., lr: 1, lr_scale: 2}]"], "sets both `lr` and `lr_scale`"),
        (&["data.size=0"], "data.size must be ≥ 1 (the image side in pixels), got 0"),
        (&["data.imbalance=0"], "data.imbalance must be ≥ 1 (1: balanced), got 0"),
        (&["data.test_fraction=0"], "data.test_fraction must be in (0, 1) (default 0.2), got 0"),
        (&["data.test_fraction=1"], "data.test_fraction must be in (0, 1)"),
        (&["data.subset_test_fraction=1"], "data.subset_test_fraction must be in [0, 1)"),
        (&["data.classes=[4, 4]"], "data.classes keeps the single class [4]"),
        (&["data.keep_side=256"], "data.keep_side keeps an image folder's files at full resolution; `digits` is not one (data.name=folder or caltech256)"),
        (&["data.name=folder", "data.size=224", "data.keep_side=200"], "data.keep_side (200) must be at least data.size (224)"),
        (&["data.name=npz"], "data set `npz` needs its file: set data.root"),
        (&["data.task=binary-class"], "data.task names the task of a `npz` file's labels; `digits` has its own"),
        (&["data.name=npz", "data.root=x.npz", "data.task=binary"], "data.task: unknown MedMNIST task \"binary\""),
        (&["model.encoder=resnet9"], "unknown model.encoder `resnet9`"),
        (&["model.mlp=[]"], "model.mlp must list widths ≥ 1 (hidden…, output; default [64, 64, 2]), got []"),
        (&["model.mlp=[64, 0, 2]"], "got [64, 0, 2]"),
        (&["model.projector=[]"], "model.projector needs at least one width"),
        (&["model.projector=[512, 0]"], "model.projector widths must be ≥ 1 (default [512, 512]), got [512, 0]"),
        (&["eval.knn_k=0"], "eval.knn_k must be ≥ 1 (default 20), got 0"),
        (&["eval.knn_t=0"], "eval.knn_t must be > 0 (the k-NN temperature; default 0.07), got 0"),
        (&["eval.probe_c=-1"], "eval.probe_c must be > 0 (the probe's inverse L2 strength; default 1), got -1"),
        (&["eval.monitor_every=0"], "eval.monitor_every must be ≥ 1"),
        (&["eval.spectrum_top=0"], "eval.spectrum_top must be ≥ 1 while eval.spectrum_every > 0"),
        (&["model.encoder=vit_t16", "data.size=28"], "data.size must be a multiple of 16, got 28 (e.g. --size 16)"),
        (&["model.encoder=vit_s16", "data.size=40"], "got 40 (e.g. --size 32)"),
        (&["model.encoder=vit_t16", "data.size=32", "train.local_views=2"], "the local views' side must be a multiple of 16, got 14 (train.local_size 0: ⌈32·96/224⌉)"),
    ];
    for (sets, expected) in cases {
        let e = refused(sets);
        assert!(e.contains(expected), "{sets:?}: `{expected}` not in `{e}`");
    }
    // At the edges of their ranges, values are accepted.
    resolve(&[
        "train.min_lr=0.001",
        "train.betas=[0.0, 0.0]",
        "train.momentum=0",
        "train.probe_lr=0",
        "train.weight_decay=0",
        "train.local_scale=[1.0, 1.0]",
        "eval.spectrum_every=0",
        "eval.spectrum_top=0",
        "model.encoder=vit_t16",
        "data.size=32",
        "train.local_views=2",
        "train.local_size=16",
    ])
    .unwrap();
}

/// A value of the wrong type names its dotted key and says what was expected, in words.
#[test]
fn type_errors_name_the_key() {
    let cases: &[(&str, &str)] = &[
        ("train.lr=abc", r#"train.lr: expected a number, got "abc""#),
        (
            "train.epochs=-1",
            "train.epochs: expected a whole number ≥ 0, got -1",
        ),
        (
            "train.epochs=2.5",
            "train.epochs: expected a whole number ≥ 0, got 2.5",
        ),
        (
            "train.drop_last=maybe",
            r#"train.drop_last: expected a boolean, got "maybe""#,
        ),
        (
            "train.betas=0.9",
            "train.betas: expected a tuple of size 2, got 0.9",
        ),
        (
            "train.optimizer=adam",
            "train.optimizer: unknown variant `adam`",
        ),
        (
            "data.augment_views=[{crop_scale: big}]",
            "data.augment_views[0].crop_scale: ",
        ),
    ];
    for (set, expected) in cases {
        let e = refused(&[set]);
        assert!(e.contains(expected), "{set}: `{expected}` not in `{e}`");
        assert!(!e.contains(" at line "), "{set}: {e}");
    }
}

/// A later mapping merges into an earlier one; a value cannot silently replace a mapping,
/// nor a key be set under a value that is not one.
#[test]
fn later_sets_merge_and_never_silently_drop_earlier_ones() -> Result<()> {
    let c = resolve(&["train.lr=0.1", "train={epochs: 3}"])?;
    assert_eq!((c.train.lr, c.train.epochs), (0.1, 3));
    let c = resolve(&["objective.params.mu=10", "objective={params: {lambda: 2}}"])?;
    let p = &c.objective.params;
    assert_eq!(
        (p["mu"].as_f64(), p["lambda"].as_f64()),
        (Some(10.0), Some(2.0))
    );
    // `~` resets a mapping, which a value may then replace; a later scalar replaces a scalar.
    let c = resolve(&[
        "train={lr: 0.1}",
        "train=~",
        "train.epochs=3",
        "train.epochs=4",
    ])?;
    assert_eq!((c.train.lr, c.train.epochs), (1e-3, 4));
    let e = refused(&["train=3", "train.lr=0.1"]);
    assert!(
        e.contains("--set train.lr=0.1: `train` is `3` (given earlier), not a mapping"),
        "{e}"
    );
    let e = refused(&["train.lr=0.1", "train=3"]);
    assert!(
        e.contains("--set train=3: `train` holds the keys `{lr: 0.1}` (given earlier)"),
        "{e}"
    );
    let e = refused(&["objective.params.mu=10", "objective={params: 5}"]);
    assert!(e.contains("`objective.params` holds the keys"), "{e}");
    for bad in ["=3", "train..lr=3", ".lr=3"] {
        let e = refused(&[bad]);
        assert!(e.contains("is not a dotted key"), "{bad}: {e}");
    }
    Ok(())
}

/// The default warm-up fits short runs; a given one longer than the run is refused.
#[test]
fn the_default_warmup_fits_the_epochs() -> Result<()> {
    assert_eq!(resolve(&["train.epochs=1"])?.train.warmup_epochs, 1);
    assert_eq!(resolve(&[])?.train.warmup_epochs, 2);
    let e = refused(&["train.epochs=1", "train.warmup_epochs=2"]);
    assert!(
        e.contains("train.warmup_epochs must be ≤ train.epochs (1)"),
        "{e}"
    );
    Ok(())
}

#[test]
fn thread_counts_are_capped_at_a_multiple_of_the_cores() -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(capped_threads(0), 0);
    assert_eq!(capped_threads(3), 3);
    assert_eq!(capped_threads(usize::MAX), MAX_THREADS_PER_CORE * cores);
    let c = resolve(&["train.threads=1000000000"])?;
    assert_eq!(c.train.threads, MAX_THREADS_PER_CORE * cores);
    Ok(())
}

#[test]
fn config_files_are_read_up_to_a_size_limit() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("recipe.yaml");
    std::fs::write(&path, "train:\n  lr: 0.5\n")?;
    assert_eq!(
        RunConfig::from_file(&path)?["train"]["lr"].as_f64(),
        Some(0.5)
    );
    std::fs::write(&path, vec![b'#'; MAX_CONFIG_BYTES as usize + 1])?;
    let e = RunConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("is larger than 1 MiB"), "{e}");
    let e = RunConfig::from_file(&dir.path().join("absent.yaml")).unwrap_err();
    assert!(e.to_string().contains("cannot read config file"), "{e}");
    std::fs::write(&path, "train: [unclosed")?;
    let e = RunConfig::from_file(&path).unwrap_err();
    assert!(e.to_string().contains("is not valid YAML"), "{e}");
    Ok(())
}

/// `data.name: caltech256` defaults to ImageNet's side, a ResNet-18, SimCLR's views and ImageNet's
/// normalisation, with a 0.2 stratified test fraction; `data.clutter` is Caltech-256's alone.
#[test]
fn caltech256_defaults_and_the_clutter_key() {
    let parse = |yaml: &str| {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        RunConfig::from_yaml_value(value)
    };
    let c = parse("data: {name: caltech256}").unwrap();
    assert_eq!((c.data.size, c.model.encoder.as_str()), (224, "resnet18"));
    assert_eq!(c.data.test_fraction, 0.2);
    assert!(!c.data.clutter);
    let resolved = serde_yaml::to_string(&c).unwrap();
    for needle in ["augment: simclr", "normalize: imagenet"] {
        assert!(
            resolved.contains(needle),
            "`{needle}` missing from: {resolved}"
        );
    }
    let c = parse("data: {name: caltech256, size: 64, clutter: true}").unwrap();
    assert_eq!(c.data.size, 64);
    assert!(c.data.clutter);
    let e = format!(
        "{:#}",
        parse("data: {name: folder, clutter: true}").unwrap_err()
    );
    assert!(e.contains("data.clutter") && e.contains("`folder`"), "{e}");
}
