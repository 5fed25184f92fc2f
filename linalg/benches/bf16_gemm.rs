//! The bf16 products of `train.precision: bf16` ([`ssl_linalg::bf16_gemm::gemm_bf16_on`]), on
//! every bf16 kernel this CPU runs, against the f32 `gemm` crate's (through `gemm_in`, as our ops
//! call it), single-threaded, on shapes of the training-step rows: per shape the median of
//! `--reps` calls of each, taken in turn, GFLOP/s and each kernel's time over f32's.
//!
//! `cargo bench -p ssl-linalg --bench bf16_gemm [-- --reps 21]`

use std::hint::black_box;
use std::time::Instant;

use ssl_linalg::bf16_gemm::{gemm_bf16_on, gemm_in, Bf16Kernel, Precision};

/// `(name, m, n, k, a transposed, b transposed)`: `dst [m, n] = a [m, k] · b [k, n]`, an
/// operand transposed when it is read through the strides of the transpose of a row-major one.
const SHAPES: [(&str, usize, usize, usize, bool, bool); 8] = [
    ("projector 128×512→2048 (x·Wᵀ)", 128, 2048, 512, false, true),
    (
        "projector 128×2048→2048 (x·Wᵀ)",
        128,
        2048,
        2048,
        false,
        true,
    ),
    (
        "projector dW 2048×2048 (Gᵀ·x)",
        2048,
        2048,
        128,
        true,
        false,
    ),
    (
        "conv 3×3 64→64, 32² chunk (W·cols)",
        64,
        2048,
        576,
        false,
        false,
    ),
    (
        "conv 3×3 256→256, 8² chunk (W·cols)",
        256,
        512,
        2304,
        false,
        false,
    ),
    (
        "conv dW 64×576, 32² chunk (dy·colsᵀ)",
        64,
        576,
        2048,
        false,
        true,
    ),
    ("ViT-S qkv 392×384→1152 (x·Wᵀ)", 392, 1152, 384, false, true),
    ("ViT-S mlp 392×1536→384 (x·Wᵀ)", 392, 384, 1536, false, true),
];

fn main() {
    let mut reps = 21;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).unwrap_or(reps),
            "--bench" => {}
            other => {
                eprintln!("error: unknown argument {other}\nusage: bf16_gemm [--reps N]");
                std::process::exit(2);
            }
        }
    }
    let kernels: Vec<Bf16Kernel> = Bf16Kernel::ALL
        .into_iter()
        .filter(|k| *k != Bf16Kernel::RoundedF32 && k.available())
        .collect();
    let names: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
    println!("bf16 kernels: {names:?}; median of {reps} calls of each, taken in turn");
    let columns = |f: &dyn Fn(&str) -> String| names.iter().map(|n| f(n)).collect::<String>();
    println!(
        "| shape | f32 (ms) |{} f32 GFLOP/s |{}",
        columns(&|n| format!(" {n} (ms) |")),
        columns(&|n| format!(" {n} GFLOP/s | {n} / f32 |"))
    );
    println!(
        "|---|---:|{}---:|{}",
        columns(&|_| "---:|".into()),
        columns(&|_| "---:|---:|".into())
    );
    for (name, m, n, k, a_transposed, b_transposed) in SHAPES {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let a_strides = if a_transposed { (1, m) } else { (k, 1) };
        let b_strides = if b_transposed { (1, k) } else { (n, 1) };
        let mut dst = vec![0f32; m * n];
        let mut times = vec![Vec::new(); 1 + kernels.len()];
        for _ in 0..reps {
            for (which, times) in times.iter_mut().enumerate() {
                let (dst_mat, a_mat, b_mat) = (
                    (dst.as_mut_ptr(), n, 1),
                    (a.as_ptr(), a_strides.0, a_strides.1),
                    (b.as_ptr(), b_strides.0, b_strides.1),
                );
                let start = Instant::now();
                // SAFETY: `a`, `b` and `dst` hold `[m, k]`, `[k, n]` and `[m, n]` at these
                // strides; each kernel runs here.
                unsafe {
                    match which {
                        0 => gemm_in(Precision::F32, (m, n, k), dst_mat, a_mat, b_mat, false),
                        _ => gemm_bf16_on(
                            kernels[which - 1],
                            (m, n, k),
                            dst_mat,
                            a_mat,
                            b_mat,
                            false,
                        ),
                    }
                };
                times.push(start.elapsed().as_secs_f64() * 1e3);
                black_box(&dst);
            }
        }
        let medians: Vec<f64> = times
            .into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            })
            .collect();
        let gflop = 2.0 * (m * n * k) as f64 / 1e9;
        let f32_ms = medians[0];
        let ms: String = medians[1..].iter().map(|t| format!(" {t:.3} |")).collect();
        let rates: String = medians[1..]
            .iter()
            .map(|t| format!(" {:.0} | **{:.2}** |", gflop / t * 1e3, t / f32_ms))
            .collect();
        println!(
            "| {name} | {f32_ms:.3} |{ms} {:.0} |{rates}",
            gflop / f32_ms * 1e3
        );
    }
}
