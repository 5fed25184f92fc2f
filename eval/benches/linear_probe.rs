//! The offline linear probe (`docs/spec/metrics.md` §1) against scikit-learn's
//! `LogisticRegression(lbfgs)` on the same data and machine: 10,000 × 512 training features of 10
//! classes, 2,000 test features.
//!
//! The features are drawn here (Gaussian classes that overlap, so neither solver reaches 100 %),
//! written to a temporary directory, fitted by `ssl_eval::linear_probe` (standardisation, L-BFGS,
//! C = 1) and by `linear_probe_sklearn.py` beside this file (StandardScaler + lbfgs, C = 1,
//! tol 1e-4, max_iter 1000) with the same thread count. Run with
//! `cargo bench -p ssl-eval --bench linear_probe -- [--reps N]` (needs `python3` with
//! scikit-learn for the reference column; `RAYON_NUM_THREADS` sets the threads of both).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use ssl_eval::{linear_probe, Features, LinearProbeConfig};

const N_TRAIN: usize = 10_000;
const N_TEST: usize = 2_000;
const D: usize = 512;
const CLASSES: usize = 10;

/// A small deterministic normal generator (xorshift64* + Box–Muller).
struct Normal(u64);

impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// `n` samples: class `i % CLASSES`, class means ~ N(0, 0.15²) per dimension, unit noise.
fn draw(means: &[Vec<f64>], n: usize, rng: &mut Normal) -> (Features, Vec<u32>) {
    let mut data = Vec::with_capacity(n * D);
    let labels: Vec<u32> = (0..n).map(|i| (i % CLASSES) as u32).collect();
    for &y in &labels {
        data.extend(means[y as usize].iter().map(|m| (m + rng.sample()) as f32));
    }
    (Features::new(data, n, D).expect("shape"), labels)
}

fn write(path: &Path, values: impl Iterator<Item = [u8; 4]>) -> Result<()> {
    let bytes: Vec<u8> = values.flatten().collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(3), |r| r.parse())?;
    let mut rng = Normal(0x5eed);
    let means: Vec<Vec<f64>> = (0..CLASSES)
        .map(|_| (0..D).map(|_| 0.15 * rng.sample()).collect())
        .collect();
    let (train, train_y) = draw(&means, N_TRAIN, &mut rng);
    let (test, test_y) = draw(&means, N_TEST, &mut rng);

    let mut seconds = Vec::new();
    let mut result = None;
    for _ in 0..reps {
        let t = Instant::now();
        result = Some(linear_probe(
            &train,
            &train_y,
            &test,
            &test_y,
            &LinearProbeConfig::default(),
        )?);
        seconds.push(t.elapsed().as_secs_f64());
    }
    seconds.sort_by(f64::total_cmp);
    let ours = seconds[seconds.len() / 2];
    let result = result.expect("at least one repetition");
    let threads = rayon::current_num_threads();
    println!(
        "{N_TRAIN} × {D} train, {N_TEST} test, {CLASSES} classes, C = 1, {threads} threads, median of {reps}\n"
    );
    println!("| solver | seconds | accuracy | balanced accuracy |\n|---|---|---|---|");
    println!(
        "| ssl-eval (L-BFGS, {} iterations) | {ours:.3} | {:.2} % | {:.2} % |",
        result.iterations,
        100.0 * result.accuracy,
        100.0 * result.balanced_accuracy
    );

    let dir = std::env::temp_dir().join("ssl-linear-probe-bench");
    std::fs::create_dir_all(&dir)?;
    write(
        &dir.join("train.f32"),
        train.data.iter().map(|v| v.to_le_bytes()),
    )?;
    write(
        &dir.join("test.f32"),
        test.data.iter().map(|v| v.to_le_bytes()),
    )?;
    write(
        &dir.join("train_y.u32"),
        train_y.iter().map(|v| v.to_le_bytes()),
    )?;
    write(
        &dir.join("test_y.u32"),
        test_y.iter().map(|v| v.to_le_bytes()),
    )?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/linear_probe_sklearn.py");
    let output = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .arg(D.to_string())
        .arg(reps.to_string())
        .env("OMP_NUM_THREADS", threads.to_string())
        .env("OPENBLAS_NUM_THREADS", threads.to_string())
        .env("MKL_NUM_THREADS", threads.to_string())
        .output();
    match output {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let reference: serde_json::Value = serde_json::from_str(text.trim())?;
            let theirs = reference["seconds"].as_f64().unwrap_or(f64::NAN);
            let accuracy = reference["accuracy"].as_f64().unwrap_or(f64::NAN);
            println!(
                "| scikit-learn {} (lbfgs, {} iterations) | {theirs:.3} | {:.2} % | {:.2} % |",
                reference["version"].as_str().unwrap_or("?"),
                reference["iterations"],
                100.0 * accuracy,
                100.0 * reference["balanced_accuracy"].as_f64().unwrap_or(f64::NAN)
            );
            println!(
                "\nratio ours / scikit-learn: {:.2} (time), accuracy difference {:+.2} pt",
                ours / theirs,
                100.0 * (result.accuracy - accuracy)
            );
        }
        Ok(o) => println!(
            "\nscikit-learn reference failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => println!("\nscikit-learn reference not run: python3 unavailable ({e})"),
    }
    Ok(())
}
