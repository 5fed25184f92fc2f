//! LiDAR, the linear-discriminant rank of Thilak et al. (`docs/spec/metrics.md` §6).
//!
//! `n` clean samples act as surrogate classes, each seen through `q ≥ 2` augmented views. With
//! class means `μ_x`, grand mean `μ`, between-class scatter `Σ_b` and within-class scatter
//! `Σ_w` (+ `δ I`), LiDAR is the entropy-based effective rank of the eigenvalues of
//! `Σ_w^{−1/2} Σ_b Σ_w^{−1/2}`. The inverse square root is symmetric (eigendecomposition of
//! `Σ_w`), the product is symmetrised `½(A + Aᵀ)` before its eigendecomposition, and negative
//! eigenvalues (round-off) are clipped to 0. Everything is computed in `f64` with nalgebra.
//!
//! For the IConE pipeline, standardise the embeddings first (spec §0: [`crate::standardize`],
//! with statistics over all `n·q` views).

use anyhow::{ensure, Result};
use nalgebra::{DMatrix, SymmetricEigen};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::Features;

/// LiDAR hyper-parameters (spec §6 defaults: `δ = 1e-4`, `ε = 1e-8`, unbiased estimators).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LidarConfig {
    /// Ridge `δ` added to the within-class scatter (`Σ_w + δ I`).
    pub delta: f64,
    /// Smoothing `ε` added to every eigenvalue before normalisation.
    pub eps: f64,
    /// Plug-in estimators (`1/n` for `Σ_b`, `1/(nq)` for `Σ_w`, as written in the paper) instead
    /// of the unbiased `1/(n−1)` and `1/(n(q−1))`.
    pub plug_in: bool,
}

impl Default for LidarConfig {
    fn default() -> Self {
        Self {
            delta: 1e-4,
            eps: 1e-8,
            plug_in: false,
        }
    }
}

/// LiDAR of `q = views.len()` augmented views of `n` samples.
///
/// `views[i]` is an `n × d` matrix whose row `x` is the `i`-th view of sample `x`; all views must
/// have the same shape, `q ≥ 2` and `n ≥ 2`. Range `[1, min(d, n − 1)]` (up to the `ε`
/// smoothing, which pulls it towards `d`).
pub fn lidar(views: &[Features], cfg: LidarConfig) -> Result<f64> {
    let eig = lidar_eigenvalues(views, &cfg)?;
    let total: f64 = eig.iter().map(|l| l + cfg.eps).sum();
    ensure!(
        total > 0.0,
        "LiDAR: the between-class scatter is zero (all class means coincide) and eps = 0"
    );
    let h: f64 = eig
        .iter()
        .map(|l| (l + cfg.eps) / total)
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    Ok(h.exp())
}

/// Eigenvalues of `Σ_lidar` (clipped at 0), descending, `d` of them.
fn lidar_eigenvalues(views: &[Features], cfg: &LidarConfig) -> Result<Vec<f64>> {
    let (sb, sw) = scatter_matrices(views, cfg)?;
    let d = sb.nrows();
    let SymmetricEigen {
        eigenvalues,
        eigenvectors,
    } = SymmetricEigen::new(sw);
    let lmin = eigenvalues.iter().copied().fold(f64::INFINITY, f64::min);
    ensure!(
        lmin > 0.0,
        "LiDAR: the within-class scatter is singular (smallest eigenvalue {lmin:e}); use delta > 0"
    );
    // Σ_w^{−1/2} = V diag(λ^{−1/2}) Vᵀ.
    let scaled = DMatrix::from_fn(d, d, |i, j| eigenvectors[(i, j)] / eigenvalues[j].sqrt());
    let inv_sqrt = &scaled * eigenvectors.transpose();
    let a = &inv_sqrt * sb * &inv_sqrt;
    let sym = (&a + a.transpose()) * 0.5;
    let mut eig: Vec<f64> = sym
        .symmetric_eigenvalues()
        .iter()
        .map(|&l| l.max(0.0))
        .collect();
    eig.sort_by(|a, b| b.total_cmp(a));
    Ok(eig)
}

/// `(Σ_b, Σ_w + δ I)`, both `d × d`.
fn scatter_matrices(views: &[Features], cfg: &LidarConfig) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
    let q = views.len();
    ensure!(q >= 2, "LiDAR: needs at least 2 views per sample, got {q}");
    let (n, d) = (views[0].n, views[0].d);
    for (i, v) in views.iter().enumerate() {
        ensure!(
            v.n == n && v.d == d,
            "LiDAR: view {i} has shape {}×{}, view 0 has {n}×{d}",
            v.n,
            v.d
        );
    }
    ensure!(
        n >= 2,
        "LiDAR: needs at least 2 samples (surrogate classes), got {n}"
    );
    ensure!(d > 0, "LiDAR: zero-dimensional features");
    ensure!(
        cfg.delta.is_finite() && cfg.delta >= 0.0,
        "LiDAR: delta must be non-negative (got {})",
        cfg.delta
    );
    ensure!(
        cfg.eps.is_finite() && cfg.eps >= 0.0,
        "LiDAR: eps must be non-negative (got {})",
        cfg.eps
    );
    ensure!(
        views.iter().all(|v| v.data.iter().all(|x| x.is_finite())),
        "LiDAR: the embeddings contain NaN or infinity"
    );
    let to_f64 = |v: &Features| DMatrix::from_fn(n, d, |x, j| f64::from(v.data[x * d + j]));
    let mut means = DMatrix::<f64>::zeros(n, d);
    for v in views {
        means += to_f64(v);
    }
    means /= q as f64;
    let grand = means.row_mean();
    let mut centred_means = means.clone();
    for mut row in centred_means.row_iter_mut() {
        row -= &grand;
    }
    let (b_div, w_div) = if cfg.plug_in {
        (n as f64, (n * q) as f64)
    } else {
        ((n - 1) as f64, (n * (q - 1)) as f64)
    };
    let sb = centred_means.tr_mul(&centred_means) / b_div;
    // Within-class scatter, one view at a time (memory n × d instead of nq × d).
    let sw = views
        .par_iter()
        .map(|v| {
            let dev = to_f64(v) - &means;
            dev.tr_mul(&dev)
        })
        .reduce(|| DMatrix::zeros(d, d), |a, b| a + b)
        / w_div;
    let sw = sw + DMatrix::<f64>::identity(d, d) * cfg.delta;
    Ok((sb, sw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{close, matmul, Rng};

    /// The spec's views, regrouped as `views[i]` = the `i`-th view of x0, x1, x2.
    fn kat_views() -> Vec<Features> {
        let samples = [
            [[1.0f32, 0.0], [1.2, 0.1], [0.8, -0.1]],
            [[0.0, 1.0], [0.1, 1.3], [-0.1, 0.9]],
            [[-1.0, -1.0], [-0.9, -1.2], [-1.1, -0.8]],
        ];
        (0..3)
            .map(|i| Features::from_rows(&samples.map(|s| s[i])).unwrap())
            .collect()
    }

    #[test]
    fn lidar_kat() {
        let views = kat_views();
        let cfg = LidarConfig::default();
        let (sb, sw) = scatter_matrices(&views, &cfg).unwrap();
        let want_b = [[1.0, 0.5], [0.5, 1.0681481481]];
        let want_w = [[0.0201, 0.0066666667], [0.0066666667, 0.0312111111]];
        for i in 0..2 {
            for j in 0..2 {
                assert!(close(sb[(i, j)], want_b[i][j], 1e-6), "Σ_b = {sb}");
                assert!(close(sw[(i, j)], want_w[i][j], 1e-6), "Σ_w = {sw}");
            }
        }
        let eig = lidar_eigenvalues(&views, &cfg).unwrap();
        assert!(close(eig[0], 51.8922484024, 1e-6), "{eig:?}");
        assert!(close(eig[1], 27.0480671469, 1e-6), "{eig:?}");
        let v = lidar(&views, cfg).unwrap();
        assert!(close(v, 1.9017427702, 1e-6), "{v}");
        let plug_in = LidarConfig {
            plug_in: true,
            ..cfg
        };
        let v = lidar(&views, plug_in).unwrap();
        assert!(close(v, 1.9016598105, 1e-6), "{v}");
    }

    #[test]
    fn lidar_range_and_invariances() {
        let mut rng = Rng::new(11);
        let (n, q, d) = (40, 4, 6);
        // Sample means span only 3 of the 6 dimensions; views add isotropic noise.
        let mut centres = rng.features(n, d);
        for row in centres.data.chunks_mut(d) {
            row[3..].iter_mut().for_each(|v| *v = 0.0);
        }
        let views: Vec<Features> = (0..q)
            .map(|_| {
                let mut v = rng.features(n, d);
                for (a, c) in v.data.iter_mut().zip(&centres.data) {
                    *a = 0.1 * *a + 3.0 * c;
                }
                v
            })
            .collect();
        let cfg = LidarConfig::default();
        let base = lidar(&views, cfg).unwrap();
        assert!((1.0..=d as f64).contains(&base), "{base}");
        // Three discriminative directions dominate.
        assert!(base > 2.5 && base < 3.5, "{base}");
        // Invariant to an orthogonal transform and translation of the embedding space
        // (δ I is rotation invariant) — up to f32 rounding of the rotated inputs.
        let r = rng.orthogonal(d);
        let rotated: Vec<Features> = views
            .iter()
            .map(|v| {
                let mut w = matmul(v, &r, d);
                w.data.iter_mut().for_each(|a| *a += 2.0);
                w
            })
            .collect();
        let rot = lidar(&rotated, cfg).unwrap();
        assert!(close(rot, base, 1e-5), "{rot} vs {base}");
        // The order of the views does not matter.
        let reversed: Vec<Features> = views.iter().rev().cloned().collect();
        assert!(close(lidar(&reversed, cfg).unwrap(), base, 1e-9));
        // Identical views: Σ_w = δ I.
        let same = vec![views[0].clone(), views[0].clone()];
        let v = lidar(&same, cfg).unwrap();
        assert!((1.0..=d as f64).contains(&v));
    }

    #[test]
    fn lidar_errors() {
        let views = kat_views();
        let cfg = LidarConfig::default();
        assert!(lidar(&views[..1], cfg).is_err());
        assert!(lidar(&[], cfg).is_err());
        let one = Features::from_rows(&[[1.0f32, 0.0]]).unwrap();
        assert!(lidar(&[one.clone(), one], cfg).is_err());
        let wrong = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0]]).unwrap();
        assert!(lidar(&[views[0].clone(), wrong], cfg).is_err());
        let wide = Features::new(vec![0.0; 9], 3, 3).unwrap();
        assert!(lidar(&[views[0].clone(), wide], cfg).is_err());
        let bad = LidarConfig { delta: -1.0, ..cfg };
        assert!(lidar(&views, bad).is_err());
        let bad = LidarConfig {
            eps: f64::NAN,
            ..cfg
        };
        assert!(lidar(&views, bad).is_err());
        // δ = 0 with identical views: Σ_w = 0 is singular.
        let singular = LidarConfig { delta: 0.0, ..cfg };
        assert!(lidar(&[views[0].clone(), views[0].clone()], singular).is_err());
        // Collapsed class means with ε = 0: nothing to normalise.
        let a = Features::from_rows(&[[1.0f32, 0.0], [0.0, 1.0]]).unwrap();
        let b = Features::from_rows(&[[0.0f32, 1.0], [1.0, 0.0]]).unwrap();
        let no_eps = LidarConfig { eps: 0.0, ..cfg };
        assert!(lidar(&[a.clone(), b.clone()], no_eps).is_err());
        // … while ε > 0 spreads the mass evenly over the d eigenvalues.
        assert!(close(lidar(&[a, b], cfg).unwrap(), 2.0, 1e-9));
    }
}
