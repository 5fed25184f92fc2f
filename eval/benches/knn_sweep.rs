//! Timing of `knn_sweep` on the duality paper's grid (6 k × 6 T) at 10 000 train × 2 000 test ×
//! 512-d, against one `knn_accuracy` call. Run with
//! `cargo bench -p ssl-eval --bench knn_sweep` (optional arguments: n_train n_test d).

use std::time::Instant;

use ssl_eval::{knn_accuracy, knn_sweep, Features, SWEEP_KS, SWEEP_TEMPERATURES};

/// Deterministic clustered features: `classes` random centres plus Gaussian-ish noise.
fn clustered(
    n: usize,
    d: usize,
    classes: u32,
    centres: &[f32],
    state: &mut u64,
) -> (Features, Vec<u32>) {
    let mut uniform = || {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
    };
    let labels: Vec<u32> = (0..n as u32).map(|i| i % classes).collect();
    let mut data = Vec::with_capacity(n * d);
    for &y in &labels {
        for j in 0..d {
            let noise = uniform() + uniform() + uniform();
            data.push(centres[y as usize * d + j] + 2.0 * noise);
        }
    }
    (Features::new(data, n, d).expect("shape"), labels)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n_train = args.first().copied().unwrap_or(10_000);
    let n_test = args.get(1).copied().unwrap_or(2_000);
    let d = args.get(2).copied().unwrap_or(512);
    let classes = 100;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let centres: Vec<f32> = (0..classes as usize * d)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32 - 0.5
        })
        .collect();
    let (train, train_y) = clustered(n_train, d, classes, &centres, &mut state);
    let (test, test_y) = clustered(n_test, d, classes, &centres, &mut state);
    println!(
        "knn_sweep: {n_train} train × {n_test} test × {d}-d, {} threads, grid {} k × {} T",
        rayon::current_num_threads(),
        SWEEP_KS.len(),
        SWEEP_TEMPERATURES.len()
    );
    for round in 0..3 {
        let start = Instant::now();
        let sweep = knn_sweep(
            &train,
            &train_y,
            &test,
            &test_y,
            &SWEEP_KS,
            &SWEEP_TEMPERATURES,
        )?;
        let sweep_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let single = knn_accuracy(&train, &train_y, &test, &test_y, 20, 0.07)?;
        let single_s = start.elapsed().as_secs_f64();
        let best = sweep.best();
        println!(
            "round {round}: sweep {sweep_s:.3} s (best k={} T={} acc={:.4}); one knn_accuracy {single_s:.3} s (acc={single:.4})",
            best.k, best.t, best.accuracy
        );
    }
    Ok(())
}
