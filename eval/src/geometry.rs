//! Alignment and uniformity (Wang & Isola; `docs/spec/metrics.md` §7), class-conditional alignment,
//! and the silhouette of the true classes (spec §13).
//!
//! Rows are L2-normalised first (`x / max(‖x‖, 1e-12)`). For the IConE pipeline, standardise
//! with [`crate::standardize`] before calling these (spec §0). Computed in `f64`; the pairwise
//! ones take their distances from blocks of the Gram matrix, `‖a‖² + ‖b‖² − 2⟨a, b⟩`.

use anyhow::{ensure, Result};
use nalgebra::DMatrix;
use rayon::prelude::*;

use crate::Features;

/// Default alignment exponent α.
pub const ALIGNMENT_ALPHA: f64 = 2.0;
/// Default uniformity temperature t.
pub const UNIFORMITY_T: f64 = 2.0;

/// `mean_i ‖z̃_i − z̃_i⁺‖²` over positive pairs (row `i` of `a` with row `i` of `b`).
pub fn alignment(a: &Features, b: &Features) -> Result<f64> {
    alignment_alpha(a, b, ALIGNMENT_ALPHA)
}

/// `mean_i ‖z̃_i − z̃_i⁺‖^α`.
pub fn alignment_alpha(a: &Features, b: &Features, alpha: f64) -> Result<f64> {
    ensure!(a.n > 0, "alignment: no samples");
    ensure!(
        a.n == b.n && a.d == b.d,
        "alignment: views have shapes {}×{} and {}×{}",
        a.n,
        a.d,
        b.n,
        b.d
    );
    ensure!(a.d > 0, "alignment: zero-dimensional features");
    ensure!(alpha > 0.0, "alignment: alpha must be positive");
    let (za, zb) = (a.normalized_rows_f64(), b.normalized_rows_f64());
    let d = a.d;
    let total: f64 = za
        .chunks(d)
        .zip(zb.chunks(d))
        .map(|(x, y)| sq_dist(x, y).sqrt().powf(alpha))
        .sum();
    Ok(total / a.n as f64)
}

/// `log mean_{i<j} exp(−2 ‖z̃_i − z̃_j‖²)`.
pub fn uniformity(z: &Features) -> Result<f64> {
    uniformity_t(z, UNIFORMITY_T)
}

/// `log mean_{i<j} exp(−t ‖z̃_i − z̃_j‖²)`, computed as a stable log-sum-exp minus `log` of the
/// pair count.
pub fn uniformity_t(z: &Features, t: f64) -> Result<f64> {
    ensure!(
        z.n >= 2,
        "uniformity needs at least 2 samples (got {})",
        z.n
    );
    ensure!(z.d > 0, "uniformity: zero-dimensional features");
    ensure!(t > 0.0, "uniformity: t must be positive");
    // Per anchor i: (max, Σ exp(v − max)) over j > i.
    let partial: Vec<(f64, f64)> = pairwise_sq_distances(z, |i, d2| {
        let vals = &d2[i + 1..];
        let m = vals
            .iter()
            .map(|&v| -t * v)
            .fold(f64::NEG_INFINITY, f64::max);
        (m, vals.iter().map(|&v| (-t * v - m).exp()).sum())
    });
    let m = partial
        .iter()
        .map(|p| p.0)
        .fold(f64::NEG_INFINITY, f64::max);
    let s: f64 = partial.iter().map(|(mi, si)| si * (mi - m).exp()).sum();
    let pairs = z.n as f64 * (z.n as f64 - 1.0) / 2.0;
    Ok(m + s.ln() - pairs.ln())
}

/// Mean of `‖z̃_i − z̃_j‖²` over unordered pairs `i < j` with equal labels.
pub fn class_conditional_alignment(z: &Features, labels: &[u32]) -> Result<f64> {
    ensure!(
        labels.len() == z.n,
        "class-conditional alignment: {} labels for {} samples",
        labels.len(),
        z.n
    );
    ensure!(
        z.d > 0,
        "class-conditional alignment: zero-dimensional features"
    );
    let (sum, count) = pairwise_sq_distances(z, |i, d2| {
        let mut acc = (0.0f64, 0usize);
        for j in i + 1..z.n {
            if labels[i] == labels[j] {
                acc.0 += d2[j];
                acc.1 += 1;
            }
        }
        acc
    })
    .into_iter()
    .fold((0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    ensure!(
        count > 0,
        "class-conditional alignment: no pair of samples shares a label"
    );
    Ok(sum / count as f64)
}

/// Silhouette of the true classes (spec §13): mean over samples of `(b_i − a_i)/max(a_i, b_i)`,
/// `a_i` the mean Euclidean distance to the other members of its class, `b_i` the smallest mean
/// distance to another class; a sample alone in its class scores 0 (scikit-learn's rule).
pub fn silhouette(z: &Features, labels: &[u32]) -> Result<f64> {
    ensure!(
        labels.len() == z.n,
        "silhouette: {} labels for {} samples",
        labels.len(),
        z.n
    );
    let mut classes: Vec<u32> = labels.to_vec();
    classes.sort_unstable();
    classes.dedup();
    ensure!(
        classes.len() >= 2,
        "silhouette: needs at least two classes, got {}",
        classes.len()
    );
    let class_of: Vec<usize> = labels
        .iter()
        .map(|y| classes.binary_search(y).expect("collected above"))
        .collect();
    let mut sizes = vec![0usize; classes.len()];
    for &c in &class_of {
        sizes[c] += 1;
    }
    let total: f64 = pairwise_sq_distances(z, |i, d2| {
        let mut sums = vec![0f64; classes.len()];
        for (j, &d2) in d2.iter().enumerate() {
            if j != i {
                sums[class_of[j]] += d2.sqrt();
            }
        }
        let own = class_of[i];
        if sizes[own] < 2 {
            return 0.0;
        }
        let a = sums[own] / (sizes[own] - 1) as f64;
        let b = (0..classes.len())
            .filter(|&c| c != own)
            .map(|c| sums[c] / sizes[c] as f64)
            .fold(f64::INFINITY, f64::min);
        match a.max(b) {
            m if m > 0.0 => (b - a) / m,
            _ => 0.0,
        }
    })
    .into_iter()
    .sum();
    Ok(total / z.n as f64)
}

/// Rows of the Gram product per block, enough for the blocked GEMM path and small enough
/// (`n × 256` values) to stay in cache-friendly pieces.
const GRAM_BLOCK: usize = 256;

/// `per_row(i, d2)` for every row `i` of `z`, with `d2[j] = ‖z̃_i − z̃_j‖²` over all rows `j` of
/// the L2-normalised features (`d2[i] = 0`, rounding below 0 clamped), from one `[n, d] × [d, b]`
/// product per block of rows, blocks in parallel; results in row order.
fn pairwise_sq_distances<R, F>(z: &Features, per_row: F) -> Vec<R>
where
    R: Send,
    F: Fn(usize, &[f64]) -> R + Sync,
{
    let (n, d) = (z.n, z.d);
    let zn = z.normalized_rows_f64();
    let sq_norms: Vec<f64> = zn
        .chunks(d.max(1))
        .map(|r| r.iter().map(|v| v * v).sum())
        .collect();
    // Column j of `columns` is row j; `rows` is its transpose, [n, d].
    let columns = DMatrix::from_column_slice(d, n, &zn);
    let rows = columns.transpose();
    let starts: Vec<usize> = (0..n).step_by(GRAM_BLOCK).collect();
    let blocks: Vec<Vec<R>> = starts
        .into_par_iter()
        .map(|start| {
            let b = GRAM_BLOCK.min(n - start);
            let gram = &rows * columns.columns(start, b);
            (0..b)
                .map(|k| {
                    let i = start + k;
                    let mut d2: Vec<f64> = gram
                        .column(k)
                        .iter()
                        .zip(&sq_norms)
                        .map(|(g, nj)| (sq_norms[i] + nj - 2.0 * g).max(0.0))
                        .collect();
                    d2[i] = 0.0;
                    per_row(i, &d2)
                })
                .collect()
        })
        .collect();
    blocks.into_iter().flatten().collect()
}

fn sq_dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::close_or_small;

    #[test]
    fn alignment_uniformity_kat() {
        let a = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0], [-1.0, 0.0]]).unwrap();
        let b = Features::from_rows(&[[1.0f32, 1.0], [0.0, 1.0], [-1.0, -1.0]]).unwrap();
        assert!(close_or_small(
            alignment(&a, &b).unwrap(),
            0.3905242918,
            1e-9
        ));
        assert!(close_or_small(uniformity(&a).unwrap(), -4.3963489672, 1e-9));
        // Scaling rows does not matter (rows are normalised).
        let a3 = Features::from_rows(&[[3.0f32, 0.0], [0.0, 0.5], [-7.0, 0.0]]).unwrap();
        assert!(close_or_small(
            uniformity(&a3).unwrap(),
            -4.3963489672,
            1e-9
        ));
    }

    #[test]
    fn uniformity_extremes() {
        let collapsed = Features::from_rows(&[[1.0f32, 2.0]; 5]).unwrap();
        assert!(uniformity(&collapsed).unwrap().abs() < 1e-12);
        let antipodal = Features::from_rows(&[[1.0f32, 0.0], [-1.0, 0.0]]).unwrap();
        assert!(close_or_small(uniformity(&antipodal).unwrap(), -8.0, 1e-12));
        assert!(uniformity(&Features::from_rows(&[[1.0f32, 0.0]]).unwrap()).is_err());
    }

    /// The Gram-block distances against the direct ones on random features, a zero row and a
    /// duplicate included, across several blocks.
    #[test]
    fn blocked_distances_equal_the_direct_ones() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (n, d) = (2 * GRAM_BLOCK + 37, 19);
        let mut data: Vec<f32> = (0..n * d).map(|_| rng.random_range(-1.0..1.0)).collect();
        data[..d].fill(0.0);
        let copy = data[2 * d..3 * d].to_vec();
        data[5 * d..6 * d].copy_from_slice(&copy);
        let z = Features::new(data, n, d).unwrap();
        let zn = z.normalized_rows_f64();
        let rows: Vec<&[f64]> = zn.chunks(d).collect();
        let worst = pairwise_sq_distances(&z, |i, d2| {
            (0..n)
                .map(|j| (d2[j] - sq_dist(rows[i], rows[j])).abs())
                .fold(0.0, f64::max)
        });
        assert!(
            worst.iter().all(|&e| e < 1e-12),
            "{:?}",
            worst.iter().fold(0.0f64, |a, &b| a.max(b))
        );
    }

    #[test]
    fn class_conditional_kat() {
        let x =
            Features::from_rows(&[[1.0f32, 0.0], [0.6, 0.8], [0.0, -1.0], [-0.6, -0.8]]).unwrap();
        let v = class_conditional_alignment(&x, &[0, 0, 1, 1]).unwrap();
        assert!(close_or_small(v, 0.6, 1e-6), "{v}");
        assert!(class_conditional_alignment(&x, &[0, 1, 2, 3]).is_err());
        assert!(class_conditional_alignment(&x, &[0, 1]).is_err());
    }

    #[test]
    fn silhouette_kat() {
        let x =
            Features::from_rows(&[[1.0f32, 0.0], [0.6, 0.8], [0.0, -1.0], [-0.6, -0.8]]).unwrap();
        let v = silhouette(&x, &[0, 0, 1, 1]).unwrap();
        assert!(close_or_small(v, 0.5666778394, 1e-6), "{v}");
        // Swapping the labels of one pair makes the clustering worse than chance.
        assert!(silhouette(&x, &[0, 1, 0, 1]).unwrap() < 0.0);
        assert!(silhouette(&x, &[0, 0, 0, 0]).is_err());
    }

    #[test]
    fn alignment_errors() {
        let a = Features::from_rows(&[[1.0f32, 0.0]]).unwrap();
        let b = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0]]).unwrap();
        assert!(alignment(&a, &b).is_err());
        assert!(alignment(&a, &a).unwrap().abs() < 1e-15);
    }
}
