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

use std::collections::HashMap;

use anyhow::{ensure, Result};
use faer::{ColMut, ColRef, Mat, MatRef, Scale, Side};
use nalgebra::{DMatrix, DMatrixView};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::Features;

/// Default number of k-means restarts (CARP code: 10).
pub const DEFAULT_RESTARTS: usize = 10;
/// Default maximum number of Lloyd iterations per restart for the CARP protocol (spec §9).
pub const DEFAULT_MAX_ITER: usize = 100;
/// Maximum Lloyd iterations of the k-means on the spectral embedding (scikit-learn's default).
pub const SPECTRAL_MAX_ITER: usize = 300;
/// Default number of neighbours of the spectral-clustering affinity (spec §11 Default).
pub const DEFAULT_SPECTRAL_NEIGHBORS: usize = 10;

/// Rows per block of the assignment product.
const BLOCK: usize = 512;
/// Smallest left factor of a product that nalgebra hands to `matrixmultiply`, rounded up.
const MIN_GEMM_ROWS: usize = 8;

/// k-means hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KMeansConfig {
    /// Number of clusters (CARP: the number of classes).
    pub k: usize,
    /// Independent k-means++ restarts; the best objective is kept.
    pub restarts: usize,
    /// Maximum Lloyd iterations per restart.
    pub max_iter: usize,
    /// Seed of the ChaCha8 generator (restart `r` uses stream `r`).
    pub seed: u64,
}

impl KMeansConfig {
    /// `k` clusters with the spec §9 defaults: [`DEFAULT_RESTARTS`] restarts,
    /// [`DEFAULT_MAX_ITER`] iterations, seed 0.
    pub fn new(k: usize) -> Self {
        Self {
            k,
            restarts: DEFAULT_RESTARTS,
            max_iter: DEFAULT_MAX_ITER,
            seed: 0,
        }
    }

    fn check(&self, n: usize) -> Result<()> {
        ensure!(
            self.k > 0,
            "k-means: the number of clusters k must be positive"
        );
        ensure!(
            self.k <= n,
            "k-means: k = {} clusters but only {n} samples; use k ≤ n",
            self.k
        );
        ensure!(
            self.restarts > 0,
            "k-means: restarts must be at least 1 (default {DEFAULT_RESTARTS})"
        );
        ensure!(
            self.max_iter > 0,
            "k-means: max_iter must be at least 1 (default {DEFAULT_MAX_ITER})"
        );
        Ok(())
    }
}

/// Which Lloyd variant a run performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Geometry {
    /// Unit-norm centroids; score `⟨x, c⟩`, cost `‖x‖ − score`.
    Spherical,
    /// Mean centroids; score `⟨x, c⟩ − ½‖c‖²`, cost `‖x‖² − 2·score = ‖x − c‖²`.
    Euclidean,
}

impl Geometry {
    /// Per-point offset of the cost (`‖x‖` or `‖x‖²`).
    fn offset(self, x: &[f32]) -> f64 {
        let sq = dot(x, x) as f64;
        match self {
            Geometry::Spherical => sq.sqrt(),
            Geometry::Euclidean => sq,
        }
    }

    /// Cost of a point with the given offset and best score (clamped at 0 against round-off).
    fn cost(self, offset: f64, score: f32) -> f64 {
        let factor = match self {
            Geometry::Spherical => 1.0,
            Geometry::Euclidean => 2.0,
        };
        (offset - factor * f64::from(score)).max(0.0)
    }

    /// The score bias `½‖c‖²` (Euclidean) or 0 (spherical) of a centroid.
    fn bias(self, c: &[f32]) -> f32 {
        match self {
            Geometry::Spherical => 0.0,
            Geometry::Euclidean => 0.5 * dot(c, c),
        }
    }

    /// The centroid a single point seeds: the point itself, normalised when spherical.
    fn centre_of_point(self, x: &[f32]) -> Vec<f32> {
        match self {
            Geometry::Spherical => {
                let norm = dot(x, x).sqrt();
                x.iter().map(|v| v / norm).collect()
            }
            Geometry::Euclidean => x.to_vec(),
        }
    }

    /// Centroid from the `f64` sum of `count > 0` members; `None` for a spherical zero sum.
    fn centre_of_sum(self, sum: &[f64], count: usize) -> Option<Vec<f32>> {
        let scale = match self {
            Geometry::Spherical => {
                let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
                if norm == 0.0 {
                    return None;
                }
                1.0 / norm
            }
            Geometry::Euclidean => 1.0 / count as f64,
        };
        Some(sum.iter().map(|v| (v * scale) as f32).collect())
    }
}

/// `Σ a_i b_i` with eight independent accumulators (vectorisable).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Row-major points prepared for Lloyd iterations (shared read-only by all restarts).
struct Points<'a> {
    data: &'a [f32],
    n: usize,
    d: usize,
    geometry: Geometry,
    /// Cost offset of every point ([`Geometry::offset`]).
    offsets: Vec<f64>,
}

impl<'a> Points<'a> {
    fn new(data: &'a [f32], n: usize, d: usize, geometry: Geometry) -> Self {
        let offsets = data.par_chunks(d).map(|x| geometry.offset(x)).collect();
        Self {
            data,
            n,
            d,
            geometry,
            offsets,
        }
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.d..(i + 1) * self.d]
    }

    /// Points that may seed a centroid (spherical: non-zero rows).
    fn seedable(&self) -> Vec<usize> {
        (0..self.n)
            .filter(|&i| self.geometry == Geometry::Euclidean || self.offsets[i] > 0.0)
            .collect()
    }
}

/// Best centroid of every point and its score.
struct Assignment {
    labels: Vec<u32>,
    scores: Vec<f32>,
}

impl Assignment {
    fn costs(&self, points: &Points) -> Vec<f64> {
        self.scores
            .iter()
            .zip(&points.offsets)
            .map(|(&s, &o)| points.geometry.cost(o, s))
            .collect()
    }
}

/// A row-major `[rows, d]` matrix padded with zero rows to at least [`MIN_GEMM_ROWS`] rows, so
/// that nalgebra's product takes the blocked `matrixmultiply` path.
fn padded(values: &[f32], rows: usize, d: usize) -> DMatrix<f32> {
    DMatrix::from_fn(rows.max(MIN_GEMM_ROWS), d, |i, j| {
        if i < rows {
            values[i * d + j]
        } else {
            0.0
        }
    })
}

/// Calls `per_point(i, sims)` for every point `i` with `sims[j] = ⟨x_i, c_j⟩` for the rows `c_j`
/// of `centres` (a [`padded`] matrix; entries past its real rows are 0), from one
/// `[rows, d] × [d, b]` product per block of [`BLOCK`] points, blocks in parallel; results in
/// point order.
fn for_each_point<R, F>(points: &Points, centres: &DMatrix<f32>, per_point: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize, &[f32]) -> R + Sync,
{
    let d = points.d;
    let m = centres.nrows();
    let blocks: Vec<Vec<R>> = points
        .data
        .par_chunks(BLOCK * d)
        .enumerate()
        .map(|(bi, chunk)| {
            let b = chunk.len() / d;
            // Column-major d × b view of the row-major b × d block: column i = point i.
            let sims = centres * DMatrixView::from_slice(chunk, d, b);
            sims.as_slice()
                .chunks(m)
                .enumerate()
                .map(|(i, col)| per_point(bi * BLOCK + i, col))
                .collect()
        })
        .collect();
    blocks.into_iter().flatten().collect()
}

/// Assigns every point to `argmax_j (⟨x, c_j⟩ − bias_j)` (lowest `j` on ties); `centroids` is
/// row-major `[k, d]`.
fn assign(points: &Points, centroids: &[f32], k: usize) -> Assignment {
    let d = points.d;
    let bias: Vec<f32> = centroids
        .chunks(d)
        .map(|c| points.geometry.bias(c))
        .collect();
    let best: Vec<(u32, f32)> = for_each_point(points, &padded(centroids, k, d), |_, col| {
        let mut best = (0u32, col[0] - bias[0]);
        for (j, (&s, &c)) in col.iter().zip(&bias).enumerate().skip(1) {
            if s - c > best.1 {
                best = (j as u32, s - c);
            }
        }
        best
    });
    let (labels, scores) = best.into_iter().unzip();
    Assignment { labels, scores }
}

/// Mean update of every non-empty cluster (re-normalised when spherical); each empty cluster is
/// moved onto the seedable point of largest cost (largest first, lowest index on ties).
fn update(points: &Points, current: &Assignment, previous: &[f32], k: usize) -> Vec<f32> {
    let d = points.d;
    let mut start = vec![0usize; k + 1];
    for &l in &current.labels {
        start[l as usize + 1] += 1;
    }
    for j in 0..k {
        start[j + 1] += start[j];
    }
    let mut fill = start.clone();
    let mut order = vec![0usize; points.n];
    for (i, &l) in current.labels.iter().enumerate() {
        order[fill[l as usize]] = i;
        fill[l as usize] += 1;
    }
    let fresh: Vec<Option<Vec<f32>>> = (0..k)
        .into_par_iter()
        .map(|j| {
            let members = &order[start[j]..start[j + 1]];
            if members.is_empty() {
                return None;
            }
            let mut sum = vec![0.0f64; d];
            for &i in members {
                for (s, &v) in sum.iter_mut().zip(points.row(i)) {
                    *s += f64::from(v);
                }
            }
            points.geometry.centre_of_sum(&sum, members.len())
        })
        .collect();
    let mut centroids = previous.to_vec();
    let mut empty = Vec::new();
    for (j, c) in fresh.into_iter().enumerate() {
        if let Some(c) = c {
            centroids[j * d..(j + 1) * d].copy_from_slice(&c);
        } else if start[j] == start[j + 1] {
            empty.push(j);
        }
    }
    if !empty.is_empty() {
        let costs = current.costs(points);
        let mut donors = points.seedable();
        donors.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
        for (j, i) in empty.into_iter().zip(donors) {
            centroids[j * d..(j + 1) * d]
                .copy_from_slice(&points.geometry.centre_of_point(points.row(i)));
        }
    }
    centroids
}

/// k-means++ seeding of every restart at once (restart `r` draws from `rngs[r]`): the first
/// centre uniformly among the seedable points, every further one with probability proportional
/// to the current cost of a point (`D²` for Euclidean, `‖x‖ − max ⟨x, c⟩` for spherical). Each
/// step updates the costs of all restarts in one pass over the points (`[R, d] × [d, b]`
/// products). Returns the row-major `[k, d]` centroids of every restart.
fn plus_plus(
    points: &Points,
    seedable: &[usize],
    k: usize,
    rngs: &mut [ChaCha8Rng],
) -> Vec<Vec<f32>> {
    let (d, r) = (points.d, rngs.len());
    let geometry = points.geometry;
    let mut centroids: Vec<Vec<f32>> = vec![Vec::with_capacity(k * d); r];
    // cost[i * r + q]: cost of point i for restart q.
    let mut cost = vec![f64::INFINITY; points.n * r];
    let mut picks: Vec<usize> = rngs
        .iter_mut()
        .map(|rng| seedable[rng.random_range(0..seedable.len())])
        .collect();
    for c in 0..k {
        let centres: Vec<f32> = picks
            .iter()
            .flat_map(|&p| geometry.centre_of_point(points.row(p)))
            .collect();
        let bias: Vec<f32> = centres.chunks(d).map(|c| geometry.bias(c)).collect();
        let fresh: Vec<f64> = for_each_point(points, &padded(&centres, r, d), |i, col| {
            col.iter()
                .zip(&bias)
                .map(|(&s, &b)| geometry.cost(points.offsets[i], s - b))
                .collect::<Vec<f64>>()
        })
        .into_iter()
        .flatten()
        .collect();
        cost.iter_mut()
            .zip(fresh)
            .for_each(|(old, new)| *old = old.min(new));
        for (all, centre) in centroids.iter_mut().zip(centres.chunks(d)) {
            all.extend_from_slice(centre);
        }
        if c + 1 == k {
            break;
        }
        for (q, (rng, pick)) in rngs.iter_mut().zip(picks.iter_mut()).enumerate() {
            let column = || cost.iter().skip(q).step_by(r);
            let total: f64 = column().sum();
            *pick = if total > 0.0 {
                let target = rng.random::<f64>() * total;
                let mut cum = 0.0;
                let mut chosen = *pick;
                for (i, &ci) in column().enumerate() {
                    if ci > 0.0 {
                        cum += ci;
                        chosen = i;
                        if cum > target {
                            break;
                        }
                    }
                }
                chosen
            } else {
                seedable[rng.random_range(0..seedable.len())]
            };
        }
    }
    centroids
}

/// Result of one k-means run.
struct Run {
    centroids: Vec<f32>,
    assignment: Assignment,
    /// `Σ_i cost_i` (minimised).
    cost: f64,
    iterations: usize,
}

/// Lloyd iterations from seeded `centroids`: `iterations` counts update + assignment rounds; the
/// returned assignment always belongs to the returned centroids.
fn lloyd(points: &Points, mut centroids: Vec<f32>, cfg: &KMeansConfig) -> Run {
    let mut current = assign(points, &centroids, cfg.k);
    let mut iterations = 0;
    while iterations < cfg.max_iter {
        centroids = update(points, &current, &centroids, cfg.k);
        iterations += 1;
        let next = assign(points, &centroids, cfg.k);
        let changed = next.labels != current.labels;
        current = next;
        if !changed {
            break;
        }
    }
    let cost = current.costs(points).iter().sum();
    Run {
        centroids,
        assignment: current,
        cost,
        iterations,
    }
}

/// Best of `cfg.restarts` k-means++-seeded Lloyd runs by total cost (lowest restart index on
/// ties). Restart `r` draws from ChaCha8 seeded with `cfg.seed`, stream `r`.
fn best_run(points: &Points, cfg: &KMeansConfig) -> Result<Run> {
    cfg.check(points.n)?;
    let seedable = points.seedable();
    ensure!(
        !seedable.is_empty(),
        "spherical k-means: every row is zero after standardisation (constant features); \
         check the feature extraction"
    );
    let mut rngs: Vec<ChaCha8Rng> = (0..cfg.restarts)
        .map(|r| {
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
            rng.set_stream(r as u64);
            rng
        })
        .collect();
    let seeds = plus_plus(points, &seedable, cfg.k, &mut rngs);
    let runs: Vec<Run> = seeds
        .into_par_iter()
        .map(|centroids| lloyd(points, centroids, cfg))
        .collect();
    let mut best: Option<Run> = None;
    for run in runs {
        if best.as_ref().is_none_or(|b| run.cost < b.cost) {
            best = Some(run);
        }
    }
    best.ok_or_else(|| anyhow::anyhow!("k-means: no restart was run"))
}

fn check_features(x: &Features, what: &str) -> Result<()> {
    ensure!(
        !x.is_empty(),
        "{what}: empty feature matrix ({}×{})",
        x.n,
        x.d
    );
    ensure!(
        x.data.iter().all(|v| v.is_finite()),
        "{what}: features contain NaN or infinite values; check the encoder output"
    );
    Ok(())
}

/// Spherical k-means fitted on standardised features (spec §9).
#[derive(Debug, Clone, PartialEq)]
pub struct SphericalKMeans {
    /// Unit-norm centroids in the standardised space, row-major `[k, d]`.
    pub centroids: Vec<f32>,
    /// Number of clusters.
    pub k: usize,
    /// Feature dimension.
    pub d: usize,
    /// Per-dimension mean `μ` of the fitted rows.
    pub mean: Vec<f64>,
    /// Per-dimension population std `s` of the fitted rows (1 where it is 0).
    pub scale: Vec<f64>,
    /// Cluster of every fitted row.
    pub labels: Vec<u32>,
    /// Objective of the kept restart, `Σ_i ⟨x̃_i, c_{labels_i}⟩` (maximised).
    pub objective: f64,
    /// Lloyd iterations of the kept restart.
    pub iterations: usize,
}

impl SphericalKMeans {
    /// Fits `x` (`[n, d]`): standardisation, k-means++ and Lloyd iterations, best of
    /// `cfg.restarts` by the objective. Deterministic for a given `cfg.seed`.
    pub fn fit(x: &Features, cfg: &KMeansConfig) -> Result<Self> {
        check_features(x, "spherical k-means")?;
        cfg.check(x.n)?;
        let (mean, scale) = column_stats(x);
        let z = standardized(x, &mean, &scale);
        let points = Points::new(&z, x.n, x.d, Geometry::Spherical);
        let run = best_run(&points, cfg)?;
        let objective = run.assignment.scores.iter().map(|&s| f64::from(s)).sum();
        Ok(Self {
            centroids: run.centroids,
            k: cfg.k,
            d: x.d,
            mean,
            scale,
            labels: run.assignment.labels,
            objective,
            iterations: run.iterations,
        })
    }

    /// Cluster of every row of `x` (`[m, d]`): standardised with the fitted statistics, then
    /// `argmax_j ⟨x̃, c_j⟩` (lowest `j` on ties).
    pub fn predict(&self, x: &Features) -> Result<Vec<u32>> {
        check_features(x, "spherical k-means predict")?;
        ensure!(
            x.d == self.d,
            "spherical k-means predict: features have dimension {}, the model was fitted on {}",
            x.d,
            self.d
        );
        let z = standardized(x, &self.mean, &self.scale);
        let points = Points::new(&z, x.n, x.d, Geometry::Spherical);
        Ok(assign(&points, &self.centroids, self.k).labels)
    }
}

/// Column means and population stds (`1` for a zero-variance column), in `f64`.
fn column_stats(x: &Features) -> (Vec<f64>, Vec<f64>) {
    let n = x.n as f64;
    let mut mean = vec![0.0f64; x.d];
    for row in x.data.chunks(x.d) {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= n);
    let mut var = vec![0.0f64; x.d];
    for row in x.data.chunks(x.d) {
        for ((s, &v), m) in var.iter_mut().zip(row).zip(&mean) {
            let c = f64::from(v) - m;
            *s += c * c;
        }
    }
    let scale = var
        .iter()
        .map(|s| {
            let sd = (s / n).sqrt();
            if sd > 0.0 {
                sd
            } else {
                1.0
            }
        })
        .collect();
    (mean, scale)
}

/// `(x − mean) / scale` as row-major `f32`.
fn standardized(x: &Features, mean: &[f64], scale: &[f64]) -> Vec<f32> {
    x.data
        .par_chunks(x.d)
        .flat_map_iter(|row| {
            row.iter()
                .zip(mean)
                .zip(scale)
                .map(|((&v, m), s)| ((f64::from(v) - m) / s) as f32)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Partition-comparison scores.

/// Contingency table of two labelings (spec §9): rows = distinct true labels (ascending),
/// columns = distinct predicted labels (ascending), stored sparsely.
#[derive(Debug, Clone, PartialEq)]
pub struct Contingency {
    /// Distinct true labels `U`, ascending (row order).
    pub classes: Vec<u32>,
    /// Distinct predicted labels `V`, ascending (column order).
    pub clusters: Vec<u32>,
    /// Row sums `a_u`.
    pub row_sums: Vec<u64>,
    /// Column sums `b_v`.
    pub col_sums: Vec<u64>,
    /// Non-zero cells `(u, v, n_uv)`, sorted by `(u, v)`.
    pub cells: Vec<(usize, usize, u64)>,
    /// Number of samples `n`.
    pub n: u64,
}

impl Contingency {
    /// Builds the table; fails on different lengths or no samples.
    pub fn new(labels_true: &[u32], labels_pred: &[u32]) -> Result<Self> {
        ensure!(
            labels_true.len() == labels_pred.len(),
            "contingency table: {} true labels but {} predicted labels",
            labels_true.len(),
            labels_pred.len()
        );
        ensure!(
            !labels_true.is_empty(),
            "contingency table: no samples to compare"
        );
        let dense = |labels: &[u32]| {
            let mut distinct = labels.to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            let index: HashMap<u32, usize> =
                distinct.iter().enumerate().map(|(i, &l)| (l, i)).collect();
            (distinct, index)
        };
        let (classes, ci) = dense(labels_true);
        let (clusters, ki) = dense(labels_pred);
        let mut counts: HashMap<(usize, usize), u64> = HashMap::new();
        let mut row_sums = vec![0u64; classes.len()];
        let mut col_sums = vec![0u64; clusters.len()];
        for (t, p) in labels_true.iter().zip(labels_pred) {
            let (u, v) = (ci[t], ki[p]);
            *counts.entry((u, v)).or_insert(0) += 1;
            row_sums[u] += 1;
            col_sums[v] += 1;
        }
        let mut cells: Vec<(usize, usize, u64)> =
            counts.into_iter().map(|((u, v), c)| (u, v, c)).collect();
        cells.sort_unstable();
        Ok(Self {
            classes,
            clusters,
            row_sums,
            col_sums,
            cells,
            n: labels_true.len() as u64,
        })
    }

    /// The dense `|U| × |V|` table.
    pub fn dense(&self) -> Vec<Vec<u64>> {
        let mut table = vec![vec![0u64; self.clusters.len()]; self.classes.len()];
        for &(u, v, c) in &self.cells {
            table[u][v] = c;
        }
        table
    }

    /// Whether both labelings are a single cluster (the reference's perfect-match special case).
    fn both_single(&self) -> bool {
        self.classes.len() == 1 && self.clusters.len() == 1
    }

    /// `MI = Σ_{u,v} (n_uv/n) log(n·n_uv / (a_u b_v))` (natural log); 0 when either labeling is a
    /// single cluster, per-cell terms below machine epsilon zeroed and the sum clipped at 0 (as
    /// the reference).
    pub fn mutual_information(&self) -> f64 {
        if self.classes.len() == 1 || self.clusters.len() == 1 {
            return 0.0;
        }
        let n = self.n as f64;
        let mi: f64 = self
            .cells
            .iter()
            .map(|&(u, v, c)| {
                let c = c as f64;
                let outer = self.row_sums[u] as f64 * self.col_sums[v] as f64;
                let term = (c / n) * ((c.ln() - n.ln()) + (2.0 * n.ln() - outer.ln()));
                if term.abs() < f64::EPSILON {
                    0.0
                } else {
                    term
                }
            })
            .sum();
        mi.max(0.0)
    }

    /// Entropies `(H(U), H(V))`, `H = −Σ (a/n) log(a/n)`.
    pub fn entropies(&self) -> (f64, f64) {
        let n = self.n as f64;
        let h = |sums: &[u64]| -> f64 {
            -sums
                .iter()
                .map(|&a| (a as f64 / n) * ((a as f64).ln() - n.ln()))
                .sum::<f64>()
        };
        (h(&self.row_sums), h(&self.col_sums))
    }

    /// Expected MI under the permutation (hypergeometric) model (spec §9):
    /// `E[MI] = Σ_u Σ_v Σ_{m=max(1, a_u+b_v−n)}^{min(a_u,b_v)} (m/n) log(n m/(a_u b_v)) ·
    /// a_u! b_v! (n−a_u)! (n−b_v)! / (n! m! (a_u−m)! (b_v−m)! (n−a_u−b_v+m)!)`,
    /// factorials through a Lanczos `ln Γ`; 0 when either labeling is a single cluster.
    pub fn expected_mutual_information(&self) -> f64 {
        if self.classes.len() == 1 || self.clusters.len() == 1 {
            return 0.0;
        }
        let n = self.n as usize;
        let nf = n as f64;
        let ln_fact: Vec<f64> = (0..=n).map(|m| ln_gamma(m as f64 + 1.0)).collect();
        let per_row: Vec<f64> = self
            .row_sums
            .par_iter()
            .map(|&a| {
                let a = a as usize;
                let mut emi = 0.0;
                for &b in &self.col_sums {
                    let b = b as usize;
                    let fixed =
                        ln_fact[a] + ln_fact[b] + ln_fact[n - a] + ln_fact[n - b] - ln_fact[n];
                    let log_ab = (a as f64).ln() + (b as f64).ln();
                    for m in (a + b).saturating_sub(n).max(1)..=a.min(b) {
                        let mf = m as f64;
                        let term2 = nf.ln() + mf.ln() - log_ab;
                        let gln = fixed
                            - ln_fact[m]
                            - ln_fact[a - m]
                            - ln_fact[b - m]
                            - ln_fact[n + m - a - b];
                        emi += (mf / nf) * term2 * gln.exp();
                    }
                }
                emi
            })
            .collect();
        per_row.iter().sum()
    }

    /// `(Σ_uv C(n_uv,2), Σ_u C(a_u,2), Σ_v C(b_v,2), C(n,2))` as `f64`.
    fn pair_sums(&self) -> (f64, f64, f64, f64) {
        let c2 = |m: u64| (m as f64) * (m as f64 - 1.0) / 2.0;
        (
            self.cells.iter().map(|&(_, _, c)| c2(c)).sum(),
            self.row_sums.iter().map(|&a| c2(a)).sum(),
            self.col_sums.iter().map(|&b| c2(b)).sum(),
            c2(self.n),
        )
    }

    /// NMI with the arithmetic mean (spec §9); 1 when both labelings are a single cluster, 0
    /// when MI = 0 otherwise.
    pub fn nmi(&self) -> f64 {
        if self.both_single() {
            return 1.0;
        }
        let mi = self.mutual_information();
        if mi == 0.0 {
            return 0.0;
        }
        let (hu, hv) = self.entropies();
        mi / (0.5 * (hu + hv))
    }

    /// AMI = `(MI − E[MI]) / (mean(H(U), H(V)) − E[MI])` (arithmetic mean, spec §9); 1 when both
    /// labelings are a single cluster; the denominator keeps its sign and is at least machine
    /// epsilon in magnitude (reference behaviour for a perfect match).
    pub fn ami(&self) -> f64 {
        if self.both_single() {
            return 1.0;
        }
        let mi = self.mutual_information();
        let emi = self.expected_mutual_information();
        let (hu, hv) = self.entropies();
        let denominator = 0.5 * (hu + hv) - emi;
        let denominator = if denominator < 0.0 {
            denominator.min(-f64::EPSILON)
        } else {
            denominator.max(f64::EPSILON)
        };
        (mi - emi) / denominator
    }

    /// ARI (spec §9): `(Σ C(n_uv,2) − Σ_u C(a_u,2) Σ_v C(b_v,2)/C(n,2)) /
    /// (½[Σ_u C(a_u,2) + Σ_v C(b_v,2)] − Σ_u C(a_u,2) Σ_v C(b_v,2)/C(n,2))`; 1 when the two
    /// labelings agree on every pair (identical partitions, including one sample).
    pub fn ari(&self) -> f64 {
        let (sum_cells, sum_rows, sum_cols, pairs) = self.pair_sums();
        if sum_cells == sum_rows && sum_cells == sum_cols {
            return 1.0;
        }
        let expected = sum_rows * sum_cols / pairs;
        (sum_cells - expected) / (0.5 * (sum_rows + sum_cols) - expected)
    }

    /// Unadjusted Rand index (spec §11): `(#pairs together in both + #pairs apart in both) /
    /// C(n, 2)`; 1 for a single sample.
    pub fn rand_index(&self) -> f64 {
        let (sum_cells, sum_rows, sum_cols, pairs) = self.pair_sums();
        if pairs == 0.0 {
            return 1.0;
        }
        let agree = pairs + 2.0 * sum_cells - sum_rows - sum_cols;
        agree / pairs
    }
}

/// NMI, AMI and ARI of a clustering against the true labels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClusteringScores {
    /// Normalised mutual information (arithmetic mean).
    pub nmi: f64,
    /// Adjusted mutual information (arithmetic mean).
    pub ami: f64,
    /// Adjusted Rand index.
    pub ari: f64,
}

/// NMI, AMI and ARI of `labels_pred` against `labels_true` (spec §9) from one contingency table.
pub fn clustering_metrics(labels_true: &[u32], labels_pred: &[u32]) -> Result<ClusteringScores> {
    let table = Contingency::new(labels_true, labels_pred)?;
    Ok(ClusteringScores {
        nmi: table.nmi(),
        ami: table.ami(),
        ari: table.ari(),
    })
}

/// Normalised mutual information, arithmetic mean (spec §9).
pub fn normalized_mutual_info(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.nmi())
}

/// Adjusted mutual information, arithmetic mean (spec §9).
pub fn adjusted_mutual_info(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.ami())
}

/// Adjusted Rand index (spec §9).
pub fn adjusted_rand_index(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.ari())
}

/// Unadjusted Rand index (spec §11).
pub fn rand_index(labels_true: &[u32], labels_pred: &[u32]) -> Result<f64> {
    Ok(Contingency::new(labels_true, labels_pred)?.rand_index())
}

/// `ln Γ(x)` for `x ≥ 0.5` by the Lanczos approximation (`g = 7`, 9 coefficients; relative error
/// about 1e-15).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    let x = x - 1.0;
    let series = COEFFICIENTS[1..]
        .iter()
        .enumerate()
        .fold(COEFFICIENTS[0], |acc, (i, c)| {
            acc + c / (x + i as f64 + 1.0)
        });
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + series.ln()
}

// ---------------------------------------------------------------------------------------------
// CARP protocol.

/// Result of [`clustering_scores`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CarpClustering {
    /// Scores of the validation assignment against the validation labels.
    pub val: ClusteringScores,
    /// Scores of the training assignment, when training labels were given.
    pub train: Option<ClusteringScores>,
    /// Spherical k-means objective of the kept restart on the training features.
    pub objective: f64,
}

/// CARP protocol (spec §9): spherical k-means with `k` clusters (`restarts` restarts, at most
/// [`DEFAULT_MAX_ITER`] iterations, ChaCha8 `seed`) fitted on the training features
/// `[n_train, d]`, validation features `[n_val, d]` standardised with the training statistics and
/// assigned to the centroid of maximum inner product, NMI/AMI/ARI computed on the validation
/// split (and on the training split when `train_labels` is given).
pub fn clustering_scores(
    train: &Features,
    train_labels: Option<&[u32]>,
    val: &Features,
    val_labels: &[u32],
    k: usize,
    restarts: usize,
    seed: u64,
) -> Result<CarpClustering> {
    ensure!(
        val_labels.len() == val.n,
        "clustering scores: {} validation labels for {} validation samples",
        val_labels.len(),
        val.n
    );
    if let Some(labels) = train_labels {
        ensure!(
            labels.len() == train.n,
            "clustering scores: {} training labels for {} training samples",
            labels.len(),
            train.n
        );
    }
    let cfg = KMeansConfig {
        k,
        restarts,
        max_iter: DEFAULT_MAX_ITER,
        seed,
    };
    let model = SphericalKMeans::fit(train, &cfg)?;
    let assigned = model.predict(val)?;
    Ok(CarpClustering {
        val: clustering_metrics(val_labels, &assigned)?,
        train: train_labels
            .map(|labels| clustering_metrics(labels, &model.labels))
            .transpose()?,
        objective: model.objective,
    })
}

// ---------------------------------------------------------------------------------------------
// Spectral clustering.

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
struct SparseSymmetric {
    n: usize,
    /// Row `i`'s entries are `cols[start[i]..start[i + 1]]`, `values[…]`.
    start: Vec<usize>,
    cols: Vec<usize>,
    values: Vec<f64>,
}

impl SparseSymmetric {
    /// `D^{-1/2} A D^{-1/2}` of the kNN affinity `A = ½(C + Cᵀ)` of `neighbours`, and `D^{-1/2}`.
    fn normalized_affinity(neighbours: &[Vec<usize>]) -> (Self, Vec<f64>) {
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

    fn dense(&self) -> Mat<f64> {
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
fn top_eigenpairs(s: &SparseSymmetric, k: usize) -> Result<(Vec<f64>, Mat<f64>)> {
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
fn nearest_neighbours(x: &Features, k: usize) -> Vec<Vec<usize>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    fn close(got: f64, want: f64, rel: f64) -> bool {
        (got - want).abs() <= rel * want.abs().max(1e-300)
    }

    fn assert_close(what: &str, got: f64, want: f64) {
        assert!(close(got, want, 1e-9), "{what}: got {got}, want {want}");
    }

    const U: [u32; 9] = [0, 0, 0, 1, 1, 1, 2, 2, 2];
    const V: [u32; 9] = [0, 0, 1, 1, 1, 2, 2, 2, 2];

    #[test]
    fn section9_kat() {
        let t = Contingency::new(&U, &V).unwrap();
        assert_eq!(t.dense(), vec![vec![2, 1, 0], vec![0, 2, 1], vec![0, 0, 3]]);
        assert_close("MI", t.mutual_information(), 0.636_514_168_3);
        let (hu, hv) = t.entropies();
        assert_close("H(U)", hu, 1.098_612_288_7);
        assert_close("H(V)", hv, 1.060_856_947_2);
        assert_close("E[MI]", t.expected_mutual_information(), 0.330_202_492_6);
        assert_close("NMI", t.nmi(), 0.589_509_827_4);
        assert_close("AMI", t.ami(), 0.408_670_509_7);
        assert_close("ARI", t.ari(), 0.357_142_857_1);
        assert_close("RI", t.rand_index(), 0.75);
        let s = clustering_metrics(&U, &V).unwrap();
        assert_eq!(
            (s.nmi, s.ami, s.ari),
            (
                normalized_mutual_info(&U, &V).unwrap(),
                adjusted_mutual_info(&U, &V).unwrap(),
                adjusted_rand_index(&U, &V).unwrap()
            )
        );
    }

    #[test]
    fn scores_match_scikit_learn_on_larger_labelings() {
        // Reference values: scikit-learn 1.9 normalized_mutual_info_score,
        // adjusted_mutual_info_score, adjusted_rand_score, rand_score.
        let cases: [(Vec<u32>, Vec<u32>, [f64; 4]); 2] = [
            (
                (0..200).map(|i| (i * 7) % 5).collect(),
                (0..200)
                    .map(|i| (i * i + 3) % 4 + if i % 3 == 0 { 4 } else { 0 })
                    .collect(),
                [
                    0.000_772_139_233_179_272_1,
                    -0.020_716_423_818_922_98,
                    -0.015_562_965_827_958_563,
                    0.632_010_050_251_256_2,
                ],
            ),
            (
                (0..5000).map(|i| i % 50).collect(),
                (0..5000).map(|i| (i * i) % 37).collect(),
                [
                    0.002_144_480_659_878_944_3,
                    -0.025_519_775_440_342_16,
                    -0.004_818_357_054_612_086,
                    0.928_833_926_785_357,
                ],
            ),
        ];
        for (u, v, want) in cases {
            let t = Contingency::new(&u, &v).unwrap();
            let got = [t.nmi(), t.ami(), t.ari(), t.rand_index()];
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-10, "got {got:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn section11_rand_index_kat() {
        assert_close("RI", rand_index(&U, &V).unwrap(), 0.75);
        assert_close("RI", rand_index(&[0, 0, 1, 1], &[0, 1, 1, 1]).unwrap(), 0.5);
    }

    #[test]
    fn identical_and_degenerate_partitions() {
        let a = [0u32, 0, 1, 1, 2, 2, 2];
        let relabelled = [7u32, 7, 3, 3, 9, 9, 9];
        let s = clustering_metrics(&a, &relabelled).unwrap();
        assert!(close(s.nmi, 1.0, 1e-12) && close(s.ami, 1.0, 1e-12) && s.ari == 1.0);
        assert_eq!(rand_index(&a, &relabelled).unwrap(), 1.0);
        let single = clustering_metrics(&[4, 4, 4], &[1, 1, 1]).unwrap();
        assert_eq!((single.nmi, single.ami, single.ari), (1.0, 1.0, 1.0));
        // One single cluster against a split: no information, chance-level agreement.
        let split = clustering_metrics(&[0, 0, 0, 0], &[0, 0, 1, 1]).unwrap();
        assert_eq!((split.nmi, split.ami, split.ari), (0.0, 0.0, 0.0));
        // All-singleton partitions agree on every pair.
        assert_eq!(adjusted_rand_index(&[0, 1, 2], &[5, 4, 3]).unwrap(), 1.0);
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        assert_close("lnΓ(1/2)", ln_gamma(0.5), 0.5 * std::f64::consts::PI.ln());
        assert!(ln_gamma(1.0).abs() < 1e-14 && ln_gamma(2.0).abs() < 1e-14);
        assert_close("ln 10!", ln_gamma(11.0), 3_628_800f64.ln());
        let ln_fact_200: f64 = (1..=200).map(|m| (m as f64).ln()).sum();
        assert_close("ln 200!", ln_gamma(201.0), ln_fact_200);
    }

    #[test]
    fn score_errors() {
        let err = Contingency::new(&[0, 1], &[0]).unwrap_err().to_string();
        assert!(err.contains("2 true labels but 1 predicted"), "{err}");
        let err = rand_index(&[], &[]).unwrap_err().to_string();
        assert!(err.contains("no samples"), "{err}");
    }

    /// `per_class` rows around each of `centres` (`[k, d]` row-major) with Gaussian noise `sigma`.
    fn blobs(
        centres: &[Vec<f64>],
        per_class: usize,
        sigma: f64,
        rng: &mut Rng,
    ) -> (Features, Vec<u32>) {
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for _ in 0..per_class {
            for (c, centre) in centres.iter().enumerate() {
                rows.push(
                    centre
                        .iter()
                        .map(|m| (m + sigma * rng.normal()) as f32)
                        .collect::<Vec<f32>>(),
                );
                labels.push(c as u32);
            }
        }
        (Features::from_rows(&rows).unwrap(), labels)
    }

    fn basis_centres(k: usize, d: usize, scale: f64) -> Vec<Vec<f64>> {
        (0..k)
            .map(|c| (0..d).map(|j| if j == c { scale } else { 0.0 }).collect())
            .collect()
    }

    #[test]
    fn kmeans_recovers_separated_blobs_and_predicts() {
        let mut rng = Rng::new(1);
        let centres = basis_centres(5, 12, 8.0);
        let (x, y) = blobs(&centres, 40, 0.5, &mut rng);
        let model = SphericalKMeans::fit(&x, &KMeansConfig::new(5)).unwrap();
        assert_eq!(adjusted_rand_index(&y, &model.labels).unwrap(), 1.0);
        for c in model.centroids.chunks(model.d) {
            assert!((dot(c, c) - 1.0).abs() < 1e-5);
        }
        assert_eq!(model.predict(&x).unwrap(), model.labels);
        let (val, val_y) = blobs(&centres, 10, 0.5, &mut rng);
        let carp = clustering_scores(&x, Some(&y), &val, &val_y, 5, 3, 7).unwrap();
        assert_eq!(carp.val.ari, 1.0);
        assert!(close(carp.val.nmi, 1.0, 1e-12) && close(carp.val.ami, 1.0, 1e-12));
        assert_eq!(carp.train.map(|s| s.ari), Some(1.0));
        assert!(carp.objective > 0.0);
    }

    #[test]
    fn kmeans_is_deterministic_per_seed_and_thread_count() {
        let mut rng = Rng::new(2);
        let x = rng.features(600, 16);
        let cfg = KMeansConfig {
            seed: 11,
            ..KMeansConfig::new(8)
        };
        let a = SphericalKMeans::fit(&x, &cfg).unwrap();
        let one_thread = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let b = one_thread.install(|| SphericalKMeans::fit(&x, &cfg).unwrap());
        assert_eq!(a, b);
        // Structureless data: different seeds end in different local optima.
        let c = SphericalKMeans::fit(
            &x,
            &KMeansConfig {
                seed: 12,
                restarts: 1,
                ..cfg
            },
        )
        .unwrap();
        let d = SphericalKMeans::fit(
            &x,
            &KMeansConfig {
                seed: 13,
                restarts: 1,
                ..cfg
            },
        )
        .unwrap();
        assert!(adjusted_rand_index(&c.labels, &d.labels).unwrap() < 0.99);
        // More restarts never lose objective against the first restart alone.
        let first = SphericalKMeans::fit(&x, &KMeansConfig { restarts: 1, ..cfg }).unwrap();
        assert!(a.objective >= first.objective);
        assert!(a.iterations >= 1 && a.iterations <= DEFAULT_MAX_ITER);
    }

    #[test]
    fn kmeans_handles_duplicates_and_constant_dimensions() {
        // Only three distinct rows but k = 3; a constant column is harmless.
        let rows: Vec<[f32; 3]> = (0..12)
            .map(|i| [(i % 3) as f32, ((i % 3) * 2 % 3) as f32, 5.0])
            .collect();
        let x = Features::from_rows(&rows).unwrap();
        let model = SphericalKMeans::fit(&x, &KMeansConfig::new(3)).unwrap();
        let truth: Vec<u32> = (0..12).map(|i| i % 3).collect();
        assert_eq!(adjusted_rand_index(&truth, &model.labels).unwrap(), 1.0);
        assert_eq!(model.scale[2], 1.0);
    }

    #[test]
    fn kmeans_errors() {
        let x = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0]]).unwrap();
        let err = |r: Result<SphericalKMeans>| r.unwrap_err().to_string();
        assert!(err(SphericalKMeans::fit(&x, &KMeansConfig::new(3))).contains("k ≤ n"));
        assert!(err(SphericalKMeans::fit(&x, &KMeansConfig::new(0))).contains("positive"));
        let no_restarts = KMeansConfig {
            restarts: 0,
            ..KMeansConfig::new(1)
        };
        assert!(err(SphericalKMeans::fit(&x, &no_restarts)).contains("restarts"));
        let nan = Features::from_rows(&[[f32::NAN, 0.0], [0.0, 1.0]]).unwrap();
        assert!(err(SphericalKMeans::fit(&nan, &KMeansConfig::new(1))).contains("NaN"));
        let constant = Features::from_rows(&[[2.0f32, 3.0], [2.0, 3.0]]).unwrap();
        assert!(err(SphericalKMeans::fit(&constant, &KMeansConfig::new(1)))
            .contains("every row is zero"));
        let model = SphericalKMeans::fit(&x, &KMeansConfig::new(2)).unwrap();
        let wide = Features::from_rows(&[[1.0f32, 0.0, 0.0]]).unwrap();
        assert!(model
            .predict(&wide)
            .unwrap_err()
            .to_string()
            .contains("dimension 3"));
        let labels_err = clustering_scores(&x, None, &x, &[0], 2, 1, 0).unwrap_err();
        assert!(labels_err.to_string().contains("1 validation labels for 2"));
    }

    #[test]
    fn spectral_clustering_separates_two_blobs() {
        let mut rng = Rng::new(3);
        let centres = vec![vec![1.0, 0.2, 0.0, 0.0, 0.0], vec![0.0, 0.2, 1.0, 0.0, 0.0]];
        let (x, y) = blobs(&centres, 40, 0.05, &mut rng);
        let labels = spectral_clustering(&x, 2, &SpectralConfig::default()).unwrap();
        assert_eq!(adjusted_rand_index(&y, &labels).unwrap(), 1.0);
        let emb = SpectralEmbedding::new(&x, 10, 3).unwrap();
        // Two connected components: the Laplacian has eigenvalue 0 twice.
        assert!(
            emb.laplacian_eigenvalues[0].abs() < 1e-10
                && emb.laplacian_eigenvalues[1].abs() < 1e-10
        );
        assert!(emb.laplacian_eigenvalues[2] > 1e-3);
        assert_eq!(emb.embedding(3).unwrap().d, 3);
        assert!(emb.embedding(0).is_err());
        assert!(emb.embedding(4).is_err());
        let few = rng.features(5, 3);
        let err = SpectralEmbedding::new(&few, 10, 2).unwrap_err().to_string();
        assert!(err.contains("too few"), "{err}");
        assert!(SpectralEmbedding::new(&x, 10, 0).is_err());
    }

    /// The previous solver: nalgebra's one-thread dense `SymmetricEigen` of `D^{-1/2} A D^{-1/2}`,
    /// the `k` largest eigenvalues (descending, ties by index) and their eigenvectors.
    fn dense_reference(s: &SparseSymmetric, k: usize) -> (Vec<f64>, DMatrix<f64>) {
        let dense = s.dense();
        let m = DMatrix::from_fn(s.n, s.n, |i, j| dense[(i, j)]);
        let eig = nalgebra::SymmetricEigen::new(m);
        let mut order: Vec<usize> = (0..s.n).collect();
        order.sort_by(|&a, &b| {
            eig.eigenvalues[b]
                .total_cmp(&eig.eigenvalues[a])
                .then(a.cmp(&b))
        });
        let values = order[..k].iter().map(|&j| eig.eigenvalues[j]).collect();
        let vectors = DMatrix::from_fn(s.n, k, |i, c| eig.eigenvectors[(i, order[c])]);
        (values, vectors)
    }

    /// Largest entry of `P_a − P_b` for the orthogonal projectors onto the column spans.
    fn projector_difference(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
        (a * a.transpose() - b * b.transpose()).amax()
    }

    #[test]
    fn block_krylov_matches_the_dense_solver() {
        let mut rng = Rng::new(4);
        // 600 rows around 12 centres (one cluster each), and unstructured rows.
        let centres: Vec<Vec<f64>> = (0..12)
            .map(|_| (0..16).map(|_| rng.normal()).collect())
            .collect();
        let (clustered, _) = blobs(&centres, 50, 0.6, &mut rng);
        for (x, k) in [
            (clustered, 12),
            (rng.features(600, 16), 5),
            (rng.features(600, 16), 40),
        ] {
            let (s, _) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
            let (values, vectors) = top_eigenpairs(&s, k).unwrap();
            let (want, want_vectors) = dense_reference(&s, k);
            for (c, (v, w)) in values.iter().zip(&want).enumerate() {
                assert!((v - w).abs() < 1e-12, "k = {k}: eigenvalue {c}: {v} vs {w}");
            }
            let got = DMatrix::from_fn(x.n, k, |i, c| vectors[(i, c)]);
            let diff = projector_difference(&got, &want_vectors);
            assert!(diff < 1e-7, "k = {k}: eigenvector spans differ by {diff}");
        }
    }

    #[test]
    fn spectral_clustering_matches_the_dense_solver() {
        let mut rng = Rng::new(5);
        let centres: Vec<Vec<f64>> = (0..8)
            .map(|_| (0..32).map(|_| rng.normal()).collect())
            .collect();
        let (x, y) = blobs(&centres, 100, 0.9, &mut rng);
        let k = centres.len();
        let labels = spectral_clustering(&x, k, &SpectralConfig::default()).unwrap();
        // The old pipeline: dense eigenvectors, the same k-means.
        let (s, inv_sqrt_deg) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
        let (_, vectors) = dense_reference(&s, k);
        let (vectors, inv_sqrt_deg) = (&vectors, &inv_sqrt_deg);
        let data: Vec<f32> = (0..x.n)
            .flat_map(|i| (0..k).map(move |c| (vectors[(i, c)] * inv_sqrt_deg[i]) as f32))
            .collect();
        let points = Points::new(&data, x.n, k, Geometry::Euclidean);
        let cfg = KMeansConfig {
            k,
            restarts: DEFAULT_RESTARTS,
            max_iter: SPECTRAL_MAX_ITER,
            seed: 0,
        };
        let reference = best_run(&points, &cfg).unwrap().assignment.labels;
        assert_eq!(adjusted_rand_index(&reference, &labels).unwrap(), 1.0);
        assert!(adjusted_rand_index(&y, &labels).unwrap() > 0.5);
    }

    #[test]
    fn block_krylov_finds_every_connected_component() {
        // Five far-apart tight blobs: the kNN graph has five components, eigenvalue 1 of
        // D^{-1/2} A D^{-1/2} five times, which a single Lanczos vector could not resolve.
        let mut rng = Rng::new(6);
        let centres = basis_centres(5, 8, 10.0);
        let (x, _) = blobs(&centres, 30, 0.05, &mut rng);
        let (s, _) = SparseSymmetric::normalized_affinity(&nearest_neighbours(&x, 10));
        let (values, _) = top_eigenpairs(&s, 6).unwrap();
        for v in &values[..5] {
            assert!((v - 1.0).abs() < 1e-10, "{values:?}");
        }
        assert!(values[5] < 1.0 - 1e-3, "{values:?}");
    }
}
