//! Data-parallel equivalence (feature `mpi`): `mpirun -np 2 ssl run` with batch 64 per rank
//! against one process with batch 128, same seed and data order: the loss at every step and
//! the final weights must agree.
//!
//! The MLP encoder on the Gaussian mixture has no batch norm; the projector has none (one layer)
//! or, with `model.sync_bn`, batch norm over both ranks' rows, which one process matches; per-rank
//! batch norm differs from one process by design, and a test shows it. What remains is float
//! reassociation: a weight's gradient is a sum over the batch, which two ranks add as two halves
//! of 64 rows and one process as one sum of 128, and the mean over ranks multiplies by 1/2; these
//! differ in the last bits of f32 (measured after 20 steps: 1e-7 relative for the losses, 1e-7
//! for the weights). The tolerances (losses 1e-5 relative, weights 1e-5 of the largest weight)
//! leave room for that and none for a wrong gradient: a gradient scaled by the number of ranks,
//! a missing sum in the gather's backward, or a shard read out of order moves the weights by far
//! more within a few steps. Synchronised batch norm adds its statistics in f32 Candle ops where
//! one process uses the fused op's f64 sums: measured 3e-6 of the largest weight after 20 steps.
//! FroSSL at V = 4 and Barlow Twins are held to 1e-4: their losses grow the rounding into a
//! drift over the 20 steps (see their tests).
//!
//! VICReg trains with SGD here, SimCLR with the default AdamW. VICReg does not change when a
//! constant is added to every projection, so the gradient of the projector's last bias (and of
//! the encoder's last bias, under a linear projector) is exactly zero, and what the optimiser
//! sees is rounding noise (about 1e-9). AdamW divides a gradient by its running RMS and turns
//! that noise into steps of the learning rate's size: those biases (and the online probe reading
//! the encoder's output) wander by 1e-3 between any two runs whose sums are rounded differently,
//! while the loss still agrees to 1e-5. SGD moves them by the noise itself.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::{Device, Tensor};

const STEPS: usize = 20;

/// How long one `ssl run` of these tests may take, on 2 ranks sharing 2 cores with another
/// test's job: a job still running then has hung, and the test fails instead of hanging too.
const JOB_LIMIT: Duration = Duration::from_secs(300);

/// `cmd`'s output once it exits, or a failure naming what it printed when it runs past
/// `limit`: the job (mpirun and, through it, its ranks) is then ended.
fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).unwrap();
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let Some(status) = status else {
        // SIGTERM first: mpirun passes it on to its ranks, which SIGKILL would orphan.
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_secs(5));
        let _ = child.kill();
        let _ = child.wait();
        let text = |h: std::thread::JoinHandle<Vec<u8>>| {
            String::from_utf8_lossy(&h.join().unwrap()).into_owned()
        };
        panic!(
            "still running after {} s (a hang), ended:\n{}{}",
            limit.as_secs(),
            text(stdout),
            text(stderr)
        );
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn ssl(launcher: Option<usize>, out: &Path, args: &[&str], batch: usize) -> String {
    let mut cmd = match launcher {
        Some(ranks) => {
            let mut c = Command::new("mpirun");
            c.args(["--oversubscribe", "-np", &ranks.to_string()])
                .arg(env!("CARGO_BIN_EXE_ssl"))
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_ssl")),
    };
    cmd.arg("run")
        .args(args)
        .args([
            "--batch-size",
            &batch.to_string(),
            "--epochs",
            "2",
            "--threads",
            "1",
        ])
        .arg("--out")
        .arg(out);
    let out = output_within(&mut cmd, JOB_LIMIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    text
}

/// The training loss of every step in the run's metrics.jsonl.
fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r.get("epoch_end").is_none())
        .map(|r| r["loss"].as_f64().unwrap())
        .collect()
}

fn weights(run: &Path) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(run.join("checkpoint/model.safetensors"), &Device::Cpu).unwrap()
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar()
        .unwrap()
}

fn mpirun_missing() -> bool {
    let missing = Command::new("mpirun").arg("--version").output().is_err();
    if missing {
        eprintln!("skipped: no mpirun on the PATH (apt-get install openmpi-bin libopenmpi-dev)");
    }
    missing
}

/// The MLP on the Gaussian mixture's 1400 training instances: 10 steps of 128 per epoch.
const GMM_MLP: [&str; 4] = ["--data", "gmm", "--encoder", "mlp"];

/// ViT-T with 4-px patches on 1280 of the 16-px digits (10 steps of 128 per epoch), one view.
const VIT_DIGITS: [&str; 10] = [
    "--data",
    "digits",
    "--encoder",
    "vit_t16",
    "--set",
    "model.patch_size=4",
    "--set",
    "data.train_size=1280",
    "--views",
    "1",
];

/// One process with batch 128 and two ranks with 64 each, on the GMM study's data and MLP
/// unless `args` name others: the run directories and the second run's log.
fn one_and_two_ranks(dir: &Path, args: &[&str]) -> (PathBuf, PathBuf, String) {
    one_and_two_ranks_on(dir, &GMM_MLP, args)
}

/// [`one_and_two_ranks`] on the data and encoder of `data`.
fn one_and_two_ranks_on(dir: &Path, data: &[&str], args: &[&str]) -> (PathBuf, PathBuf, String) {
    let args = [data, args].concat();
    let args = args.as_slice();
    let (one, two) = (dir.join("one"), dir.join("two"));
    ssl(None, &one, args, 128);
    let log = ssl(Some(2), &two, args, 64);
    assert!(log.contains("global batch 128"), "{log}");
    // OpenMPI offers thread level Multiple: the gradient buckets go while the backward runs.
    assert!(
        log.contains("gradients averaged during the backward pass"),
        "{log}"
    );
    let recorded = ssl_train::trainer::DistributedRecord::read(&two).unwrap();
    let record = recorded.expect("a two-rank run records distributed.json");
    assert_eq!(
        (record.world_size, record.global_batch),
        (2, 2 * record.batch_size_per_rank)
    );
    // Through the end of the run: rank 0's evaluation, every rank's last barrier.
    assert!(two.join("results.json").exists(), "{log}");
    assert!(log.contains("| random init |"), "{log}");
    (one, two, log)
}

fn two_ranks_match_one_process(args: &[&str]) {
    two_ranks_match_one_process_within(args, TOLERANCE, true);
}

/// Relative tolerance of the losses and of the weights (to the largest weight); see the module
/// docs.
const TOLERANCE: f64 = 1e-5;

/// [`two_ranks_match_one_process`] at `tolerance`; `lowers` whether 20 steps lower the loss
/// (MoCo's rises while its queue fills with negatives, DINO's while its centre and teacher move).
fn two_ranks_match_one_process_within(args: &[&str], tolerance: f64, lowers: bool) {
    two_ranks_match_one_process_on(&GMM_MLP, args, tolerance, lowers);
}

/// [`two_ranks_match_one_process_within`] on the data and encoder of `data`.
fn two_ranks_match_one_process_on(data: &[&str], args: &[&str], tolerance: f64, lowers: bool) {
    let objective = args.join(" ");
    if mpirun_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (one, two, _) = one_and_two_ranks_on(dir.path(), data, args);

    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(a.len(), STEPS, "{a:?}");
    assert_eq!(b.len(), STEPS, "{b:?}");
    assert!(
        !lowers || a[STEPS - 1] < a[0],
        "training lowers the loss: {a:?}"
    );
    assert!(
        a.iter().any(|x| *x != a[0]),
        "training changes the loss: {a:?}"
    );
    assert_losses_match(&a, &b, tolerance, &objective);
    assert_weights_match(&one, &two, tolerance, &objective);

    // Resuming on another number of ranks is refused, naming the one to use.
    let out = Command::new(env!("CARGO_BIN_EXE_ssl"))
        .args(["run", "--resume", "--out"])
        .arg(&two)
        .args(["--set", "train.epochs=3", "--allow-changed", "train.epochs"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("trained on 2 rank(s)") && err.contains("mpirun -np 2"),
        "{err}"
    );
}

/// The losses `a` of one process and `b` of two ranks agree at every step, to `tolerance`
/// relative (absolute below 1).
fn assert_losses_match(a: &[f64], b: &[f64], tolerance: f64, objective: &str) {
    for (step, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tolerance * x.abs().max(1.0),
            "{objective}, step {step}: one process {x}, two ranks {y}\n{a:?}\n{b:?}"
        );
    }
}

/// Relative tolerance of the online probe's weights (at least): the probe standardises each
/// feature by its batch spread, which grows the ranks' rounding in a nearly constant feature
/// (measured: SwAV's encoder within 2.5e-6 of the largest weight, its probe 4.6e-5; BYOL's
/// probe 4.6e-5, FroSSL's 3.2e-5; the others' under 1e-5). A wrong gather
/// of the probe's statistics is caught exactly by `ssl_train::online_probe`'s tests.
const PROBE_TOLERANCE: f64 = 1e-4;

/// The final weights of runs `one` and `two` agree to `tolerance` of the largest weight (the
/// online probe's to [`PROBE_TOLERANCE`] where that is looser).
fn assert_weights_match(one: &Path, two: &Path, tolerance: f64, objective: &str) {
    let (wa, wb) = (weights(one), weights(two));
    assert_eq!(wa.len(), wb.len());
    let scale = wa.values().map(max_abs).fold(0.0f32, f32::max);
    for probe in [false, true] {
        let (mut worst, mut at) = (0.0f32, "");
        for (name, t) in wa.iter().filter(|(n, _)| n.starts_with("probe.") == probe) {
            let diff = max_abs(&(t - &wb[name]).unwrap());
            if diff >= worst {
                (worst, at) = (diff, name);
            }
        }
        let tolerance = match probe {
            true => tolerance.max(PROBE_TOLERANCE),
            false => tolerance,
        };
        eprintln!(
            "{objective}: largest weight difference {worst:e} in {at} (largest weight {scale})"
        );
        assert!(
            worst <= tolerance as f32 * scale,
            "{objective}: weights differ by {worst} in {at} (largest {scale})"
        );
    }
}

/// A one-layer projector: no batch norm anywhere.
const NO_BN: [&str; 2] = ["--set", "model.projector=[64]"];

#[test]
fn vicreg_on_two_ranks_matches_one_process() {
    two_ranks_match_one_process(
        &[
            &NO_BN[..],
            &["--objective", "vicreg", "--set", "train.optimizer=sgd"],
        ]
        .concat(),
    );
}

/// Two batches accumulated per step: the second one's backward hands over each parameter's
/// mean over both while it runs, and the ranks average that. 10 steps of 2 × 128 (2 × 64 per
/// rank).
#[test]
fn accumulating_on_two_ranks_matches_one_process() {
    if mpirun_missing() {
        return;
    }
    let args = [
        &NO_BN[..],
        &["--objective", "vicreg", "--set", "train.optimizer=sgd"],
        &["--set", "train.accumulate=2"],
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let (one, two, _) = one_and_two_ranks(dir.path(), &args);
    let (a, b) = (losses(&one), losses(&two));
    assert_eq!((a.len(), b.len()), (STEPS / 2, STEPS / 2), "{a:?}\n{b:?}");
    assert!(a[STEPS / 2 - 1] < a[0], "training lowers the loss: {a:?}");
    let objective = "vicreg, accumulate 2";
    assert_losses_match(&a, &b, TOLERANCE, objective);
    assert_weights_match(&one, &two, TOLERANCE, objective);
}

#[test]
fn simclr_on_two_ranks_matches_one_process() {
    two_ranks_match_one_process(&[&NO_BN[..], &["--objective", "simclr"]].concat());
}

/// VICReg with SGD and a projector whose hidden layer has batch norm (Linear–BN–ReLU–Linear).
const WITH_BN: [&str; 6] = [
    "--objective",
    "vicreg",
    "--set",
    "train.optimizer=sgd",
    "--set",
    "model.projector=[64,64]",
];

/// With `model.sync_bn` the projector's batch norm normalises with the statistics of both
/// ranks' rows, and its backward carries the other rank's share: two ranks match one process
/// in every step's loss and in the final weights, running statistics included.
#[test]
fn synchronised_batch_norm_on_two_ranks_matches_one_process() {
    two_ranks_match_one_process(&[&WITH_BN[..], &["--set", "model.sync_bn=true"]].concat());
}

/// The other objectives of the equivalence list, each with batch norm in its projector (and
/// teacher) synchronised, SGD: the gathered batch statistics (Barlow Twins' cross-correlation,
/// FroSSL's Gram matrices at V = 4, IConE's table gradient), MoCo's queue filled with every
/// rank's keys in rank order, SwAV's Sinkhorn over the global batch, DINO's centre from the
/// global mean. Small heads and queues keep each run to seconds.
fn synced(objective: &[&str]) -> Vec<String> {
    let mut args: Vec<&str> = vec![
        "--set",
        "train.optimizer=sgd",
        "--set",
        "model.projector=[64,64]",
        "--set",
        "model.sync_bn=true",
    ];
    args.extend(objective);
    args.into_iter().map(String::from).collect()
}

fn synced_two_ranks_match_one_process(objective: &[&str], tolerance: f64, lowers: bool) {
    let args = synced(objective);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    two_ranks_match_one_process_within(&args, tolerance, lowers);
}

#[test]
fn barlow_twins_on_two_ranks_matches_one_process() {
    // λ·Σ C_ij² over the 64 × 64 cross-correlation grows the rounding of the ranks' sums into a
    // drift, as FroSSL's log does: 2e-7 at step 1, 3e-6 at step 13, 1.1e-5 at step 19 (measured
    // with SGD stepping in place; the composed step's rounding stayed just under 1e-5).
    synced_two_ranks_match_one_process(&["--objective", "barlow-twins"], 1e-4, true);
}

#[test]
fn frossl_with_four_views_on_two_ranks_matches_one_process() {
    // The log of the Gram matrices' Frobenius norms turns the rounding of their sums into a drift
    // that grows over the steps: 1e-7 for the first ten, 1.2e-5 at step 18 (measured).
    let four_views = ["--objective", "frossl", "--views", "4"];
    synced_two_ranks_match_one_process(&four_views, 1e-4, true);
}

#[test]
fn icone_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(&["--objective", "icone"], TOLERANCE, true);
}

#[test]
fn moco_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(
        &[
            "--objective",
            "moco",
            "--set",
            "objective.params.queue_size=256",
        ],
        TOLERANCE,
        false,
    );
}

#[test]
fn swav_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(
        &[
            "--objective",
            "swav",
            "--set",
            "objective.params.num_prototypes=32",
            // The prototypes stay frozen for the whole run, as they did before SwAV's freeze
            // was fitted to one epoch: once they train, the two runs drift apart from 1e-5
            // (step 16) to 7e-5 relative (step 19), which this tolerance does not take.
            "--set",
            "objective.params.freeze_prototypes_steps=313",
        ],
        TOLERANCE,
        true,
    );
}

#[test]
fn dino_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(
        &[
            "--objective",
            "dino",
            "--set",
            "objective.params={out_dim: 64, head_hidden: 32, bottleneck: 16}",
        ],
        TOLERANCE,
        false,
    );
}

/// SimSiam's projector-output batch norm (no affine, no running statistics; in the objective,
/// not the projector) follows `model.sync_bn` like every `BatchNorm`: each rank standardises its
/// 64 rows with the statistics of all 128.
#[test]
fn simsiam_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(&["--objective", "simsiam"], TOLERANCE, true);
}

/// BYOL: the predictor's batch norm synchronised, the EMA teacher updated alike on every rank.
#[test]
fn byol_on_two_ranks_matches_one_process() {
    // The loss falls from 4.7 to 0.4 in 20 steps, and the steep descent grows the ranks'
    // rounding: 1e-7 relative for the first eight steps, 1.5e-5 at step 9 (measured).
    synced_two_ranks_match_one_process(&["--objective", "byol"], 1e-4, true);
}

/// Without `model.sync_bn` each rank normalises its own 64 rows: the one documented difference
/// from one process, which moves the losses by far more than the equivalence tolerance.
/// SIGReg's characteristic-function sums are gathered over the ranks, its random slices drawn
/// from the run's seed and step on every rank alike.
#[test]
fn lejepa_on_two_ranks_matches_one_process() {
    synced_two_ranks_match_one_process(
        &[
            "--objective",
            "lejepa",
            "--set",
            "objective.params.slices=64",
        ],
        1e-4,
        true,
    );
}

/// MAE draws its masks for the global batch and each rank keeps its own rows; a light decoder
/// keeps the runs to seconds. SGD, as for VICReg: attention's key bias has an exactly zero
/// gradient (softmax ignores a constant added to every logit of a query), whose rounding noise
/// AdamW would turn into steps of the learning rate's size (measured: 1.5e-4 apart after 20
/// steps, the losses agreeing to 1e-5).
#[test]
fn mae_on_two_ranks_matches_one_process() {
    two_ranks_match_one_process_on(
        &VIT_DIGITS,
        &[
            "--objective",
            "mae",
            "--set",
            "train.optimizer=sgd",
            "--set",
            "objective.params={decoder_dim: 32, decoder_depth: 1, decoder_heads: 2}",
        ],
        TOLERANCE,
        true,
    );
}

/// I-JEPA's multi-block masks are drawn for the global batch (and truncated over it) and cut
/// to each rank's rows; its EMA target encoder moves alike on every rank. SGD, as for MAE.
#[test]
fn ijepa_on_two_ranks_matches_one_process() {
    two_ranks_match_one_process_on(
        &VIT_DIGITS,
        &[
            "--objective",
            "ijepa",
            "--set",
            "train.optimizer=sgd",
            "--set",
            "objective.params={predictor_dim: 32, predictor_depth: 1, predictor_heads: 2, target_scale: [0.25, 0.35], targets: 2, min_keep: 1}",
        ],
        TOLERANCE,
        true,
    );
}

#[test]
fn per_rank_batch_norm_is_the_one_difference() {
    if mpirun_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (one, two, log) = one_and_two_ranks(dir.path(), &WITH_BN);
    assert!(log.contains("batch norm per rank"), "{log}");
    let (a, b) = (losses(&one), losses(&two));
    let apart = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
        .fold(0.0, f64::max);
    assert!(
        apart > 1e-3,
        "per-rank batch norm should differ: {a:?}\n{b:?}"
    );
}

/// The pid of the rank `rank` of the run writing to `out` (a process whose command line names
/// `out` and whose environment has `OMPI_COMM_WORLD_RANK=rank`).
fn rank_pid(out: &Path, rank: usize) -> Option<i32> {
    let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
    let out = out.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let has =
                |bytes: &[u8], s: &str| bytes.split(|&b| b == 0).any(|part| part == s.as_bytes());
            (has(&cmdline, &out) && has(&environ, &wanted) && has(&cmdline, "run")).then_some(pid)
        })
}

/// The arguments of the killed job and of its uninterrupted twin: 200 short epochs (about 5 s on
/// 2 ranks), a checkpoint after each.
const KILLED_RUN: [&str; 16] = [
    "run",
    "--data",
    "gmm",
    "--encoder",
    "mlp",
    "--batch-size",
    "64",
    "--epochs",
    "200",
    "--threads",
    "1",
    "--set",
    "model.projector=[64]",
    "--set",
    "train.checkpoint_every=1",
    "--out",
];

/// `mpirun -np 2 ssl ARGS` with the test's environment, not yet started.
fn mpirun_ssl(args: &[&str]) -> Command {
    let mut job = Command::new("mpirun");
    job.args(["--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_ssl"))
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    job
}

/// `mpirun -np 2 ssl ARGS OUT` with the test's environment, not yet started.
fn two_ranks(args: &[&str], out: &Path) -> Command {
    let mut job = mpirun_ssl(args);
    job.arg(out);
    job
}

/// A rank killed with SIGKILL mid-run ends the whole job: the launcher exits non-zero within
/// 60 s, naming the rank, and the checkpoint on disk is whole; `--resume` on 2 ranks then
/// finishes with the weights of an uninterrupted 2-rank run, bit for bit.
#[test]
fn a_killed_rank_ends_every_rank_within_a_minute() {
    if mpirun_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut job = two_ranks(&KILLED_RUN, &out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let state = out.join("checkpoint/trainer_state.json");
    while !state.exists() {
        assert!(
            job.try_wait().unwrap().is_none(),
            "the job ended before its first checkpoint"
        );
        assert!(
            started.elapsed().as_secs() < 300,
            "no checkpoint after 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let victim = rank_pid(&out, 1).expect("rank 1 is running");
    // SAFETY: kill(2) on a pid this test's job started.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
    let killed = std::time::Instant::now();
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break status;
        }
        assert!(
            killed.elapsed().as_secs() < 60,
            "the other rank still runs 60 s after rank 1 was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let output = job.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("rank 1"),
        "the launcher names the rank:\n{text}"
    );
    assert!(rank_pid(&out, 0).is_none(), "rank 0 outlived the job");
    // Whatever instant the kill hit, one whole checkpoint is on disk.
    let checkpoint = out.join("checkpoint");
    let state = ssl_train::checkpoint::load_state(&checkpoint).unwrap();
    ssl_train::checkpoint::load_tensors(&checkpoint.join(ssl_train::checkpoint::MODEL)).unwrap();

    let resumed = two_ranks(&["run", "--resume", "--out"], &out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{text}");
    let whole = dir.path().join("whole");
    let uninterrupted = two_ranks(&KILLED_RUN, &whole).output().unwrap();
    assert!(uninterrupted.status.success());
    let (a, b) = (weights(&out), weights(&whole));
    assert_eq!(a.len(), b.len());
    for (name, t) in &a {
        let diff = max_abs(&(t - &b[name]).unwrap());
        assert_eq!(diff, 0.0, "{name} after the resume from {state:?}");
    }
}

/// The README's data-parallel job (its "Scale out" section), word for word after `mpirun`.
const README_JOB: &str =
    "mpirun -np 2 target/release/ssl run --epochs 1 --set data.train_size=512 \
     --batch-size 64 --set model.sync_bn=true";

/// `mpirun -np 2 ssl ARGS` in `dir` with the test's environment, its output once it ends, and
/// its stdout and stderr together.
fn two_ranks_in(dir: &Path, args: &[&str]) -> (Output, String) {
    let mut job = mpirun_ssl(args);
    job.current_dir(dir);
    let out = output_within(&mut job, JOB_LIMIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// A 2-rank job that must end with the end-of-run table and results.json in `run`.
fn ends_with_its_table(dir: &Path, args: &[&str], run: &Path) -> String {
    let (out, text) = two_ranks_in(dir, args);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("| random init |"), "{text}");
    assert!(run.join("results.json").exists(), "{text}");
    text
}

/// The README's job (the digits CNN, whose batch norms the random-init baseline calibrates in
/// train mode on rank 0 alone) ends with its table: batch norm is synchronised in the training
/// step only. It runs exactly as the README writes it, in a fresh directory (its run goes to
/// `runs/`), and without `--threads` each rank takes its share of the cores.
#[test]
fn the_readme_job_with_synchronised_batch_norm_ends_with_its_table() {
    if mpirun_missing() {
        return;
    }
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(README_JOB),
        "README.md must show:\n{README_JOB}"
    );
    let args: Vec<&str> = README_JOB.split_whitespace().skip(4).collect();
    let dir = tempfile::tempdir().unwrap();
    let text = ends_with_its_table(dir.path(), &args, &dir.path().join("runs/latest"));
    assert!(text.contains("batch norm over the global batch"), "{text}");
    assert!(text.contains("CPU thread(s) per rank"), "{text}");
}

/// One epoch of an encoder family on 2 ranks, batch norm synchronised and per rank, each through
/// the end-of-run evaluation (its random-init baseline calibrated in train mode on rank 0), on
/// small inputs: what is tested is that every rank reaches the end, not what the encoder learns.
fn family_ends_with_and_without_sync_bn(family: &[&str]) {
    if mpirun_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (sync_bn, says) in [
        ("true", "batch norm over the global batch"),
        ("false", "batch norm per rank"),
    ] {
        let run = dir.path().join(format!("sync-{sync_bn}"));
        let setting = format!("model.sync_bn={sync_bn}");
        let mut args = vec![
            "run",
            "--epochs",
            "1",
            "--batch-size",
            "16",
            "--threads",
            "1",
            "--set",
            "model.projector=[32,32]",
            // 64 instances split in halves: 32 to train on (one step of 2 × 16), 32 to test.
            "--set",
            "data.train_size=64",
            "--set",
            "data.subset_test_fraction=0.5",
            "--set",
            &setting,
            "--out",
            run.to_str().unwrap(),
        ];
        args.extend(family);
        let text = ends_with_its_table(dir.path(), &args, &run);
        assert!(text.contains(says), "{text}");
    }
}

#[test]
fn the_digits_cnn_ends_with_and_without_sync_bn() {
    family_ends_with_and_without_sync_bn(&[]);
}

#[test]
fn resnet18_ends_with_and_without_sync_bn() {
    family_ends_with_and_without_sync_bn(&[
        "--encoder",
        "resnet18",
        "--set",
        "model.stem=cifar",
        "--size",
        "8",
    ]);
}

#[test]
fn vit_t_ends_with_and_without_sync_bn() {
    family_ends_with_and_without_sync_bn(&["--encoder", "vit_t16", "--size", "16"]);
}

/// The 3D ResNet-18 on MedMNIST 3D volumes (the digits written as OrganMNIST3D, 28³).
#[test]
fn resnet18_3d_ends_with_and_without_sync_bn() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("organmnist3d.npz");
    ssl_data::write_digits_as_medmnist(&file, "organmnist3d", 28).unwrap();
    let root_set = format!("data.root={}", root.path().display());
    family_ends_with_and_without_sync_bn(&[
        "--data",
        "organmnist3d",
        "--size",
        "28",
        "--set",
        &root_set,
    ]);
}

/// A rank that never joins a collective (the test hook stalls rank 1 before its fifth one) ends
/// the job within the bound: rank 0's collective fails, naming the operation, the rank and the
/// step, and the launcher exits non-zero.
#[test]
fn a_collective_a_rank_never_joins_ends_the_job_within_the_bound() {
    if mpirun_missing() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut job = mpirun_ssl(&[
        "run",
        "--data",
        "gmm",
        "--encoder",
        "mlp",
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--threads",
        "1",
        "--set",
        "train.collective_timeout=3",
        "--out",
    ]);
    job.arg(dir.path().join("run"))
        .env(ssl_dist::STALL_VARIABLE, "1:5");
    let started = Instant::now();
    let output = output_within(&mut job, Duration::from_secs(120));
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("stalling before collective 5"), "{text}");
    assert!(
        text.contains("error (rank 0): training stopped at step")
            && text.contains("on rank 0 of 2 did not complete within 3 s"),
        "{text}"
    );
    assert!(
        ["MPI all-gather", "MPI all-reduce", "MPI barrier"]
            .iter()
            .any(|op| text.contains(op)),
        "the error names the operation:\n{text}"
    );
    assert!(
        took < Duration::from_secs(60),
        "ended after {took:?}:\n{text}"
    );
}
