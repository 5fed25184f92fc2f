//! Two-dimensional PCA projection for embedding plots (no spec section; conventions of
//! `docs/spec/metrics.md` §0: rows are samples, computations in `f64`).
//!
//! The data are centred over the samples and projected on the two leading eigenvectors of the
//! scatter matrix `S = X_cᵀ X_c`. The eigenproblem is solved on the smaller of `S` (`d × d`) and
//! the Gram matrix `X_c X_cᵀ` (`n × n`, same non-zero spectrum; directions recovered as
//! `v = X_cᵀ u / ‖X_cᵀ u‖`) with nalgebra's symmetric eigensolver.

use anyhow::{ensure, Result};
use nalgebra::{DMatrix, SymmetricEigen};

use crate::Features;

/// Projection of the centred rows of `z` (`n × d`, `n ≥ 2`, `d ≥ 1`) on its top-2 principal
/// directions: an `n × 2` matrix.
///
/// * Column `k` has zero mean and sum of squares `Σ_i p_ik² = λ_k(X_cᵀX_c)`, the `k`-th
///   eigenvalue of the **scatter** matrix; i.e. its variance with divisor `n − 1` is the `k`-th
///   eigenvalue of the unbiased sample covariance (divisor `n`: of the population covariance).
///   The two columns are uncorrelated.
/// * Sign convention: each direction is oriented so that its largest-magnitude loading (lowest
///   dimension index on ties) is positive, so the output is deterministic. Directions are unique
///   only when the eigenvalues are distinct; with a (near-)degenerate top pair any orthonormal
///   basis of that eigenspace may come out.
/// * Rank deficiency: a direction with zero variance gives an all-zero column (`n = 2` always has
///   a zero second column). For `d == 1` the second column is padded with zeros.
pub fn pca_2d(z: &Features) -> Result<Features> {
    let (_, _, proj) = principal_axes(z, 2)?;
    let mut data = vec![0.0f32; z.n * 2];
    for i in 0..z.n {
        for c in 0..proj.ncols() {
            data[i * 2 + c] = proj[(i, c)] as f32;
        }
    }
    Features::new(data, z.n, 2)
}

/// The top `min(k, d)` eigenvalues of `X_cᵀX_c` (descending), the matching unit directions
/// (`d × k'`, sign-fixed; a zero column for a null direction found through the Gram matrix) and
/// the projections `X_c V` (`n × k'`).
fn principal_axes(z: &Features, k: usize) -> Result<(Vec<f64>, DMatrix<f64>, DMatrix<f64>)> {
    ensure!(z.n >= 2, "PCA: needs at least 2 samples, got {}", z.n);
    ensure!(z.d > 0, "PCA: zero-dimensional features");
    ensure!(
        z.data.iter().all(|v| v.is_finite()),
        "PCA: the features contain NaN or infinity"
    );
    let (n, d) = (z.n, z.d);
    let mut xc = DMatrix::from_fn(n, d, |i, j| f64::from(z.data[i * d + j]));
    let mean = xc.row_mean();
    for mut row in xc.row_iter_mut() {
        row -= &mean;
    }
    let gram_path = d > n;
    let m = if gram_path {
        &xc * xc.transpose()
    } else {
        xc.tr_mul(&xc)
    };
    let SymmetricEigen {
        eigenvalues,
        eigenvectors,
    } = SymmetricEigen::new(m);
    let mut order: Vec<usize> = (0..eigenvalues.len()).collect();
    order.sort_by(|&a, &b| eigenvalues[b].total_cmp(&eigenvalues[a]));
    let k = k.min(d);
    let lmax = eigenvalues[order[0]].max(0.0);
    let floor = lmax * n.max(d) as f64 * f64::EPSILON;
    let mut values = Vec::with_capacity(k);
    let mut dirs = DMatrix::<f64>::zeros(d, k);
    for (c, &idx) in order.iter().take(k).enumerate() {
        let lambda = eigenvalues[idx];
        values.push(if lambda <= floor { 0.0 } else { lambda });
        let mut v = if gram_path {
            if lambda <= floor {
                continue; // null direction: zero loadings, zero projections
            }
            let v = xc.tr_mul(&eigenvectors.column(idx));
            let norm = v.norm();
            v / norm
        } else {
            eigenvectors.column(idx).into_owned()
        };
        let lead = v.iter().enumerate().fold(
            0,
            |best, (j, x)| {
                if x.abs() > v[best].abs() {
                    j
                } else {
                    best
                }
            },
        );
        if v[lead] < 0.0 {
            v.neg_mut();
        }
        dirs.set_column(c, &v);
    }
    let proj = &xc * &dirs;
    Ok((values, dirs, proj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{matmul, Rng};

    fn column(p: &Features, c: usize) -> Vec<f64> {
        (0..p.n).map(|i| f64::from(p.data[i * p.d + c])).collect()
    }

    fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// Walsh–Hadamard column `j` of order 8: ±1 entries, zero sum, mutually orthogonal.
    fn walsh(j: usize) -> Vec<f64> {
        (0..8usize)
            .map(|i| {
                if (i & j).count_ones() & 1 == 0 {
                    1.0
                } else {
                    -1.0
                }
            })
            .collect()
    }

    #[test]
    fn known_axes() {
        // X = [5 h₁, 3 h₂, 1 h₄] Rᵀ + 7 with orthogonal zero-sum h: the scatter matrix has
        // eigenvalues 8·25 = 200, 8·9 = 72, 8 along R's columns.
        let h = [walsh(1), walsh(2), walsh(4)];
        let scales = [5.0, 3.0, 1.0];
        let base: Vec<[f32; 3]> = (0..8)
            .map(|i| std::array::from_fn(|c| (scales[c] * h[c][i]) as f32))
            .collect();
        let base = Features::from_rows(&base).unwrap();
        let mut rng = Rng::new(21);
        let r = rng.orthogonal(3);
        let rt: Vec<f64> = (0..9).map(|idx| r[(idx % 3) * 3 + idx / 3]).collect();
        let mut x = matmul(&base, &rt, 3);
        x.data.iter_mut().for_each(|v| *v += 7.0);

        let (values, dirs, _) = principal_axes(&x, 2).unwrap();
        assert!((values[0] - 200.0).abs() < 1e-4 && (values[1] - 72.0).abs() < 1e-4);
        // Directions are R's first two columns up to sign.
        for c in 0..2 {
            let rc: Vec<f64> = (0..3).map(|j| r[j * 3 + c]).collect();
            let cos = dot(dirs.column(c).as_slice(), &rc);
            assert!((cos.abs() - 1.0).abs() < 1e-6, "{cos}");
        }
        let p = pca_2d(&x).unwrap();
        assert_eq!((p.n, p.d), (8, 2));
        let (p0, p1) = (column(&p, 0), column(&p, 1));
        // Sum of squares = scatter eigenvalues (= (n − 1) × unbiased covariance eigenvalues).
        assert!((dot(&p0, &p0) - 200.0).abs() < 1e-4);
        assert!((dot(&p1, &p1) - 72.0).abs() < 1e-4);
        assert!(p0.iter().sum::<f64>().abs() < 1e-4 && p1.iter().sum::<f64>().abs() < 1e-4);
        assert!(dot(&p0, &p1).abs() < 1e-4, "correlated: {}", dot(&p0, &p1));
        // Coordinates are ±5 h₁ and ±3 h₂.
        let s0 = p0[0].signum();
        let s1 = p1[0].signum();
        for i in 0..8 {
            assert!((p0[i] - s0 * 5.0 * h[0][i]).abs() < 1e-5, "{p0:?}");
            assert!((p1[i] - s1 * 3.0 * h[1][i]).abs() < 1e-5, "{p1:?}");
        }
    }

    #[test]
    fn rotation_changes_at_most_the_signs() {
        let mut rng = Rng::new(8);
        let (n, d) = (60, 5);
        let mut x = rng.features(n, d);
        for row in x.data.chunks_mut(d) {
            for (j, v) in row.iter_mut().enumerate() {
                *v *= [4.0, 2.0, 1.0, 0.5, 0.25][j];
            }
        }
        let p = pca_2d(&x).unwrap();
        let q = rng.orthogonal(d);
        let pr = pca_2d(&matmul(&x, &q, d)).unwrap();
        for c in 0..2 {
            let (a, b) = (column(&p, c), column(&pr, c));
            let same = a.iter().zip(&b).all(|(u, v)| (u - v).abs() < 1e-4);
            let flipped = a.iter().zip(&b).all(|(u, v)| (u + v).abs() < 1e-4);
            assert!(same || flipped, "column {c}: {a:?} vs {b:?}");
        }
        // Deterministic, and the sign rule holds: the largest loading is positive.
        assert_eq!(pca_2d(&x).unwrap(), p);
        let (_, dirs, _) = principal_axes(&x, 2).unwrap();
        for c in 0..2 {
            let col = dirs.column(c);
            let lead = col
                .iter()
                .copied()
                .fold(0.0f64, |m, v| if v.abs() > m.abs() { v } else { m });
            assert!(lead > 0.0);
        }
    }

    #[test]
    fn wide_data_uses_the_gram_matrix() {
        // n < d: the Gram path gives unit, orthogonal directions and projections whose sums of
        // squares are the eigenvalues.
        let mut rng = Rng::new(4);
        let x = rng.features(4, 10);
        let (values, dirs, proj) = principal_axes(&x, 2).unwrap();
        for c in 0..2 {
            let pc: Vec<f64> = proj.column(c).iter().copied().collect();
            assert!((dot(&pc, &pc) - values[c]).abs() < 1e-9 * values[0]);
            assert!((dirs.column(c).norm() - 1.0).abs() < 1e-12);
        }
        assert!(dot(dirs.column(0).as_slice(), dirs.column(1).as_slice()).abs() < 1e-12);
        // The d × d path on the samples repeated three times (n = 12 ≥ d): the scatter triples,
        // the directions (sign rule included) are the same.
        let mut twice = x.data.clone();
        twice.extend_from_slice(&x.data);
        twice.extend_from_slice(&x.data);
        let x3 = Features::new(twice, 12, 10).unwrap();
        let (v3, d3, _) = principal_axes(&x3, 2).unwrap();
        for c in 0..2 {
            assert!((v3[c] - 3.0 * values[c]).abs() < 1e-9 * v3[0]);
            let cos = dot(d3.column(c).as_slice(), dirs.column(c).as_slice());
            assert!((cos - 1.0).abs() < 1e-9, "{cos}");
        }
        // Two samples: rank one, the second column is zero.
        let two = Features::from_rows(&[[1.0f32, 2.0, 3.0], [0.0, 1.0, 1.0]]).unwrap();
        let p = pca_2d(&two).unwrap();
        assert!(column(&p, 1).iter().all(|&v| v.abs() < 1e-6));
        assert!(column(&p, 0).iter().all(|&v| v.abs() > 0.1));
    }

    #[test]
    fn one_dimension_is_padded_and_errors() {
        let x = Features::from_rows(&[[1.0f32], [3.0], [2.0]]).unwrap();
        let p = pca_2d(&x).unwrap();
        assert_eq!(p.data, vec![-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
        assert!(pca_2d(&Features::from_rows(&[[1.0f32, 2.0]]).unwrap()).is_err());
        assert!(pca_2d(&Features::new(vec![], 3, 0).unwrap()).is_err());
        assert!(pca_2d(&Features::from_rows(&[[f32::NAN, 0.0], [1.0, 1.0]]).unwrap()).is_err());
    }
}
