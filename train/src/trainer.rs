//! The training loop: config → init → run.
//!
//! One step: V augmented views of B instances → encoder (train mode, one view at a time) →
//! projector → objective loss (+ the online probe's cross-entropy on detached features) → backward
//! (the loss's, then each view's graph on its own, side by side on the CPU) → optimiser → objective
//! hook. Every step is logged to `metrics.jsonl`, its values read from the device `log_every` steps
//! at a time, with the covariance spectrum of the steps that log it (no host synchronisation
//! inside a step); every `checkpoint_every` epochs and at the end the run is checkpointed
//! atomically; `--resume` continues to the same final weights.
//!
//! Data parallel ([`run_on`] with a [`Comm`] of several ranks): every rank builds the same model
//! from the seed, reads its shard of each global batch of `world × train.batch_size`
//! ([`ViewLoader::with_shard`]), gathers the global batch where the objective asks
//! (`Batch::collective`), and averages its gradients over the ranks before the optimiser step,
//! bucket by bucket while the backward pass goes on ([`GradientAveraging`]), so the ranks stay
//! identical. Collectives belong to the step, which every rank takes ([`StepCollectives`]:
//! the objective's gathers and, with `model.sync_bn`, the batch norms' statistics); rank 0
//! alone writes the run directory, monitors and evaluates, with no collective, while the others
//! wait at a barrier at the end of every epoch and of the run. Every collective is bounded
//! (`train.collective_timeout`): one that a rank never joins ends the job with an error naming
//! it, the rank and the step.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::utils::barrier_pool;
use candle_core::{Device, Tensor, TensorId, Var};
use serde_json::json;
use ssl_core::{
    Batch, Collective, Ids, LossOutput, ParamStore, PixelBatch, PixelLoss, Progress, SingleProcess,
    StepContext,
};
use ssl_data::{Interpolation, LocalCrop, ViewLoader, ViewTransform};
use ssl_dist::{Comm, Complete, GradientAveraging, GradientReduction};
use ssl_models::autocast::{autocast, Precision};
use ssl_models::{Encoder, Projector};

use crate::atomic;
use crate::callbacks::{Callbacks, EpochEvent, StepEvent};
use crate::checkpoint::{self, TrainerState};
use crate::config::RunConfig;
use crate::evaluate::{self, Evaluation, Inputs};
use crate::model::{self, Model};
use crate::progress;
use crate::rundir::{self, Start};
use crate::runlog::{RunLog, StepRecord};
use crate::setup::{self, DataSplit};
use crate::staging::{StagedBatch, Stager};
use ssl_optim::{learning_rate, Optimizer};

/// Result of a finished run.
pub struct RunOutcome {
    pub dir: PathBuf,
    pub evaluation: Vec<(String, Evaluation)>,
    pub seconds: f64,
}

/// Trains `cfg` into its run directory, in this process alone ([`run_on`]).
pub fn run(cfg: &RunConfig, start: Start) -> Result<RunOutcome> {
    run_on(cfg, start, &(Arc::new(SingleProcess) as Arc<dyn Comm>))
}

/// The file in a data-parallel run's directory that records its world size and batch sizes.
pub const DISTRIBUTED_JSON: &str = "distributed.json";

/// Trains `cfg` on the data set it names, as one rank of `shared` ([`fit`]).
pub fn run_on(cfg: &RunConfig, start: Start, shared: &Arc<dyn Comm>) -> Result<RunOutcome> {
    fit(
        cfg,
        start,
        shared,
        setup::data(cfg)?,
        &mut Callbacks::default(),
    )
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
    // A configuration filled in field by field meets the same checks as one read from YAML.
    cfg.validate()?;
    let comm = shared.as_ref();
    comm.set_collective_timeout(Duration::from_secs(cfg.train.collective_timeout as u64));
    let device = setup::rank_device(&cfg.train.device, comm)?;
    evaluate::check_split(&data)?;
    let (mut model, mut optimizer, resumed) = build_or_restore(cfg, &data, &device, start, comm)?;
    let loader = training_loader(cfg, &data, comm)?;
    let outcome = |dir: PathBuf, evaluation| RunOutcome {
        dir,
        evaluation,
        seconds: started.elapsed().as_secs_f64(),
    };
    if comm.rank() != 0 {
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
    let evaluation = evaluate_run(cfg, &data, &model, &device, features, started)?;
    log.finish(last_step)?;
    comm.wait_for_rank_zero()
        .context("at the barrier after the end-of-run evaluation")?;
    Ok(outcome(dir, evaluation))
}

/// The model and optimiser of `cfg` on `data`: fresh (with `model.init`'s weights, if given),
/// or restored from the run directory to resume.
fn build_or_restore(
    cfg: &RunConfig,
    data: &DataSplit,
    device: &Device,
    start: Start,
    comm: &dyn Comm,
) -> Result<(Model, Optimizer, Option<TrainerState>)> {
    let mut model = model::build_model(cfg, data, device)?;
    model::apply_init(cfg, &model)?;
    let mut optimizer = model::optimizer(cfg, &model)?;
    let resumed = match start {
        Start::Resume => {
            check_world_size(&cfg.out, comm.world_size(), cfg.train.batch_size)?;
            Some(restore(&cfg.out, &mut model, &mut optimizer)?)
        }
        Start::Fresh | Start::Overwrite => None,
    };
    Ok((model, optimizer, resumed))
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
        eprintln!(
            "train.precision bf16 on the CPU is emulated (bf16-rounded operands, f32 products): \
             it checks a recipe in bf16 but is slower than f32; use it for speed on cuda or metal"
        );
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
        let record = json!({
            "world_size": world,
            "batch_size_per_rank": b,
            "global_batch": world * b,
            "sync_bn": cfg.model.sync_bn,
        });
        atomic::write(
            &dir.join(DISTRIBUTED_JSON),
            serde_json::to_string_pretty(&record)?.as_bytes(),
        )?;
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
    started: Instant,
) -> Result<Vec<(String, Evaluation)>> {
    let dir = &cfg.out;
    let evaluation = evaluate::with_baselines(cfg, data, model, device, features)
        .context("in the end-of-run evaluation")?;
    if model.encoder.output_dim() == 2 {
        evaluate::write_embedding(&dir.join("embedding.csv"), data, model, device)?;
        #[cfg(feature = "plots")]
        crate::figures::embedding(dir, format!("{}: test embeddings", cfg.objective.name))?;
    }
    let results = json!({
        "seconds": started.elapsed().as_secs_f64(),
        "rows": evaluation.iter().map(|(n, e)| json!({"encoder": n, "metrics": e})).collect::<Vec<_>>(),
    });
    atomic::write(
        &dir.join("results.json"),
        serde_json::to_string_pretty(&results)?.as_bytes(),
    )?;
    Ok(evaluation)
}

/// Refuses to resume the run in `dir` on `world` ranks when it was trained on another number
/// (its [`DISTRIBUTED_JSON`]; a run without one was trained by one process): the global batch,
/// and with it every step after the checkpoint, would change.
fn check_world_size(dir: &Path, world: usize, batch_size: usize) -> Result<()> {
    let path = dir.join(DISTRIBUTED_JSON);
    let trained = match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["world_size"].as_u64())
            .with_context(|| format!("{} has no world_size; it is damaged", path.display()))?
            as usize,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 1,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    ensure!(
        trained == world,
        "the run in {} was trained on {trained} rank(s) (global batch {}), and this resume has \
         {world} (global batch {}); resume it with {trained} process(es) ({})",
        dir.display(),
        trained * batch_size,
        world * batch_size,
        match trained {
            1 => "plain `ssl run --resume`".to_string(),
            n => format!("mpirun -np {n} ssl run --resume"),
        }
    );
    Ok(())
}

/// Loads the last checkpoint of the run in `dir` into `model` and `optimizer`: where it stands.
fn restore(dir: &Path, model: &mut Model, optimizer: &mut Optimizer) -> Result<TrainerState> {
    let ckpt_dir = dir.join("checkpoint");
    let state = checkpoint::load_state(&ckpt_dir)?;
    model
        .store
        .load(&checkpoint::load_tensors(&ckpt_dir.join(checkpoint::MODEL))?)
        .with_context(|| {
            format!(
                "cannot resume from {}: it was written for another model, objective or training-set size \
                 (an instance table has one row per training instance); resume with the run's own \
                 configuration ({}) or start a new run",
                ckpt_dir.display(),
                dir.join("config.yaml").display()
            )
        })?;
    optimizer.load_state(&checkpoint::load_tensors(
        &ckpt_dir.join(checkpoint::OPTIMIZER),
    )?)?;
    Ok(state)
}

/// The multi-crop local views of `cfg` for samples of `shape` (`[C, H, W]`), made by `local`
/// (the view types' local transform and crop filter).
pub fn local_crop(
    cfg: &RunConfig,
    shape: &[usize],
    (then, interpolation): (Arc<dyn ViewTransform>, Interpolation),
) -> LocalCrop {
    let t = &cfg.train;
    let side = shape.last().copied().unwrap_or(0);
    LocalCrop {
        interpolation,
        ..LocalCrop::new(t.local_side(side), t.local_scale, then)
    }
}

/// The training views of `cfg` over the train split, this rank's shard of every global batch,
/// checked against the data (before a run writes anything).
fn training_loader(cfg: &RunConfig, data: &DataSplit, comm: &dyn Comm) -> Result<Arc<ViewLoader>> {
    let t = &cfg.train;
    let types = cfg.data.view_types(&data.dataset.shape)?;
    let loader = ViewLoader::new(
        data.dataset.clone(),
        data.pretraining(),
        t.batch_size,
        t.views,
        t.drop_last,
        t.seed,
        types.views,
    )?
    .with_local_views(
        t.local_views,
        local_crop(cfg, &data.dataset.shape, types.local),
    )
    .context("invalid train.local_views for this data")?
    .with_shard(comm.rank(), comm.world_size())?;
    if loader.steps_per_epoch() / t.accumulate == 0 {
        bail!(
            "an optimiser step takes {} batch(es) of {} × {} rank(s) (train.accumulate × --batch-size \
             × ranks), more than the {} training instances give per epoch with drop_last; lower \
             --batch-size or train.accumulate",
            t.accumulate,
            t.batch_size,
            comm.world_size(),
            data.pretraining().len()
        );
    }
    Ok(Arc::new(loader))
}

/// Batches the loader builds ahead of the training step.
const PREFETCH: usize = 2;

/// A run in training: the model and optimiser, its logs, and where it stands.
struct Training<'a> {
    cfg: &'a RunConfig,
    model: &'a mut Model,
    optimizer: &'a mut Optimizer,
    /// Rank 0's logs and callbacks; the other ranks write and call nothing.
    report: Option<Report<'a>>,
    comm: &'a dyn Comm,
    /// The batch norms' collective under `model.sync_bn` on more than one rank, handed to every
    /// training step ([`StepCollectives`]).
    batch_norm: Option<Arc<dyn Collective>>,
    /// The variables whose gradients are averaged over the ranks.
    trainable: Vec<(String, Var)>,
    state: TrainerState,
    /// The step of the checkpoint on disk, if there is one.
    checkpointed: Option<usize>,
    steps_per_epoch: usize,
    total_steps: usize,
    /// The student's trainable parameters, and the teacher's under the same names (the EMA
    /// hook pairs them by position).
    student: model::NamedVars,
    teacher: Option<model::NamedVars>,
    /// The last epoch's monitor features, which the final evaluation reuses.
    final_features: Option<evaluate::Embeddings>,
    /// Steps taken whose logged values are still on the device.
    pending: Pending,
}

/// What rank 0 writes and calls as the run goes.
struct Report<'a> {
    log: &'a mut RunLog,
    callbacks: &'a mut Callbacks,
}

/// The steps of the current logging interval (`train.log_every`), read from the device together.
#[derive(Default)]
struct Pending {
    steps: Vec<PendingStep>,
    /// When the interval's first step started, and how many images (over all ranks) its steps
    /// trained on.
    since: Option<Instant>,
    images: usize,
}

struct PendingStep {
    step: usize,
    epoch: usize,
    lr: f64,
    data_wait_ms: f64,
    logged: Logged,
    /// The step's global-view projections `[V, B, D]` (detached) when it logs the spectrum,
    /// read with the interval's values rather than in the step.
    spectrum: Option<Tensor>,
}

impl<'a> Training<'a> {
    fn new(
        cfg: &'a RunConfig,
        loader: &ViewLoader,
        model: &'a mut Model,
        optimizer: &'a mut Optimizer,
        report: Option<Report<'a>>,
        comm: &'a Arc<dyn Comm>,
        resumed: Option<TrainerState>,
    ) -> Self {
        let steps_per_epoch = loader.steps_per_epoch() / cfg.train.accumulate;
        let (student, teacher) = model.hook_parameters();
        Self {
            cfg,
            trainable: model::trainable(&model.store),
            model,
            optimizer,
            report,
            comm: comm.as_ref(),
            batch_norm: (cfg.model.sync_bn && comm.world_size() > 1)
                .then(|| Arc::clone(comm) as Arc<dyn Collective>),
            checkpointed: resumed.as_ref().map(|s| s.step),
            state: resumed.unwrap_or_default(),
            steps_per_epoch,
            total_steps: steps_per_epoch * cfg.train.epochs,
            student,
            teacher,
            final_features: None,
            pending: Pending::default(),
        }
    }

    /// The training loop: every remaining epoch's optimiser steps, then its end (monitor,
    /// checkpoint). Returns whether the run reached its last epoch.
    fn run(&mut self, data: &DataSplit, device: &Device, loader: &Arc<ViewLoader>) -> Result<bool> {
        let t = &self.cfg.train;
        let monitor_inputs = evaluate::clean_inputs(data, device);
        let bar = match self.report {
            Some(_) => progress::bar(
                self.total_steps as u64,
                "{spinner} epoch {prefix} [{bar:30}] {pos}/{len} steps {msg} ({eta})",
            ),
            None => indicatif::ProgressBar::hidden(),
        };
        bar.set_position(self.state.step as u64);
        let first = self.state.epochs_done;
        // One for the run: its page-locked buffers serve every epoch's loader thread in turn.
        let stager = Arc::new(Mutex::new(Stager::new(device, &data.dataset.shape)));
        for epoch in first..t.epochs {
            bar.set_prefix(format!("{}/{}", epoch + 1, t.epochs));
            let (stager, views) = (Arc::clone(&stager), Arc::clone(loader));
            let stage = move |batch| {
                views.check_finite(&batch)?;
                stager
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .stage(batch)
            };
            // Batches beyond the last whole group of `accumulate` are dropped, as drop_last does.
            let mut batches =
                loader.prefetch_with(epoch, self.steps_per_epoch * t.accumulate, PREFETCH, stage);
            for i in 0..self.steps_per_epoch {
                self.optimiser_step(epoch, &mut batches)?;
                bar.inc(1);
                // An interval's end, and the epoch's (before its checkpoint), read the values.
                if self.state.step.is_multiple_of(t.log_every) || i + 1 == self.steps_per_epoch {
                    let read = self.read_pending();
                    let loss = read.with_context(|| self.stopped_at(epoch))?;
                    bar.set_message(format!("loss {loss:.4}"));
                }
            }
            let by_setting = t.stop_after_epochs > 0 && epoch + 1 - first >= t.stop_after_epochs;
            let asked = self.comm.world_size() == 1
                && (self.report.as_ref()).is_some_and(|r| r.callbacks.stop_requested());
            let stopping = by_setting || asked;
            self.end_epoch(epoch, &monitor_inputs, stopping)?;
            if stopping && epoch + 1 < t.epochs {
                bar.abandon_with_message(match asked {
                    true => "stopped as asked, checkpoint written; continue with --resume",
                    false => "stopped early (train.stop_after_epochs); continue with --resume",
                });
                return Ok(false);
            }
        }
        bar.finish_and_clear();
        Ok(true)
    }

    /// One optimiser step: `train.accumulate` batches forward and backward, their mean
    /// gradient applied, the objective's hook (EMA teachers, queues); its logged values join
    /// the pending interval.
    fn optimiser_step(
        &mut self,
        epoch: usize,
        batches: &mut impl Iterator<Item = Result<StagedBatch>>,
    ) -> Result<()> {
        let t = &self.cfg.train;
        let started = Instant::now();
        let progress = Progress {
            step: self.state.step,
            epoch,
            steps_per_epoch: self.steps_per_epoch,
            total_steps: self.total_steps,
            seed: t.seed,
        };
        let lr = learning_rate(
            self.state.step,
            self.total_steps,
            t.warmup_epochs * self.steps_per_epoch,
            t.lr,
            t.min_lr,
        );
        let (mut outs, mut images) = (Vec::with_capacity(t.accumulate), 0);
        let mut data_wait = Duration::ZERO;
        let comm = self.comm;
        let (out, checkpointed, step) = (&self.cfg.out, self.checkpointed, self.state.step);
        let averaging = GradientAveraging::new(comm, &self.trainable, ssl_dist::BUCKET_ELEMENTS);
        let model = &mut *self.model;
        let ranks = StepCollectives {
            gather: comm.as_collective(),
            batch_norm: self.batch_norm.as_ref(),
        };
        let grads = averaging
            .run(|complete| {
                // The batches before the last are summed; the last one's backward completes the
                // mean over them, and hands each variable's over as it does.
                let mut sum: Option<GradStore> = None;
                let scale = 1.0 / t.accumulate as f64;
                for batch in 0..t.accumulate {
                    let asked = Instant::now();
                    let staged = batches
                        .next()
                        .context("the data loader stopped before the epoch's last batch")??;
                    data_wait += asked.elapsed();
                    let input = step_input(&staged, progress, lr)?;
                    let earlier = sum.as_ref();
                    let mean = |id: TensorId, grad: Option<&Tensor>| -> Result<()> {
                        if t.accumulate == 1 {
                            return complete(id, grad);
                        }
                        let total = match (earlier.and_then(|s| s.get_id(id)), grad) {
                            (Some(s), Some(g)) => Some((s + g)?),
                            (s, g) => s.or(g).cloned(),
                        };
                        complete(id, total.map(|t| t * scale).transpose()?.as_ref())
                    };
                    let last = batch + 1 == t.accumulate;
                    let hand_over: &Complete = match last {
                        true => &mean,
                        false => &|_, _| Ok(()),
                    };
                    let (out, batch_grads) = forward_backward_on(model, &input, ranks, hand_over)?;
                    images += input.views * input.instance_ids.len() * comm.world_size();
                    sum = Some(match sum.take() {
                        None => batch_grads,
                        Some(sum) => add_grads(&model.store, sum, &batch_grads)?,
                    });
                    outs.push(out);
                }
                let mut grads = sum.context("train.accumulate is at least 1")?;
                if t.accumulate > 1 {
                    scale_grads(&model.store, &mut grads, scale)?;
                }
                Ok(grads)
            })
            .with_context(|| stopped_at(out, checkpointed, step, epoch))?
            .grads;
        let hook = StepContext {
            progress,
            student: &self.student,
            teacher: self.teacher.as_deref(),
        };
        self.model.objective.before_step(&hook)?;
        self.optimizer.step(&grads, lr, &progress)?;
        self.model.objective.after_step(&hook)?;
        let out = mean_output(outs)?;
        let step = self.state.step;
        self.state.step += 1;
        let spectrum = match &self.report {
            Some(report) if report.log.logs_spectrum(self.cfg, step) => Some(out.projections),
            _ => None,
        };
        let pending = &mut self.pending;
        pending.since.get_or_insert(started);
        pending.images += images;
        pending.steps.push(PendingStep {
            step,
            epoch,
            lr,
            data_wait_ms: 1e3 * data_wait.as_secs_f64(),
            logged: out.logged,
            spectrum,
        });
        Ok(())
    }

    /// Reads the pending steps' values from the device in one copy, averages them over the
    /// ranks (the global batch's loss: every term is a mean over instances), stops at the
    /// first non-finite one, and logs them. Returns the last step's loss. Throughput is the
    /// interval's: on a GPU only the read waits for the steps' kernels.
    fn read_pending(&mut self) -> Result<f64> {
        let pending = std::mem::take(&mut self.pending);
        let last = pending
            .steps
            .last()
            .context("a logging interval has a step")?;
        let values: Vec<&Tensor> = pending.steps.iter().map(|p| &p.logged.values).collect();
        let width = last.logged.values.elem_count();
        let mut rows = Tensor::stack(&values, 0)?.flatten_all()?.to_vec1::<f64>()?;
        let world = self.comm.world_size();
        if world > 1 {
            self.comm.all_reduce_sum_f64(&mut rows)?;
            rows.iter_mut().for_each(|v| *v /= world as f64);
        }
        let seconds = pending.since.map_or(0.0, |t| t.elapsed().as_secs_f64());
        let mut loss = f64::NAN;
        for (p, row) in pending.steps.iter().zip(rows.chunks(width)) {
            let values = p.logged.values_of(row);
            values.check_finite(p.step, p.lr)?;
            loss = values.loss;
            if let Some(Report { log, callbacks }) = self.report.as_mut() {
                log.step(&StepRecord {
                    step: p.step,
                    epoch: p.epoch,
                    loss: values.loss,
                    terms: &values.terms,
                    probe_ce: values.probe_ce,
                    lr: p.lr,
                    images_per_s: pending.images as f64 / seconds,
                    data_wait_ms: p.data_wait_ms,
                })?;
                if let Some(projections) = &p.spectrum {
                    log.spectrum(p.step, projections)?;
                }
                callbacks.step(&StepEvent {
                    step: p.step,
                    epoch: p.epoch,
                    loss: values.loss,
                    terms: &values.terms,
                    lr: p.lr,
                })?;
            }
        }
        Ok(loss)
    }

    /// Where a failed step stopped the run, and what it left: only what is true of the disk.
    fn stopped_at(&self, epoch: usize) -> String {
        stopped_at(&self.cfg.out, self.checkpointed, self.state.step, epoch)
    }

    /// The end of an epoch: the k-NN / online-probe monitor when due, the logs flushed, and a
    /// checkpoint when due (every `checkpoint_every` epochs, the last, and before an early stop).
    fn end_epoch(
        &mut self,
        epoch: usize,
        monitor_inputs: &(Inputs, Inputs),
        stopping: bool,
    ) -> Result<()> {
        let cfg = self.cfg;
        self.state.epochs_done = epoch + 1;
        let last = self.state.epochs_done == cfg.train.epochs;
        let Some(Report { log, callbacks }) = self.report.as_mut() else {
            // Rank 0 monitors and checkpoints meanwhile.
            return self.comm.wait_for_rank_zero();
        };
        let mut monitored = (None, None);
        if last
            || self
                .state
                .epochs_done
                .is_multiple_of(cfg.eval.monitor_every)
        {
            let (train, test) = monitor_inputs;
            let (knn, probe, features) = evaluate::monitor(cfg, self.model, train, test)?;
            log.epoch_end(epoch, self.state.step, knn, probe)?;
            self.final_features = last.then_some(features);
            monitored = (Some(knn), probe);
        }
        log.flush()?;
        if last
            || stopping
            || self
                .state
                .epochs_done
                .is_multiple_of(cfg.train.checkpoint_every)
        {
            checkpoint::save(
                &cfg.out.join("checkpoint"),
                &self.model.store.tensors(),
                &self.optimizer.state()?,
                &self.state,
            )?;
            self.checkpointed = Some(self.state.step);
        }
        callbacks.epoch(&EpochEvent {
            epoch,
            steps: self.state.step,
            knn_accuracy: monitored.0,
            probe_accuracy: monitored.1,
        })?;
        let step = self.state.step;
        self.comm
            .wait_for_rank_zero()
            .with_context(|| format!("at the barrier ending epoch {} (step {step})", epoch + 1))
    }
}

/// One staged batch as the step's inputs, its ids and labels borrowed from it.
fn step_input(staged: &StagedBatch, progress: Progress, lr: f64) -> Result<StepInput<'_>> {
    let (images, local_images) = staged.tensors()?;
    let batch = &staged.batch;
    Ok(StepInput {
        images,
        views: batch.views_count,
        local_images,
        instance_ids: &batch.instance_ids,
        labels: &batch.labels,
        progress,
        lr,
    })
}

/// The inputs of one optimisation step.
pub struct StepInput<'a> {
    /// `[V·B, ...]` images, view-major (row `v·B + i` is view `v` of instance `i`).
    pub images: Tensor,
    pub views: usize,
    /// Multi-crop local views `[M·B, ...]` at their own (smaller) size, view-major; `None`
    /// without local crops.
    pub local_images: Option<Tensor>,
    /// Stable instance ids `[B]` and class labels `[B]`.
    pub instance_ids: &'a [u32],
    pub labels: &'a [u32],
    pub progress: Progress,
    pub lr: f64,
}

/// What one step computed.
pub struct StepOutput {
    pub logged: Logged,
    /// The projections of the global views the loss saw, `[V, B, D]` (detached).
    pub projections: Tensor,
}

/// A step's logged values, on the step's device until they are read ([`Self::read`]; the
/// trainer reads `train.log_every` steps' at once).
pub struct Logged {
    /// `[K]` f64: the objective's loss, its terms in the order of [`Self::terms`], then the
    /// online probe's cross-entropy if there is a probe (detached).
    pub values: Tensor,
    /// The names of the objective's loss terms.
    pub terms: Vec<String>,
    pub probe: bool,
}

/// One step's logged values on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct StepValues {
    pub loss: f64,
    pub terms: Vec<(String, f64)>,
    /// The online probe's cross-entropy, if there is a probe.
    pub probe_ce: Option<f64>,
}

impl Logged {
    /// The values on the host (one device-to-host copy).
    pub fn read(&self) -> Result<StepValues> {
        Ok(self.values_of(&self.values.to_vec1::<f64>()?))
    }

    /// The values of `row`, laid out as [`Self::values`].
    fn values_of(&self, row: &[f64]) -> StepValues {
        let n = self.terms.len();
        StepValues {
            loss: row[0],
            terms: self
                .terms
                .iter()
                .cloned()
                .zip(row[1..=n].to_vec())
                .collect(),
            probe_ce: self.probe.then(|| row[n + 1]),
        }
    }
}

impl StepValues {
    /// Refuses a non-finite loss or term, naming it, its step and the learning rate. The views
    /// were checked finite on the loader's thread, so the objective made it: at step 0 no
    /// update has been applied yet and the learning rate cannot be the cause; later, lowering
    /// it can help.
    pub fn check_finite(&self, step: usize, lr: f64) -> Result<()> {
        let what = match self.terms.iter().find(|(_, v)| !v.is_finite()) {
            Some((name, value)) => format!("loss term `{name}` became non-finite ({value})"),
            None if !self.loss.is_finite() => {
                format!("the loss became non-finite ({})", self.loss)
            }
            None => return Ok(()),
        };
        let fix = match step {
            0 => "on finite views at the initial weights, before any update, so the learning \
                  rate is not the cause: check the objective's settings (`ssl describe \
                  OBJECTIVE`) and whether the views differ at all (constant images)"
                .to_string(),
            _ => "on finite views; lower train.lr (or lengthen train.warmup_epochs) and train \
                  again, or resume from the last checkpoint with --allow-changed train.lr"
                .to_string(),
        };
        bail!("{what} at step {step} (lr {lr:e}) {fix}")
    }
}

/// Encoder and projector outputs of each view, `[B, F]` and `[B, D]`, with every view forwarded
/// as its own batch — as the official VICReg, BYOL and solo-learn code do: batch-norm statistics
/// are per view, and the cost is linear in V (one pass over 4·B images costs more than four over
/// B).
fn forward_views(
    encoder: &dyn Encoder,
    projector: Option<&Projector>,
    views: &[Tensor],
    train: bool,
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let mut features = Vec::with_capacity(views.len());
    let mut projections = Vec::with_capacity(views.len());
    for view in views {
        let f = encoder.forward_t(view, train)?;
        projections.push(match projector {
            Some(p) => p.forward_t(&f, train)?,
            None => f.clone(),
        });
        features.push(f);
    }
    Ok((features, projections))
}

/// The loss graph's gradients `grads` plus those of every variable behind `roots` (each a
/// scalar, one view's share of the loss), each variable of `store` handed to `complete` with its
/// total as soon as it is complete: one no root reaches at once (with the loss graph's
/// gradient, or none when it is not in this step's graph at all — a frozen head, say — as DDP
/// marks unused parameters ready, so that its bucket does not hold back the buckets after it),
/// another when every pass that reaches it has given its share. The roots' backward passes
/// share no node but the variables; on the CPU they run side by side, one to a Candle worker at
/// a time, every op of a pass on the thread that took it. A pass on its own thread needs no
/// barrier between its ops and multiplies whole matrices (2 threads, ViT-S's linear layers:
/// 0.91–0.95 of the time of the same products each split over both threads). A variable's
/// shares are added in root order whatever the thread count, each as soon as the ones before it
/// are in. Other devices take the roots in turn, and so does synchronised batch norm, whose
/// gathers' backward passes must reach the ranks' collectives in the same order everywhere.
fn backward_views(
    roots: Vec<Tensor>,
    grads: GradStore,
    store: &ParamStore,
    complete: &Complete,
) -> Result<GradStore> {
    let count = roots.len();
    let side_by_side =
        roots.iter().all(|r| r.device().is_cpu()) && !ssl_models::sync_bn::synchronised();
    let sums = ViewSums::new(&roots, grads);
    for id in sums.unreached(store) {
        complete(id, sums.total.get_id(id))?;
    }
    let roots: Vec<Mutex<Option<Tensor>>> =
        roots.into_iter().map(|r| Mutex::new(Some(r))).collect();
    let sums = Mutex::new(sums);
    let take_back = |i: usize| {
        let Some(root) = roots[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let lock = || sums.lock().unwrap_or_else(PoisonError::into_inner);
        let pass = root.backward_with(|var, grad| {
            let Some(total) = lock().add(i, var.id(), grad)? else {
                return Ok(());
            };
            complete(var.id(), total.as_ref())
                .map_err(|e| candle_core::Error::msg(format!("{e:#}")))
        });
        // The root, and with it the view's graph, goes before the next pass.
        drop(root);
        if let Err(e) = pass {
            lock().error.get_or_insert(e);
        }
    };
    match side_by_side {
        true => barrier_pool().execute_chunked(count, |range| range.for_each(take_back)),
        false => (0..count).for_each(take_back),
    }
    sums.into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_total()
}

/// Each variable's gradient summed over the backward passes that reach it, in pass order,
/// whatever order the passes give their shares in.
struct ViewSums {
    /// The loss graph's gradients, then each variable's total as it completes.
    total: GradStore,
    reached: HashMap<TensorId, ViewSum>,
    /// The first error of a pass or a sum; nothing is added after it.
    error: Option<candle_core::Error>,
}

/// One variable's shares.
struct ViewSum {
    /// The passes that reach it, in order, and how many of them are in the sum.
    passes: Vec<usize>,
    added: usize,
    sum: Option<Tensor>,
    /// Shares that came before an earlier pass's.
    waiting: BTreeMap<usize, Option<Tensor>>,
}

impl ViewSums {
    fn new(roots: &[Tensor], grads: GradStore) -> Self {
        let mut reached: HashMap<TensorId, ViewSum> = HashMap::new();
        for (i, root) in roots.iter().enumerate() {
            for var in root.sorted_nodes().into_iter().filter(|n| n.is_variable()) {
                let entry = reached.entry(var.id()).or_insert_with(|| ViewSum {
                    passes: Vec::new(),
                    added: 0,
                    sum: None,
                    waiting: BTreeMap::new(),
                });
                entry.passes.push(i);
            }
        }
        Self {
            total: grads,
            reached,
            error: None,
        }
    }

    /// The variables of `store` that no pass reaches: complete already, with the loss graph's
    /// gradient or none.
    fn unreached(&self, store: &ParamStore) -> Vec<TensorId> {
        store
            .vars()
            .into_iter()
            .map(|(_, var)| var.as_tensor().id())
            .filter(|id| !self.reached.contains_key(id))
            .collect()
    }

    /// Adds pass `pass`'s share `grad` of variable `id`; returns its total once every pass that
    /// reaches it is in (`Some(None)`: no gradient anywhere), `None` before.
    fn add(
        &mut self,
        pass: usize,
        id: TensorId,
        grad: Option<&Tensor>,
    ) -> candle_core::Result<Option<Option<Tensor>>> {
        if let Some(e) = &self.error {
            candle_core::bail!("another view's backward pass failed: {e}");
        }
        let Some(var) = self.reached.get_mut(&id) else {
            candle_core::bail!("a backward pass reached a variable its graph does not hold");
        };
        var.waiting.insert(pass, grad.cloned());
        while let Some(share) = var
            .passes
            .get(var.added)
            .and_then(|next| var.waiting.remove(next))
        {
            var.added += 1;
            var.sum = match (var.sum.take(), share) {
                (Some(sum), Some(share)) => Some(sum.add(&share)?),
                (sum, share) => sum.or(share),
            };
        }
        if var.added < var.passes.len() {
            return Ok(None);
        }
        // The loss graph's gradient comes first, as one pass's total would have been added to it.
        if let Some(sum) = var.sum.take() {
            let total = match self.total.get_id(id) {
                Some(loss) => loss.add(&sum)?,
                None => sum,
            };
            self.total.insert_id(id, total);
        }
        Ok(Some(self.total.get_id(id).cloned()))
    }

    fn into_total(self) -> Result<GradStore> {
        if let Some(e) = self.error {
            return Err(e.into());
        }
        let open = self
            .reached
            .values()
            .filter(|v| v.added < v.passes.len())
            .count();
        ensure!(
            open == 0,
            "{open} variables' backward passes did not all run"
        );
        Ok(self.total)
    }
}

/// What a failed step says: where training stopped and what `out` holds to resume from.
fn stopped_at(out: &Path, checkpointed: Option<usize>, step: usize, epoch: usize) -> String {
    let dir = out.join("checkpoint");
    let kept = match checkpointed {
        Some(step) => format!(
            "the checkpoint of step {step} in {} is kept (continue with --resume)",
            dir.display()
        ),
        None => "no checkpoint had been written yet".to_string(),
    };
    format!(
        "training stopped at step {step} (epoch {}); {kept}",
        epoch + 1
    )
}

/// One step: encoder (train mode, view by view, global views then local crops) → projector →
/// objective loss (+ the online probe's cross-entropy on the global views' detached features) →
/// backward → optimiser. A teacher sees the global views only. A non-finite loss or term is an
/// error raised before the weights change. Returns the step's values, read to the host.
pub fn training_step(
    model: &mut Model,
    optimizer: &mut Optimizer,
    input: &StepInput<'_>,
) -> Result<StepValues> {
    let (out, grads) = forward_backward(model, input)?;
    let values = out.logged.read()?;
    values.check_finite(input.progress.step, input.lr)?;
    optimizer.step(&grads, input.lr, &input.progress)?;
    Ok(values)
}

/// `sum + other` for every variable of `store` with a gradient in either.
pub fn add_grads(store: &ParamStore, mut sum: GradStore, other: &GradStore) -> Result<GradStore> {
    for (_, var) in store.vars() {
        let t = var.as_tensor();
        if let Some(g) = other.get(t) {
            let total = match sum.get(t) {
                Some(s) => (s + g)?,
                None => g.clone(),
            };
            sum.insert(t, total);
        }
    }
    Ok(sum)
}

/// Multiplies every gradient of `store`'s variables in `grads` by `factor`.
pub fn scale_grads(store: &ParamStore, grads: &mut GradStore, factor: f64) -> Result<()> {
    for (_, var) in store.vars() {
        let t = var.as_tensor();
        if let Some(g) = grads.get(t) {
            let scaled = (g * factor)?;
            grads.insert(t, scaled);
        }
    }
    Ok(())
}

/// The accumulated batches' outputs as one: their mean values (on the device), the last
/// batch's projections.
fn mean_output(outs: Vec<StepOutput>) -> Result<StepOutput> {
    let values = match outs.as_slice() {
        [_] => None,
        many => {
            let values: Vec<&Tensor> = many.iter().map(|o| &o.logged.values).collect();
            Some(Tensor::stack(&values, 0)?.mean(0)?)
        }
    };
    let mut last = outs.into_iter().last().context("at least one batch")?;
    if let Some(values) = values {
        last.logged.values = values;
    }
    Ok(last)
}

/// Forward, loss and backward of one batch (no optimiser step): its outputs and gradients.
pub fn forward_backward(
    model: &mut Model,
    input: &StepInput<'_>,
) -> Result<(StepOutput, GradStore)> {
    let one = StepCollectives::gather_over(&SingleProcess);
    forward_backward_on(model, input, one, &|_, _| Ok(()))
}

/// What a training step shares with the other ranks. It is handed to the step, which every rank
/// takes, and to nothing else: work one rank does alone (evaluation, baselines, monitoring,
/// export) has no collective to enter, and its batch norms use that rank's rows.
#[derive(Clone, Copy)]
pub struct StepCollectives<'a> {
    /// The objective's gathers of the global batch (`Batch::collective`).
    pub gather: &'a dyn Collective,
    /// With `model.sync_bn`: the collective over which every train-mode batch norm of the step
    /// takes the global batch's statistics; `None`: each rank's own rows.
    pub batch_norm: Option<&'a Arc<dyn Collective>>,
}

impl<'a> StepCollectives<'a> {
    /// Gathers over `collective`, batch norm per rank.
    pub fn gather_over(collective: &'a dyn Collective) -> Self {
        Self {
            gather: collective,
            batch_norm: None,
        }
    }
}

/// [`forward_backward`] of this rank's shard, the objective gathering the global batch through
/// `ranks.gather` and the batch norms synchronised over `ranks.batch_norm` for the step's forward
/// and backward passes alone. The gradients are this rank's; each variable's is also handed to
/// `complete` as soon as the backward has completed it (for [`GradientAveraging`] to average it
/// over the ranks while the backward goes on).
pub fn forward_backward_on(
    model: &mut Model,
    input: &StepInput<'_>,
    ranks: StepCollectives<'_>,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    match ranks.batch_norm {
        Some(collective) => {
            ssl_models::sync_bn::with_global_statistics(Arc::clone(collective), || {
                step_on(model, input, ranks.gather, complete)
            })
        }
        None => step_on(model, input, ranks.gather, complete),
    }
}

/// [`forward_backward_on`] with batch norm as the caller set it.
fn step_on(
    model: &mut Model,
    input: &StepInput<'_>,
    collective: &dyn Collective,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    let _precision = autocast(model.precision);
    let device = input.images.device();
    let (v, b) = (input.views, input.instance_ids.len());
    let views = input.images.chunk(v, 0)?;
    let mut student_views = views.clone();
    if let Some(local) = &input.local_images {
        student_views.extend(local.chunk(local.dims()[0] / b, 0)?);
    }
    if model.objective.requirements().pixels {
        return pixel_step(model, input, &student_views, collective, complete);
    }
    let all_views = student_views.len();
    let (view_features, view_projections) = forward_views(
        model.encoder.as_ref(),
        model.projector.as_ref(),
        &student_views,
        true,
    )?;
    // The loss's graph starts from leaves holding the views' outputs, and each view's own graph
    // is taken back afterwards from the loss's gradients at those leaves (`backward_views`).
    let features = Var::from_tensor(&Tensor::cat(&view_features, 0)?.detach())?;
    let projections = Var::from_tensor(&Tensor::cat(&view_projections, 0)?.detach())?;
    let teacher_out = match &model.teacher {
        Some((enc, proj)) => {
            let train_mode = model
                .objective
                .requirements()
                .teacher
                .is_some_and(|s| s.train_mode);
            let (_, p) = forward_views(enc.as_ref(), proj.as_ref(), &views, train_mode)?;
            Some(Tensor::cat(&p, 0)?.detach().reshape((v, b, ()))?)
        }
        None => None,
    };
    let indices = Ids::new(input.instance_ids, device)?;
    let labels = Ids::new(input.labels, device)?;
    let features_v = features.reshape((all_views, b, ()))?;
    let projections_v = projections.reshape((all_views, b, ()))?;
    let batch = Batch {
        projections: &projections_v,
        features: &features_v,
        global_views: v,
        indices: &indices,
        labels: Some(&labels),
        teacher: teacher_out.as_ref(),
        progress: input.progress,
        train: true,
        collective,
    };
    let out = model.objective.loss(&batch)?;
    let (mut values, terms) = logged_values(&out)?;
    let mut total = out.loss;
    if let Some(probe) = &model.probe {
        let ce = probe.loss(&features.narrow(0, 0, v * b)?, input.labels, v, collective)?;
        values.push(scalar(&ce)?);
        total = (total + ce)?;
    }
    let mut grads = total.backward()?;
    // Each view's share of the loss, `⟨output, ∂L/∂output⟩` summed over its features and
    // projections, has the loss's gradients for that view's graph; the roots own the views'
    // graphs from here, so each graph is freed as soon as its pass is done.
    let leaf_grads = [grads.remove(&features), grads.remove(&projections)];
    let mut roots = Vec::with_capacity(all_views);
    for (view, outputs) in view_features.into_iter().zip(view_projections).enumerate() {
        let mut root: Option<Tensor> = None;
        for (output, grad) in [outputs.0, outputs.1].iter().zip(&leaf_grads) {
            if let Some(grad) = grad {
                let share = (output * grad.narrow(0, view * b, b)?)?.sum_all()?;
                root = Some(match root {
                    Some(root) => (root + share)?,
                    None => share,
                });
            }
        }
        roots.extend(root);
    }
    let grads = backward_views(roots, grads, &model.store, complete)?;
    let out = StepOutput {
        logged: Logged {
            values: Tensor::stack(&values, 0)?,
            terms,
            probe: model.probe.is_some(),
        },
        projections: projections_v.narrow(0, 0, v)?.detach(),
    };
    Ok((out, grads))
}

/// [`step_on`] for an objective that encodes the views itself ([`Requirements::pixels`]): it
/// gets the views and the encoders' patch tokens, returns its loss and an embedding of every
/// global view (for the spectrum); the online probe trains on the encoder's detached output for
/// the whole global views. One backward pass through the whole graph.
///
/// [`Requirements::pixels`]: ssl_core::Requirements::pixels
fn pixel_step(
    model: &mut Model,
    input: &StepInput<'_>,
    views: &[Tensor],
    collective: &dyn Collective,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    let device = input.images.device();
    let v = input.views;
    let no_tokens = || anyhow!("the objective encodes patch tokens and the encoder has none");
    let encoder = model.encoder.tokens().ok_or_else(no_tokens)?;
    let teacher = match &model.teacher {
        Some((enc, _)) => Some(enc.tokens().ok_or_else(no_tokens)?),
        None => None,
    };
    let indices = Ids::new(input.instance_ids, device)?;
    let labels = Ids::new(input.labels, device)?;
    let batch = PixelBatch {
        views,
        global_views: v,
        encoder,
        teacher,
        indices: &indices,
        labels: Some(&labels),
        progress: input.progress,
        train: true,
        collective,
    };
    let PixelLoss { output, embeddings } = model.objective.pixel_loss(&batch)?;
    let embeddings = embeddings.detach();
    let (mut values, terms) = logged_values(&output)?;
    let mut total = output.loss;
    if let Some(probe) = &model.probe {
        // The probe reads the encoder's output on the whole global views, as it does with the
        // other objectives and is evaluated on, not the objective's embedding of a masked view
        // or of the teacher (on which it stayed at chance). Through the eval encoder: the same
        // function (a token encoder has no batch norm), and no graph held beside the step's. It
        // is the student's: `eval.encoder: teacher` runs without the probe (config validation).
        let global = Tensor::cat(&views[..v], 0)?;
        let features = model.eval_encoder.forward_t(&global, true)?;
        let ce = probe.loss(&features, input.labels, v, collective)?;
        values.push(scalar(&ce)?);
        total = (total + ce)?;
    }
    let grads = backward_views(Vec::new(), total.backward()?, &model.store, complete)?;
    let out = StepOutput {
        logged: Logged {
            values: Tensor::stack(&values, 0)?,
            terms,
            probe: model.probe.is_some(),
        },
        projections: embeddings,
    };
    Ok((out, grads))
}

/// A logged scalar: detached, f64, shape `[]`.
fn scalar(t: &Tensor) -> Result<Tensor> {
    Ok(t.detach().to_dtype(candle_core::DType::F64)?.reshape(())?)
}

/// The loss and its terms as logged scalars, and the terms' names.
fn logged_values(out: &LossOutput) -> Result<(Vec<Tensor>, Vec<String>)> {
    let mut values = vec![scalar(&out.loss)?];
    let mut names = Vec::with_capacity(out.terms.len());
    for (name, value) in &out.terms {
        names.push(name.clone());
        values.push(scalar(value)?);
    }
    Ok((values, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model and optimiser of the GMM study (MLP encoder, IConE): no batch norm, and a loss
    /// whose batch terms are means over instances, so accumulating two half batches must give
    /// the full batch's update.
    fn gmm_model(cfg: &RunConfig, data: &DataSplit) -> (Model, Optimizer) {
        let model = model::build_model(cfg, data, &Device::Cpu).unwrap();
        let optimizer = model::optimizer(cfg, &model).unwrap();
        (model, optimizer)
    }

    /// The GMM study's config (MLP encoder, IConE, no probe) with `sets` applied.
    fn gmm_config(sets: &[&str]) -> RunConfig {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        for s in [
            "data.name=gmm",
            "model.encoder=mlp",
            "objective.name=icone",
            "train.probe_lr=0",
        ]
        .iter()
        .chain(sets)
        {
            crate::config::apply_set(&mut root, s).unwrap();
        }
        RunConfig::from_yaml_value(root).unwrap()
    }

    /// The first `b` training instances of `data` (clean), their ids `0..b` and labels, and the
    /// progress of a one-step run.
    fn first_instances(data: &DataSplit, b: usize) -> (Tensor, Vec<u32>, Vec<u32>, Progress) {
        let positions: Vec<usize> = data.train[..b].to_vec();
        let clean = setup::samples(data, &positions, &Device::Cpu).unwrap();
        let progress = Progress {
            step: 0,
            epoch: 0,
            steps_per_epoch: 1,
            total_steps: 1,
            seed: 0,
        };
        let labels = setup::labels(&data.dataset, &positions);
        (clean, (0..b as u32).collect(), labels, progress)
    }

    /// A variable's shares arriving out of order are summed in pass order and added to the loss
    /// graph's gradient once every pass that reaches it is in; a variable only the loss graph
    /// holds, or none at all, is complete from the start, one reached without a gradient
    /// completes with none, and after a failed pass nothing more is added.
    #[test]
    fn view_sums_add_in_pass_order_and_stop_at_the_first_error() {
        let cpu = &Device::Cpu;
        let store = ParamStore::new(0);
        let vb = store.var_builder(cpu);
        let [w, x, y, z] =
            [("w", 1), ("x", 2), ("y", 1), ("z", 1)].map(|(name, n)| vb.get(n, name).unwrap());
        let [w, x, y, z] = [w, x, y, z].map(|t| Var::from_tensor(&t).unwrap());
        let g = |v: &[f32]| Tensor::new(v, cpu).unwrap();
        let values = |t: &Tensor| t.to_vec1::<f32>().unwrap();
        // Passes 0 and 2 reach x, pass 1 reaches y; the loss graph holds x and z; no graph w.
        let roots = [
            x.as_tensor().sum_all().unwrap(),
            y.as_tensor().sum_all().unwrap(),
            (x.as_tensor() * 2.0).unwrap().sum_all().unwrap(),
        ];
        let mut loss = GradStore::default();
        loss.insert(x.as_tensor(), g(&[10.0, 10.0]));
        loss.insert(z.as_tensor(), g(&[3.0]));
        let mut sums = ViewSums::new(&roots, loss);
        assert_eq!(
            sums.unreached(&store),
            [w.as_tensor().id(), z.as_tensor().id()]
        );
        let early = sums.add(2, x.as_tensor().id(), Some(&g(&[4.0, 1.0])));
        assert!(early.unwrap().is_none(), "pass 2 waits for pass 0");
        let x_total = sums.add(0, x.as_tensor().id(), Some(&g(&[1.0, 1.0])));
        assert_eq!(values(&x_total.unwrap().unwrap().unwrap()), [15.0, 12.0]);
        let y_total = sums.add(1, y.as_tensor().id(), None).unwrap();
        assert!(
            matches!(y_total, Some(None)),
            "y is complete, without a gradient"
        );
        let total = sums.into_total().unwrap();
        assert_eq!(values(total.get(x.as_tensor()).unwrap()), [15.0, 12.0]);
        assert_eq!(values(total.get(z.as_tensor()).unwrap()), [3.0]);
        assert!(total.get(y.as_tensor()).is_none());

        let mut sums = ViewSums::new(&roots, GradStore::default());
        sums.error = Some(candle_core::Error::Msg("pass 1 failed".into()));
        let e = sums.add(0, x.as_tensor().id(), Some(&g(&[1.0, 1.0])));
        assert!(e.unwrap_err().to_string().contains("pass 1 failed"));
        let e = sums.into_total().unwrap_err().to_string();
        assert!(e.contains("pass 1 failed"), "{e}");
    }

    /// A failed step names where training stopped (1-based epoch) and the checkpoint that is
    /// left to resume from, if any.
    #[test]
    fn a_failed_step_says_where_it_stopped_and_what_is_kept() {
        let out = Path::new("runs/a");
        let kept = stopped_at(out, Some(40), 57, 2);
        assert!(
            kept.starts_with("training stopped at step 57 (epoch 3); "),
            "{kept}"
        );
        let dir = out.join("checkpoint");
        let named = format!("the checkpoint of step 40 in {} is kept", dir.display());
        assert!(
            kept.contains(&named) && kept.ends_with("(continue with --resume)"),
            "{kept}"
        );
        let none = stopped_at(out, None, 3, 0);
        assert_eq!(
            none,
            "training stopped at step 3 (epoch 1); no checkpoint had been written yet"
        );
    }

    #[test]
    fn bf16_training_follows_f32_within_bf16_precision() {
        let losses = |precision: &str| -> Vec<f64> {
            let cfg = gmm_config(&[&format!("train.precision={precision}")]);
            let data = setup::data(&cfg).unwrap();
            let (mut model, mut optimizer) = gmm_model(&cfg, &data);
            let b = 16;
            let positions: Vec<usize> = data.train[..b].to_vec();
            let clean = setup::samples(&data, &positions, &Device::Cpu).unwrap();
            let images =
                Tensor::cat(&[(&clean + 0.1).unwrap(), (&clean - 0.1).unwrap()], 0).unwrap();
            let ids: Vec<u32> = (0..b as u32).collect();
            let labels = setup::labels(&data.dataset, &positions);
            (0..5)
                .map(|step| {
                    let input = StepInput {
                        images: images.clone(),
                        views: 2,
                        local_images: None,
                        instance_ids: &ids,
                        labels: &labels,
                        progress: Progress {
                            step,
                            epoch: 0,
                            steps_per_epoch: 5,
                            total_steps: 5,
                            seed: 0,
                        },
                        lr: 1e-2,
                    };
                    training_step(&mut model, &mut optimizer, &input)
                        .unwrap()
                        .loss
                })
                .collect()
        };
        let (full, bf16) = (losses("f32"), losses("bf16"));
        assert!(full[4] < full[0], "training lowers the loss: {full:?}");
        let mut largest = 0.0f64;
        for (a, b) in full.iter().zip(&bf16) {
            let relative = (a - b).abs() / a.abs();
            assert!(relative < 1e-2, "f32 {full:?} vs bf16 {bf16:?}");
            largest = largest.max(relative);
        }
        assert!(
            largest > 0.0,
            "bf16 operands must change the numbers: {bf16:?}"
        );
    }

    /// A collective of two ranks that both hold this rank's rows, counting its gathers.
    struct Counted(std::sync::atomic::AtomicUsize);

    impl Collective for Counted {
        fn world_size(&self) -> usize {
            2
        }
        fn rank(&self) -> usize {
            0
        }
        fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Tensor::cat(&[t, t], dim)
        }
    }

    /// The batch-norm collective handed to a step is used by the step's train-mode batch norms
    /// (the digits CNN's and the projector's) and by nothing after it: the random-init
    /// baseline's train-mode calibration, which rank 0 runs alone, gathers nothing.
    #[test]
    fn the_batch_norm_collective_ends_with_the_step() {
        let cfg = RunConfig::default();
        let mut data = setup::data(&cfg).unwrap();
        data.train.truncate(64);
        let b = 8;
        let (clean, ids, labels, progress) = first_instances(&data, b);
        let input = StepInput {
            images: Tensor::cat(&[&clean, &(&clean * 0.9).unwrap()], 0).unwrap(),
            views: 2,
            local_images: None,
            instance_ids: &ids,
            labels: &labels,
            progress,
            lr: 0.1,
        };
        let mut model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
        let counted = Arc::new(Counted(Default::default()));
        let gathers = || counted.0.load(std::sync::atomic::Ordering::Relaxed);
        let batch_norm: Arc<dyn Collective> = counted.clone();
        let ranks = StepCollectives {
            gather: &SingleProcess,
            batch_norm: Some(&batch_norm),
        };
        forward_backward_on(&mut model, &input, ranks, &|_, _| Ok(())).unwrap();
        let in_step = gathers();
        assert!(in_step > 0, "the step's batch norms gather");
        assert!(!ssl_models::sync_bn::synchronised());
        let (train, _) = evaluate::clean_inputs(&data, &Device::Cpu);
        setup::calibrated_random_encoder(&cfg, &data.dataset, &train.x, &Device::Cpu).unwrap();
        model.embed(&train.x).unwrap();
        assert_eq!(gathers(), in_step, "work after the step gathers nothing");
    }

    /// The eval encoder records no graph (so each activation is freed once read) and computes
    /// what the training encoder computes in eval mode, with the weights and batch-norm
    /// statistics as training leaves them: the digits CNN (batch norm) and a ViT.
    #[test]
    fn the_eval_encoder_records_no_graph_and_follows_the_training_encoder() {
        for encoder in [&[][..], &["model.encoder=vit_t16", "model.patch_size=4"]] {
            let mut root = serde_yaml::Value::Mapping(Default::default());
            for s in encoder {
                crate::config::apply_set(&mut root, s).unwrap();
            }
            let cfg = RunConfig::from_yaml_value(root).unwrap();
            let data = setup::data(&cfg).unwrap();
            let (x, ..) = first_instances(&data, 8);
            let model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
            // As an optimiser step and a train-mode pass leave them: every weight moved in place,
            // the running statistics updated.
            for (_, var) in model.store.vars_with_prefix("encoder.") {
                var.set(&((var.as_tensor() * 1.1).unwrap() + 0.01).unwrap())
                    .unwrap();
            }
            model.encoder.forward_t(&(&x * 0.5).unwrap(), true).unwrap();
            let trained = model.encoder.forward_t(&x, false).unwrap();
            let eval = model.eval_encoder.forward_t(&x, false).unwrap();
            assert!(trained.track_op() && !eval.track_op(), "{encoder:?}");
            let diff = (trained - &eval).unwrap().abs().unwrap().max_all().unwrap();
            assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{encoder:?}");
            assert_eq!(
                model.features(&x).unwrap().to_vec2::<f32>().unwrap(),
                eval.to_vec2::<f32>().unwrap()
            );
        }
    }

    /// With `eval.encoder: teacher` the eval encoder (the monitor's and the table's features)
    /// is the EMA teacher's, weights and batch-norm statistics, not the student's.
    #[test]
    fn the_eval_encoder_reads_the_teacher_when_told() {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        for s in [
            "objective.name=byol",
            "eval.encoder=teacher",
            "train.probe_lr=0",
        ] {
            crate::config::apply_set(&mut root, s).unwrap();
        }
        let cfg = RunConfig::from_yaml_value(root).unwrap();
        let data = setup::data(&cfg).unwrap();
        let (x, ..) = first_instances(&data, 8);
        let model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
        let (teacher, _) = model.teacher.as_ref().unwrap();
        for (_, var) in model.store.vars_with_prefix("teacher.encoder.") {
            var.set(&((var.as_tensor() * 0.9).unwrap() - 0.01).unwrap())
                .unwrap();
        }
        teacher.forward_t(&(&x * 0.5).unwrap(), true).unwrap();
        let expected = teacher
            .forward_t(&x, false)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(
            model.features(&x).unwrap().to_vec2::<f32>().unwrap(),
            expected
        );
        let student = model.encoder.forward_t(&x, false).unwrap();
        assert_ne!(student.to_vec2::<f32>().unwrap(), expected);
    }

    /// `forward_backward` takes each view's graph back on its own from the loss's gradients at
    /// the views' outputs; the gradients must be those of one backward through the whole graph
    /// (three views, so that the views outnumber two threads, and an online probe).
    #[test]
    fn backward_view_by_view_equals_one_backward_through_the_whole_graph() {
        let cfg = gmm_config(&["train.probe_lr=0.1"]);
        let data = setup::data(&cfg).unwrap();
        let (b, v) = (8, 3);
        let (clean, ids, labels, progress) = first_instances(&data, b);
        let views: Vec<Tensor> = (0..v)
            .map(|i| (&clean * (1.0 - 0.1 * i as f64)).unwrap())
            .collect();
        let input = StepInput {
            images: Tensor::cat(&views, 0).unwrap(),
            views: v,
            local_images: None,
            instance_ids: &ids,
            labels: &labels,
            progress,
            lr: 0.1,
        };
        let (mut model, _) = gmm_model(&cfg, &data);
        assert!(model.probe.is_some());
        let (_, grads) = forward_backward(&mut model, &input).unwrap();

        let (f, p) = forward_views(
            model.encoder.as_ref(),
            model.projector.as_ref(),
            &views,
            true,
        )
        .unwrap();
        let features = Tensor::cat(&f, 0).unwrap();
        let projections = Tensor::cat(&p, 0).unwrap();
        let batch = Batch {
            projections: &projections.reshape((v, b, ())).unwrap(),
            features: &features.reshape((v, b, ())).unwrap(),
            global_views: v,
            indices: &Ids::new(&ids, &Device::Cpu).unwrap(),
            labels: Some(&Ids::new(&labels, &Device::Cpu).unwrap()),
            teacher: None,
            progress,
            train: true,
            collective: &SingleProcess,
        };
        let loss = model.objective.loss(&batch).unwrap().loss;
        let probe = model.probe.as_ref().unwrap();
        let ce = probe.loss(&features, &labels, v, &SingleProcess).unwrap();
        let whole = (loss + ce).unwrap().backward().unwrap();

        let mut compared = 0;
        for (name, var) in model.store.vars() {
            let (ours, reference) = (grads.get(var.as_tensor()), whole.get(var.as_tensor()));
            assert_eq!(ours.is_some(), reference.is_some(), "{name}");
            let (Some(ours), Some(reference)) = (ours, reference) else {
                continue;
            };
            let max = |t: &Tensor| -> f32 {
                t.abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            let scale = max(reference);
            assert!(scale > 0.0, "{name} has a zero gradient");
            let diff = max(&(ours - reference).unwrap());
            assert!(
                diff <= 1e-5 * scale,
                "{name}: {diff} against a largest {scale}"
            );
            compared += 1;
        }
        assert!(compared >= 4, "only {compared} gradients compared");
    }

    #[test]
    fn accumulating_two_half_batches_equals_one_full_batch_step() {
        // Plain SGD: the update is proportional to the gradient (Adam's first step is about its
        // sign), so a wrongly summed or scaled gradient shows.
        let cfg = gmm_config(&[
            "train.optimizer=sgd",
            "train.momentum=0",
            "train.weight_decay=0",
        ]);
        let data = setup::data(&cfg).unwrap();
        let (b, v) = (8, 2);
        let (clean, ids, labels, progress) = first_instances(&data, b);
        let views: Vec<Tensor> = (0..v)
            .map(|i| (&clean + (i as f64 + 1.0) * 0.1).unwrap())
            .collect();
        let input = |range: std::ops::Range<usize>| StepInput {
            images: Tensor::cat(
                &views
                    .iter()
                    .map(|x| x.narrow(0, range.start, range.len()).unwrap())
                    .collect::<Vec<_>>(),
                0,
            )
            .unwrap(),
            views: v,
            local_images: None,
            instance_ids: &ids[range.clone()],
            labels: &labels[range.clone()],
            progress,
            lr: 0.1,
        };
        let (mut full, mut full_opt) = gmm_model(&cfg, &data);
        training_step(&mut full, &mut full_opt, &input(0..b)).unwrap();

        let (mut halves, mut halves_opt) = gmm_model(&cfg, &data);
        let (_, first) = forward_backward(&mut halves, &input(0..b / 2)).unwrap();
        let (_, second) = forward_backward(&mut halves, &input(b / 2..b)).unwrap();
        let mut sum = add_grads(&halves.store, first, &second).unwrap();
        scale_grads(&halves.store, &mut sum, 0.5).unwrap();
        halves_opt.step(&sum, 0.1, &progress).unwrap();

        let before = gmm_model(&cfg, &data).0.store.tensors();
        let (after_full, after_halves) = (full.store.tensors(), halves.store.tensors());
        let mut moved = 0.0f64;
        for (name, t) in &after_full {
            let diff = |a: &Tensor, b: &Tensor| -> f64 {
                (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap() as f64
            };
            assert!(diff(t, &after_halves[name]) < 1e-7, "{name}");
            moved = moved.max(diff(t, &before[name]));
        }
        assert!(
            moved > 1e-4,
            "the step must move the weights, moved {moved}"
        );
    }

    /// Reading the logged values once per interval logs every step with the values a read
    /// after each step gives, and a diverging run names the same first non-finite step.
    #[test]
    fn values_read_per_interval_are_those_of_every_step() {
        let dir = tempfile::tempdir().unwrap();
        let config = |every: usize, sets: &[&str]| {
            let every = format!("train.log_every={every}");
            let sets = [&["train.epochs=2", "train.batch_size=64", &every][..], sets].concat();
            let mut cfg = gmm_config(&sets);
            cfg.out = dir.path().join(format!("every-{every}-{}", sets.len()));
            cfg
        };
        let logged = |every: usize| {
            let cfg = config(every, &[]);
            run(&cfg, Start::Fresh).unwrap();
            let text = std::fs::read_to_string(cfg.out.join(crate::runlog::METRICS)).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .filter(|r| r.get("loss").is_some())
                .map(|mut r| {
                    let record = r.as_object_mut().unwrap();
                    record.remove("images_per_s");
                    record.remove("data_wait_ms");
                    r
                })
                .collect::<Vec<_>>()
        };
        let each = logged(1);
        let data = setup::data(&config(1, &[])).unwrap();
        // Whole batches (train.drop_last); an interval that does not divide the epoch, whose
        // end reads the remainder.
        let per_epoch = data.train.len() / 64;
        assert_ne!(per_epoch % 4, 0);
        assert_eq!(each.len(), 2 * per_epoch);
        assert_eq!(logged(4), each);
        let diverged = |every: usize| {
            let cfg = config(every, &["train.optimizer=sgd", "train.lr=1e30"]);
            match run(&cfg, Start::Fresh) {
                Ok(_) => panic!("a run at lr 1e30 must diverge"),
                Err(e) => format!("{e:#}"),
            }
        };
        let first = diverged(1);
        assert!(first.contains("non-finite"), "{first}");
        assert!(first.contains("lower train.lr"), "{first}");
        let named = |e: &str| e[e.find("non-finite").unwrap()..].to_string();
        assert_eq!(named(&diverged(5)), named(&first));
    }

    /// A non-finite loss suggests the learning rate only once an update has been applied.
    #[test]
    fn a_non_finite_loss_blames_the_learning_rate_only_after_an_update() {
        let values = StepValues {
            loss: f64::NAN,
            terms: vec![("invariance".into(), f64::NAN), ("variance".into(), 1.0)],
            probe_ce: None,
        };
        let at = |step| values.check_finite(step, 1e-3).unwrap_err().to_string();
        let (first, later) = (at(0), at(3));
        for e in [&first, &later] {
            assert!(
                e.contains("loss term `invariance` became non-finite (NaN)"),
                "{e}"
            );
        }
        assert!(
            first.contains("not the cause") && !first.contains("lower train.lr"),
            "{first}"
        );
        assert!(
            later.contains("at step 3") && later.contains("lower train.lr"),
            "{later}"
        );
        let finite = StepValues {
            loss: 0.5,
            terms: vec![("variance".into(), 0.5)],
            probe_ce: None,
        };
        assert!(finite.check_finite(0, 1e-3).is_ok());
    }

    /// The final evaluation reuses the last epoch's monitor features: its rows equal those
    /// computed afresh from the checkpointed weights.
    #[test]
    fn the_final_evaluation_equals_one_from_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = gmm_config(&[
            "train.epochs=3",
            "train.batch_size=64",
            "eval.monitor_every=1",
        ]);
        cfg.out = dir.path().join("run");
        let outcome = run(&cfg, Start::Fresh).unwrap();
        let data = setup::data(&cfg).unwrap();
        let mut model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
        let mut optimizer = model::optimizer(&cfg, &model).unwrap();
        restore(&cfg.out, &mut model, &mut optimizer).unwrap();
        let fresh = evaluate::with_baselines(&cfg, &data, &model, &Device::Cpu, None).unwrap();
        assert_eq!(outcome.evaluation.len(), 3);
        assert_eq!(format!("{:?}", outcome.evaluation), format!("{fresh:?}"));
    }

    /// A run stopped inside a parameter group's freeze and resumed ends with the weights of an
    /// uninterrupted run; the frozen group did not move during its freeze and did after it.
    #[test]
    fn a_run_resumed_inside_a_freeze_equals_an_uninterrupted_one() {
        let dir = tempfile::tempdir().unwrap();
        let config = |out: &std::path::Path, stop: usize| {
            let mut cfg = gmm_config(&[
                "train.epochs=3",
                "train.warmup_epochs=1",
                "train.batch_size=64",
                "train.checkpoint_every=1",
                &format!("train.stop_after_epochs={stop}"),
                "train.param_groups=[{params: encoder., freeze_epochs: 2}, \
                 {params: objective., schedule: constant, clip_grad_norm: 1.0}]",
            ]);
            cfg.out = out.to_path_buf();
            cfg
        };
        let weights = |out: &std::path::Path| {
            checkpoint::load_tensors(&out.join("checkpoint/model.safetensors")).unwrap()
        };
        let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
        run(&config(&whole, 0), Start::Fresh).unwrap();
        run(&config(&split, 1), Start::Fresh).unwrap();
        let stopped = weights(&split);
        let cfg = config(&split, 0);
        let data = setup::data(&cfg).unwrap();
        let initial = model::build_model(&cfg, &data, &Device::Cpu)
            .unwrap()
            .store
            .tensors();
        let encoder: Vec<&String> = initial
            .keys()
            .filter(|k| k.starts_with("encoder."))
            .collect();
        assert!(!encoder.is_empty());
        for name in &encoder {
            let same = (&stopped[*name] - &initial[*name]).unwrap().abs().unwrap();
            let max = same
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(max, 0.0, "{name} moved during its freeze");
        }
        run(&cfg, Start::Resume).unwrap();
        let (a, b) = (weights(&whole), weights(&split));
        assert_eq!(a.len(), b.len());
        let mut moved = false;
        for (name, t) in &a {
            let diff = (t - &b[name])
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap();
            let diff = diff.max(0).unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(diff, 0.0, "{name} differs from the uninterrupted run");
            if name.starts_with("encoder.") {
                let d = (t - &initial[name])
                    .unwrap()
                    .abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap();
                moved |= d.max(0).unwrap().to_scalar::<f32>().unwrap() > 0.0;
            }
        }
        assert!(moved, "the encoder must train after its freeze");
    }

    /// CARP's teacher follows the reference's order: each step's EMA update uses the student
    /// weights that produced that step's loss, before the optimiser moves them. After one step
    /// the teacher is still its initial copy of the student (`m·θ_t⁰ + (1 − m)·θ_s⁰ = θ_s⁰`);
    /// after the second it is `m₁·θ_t¹ + (1 − m₁)·θ_s¹`, `θ_s¹` the student after the first
    /// step (the order after the optimiser step would give `θ_s²` there).
    #[test]
    fn carp_updates_its_teacher_before_the_optimiser_step() {
        let dir = tempfile::tempdir().unwrap();
        let config = |stop: usize| {
            let mut cfg = gmm_config(&[
                "objective.name=carp",
                "objective.params={num_prototypes: 64, block_size: 16, bottleneck: 8, head_hidden: 16}",
                "data.train_size=64",
                "train.batch_size=64",
                "train.epochs=2",
                "train.warmup_epochs=0",
                "train.lr=0.05",
                "train.checkpoint_every=1",
                &format!("train.stop_after_epochs={stop}"),
            ]);
            cfg.out = dir.path().to_path_buf();
            cfg
        };
        let weights =
            || checkpoint::load_tensors(&dir.path().join("checkpoint/model.safetensors")).unwrap();
        let first = config(1);
        let data = setup::data(&first).unwrap();
        let initial = model::build_model(&first, &data, &Device::Cpu)
            .unwrap()
            .store
            .tensors();
        // (teacher name, student name) of every EMA-updated parameter.
        let pairs: Vec<(String, String)> = initial
            .keys()
            .filter(|k| !ssl_core::ParamStore::is_buffer(k))
            .filter_map(|k| {
                let student = match k.strip_prefix("teacher.") {
                    Some(rest) => rest.to_string(),
                    None => k.replacen("objective.teacher_head.", "objective.head.", 1),
                };
                (student != *k).then(|| (k.clone(), student))
            })
            .collect();
        assert!(pairs.iter().any(|(t, _)| t.starts_with("teacher.encoder.")));
        assert!(pairs
            .iter()
            .any(|(t, _)| t.starts_with("objective.teacher_head.")));
        let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
            let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
            d.max(0).unwrap().to_scalar::<f32>().unwrap()
        };

        run(&first, Start::Fresh).unwrap();
        let after_one = weights();
        let mut student_moved = 0f32;
        for (t, s) in &pairs {
            // Equal up to the rounding of m·x + (1 − m)·x in f32.
            assert!(
                max_diff(&after_one[t], &initial[t]) < 1e-6,
                "{t} moved at step 0"
            );
            student_moved = student_moved.max(max_diff(&after_one[s], &initial[s]));
        }
        assert!(student_moved > 0.0, "the student must train");

        run(&config(0), Start::Resume).unwrap();
        let after_two = weights();
        let progress = Progress {
            step: 1,
            epoch: 1,
            steps_per_epoch: 1,
            total_steps: 2,
            seed: 0,
        };
        let m = progress.cosine_ramp(0.99, 1.0);
        let ema = |t: &Tensor, s: &Tensor| ((t * m).unwrap() + (s * (1.0 - m)).unwrap()).unwrap();
        let mut apart = 0f32;
        for (t, s) in &pairs {
            let want = ema(&after_one[t], &after_one[s]);
            let late = ema(&after_one[t], &after_two[s]);
            assert!(
                max_diff(&after_two[t], &want) < 1e-6,
                "{t}: not m·θ_t¹ + (1 − m)·θ_s¹"
            );
            apart = apart.max(max_diff(&want, &late));
        }
        assert!(
            apart > 1e-5,
            "the two orders must differ for the check to mean anything"
        );
    }
}
