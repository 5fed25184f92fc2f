//! The epoch loop: the loader, each optimiser step, the logging interval's read-back, and each
//! epoch's end (monitor, logs, checkpoint).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, TensorId, Var};
use ssl_core::{Collective, Progress, StepContext};
use ssl_data::{Interpolation, LocalCrop, ViewBatch, ViewLoader, ViewTransform};
use ssl_dist::{Comm, Complete, GradientAveraging};

use crate::callbacks::{Callbacks, EpochEvent, StepEvent};
use crate::checkpoint::{self, TrainerState};
use crate::config::RunConfig;
use crate::evaluate::{self, Inputs};
use crate::model::{self, Model};
use crate::phases::{self, timed, Clock, Phase};
use crate::runlog::RunLog;
use crate::setup::DataSplit;
use crate::staging::{StagedBatch, Stager};
use ssl_core::progress;
use ssl_optim::{learning_rate, Optimizer};

use super::step::{
    add_grads, forward_backward_on, mean_output, scale_grads, step_input, Logged, StepCollectives,
};

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
pub(super) fn training_loader(
    cfg: &RunConfig,
    data: &DataSplit,
    comm: &dyn Comm,
) -> Result<Arc<ViewLoader>> {
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
pub(super) const PREFETCH: usize = 2;

/// A run in training: the model and optimiser, its logs, and where it stands.
pub(super) struct Training<'a> {
    /// The run's clock ([`crate::phases`]), installed on this thread by `fit`.
    clock: Clock,
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
    pub(super) state: TrainerState,
    /// The step of the checkpoint on disk, if there is one.
    checkpointed: Option<usize>,
    steps_per_epoch: usize,
    total_steps: usize,
    /// The student's trainable parameters, and the teacher's under the same names (the EMA
    /// hook pairs them by position).
    student: model::NamedVars,
    teacher: Option<model::NamedVars>,
    /// The last epoch's monitor features, which the final evaluation reuses.
    pub(super) final_features: Option<evaluate::Embeddings>,
    /// Steps taken whose logged values are still on the device.
    pending: Pending,
}

/// What rank 0 writes and calls as the run goes.
pub(super) struct Report<'a> {
    pub(super) log: &'a mut RunLog,
    pub(super) callbacks: &'a mut Callbacks,
}

/// The steps of the current logging interval (`train.log_every`), read from the device together.
#[derive(Default)]
pub(super) struct Pending {
    steps: Vec<PendingStep>,
    /// When the interval's first step started, and how many images (over all ranks) its steps
    /// trained on.
    since: Option<Instant>,
    images: usize,
}

pub(super) struct PendingStep {
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
    pub(super) fn new(
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
            clock: phases::current(),
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
    pub(super) fn run(
        &mut self,
        data: &DataSplit,
        device: &Device,
        loader: &Arc<ViewLoader>,
    ) -> Result<bool> {
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
            let clock = self.clock.clone();
            let stage = move |batch: ViewBatch| {
                clock.add_duration(Phase::Views, batch.made_in);
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
                    self.clock.add(Phase::DataWait, asked);
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
        timed(Phase::Optimiser, || -> Result<()> {
            self.model.objective.before_step(&hook)?;
            self.optimizer.step(&grads, lr, &progress)?;
            self.model.objective.after_step(&hook)
        })?;
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
                let event = StepEvent {
                    step: p.step,
                    epoch: p.epoch,
                    loss: values.loss,
                    terms: &values.terms,
                    probe_ce: values.probe_ce,
                    lr: p.lr,
                    images_per_s: pending.images as f64 / seconds,
                    data_wait_ms: p.data_wait_ms,
                };
                log.step(&event)?;
                if let Some(projections) = &p.spectrum {
                    log.spectrum(p.step, projections)?;
                }
                callbacks.step(&event)?;
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
        let mut event = EpochEvent {
            epoch,
            steps: self.state.step,
            knn_accuracy: None,
            probe_accuracy: None,
        };
        if last
            || self
                .state
                .epochs_done
                .is_multiple_of(cfg.eval.monitor_every)
        {
            let (train, test) = monitor_inputs;
            let (knn, probe, features) = timed(Phase::Monitor, || {
                evaluate::monitor(cfg, self.model, train, test)
            })?;
            self.final_features = last.then_some(features);
            (event.knn_accuracy, event.probe_accuracy) = (Some(knn), probe);
        }
        // The log is written before the checkpoint, which a resume cuts it back to; callbacks
        // see the epoch once its checkpoint is on disk.
        log.epoch_end(&event)?;
        let written = Instant::now();
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
        self.clock.add(Phase::Checkpoint, written);
        callbacks.epoch(&event)?;
        let step = self.state.step;
        self.comm
            .wait_for_rank_zero()
            .with_context(|| format!("at the barrier ending epoch {} (step {step})", epoch + 1))
    }
}

/// What a failed step says: where training stopped and what `out` holds to resume from.
pub(super) fn stopped_at(
    out: &Path,
    checkpointed: Option<usize>,
    step: usize,
    epoch: usize,
) -> String {
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
