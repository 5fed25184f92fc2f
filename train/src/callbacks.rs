//! Code of your own called as a run goes: after every step (once its values are read from the
//! device, `train.log_every` steps at a time) and at the end of every epoch. Callbacks run on
//! rank 0 only; an error a callback returns stops the run with that error. A run in one process
//! can also be asked to stop at the end of its epoch, with a checkpoint there that `--resume`
//! continues from ([`Callbacks::stop_handle`]; the Python package's first Ctrl-C).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;

/// One optimiser step, as the run log, TensorBoard and your callbacks all receive it.
#[derive(Debug, Clone)]
pub struct StepEvent<'a> {
    /// The step, counted from 0 over the whole run.
    pub step: usize,
    pub epoch: usize,
    /// The loss averaged over the ranks.
    pub loss: f64,
    /// The objective's named loss terms.
    pub terms: &'a [(String, f64)],
    /// The online probe's cross-entropy, if there is a probe.
    pub probe_ce: Option<f64>,
    /// The learning rate the step used.
    pub lr: f64,
    /// Throughput over the logging interval the step belongs to (`train.log_every`).
    pub images_per_s: f64,
    /// Time the step waited for its views, in milliseconds.
    pub data_wait_ms: f64,
}

/// The end of an epoch, as the run log and your callbacks receive it.
#[derive(Debug, Clone, Copy)]
pub struct EpochEvent {
    /// The epoch that ended, counted from 0.
    pub epoch: usize,
    /// Optimiser steps taken so far.
    pub steps: usize,
    /// The monitor's k-NN accuracy on the test split, where it ran this epoch
    /// (`eval.monitor_every`, and always after the last).
    pub knn_accuracy: Option<f64>,
    /// The online probe's test accuracy, where the monitor ran and there is a probe.
    pub probe_accuracy: Option<f64>,
}

type StepFn = Box<dyn FnMut(&StepEvent) -> Result<()> + Send>;
type EpochFn = Box<dyn FnMut(&EpochEvent) -> Result<()> + Send>;

/// The callbacks of a run, called in the order they were added.
#[derive(Default)]
pub struct Callbacks {
    step: Vec<StepFn>,
    epoch: Vec<EpochFn>,
    stop: Arc<AtomicBool>,
}

impl Callbacks {
    /// Adds `f`, called after every step.
    pub fn on_step(&mut self, f: impl FnMut(&StepEvent) -> Result<()> + Send + 'static) {
        self.step.push(Box::new(f));
    }

    /// Adds `f`, called at the end of every epoch.
    pub fn on_epoch(&mut self, f: impl FnMut(&EpochEvent) -> Result<()> + Send + 'static) {
        self.epoch.push(Box::new(f));
    }

    /// A flag that, once set (from any thread, e.g. a callback), ends a single-process run at
    /// the end of the epoch in progress, after writing its checkpoint; the run then returns
    /// without its evaluation, as `train.stop_after_epochs` does. Ignored with several ranks,
    /// which must all stop at one step.
    pub fn stop_handle(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    pub(crate) fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(crate) fn step(&mut self, event: &StepEvent) -> Result<()> {
        self.step.iter_mut().try_for_each(|f| f(event))
    }

    pub(crate) fn epoch(&mut self, event: &EpochEvent) -> Result<()> {
        self.epoch.iter_mut().try_for_each(|f| f(event))
    }
}
