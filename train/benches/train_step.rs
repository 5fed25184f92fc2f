//! One full training step (forward + loss + backward + AdamW) of the seed papers' encoders, the
//! Rust side of `train_step.py`, which runs the same six steps in PyTorch:
//!
//! 1. `resnet18_cifar_vicreg`: ResNet-18, CIFAR stem, projector 512-2048-2048, VICReg,
//!    32×32×3, B = 64 instances × 2 views (lr 1e-3);
//! 2. `resnet18_cifar_frossl_v8`: the same with FroSSL at V = 8;
//! 3. `vit_s16_icone`: ViT-S/16 at 224×224×3, B = 16 × 2 views, IConE on the 384-d class token
//!    (table of 1024 instances, lr 1e-4);
//! 4. `resnet3d18_icone`: the IConE paper's 3D ResNet-18 at 64³ × 1 channel, B = 4 × 2 views,
//!    IConE on its 512-d output (table of 1024 instances, lr 1e-4);
//! 5. `vit_s16_mae`: ViT-S/16 at 224×224×3, B = 64 × 1 view, MAE with its defaults: 75 % of
//!    the 196 patches removed per image (the encoder on the class token and 49 patches), a
//!    decoder of width 512, depth 8 and 16 heads on all 197 tokens, normalised-pixel loss on the
//!    removed patches (lr 1.5e-4);
//! 6. `vit_s16_ijepa`: ViT-S/16 at 224×224×3, B = 64 × 1 view, I-JEPA with its defaults: one
//!    context block and 4 target blocks per image (multi-block masks on the 14×14 grid), the
//!    EMA target encoder on all 196 patches without gradient, a predictor of width 384 and
//!    depth 12 on the context and each target block's mask tokens (batch 4·B), smooth L1, the
//!    target encoder's EMA update (momentum 0.996 at step 0) after the optimiser step (lr 1e-3).
//!
//! Rows 5 and 6 need the `mae` and `ijepa` objectives registered in `ssl-train`; a build
//! without them fails those rows with the registry's unknown-objective error.
//!
//! AdamW (betas 0.9/0.999, weight decay 0.05 on weights, none on biases and norm parameters;
//! the IConE table decayed), no online probe. Inputs are N(0, 1) images drawn once; the step is
//! the trainer's own (`forward_backward_on`, the gradient average over ranks, the objective's
//! `before_step` hook, the optimiser step, its `after_step` hook: I-JEPA's EMA update), encoder
//! forwarded view by view in train mode (rows 5 and 6: the objective encodes its masked view).
//! Each row prints one JSON line: median / min / max milliseconds over `--steps` steps after
//! `--warmup`, and the process's peak RSS (MiB). `--row all` runs every row in a fresh process, so each peak RSS is the row's own.
//!
//! `cargo bench -p ssl-train --bench train_step -- --row all --threads 2 [--steps 10] [--warmup 2]
//! [--device cuda]` (a GPU run needs `--features cuda`; it adds the peak GPU memory of the
//! device's memory pool, which Candle allocates from). `--composed` runs every op as the
//! composition of Candle ops (`ssl_models::dispatch::composed_only`): on a GPU, the step as it
//! was before cuDNN, for before/after ratios in one call.
//!
//! Data parallel: built with `--features mpi` and started by a launcher
//! (`mpirun -np 2 …/train_step --row 1 --threads 1`), each rank steps its share of the row's
//! batch (B / world instances, its own inputs), the objective gathering the global batch and the
//! gradients averaged over the ranks as `ssl run` does; rank 0 prints the row with `world`. The
//! global batch is the row's.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use ssl_core::{Progress, StepContext};
use ssl_dist::{Comm, GradientAveraging, BUCKET_ELEMENTS};
use ssl_train::config::{apply_set, RunConfig};
use ssl_train::model;
use ssl_train::setup::DataSplit;
use ssl_train::trainer::{self, StepInput};

/// Instances in the training set (IConE's table rows).
const INSTANCES: usize = 1024;

struct Row {
    name: &'static str,
    /// `--set` assignments onto the defaults.
    sets: &'static [&'static str],
    /// Per-sample shape.
    shape: &'static [usize],
}

const ROWS: [Row; 6] = [
    Row {
        name: "resnet18_cifar_vicreg",
        sets: &[
            "model.encoder=resnet18",
            "model.stem=cifar",
            "model.projector=[2048,2048]",
            "objective.name=vicreg",
            "train.batch_size=64",
            "train.views=2",
            "train.lr=1e-3",
        ],
        shape: &[3, 32, 32],
    },
    Row {
        name: "resnet18_cifar_frossl_v8",
        sets: &[
            "model.encoder=resnet18",
            "model.stem=cifar",
            "model.projector=[2048,2048]",
            "objective.name=frossl",
            "train.batch_size=64",
            "train.views=8",
            "train.lr=1e-3",
        ],
        shape: &[3, 32, 32],
    },
    Row {
        name: "vit_s16_icone",
        sets: &[
            "model.encoder=vit_s16",
            "objective.name=icone",
            "train.batch_size=16",
            "train.views=2",
            "train.lr=1e-4",
        ],
        shape: &[3, 224, 224],
    },
    Row {
        name: "resnet3d18_icone",
        sets: &[
            "model.encoder=resnet18_3d",
            "objective.name=icone",
            "train.batch_size=4",
            "train.views=2",
            "train.lr=1e-4",
        ],
        shape: &[1, 64, 64, 64],
    },
    Row {
        name: "vit_s16_mae",
        sets: &[
            "model.encoder=vit_s16",
            "objective.name=mae",
            "train.batch_size=64",
            "train.views=1",
            "train.lr=1.5e-4",
        ],
        shape: &[3, 224, 224],
    },
    Row {
        name: "vit_s16_ijepa",
        sets: &[
            "model.encoder=vit_s16",
            "objective.name=ijepa",
            "train.batch_size=64",
            "train.views=1",
            "train.lr=1e-3",
        ],
        shape: &[3, 224, 224],
    },
];

struct Args {
    row: String,
    device: String,
    threads: usize,
    steps: usize,
    warmup: usize,
    composed: bool,
    /// cudarc's per-buffer events kept on (as before `ssl_train::setup::device` turned them off).
    event_tracking: bool,
    /// `train.precision`: f32 or bf16.
    precision: String,
    /// `KEY=VALUE` overrides applied last (another objective on the row's encoder, say).
    sets: Vec<String>,
}

const USAGE: &str = "\
Usage: cargo bench -p ssl-train --bench train_step -- [OPTIONS]

One training step (forward of every view, loss, backward, AdamW, the objective's EMA update)
of the issue's six encoder settings; prints one JSON line a row: the median step time and the
peak RSS.

Options:
  --row <N|all>       1 ResNet-18 VICReg, 2 the same with FroSSL at V = 8, 3 ViT-S/16 IConE,
                      4 3D ResNet-18 IConE, 5 ViT-S/16 MAE (B = 64, 75 % masked),
                      6 ViT-S/16 I-JEPA (B = 64), or all [default: all]
  --device <DEVICE>   cpu, cuda[:N] or metal [default: cpu]
  --threads <N>       CPU threads [default: 2]
  --steps <N>         timed steps [default: 10]
  --warmup <N>        untimed steps first [default: 2]
  --composed          every op composed from Candle ops (no fused CPU kernels, no cuDNN)
  --event-tracking    CUDA: keep cudarc's two events per buffer (off in ssl), to time them
  --precision <P>     train.precision: f32 or bf16 (bf16 products) [default: f32]
  --set <KEY=VALUE>   a config override after the row's settings, e.g. objective.name=swav
                      (repeatable; the JSON line lists them)
  -h, --help          print this help";

fn parse_args() -> Result<Args> {
    let mut args = Args {
        row: "all".into(),
        device: "cpu".into(),
        threads: 2,
        steps: 10,
        warmup: 2,
        composed: false,
        event_tracking: false,
        precision: "f32".into(),
        sets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--row" => args.row = value()?,
            "--device" => args.device = value()?,
            "--threads" => args.threads = value()?.parse()?,
            "--steps" => args.steps = value()?.parse()?,
            "--warmup" => args.warmup = value()?.parse()?,
            "--composed" => args.composed = true,
            "--event-tracking" => args.event_tracking = true,
            "--precision" => args.precision = value()?,
            "--set" => args.sets.push(value()?),
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument `{other}`\n\n{USAGE}"),
        }
    }
    Ok(args)
}

fn config(row: &Row, args: &Args) -> Result<RunConfig> {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for s in row.sets {
        apply_set(&mut root, s)?;
    }
    apply_set(&mut root, &format!("train.precision={}", args.precision))?;
    for s in [
        "train.weight_decay=0.05",
        "train.probe_lr=0",
        "train.warmup_epochs=0",
    ] {
        apply_set(&mut root, s)?;
    }
    for s in &args.sets {
        apply_set(&mut root, s)?;
    }
    RunConfig::from_yaml_value(root)
}

fn peak_rss_mib() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss as f64 / 1024.0 // KiB on Linux
}

/// The high-water mark of `device`'s default memory pool (Candle's stream-ordered allocations
/// come from it), MiB; `None` off CUDA.
#[cfg(feature = "cuda")]
fn peak_gpu_mib(device: &candle_core::Device) -> Option<f64> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let candle_core::Device::Cuda(cuda) = device else {
        return None;
    };
    let dev = cuda.cuda_stream().context().cu_device();
    let mut pool = std::ptr::null_mut();
    let mut high: u64 = 0;
    // SAFETY: both calls write only the out-parameters given, of the types the API names.
    let ok = unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, dev) == sys::CUresult::CUDA_SUCCESS
            && sys::cuMemPoolGetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&mut high as *mut u64).cast(),
            ) == sys::CUresult::CUDA_SUCCESS
    };
    ok.then(|| high as f64 / 1024.0 / 1024.0)
}

/// Turns cudarc's event tracking back on for `device`'s buffers from here on (its default).
#[cfg(feature = "cuda")]
fn track_events(device: &candle_core::Device) {
    if let candle_core::Device::Cuda(cuda) = device {
        // SAFETY: the default state, with one stream: the events are made and never waited for.
        unsafe { cuda.cuda_stream().context().enable_event_tracking() };
    }
}

#[cfg(not(feature = "cuda"))]
fn track_events(_: &candle_core::Device) {}

#[cfg(not(feature = "cuda"))]
fn peak_gpu_mib(_: &candle_core::Device) -> Option<f64> {
    None
}

fn run_row(index: usize, args: &Args, comm: &dyn Comm) -> Result<()> {
    let row = &ROWS[index];
    let _composed = args.composed.then(ssl_models::dispatch::composed_only);
    let cfg = config(row, args)?;
    let device = ssl_train::setup::device(&args.device)?;
    if args.event_tracking {
        track_events(&device);
    }
    let data = DataSplit::shape_only(row.shape, INSTANCES);
    let mut model = model::build_model(&cfg, &data, &device)?;
    let mut optimizer = model::optimizer(&cfg, &model)?;
    let trainable = model::trainable(&model.store);
    // The objective's hooks see what the trainer hands them.
    let (student, teacher) = model.hook_parameters();
    let (world, rank) = (comm.world_size(), comm.rank());
    let v = cfg.train.views;
    if cfg.train.batch_size % world != 0 {
        bail!(
            "row {} has B = {}, which {world} ranks cannot share evenly",
            index + 1,
            cfg.train.batch_size
        );
    }
    let b = cfg.train.batch_size / world;
    let mut shape = vec![v * b];
    shape.extend(row.shape);
    // Unseeded draws: each rank its own inputs.
    let images = Tensor::randn(0f32, 1.0, shape, &device)?;
    let labels: Vec<u32> = vec![0; b];
    let mut times = Vec::new();
    for step in 0..args.warmup + args.steps {
        // Different table rows every step, as an epoch would touch them; each rank its shard.
        let first = (step * b * world + rank * b) % INSTANCES;
        let ids: Vec<u32> = (first..first + b).map(|i| i as u32).collect();
        let input = StepInput {
            images: images.clone(),
            views: v,
            local_images: None,
            instance_ids: &ids,
            labels: &labels,
            progress: Progress {
                step,
                epoch: 0,
                steps_per_epoch: 1000,
                total_steps: 1000,
                seed: 0,
            },
            lr: cfg.train.lr,
        };
        let t = Instant::now();
        let grads = GradientAveraging::new(comm, &trainable, BUCKET_ELEMENTS)
            .run(|complete| {
                let ranks = trainer::StepCollectives::gather_over(comm.as_collective());
                Ok(trainer::forward_backward_on(&mut model, &input, ranks, complete)?.1)
            })?
            .grads;
        let hook = StepContext {
            progress: input.progress,
            student: &student,
            teacher: teacher.as_deref(),
        };
        model.objective.before_step(&hook)?;
        optimizer.step(&grads, input.lr, &input.progress)?;
        // I-JEPA's EMA update of its target encoder; nothing for rows 1–5.
        model.objective.after_step(&hook)?;
        device.synchronize()?;
        if step >= args.warmup {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let median = match times.len() % 2 {
        1 => times[times.len() / 2],
        _ => (times[times.len() / 2 - 1] + times[times.len() / 2]) / 2.0,
    };
    if rank > 0 {
        return Ok(());
    }
    println!(
        "{}",
        serde_json::json!({
            "row": index + 1,
            "name": row.name,
            "framework": "candle-ssl",
            "device": args.device,
            "world": world,
            "threads": args.threads,
            "median_ms": median,
            "min_ms": times[0],
            "max_ms": times[times.len() - 1],
            "peak_rss_mib": peak_rss_mib(),
            "peak_gpu_mib": peak_gpu_mib(&device),
            "composed": args.composed,
            "event_tracking": args.event_tracking,
            "precision": args.precision,
            "sets": args.sets,
        })
    );
    Ok(())
}

fn main() -> Result<()> {
    // As `ssl` does: keep freed memory for the next step instead of faulting in fresh pages.
    ssl_core::allocator::keep_freed_memory();
    let args = parse_args()?;
    if args.steps == 0 {
        bail!("--steps must be ≥ 1");
    }
    if args.row == "all" {
        if let Some(l) = ssl_dist::detect_launch(|v| std::env::var(v).ok())? {
            bail!(
                "started by a launcher ({}={}): give one --row, every rank runs it",
                l.variable,
                l.processes
            );
        }
        let exe = std::env::current_exe()?;
        for row in 1..=ROWS.len() {
            let status = std::process::Command::new(&exe)
                .args(["--row", &row.to_string()])
                .args(["--device", &args.device])
                .args(["--threads", &args.threads.to_string()])
                .args(["--steps", &args.steps.to_string()])
                .args(["--warmup", &args.warmup.to_string()])
                .args(args.composed.then_some("--composed"))
                .args(args.event_tracking.then_some("--event-tracking"))
                .args(["--precision", &args.precision])
                .status()?;
            if !status.success() {
                bail!("row {row} failed");
            }
        }
        return Ok(());
    }
    let row: usize = args
        .row
        .parse()
        .ok()
        .filter(|r| (1..=ROWS.len()).contains(r))
        .with_context(|| format!("--row {}: use 1..={} or all", args.row, ROWS.len()))?;
    // Candle's CPU kernels read RAYON_NUM_THREADS when they first run; our ops use Candle's
    // workers and rayon's global pool.
    std::env::set_var("RAYON_NUM_THREADS", args.threads.to_string());
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build_global()?;
    let comm = ssl_dist::connect(None)?;
    run_row(row - 1, &args, comm.as_ref())
}
