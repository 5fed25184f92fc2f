//! Host cost of one SAG-VICReg pairing (detached copy, kNN affinity, random walk, draw) at
//! B = 128, d = 128: prints the median of 50 calls.

use std::time::Instant;

use candle_core::{Device, Tensor};
use ssl_core::testing::first_step;
use ssl_sagvicreg::draw_pairing;

fn main() -> anyhow::Result<()> {
    let z = Tensor::randn(0f32, 1., (2, 128, 128), &Device::Cpu)?;
    let mut rng = first_step().rng(0);
    let mut micros: Vec<f64> = (0..50)
        .map(|_| {
            let start = Instant::now();
            draw_pairing(&z, 5, 20.0, &mut rng)?;
            Ok(start.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<anyhow::Result<_>>()?;
    micros.sort_by(f64::total_cmp);
    println!(
        "sag-vicreg pairing, B = 128, d = 128: median {:.1} µs over 50 calls (min {:.1}, max {:.1})",
        (micros[24] + micros[25]) / 2.0,
        micros[0],
        micros[49]
    );
    Ok(())
}
