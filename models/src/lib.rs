//! Candle encoders and heads for candle-ssl, with fast CPU convolution and batch norm.
//!
//! - [`autocast`]: bf16 operands for every matrix product, as `torch.autocast`.
//! - [`dispatch`]: fused CPU kernels or composed Candle ops (the GPU's path), per device.
//! - [`mod@linear`]: `x Wᵀ + b` over the last axis of any rank.
//! - [`conv`]: 2D/3D im2col + GEMM convolution on channel-major activations.
//! - [`pool`]: 2D/3D max pooling with padding.
//! - [`batch_norm`]: fused train-mode batch norm (+ReLU) custom op; [`sync_bn`]: its statistics
//!   over a data-parallel job's global batch.
//! - [`layer_norm`]: fused layer norm with its backward (Candle's fused one has none).
//! - [`softmax`]: fused last-axis softmax with its backward.
//! - [`gelu`]: the erf GELU with a one-pass backward.
//! - [`residual`]: a residual block's `relu(h + shortcut)` with a one-pass backward.
//! - [`DigitsCnn`], [`Mlp`], [`ResNet`] (2D/3D), [`VisionTransformer`]: encoders implementing
//!   [`Encoder`].
//! - [`Projector`]: Linear–BN–ReLU projection head.
//!
//! # Example
//!
//! An MLP encoder and a projector, their weights created (seeded) in an `ssl_core::ParamStore`
//! under PyTorch state-dict keys:
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_core::ParamStore;
//! use ssl_models::{Encoder, Mlp, Projector};
//!
//! let store = ParamStore::new(0);
//! let vb = store.var_builder(&Device::Cpu);
//! let encoder = Mlp::new(64, &[32, 16], vb.pp("encoder"))?; // 64 → 32 → 16
//! let projector = Projector::new(16, &[32, 8], vb.pp("projector"))?; // Linear–BN–ReLU–Linear
//! let x = (Tensor::arange(0f32, 256., &Device::Cpu)?.reshape((4, 64))? / 256.)?; // [N, 64]
//! let h = encoder.forward_t(&x, true)?;
//! assert_eq!(h.dims(), [4, encoder.output_dim()]);
//! assert_eq!(projector.forward_t(&h, true)?.dims(), [4, 8]);
//! let keys: Vec<String> = store.vars().into_iter().map(|(key, _)| key).collect();
//! assert!(keys.contains(&"encoder.layers.1.weight".to_string()));
//! assert!(keys.contains(&"projector.1.running_mean".to_string()));
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod attention;
pub mod autocast;
pub mod batch_norm;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod digits_cnn;
pub mod dispatch;
pub mod gelu;
pub mod layer_norm;
pub mod linear;
pub mod mlp;
pub mod pool;
pub mod projector;
pub mod registry;
pub mod residual;
pub mod resnet;
pub mod softmax;
pub mod sync_bn;
mod util;
pub mod vit;

pub use batch_norm::BatchNorm;
pub use conv::Conv;
pub use digits_cnn::DigitsCnn;
pub use inventory;
pub use linear::{linear, Linear};
pub use mlp::Mlp;
pub use projector::Projector;
pub use registry::{
    find_encoder, registered_encoders, EncoderRegistration, EncoderSpec, ModuleEncoder,
};
pub use resnet::{ResNet, ResNetConfig, Stem};
pub use vit::{PosEmbed, VisionTransformer, VitConfig, VitPool};

use candle_core::{Result, Tensor};

/// An encoder mapping a batch of inputs to `[N, output_dim]` features.
pub trait Encoder: Send + Sync {
    /// Forward pass; `train` selects batch statistics in batch norms.
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor>;
    /// Feature dimension.
    fn output_dim(&self) -> usize;
    /// The same encoder as a patch-token encoder, for objectives that encode the views
    /// themselves ([`ssl_core::Requirements::pixels`]); `None` for encoders without patches.
    fn tokens(&self) -> Option<&dyn ssl_core::TokenEncoder> {
        None
    }
}
