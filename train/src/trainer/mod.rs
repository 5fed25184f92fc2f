//! The training loop, in rooms: this file runs a whole fit (config → init → epochs →
//! evaluation); [`resume`] restores a run; [`epoch`] holds the loop over epochs and optimiser
//! steps; [`step`] is one step's forward, loss and backward, the seam the benches and parity
//! tests call. [`crate::Trainer`] is the door every caller comes through.
//!
//! One step: V augmented views of B instances → encoder (train mode, one view at a time) →
//! projector → objective loss (+ the online probe's cross-entropy on detached features) →
//! backward (the loss's, then each view's graph on its own, side by side on the CPU) →
//! optimiser → objective hook. Every step is logged to `metrics.jsonl`, its values read from
//! the device `log_every` steps at a time, with the covariance spectrum of the steps that log
//! it (no host synchronisation inside a step); every `checkpoint_every` epochs and at the end
//! the run is checkpointed atomically; `--resume` continues to the same final weights.
//!
//! Data parallel ([`crate::Trainer::ranks`], a [`Comm`] of several ranks): every rank builds
//! the same model from the seed, reads its shard of each global batch of
//! `world × train.batch_size` ([`ssl_data::ViewLoader::with_shard`]), gathers the global batch
//! where the objective asks (`Batch::collective`), and averages its gradients over the ranks
//! before the optimiser step, bucket by bucket while the backward pass goes on
//! ([`ssl_dist::GradientAveraging`]), so the ranks stay identical. Collectives belong to the
//! step, which every rank takes ([`StepCollectives`]: the objective's gathers and, with
//! `model.sync_bn`, the batch norms' statistics); rank 0 alone writes the run directory,
//! monitors and evaluates, with no collective, while the others wait at a barrier at the end
//! of every epoch and of the run. Every collective is bounded (`train.collective_timeout`): one
//! that a rank never joins ends the job with an error naming it, the rank and the step.

mod epoch;
mod resume;
mod step;
#[cfg(test)]
mod tests;

pub use epoch::local_crop;
pub use step::{
    add_grads, forward_backward, forward_backward_on, scale_grads, training_step, Logged,
    StepCollectives, StepInput, StepOutput, StepValues,
};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use ssl_core::RunFacts;
use ssl_dist::{Comm, GradientReduction};
use ssl_linalg::bf16_gemm::{native_bf16, Bf16Kernel};
use ssl_models::autocast::Precision;

use crate::callbacks::Callbacks;
use crate::config::RunConfig;
use crate::evaluate::{self, Evaluation};
use crate::model::Model;
use crate::phases::{timed, Clock, Phase, PhaseSeconds};
use crate::results::Results;
use crate::rundir::{self, Start};
use crate::runlog::RunLog;
use crate::setup::{self, DataSplit};
use epoch::{training_loader, Report, Training};
use resume::build_or_restore;
use ssl_core::atomic;
use ssl_core::progress;

/// Result of a finished run.
pub struct RunOutcome {
    pub dir: PathBuf,
    pub evaluation: Vec<(String, Evaluation)>,
    pub seconds: f64,
    /// Where those seconds went ([`crate::phases`]).
    pub phases: PhaseSeconds,
}

/// The file in a data-parallel run's directory that records its world size and batch sizes.
pub const DISTRIBUTED_JSON: &str = "distributed.json";

/// What [`DISTRIBUTED_JSON`] records of a data-parallel run; a resume reads it back to refuse
/// another world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistributedRecord {
    pub world_size: usize,
    pub batch_size_per_rank: usize,
    pub global_batch: usize,
    pub sync_bn: bool,
}

impl DistributedRecord {
    /// The record of the run in `dir`; `None` when it has none (one process trained it).
    pub fn read(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join(DISTRIBUTED_JSON);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .with_context(|| format!("{} is damaged: {text:?}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    fn write(&self, dir: &Path) -> Result<()> {
        atomic::write(
            &dir.join(DISTRIBUTED_JSON),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )
    }
}

/// Trains `cfg` on `data` as one rank of `shared`: the model built (or restored to resume),
/// rank 0's run directory opened, the epochs trained, and rank 0's end-of-run evaluation
/// written. The other ranks train alongside and return no evaluation.
pub fn fit(
    cfg: &RunConfig,
    start: Start,
    shared: &Arc<dyn Comm>,
    data: DataSplit,
    callbacks: &mut Callbacks,
) -> Result<RunOutcome> {
    let started = Instant::now();
    let clock = Clock::default();
    let _clock = clock.install();
    let setup_started = Instant::now();
    // A configuration filled in field by field meets the same checks as one read from YAML.
    cfg.validate()?;
    let comm = shared.as_ref();
    comm.set_collective_timeout(Duration::from_secs(cfg.train.collective_timeout as u64));
    let device = setup::rank_device(&cfg.train.device, comm)?;
    evaluate::check_split(&data)?;
    let cfg = &fit_to_data(cfg, start, &data, comm)?;
    let (mut model, mut optimizer, resumed) = build_or_restore(cfg, &data, &device, start, comm)?;
    let loader = training_loader(cfg, &data, comm)?;
    let outcome = |dir: PathBuf, evaluation| RunOutcome {
        dir,
        evaluation,
        seconds: started.elapsed().as_secs_f64(),
        phases: clock.seconds(),
    };
    if comm.rank() != 0 {
        clock.add(Phase::Setup, setup_started);
        let mut training = Training::new(
            cfg,
            &loader,
            &mut model,
            &mut optimizer,
            None,
            shared,
            resumed,
        );
        training.run(&data, &device, &loader)?;
        // Rank 0 evaluates and writes the results meanwhile.
        comm.wait_for_rank_zero()?;
        return Ok(outcome(cfg.out.clone(), Vec::new()));
    }
    let cfg = &open_run_dir(cfg, start, &data, &model, &device, comm)?;
    let dir = cfg.out.clone();
    let mut log = RunLog::open(&dir, cfg, resumed.as_ref())?;
    clock.add(Phase::Setup, setup_started);
    let mut training = Training::new(
        cfg,
        &loader,
        &mut model,
        &mut optimizer,
        Some(Report {
            log: &mut log,
            callbacks,
        }),
        shared,
        resumed,
    );
    if !training.run(&data, &device, &loader)? {
        comm.wait_for_rank_zero()
            .context("at the barrier after an early stop")?;
        return Ok(outcome(dir, Vec::new()));
    }
    let last_step = training.state.step.saturating_sub(1);
    let features = training.final_features.take();
    let evaluation = timed(Phase::Evaluation, || {
        evaluate_run(cfg, &data, &model, &device, features)
    })?;
    write_results(cfg, &evaluation, started, &clock)?;
    log.finish(last_step)?;
    comm.wait_for_rank_zero()
        .context("at the barrier after the end-of-run evaluation")?;
    Ok(outcome(dir, evaluation))
}

/// `cfg` with its objective's defaulted keys fitted to the training set, each change printed
/// (and recorded in `config.yaml` with the rest). A resumed run keeps the values it recorded.
fn fit_to_data(
    cfg: &RunConfig,
    start: Start,
    data: &DataSplit,
    comm: &dyn Comm,
) -> Result<RunConfig> {
    let mut cfg = cfg.clone();
    if matches!(start, Start::Resume) {
        return Ok(cfg);
    }
    // The encoder's width, from a scratch copy (the run's is built after the fit).
    let scratch = ssl_core::ParamStore::new(cfg.train.seed);
    let encoder = setup::encoder(&cfg, &data.dataset, scratch.var_builder(&Device::Cpu))?;
    let feature_dim = encoder.output_dim();
    let facts = RunFacts {
        num_instances: data.pretraining().len(),
        batch_size: cfg.train.batch_size * comm.world_size(),
        feature_dim,
        projection_dim: cfg.model.projector.last().copied().unwrap_or(feature_dim),
    };
    for note in cfg.objective.fit_to_data(&facts)? {
        if comm.rank() == 0 {
            progress::println(format!("note: {note}"));
        }
    }
    Ok(cfg)
}

/// Rank 0's run directory, prepared for `start`, with the resolved configuration, the data
/// split and (data parallel) the world's batch sizes written into it; returns the configuration
/// with `out` set to it.
fn open_run_dir(
    cfg: &RunConfig,
    start: Start,
    data: &DataSplit,
    model: &Model,
    device: &Device,
    comm: &dyn Comm,
) -> Result<RunConfig> {
    if model.precision == Precision::Bf16 && device.is_cpu() {
        Bf16Kernel::from_env().map_err(anyhow::Error::msg)?;
        if !native_bf16() {
            eprintln!(
                "train.precision bf16: this CPU has neither AMX nor AVX512-BF16, so the \
                 products multiply bf16-rounded operands in f32: a check of a recipe in bf16, \
                 no faster than f32"
            );
        }
    }
    let dir = rundir::prepare(cfg, start)?;
    let cfg = RunConfig {
        out: dir.clone(),
        ..cfg.clone()
    };
    atomic::write(
        &dir.join("config.yaml"),
        serde_yaml::to_string(&cfg)?.as_bytes(),
    )?;
    atomic::write(
        &dir.join("split.json"),
        serde_json::to_string(data)?.as_bytes(),
    )?;
    let world = comm.world_size();
    if world > 1 {
        let b = cfg.train.batch_size;
        let norm = match cfg.model.sync_bn {
            true => "batch norm over the global batch (model.sync_bn)",
            false => "batch norm per rank (model.sync_bn: false)",
        };
        let averaged = match comm.gradient_reduction() {
            GradientReduction::OnThread | GradientReduction::Enqueued => {
                "gradients averaged during the backward pass"
            }
            GradientReduction::AfterBackward => "gradients averaged after the backward pass",
        };
        eprintln!(
            "data parallel over {world} ranks: batch {b} per rank, global batch {}, {norm}, \
             {averaged}",
            world * b
        );
        DistributedRecord {
            world_size: world,
            batch_size_per_rank: b,
            global_batch: world * b,
            sync_bn: cfg.model.sync_bn,
        }
        .write(&dir)?;
    }
    Ok(cfg)
}

/// The end-of-run evaluation (raw inputs, random init, the trained encoder), a 2-D encoder's
/// embedding, and `results.json` in the run directory.
fn evaluate_run(
    cfg: &RunConfig,
    data: &DataSplit,
    model: &Model,
    device: &Device,
    features: Option<evaluate::Embeddings>,
) -> Result<Vec<(String, Evaluation)>> {
    let dir = &cfg.out;
    let evaluation = evaluate::with_baselines(cfg, data, model, device, features)
        .context("in the end-of-run evaluation")?;
    if model.encoder.output_dim() == 2 {
        evaluate::write_embedding(&dir.join("embedding.csv"), data, model, device)?;
        #[cfg(feature = "plots")]
        crate::figures::embedding(dir, format!("{}: test embeddings", cfg.objective.name))?;
    }
    Ok(evaluation)
}

/// `results.json`: the table's rows, the run's seconds and where they went.
fn write_results(
    cfg: &RunConfig,
    evaluation: &[(String, Evaluation)],
    started: Instant,
    clock: &Clock,
) -> Result<()> {
    Results::new(
        evaluation,
        started.elapsed().as_secs_f64(),
        &clock.seconds(),
    )
    .write(&cfg.out)
}
