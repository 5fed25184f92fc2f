//! Timing of the CARP spherical k-means (`docs/spec/metrics.md` §9) at 10,000 × 512 features drawn
//! around 100 random centres, k = 100, 10 restarts, at most 100 iterations, on 2 threads (median of
//! 3), and of Ward linkage on the cosine distances of 1,000 × 512 features (spec §10) and of
//! spectral clustering (spec §11 Default, block Krylov eigenvectors of the sparse affinity) of
//! 2,000 × 512 features into 100 clusters (single runs). Run with
//! `cargo bench -p ssl-eval --bench kmeans -- [threads]`.

use std::time::Instant;

use anyhow::Result;
use ssl_eval::{
    adjusted_rand_index, spectral_clustering, Dendrogram, Features, KMeansConfig, SpectralConfig,
    SphericalKMeans,
};

const N: usize = 10_000;
const D: usize = 512;
const K: usize = 100;
const WARD_N: usize = 1_000;
const SPECTRAL_N: usize = 2_000;
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

/// `n` rows, row `i` around centre `i % K` (Irwin–Hall noise of std `NOISE`).
fn clustered(n: usize, centres: &[f32], state: &mut u64) -> (Features, Vec<u32>) {
    let labels: Vec<u32> = (0..n).map(|i| (i % K) as u32).collect();
    let mut data = Vec::with_capacity(n * D);
    for &y in &labels {
        for j in 0..D {
            let noise = uniform(state) + uniform(state) + uniform(state);
            data.push(centres[y as usize * D + j] + 2.0 * NOISE * noise);
        }
    }
    (Features::new(data, n, D).expect("shape"), labels)
}

fn median(mut seconds: Vec<f64>) -> f64 {
    seconds.sort_by(f64::total_cmp);
    seconds[seconds.len() / 2]
}

fn main() -> Result<()> {
    let threads = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let centres: Vec<f32> = (0..K * D).map(|_| uniform(&mut state)).collect();
    let (x, y) = clustered(N, &centres, &mut state);
    let cfg = KMeansConfig::new(K);

    let mut seconds = Vec::new();
    let mut model = None;
    for _ in 0..REPS {
        let t = Instant::now();
        model = Some(pool.install(|| SphericalKMeans::fit(&x, &cfg))?);
        seconds.push(t.elapsed().as_secs_f64());
    }
    let model = model.expect("at least one repetition");
    println!(
        "spherical k-means: {N} × {D}, k = {K}, {} restarts, ≤ {} iterations, {threads} threads: \
         median of {REPS} = {:.3} s (best restart: {} iterations, ARI vs generating centres {:.4})",
        cfg.restarts,
        cfg.max_iter,
        median(seconds),
        model.iterations,
        adjusted_rand_index(&y, &model.labels)?
    );

    let ward_x = Features::new(x.data[..WARD_N * D].to_vec(), WARD_N, D)?;
    let mut seconds = Vec::new();
    for _ in 0..REPS {
        let t = Instant::now();
        pool.install(|| Dendrogram::ward_cosine(&ward_x))?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    println!(
        "Ward linkage (cosine distances + nearest-neighbour chain): {WARD_N} × {D}, {threads} \
         threads: median of {REPS} = {:.3} s",
        median(seconds)
    );

    let spectral_x = Features::new(x.data[..SPECTRAL_N * D].to_vec(), SPECTRAL_N, D)?;
    let t = Instant::now();
    let labels =
        pool.install(|| spectral_clustering(&spectral_x, K, &SpectralConfig::default()))?;
    println!(
        "spectral clustering: {SPECTRAL_N} × {D} into {K} clusters, {threads} threads: {:.3} s \
         (ARI vs generating centres {:.4})",
        t.elapsed().as_secs_f64(),
        adjusted_rand_index(&y[..SPECTRAL_N], &labels)?
    );
    Ok(())
}
