//! Evaluation of frozen features (`ssl-eval`).
//!
//! Implements the metrics of `spec/metrics.md`: the offline linear probe (§1), the weighted k-NN
//! classifier (§3), RankMe (§4), the effective rank (§5) and alignment / uniformity (§7), plus
//! the per-dimension standardisation of §0. All computations are done in `f64` (except the k-NN
//! similarity matrix product, which is `f32`), inputs are row-major `f32` feature matrices
//! ([`Features`]).

pub mod features;
pub mod geometry;
pub mod knn;
pub mod linear_probe;
pub mod spectrum;

pub use features::Features;
pub use geometry::{
    alignment, alignment_alpha, class_conditional_alignment, silhouette, uniformity, uniformity_t,
    ALIGNMENT_ALPHA, UNIFORMITY_T,
};
pub use knn::{
    knn_accuracy, knn_predict, knn_scores, knn_topk_accuracy, DEFAULT_KNN_K, DEFAULT_KNN_T,
};
pub use linear_probe::{
    balanced_accuracy, fit_logistic, linear_probe, LinearProbeConfig, LogisticModel, ProbeResult,
};
pub use spectrum::{
    covariance_spectrum, effective_rank, rankme, singular_values, standardize, CovarianceSpectrum,
    RANKME_EPS,
};
