//! Projection head: Linear–BatchNorm1d–ReLU blocks and a final Linear, keyed like a PyTorch
//! `nn.Sequential` (`0.weight`, `0.bias`, `1.weight`, `1.running_mean`, …, `3.weight`, …).

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::batch_norm::{batch_norm, BatchNorm};
use crate::{linear, Linear};

/// Projector for dims `[h1, …, out]`.
#[derive(Debug, Clone)]
pub struct Projector {
    hidden: Vec<(Linear, BatchNorm)>,
    last: Linear,
    out_dim: usize,
}

impl Projector {
    /// Builds `in_dim → h1 → … → out`; sequential indices 3i (Linear), 3i+1 (BN), 3i+2 (ReLU).
    pub fn new(in_dim: usize, dims: &[usize], vb: VarBuilder) -> Result<Self> {
        let Some((&out_dim, hidden_dims)) = dims.split_last() else {
            candle_core::bail!("Projector needs at least one layer");
        };
        let mut hidden = Vec::new();
        let mut d = in_dim;
        for (i, &h) in hidden_dims.iter().enumerate() {
            let l = linear(d, h, vb.pp((3 * i).to_string()))?;
            let bn = batch_norm(h, vb.pp((3 * i + 1).to_string()))?;
            hidden.push((l, bn));
            d = h;
        }
        let last = linear(d, out_dim, vb.pp((3 * hidden_dims.len()).to_string()))?;
        Ok(Self {
            hidden,
            last,
            out_dim,
        })
    }

    /// `[N, D]` → `[N, out]`; `train` selects batch statistics in the batch norms.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut h = x.clone();
        for (l, bn) in &self.hidden {
            h = bn.forward_rows(&l.forward(&h)?, true, train)?;
        }
        self.last.forward(&h)
    }

    /// Output dimension.
    pub fn output_dim(&self) -> usize {
        self.out_dim
    }
}
