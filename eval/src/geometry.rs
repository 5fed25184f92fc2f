//! Alignment and uniformity (Wang & Isola; spec §7), class-conditional alignment, and the
//! silhouette of the true classes (spec §13).
//!
//! Rows are L2-normalised first (`x / max(‖x‖, 1e-12)`). For the IConE pipeline, standardise
//! with [`crate::standardize`] before calling these (spec §0). Computed in `f64`.

use anyhow::{ensure, Result};
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
    let zn = z.normalized_rows_f64();
    let d = z.d;
    let rows: Vec<&[f64]> = zn.chunks(d).collect();
    // Per anchor i: (max, Σ exp(v − max)) over j > i.
    let partial: Vec<(f64, f64)> = (0..z.n - 1)
        .into_par_iter()
        .map(|i| {
            let vals: Vec<f64> = rows[i + 1..]
                .iter()
                .map(|r| -t * sq_dist(rows[i], r))
                .collect();
            let m = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (m, vals.iter().map(|v| (v - m).exp()).sum())
        })
        .collect();
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
    let zn = z.normalized_rows_f64();
    let d = z.d;
    let rows: Vec<&[f64]> = zn.chunks(d).collect();
    let (sum, count) = (0..z.n)
        .into_par_iter()
        .map(|i| {
            let mut acc = (0.0f64, 0usize);
            for j in i + 1..z.n {
                if labels[i] == labels[j] {
                    acc.0 += sq_dist(rows[i], rows[j]);
                    acc.1 += 1;
                }
            }
            acc
        })
        .reduce(|| (0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
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
    let zn = z.normalized_rows_f64();
    let rows: Vec<&[f64]> = zn.chunks(z.d.max(1)).collect();
    let class_of: Vec<usize> = labels
        .iter()
        .map(|y| classes.binary_search(y).expect("collected above"))
        .collect();
    let mut sizes = vec![0usize; classes.len()];
    for &c in &class_of {
        sizes[c] += 1;
    }
    let total: f64 = (0..z.n)
        .into_par_iter()
        .map(|i| {
            let mut sums = vec![0f64; classes.len()];
            for j in 0..z.n {
                if j != i {
                    sums[class_of[j]] += sq_dist(rows[i], rows[j]).sqrt();
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
        .sum();
    Ok(total / z.n as f64)
}

fn sq_dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    #[test]
    fn alignment_uniformity_kat() {
        let a = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0], [-1.0, 0.0]]).unwrap();
        let b = Features::from_rows(&[[1.0f32, 1.0], [0.0, 1.0], [-1.0, -1.0]]).unwrap();
        assert!(close(alignment(&a, &b).unwrap(), 0.3905242918, 1e-9));
        assert!(close(uniformity(&a).unwrap(), -4.3963489672, 1e-9));
        // Scaling rows does not matter (rows are normalised).
        let a3 = Features::from_rows(&[[3.0f32, 0.0], [0.0, 0.5], [-7.0, 0.0]]).unwrap();
        assert!(close(uniformity(&a3).unwrap(), -4.3963489672, 1e-9));
    }

    #[test]
    fn uniformity_extremes() {
        let collapsed = Features::from_rows(&[[1.0f32, 2.0]; 5]).unwrap();
        assert!(uniformity(&collapsed).unwrap().abs() < 1e-12);
        let antipodal = Features::from_rows(&[[1.0f32, 0.0], [-1.0, 0.0]]).unwrap();
        assert!(close(uniformity(&antipodal).unwrap(), -8.0, 1e-12));
        assert!(uniformity(&Features::from_rows(&[[1.0f32, 0.0]]).unwrap()).is_err());
    }

    #[test]
    fn class_conditional_kat() {
        let x =
            Features::from_rows(&[[1.0f32, 0.0], [0.6, 0.8], [0.0, -1.0], [-0.6, -0.8]]).unwrap();
        let v = class_conditional_alignment(&x, &[0, 0, 1, 1]).unwrap();
        assert!(close(v, 0.6, 1e-6), "{v}");
        assert!(class_conditional_alignment(&x, &[0, 1, 2, 3]).is_err());
        assert!(class_conditional_alignment(&x, &[0, 1]).is_err());
    }

    #[test]
    fn silhouette_kat() {
        let x =
            Features::from_rows(&[[1.0f32, 0.0], [0.6, 0.8], [0.0, -1.0], [-0.6, -0.8]]).unwrap();
        let v = silhouette(&x, &[0, 0, 1, 1]).unwrap();
        assert!(close(v, 0.5666778394, 1e-6), "{v}");
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
