//! Candle encoders and heads for candle-ssl, with fast CPU convolution and batch norm.
//!
//! - [`conv`]: 2D/3D im2col + GEMM convolution on channel-major activations.
//! - [`pool`]: 2D/3D max pooling with padding.
//! - [`batch_norm`]: fused train-mode batch norm (+ReLU) custom op.
//! - [`layer_norm`]: fused layer norm with its backward (Candle's fused one has none).
//! - [`softmax`]: fused last-axis softmax with its backward.
//! - [`gelu`]: the erf GELU with a one-pass backward.
//! - [`DigitsCnn`], [`Mlp`], [`ResNet`] (2D/3D), [`VisionTransformer`]: encoders implementing
//!   [`Encoder`].
//! - [`Projector`]: Linear–BN–ReLU projection head.

pub mod batch_norm;
pub mod conv;
pub mod digits_cnn;
pub mod gelu;
pub mod layer_norm;
pub mod mlp;
pub mod pool;
pub mod projector;
pub mod resnet;
pub mod softmax;
mod util;
pub mod vit;

pub use batch_norm::BatchNorm;
pub use conv::Conv;
pub use digits_cnn::DigitsCnn;
pub use mlp::Mlp;
pub use projector::Projector;
pub use resnet::{ResNet, ResNetConfig, Stem};
pub use vit::{VisionTransformer, VitConfig};

use candle_core::{Result, Tensor};
use candle_nn::{Init, Linear, VarBuilder};

/// An encoder mapping a batch of inputs to `[N, output_dim]` features.
pub trait Encoder: Send + Sync {
    /// Forward pass; `train` selects batch statistics in batch norms.
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor>;
    /// Feature dimension.
    fn output_dim(&self) -> usize;
}

/// A linear layer with PyTorch's default initialisation: weight and bias Uniform ±1/√in_dim.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder) -> Result<Linear> {
    let bound = 1.0 / (in_dim as f64).sqrt();
    let init = Init::Uniform {
        lo: -bound,
        up: bound,
    };
    let w = vb.get_with_hints((out_dim, in_dim), "weight", init)?;
    let b = vb.get_with_hints(out_dim, "bias", init)?;
    Ok(Linear::new(w, Some(b)))
}
