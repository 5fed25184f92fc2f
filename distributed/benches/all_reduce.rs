//! The gradient all-reduce of one step of `train_step` row 1 (ResNet-18 CIFAR + a 2048-2048
//! projector: 16.0 M parameters), timed as the trainer runs it: [`reduce_gradients`] in 25 MiB
//! buckets, mean over the ranks. Run it under the launcher, one thread a rank:
//!
//! ```sh
//! cargo build --release -p ssl-dist --features mpi --bench all_reduce
//! mpirun -np 2 target/release/deps/all_reduce-* [REPEATS]
//! ```
//!
//! Rank 0 prints the median, minimum and maximum seconds of REPEATS (20) all-reduces after 3
//! unmeasured ones.

use std::time::Instant;

use candle_core::{Device, Var};
use ssl_dist::{reduce_gradients, Collective, Comm, MpiCollective, BUCKET_ELEMENTS};

/// Parameters of row 1, in 64 tensors of 250,000 values (the buckets pack them as they would
/// the real tensors: the sizes matter, not the shapes).
const PARAMETERS: usize = 16_000_000;
const TENSORS: usize = 64;

fn main() -> anyhow::Result<()> {
    let repeats: usize = std::env::args()
        .nth(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20);
    let comm = MpiCollective::init()?;
    let each = PARAMETERS / TENSORS;
    let params: Vec<(String, Var)> = (0..TENSORS)
        .map(|i| {
            Ok((
                format!("p{i:02}"),
                Var::zeros(each, candle_core::DType::F32, &Device::Cpu)?,
            ))
        })
        .collect::<candle_core::Result<_>>()?;
    // Σ of every parameter: its backward gives each an all-ones gradient.
    let mut total = params[0].1.as_tensor().sum_all()?;
    for (_, v) in &params[1..] {
        total = (total + v.as_tensor().sum_all()?)?;
    }
    let mut times = Vec::with_capacity(repeats);
    for round in 0..3 + repeats {
        let mut grads = total.backward()?;
        comm.barrier()?;
        let started = Instant::now();
        reduce_gradients(&comm, &params, &mut grads, BUCKET_ELEMENTS)?;
        if round >= 3 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    if comm.rank() == 0 {
        println!(
            "all-reduce of {PARAMETERS} f32 gradients over {} ranks: median {:.4} s (min {:.4}, max {:.4}, {repeats} repeats)",
            comm.world_size(),
            times[repeats / 2],
            times[0],
            times[repeats - 1]
        );
    }
    Ok(())
}
