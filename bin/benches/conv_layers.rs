//! Times the forward and forward + backward of every distinct convolution of ResNet-18 with the
//! CIFAR stem on 128 images of 32×32 (row 1 of the train_step bench), with `ssl_models::Conv`;
//! `python3 bin/benches/conv_layers.py` times the same convolutions in PyTorch, so the two
//! tables show which layers and which pass lose.
//!
//! `cargo bench -p ssl --bench conv_layers -- [--threads 2] [--reps 5]`

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use ssl_models::conv::conv;

/// (input channels, output channels, input side, kernel, stride, padding, count in the net).
const LAYERS: [(usize, usize, usize, usize, usize, usize, usize); 11] = [
    (3, 64, 32, 3, 1, 1, 1),
    (64, 64, 32, 3, 1, 1, 4),
    (64, 128, 32, 3, 2, 1, 1),
    (128, 128, 16, 3, 1, 1, 3),
    (64, 128, 32, 1, 2, 0, 1),
    (128, 256, 16, 3, 2, 1, 1),
    (256, 256, 8, 3, 1, 1, 3),
    (128, 256, 16, 1, 2, 0, 1),
    (256, 512, 8, 3, 2, 1, 1),
    (512, 512, 4, 3, 1, 1, 3),
    (256, 512, 8, 1, 2, 0, 1),
];
const BATCH: usize = 128;

fn median_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
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
    ssl::allocator::keep_freed_memory();
    // Candle's workers read RAYON_NUM_THREADS when they first run.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let device = Device::Cpu;
    println!("layer                         count  fwd ms  fwd+bwd ms");
    let (mut total_fwd, mut total_both) = (0.0, 0.0);
    for (c, o, side, k, s, p, count) in LAYERS {
        let vars = VarMap::new();
        let layer = conv(
            c,
            o,
            2,
            k,
            s,
            p,
            false,
            VarBuilder::from_varmap(&vars, DType::F32, &device),
        )?;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1., (c, BATCH, side, side), &device)?)?;
        let side_out = (side + 2 * p - k) / s + 1;
        let dy = Tensor::randn(0f32, 1., (o, BATCH, side_out, side_out), &device)?;
        let fwd = median_ms(reps, || {
            layer.forward_channel_major(&x)?;
            Ok(())
        })?;
        let both = median_ms(reps, || {
            let y = layer.forward_channel_major(&x)?;
            (y * &dy)?.sum_all()?.backward()?;
            Ok(())
        })?;
        total_fwd += fwd * count as f64;
        total_both += both * count as f64;
        let name = format!("{c}->{o} {side}x{side} k{k} s{s}");
        println!("{name:<30}{count:>5}{fwd:>8.1}{both:>12.1}");
    }
    println!(
        "{:<35}{total_fwd:>8.1}{total_both:>12.1}",
        "whole net (× count)"
    );
    Ok(())
}
