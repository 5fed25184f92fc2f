//! Differentiable tensor operations the objectives share and Candle lacks: spec
//! `docs/spec/objectives.md` §0's L2 normalisation, batch-axis column standardisation, the Gram
//! matrix with a symmetric backward, and spec §3's spectral operations — log-determinant, functions
//! of a symmetric matrix's eigenvalues, the nuclear norm, and Cholesky whitening.
//!
//! # Example
//!
//! A log-determinant, its gradient `A⁻¹` through autograd, and Cholesky whitening, whose output
//! has the identity as its covariance:
//!
//! ```
//! use candle_core::{Device, Tensor, Var};
//! use ssl_linalg::{cholesky::cholesky_whiten, logdet::logdet_spd, normalize_rows};
//!
//! let dev = &Device::Cpu;
//! let a = Var::new(&[[2f64, 1.], [1., 2.]], dev)?;
//! let logdet = logdet_spd(a.as_tensor())?;
//! assert!((logdet.to_scalar::<f64>()? - 3f64.ln()).abs() < 1e-12);
//! let gradient = logdet.backward()?.get(&a).unwrap().to_vec2::<f64>()?;
//! let inverse = [[2.0 / 3.0, -1.0 / 3.0], [-1.0 / 3.0, 2.0 / 3.0]];
//! for (row, want) in gradient.iter().zip(inverse) {
//!     for (got, want) in row.iter().zip(want) {
//!         assert!((got - want).abs() < 1e-12);
//!     }
//! }
//!
//! let x = Tensor::new(&[[1f64, 0.], [0., 2.], [3., 1.], [1., 1.], [2., 5.]], dev)?; // [n, d]
//! let y = cholesky_whiten(&x, 0.0)?;
//! let covariance = (y.t()?.matmul(&y)? / 4.0)?.to_vec2::<f64>()?; // (n − 1) = 4; y is centred
//! for (i, row) in covariance.iter().enumerate() {
//!     for (j, &c) in row.iter().enumerate() {
//!         assert!((c - if i == j { 1.0 } else { 0.0 }).abs() < 1e-9);
//!     }
//! }
//!
//! let unit = normalize_rows(&x)?.sqr()?.sum(1)?.to_vec1::<f64>()?;
//! assert!(unit.iter().all(|n| (n - 1.0).abs() < 1e-12));
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod bf16_gemm;
pub mod cholesky;
pub mod columns;
pub mod fast_math;
pub mod fused_terms;
pub mod gram;
pub mod logdet;
pub mod norm;
pub mod parallel;
pub mod simd;
pub mod spectral;
pub mod transpose;

pub use bf16_gemm::Precision;
pub use columns::{centre_and_scale_columns, mean_of_views, ColumnScale};
pub use fast_math::exp_f32;
pub use fused_terms::{apply_terms, TermsKernel};
pub use gram::{gram, gram_of_columns, smaller_gram_blocks, smaller_gram_times};
pub use norm::{l2_norm_keepdim, l2_normalize, logsumexp_rows, normalize_columns, normalize_rows};
pub use parallel::{
    extend_by_chunks, for_each_chunk_mut, for_each_index, gram_blocks, map_chunks_mut, matmul,
    matmul_detached, matmul_in, matmul_rows, matmul_strided, matmul_strided_uninit,
};
pub use simd::vectorized;
pub use transpose::{transpose, transpose_raw};
