//! Evaluation of frozen features (`ssl-eval`).
//!
//! Implements the metrics of `docs/spec/metrics.md` (a bare `spec §N` in this crate means its §N):
//!
//! * the offline linear probe (§1), with optional selection of `C` on a validation split;
//! * the weighted k-NN classifier (§3), single setting or a whole `k × T` sweep;
//! * RankMe (§4) and the effective rank (§5);
//! * LiDAR, the linear-discriminant rank (§6);
//! * alignment / uniformity (§7) and the silhouette of the true classes (§13);
//! * linear CKA (§8);
//! * spherical k-means with NMI, AMI and ARI (§9, CARP protocol), spectral clustering;
//! * Ward trees of embeddings compared by LCA and cophenetic similarity (§10) and the
//!   hierarchical Rand index against a class hierarchy (§11, SAG-VICReg);
//! * covariance eigenvalue trajectories (§12);
//! * a 2-D PCA projection for embedding plots;
//! * the official MedMNIST ACC and AUC per task type (MedMNIST v2, official `evaluator.py`);
//!
//! plus the per-dimension standardisation of §0. All computations are done in `f64` (except the
//! k-NN similarity matrix product, which is `f32`), inputs are row-major `f32` feature matrices
//! ([`Features`]).
//!
//! # Example
//!
//! RankMe of three orthogonal embeddings and of a collapsed set, a k-NN classifier on two
//! clusters, and the invariance of CKA to rotation and scale:
//!
//! ```
//! use ssl_eval::{knn_accuracy, linear_cka, rankme, Features, DEFAULT_KNN_T};
//!
//! let spread = Features::from_rows(&[[2f32, 0., 0.], [0., 2., 0.], [0., 0., 2.]])?;
//! assert!((rankme(&spread, 0.0)? - 3.0).abs() < 1e-9);
//! let collapsed = Features::from_rows(&[[1f32, 1., 1.], [2., 2., 2.], [3., 3., 3.]])?;
//! assert!((rankme(&collapsed, 0.0)? - 1.0).abs() < 1e-6);
//!
//! let train = Features::from_rows(&[[1f32, 0.], [0.9, 0.2], [0., 1.], [0.1, 0.9]])?;
//! let test = Features::from_rows(&[[0.8f32, 0.1], [0.2, 0.7]])?;
//! let accuracy = knn_accuracy(&train, &[0, 0, 1, 1], &test, &[0, 1], 2, DEFAULT_KNN_T)?;
//! assert_eq!(accuracy, 1.0);
//!
//! // Swapping the two axes and scaling by 3 is an orthogonal map and an isotropic scale.
//! let swapped: Vec<[f32; 2]> = (0..train.n)
//!     .map(|i| [3.0 * train.row(i)[1], 3.0 * train.row(i)[0]])
//!     .collect();
//! let cka = linear_cka(&train, &Features::from_rows(&swapped)?)?;
//! assert!((cka - 1.0).abs() < 1e-9);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod cka;
pub mod clustering;
pub mod features;
pub mod geometry;
pub mod hierarchy;
pub mod knn;
pub mod lidar;
pub mod linear_probe;
pub mod medmnist;
pub mod pca;
pub mod spectrum;
#[cfg(test)]
mod test_util;

pub use cka::linear_cka;
pub use clustering::{
    adjusted_mutual_info, adjusted_rand_index, clustering_metrics, clustering_scores,
    normalized_mutual_info, rand_index, spectral_clustering, CarpClustering, ClusteringScores,
    Contingency, KMeansConfig, SpectralConfig, SpectralEmbedding, SphericalKMeans,
};
pub use features::Features;
pub use geometry::{
    alignment, alignment_alpha, class_conditional_alignment, silhouette, uniformity, uniformity_t,
    ALIGNMENT_ALPHA, UNIFORMITY_T,
};
pub use hierarchy::{
    cophenetic_correlation, cosine_distances, hierarchical_rand_index, kendall_tau_b, pearson,
    spearman, tree_similarity, ClassHierarchy, Dendrogram, LevelRandIndex, Merge, TreeSimilarity,
};
pub use knn::{
    knn_accuracy, knn_predict, knn_scores, knn_sweep, knn_topk_accuracy, KnnCell, KnnSweep,
    DEFAULT_KNN_K, DEFAULT_KNN_T, SWEEP_KS, SWEEP_TEMPERATURES,
};
pub use lidar::{lidar, LidarConfig};
pub use linear_probe::{
    balanced_accuracy, fit_logistic, linear_probe, select_c, CSelection, LinearProbeConfig,
    LogisticModel, ProbeResult, DEFAULT_C_GRID,
};
pub use medmnist::{medmnist_acc, medmnist_metrics, roc_auc, MedMnistScores, MEDMNIST_THRESHOLD};
pub use pca::pca_2d;
pub use spectrum::{
    centred_ranks, covariance_spectrum, effective_rank, rankme, singular_values, standardize,
    CovarianceSpectrum, RANKME_EPS,
};
