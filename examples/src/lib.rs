//! candle-ssl's examples of the library: see the `examples` listed in this package's
//! `Cargo.toml` and the README's "As a library" section. `tests/examples.rs` runs each one.
//! The package's library is empty: it exists so that those examples and tests have a home.
//!
//! # Example
//!
//! The smallest of them, `loss_in_own_loop` in short: VICReg's loss (`ssl-vicreg`) training a
//! linear encoder in a plain Candle loop, no trainer involved.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{Module, Optimizer, VarBuilder, VarMap};
//! use ssl_vicreg::{vicreg_loss, VicregConfig};
//!
//! let device = Device::Cpu;
//! let varmap = VarMap::new();
//! let encoder = candle_nn::linear(8, 4, VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
//! let mut optimizer = candle_nn::AdamW::new_lr(varmap.all_vars(), 1e-2)?;
//! // Two views of 64 points: the points, and the points slightly scaled and shifted.
//! let points = (Tensor::arange(0f32, 512., &device)?.reshape((64, 8))? * 0.37)?.sin()?;
//! let other = ((&points * 0.9)? + 0.05)?;
//! let loss_now = || -> candle_core::Result<Tensor> {
//!     let z = Tensor::stack(&[encoder.forward(&points)?, encoder.forward(&other)?], 0)?;
//!     vicreg_loss(&z, &VicregConfig::default()) // z: [V = 2, B = 64, D = 4]
//! };
//! let first = loss_now()?.to_scalar::<f32>()?;
//! for _ in 0..30 {
//!     optimizer.backward_step(&loss_now()?)?;
//! }
//! let last = loss_now()?.to_scalar::<f32>()?;
//! assert!(last < first, "{first} → {last}");
//! # Ok::<(), candle_core::Error>(())
//! ```
