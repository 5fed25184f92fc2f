//! Times the forward and forward + backward of every distinct convolution of a bench row's net
//! with `ssl_models::Conv`, at the batch one view of that row gives (the trainer forwards view by
//! view): ResNet-18 with the CIFAR stem on 64 images of 32×32 (row 1 of the train_step bench,
//! `--net cifar`, the default) or the 3D ResNet-18 on 4 volumes of 64³ (row 4, `--net 3d`). The
//! stem's input needs no gradient, as in the net. Totals count every layer of the net and both
//! views. `--net digits` is the main job's digits CNN on one view's 128 images of 16×16. The
//! stem there (and in every net) takes no input gradient. `python3 tools/twins/conv_layers.py` times the same convolutions in PyTorch, so the
//! two tables show which layers and which pass lose.
//!
//! `cargo bench -p ssl-models --bench conv_layers -- [--net cifar|3d|digits] [--threads 2] [--reps 5]`

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use ssl_models::conv::conv;

/// (input channels, output channels, input side, kernel, stride, padding, count in the net).
type Layer = (usize, usize, usize, usize, usize, usize, usize);

/// Views per instance in rows 1 and 4, each forwarded as its own batch.
const VIEWS: usize = 2;

/// Row 1's net, on 32² images.
const CIFAR: [Layer; 11] = [
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

/// Row 4's net, on single-channel 64³ volumes: the 7³ stride-2 stem and its max-pool to 16³.
const RESNET_3D: [Layer; 11] = [
    (1, 64, 64, 7, 2, 3, 1),
    (64, 64, 16, 3, 1, 1, 4),
    (64, 128, 16, 3, 2, 1, 1),
    (128, 128, 8, 3, 1, 1, 3),
    (64, 128, 16, 1, 2, 0, 1),
    (128, 256, 8, 3, 2, 1, 1),
    (256, 256, 4, 3, 1, 1, 3),
    (128, 256, 8, 1, 2, 0, 1),
    (256, 512, 4, 3, 2, 1, 1),
    (512, 512, 2, 3, 1, 1, 3),
    (256, 512, 4, 1, 2, 0, 1),
];

/// The main job's digits CNN, on 16² images.
const DIGITS: [Layer; 3] = [
    (1, 32, 16, 3, 1, 1, 1),
    (32, 64, 16, 3, 2, 1, 1),
    (64, 128, 8, 3, 2, 1, 1),
];

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
    let (mut threads, mut reps, mut net) = (2usize, 5usize, "cifar".to_string());
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    while let Some(flag) = args.next() {
        let mut value = || args.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--threads" => threads = value()?.parse()?,
            "--reps" => reps = value()?.parse()?,
            "--net" => net = value()?,
            other => bail!(
                "unknown argument `{other}`; use --net cifar|3d|digits, --threads N, --reps N"
            ),
        }
    }
    let (layers, rank, batch): (&[Layer], _, _) = match net.as_str() {
        "cifar" => (&CIFAR, 2, 64),
        "3d" => (&RESNET_3D, 3, 4),
        "digits" => (&DIGITS, 2, 128),
        other => bail!(
            "unknown net `{other}`; use --net cifar (row 1), 3d (row 4) or digits (the main job)"
        ),
    };
    // As in `ssl run`: freed tensors stay in the process instead of costing page faults anew.
    ssl_core::allocator::keep_freed_memory();
    // Candle's workers read RAYON_NUM_THREADS when they first run.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let device = Device::Cpu;
    println!("layer                         count  fwd ms  fwd+bwd ms");
    let (mut total_fwd, mut total_both) = (0.0, 0.0);
    for &(c, o, side, k, s, p, count) in layers {
        let vars = VarMap::new();
        let layer = conv(
            c,
            o,
            rank,
            k,
            s,
            p,
            false,
            VarBuilder::from_varmap(&vars, DType::F32, &device),
        )?;
        let side_out = (side + 2 * p - k) / s + 1;
        let shape = |channels, side| [vec![channels, batch], vec![side; rank]].concat();
        let x = Tensor::randn(0f32, 1., shape(c, side), &device)?;
        // Every layer but the stem back-propagates into its input.
        let x = if c > 3 {
            Var::from_tensor(&x)?.into_inner()
        } else {
            x
        };
        let dy = Tensor::randn(0f32, 1., shape(o, side_out), &device)?;
        let fwd = median_ms(reps, || {
            layer.forward_channel_major(&x)?;
            Ok(())
        })?;
        let both = median_ms(reps, || {
            let y = layer.forward_channel_major(&x)?;
            (y * &dy)?.sum_all()?.backward()?;
            Ok(())
        })?;
        total_fwd += fwd * (VIEWS * count) as f64;
        total_both += both * (VIEWS * count) as f64;
        let name = format!("{c}->{o} {side}^{rank} k{k} s{s}");
        println!("{name:<30}{count:>5}{fwd:>8.1}{both:>12.1}");
    }
    println!(
        "{:<35}{total_fwd:>8.1}{total_both:>12.1}",
        "whole net (× count × 2 views)"
    );
    Ok(())
}
