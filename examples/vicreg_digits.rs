//! VICReg on the embedded digits, from Rust: `cargo run --release -p ssl-examples --example vicreg_digits`.
use ssl_train::{RunConfig, Start, Trainer};

pub fn run(out: &std::path::Path, epochs: usize) -> anyhow::Result<ssl_train::RunOutcome> {
    let config = RunConfig::builder()
        .objective("vicreg")
        .epochs(epochs)
        .out(out)
        .build()?;
    let outcome = Trainer::new(config.clone()).start(Start::Overwrite).fit()?;
    println!("{}", outcome.table(&config));
    Ok(outcome)
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    run("runs/example-vicreg-digits".as_ref(), 50).map(drop)
}
