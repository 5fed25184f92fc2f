//! Images of your own from a `Vec`, with a callback after every epoch:
//! `cargo run --release -p ssl-examples --example own_images`.
//!
//! The images here are made up: 16×16 grey squares of three classes (a bright bar across, a bar
//! down, a bright spot), each at a random position with noise.
use ssl_train::{OwnImages, RunConfig, Start, Trainer};

/// `n` images of 16×16 and their labels 0, 1, 2 in turn.
pub fn made_up_images(n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f32 / (1u64 << 53) as f32
    };
    let (mut pixels, mut labels) = (Vec::new(), Vec::new());
    for i in 0..n {
        let class = (i % 3) as u32;
        let at = 3 + (uniform() * 10.0) as usize;
        for y in 0..16_usize {
            for x in 0..16_usize {
                let on = match class {
                    0 => y.abs_diff(at) <= 1,
                    1 => x.abs_diff(at) <= 1,
                    _ => y.abs_diff(at) <= 2 && x.abs_diff(at) <= 2,
                };
                let value = if on { 0.8 } else { 0.1 } + 0.1 * uniform();
                pixels.push(value);
            }
        }
        labels.push(class);
    }
    (pixels, labels)
}

pub fn run(out: &std::path::Path, epochs: usize) -> anyhow::Result<ssl_train::RunOutcome> {
    let (pixels, labels) = made_up_images(600);
    let images = OwnImages::new(&[1, 16, 16], pixels, labels)?;
    let config = RunConfig::builder()
        .objective("vicreg")
        .epochs(epochs)
        .batch_size(64)
        .out(out)
        .build()?;
    let outcome = Trainer::new(config.clone())
        .with_data(images)
        .start(Start::Overwrite)
        .on_epoch(|end| {
            if let Some(knn) = end.knn_accuracy {
                println!("epoch {}: k-NN accuracy {:.3}", end.epoch + 1, knn);
            }
            Ok(())
        })
        .fit()?;
    println!("{}", outcome.table(&config));
    Ok(outcome)
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    run("runs/example-own-images".as_ref(), 10).map(drop)
}
