//! Spectral metrics (`docs/spec/metrics.md` §4, §5), the covariance eigenvalue trajectories of
//! FroSSL (§12) and the per-dimension standardisation of spec §0.
//!
//! Singular values are obtained as square roots of the eigenvalues of the smaller Gram matrix
//! (`ZᵀZ` when `d ≤ n`, else `ZZᵀ`) computed in `f64` with nalgebra's symmetric eigenvalue solver.
//! Eigenvalues below `λ_max · max(n, d) · ε_f64` (round-off level of the Gram matrix) are set to
//! 0, so exactly rank-deficient inputs get exactly zero singular values.

use anyhow::{ensure, Result};
use nalgebra::DMatrix;

use crate::Features;

/// Default RankMe ε (spec §4).
pub const RANKME_EPS: f64 = 1e-7;

/// Singular values of `Z` (uncentred), descending, `min(n, d)` of them.
pub fn singular_values(z: &Features) -> Result<Vec<f64>> {
    ensure!(
        !z.is_empty(),
        "singular values of an empty {}×{} matrix",
        z.n,
        z.d
    );
    let m = DMatrix::from_fn(z.n, z.d, |i, j| f64::from(z.data[i * z.d + j]));
    Ok(singular_values_of(&m))
}

/// Eigenvalues of the smaller Gram of `m` (`mᵀm` when `d ≤ n`, else `mmᵀ`): the squared
/// singular values, padded with zeros to `min(n, d)`. Eigenvalues only, no eigenvectors.
fn gram_eigenvalues(m: &DMatrix<f64>) -> Vec<f64> {
    let (n, d) = m.shape();
    // `mᵀ·m` as a product, not `tr_mul`: nalgebra hands products to the blocked
    // `matrixmultiply` GEMM, `tr_mul` to one dot product per entry (10× slower at d = 2352).
    let gram = if d <= n {
        m.transpose() * m
    } else {
        m * m.transpose()
    };
    gram.symmetric_eigenvalues().iter().copied().collect()
}

fn singular_values_of(m: &DMatrix<f64>) -> Vec<f64> {
    let (n, d) = m.shape();
    let mut eig = gram_eigenvalues(m);
    let lmax = eig.iter().copied().fold(0.0f64, f64::max);
    let floor = lmax * n.max(d) as f64 * f64::EPSILON;
    for v in eig.iter_mut() {
        *v = if *v <= floor { 0.0 } else { v.sqrt() };
    }
    eig.sort_by(|a, b| b.total_cmp(a));
    eig
}

/// RankMe (spec §4): `exp(−Σ p_k log p_k)`, `p_k = σ_k / Σσ + ε` over all `min(n, d)` singular
/// values of the uncentred matrix (`0·log 0 = 0` when `ε = 0`). Default `ε` = [`RANKME_EPS`].
pub fn rankme(z: &Features, eps: f64) -> Result<f64> {
    ensure!(eps >= 0.0, "RankMe: eps must be non-negative (got {eps})");
    rankme_of(&singular_values(z)?, eps)
}

fn rankme_of(sv: &[f64], eps: f64) -> Result<f64> {
    let total: f64 = sv.iter().sum();
    ensure!(total > 0.0, "RankMe: the embedding matrix is zero");
    Ok(entropy_exp(sv.iter().map(|s| s / total + eps)))
}

/// `(RankMe, effective rank)` of features whose columns are centred (e.g. [`standardize`]d), from
/// one decomposition: there the two are functions of the same singular values. Errors when a
/// column mean is not zero (relative to the column's scale), where they are not.
pub fn centred_ranks(z: &Features, eps: f64) -> Result<(f64, f64)> {
    ensure!(eps >= 0.0, "RankMe: eps must be non-negative (got {eps})");
    let means = column_means(z);
    for (j, mean) in means.iter().enumerate() {
        let scale = (0..z.n)
            .map(|i| f64::from(z.data[i * z.d + j]).abs())
            .fold(0.0, f64::max);
        ensure!(
            mean.abs() <= 1e-6 * scale.max(f64::MIN_POSITIVE),
            "centred_ranks: column {j} has mean {mean}, not 0; standardise the features first"
        );
    }
    let sv = singular_values(z)?;
    Ok((rankme_of(&sv, eps)?, effective_rank_of(&sv)?))
}

/// Effective rank (spec §5): entropy of the normalised singular values of the column-centred
/// matrix, zero singular values dropped, no ε.
pub fn effective_rank(z: &Features) -> Result<f64> {
    ensure!(
        !z.is_empty(),
        "effective rank of an empty {}×{} matrix",
        z.n,
        z.d
    );
    let mean = column_means(z);
    let m = DMatrix::from_fn(z.n, z.d, |i, j| f64::from(z.data[i * z.d + j]) - mean[j]);
    effective_rank_of(&singular_values_of(&m))
}

fn effective_rank_of(sv: &[f64]) -> Result<f64> {
    let total: f64 = sv.iter().sum();
    ensure!(
        total > 0.0,
        "effective rank: the centred embedding matrix is zero"
    );
    Ok(entropy_exp(sv.iter().map(|s| s / total)))
}

/// Standardises each dimension over the samples (zero mean, population std 1); a
/// zero-variance dimension becomes all zeros (spec §0).
pub fn standardize(z: &Features) -> Features {
    if z.is_empty() {
        return z.clone();
    }
    let mean = column_means(z);
    let mut var = vec![0.0f64; z.d];
    for row in z.data.chunks(z.d) {
        for ((s, &v), m) in var.iter_mut().zip(row).zip(&mean) {
            let c = f64::from(v) - m;
            *s += c * c;
        }
    }
    let inv_sd: Vec<f64> = var
        .iter()
        .map(|s| {
            let sd = (s / z.n as f64).sqrt();
            if sd > 0.0 {
                1.0 / sd
            } else {
                0.0
            }
        })
        .collect();
    let data = z
        .data
        .chunks(z.d)
        .flat_map(|row| {
            row.iter()
                .zip(&mean)
                .zip(&inv_sd)
                .map(|((&v, m), s)| ((f64::from(v) - m) * s) as f32)
        })
        .collect();
    Features {
        data,
        n: z.n,
        d: z.d,
    }
}

/// Covariance spectrum of one view's embeddings (`docs/spec/metrics.md` §12).
#[derive(Debug, Clone, PartialEq)]
pub struct CovarianceSpectrum {
    /// The largest eigenvalues of `C = (Z − mean)ᵀ(Z − mean)/(N − 1)`, descending.
    pub eigenvalues: Vec<f64>,
    /// The same divided by `tr C` (the sum of all eigenvalues, not only the kept ones).
    pub normalized: Vec<f64>,
}

impl CovarianceSpectrum {
    /// `λ_1 / λ_k` over the kept eigenvalues (infinite when the last one is 0).
    pub fn condition_number(&self) -> f64 {
        match (self.eigenvalues.first(), self.eigenvalues.last()) {
            (Some(first), Some(last)) => first / last,
            _ => f64::NAN,
        }
    }
}

/// The top `k` eigenvalues of the covariance of `z` (`[N, d]`, N ≥ 2) and their trace-normalised
/// values. Works on the smaller of the `d×d` covariance and the `N×N` Gram of the centred rows
/// (same non-zero spectrum), so a 128 × 512 batch costs a 128 × 128 eigendecomposition.
pub fn covariance_spectrum(z: &Features, k: usize) -> Result<CovarianceSpectrum> {
    ensure!(
        z.n >= 2,
        "the covariance spectrum needs at least 2 rows, got {}",
        z.n
    );
    let means = column_means(z);
    let centred = DMatrix::from_fn(z.n, z.d, |i, j| f64::from(z.data[i * z.d + j]) - means[j]);
    let mut eigenvalues: Vec<f64> = gram_eigenvalues(&centred)
        .into_iter()
        .map(|v| (v / (z.n as f64 - 1.0)).max(0.0))
        .collect();
    eigenvalues.sort_by(|a, b| b.total_cmp(a));
    let trace: f64 = eigenvalues.iter().sum();
    eigenvalues.truncate(k);
    let normalized = eigenvalues
        .iter()
        .map(|v| if trace > 0.0 { v / trace } else { 0.0 })
        .collect();
    Ok(CovarianceSpectrum {
        eigenvalues,
        normalized,
    })
}

fn column_means(z: &Features) -> Vec<f64> {
    let mut mean = vec![0.0f64; z.d];
    for row in z.data.chunks(z.d) {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= z.n as f64);
    mean
}

/// `exp(−Σ p log p)` with `0·log 0 = 0`.
fn entropy_exp(p: impl Iterator<Item = f64>) -> f64 {
    let h: f64 = p.filter(|&v| v > 0.0).map(|v| -v * v.ln()).sum();
    h.exp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::close;

    #[test]
    fn centred_ranks_equal_the_two_metrics_on_standardised_features() {
        let z = Features::from_rows(&[
            [1.0f32, 2.0, 0.5],
            [0.3, -1.0, 2.0],
            [-2.0, 0.7, 1.1],
            [0.9, 0.1, -0.4],
            [1.5, -0.6, 0.2],
        ])
        .unwrap();
        let s = standardize(&z);
        let (r, e) = centred_ranks(&s, RANKME_EPS).unwrap();
        assert!((r - rankme(&s, RANKME_EPS).unwrap()).abs() < 1e-9);
        assert!((e - effective_rank(&s).unwrap()).abs() < 1e-9);
        let err = centred_ranks(&z, RANKME_EPS).unwrap_err().to_string();
        assert!(err.contains("standardise"), "{err}");
    }

    fn z() -> Features {
        Features::from_rows(&[[1.0f32, 0., 0.], [0., 2., 0.], [0., 0., 3.], [1., 1., 1.]]).unwrap()
    }

    #[test]
    fn rankme_kat() {
        let sv = singular_values(&z()).unwrap();
        for (s, w) in sv.iter().zip([3.2185243425, 2.2360679775, 1.2810546657]) {
            assert!(close(*s, w, 1e-9), "{sv:?}");
        }
        assert!(close(rankme(&z(), 1e-7).unwrap(), 2.8140041245, 1e-9));
        assert!(close(rankme(&z(), 0.0).unwrap(), 2.8140039836, 1e-9));
        assert!(close(rankme(&z(), RANKME_EPS).unwrap(), 2.8140041245, 1e-9));
    }

    #[test]
    fn rankme_invariants() {
        let base = rankme(&z(), 0.0).unwrap();
        // Scale invariance.
        for c in [0.5f32, 3.0, 1000.0] {
            let mut s = z();
            s.data.iter_mut().for_each(|v| *v *= c);
            assert!(close(rankme(&s, 0.0).unwrap(), base, 1e-9));
            assert!(close(
                rankme(&s, 1e-7).unwrap(),
                rankme(&z(), 1e-7).unwrap(),
                1e-9
            ));
        }
        // Orthogonal Q acting on the samples (a permutation with sign flips) — exact in f32.
        let zz = z();
        let perm = [2usize, 0, 3, 1];
        let rows: Vec<Vec<f32>> = perm
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let sign = if k % 2 == 0 { -1.0 } else { 1.0 };
                zz.row(i).iter().map(|v| sign * v).collect()
            })
            .collect();
        let q = Features::from_rows(&rows).unwrap();
        assert!(close(rankme(&q, 0.0).unwrap(), base, 1e-9));
        // Rank-one with ε = 0 → 1 (also in the wide, n < d, orientation).
        let u = [1.0f32, 2.0, 3.0, 4.0];
        let v = [1.0f32, 2.0, 0.5];
        let rows: Vec<Vec<f32>> = u
            .iter()
            .map(|a| v.iter().map(|b| a * b).collect())
            .collect();
        let r1 = Features::from_rows(&rows).unwrap();
        assert!(close(rankme(&r1, 0.0).unwrap(), 1.0, 1e-12));
        let rows_t: Vec<Vec<f32>> = v
            .iter()
            .map(|a| u.iter().map(|b| a * b).collect())
            .collect();
        assert!(close(
            rankme(&Features::from_rows(&rows_t).unwrap(), 0.0).unwrap(),
            1.0,
            1e-12
        ));
        assert!(rankme(&Features::new(vec![0.0; 6], 2, 3).unwrap(), 0.0).is_err());
        assert!(rankme(&Features::new(vec![], 0, 3).unwrap(), 0.0).is_err());
    }

    #[test]
    fn effective_rank_kat() {
        assert!(close(effective_rank(&z()).unwrap(), 2.6007928129, 1e-9));
        let e = effective_rank(&z()).unwrap();
        // Wide orientation (n < d): at most n − 1 after centring; two distinct rows → exactly 1.
        let wide = Features::from_rows(&[[1.0f32, 2.0, 0.0, 4.0], [0.0, 1.0, 3.0, 1.0]]).unwrap();
        assert!(close(effective_rank(&wide).unwrap(), 1.0, 1e-12));
        // RankMe of the same wide matrix uses the n × n Gram; compare with the transpose.
        let tall =
            Features::from_rows(&[[1.0f32, 0.0], [2.0, 1.0], [0.0, 3.0], [4.0, 1.0]]).unwrap();
        assert!(close(
            rankme(&wide, 0.0).unwrap(),
            rankme(&tall, 0.0).unwrap(),
            1e-9
        ));
        // Centring: a constant offset does not change it.
        let mut s = z();
        s.data.iter_mut().for_each(|v| *v += 5.0);
        assert!(close(effective_rank(&s).unwrap(), e, 1e-6));
    }

    #[test]
    fn standardize_matches_spec() {
        let f =
            Features::from_rows(&[[1.0f32, 2.0, 7.0], [3.0, 2.0, 7.5], [5.0, 2.0, 8.0]]).unwrap();
        let s = standardize(&f);
        let want = [
            -1.224744871,
            0.0,
            -1.224744871,
            0.0,
            0.0,
            0.0,
            1.224744871,
            0.0,
            1.224744871,
        ];
        for (g, w) in s.data.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{:?}", s.data);
        }
    }
    #[test]
    fn covariance_spectrum_known_answer_spec_12() -> Result<()> {
        let z = Features::new(
            vec![1., 0., 0.5, 0., 1., 0., 1., 1., 1., 0., 0., 1., 2., 1., 0.],
            5,
            3,
        )?;
        let s = covariance_spectrum(&z, 20)?;
        let expect = [0.7967051379, 0.3057764626, 0.1475183995];
        let expect_normalized = [0.6373641103, 0.2446211701, 0.1180147196];
        for k in 0..3 {
            assert!((s.eigenvalues[k] - expect[k]).abs() < 1e-6, "{s:?}");
            assert!(
                (s.normalized[k] - expect_normalized[k]).abs() < 1e-6,
                "{s:?}"
            );
        }
        assert!((s.condition_number() - expect[0] / expect[2]).abs() < 1e-5);
        // More columns than rows: the N×N Gram gives the same non-zero spectrum.
        let wide = Features::new(
            (0..3 * 8).map(|i| ((i * 7 % 11) as f32).sin()).collect(),
            3,
            8,
        )?;
        let tall = covariance_spectrum(&wide, 2)?;
        let mut cov = [[0f64; 8]; 8];
        let means = column_means(&wide);
        for (a, row) in cov.iter_mut().enumerate() {
            for (b, c) in row.iter_mut().enumerate() {
                *c = (0..3)
                    .map(|i| {
                        (f64::from(wide.data[i * 8 + a]) - means[a])
                            * (f64::from(wide.data[i * 8 + b]) - means[b])
                    })
                    .sum::<f64>()
                    / 2.0;
            }
        }
        let trace: f64 = (0..8).map(|a| cov[a][a]).sum();
        let sum: f64 = tall.eigenvalues.iter().sum();
        assert!(
            (sum - trace).abs() < 1e-9,
            "rank 2: the two eigenvalues carry the trace"
        );
        assert_eq!(tall.eigenvalues.len(), 2);
        Ok(())
    }
}
