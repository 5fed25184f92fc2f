//! Resuming a run: the world-size check and the last checkpoint restored.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use candle_core::Device;
use ssl_dist::Comm;

use crate::checkpoint::{self, TrainerState};
use crate::config::RunConfig;
use crate::model::{self, Model};
use crate::rundir::Start;
use crate::setup::DataSplit;
use ssl_optim::Optimizer;

use super::DistributedRecord;

/// The model and optimiser of `cfg` on `data`: fresh (with `model.init`'s weights, if given),
/// or restored from the run directory to resume.
pub(super) fn build_or_restore(
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

/// Refuses to resume the run in `dir` on `world` ranks when it was trained on another number
/// (its [`DistributedRecord`]; a run without one was trained by one process): the global batch,
/// and with it every step after the checkpoint, would change.
pub(super) fn check_world_size(dir: &Path, world: usize, batch_size: usize) -> Result<()> {
    let trained = DistributedRecord::read(dir)?.map_or(1, |r| r.world_size);
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
pub(super) fn restore(
    dir: &Path,
    model: &mut Model,
    optimizer: &mut Optimizer,
) -> Result<TrainerState> {
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
