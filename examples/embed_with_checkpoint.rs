//! Load a run's checkpoint and embed new images:
//! `cargo run --release -p ssl-examples --example embed_with_checkpoint [RUN_DIR]`
//! (without a run directory it trains a short digits run first).
use ssl_train::{RunConfig, Start, TrainedEncoder, Trainer};

/// Embeds the first ten digits with the encoder of the run in `run_dir`; returns `[10, F]`.
pub fn embed_digits(run_dir: &std::path::Path) -> anyhow::Result<candle_core::Tensor> {
    let encoder = TrainedEncoder::load(run_dir, &[1, 16, 16])?;
    let digits = ssl_data::digits(16)?;
    let ssl_data::Samples::F32(values) = &digits.samples else {
        anyhow::bail!("the digits are stored as f32 values");
    };
    let features = encoder.embed(&values[..10 * 16 * 16])?;
    println!(
        "{} features of width {}",
        features.dim(0)?,
        encoder.output_dim()
    );
    Ok(features)
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    let run_dir = match std::env::args_os().nth(1) {
        Some(dir) => dir.into(),
        None => {
            let config = RunConfig::builder()
                .epochs(5)
                .out("runs/example-embed")
                .build()?;
            Trainer::new(config).start(Start::Overwrite).fit()?.dir
        }
    };
    embed_digits(&run_dir).map(drop)
}
