//! One objective's loss inside your own Candle training loop, without the trainer:
//! `cargo run --release -p ssl-examples --example loss_in_own_loop`.
//!
//! A linear encoder sees two noisy views of the same 32-d points; VICReg's loss (invariance,
//! variance and covariance of the `[2, B, D]` embeddings) trains it with Candle's AdamW.
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, Optimizer, VarBuilder, VarMap};
use ssl_vicreg::{vicreg_loss, VicregConfig};

/// Trains for `steps` steps; returns the loss at the first and the last step.
pub fn run(steps: usize) -> anyhow::Result<(f32, f32)> {
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let encoder = candle_nn::linear(32, 16, vb.pp("encoder"))?;
    let mut optimizer = candle_nn::AdamW::new_lr(varmap.all_vars(), 1e-2)?;
    let points = Tensor::randn(0f32, 1.0, (256, 32), &device)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let view = |x: &Tensor| -> candle_core::Result<Tensor> {
            x + Tensor::randn(0f32, 0.1, x.dims(), x.device())?
        };
        let z = Tensor::stack(
            &[
                encoder.forward(&view(&points)?)?,
                encoder.forward(&view(&points)?)?,
            ],
            0,
        )?;
        let loss = vicreg_loss(&z, &VicregConfig::default())?;
        optimizer.backward_step(&loss)?;
        losses.push(loss.to_scalar::<f32>()?);
    }
    let (first, last) = (losses[0], losses[losses.len() - 1]);
    println!("VICReg loss: {first:.3} at the first step, {last:.3} after {steps}");
    Ok((first, last))
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    run(200).map(drop)
}
