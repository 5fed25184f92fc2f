//! Spectral clustering (spec §11 Default): the kNN affinity graph, its spectral embedding by a
//! block Krylov iteration, and Euclidean k-means on the embedding.

use anyhow::{ensure, Result};
use faer::{ColMut, ColRef, Mat, MatRef, Scale, Side};
use nalgebra::DMatrixView;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::kmeans::{
    best_run, check_features, Geometry, KMeansConfig, Points, BLOCK, DEFAULT_RESTARTS,
};
use crate::Features;

/// Maximum Lloyd iterations of the k-means on the spectral embedding (scikit-learn's default).
pub const SPECTRAL_MAX_ITER: usize = 300;
/// Default number of neighbours of the spectral-clustering affinity (spec §11 Default).
pub const DEFAULT_SPECTRAL_NEIGHBORS: usize = 10;

/// Spectral-clustering settings (spec §11 Default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpectralConfig {
    /// Neighbours per sample in the affinity graph (self excluded).
    pub n_neighbors: usize,
    /// k-means restarts on the embedding.
    pub restarts: usize,
    /// k-means seed.
    pub seed: u64,
}

impl Default for SpectralConfig {
    fn default() -> Self {
        Self {
            n_neighbors: DEFAULT_SPECTRAL_NEIGHBORS,
            restarts: DEFAULT_RESTARTS,
            seed: 0,
        }
    }
}

/// The smallest eigenvalues of the normalised Laplacian of the kNN affinity graph and their
/// embedding maps, so that clusterings with up to `n_components` clusters share one
/// eigen-decomposition.
///
/// The affinity is sparse (at most `2·n_neighbors` entries a row), so the eigenvectors come from
/// a block Krylov (block Lanczos) iteration on it: `O(n·m²)` for a Krylov
/// basis of `m` vectors, a few times `n_components`, instead of the `O(n³)` of a dense
/// decomposition.
#[derive(Debug, Clone)]
pub struct SpectralEmbedding {
    /// The `n_components` smallest eigenvalues of `L = I − D^{-1/2} A D^{-1/2}`, ascending.
    pub laplacian_eigenvalues: Vec<f64>,
    /// `[n, n_components]`: column `j` is `D^{-1/2} u_j`, `u_j` the eigenvector of the `j`-th
    /// smallest eigenvalue.
    maps: Mat<f64>,
}

/// Symmetric sparse matrix in compressed rows.
pub(super) struct SparseSymmetric {
    pub(super) n: usize,
    /// Row `i`'s entries are `cols[start[i]..start[i + 1]]`, `values[…]`.
    start: Vec<usize>,
    cols: Vec<usize>,
    values: Vec<f64>,
}

impl SparseSymmetric {
    /// `D^{-1/2} A D^{-1/2}` of the kNN affinity `A = ½(C + Cᵀ)` of `neighbours`, and `D^{-1/2}`.
    pub(super) fn normalized_affinity(neighbours: &[Vec<usize>]) -> (Self, Vec<f64>) {
        let n = neighbours.len();
        let mut rows: Vec<Vec<(usize, f64)>> = neighbours
            .iter()
            .map(|list| list.iter().map(|&j| (j, 0.5)).collect())
            .collect();
        for (i, list) in neighbours.iter().enumerate() {
            for &j in list {
                rows[j].push((i, 0.5));
            }
        }
        let (mut start, mut cols, mut values) = (vec![0], Vec::new(), Vec::new());
        for row in &mut rows {
            row.sort_by_key(|&(j, _)| j);
            let first = cols.len();
            for &(j, a) in row.iter() {
                if cols.len() > first && cols[cols.len() - 1] == j {
                    let last = values.len() - 1;
                    values[last] += a;
                } else {
                    cols.push(j);
                    values.push(a);
                }
            }
            start.push(cols.len());
        }
        let inv_sqrt_deg: Vec<f64> = (0..n)
            .map(|i| 1.0 / values[start[i]..start[i + 1]].iter().sum::<f64>().sqrt())
            .collect();
        for i in 0..n {
            for e in start[i]..start[i + 1] {
                values[e] *= inv_sqrt_deg[i] * inv_sqrt_deg[cols[e]];
            }
        }
        let matrix = Self {
            n,
            start,
            cols,
            values,
        };
        (matrix, inv_sqrt_deg)
    }

    /// `S X` for `x`: `[n, b]`, the columns in parallel.
    fn apply(&self, x: MatRef<'_, f64>) -> Mat<f64> {
        let mut out = Mat::<f64>::zeros(self.n, x.ncols());
        let columns: Vec<(ColMut<'_, f64>, ColRef<'_, f64>)> =
            out.col_iter_mut().zip(x.col_iter()).collect();
        columns.into_par_iter().for_each(|(mut y, x)| {
            for i in 0..self.n {
                let range = self.start[i]..self.start[i + 1];
                y[i] = self.cols[range.clone()]
                    .iter()
                    .zip(&self.values[range])
                    .map(|(&j, &v)| v * x[j])
                    .sum();
            }
        });
        out
    }

    pub(super) fn dense(&self) -> Mat<f64> {
        let mut m = Mat::<f64>::zeros(self.n, self.n);
        for i in 0..self.n {
            for e in self.start[i]..self.start[i + 1] {
                m[(i, self.cols[e])] = self.values[e];
            }
        }
        m
    }
}

/// Largest residual `‖S y − θ y‖` of an accepted Ritz pair (unit `y`; `‖S‖ ≤ 1`).
const RITZ_TOLERANCE: f64 = 1e-9;

/// Degree of the filter `((S + I)/2)^q` that extends the Krylov basis: it keeps the order of the
/// eigenvalues and damps those away from 1, so each block of the basis gains more on the wanted
/// eigenvectors than one product with `S` (the products are cheap, the basis is not).
const FILTER_DEGREE: usize = 8;

/// Eigenvalues and eigenvectors of the self-adjoint `m` (ascending), faer's blocked solver.
fn dense_eigen(m: MatRef<'_, f64>) -> Result<(Vec<f64>, Mat<f64>)> {
    let eig = m
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| anyhow::anyhow!("spectral clustering: eigendecomposition failed: {e:?}"))?;
    Ok((
        eig.S().column_vector().iter().copied().collect(),
        eig.U().to_owned(),
    ))
}

/// Columns of `w` made orthonormal and orthogonal to the orthonormal `basis` (block Gram–Schmidt
/// against `basis`, then a thin QR; twice, which is enough in floating point).
fn orthonormalize(mut w: Mat<f64>, basis: MatRef<'_, f64>) -> Mat<f64> {
    for _ in 0..2 {
        if basis.ncols() > 0 {
            let coefficients = basis.transpose() * &w;
            w -= basis * coefficients;
        }
        w = w.qr().compute_thin_Q();
    }
    w
}

/// The `k` algebraically largest eigenvalues of the symmetric `s` (descending) and their
/// eigenvectors, by block Krylov iteration with full reorthogonalisation and Rayleigh–Ritz: the
/// basis grows by blocks of `b = k + max(k/2, 8)` vectors (the filter of [`FILTER_DEGREE`] applied
/// to the last block, made orthonormal to the basis), until the `k` largest Ritz pairs have
/// residuals below [`RITZ_TOLERANCE`]. A block rather than a single Lanczos vector finds repeated
/// eigenvalues (one eigenvalue 1 of `s` per connected component of the graph) up to multiplicity
/// `b`. Falls back to the dense decomposition when the basis would reach `n` vectors.
pub(super) fn top_eigenpairs(s: &SparseSymmetric, k: usize) -> Result<(Vec<f64>, Mat<f64>)> {
    let n = s.n;
    let b = (k + (k / 2).max(8)).min(n);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let start = Mat::<f64>::from_fn(n, b, |_, _| rng.random::<f64>() - 0.5);
    let mut basis = orthonormalize(start, Mat::<f64>::zeros(n, 0).as_ref());
    let mut image = s.apply(basis.as_ref());
    let mut projected = basis.transpose() * &image;
    while basis.ncols() + b <= n {
        let m = basis.ncols();
        let symmetric =
            Mat::<f64>::from_fn(m, m, |i, j| 0.5 * (projected[(i, j)] + projected[(j, i)]));
        let (theta, y) = dense_eigen(symmetric.as_ref())?;
        let top = y.get(.., m - k..);
        let (vectors, images) = (&basis * top, &image * top);
        let converged = (0..k).all(|c| {
            let t = theta[m - k + c];
            let residual: f64 = images
                .col(c)
                .iter()
                .zip(vectors.col(c).iter())
                .map(|(a, v)| (a - t * v).powi(2))
                .sum();
            residual.sqrt() <= RITZ_TOLERANCE
        });
        if converged {
            let order: Vec<usize> = (0..k).rev().collect();
            let values = order.iter().map(|&c| theta[m - k + c]).collect();
            let vectors = Mat::from_fn(n, k, |i, c| vectors[(i, order[c])]);
            return Ok((values, vectors));
        }
        let mut next = basis.get(.., m - b..).to_owned();
        for _ in 0..FILTER_DEGREE {
            next = (s.apply(next.as_ref()) + &next) * Scale(0.5);
        }
        let next = orthonormalize(next, basis.as_ref());
        let next_image = s.apply(next.as_ref());
        let m2 = m + b;
        let grown = |old: &Mat<f64>, new: &Mat<f64>| {
            Mat::from_fn(
                n,
                m2,
                |i, j| if j < m { old[(i, j)] } else { new[(i, j - m)] },
            )
        };
        basis = grown(&basis, &next);
        image = grown(&image, &next_image);
        // Only the new columns of BasisᵀSBasis are new; the new rows follow by symmetry.
        let new_columns = basis.transpose() * &next_image;
        projected = Mat::from_fn(m2, m2, |i, j| match (i < m, j < m) {
            (true, true) => projected[(i, j)],
            (_, false) => new_columns[(i, j - m)],
            (false, true) => new_columns[(j, i - m)],
        });
    }
    let (values, vectors) = dense_eigen(s.dense().as_ref())?;
    Ok((
        (0..k).map(|c| values[n - 1 - c]).collect(),
        Mat::from_fn(n, k, |i, c| vectors[(i, n - 1 - c)]),
    ))
}

impl SpectralEmbedding {
    /// Builds the affinity graph of `x` (`[n, d]`) with `n_neighbors` neighbours per row and
    /// computes the `n_components` smallest eigenpairs of its normalised Laplacian.
    pub fn new(x: &Features, n_neighbors: usize, n_components: usize) -> Result<Self> {
        check_features(x, "spectral clustering")?;
        ensure!(
            n_neighbors > 0,
            "spectral clustering: n_neighbors must be positive (default {DEFAULT_SPECTRAL_NEIGHBORS})"
        );
        ensure!(
            n_neighbors < x.n,
            "spectral clustering: {} samples are too few for {n_neighbors} neighbours per sample; \
             pass more samples or lower n_neighbors",
            x.n
        );
        ensure!(
            (1..=x.n).contains(&n_components),
            "spectral embedding: {n_components} components requested, between 1 and n = {} exist",
            x.n
        );
        let (normalized, inv_sqrt_deg) =
            SparseSymmetric::normalized_affinity(&nearest_neighbours(x, n_neighbors));
        // Smallest Laplacian eigenvalues = largest eigenvalues of D^{-1/2} A D^{-1/2}.
        let (values, vectors) = top_eigenpairs(&normalized, n_components)?;
        Ok(Self {
            laplacian_eigenvalues: values.iter().map(|v| 1.0 - v).collect(),
            maps: Mat::from_fn(x.n, n_components, |i, c| vectors[(i, c)] * inv_sqrt_deg[i]),
        })
    }

    /// Number of embedded samples.
    pub fn len(&self) -> usize {
        self.maps.nrows()
    }

    /// Whether there are no samples (never true for a constructed embedding).
    pub fn is_empty(&self) -> bool {
        self.maps.nrows() == 0
    }

    /// The first `n_components` embedding coordinates of every sample, `[n, n_components]`.
    pub fn embedding(&self, n_components: usize) -> Result<Features> {
        let (n, computed) = (self.len(), self.maps.ncols());
        ensure!(
            (1..=computed).contains(&n_components),
            "spectral embedding: {n_components} components requested, between 1 and the \
             {computed} computed exist"
        );
        let data = (0..n)
            .flat_map(|i| (0..n_components).map(move |c| self.maps[(i, c)] as f32))
            .collect();
        Features::new(data, n, n_components)
    }

    /// Euclidean k-means (k-means++, `restarts` restarts, ChaCha8 `seed`, at most
    /// [`SPECTRAL_MAX_ITER`] iterations) with `n_clusters` clusters on the `n_clusters`-column
    /// embedding.
    pub fn cluster(&self, n_clusters: usize, restarts: usize, seed: u64) -> Result<Vec<u32>> {
        ensure!(
            n_clusters > 0,
            "spectral clustering: the number of clusters must be positive"
        );
        let embedded = self.embedding(n_clusters)?;
        let points = Points::new(&embedded.data, embedded.n, embedded.d, Geometry::Euclidean);
        let cfg = KMeansConfig {
            k: n_clusters,
            restarts,
            max_iter: SPECTRAL_MAX_ITER,
            seed,
        };
        Ok(best_run(&points, &cfg)?.assignment.labels)
    }
}

/// Spectral clustering of `x` (`[n, d]`) into `n_clusters` clusters (spec §11 Default).
pub fn spectral_clustering(
    x: &Features,
    n_clusters: usize,
    cfg: &SpectralConfig,
) -> Result<Vec<u32>> {
    SpectralEmbedding::new(x, cfg.n_neighbors, n_clusters)?.cluster(
        n_clusters,
        cfg.restarts,
        cfg.seed,
    )
}

/// The `k` most cosine-similar other rows of every row (ties: lower index first), from `f32`
/// products of blocks of L2-normalised rows.
pub(super) fn nearest_neighbours(x: &Features, k: usize) -> Vec<Vec<usize>> {
    let (n, d) = (x.n, x.d);
    let rows: Vec<f32> = x
        .normalized_rows_f64()
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let all = DMatrixView::from_slice(&rows, d, n);
    let blocks: Vec<Vec<Vec<usize>>> = rows
        .par_chunks(BLOCK * d)
        .enumerate()
        .map(|(bi, chunk)| {
            let b = chunk.len() / d;
            let sims = DMatrixView::from_slice(chunk, d, b).transpose() * all; // b × n
            let mut cand: Vec<(usize, f32)> = Vec::with_capacity(n);
            (0..b)
                .map(|r| {
                    let me = bi * BLOCK + r;
                    cand.clear();
                    cand.extend(
                        sims.row(r)
                            .iter()
                            .copied()
                            .enumerate()
                            .filter(|&(j, _)| j != me),
                    );
                    let order = |a: &(usize, f32), b: &(usize, f32)| {
                        b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
                    };
                    cand.select_nth_unstable_by(k - 1, order);
                    cand[..k].iter().map(|&(j, _)| j).collect()
                })
                .collect()
        })
        .collect();
    blocks.into_iter().flatten().collect()
}
