//! Spherical k-means on standardised features and the CARP protocol built on it (spec §9), and
//! the Lloyd iterations, k-means++ seeding and restarts that the spectral clustering's Euclidean
//! k-means shares.

use anyhow::{ensure, Result};
use nalgebra::{DMatrix, DMatrixView};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::scores::{clustering_metrics, ClusteringScores};
use crate::Features;

/// Default number of k-means restarts (CARP code: 10).
pub const DEFAULT_RESTARTS: usize = 10;
/// Default maximum number of Lloyd iterations per restart for the CARP protocol (spec §9).
pub const DEFAULT_MAX_ITER: usize = 100;

/// Rows per block of the assignment product.
pub(super) const BLOCK: usize = 512;
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
pub(super) enum Geometry {
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
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
pub(super) struct Points<'a> {
    data: &'a [f32],
    n: usize,
    d: usize,
    geometry: Geometry,
    /// Cost offset of every point ([`Geometry::offset`]).
    offsets: Vec<f64>,
}

impl<'a> Points<'a> {
    pub(super) fn new(data: &'a [f32], n: usize, d: usize, geometry: Geometry) -> Self {
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
pub(super) struct Assignment {
    pub(super) labels: Vec<u32>,
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
pub(super) struct Run {
    centroids: Vec<f32>,
    pub(super) assignment: Assignment,
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
pub(super) fn best_run(points: &Points, cfg: &KMeansConfig) -> Result<Run> {
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

pub(super) fn check_features(x: &Features, what: &str) -> Result<()> {
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
