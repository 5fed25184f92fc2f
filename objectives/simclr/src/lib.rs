//! SimCLR's NT-Xent and decoupled contrastive learning (DCL), with the duality paper's
//! similarity functions and preprocessings.
//!
//! * Chen, Kornblith, Norouzi & Hinton, "A Simple Framework for Contrastive Learning of Visual
//!   Representations", ICML 2020, eq. 1 — spec `docs/spec/objectives.md` §2.6.
//! * Yeh, Hong, Hsu, Liu, Chen & LeCun, "Decoupled Contrastive Learning", ECCV 2022, eqs. 6, 8 —
//!   spec §2.7.
//! * Garrido, Chen, Bardes, Najman & LeCun, "On the duality between contrastive and
//!   non-contrastive self-supervised learning", ICLR 2023: `f ∈ {identity, |·|, (·)²}` applied to
//!   every similarity (SimCLR-abs/-sq, DCL-abs/-sq), centring (scenario A), dimension
//!   standardisation (scenario B, eq. 14) and the one-direction "paper forms" (eqs. 15–17, 27,
//!   30–31), which are exposed as [`nt_xent_paper`] and [`dcl_paper`] for analysis and tests.
//!
//! Training uses the practical multi-view forms (spec §4): the `V·B` embeddings are stacked and
//! every other view of an anchor's instance is a positive ([`nt_xent_with`], [`dcl`]). DCL for
//! `V > 2` averages the positive term over the `V−1` positives (at `V = 2`: the reference
//! library's two-direction form, spec §2.7); DCL-W weights a positive pair of views `(u, v)` with
//! a softmax over the instances of their cosine, computed from the cosine even when `f ≠ identity`
//! (the weighting is not defined for `f` in the sources). All objectives need B ≥ 2.
//!
//! # Example
//!
//! Spec §2.6's known answers: NT-Xent of two views of three instances at `τ = 0.5`, with the
//! cosine similarity and with its absolute value.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_simclr::{nt_xent, nt_xent_with, Preprocess, Similarity};
//!
//! let dev = &Device::Cpu;
//! let x1 = Tensor::new(&[[1f64, 0.], [0., 1.], [-1., 1.]], dev)?;
//! let x2 = Tensor::new(&[[1f64, 0.2], [0.1, 1.], [-1., 0.5]], dev)?;
//! let z = Tensor::stack(&[&x1, &x2], 0)?; // [V = 2, B = 3, d = 2]
//! let loss = nt_xent(&z, 0.5)?.to_scalar::<f64>()?;
//! assert!((loss - 0.6129270798).abs() < 1e-9);
//! let abs = nt_xent_with(&z, 0.5, Similarity::Abs, Preprocess::None)?.to_scalar::<f64>()?;
//! assert!((abs - 0.9822533591).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

mod config;
mod dcl;
mod nt_xent;
mod similarity;

pub use config::{
    presets, Dcl, DclAbsConfig, DclConfig, DclConfigOf, DclSqConfig, Preset, Simclr,
    SimclrAbsConfig, SimclrCentredConfig, SimclrConfig, SimclrConfigOf, SimclrSqConfig,
    SimclrStandardizedConfig,
};
pub use dcl::{dcl, dcl_paper, dcl_terms, dcl_w, dclw_weights, DclTerms, Weighting};
pub use nt_xent::{nt_xent, nt_xent_paper, nt_xent_with};
pub use similarity::{
    logsumexp_rows, normalize_rows, preprocess, similarity_logits, Preprocess, Similarity,
};
