//! The kNN affinity graph and the random-walk pairing of SAG-VICReg (spec `docs/spec/objectives.md`
//! §2.16, steps 1–6 and "Pairing"), computed on the host in f64 from detached embeddings: the graph
//! is a constant of the loss (spec §6.13), and at `B ≤` a few hundred its `O(B²·d)` cost is small.

use anyhow::{ensure, Result};
use rand::Rng;

/// Smallest local scale `s_i`, so that a row whose nearest neighbours are tied stays finite.
pub const MIN_SCALE: f64 = 1e-7;

/// The sparse affinity `W` of `n` embeddings `Z` to `n` embeddings `Z'` (spec §2.16 steps 1–5):
/// row `i` keeps its `k` nearest columns `j` by cosine distance `D_ij = 1 − cos(z_i, z'_j)`,
/// `W_ij = exp(−(A_ij)²/s_i²)` with `A_ij = D_ij − min_j D_ij`, and `W_ij = 0` for every other `j`.
#[derive(Debug, Clone, PartialEq)]
pub struct Affinity {
    neighbours: Vec<Vec<usize>>,
    weights: Vec<Vec<f64>>,
    scales: Vec<f64>,
}

impl Affinity {
    /// Number of rows `n`.
    pub fn len(&self) -> usize {
        self.scales.len()
    }

    /// Whether there are no rows (never, for an affinity built by [`knn_affinity`]).
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }

    /// `[n][k]`: the `k` nearest columns of every row, by ascending `D_ij`, ties by smaller `j`.
    pub fn neighbours(&self) -> &[Vec<usize>] {
        &self.neighbours
    }

    /// `[n][k]`: `W_{i, neighbours[i][r]}`, aligned with [`Affinity::neighbours`]; the nearest
    /// neighbour (`r = 0`) has weight 1.
    pub fn weights(&self) -> &[Vec<f64>] {
        &self.weights
    }

    /// `[n]`: the local scales `s_i = max(percentile_q(A_i^(0..k−1)), 1e-7)`.
    pub fn scales(&self) -> &[f64] {
        &self.scales
    }

    /// `W_ij` (0 when `j` is not among row `i`'s neighbours or out of range).
    pub fn weight(&self, i: usize, j: usize) -> f64 {
        self.neighbours
            .get(i)
            .and_then(|row| row.iter().position(|&c| c == j))
            .map_or(0.0, |r| self.weights[i][r])
    }

    /// The pairing `i ↦ partners[i]` with its weights `W_{i, partners[i]}` (zero for a partner
    /// outside row `i`'s neighbours). `partners`: `[n]`, every entry `< n`.
    pub fn pairing(&self, partners: Vec<usize>) -> Result<Pairing> {
        let n = self.len();
        ensure!(
            partners.len() == n,
            "a pairing of {n} rows needs {n} partners, got {}",
            partners.len()
        );
        if let Some(&j) = partners.iter().find(|&&j| j >= n) {
            anyhow::bail!("pairing partner {j} is out of range for {n} rows");
        }
        let weights = partners
            .iter()
            .enumerate()
            .map(|(i, &j)| self.weight(i, j))
            .collect();
        Ok(Pairing { partners, weights })
    }
}

/// A drawn pairing: row `i` of `Z` is matched with row `j(i)` of `Z'`, weighted by `W_{i,j(i)}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pairing {
    partners: Vec<usize>,
    weights: Vec<f64>,
}

impl Pairing {
    /// Every row paired with its own other view at weight 1: VICReg's invariance.
    pub fn identity(n: usize) -> Self {
        Pairing {
            partners: (0..n).collect(),
            weights: vec![1.0; n],
        }
    }

    /// `[n]`: `j(i)`.
    pub fn partners(&self) -> &[usize] {
        &self.partners
    }

    /// `[n]`: `W_{i, j(i)}`.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// Fraction of rows paired with their own other view (`j(i) = i`).
    pub fn self_fraction(&self) -> f64 {
        let own = self.partners.iter().enumerate().filter(|&(i, &j)| i == j);
        own.count() as f64 / self.partners.len().max(1) as f64
    }
}

/// The `q`-th percentile of ascending `sorted` values with linear interpolation, exactly as numpy's
/// default `np.percentile(a, q)`: virtual index `t = (q/100)(m − 1)`, and
/// `lerp(a_⌊t⌋, a_⌊t⌋+1, t − ⌊t⌋)` evaluated from the nearer end. `sorted` non-empty,
/// `q ∈ [0, 100]`.
pub fn percentile_linear(sorted: &[f64], q: f64) -> f64 {
    let Some(&last) = sorted.last() else {
        return f64::NAN;
    };
    let index = q / 100.0 * (sorted.len() - 1) as f64;
    let below = index.floor() as usize;
    if below + 1 >= sorted.len() {
        return last;
    }
    let (a, b, t) = (sorted[below], sorted[below + 1], index - below as f64);
    if t >= 0.5 {
        b - (b - a) * (1.0 - t)
    } else {
        a + (b - a) * t
    }
}

/// Each row divided by `max(‖row‖₂, 1e-12)`.
fn normalize_rows(rows: &[Vec<f64>]) -> Vec<Vec<f64>> {
    rows.iter()
        .map(|r| {
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            r.iter().map(|x| x / norm).collect()
        })
        .collect()
}

/// `⟨x, y⟩` with four independent partial sums, which the compiler vectorises (a single
/// running f64 sum must be added in order and is not).
fn dot(x: &[f64], y: &[f64]) -> f64 {
    let mut partial = [0f64; 4];
    let (xs, ys) = (x.chunks_exact(4), y.chunks_exact(4));
    let tail: f64 = xs
        .remainder()
        .iter()
        .zip(ys.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xs.zip(ys) {
        for i in 0..4 {
            partial[i] += a[i] * b[i];
        }
    }
    partial.iter().sum::<f64>() + tail
}

/// The kNN affinity of `z` to `z_prime` (both `[n][d]`, f64 host rows) with `min(k, n)`
/// neighbours per row and the local scale at the `percentile`-th percentile (spec §2.16
/// steps 1–5; defaults `k = 5`, `percentile = 20`).
pub fn knn_affinity(
    z: &[Vec<f64>],
    z_prime: &[Vec<f64>],
    k: usize,
    percentile: f64,
) -> Result<Affinity> {
    let n = z.len();
    ensure!(
        n >= 1 && z_prime.len() == n,
        "the affinity needs the same non-zero number of rows in Z and Z', got {n} and {}",
        z_prime.len()
    );
    let d = z[0].len();
    ensure!(
        d >= 1 && z.iter().chain(z_prime).all(|r| r.len() == d),
        "the affinity needs rows of one non-zero width in Z and Z'"
    );
    ensure!(k >= 1, "the affinity needs k ≥ 1 neighbours, got {k}");
    ensure!(
        (0.0..=100.0).contains(&percentile),
        "the local-scale percentile must lie in [0, 100], got {percentile}"
    );
    let k = k.min(n);
    let a = normalize_rows(z);
    let b = normalize_rows(z_prime);
    let mut neighbours = Vec::with_capacity(n);
    let mut weights = Vec::with_capacity(n);
    let mut scales = Vec::with_capacity(n);
    for row in &a {
        let distances: Vec<f64> = b.iter().map(|col| 1.0 - dot(row, col)).collect();
        let nearer = |p: &usize, q: &usize| distances[*p].total_cmp(&distances[*q]).then(p.cmp(q));
        let mut order: Vec<usize> = (0..n).collect();
        order.select_nth_unstable_by(k - 1, nearer);
        order.truncate(k);
        order.sort_unstable_by(nearer);
        let nearest = distances[order[0]];
        let shifted: Vec<f64> = order.iter().map(|&j| distances[j] - nearest).collect();
        let scale = percentile_linear(&shifted, percentile).max(MIN_SCALE);
        weights.push(
            shifted
                .iter()
                .map(|a| (-(a * a) / (scale * scale)).exp())
                .collect(),
        );
        neighbours.push(order);
        scales.push(scale);
    }
    Ok(Affinity {
        neighbours,
        weights,
        scales,
    })
}

/// The random walk `P = Δ⁻¹W`, `Δ = diag(row sums of W)` (spec §2.16 step 6), sparse:
/// `[n][k]`, entry `r` of row `i` is `P_{i, neighbours[i][r]}`; every row sums to 1.
pub fn random_walk(affinity: &Affinity) -> Vec<Vec<f64>> {
    affinity
        .weights
        .iter()
        .map(|row| {
            let total: f64 = row.iter().sum();
            row.iter().map(|w| w / total).collect()
        })
        .collect()
}

/// Draws `j(i) ~ P_{i·}` independently for every row (one uniform number per row, in row
/// order, by inversion of the cumulative walk probabilities) and pairs `i` with `j(i)`.
pub fn sample_pairing(affinity: &Affinity, rng: &mut impl Rng) -> Pairing {
    let walk = random_walk(affinity);
    let (partners, weights) = affinity
        .neighbours
        .iter()
        .zip(&affinity.weights)
        .zip(&walk)
        .map(|((columns, w), p)| {
            let u: f64 = rng.random();
            let mut cumulative = 0.0;
            // Rounding can leave the cumulative sum just below 1: then the last neighbour is drawn.
            let r = p
                .iter()
                .position(|pr| {
                    cumulative += pr;
                    u < cumulative
                })
                .unwrap_or(p.len() - 1);
            (columns[r], w[r])
        })
        .unzip();
    Pairing { partners, weights }
}
