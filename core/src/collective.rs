//! Cross-device collectives for batch-level statistics.
//!
//! Objectives whose loss depends on the whole batch (variance, covariance, in-batch negatives)
//! call [`Collective::all_gather`] on their embeddings before computing those statistics. On one
//! device this is the identity; a data-parallel trainer supplies an implementation that gathers
//! the global batch with gradients flowing back to the local shard, and no objective changes.

use candle_core::{Result, Tensor};

/// Gathers tensors from every data-parallel worker.
pub trait Collective: Send + Sync {
    /// Number of workers taking part.
    fn world_size(&self) -> usize;
    /// Concatenates every worker's `t` along `dim` (in rank order). The result must be
    /// differentiable with respect to the local `t`.
    fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor>;
}

/// The single-process case: gathering returns the input.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn world_size(&self) -> usize {
        1
    }
    fn all_gather(&self, t: &Tensor, _dim: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
}
