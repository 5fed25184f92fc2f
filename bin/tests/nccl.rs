//! `ssl run --device cuda --distributed nccl` (feature `nccl`) on one GPU against `--distributed
//! none`: the main job for its first two epochs (its schedule, stopped by
//! `train.stop_after_epochs`) must end with the same weights. At world size 1 NCCL still gathers
//! the batch and all-reduces the gradients on the GPU (device copies), so this checks the whole
//! path a multi-GPU run takes but the traffic between GPUs.
//!
//! Tolerance: 1e-5 of the largest weight, as `distributed.rs`, unless two `--distributed none`
//! runs already differ by more (GPU kernels that add in a varying order, which AdamW turns into
//! steps of the learning rate's size on gradients that are only rounding noise); then 10 times
//! that difference. A lost or doubled gradient, or a bucket split at the wrong offset, moves the
//! weights by far more within a few steps.
//!
//! It also prints each run's training throughput (the step time with NCCL on, at world size 1).
//!
//! Needs a GPU: `cargo test --release -p ssl --features nccl --test nccl`; where the CUDA driver
//! finds none, the test prints so and passes. `SSL_BIN` names the `ssl` binary to run (default:
//! this build's), as `tools/cuda/device.sh` sets it.

use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::cuda_backend::cudarc::driver::result::DriverError;
use candle_core::cuda_backend::cudarc::driver::sys::CUresult;
use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::{Device, Tensor};

fn ssl(distributed: &str, out: &Path) {
    let bin =
        std::env::var_os("SSL_BIN").map_or_else(|| env!("CARGO_BIN_EXE_ssl").into(), PathBuf::from);
    let run = Command::new(bin)
        .args(["run", "--device", "cuda", "--distributed", distributed])
        .args(["--set", "train.stop_after_epochs=2", "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "--distributed {distributed}:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

fn weights(run: &Path) -> Vec<(String, Tensor)> {
    let mut w: Vec<_> =
        candle_core::safetensors::load(run.join("checkpoint/model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// The largest difference between two runs' weights of the same names, and the largest weight.
fn difference(a: &Path, b: &Path) -> (f32, f32) {
    let largest = |t: &Tensor| -> f32 {
        t.abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    };
    let (a, b) = (weights(a), weights(b));
    assert_eq!(
        a.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        b.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    a.iter()
        .zip(&b)
        .fold((0f32, 0f32), |(diff, scale), ((_, x), (_, y))| {
            (diff.max(largest(&(x - y).unwrap())), scale.max(largest(x)))
        })
}

/// The median of a run's images per second over its steps after the first 3 (warm-up: kernel
/// compilation, cuDNN's algorithm search).
fn images_per_s(run: &Path) -> f64 {
    let mut rates: Vec<f64> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["images_per_s"].as_f64()
        })
        .skip(3)
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN)
}

#[test]
fn nccl_on_one_gpu_trains_the_weights_of_one_process() {
    match CudaContext::device_count() {
        Ok(0) | Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => {
            eprintln!("skipped: the CUDA driver finds no GPU");
            return;
        }
        Ok(_) => {}
        Err(e) => panic!("CUDA failed before looking for a GPU: {e:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let (none, again, nccl) = (
        dir.path().join("none"),
        dir.path().join("again"),
        dir.path().join("nccl"),
    );
    ssl("none", &none);
    ssl("none", &again);
    ssl("nccl", &nccl);
    let (noise, scale) = difference(&none, &again);
    let (diff, _) = difference(&none, &nccl);
    let tolerance = (1e-5 * scale).max(10.0 * noise);
    println!(
        "images/s, median after 3 steps: none {:.0} and {:.0}, nccl {:.0}",
        images_per_s(&none),
        images_per_s(&again),
        images_per_s(&nccl)
    );
    println!(
        "largest weight {scale:.3e}; none against none {noise:.3e}, nccl against none {diff:.3e} \
         (tolerance {tolerance:.3e})"
    );
    assert!(
        diff <= tolerance,
        "--distributed nccl ends {diff:.3e} from --distributed none (tolerance {tolerance:.3e})"
    );
}
