//! Spectral clustering (`docs/spec/metrics.md` §11 Default) of 2,000 × 512 features drawn around
//! `K` random centres into `K` clusters, for K = 10 and K = 100 (median of 3 runs each, on
//! `threads` rayon threads, default 2). `--save FILE` writes the labels of both runs (one line
//! each) so that two builds can be compared. Run with
//! `cargo bench -p ssl-eval --bench spectral -- [threads] [--save FILE]`.

use std::time::Instant;

use anyhow::Result;
use ssl_eval::{adjusted_rand_index, spectral_clustering, Features, SpectralConfig};

const N: usize = 2_000;
const D: usize = 512;
/// Per-dimension noise std relative to the centres' per-dimension std (uniform(−½, ½): ≈ 0.29).
const NOISE: f32 = 0.6;
const REPS: usize = 3;

/// xorshift64 uniform in `[−½, ½)`.
fn uniform(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    (*state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
}

/// `N` rows, row `i` around centre `i % k` (Irwin–Hall noise of std `NOISE`).
fn clustered(k: usize, state: &mut u64) -> (Features, Vec<u32>) {
    let centres: Vec<f32> = (0..k * D).map(|_| uniform(state)).collect();
    let labels: Vec<u32> = (0..N).map(|i| (i % k) as u32).collect();
    let mut data = Vec::with_capacity(N * D);
    for &y in &labels {
        for j in 0..D {
            let noise = uniform(state) + uniform(state) + uniform(state);
            data.push(centres[y as usize * D + j] + 2.0 * NOISE * noise);
        }
    }
    (Features::new(data, N, D).expect("shape"), labels)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads = args
        .iter()
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(2);
    let save = args
        .iter()
        .position(|a| a == "--save")
        .and_then(|i| args.get(i + 1));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut saved = String::new();
    for k in [10, 100] {
        let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ k as u64;
        let (x, y) = clustered(k, &mut state);
        let mut seconds = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..REPS {
            let t = Instant::now();
            labels = pool.install(|| spectral_clustering(&x, k, &SpectralConfig::default()))?;
            seconds.push(t.elapsed().as_secs_f64());
        }
        seconds.sort_by(f64::total_cmp);
        println!(
            "spectral clustering: {N} × {D} into {k} clusters, {threads} threads: median of \
             {REPS} = {:.3} s (ARI vs generating centres {:.4})",
            seconds[REPS / 2],
            adjusted_rand_index(&y, &labels)?
        );
        let line: Vec<String> = labels.iter().map(u32::to_string).collect();
        saved.push_str(&line.join(" "));
        saved.push('\n');
    }
    if let Some(path) = save {
        std::fs::write(path, saved)?;
    }
    Ok(())
}
