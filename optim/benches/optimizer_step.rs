//! One LARS step of an f32 parameter (the paper recipes' settings: momentum 0.9, weight decay
//! 10⁻⁶, η 0.02) composed from Candle tensor ops against in place (`ssl_optim::sgd`), for a
//! 4096 × 4096 and an 8192 × 8192 matrix (16.8 M and 67.1 M values; ResNet-50 has 23.5 M, an
//! 8192-wide expander layer 67.1 M). Each path steps its own parameter and momentum buffer with
//! one gradient, the two in turn (so that a load on the machine falls on both), after one
//! warm-up step each that creates the buffer; prints the median milliseconds of `--reps` steps
//! of each path, their ratio (composed / in place), and the sums of the medians.
//!
//! `cargo bench -p ssl-optim --bench optimizer_step -- [--threads 2] [--reps 5]`

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use ssl_optim::sgd::SgdStep;

const LARS: SgdStep = SgdStep {
    lr: 0.3,
    weight_decay: 1e-6,
    momentum: 0.9,
    nesterov: false,
    lars_eta: Some(0.02),
};

/// Milliseconds `f` takes.
fn ms(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() -> Result<()> {
    let (mut threads, mut reps) = (2usize, 5usize);
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--threads" => threads = value()?.parse()?,
            "--reps" => reps = value()?.parse()?,
            other => bail!("unknown argument `{other}`; use --threads N, --reps N"),
        }
    }
    // As in `ssl run`: freed tensors stay in the process instead of costing page faults anew.
    ssl_core::allocator::keep_freed_memory();
    // Candle's workers read RAYON_NUM_THREADS when they first run.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let dev = Device::Cpu;
    println!("parameter      values  composed ms  in place ms  ratio");
    let mut totals = (0.0, 0.0);
    for side in [4096, 8192] {
        let g = Tensor::randn(0f32, 1e-3, (side, side), &dev)?;
        let w0 = Tensor::randn(0f32, 1e-2, (side, side), &dev)?;
        let (mut w, mut buf) = (w0.copy()?, None);
        let (fused_w, fused_buf) = (w0.copy()?, w0.zeros_like()?);
        let (mut composed, mut fused) = (Vec::new(), Vec::new());
        for rep in 0..=reps {
            let c = ms(|| {
                let (next, b) = LARS.composed(&w, &g, buf.as_ref())?;
                (w, buf) = (next, Some(b));
                Ok(())
            })?;
            let f = ms(|| Ok(LARS.in_place(&fused_w, &g, &fused_buf)?))?;
            if rep > 0 {
                composed.push(c);
                fused.push(f);
            }
        }
        let (composed, fused) = (median(composed), median(fused));
        let name = format!("{side} x {side}");
        let values = (side * side) as f64 / 1e6;
        println!(
            "{name:<12}{values:>7.1} M{composed:>13.1}{fused:>13.1}{:>7.2}",
            composed / fused
        );
        totals = (totals.0 + composed, totals.1 + fused);
    }
    let (composed, fused) = totals;
    println!(
        "{:<21}{composed:>13.1}{fused:>13.1}{:>7.2}",
        "both",
        composed / fused
    );
    Ok(())
}
