//! The cost of IConE's whole-table repulsion `L_div` (forward + backward into the raw table,
//! through the row normalisation) against a plain `N×N` Gram matmul `E Eᵀ` of the same shapes,
//! and against the same loss composed from whole-matrix tensor ops under autograd.
//!
//! `cargo bench -p ssl-icone --bench diversity -- [--n N] [--d D] [--tile T] [--reps R]`;
//! defaults N = 5,000, d = 384 (the paper's largest 2-D setting: ViT-S width); `RAYON_NUM_THREADS`
//! sets the threads.

use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor, Var};
use ssl_icone::{normalize_rows, squared_hinge_diversity, DEFAULT_TILE};

fn median_seconds(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[reps / 2])
}

/// `L_div` from whole-matrix ops: Gram, hinge, off-diagonal mask, mean of squares.
fn composed(e: &Tensor) -> Result<Tensor> {
    let n = e.dim(0)?;
    let off_diagonal =
        (Tensor::ones((n, n), e.dtype(), e.device())? - Tensor::eye(n, e.dtype(), e.device())?)?;
    let gram = e.matmul(&e.t()?)?.relu()?;
    Ok(((gram * off_diagonal)?.sqr()?.sum_all()? / (n * (n - 1)) as f64)?)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| -> Result<usize> {
        Ok(match args.iter().position(|a| a == name) {
            Some(i) => args.get(i + 1).map_or(Ok(default), |v| v.parse())?,
            None => default,
        })
    };
    let (n, d) = (flag("--n", 5000)?, flag("--d", 384)?);
    let tile = flag("--tile", DEFAULT_TILE)?;
    let reps = flag("--reps", 7)?;
    let table = Var::from_tensor(&Tensor::randn(0f32, 0.02, (n, d), &Device::Cpu)?)?;
    let e = table.as_tensor();

    let matmul = median_seconds(reps, || {
        e.matmul(&e.t()?)?;
        Ok(())
    })?;
    let tiled = median_seconds(reps, || {
        squared_hinge_diversity(&normalize_rows(e)?, tile, None)?.backward()?;
        Ok(())
    })?;
    let whole = median_seconds(reps, || {
        composed(&normalize_rows(e)?)?.backward()?;
        Ok(())
    })?;
    println!(
        "L_div at N = {n}, d = {d}, tile {tile}; median of {reps}, {} threads\n",
        rayon::current_num_threads()
    );
    println!("| computation | ms | × plain matmul |\n|---|---|---|");
    for (what, t) in [
        ("plain Gram matmul E Eᵀ (forward only)", matmul),
        ("L_div forward + backward, tiled (ours)", tiled),
        ("L_div forward + backward, whole-matrix autograd", whole),
    ] {
        println!("| {what} | {:.1} | {:.2} |", t * 1e3, t / matmul);
    }
    Ok(())
}
