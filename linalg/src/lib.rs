//! Differentiable tensor operations the objectives share and Candle lacks: spec
//! `docs/spec/objectives.md` §0's L2 normalisation, batch-axis column standardisation, the Gram
//! matrix with a symmetric backward, and spec §3's spectral operations — log-determinant, functions
//! of a symmetric matrix's eigenvalues, the nuclear norm, and Cholesky whitening.

pub mod cholesky;
pub mod columns;
pub mod gram;
pub mod logdet;
pub mod norm;
pub mod parallel;
pub mod spectral;

pub use columns::{centre_and_scale_columns, mean_of_views, ColumnScale};
pub use gram::{gram, gram_of_columns};
pub use norm::{l2_norm_keepdim, l2_normalize, logsumexp_rows, normalize_columns, normalize_rows};
pub use parallel::{
    extend_by_chunks, for_each_chunk_mut, for_each_index, gram_blocks, map_chunks_mut, matmul,
    matmul_detached, matmul_rows, matmul_strided, matmul_strided_uninit,
};
