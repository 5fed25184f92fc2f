//! Paper defaults fitted to the data set: prototypes and queues no longer than the training set,
//! values the user gave kept, the fitted values recorded in the run's `config.yaml` and kept by
//! a resumed run.

use anyhow::Result;
use ssl_core::RunFacts;
use ssl_train::{RunConfig, Start, Trainer};

/// The digits' training split at the default batch.
const DIGITS: RunFacts = RunFacts {
    num_instances: 1437,
    batch_size: 128,
    feature_dim: 128,
    projection_dim: 512,
};

fn fitted(objective: &str, given: &[(&str, i64)]) -> Result<(RunConfig, Vec<String>)> {
    let mut builder = RunConfig::builder().objective(objective);
    for (key, value) in given {
        builder = builder.objective_param(key, *value);
    }
    let mut cfg = builder.build()?;
    let notes = cfg.objective.fit_to_data(&DIGITS)?;
    Ok((cfg, notes))
}

fn param(cfg: &RunConfig, key: &str) -> u64 {
    cfg.objective.params[key].as_u64().unwrap()
}

#[test]
fn prototypes_and_queues_beyond_the_training_set_shrink_to_it() -> Result<()> {
    let (carp, notes) = fitted("carp", &[])?;
    assert_eq!(
        (param(&carp, "num_prototypes"), param(&carp, "block_size")),
        (1024, 8)
    );
    assert_eq!(notes.len(), 2);
    assert!(notes[0].contains("65536") && notes[0].contains("num_prototypes = 1024"));

    // The heads: at most 4× what they read (the digits CNN's 128 features, 512-d projections).
    assert_eq!(param(&carp, "head_hidden"), 512);
    let (dino, notes) = fitted("dino", &[])?;
    assert_eq!(
        (param(&dino, "out_dim"), param(&dino, "head_hidden")),
        (1024, 512)
    );
    assert_eq!(notes.len(), 2);
    assert!(
        notes[1].contains("`head_hidden` 2048") && notes[1].contains("is 512"),
        "{notes:?}"
    );
    let (byol, _) = fitted("byol", &[])?;
    assert_eq!(param(&byol, "predictor_hidden"), 2048);
    let (byol, _) = fitted("byol", &[("predictor_hidden", 4096)])?;
    assert_eq!(param(&byol, "predictor_hidden"), 4096);

    let (swav, notes) = fitted("swav", &[])?;
    assert_eq!(param(&swav, "num_prototypes"), 1024);
    assert_eq!(param(&swav, "freeze_prototypes_steps"), 11, "{notes:?}");

    let (moco, notes) = fitted("moco-v2", &[])?;
    assert_eq!(param(&moco, "queue_size"), 11 * 128);
    assert!(notes[0].contains("11 batches of 128"), "{notes:?}");

    // Objectives whose defaults fit any data set are left as they are.
    let (vicreg, notes) = fitted("vicreg", &[])?;
    assert!(notes.is_empty());
    assert_eq!(
        vicreg.objective.params,
        RunConfig::builder().build()?.objective.params
    );
    Ok(())
}

#[test]
fn a_value_the_user_gave_is_kept_and_its_neighbour_still_fits() -> Result<()> {
    let (carp, notes) = fitted("carp", &[("num_prototypes", 65536), ("head_hidden", 2048)])?;
    assert_eq!(
        (param(&carp, "num_prototypes"), param(&carp, "block_size")),
        (65536, 512)
    );
    assert_eq!(param(&carp, "head_hidden"), 2048);
    assert!(notes.is_empty(), "{notes:?}");
    let (carp, _) = fitted("carp", &[("block_size", 16)])?;
    assert_eq!(
        (param(&carp, "num_prototypes"), param(&carp, "block_size")),
        (1024, 16)
    );
    // A given block larger than the fitted K is an error naming both keys, not a silent change.
    let mut cfg = RunConfig::builder()
        .objective("carp")
        .objective_param("block_size", 2048)
        .build()?;
    let err = format!("{:#}", cfg.objective.fit_to_data(&DIGITS).unwrap_err());
    assert!(
        err.contains("block_size") && err.contains("num_prototypes"),
        "{err}"
    );
    Ok(())
}

#[test]
fn the_run_records_the_fitted_values_and_a_resumed_run_keeps_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("run");
    let cfg = RunConfig::builder()
        .objective("moco-v2")
        .set("data.train_size", 300)
        .set("train.batch_size", 64)
        .set("train.epochs", 2)
        .set("train.stop_after_epochs", 1)
        .set("out", out.display().to_string())
        .build()?;
    Trainer::new(cfg.clone()).start(Start::Fresh).fit()?;
    let recorded = RunConfig::load_run(&out)?;
    // 300 images at a batch of 64 hold 4 whole batches; the record keeps what was asked.
    assert_eq!(param(&recorded, "queue_size"), 256);
    assert_eq!(recorded.objective.fitted.len(), 1);
    assert_eq!(
        recorded.objective.as_requested().params,
        cfg.objective.params,
        "asked for the paper's queue"
    );
    // Resumed from its own config.yaml, every key is given: nothing is fitted again.
    let resumed = Trainer::new(recorded).start(Start::Resume).fit()?;
    assert_eq!(
        param(&RunConfig::load_run(&resumed.dir)?, "queue_size"),
        256
    );
    Ok(())
}
