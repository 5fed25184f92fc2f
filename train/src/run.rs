//! [`Trainer`]: a run from Rust code. It takes a checked [`RunConfig`] and, optionally, data
//! held in memory ([`OwnImages`]) and callbacks; [`Trainer::fit`] trains, checkpoints and
//! evaluates as `ssl run` does, and returns the evaluation table and the run directory.

use std::sync::Arc;

use anyhow::Result;
use ssl_core::SingleProcess;
use ssl_dist::Comm;

use crate::callbacks::{Callbacks, EpochEvent, StepEvent};
use crate::config::RunConfig;
use crate::own_data::OwnImages;
use crate::rundir::Start;
use crate::{evaluate, setup, trainer};

pub use crate::trainer::RunOutcome;

/// One run, configured; see the module docs.
pub struct Trainer {
    config: RunConfig,
    data: Option<OwnImages>,
    start: Start,
    callbacks: Callbacks,
    ranks: Arc<dyn Comm>,
}

impl Trainer {
    /// A run of `config` on the data set it names, into a new run directory.
    pub fn new(config: RunConfig) -> Self {
        Self {
            config,
            data: None,
            start: Start::Fresh,
            callbacks: Callbacks::default(),
            ranks: Arc::new(SingleProcess),
        }
    }

    /// Trains as one rank of a data-parallel job over `ranks` (`ssl_dist::connect`), instead
    /// of in this process alone: rank 0 writes the run directory and evaluates.
    pub fn ranks(mut self, ranks: Arc<dyn Comm>) -> Self {
        self.ranks = ranks;
        self
    }

    /// Trains and evaluates on `images` instead of `data.name`'s data set.
    pub fn with_data(mut self, images: OwnImages) -> Self {
        self.data = Some(images);
        self
    }

    /// How the run directory is opened: fresh (the default), overwriting one, or resuming the
    /// run in it.
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Calls `f` after every step (see [`crate::callbacks`]).
    pub fn on_step(mut self, f: impl FnMut(&StepEvent) -> Result<()> + Send + 'static) -> Self {
        self.callbacks.on_step(f);
        self
    }

    /// A flag that ends the run at the end of the epoch in progress, with a checkpoint there
    /// ([`Callbacks::stop_handle`]).
    pub fn stop_handle(&self) -> Arc<std::sync::atomic::AtomicBool> {
        self.callbacks.stop_handle()
    }

    /// Calls `f` at the end of every epoch.
    pub fn on_epoch(mut self, f: impl FnMut(&EpochEvent) -> Result<()> + Send + 'static) -> Self {
        self.callbacks.on_epoch(f);
        self
    }

    /// Trains, then evaluates: the table's rows (raw inputs, random init, the trained encoder)
    /// and the run directory.
    pub fn fit(mut self) -> Result<RunOutcome> {
        let data = match self.data {
            Some(images) => {
                let (dataset, unlabelled) = images.into_parts();
                setup::own_data(&self.config, dataset, unlabelled)?
            }
            None => setup::data(&self.config)?,
        };
        trainer::fit(
            &self.config,
            self.start,
            &self.ranks,
            data,
            &mut self.callbacks,
        )
    }
}

impl RunOutcome {
    /// The evaluation as the Markdown table `ssl run` prints.
    pub fn table(&self, config: &RunConfig) -> String {
        evaluate::table(&self.evaluation, config)
    }
}

/// The encoder a run trained, loaded from its last checkpoint to embed new samples.
pub struct TrainedEncoder {
    encoder: Box<dyn ssl_models::Encoder>,
    shape: Vec<usize>,
    normalize: ssl_data::Normalization,
    device: candle_core::Device,
}

impl TrainedEncoder {
    /// The encoder of the run in `run_dir` (its `config.yaml` and `checkpoint/`, or an exported
    /// `model.safetensors` beside `config.yaml`, as `ssl pull` leaves it), for samples of `shape`
    /// (the run's: e.g. `[1, 16, 16]` for the digits at the default size), on the CPU.
    pub fn load(run_dir: &std::path::Path, shape: &[usize]) -> Result<Self> {
        let config = RunConfig::load_run(run_dir)?;
        let device = candle_core::Device::Cpu;
        let store = ssl_core::ParamStore::new(config.train.seed);
        let dataset = setup::DataSplit::shape_only(shape, 0).dataset;
        let encoder = setup::eval_encoder(&config, &dataset, &store, &device)?;
        let checkpoint = run_dir.join("checkpoint").join(crate::checkpoint::MODEL);
        let exported = run_dir.join(crate::export::EXPORTED);
        let weights = match checkpoint.exists() || !exported.exists() {
            true => checkpoint,
            false => exported,
        };
        crate::export::load_encoder(&store, &crate::checkpoint::load_tensors(&weights)?)?;
        Ok(Self {
            encoder,
            shape: shape.to_vec(),
            normalize: config.data.normalization(),
            device,
        })
    }

    /// The features `[N, F]` of `samples` (each of the run's shape, values in `[0, 1]` as the
    /// data set stored them), normalised as the run's evaluation normalised its inputs, in
    /// evaluation mode.
    pub fn embed(&self, samples: &[f32]) -> Result<candle_core::Tensor> {
        let sample_len: usize = self.shape.iter().product();
        anyhow::ensure!(
            !samples.is_empty() && samples.len().is_multiple_of(sample_len),
            "samples of shape {:?} take {sample_len} values each; got {} values",
            self.shape,
            samples.len()
        );
        let mut values = samples.to_vec();
        let channels = self.shape[0];
        values
            .chunks_mut(sample_len)
            .for_each(|sample| self.normalize.apply(sample, channels));
        let mut dims = vec![samples.len() / sample_len];
        dims.extend(&self.shape);
        let x = candle_core::Tensor::from_vec(values, dims, &self.device)?;
        setup::forward_in_chunks(self.encoder.as_ref(), &x, false)
    }

    /// The width of the features.
    pub fn output_dim(&self) -> usize {
        self.encoder.output_dim()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    /// A stop asked for in the second epoch ends the run at that epoch's end, checkpointed
    /// there (every 10 epochs otherwise), without the evaluation.
    #[test]
    fn a_stop_asked_for_ends_the_epoch_with_a_checkpoint() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = RunConfig::builder()
            .epochs(4)
            .batch_size(256)
            .out(dir.path())
            .build()?;
        let trainer = Trainer::new(cfg).start(Start::Overwrite);
        let stop = trainer.stop_handle();
        let outcome = trainer
            .on_step(move |e| {
                if e.epoch == 1 {
                    stop.store(true, Ordering::SeqCst);
                }
                Ok(())
            })
            .fit()?;
        assert!(outcome.evaluation.is_empty());
        let state = crate::checkpoint::load_state(&dir.path().join("checkpoint"))?;
        assert_eq!(state.epochs_done, 2);
        Ok(())
    }
}
