//! Encoders of your own, named in a run's configuration like the built-in ones.
//!
//! A crate registers an encoder with [`register_encoder!`](crate::register_encoder); any
//! program that links the crate can then name it in `model.encoder` (YAML, `--encoder`, or
//! the `RunConfig` builder). The registration builds the encoder for a data set's sample shape
//! under a `VarBuilder`, so its weights are saved, resumed and exported with the run's. Any
//! Candle [`Module`] becomes an encoder with [`ModuleEncoder`], given its output width.
//!
//! ```
//! use candle_nn::VarBuilder;
//! use ssl_models::{Encoder, EncoderSpec, ModuleEncoder};
//!
//! /// For vector samples `[F]`: one linear layer to 16 features.
//! fn one_layer(spec: &EncoderSpec, vb: VarBuilder) -> anyhow::Result<Box<dyn Encoder>> {
//!     let layer = candle_nn::linear(spec.input_shape[0], 16, vb.pp("fc"))?;
//!     Ok(Box::new(ModuleEncoder::new(layer, 16)))
//! }
//!
//! ssl_models::register_encoder! {
//!     name: "one_layer",
//!     summary: "one linear layer on vector samples",
//!     build: one_layer,
//! }
//!
//! # fn main() -> anyhow::Result<()> {
//! use candle_core::{DType, Device, Tensor};
//! let registration = ssl_models::find_encoder("one_layer").expect("registered above");
//! let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
//! let encoder = (registration.build)(&EncoderSpec { input_shape: &[64] }, vb)?;
//! let x = Tensor::zeros((4, 64), DType::F32, &Device::Cpu)?;
//! assert_eq!(encoder.forward_t(&x, true)?.dims(), &[4, 16]);
//! # Ok(())
//! # }
//! ```

use candle_core::{Result, Tensor};
use candle_nn::{Module, VarBuilder};

use crate::Encoder;

/// What a registered encoder is built for.
#[derive(Debug, Clone, Copy)]
pub struct EncoderSpec<'a> {
    /// One sample's shape: `[C, H, W]` images, `[C, D, H, W]` volumes, `[F]` vectors.
    pub input_shape: &'a [usize],
}

/// An encoder that `model.encoder` can name, collected from every linked crate.
pub struct EncoderRegistration {
    /// The name configurations use; must not be a built-in encoder's.
    pub name: &'static str,
    /// One line for `ssl list`.
    pub summary: &'static str,
    /// Builds the encoder with its weights under `vb` (keys `encoder.…` in the run's files).
    pub build: fn(&EncoderSpec, VarBuilder) -> anyhow::Result<Box<dyn Encoder>>,
}

inventory::collect!(EncoderRegistration);

/// Registers an encoder under a name (see the module docs for an example):
/// `register_encoder! { name: "…", summary: "…", build: a_fn }`.
#[macro_export]
macro_rules! register_encoder {
    (name: $name:expr, summary: $summary:expr, build: $build:expr $(,)?) => {
        $crate::inventory::submit! {
            $crate::EncoderRegistration {
                name: $name,
                summary: $summary,
                build: $build,
            }
        }
    };
}

/// The registered encoder called `name`, if a linked crate registered one.
pub fn find_encoder(name: &str) -> Option<&'static EncoderRegistration> {
    inventory::iter::<EncoderRegistration>().find(|r| r.name == name)
}

/// Every registered encoder, sorted by name.
pub fn registered_encoders() -> Vec<&'static EncoderRegistration> {
    let mut all: Vec<_> = inventory::iter::<EncoderRegistration>().collect();
    all.sort_by_key(|r| r.name);
    all
}

/// Any Candle module as an encoder: `module` maps a batch `[N, …]` to `[N, output_dim]`, the
/// same in training and evaluation (a module with batch norm or dropout implements
/// [`Encoder`] itself, to see the `train` flag).
pub struct ModuleEncoder<M> {
    module: M,
    output_dim: usize,
}

impl<M: Module + Send + Sync> ModuleEncoder<M> {
    /// `module` with its declared output width.
    pub fn new(module: M, output_dim: usize) -> Self {
        Self { module, output_dim }
    }
}

impl<M: Module + Send + Sync> Encoder for ModuleEncoder<M> {
    fn forward_t(&self, x: &Tensor, _train: bool) -> Result<Tensor> {
        self.module.forward(x)
    }

    fn output_dim(&self) -> usize {
        self.output_dim
    }
}
