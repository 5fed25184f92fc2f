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
    /// This worker's place in the gather order, `0..world_size()`: the rows
    /// `rank·B..(rank + 1)·B` of a gathered batch are its own. Per-instance random draws (MAE's
    /// and I-JEPA's masks) made for the global batch and cut to these rows are one process's.
    fn rank(&self) -> usize;
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
    fn rank(&self) -> usize {
        0
    }
    fn all_gather(&self, t: &Tensor, _dim: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
}
