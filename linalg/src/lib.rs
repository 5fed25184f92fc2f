//! Differentiable spectral operations the objectives need and Candle lacks (spec §3
//! "Spectral operations needed"): log-determinant, functions of a symmetric matrix's eigenvalues,
//! the nuclear norm, and Cholesky whitening.

pub mod cholesky;
pub mod logdet;
pub mod spectral;
