//! The training step on a CUDA GPU against the CPU's fused kernels (see `parity/mod.rs`): the
//! GPU runs Candle's CUDA kernels, cuBLAS and our composed ops; the CPU our Winograd and im2col
//! convolutions, fused batch/layer norm and attention, so each side checks the other.
//!
//! Built only with `--features cuda`, and needs a GPU:
//! `cargo test --release -p ssl --features cuda --test cuda -- --test-threads 1`.
//! CI builds the CPU workspace, where this file compiles to nothing.
#![cfg(feature = "cuda")]

mod parity;

use anyhow::Result;
use candle_core::{Device, Tensor};
use parity::{check_encoder_row, compare, config, trace, ENCODER_ROWS};
use ssl::setup;

fn gpu() -> Device {
    Device::new_cuda(0).expect("this test needs a CUDA GPU (it is built only with --features cuda)")
}

/// The four rows of the `train_step` bench at test size.
#[test]
fn every_encoder_trains_on_cuda_as_on_the_cpu() -> Result<()> {
    let device = gpu();
    let mut report = Vec::new();
    for row in &ENCODER_ROWS {
        report.extend(check_encoder_row(row, &device, false)?);
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// Every registered objective on the main job's encoder (digits CNN, projector 512-512), B = 16
/// digits × 2 views: the first step's loss and gradients, then three steps' losses. An objective
/// the default configuration refuses must be refused on both devices.
#[test]
fn every_objective_gives_the_cpu_loss_and_gradients_on_cuda() -> Result<()> {
    let device = gpu();
    let base = config(&[])?;
    let data = setup::data(&base)?;
    let b = 16;
    let positions: Vec<usize> = data.train[..b].to_vec();
    let clean = setup::samples(&data, &positions, &Device::Cpu)?;
    let images = Tensor::cat(&[(&clean + 0.1)?, (&clean * 0.9)?], 0)?;
    let labels = setup::labels(&data.dataset, &positions);
    let mut report = Vec::new();
    for registration in ssl_core::registry() {
        let name = registration.name;
        let cfg = config(&[
            &format!("objective.name={name}"),
            &format!("train.batch_size={b}"),
            "train.views=2",
        ])?;
        let cpu = match trace(&cfg, &data, &images, &labels, 3, &Device::Cpu, false) {
            Ok(t) => t,
            Err(refused) => {
                let on_gpu = trace(&cfg, &data, &images, &labels, 3, &device, false);
                println!("{name}: refused on the CPU ({})", refused.root_cause());
                if on_gpu.is_ok() {
                    report.push(format!("{name}: refused on the CPU, trained on the GPU"));
                }
                continue;
            }
        };
        let gpu = match trace(&cfg, &data, &images, &labels, 3, &device, false) {
            Ok(t) => t,
            Err(e) => {
                report.push(format!("{name}: failed on the GPU: {e:#}"));
                continue;
            }
        };
        let (problems, largest) = compare(&cpu, &gpu, None, 1e-2)?;
        println!(
            "{name}: loss {:.6} / {:.6}, largest gradient error {largest:.1e}",
            cpu.loss, gpu.loss
        );
        report.extend(problems.into_iter().map(|p| format!("{name}: {p}")));
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// `train.precision: bf16` on the GPU multiplies in bf16 (the CPU only rounds the operands):
/// five steps follow f32's losses within bf16's precision, and differ from them.
#[test]
fn bf16_training_on_cuda_follows_f32() -> Result<()> {
    let device = gpu();
    let losses = |precision: &str| -> Result<Vec<f64>> {
        let cfg = config(&[
            "objective.name=icone",
            &format!("train.precision={precision}"),
        ])?;
        let data = setup::data(&cfg)?;
        let b = 32;
        let positions: Vec<usize> = data.train[..b].to_vec();
        let clean = setup::samples(&data, &positions, &Device::Cpu)?;
        let images = Tensor::cat(&[(&clean + 0.1)?, (&clean - 0.1)?], 0)?;
        let labels = setup::labels(&data.dataset, &positions);
        Ok(trace(&cfg, &data, &images, &labels, 5, &device, false)?.losses)
    };
    let (full, bf16) = (losses("f32")?, losses("bf16")?);
    println!("f32 {full:?}\nbf16 {bf16:?}");
    assert!(full[4] < full[0], "training lowers the loss: {full:?}");
    let mut largest = 0.0f64;
    for (a, b) in full.iter().zip(&bf16) {
        let relative = (a - b).abs() / a.abs();
        assert!(relative < 2e-2, "f32 {full:?} vs bf16 {bf16:?}");
        largest = largest.max(relative);
    }
    assert!(largest > 0.0, "bf16 products must change the numbers");
    Ok(())
}
