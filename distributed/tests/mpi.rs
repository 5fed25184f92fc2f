//! Multi-process tests of the MPI back end (feature `mpi`).
//!
//! Each test runs twice: started by `cargo test`, it launches
//! `mpirun --oversubscribe -np 2 <this test binary> <the test> --exact` and asserts that every
//! rank passed; started by `mpirun` (it sees `OMPI_COMM_WORLD_SIZE`), it is one rank and runs the
//! checks. Without `mpirun` on the PATH the outer test prints why and passes: `.ci/run` installs
//! OpenMPI first, so CI always runs them.

use std::process::Command;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use ssl_dist::{
    reduce_gradients, Collective, Comm, GradientAveraging, GradientReduction, MpiCollective,
};

const RANKS: usize = 2;

/// Runs `name` (this binary's test of that name) on [`RANKS`] ranks under mpirun, or returns
/// `false` when this process is already a rank (the caller then runs the body).
fn launched(name: &str) -> bool {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() {
        return false;
    }
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!(
            "skipped {name}: no mpirun on the PATH (apt-get install openmpi-bin libopenmpi-dev)"
        );
        return true;
    }
    let exe = std::env::current_exe().unwrap();
    // Each rank writes to a file of its own: on a shared stdout the two ranks' lines interleave
    // ("test result: okok"), and counting them there is a race.
    let outputs = tempfile::tempdir().unwrap();
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "-np", &RANKS.to_string()])
        .arg("--output-filename")
        .arg(outputs.path())
        .arg(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .unwrap();
    let ranks = rank_outputs(outputs.path());
    let text = format!(
        "{}{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        ranks.join("\n")
    );
    assert!(out.status.success(), "a rank failed:\n{text}");
    // Each rank's harness reports the one test it ran; a filter that matched nothing would pass
    // silently.
    let passed = ranks
        .iter()
        .filter(|rank| rank.contains("test result: ok. 1 passed"))
        .count();
    assert_eq!(passed, RANKS, "every rank must run {name}:\n{text}");
    true
}

/// The text of every `stdout` file under `dir`, where `mpirun --output-filename dir` puts one
/// per rank (OpenMPI 4: `dir/1/rank.N/stdout`).
fn rank_outputs(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if path.file_name().is_some_and(|n| n == "stdout") {
            found.push(std::fs::read_to_string(&path).unwrap());
        }
    }
    found
}

/// A fixed `[2 views, n, d]` batch, the same on every rank.
fn global_batch(n: usize, d: usize) -> Tensor {
    let values: Vec<f32> = (0..2 * n * d)
        .map(|i| ((i * 7919 % 101) as f32 / 50.0 - 1.0) + (i as f32 * 0.37).sin())
        .collect();
    Tensor::from_vec(values, (2, n, d), &Device::Cpu).unwrap()
}

type Loss = fn(&Tensor) -> candle_core::Result<Tensor>;

/// VICReg of a `[2, n, d]` batch (λ = μ = 25, ν = 1): the views' mean squared difference, and
/// for each view the hinge on the per-dimension standard deviation and the squared off-diagonal
/// covariances (over the batch: what gathering must see whole).
fn vicreg(z: &Tensor) -> candle_core::Result<Tensor> {
    let (_, n, d) = z.dims3()?;
    let (a, b) = (z.get(0)?, z.get(1)?);
    let mut loss = ((&a - &b)?.sqr()?.mean_all()? * 25.0)?;
    for x in [a, b] {
        let x = x.broadcast_sub(&x.mean_keepdim(0)?)?;
        let cov = (x.t()?.matmul(&x)? / (n - 1) as f64)?;
        let diag = (&cov * Tensor::eye(d, cov.dtype(), cov.device())?)?;
        let std = (diag.sum(1)? + 1e-4)?.sqrt()?;
        let hinge = (1.0 - std)?.relu()?.mean_all()?;
        let off = ((cov.sqr()?.sum_all()? - diag.sqr()?.sum_all()?)? / d as f64)?;
        loss = (loss + (hinge * 25.0)? + off)?;
    }
    Ok(loss)
}

/// SimCLR's NT-Xent (τ = 0.5) of a `[2, n, d]` batch: every row's positive is its other view,
/// its negatives every other row of the batch.
fn nt_xent(z: &Tensor) -> candle_core::Result<Tensor> {
    let (_, n, d) = z.dims3()?;
    let z = z.reshape((2 * n, d))?;
    let z = z.broadcast_div(&z.sqr()?.sum_keepdim(1)?.sqrt()?)?;
    let eye = Tensor::eye(2 * n, z.dtype(), z.device())?;
    let sim = ((z.matmul(&z.t()?)? / 0.5)? - (&eye * 1e9)?)?;
    let max = sim.max_keepdim(1)?.detach();
    let lse = (sim.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()? + max)?;
    let positives = Tensor::cat(&[eye.narrow(0, n, n)?, eye.narrow(0, 0, n)?], 0)?;
    let positive = (&sim * positives)?.sum_keepdim(1)?;
    (lse - positive)?.mean_all()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn max_abs(a: &Tensor) -> f32 {
    a.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

/// Rank `r` gathers its rows of a fixed batch and weighs the loss of the gathered batch by
/// `r + 1`, so the ranks' losses differ. The global loss is their sum, `Σ_r (r + 1) · L(Z)`; the
/// all-gather's backward must give each rank exactly that loss's gradient with respect to its
/// own rows, as one process computes it on the whole batch. Forgetting the sum over ranks gives
/// rank `r` only `(r + 1) · ∂L/∂rows`, a third and two thirds of it. Two losses: VICReg (variance
/// and covariance over the batch) and SimCLR's NT-Xent (in-batch negatives).
#[test]
fn gather_backward_is_the_gradient_of_the_global_loss() {
    if launched("gather_backward_is_the_gradient_of_the_global_loss") {
        return;
    }
    let comm = MpiCollective::init().unwrap();
    let (rank, world) = (comm.rank(), comm.world_size());
    assert_eq!(world, RANKS);
    let (b, d) = (4, 6);
    let full = global_batch(world * b, d);
    let losses: [(&str, Loss); 2] = [("vicreg", vicreg), ("nt_xent", nt_xent)];
    for (name, loss) in losses {
        let local = Var::from_tensor(&full.narrow(1, rank * b, b).unwrap()).unwrap();
        let gathered = comm.all_gather(local.as_tensor(), 1).unwrap();
        assert_eq!(
            max_abs_diff(&gathered, &full),
            0.0,
            "{name}: the forward gathers in rank order"
        );
        let weight = (rank + 1) as f64;
        let ours = (loss(&gathered).unwrap() * weight)
            .unwrap()
            .backward()
            .unwrap();
        let ours = ours.get(local.as_tensor()).unwrap();

        let whole = Var::from_tensor(&full).unwrap();
        let total: f64 = (1..=world).map(|r| r as f64).sum();
        let reference = (loss(whole.as_tensor()).unwrap() * total)
            .unwrap()
            .backward()
            .unwrap();
        let reference = reference
            .get(whole.as_tensor())
            .unwrap()
            .narrow(1, rank * b, b)
            .unwrap();
        let (diff, scale) = (max_abs_diff(ours, &reference), max_abs(&reference));
        assert!(
            scale > 1e-3,
            "{name}: the reference gradient is all but zero"
        );
        // f32 arithmetic over a batch of 8: the same products in another order.
        assert!(
            diff <= 1e-5 * scale,
            "{name}, rank {rank}: gradient differs from one process's by {diff} (largest {scale})"
        );
    }
}

/// Every rank computes the same loss of the gathered batch through a shared layer on its own
/// inputs; after the gradient mean over ranks, in buckets of at most 30 values (the weight
/// travels alone), the layer's gradient equals one process's on the whole batch. A parameter
/// with a gradient on rank 0 only comes back as half of it everywhere; one with none anywhere
/// stays without. Averaged while the backward goes on (OpenMPI offers thread level `Multiple`;
/// the gather's backward all-reduces on the world communicator meanwhile), the gradients are
/// those averaged after it, bit for bit.
#[test]
fn mean_gradients_over_ranks_equal_one_process_on_the_global_batch() {
    if launched("mean_gradients_over_ranks_equal_one_process_on_the_global_batch") {
        return;
    }
    let comm = MpiCollective::init().unwrap();
    let (rank, world) = (comm.rank(), comm.world_size());
    let (b, d, k) = (4, 6, 5);
    let dev = Device::Cpu;
    let full = global_batch(world * b, d);
    let init = |shape: (usize, usize), shift: f32| {
        let n = shape.0 * shape.1;
        let v: Vec<f32> = (0..n)
            .map(|i| ((i as f32 + shift) * 0.61).cos() * 0.5)
            .collect();
        Var::from_tensor(&Tensor::from_vec(v, shape, &dev).unwrap()).unwrap()
    };
    let (w, bias, only0, never) = (
        init((d, k), 0.0),
        init((1, k), 3.0),
        init((2, 2), 1.0),
        init((3, 1), 2.0),
    );
    let project = |x: &Tensor| -> Tensor {
        // tanh: through a linear layer alone the bias would cancel out of VICReg.
        x.broadcast_matmul(w.as_tensor())
            .unwrap()
            .broadcast_add(bias.as_tensor())
            .unwrap()
            .tanh()
            .unwrap()
    };
    let params: Vec<(String, Var)> = [
        ("w", &w),
        ("bias", &bias),
        ("only0", &only0),
        ("never", &never),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_string(), v.clone()))
    .collect();

    let local = full.narrow(1, rank * b, b).unwrap();
    let z = comm.all_gather(&project(&local), 1).unwrap();
    let mut loss = vicreg(&z).unwrap();
    if rank == 0 {
        loss = (loss + only0.as_tensor().sqr().unwrap().sum_all().unwrap()).unwrap();
    }
    let mut grads = loss.backward().unwrap();
    assert!(grads.get(never.as_tensor()).is_none());
    reduce_gradients(&comm, &params, &mut grads, d * k).unwrap();

    assert_eq!(comm.gradient_reduction(), GradientReduction::OnThread);
    let during = GradientAveraging::new(&comm, &params, d * k)
        .run(|complete| {
            Ok(loss.backward_with(|var, grad| {
                complete(var.id(), grad).map_err(candle_core::Error::msg)
            })?)
        })
        .unwrap();
    assert_eq!(during.buckets, 2);
    // The weight's bucket; `never` (and on rank 1 `only0`) is in no graph, so the other bucket
    // completes when the backward returns.
    assert_eq!(during.ready_during_backward, 1);
    for (name, var) in &params {
        let values = |g: &GradStore| g.get(var.as_tensor()).map(|g| g.to_vec2::<f32>().unwrap());
        assert_eq!(values(&during.grads), values(&grads), "{name}, rank {rank}");
    }

    let reference: GradStore = vicreg(&project(&full)).unwrap().backward().unwrap();
    for var in [&w, &bias] {
        let (ours, theirs) = (
            grads.get(var.as_tensor()).unwrap(),
            reference.get(var.as_tensor()).unwrap(),
        );
        let (diff, scale) = (max_abs_diff(ours, theirs), max_abs(theirs));
        assert!(scale > 1e-3, "the reference gradient is all but zero");
        assert!(
            diff <= 1e-5 * scale,
            "rank {rank}: {diff} against a largest {scale}"
        );
    }
    let half = (only0.as_tensor() * (2.0 / world as f64)).unwrap();
    assert!(max_abs_diff(grads.get(only0.as_tensor()).unwrap(), &half) <= 1e-6);
    assert!(
        grads.get(never.as_tensor()).is_none(),
        "no rank had a gradient for `never`"
    );
}

/// Double-precision gradients are averaged in double precision, during the backward and after
/// it: rank r's gradient `1 + (r + 1)(k + 1)·1e-12` averages to the mean computed in f64 by
/// each rank, bit for bit (in f32 each would round to 1).
#[test]
fn double_precision_gradients_average_in_double_precision() {
    if launched("double_precision_gradients_average_in_double_precision") {
        return;
    }
    let comm = MpiCollective::init().unwrap();
    let (rank, world) = (comm.rank(), comm.world_size());
    let dev = Device::Cpu;
    let w = Var::zeros(5, candle_core::DType::F64, &dev).unwrap();
    let params = vec![("w".to_string(), w.clone())];
    let gradient = |r: usize| -> Vec<f64> {
        (0..5)
            .map(|k| 1.0 + ((r + 1) * (k + 1)) as f64 * 1e-12)
            .collect()
    };
    let mean: Vec<f64> = (0..5)
        .map(|k| (0..world).map(|r| gradient(r)[k]).sum::<f64>() * (1.0 / world as f64))
        .collect();
    assert!(mean.iter().all(|&m| m as f32 as f64 != m), "exact in f32");
    // d/dw of sum(w · g) is g.
    let g = Tensor::new(gradient(rank).as_slice(), &dev).unwrap();
    let loss = w.as_tensor().mul(&g).unwrap().sum_all().unwrap();
    let mut grads = loss.backward().unwrap();
    reduce_gradients(&comm, &params, &mut grads, 16).unwrap();
    let during = GradientAveraging::new(&comm, &params, 16)
        .run(|complete| {
            Ok(loss.backward_with(|var, grad| {
                complete(var.id(), grad).map_err(candle_core::Error::msg)
            })?)
        })
        .unwrap();
    for (when, store) in [("after", &grads), ("during", &during.grads)] {
        let ours = store.get(w.as_tensor()).unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(ours, mean, "rank {rank}, averaged {when} the backward");
    }
}

/// A rank with fewer rows than the others makes the all-gather fail on every rank, with the
/// same message naming both shapes, instead of reading past a buffer or waiting forever; the
/// ranks then gather again as usual.
#[test]
fn unequal_gathers_fail_on_every_rank_naming_the_shapes() {
    if launched("unequal_gathers_fail_on_every_rank_naming_the_shapes") {
        return;
    }
    let comm = MpiCollective::init().unwrap();
    let rank = comm.rank();
    let rows = if rank == 0 { 3 } else { 2 };
    let local = Tensor::zeros((rows, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
    let err = comm.all_gather(&local, 0).unwrap_err().to_string();
    assert!(
        err.contains("rank 0 has 3 rows of 5 values, rank 1 2 of 5")
            && err.contains("train.drop_last"),
        "rank {rank}: {err}"
    );
    let equal = Tensor::ones((2, 5), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert_eq!(comm.all_gather(&equal, 0).unwrap().dims(), [4, 5]);
}
