//! Tests of grid expansion, smoke runs, stored-run matching and the summary.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use ssl_train::config::RunConfig;

use super::runs::{config_text, same_config};
use super::summary::Summary;
use super::{Cell, Grid, Outcome, SMOKE_HALF_CLASSES, SMOKE_HALF_TRAIN_SIZE, SMOKE_TRAIN_SIZE};

fn grid(yaml: &str) -> Result<Grid> {
    Ok(serde_yaml::from_str(yaml)?)
}

/// `--smoke` keeps every entry and view count at one small batch (but not below what the
/// entry trains at), the first seed, one epoch and a small pretraining subset, even where an
/// entry's own `set` asks for more; a halves grid checks both halves.
#[test]
fn a_smoke_run_keeps_every_entry_and_view_at_one_small_cheap_cell() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut g = grid(
        "objectives:\n  - vicreg\n  - {name: simclr, label: long, set: [train.epochs=400, \
         train.accumulate=16, 'model.projector=[8192,8192,64]'], batch_sizes: [128, 64]}\n  \
         - {name: wmse, set: ['model.projector=[64,32]']}\n\
         views: [2, 4]\nbatch_sizes: [256, 1]\nseeds: [3, 4]\nset: ['model.projector=[512,300]']",
    )?;
    g.smoke(Some(dir.path()))?;
    let cells = g.cells()?;
    let shape: Vec<(&str, usize, usize)> = cells
        .iter()
        .map(|c| (c.label.as_str(), c.views, c.batch_size))
        .collect();
    assert_eq!(
        shape,
        [
            // The grid's smallest, 1, is one instance in the projector's batch norm.
            ("vicreg", 2, 2),
            ("vicreg", 4, 2),
            ("long", 2, 4),
            ("long", 4, 4),
            // W-MSE whitens sub-batches of w_size = 128.
            ("wmse", 2, 128),
            ("wmse", 4, 128)
        ]
    );
    for c in &cells {
        assert_eq!((c.seed, c.config.train.epochs), (3, 1));
        assert_eq!(c.config.train.accumulate, 1);
        // The built-in digits too: their 1,437 instances at B = 4 would end on a batch of 1.
        let train_size = match c.label.as_str() {
            "wmse" => 128,
            _ => SMOKE_TRAIN_SIZE,
        };
        assert_eq!(c.config.data.train_size, train_size, "{}", c.label);
        assert!(c.config.out.starts_with(dir.path()));
        // Projector layers cut to SMOKE_WIDTH, the grid's and an entry's own alike.
        let widths = match c.label.as_str() {
            "vicreg" => [256, 256].as_slice(),
            "wmse" => &[64, 32],
            _ => &[256, 256, 64],
        };
        assert_eq!(c.config.model.projector, widths, "{}", c.label);
    }
    let mut halves =
        grid("objectives: [vicreg]\nhalves: [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11]]")?;
    halves.smoke(Some(dir.path()))?;
    let [a, b] = halves.halves.clone().expect("halves");
    assert_eq!((a.len(), b.len()), (SMOKE_HALF_CLASSES, 2));
    let a = halves.half(&[a, b], 0).cells()?;
    assert_eq!(a[0].config.data.classes, [0, 1, 2, 3]);
    assert_eq!(a[0].config.data.train_size, SMOKE_HALF_TRAIN_SIZE);
    assert!(a[0].config.out.starts_with(dir.path().join("half-a")));
    Ok(())
}

#[test]
fn stored_runs_match_only_their_resolved_configuration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = RunConfig::from_yaml_value(serde_yaml::Value::Mapping(Default::default()))?;
    assert!(!same_config(dir.path(), &cfg)?);
    let write = |text: &str| std::fs::write(dir.path().join("config.yaml"), text);
    // Written in full: matches; one parameter off: retrains.
    write(&config_text(&cfg)?)?;
    assert!(same_config(dir.path(), &cfg)?);
    write(&config_text(&cfg)?.replace("lambda: 25.0", "lambda: 24.0"))?;
    assert!(!same_config(dir.path(), &cfg)?);
    // Another online-probe learning rate trains the same encoder: still this cell's run.
    let mut other_probe = cfg.clone();
    other_probe.train.probe_lr = 1e-3;
    write(&serde_yaml::to_string(&other_probe)?)?;
    assert!(same_config(dir.path(), &cfg)?);
    // Recorded without its parameters: resolved against these defaults.
    let mut legacy: serde_yaml::Value = serde_yaml::from_str(&config_text(&cfg)?)?;
    legacy["objective"]["params"] = serde_yaml::Value::Mapping(Default::default());
    write(&serde_yaml::to_string(&legacy)?)?;
    assert!(same_config(dir.path(), &cfg)?);
    write("not: [valid")?;
    assert!(!same_config(dir.path(), &cfg)?);
    Ok(())
}

#[test]
fn cells_expand_in_table_order_with_entry_overrides() -> Result<()> {
    let g = grid(
        "objectives: [vicreg, {name: simclr, label: simclr-t02, params: {temperature: 0.2}, views: [2, 4]}]\nseeds: [0, 1]\nbatch_sizes: [64]\nout: /tmp/x\nset: ['train.epochs=3']",
    )?;
    let cells = g.cells()?;
    let keys: Vec<(String, usize, u64)> = cells
        .iter()
        .map(|c| (c.label.clone(), c.views, c.seed))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("vicreg".into(), 2, 0),
            ("vicreg".into(), 2, 1),
            ("simclr-t02".into(), 2, 0),
            ("simclr-t02".into(), 2, 1),
            ("simclr-t02".into(), 4, 0),
            ("simclr-t02".into(), 4, 1),
        ]
    );
    let c = &cells[4];
    assert_eq!(c.config.objective.name, "simclr");
    assert_eq!(c.config.objective.params["temperature"].as_f64(), Some(0.2));
    assert_eq!((c.config.train.batch_size, c.config.train.epochs), (64, 3));
    assert_eq!(
        c.config.out,
        PathBuf::from("/tmp/x/runs/simclr-t02/v4-b64-s0")
    );
    Ok(())
}

/// `--objectives` over a grid keeps the grid's entries for those objectives (by label or
/// by name, aliases resolved), in the order asked, and adds the others with defaults.
#[test]
fn selecting_objectives_keeps_their_grid_entries() -> Result<()> {
    let mut g = grid(
        "objectives: [vicreg, {name: simclr, label: simclr-t02, params: {temperature: 0.2}}, {name: mae, set: ['train.epochs=5']}]\nseeds: [0]",
    )?;
    let names = ["masked-autoencoder", "simclr-t02", "barlow-twins"].map(String::from);
    g.select_objectives(&names)?;
    let cells = g.cells()?;
    let labels: Vec<&str> = cells.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(labels, ["mae", "simclr-t02", "barlow-twins"]);
    assert_eq!(cells[0].config.train.epochs, 5);
    assert_eq!(
        cells[1].config.objective.params["temperature"].as_f64(),
        Some(0.2)
    );
    assert!(g.select_objectives(&["vicregg".into()]).is_err());
    // By objective, a labelled entry is selected too.
    let mut g = grid("objectives: [vicreg, {name: simclr, label: simclr-t02}]")?;
    g.select_objectives(&["simclr".into()])?;
    let labels: Vec<String> = g.cells()?.into_iter().map(|c| c.label).collect();
    assert_eq!(labels, ["simclr-t02"; 3]);
    Ok(())
}

#[test]
fn a_batch_size_set_by_override_is_kept_without_a_batch_list() -> Result<()> {
    let g = grid(
        "objectives: [vicreg, {name: simclr, set: ['train.batch_size=16']}]\nseeds: [0]\nset: ['train.batch_size=64']",
    )?;
    let batches: Vec<usize> = g.cells()?.iter().map(|c| c.batch_size).collect();
    assert_eq!(batches, [64, 16]);
    Ok(())
}

#[test]
fn unknown_metrics_are_refused_before_anything_trains() {
    let e = grid("objectives: [vicreg]\nmetrics: [knn_acc]")
        .unwrap()
        .cells()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown metric `knn_acc`") && e.contains("knn_accuracy"),
        "{e}"
    );
}

#[test]
fn grid_errors_name_the_problem() {
    let err = |yaml: &str| format!("{:#}", grid(yaml).and_then(|g| g.cells()).unwrap_err());
    assert!(err("objectives: [vicregg]").contains("did you mean"));
    assert!(err("objectives: []").contains("no objectives"));
    assert!(err("objectives: [{name: vicreg, lable: x}]").contains("unknown field `lable`"));
    assert!(err("objective: [vicreg]").contains("unknown field `objective`"));
}

/// A cell of seed 0 at V = 2, B = 64 running `config`.
fn cell_of(label: &str, config: RunConfig) -> Cell {
    Cell {
        label: label.into(),
        views: 2,
        batch_size: 64,
        seed: 0,
        config,
    }
}

#[test]
fn baselines_are_reported_per_data_set() {
    let cell = |label: &str, imbalance: usize| {
        let mut config = RunConfig::default();
        config.data.imbalance = imbalance;
        cell_of(label, config)
    };
    let done = |acc: f64| {
        let mut m = BTreeMap::new();
        m.insert("probe_balanced_accuracy".to_string(), acc);
        let rows = ["ours", "raw inputs", "random init"]
            .map(|r| (r.to_string(), m.clone()))
            .into_iter()
            .collect();
        Outcome::Done { rows, seconds: 1.0 }
    };
    let cells = [cell("k=1", 1), cell("k=5", 5)];
    let g = grid("objectives: [vicreg]").unwrap();
    let md = Summary::new(&g, &cells, &[done(0.9), done(0.6)])
        .unwrap()
        .markdown("ssl compare");
    assert!(
        md.contains("| raw inputs (imbalance=default) | — | — | 1 | 90.0 ± 0.0 |"),
        "{md}"
    );
    assert!(
        md.contains("| raw inputs (imbalance=5) | — | — | 1 | 60.0 ± 0.0 |"),
        "{md}"
    );
    assert!(md.contains("| random init (imbalance=5) |"), "{md}");
}

/// The random-init rows follow the encoder's configuration (not its projector), the
/// raw-input rows do not: a grid whose entries pool a ViT two ways has one raw-input row
/// and a random-init row per pooling, each from its own cells (before, the last cell of a
/// seed stood for every encoder).
#[test]
fn random_init_rows_are_reported_per_encoder_configuration() {
    use ssl_models::VitPool::{self, Class, Mean};
    let cell = |label: &str, pool: VitPool, projector: usize| {
        let mut config = RunConfig::default();
        config.model.pool = pool;
        config.model.projector = vec![projector];
        cell_of(label, config)
    };
    let done = |raw: f64, random: f64| {
        let row = |v: f64| BTreeMap::from([("probe_balanced_accuracy".to_string(), v)]);
        let rows = BTreeMap::from([
            ("ours".to_string(), row(0.5)),
            ("raw inputs".to_string(), row(raw)),
            ("random init".to_string(), row(random)),
        ]);
        Outcome::Done { rows, seconds: 1.0 }
    };
    let cells = [
        cell("a", Class, 8),
        cell("b", Class, 16),
        cell("c", Mean, 8),
    ];
    let outcomes = [done(0.9, 0.7), done(0.9, 0.7), done(0.9, 0.8)];
    let g = grid("objectives: [vicreg]").unwrap();
    let md = Summary::new(&g, &cells, &outcomes)
        .unwrap()
        .markdown("ssl compare");
    assert!(
        md.contains("| raw inputs | — | — | 1 | 90.0 ± 0.0 |"),
        "{md}"
    );
    for (pool, acc) in [("class", "70.0"), ("mean", "80.0")] {
        let row = format!("| random init (model.pool={pool}) | — | — | 1 | {acc} ± 0.0 |");
        assert!(md.contains(&row), "{row} not in\n{md}");
    }
    assert_eq!(md.matches("| random init").count(), 2, "{md}");
}

#[test]
fn summary_gives_mean_and_sample_std_and_lists_failures() {
    let cell = |seed| Cell {
        label: "vicreg".into(),
        views: 2,
        batch_size: 8,
        seed,
        config: RunConfig::default(),
    };
    let done = |acc: f64| {
        let mut ours = BTreeMap::new();
        ours.insert("probe_balanced_accuracy".to_string(), acc);
        let mut rows = BTreeMap::new();
        rows.insert("ours".to_string(), ours.clone());
        rows.insert("raw inputs".to_string(), ours);
        Outcome::Done {
            rows,
            seconds: 10.0,
        }
    };
    let cells = [cell(0), cell(1), cell(2)];
    let outcomes = [
        done(0.9),
        done(0.8),
        Outcome::Failed("NaN at step 3".into()),
    ];
    let grid = grid("objectives: [vicreg]\nreference: {vicreg: {probe_balanced_accuracy: 0.875}}")
        .unwrap();
    let s = Summary::new(&grid, &cells, &outcomes).unwrap();
    let md = s.markdown("ssl compare");
    assert!(md.contains("| ↳ vicreg (published) | | | | 87.5 |"), "{md}");
    assert!(md.contains("| vicreg | 2 | 8 | 2 | 85.0 ± 7.1 |"), "{md}");
    assert!(md.contains("vicreg V=2 B=8: NaN at step 3"), "{md}");
    assert!(
        md.contains("| raw inputs | — | — | 2 | 85.0 ± 7.1 |"),
        "{md}"
    );
    let csv = s.csv();
    assert!(
        csv.lines().nth(2).unwrap().starts_with("vicreg,2,8,2,0.85"),
        "{csv}"
    );
}
