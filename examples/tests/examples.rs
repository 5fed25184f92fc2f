//! Runs every example (`cargo test -p ssl-examples`), with fewer epochs than their `main`, and
//! checks what it returns.

#[allow(dead_code)]
#[path = "../custom_encoder.rs"]
mod custom_encoder;
#[allow(dead_code)]
#[path = "../embed_with_checkpoint.rs"]
mod embed_with_checkpoint;
#[allow(dead_code)]
#[path = "../loss_in_own_loop.rs"]
mod loss_in_own_loop;
#[allow(dead_code)]
#[path = "../own_images.rs"]
mod own_images;
#[allow(dead_code)]
#[path = "../vicreg_digits.rs"]
mod vicreg_digits;

use ssl_train::RunOutcome;

/// The trained encoder's linear-probe balanced accuracy (the table's last row), after the
/// raw-input and random-init rows.
fn trained_probe(outcome: &RunOutcome) -> f64 {
    assert_eq!(outcome.evaluation.len(), 3, "raw, random init, trained");
    assert!(outcome.dir.join("results.json").is_file());
    outcome.evaluation[2].1.probe_balanced_accuracy
}

#[test]
fn vicreg_on_the_digits_learns_features_a_probe_reads() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let outcome = vicreg_digits::run(dir.path(), 5)?;
    let probe = trained_probe(&outcome);
    assert!(probe > 0.8, "10 classes, chance 0.1: {probe}");
    Ok(())
}

#[test]
fn a_registered_encoder_trains_under_its_name_and_is_saved_with_its_keys() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let outcome = custom_encoder::run(dir.path(), 3)?;
    let probe = trained_probe(&outcome);
    assert!(probe > 0.5, "10 classes, chance 0.1: {probe}");
    let config = std::fs::read_to_string(outcome.dir.join("config.yaml"))?;
    assert!(config.contains("encoder: two_layers"), "{config}");
    let weights = ssl_train::checkpoint::load_tensors(
        &outcome
            .dir
            .join("checkpoint")
            .join(ssl_train::checkpoint::MODEL),
    )?;
    assert_eq!(weights["encoder.hidden.weight"].dims(), &[256, 256]);
    assert_eq!(weights["encoder.out.weight"].dims(), &[64, 256]);
    Ok(())
}

#[test]
fn images_from_a_vec_train_with_a_callback_each_epoch() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let outcome = own_images::run(dir.path(), 4)?;
    let probe = trained_probe(&outcome);
    assert!(probe > 0.6, "3 classes, chance 0.33: {probe}");
    let split = std::fs::read_to_string(outcome.dir.join("split.json"))?;
    assert!(split.contains("\"train\""), "{split}");
    Ok(())
}

#[test]
fn the_vicreg_loss_falls_in_a_plain_candle_loop() -> anyhow::Result<()> {
    let (first, last) = loss_in_own_loop::run(100)?;
    assert!(last < 0.8 * first, "first {first}, last {last}");
    Ok(())
}

#[test]
fn a_checkpoint_embeds_new_images_as_its_run_evaluated_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = ssl_train::RunConfig::builder()
        .epochs(1)
        .out(dir.path())
        .build()?;
    let outcome = ssl_train::Trainer::new(config)
        .start(ssl_train::Start::Overwrite)
        .fit()?;
    let features = embed_with_checkpoint::embed_digits(&outcome.dir)?;
    let (n, width) = features.dims2()?;
    assert_eq!(n, 10);
    let values = features.flatten_all()?.to_vec1::<f32>()?;
    assert!(values.iter().all(|v| v.is_finite()));
    let again = ssl_train::TrainedEncoder::load(&outcome.dir, &[1, 16, 16])?;
    assert_eq!(again.output_dim(), width);
    // The trained weights, not the run's initial ones: the same samples through the encoder at
    // its random init (same seed) give other features.
    let config = ssl_train::RunConfig::load_run(&outcome.dir)?;
    let store = ssl_core::ParamStore::new(config.train.seed);
    let shape = ssl_train::setup::DataSplit::shape_only(&[1, 16, 16], 0).dataset;
    let vb = store.var_builder(&candle_core::Device::Cpu).pp("encoder");
    let initial_encoder = ssl_train::setup::encoder(&config, &shape, vb)?;
    let ssl_data::Samples::F32(digits) = ssl_data::digits(16)?.samples else {
        anyhow::bail!("the digits are stored as f32 values");
    };
    let mut samples = digits[..10 * 16 * 16].to_vec();
    samples
        .chunks_mut(16 * 16)
        .for_each(|s| config.data.normalization().apply(s, 1));
    let x = candle_core::Tensor::from_vec(samples, (10, 1, 16, 16), &candle_core::Device::Cpu)?;
    let initial = ssl_train::setup::forward_in_chunks(initial_encoder.as_ref(), &x, false)?;
    let moved = (&features - &initial)?
        .abs()?
        .max_all()?
        .to_scalar::<f32>()?;
    assert!(moved > 1e-3, "features equal the random init's: {moved}");
    Ok(())
}
