//! Clustering of frozen features and partition-comparison scores (`docs/spec/metrics.md` §9 and
//! §11).
//!
//! * **Spherical k-means, CARP protocol (§9)** — Silva & Rivera, "Representation Learning via
//!   Consistent Assignment of Views to Clusters" (CARP, 2022). [`SphericalKMeans::fit`]
//!   standardises the fitted rows with their own statistics (`x̃ = (x − μ)/s`, population std,
//!   `s = 1` for a zero-variance dimension, as the reference `StandardScaler`), seeds with
//!   k-means++ (ChaCha8, one stream per restart), then alternates the mean update — every centroid
//!   re-normalised to unit norm — with the assignment `argmax_j ⟨x̃_i, c_j⟩` (lowest `j` on ties),
//!   for at most 100 iterations, stopping when no assignment changes; the restart with the largest
//!   objective `Σ_i max_j ⟨x̃_i, c_j⟩` is kept. [`SphericalKMeans::predict`] assigns new rows
//!   after standardising them with the fitted statistics; [`clustering_scores`] fits on the
//!   training split and scores the validation split.
//! * **Scores (§9, §11)** from the contingency table `n_uv` of true labels `U` and clusters `V`:
//!   NMI and AMI with the arithmetic-mean normaliser (`E[MI]` under the hypergeometric model,
//!   evaluated with log-gamma), ARI (Hubert & Arabie, 1985) and the unadjusted Rand index, with
//!   the reference's edge cases (identical partitions → 1; both partitions a single cluster → 1).
//! * **Spectral clustering (§11 Default)**: L2-normalised rows, symmetric k-nearest-neighbour
//!   affinity `A ← ½(C + Cᵀ)` with `C_ij = 1` when `j` is among the `k = 10` nearest neighbours of
//!   `i` by cosine similarity (self excluded), spectral embedding from the normalised Laplacian
//!   `L = I − D^{-1/2} A D^{-1/2}` (rows of `D^{-1/2} U`, `U` = eigenvectors of the smallest
//!   eigenvalues, one per cluster, as scikit-learn's `spectral_embedding`), Euclidean k-means
//!   (k-means++, fixed seed, 10 restarts) on the embedding rows. The eigenvectors come from a
//!   block Krylov iteration on the sparse affinity ([`SpectralEmbedding`]), not a dense
//!   decomposition.
//!
//! The assignment step is an `f32` matrix product `[k, d] × [d, b]` per block of `b` rows, blocks
//! and restarts in parallel (rayon); sums, costs and objectives are accumulated in `f64` in a
//! fixed order, so results do not depend on the number of threads.
//!
//! Each topic is a file of its own: `kmeans` (with the CARP protocol), `scores` and `spectral`.

mod kmeans;
mod scores;
mod spectral;

#[cfg(test)]
mod tests;

pub use kmeans::{
    clustering_scores, CarpClustering, KMeansConfig, SphericalKMeans, DEFAULT_MAX_ITER,
    DEFAULT_RESTARTS,
};
pub use scores::{
    adjusted_mutual_info, adjusted_rand_index, clustering_metrics, normalized_mutual_info,
    rand_index, ClusteringScores, Contingency,
};
pub use spectral::{
    spectral_clustering, SpectralConfig, SpectralEmbedding, DEFAULT_SPECTRAL_NEIGHBORS,
    SPECTRAL_MAX_ITER,
};
