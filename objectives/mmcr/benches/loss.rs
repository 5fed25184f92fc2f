//! MMCR loss + backward at the main job's shapes (V = 2 views of `[B, D]` f32 projections, λ = 0:
//! the nuclear norm of the `[B, D]` centroid matrix, from the eigendecomposition of its
//! `min(B, D)`-square Gram matrix). Prints the median of the repetitions and the loss value (to
//! compare solvers). Run with `cargo bench -p ssl-mmcr --bench loss -- [reps]`.

use std::time::Instant;

use candle_core::{DType, Device, Result, Var};
use ssl_core::testing::randn;
use ssl_mmcr::{mmcr_loss, MmcrConfig};

fn main() -> Result<()> {
    let reps = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(50);
    let cfg = MmcrConfig::default();
    for (b, d) in [(128, 512), (256, 512)] {
        let z = Var::from_tensor(&randn(0f32, 1., (2, b, d), &Device::Cpu)?)?;
        let mut seconds = Vec::with_capacity(reps);
        let mut value = 0.0;
        for _ in 0..reps + 2 {
            let t = Instant::now();
            let loss = mmcr_loss(z.as_tensor(), &cfg)?;
            let grads = loss.backward()?;
            let g = grads.get(z.as_tensor()).expect("gradient");
            g.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            seconds.push(t.elapsed().as_secs_f64());
            value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        }
        let mut seconds = seconds.split_off(2);
        seconds.sort_by(f64::total_cmp);
        println!(
            "MMCR loss + backward, V = 2, B = {b}, D = {d}: median of {reps} = {:.3} ms (loss {value:.9})",
            seconds[reps / 2] * 1e3
        );
    }
    Ok(())
}
