//! A plain multi-layer perceptron: Linear–ReLU blocks, with no ReLU after the last layer.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::{linear, Encoder, Linear};

/// MLP with keys `layers.{i}.weight` / `layers.{i}.bias`.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
    out_dim: usize,
}

impl Mlp {
    /// Layers `in_dim → dims[0] → … → dims[last]`; ReLU between layers.
    pub fn new(in_dim: usize, dims: &[usize], vb: VarBuilder) -> Result<Self> {
        if dims.is_empty() {
            candle_core::bail!("Mlp needs at least one layer");
        }
        let vb = vb.pp("layers");
        let mut layers = Vec::new();
        let mut d = in_dim;
        for (i, &o) in dims.iter().enumerate() {
            layers.push(linear(d, o, vb.pp(i.to_string()))?);
            d = o;
        }
        Ok(Self { layers, out_dim: d })
    }

    /// `[N, in_dim]` → `[N, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i < last {
                h = h.relu()?;
            }
        }
        Ok(h)
    }

    /// Output dimension.
    pub fn output_dim(&self) -> usize {
        self.out_dim
    }
}

impl Encoder for Mlp {
    /// Flattens `[N, ...]` to `[N, D]` first.
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        self.forward(&x.flatten_from(1)?)
    }
    fn output_dim(&self) -> usize {
        self.out_dim
    }
}
