//! Row-major `f32` feature matrices (`n` samples × `d` dimensions) shared by all metrics.

use anyhow::{ensure, Result};

/// Norm floor used by `normalize(x) = x / max(‖x‖₂, 1e-12)` (`docs/spec/metrics.md` §0).
pub(crate) const NORM_FLOOR: f64 = 1e-12;

/// A dense, row-major feature matrix: row `i` is `data[i*d .. (i+1)*d]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    /// Row-major values, `n * d` of them.
    pub data: Vec<f32>,
    /// Number of samples (rows).
    pub n: usize,
    /// Feature dimension (columns).
    pub d: usize,
}

impl Features {
    /// Wraps `data` as an `n × d` matrix; fails when `data.len() != n * d`.
    pub fn new(data: Vec<f32>, n: usize, d: usize) -> Result<Self> {
        let expected = n
            .checked_mul(d)
            .ok_or_else(|| anyhow::anyhow!("feature shape {n}×{d} overflows usize"))?;
        ensure!(
            data.len() == expected,
            "feature buffer has {} values, expected n*d = {n}*{d} = {expected}",
            data.len()
        );
        Ok(Self { data, n, d })
    }

    /// Builds a matrix from equally long rows (convenient for tests and small inputs).
    pub fn from_rows<R: AsRef<[f32]>>(rows: &[R]) -> Result<Self> {
        let n = rows.len();
        let d = rows.first().map_or(0, |r| r.as_ref().len());
        let mut data = Vec::with_capacity(n * d);
        for (i, r) in rows.iter().enumerate() {
            let r = r.as_ref();
            ensure!(r.len() == d, "row {i} has {} values, expected {d}", r.len());
            data.extend_from_slice(r);
        }
        Self::new(data, n, d)
    }

    /// Row `i` (panics if `i >= n`, like slice indexing).
    pub fn row(&self, i: usize) -> &[f32] {
        assert!(i < self.n, "row index {i} out of range (n = {})", self.n);
        &self.data[i * self.d..(i + 1) * self.d]
    }

    /// Whether the matrix has no samples or no dimensions.
    pub fn is_empty(&self) -> bool {
        self.n == 0 || self.d == 0
    }

    /// Rows L2-normalised with `x / max(‖x‖, 1e-12)`, as row-major `f64`.
    pub(crate) fn normalized_rows_f64(&self) -> Vec<f64> {
        let mut out: Vec<f64> = self.data.iter().map(|&v| f64::from(v)).collect();
        if self.d > 0 {
            for row in out.chunks_mut(self.d) {
                let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
                let inv = 1.0 / norm.max(NORM_FLOOR);
                row.iter_mut().for_each(|v| *v *= inv);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_length_and_row_access() {
        assert!(Features::new(vec![0.0; 5], 2, 3).is_err());
        let f = Features::new((0..6).map(|v| v as f32).collect(), 2, 3).unwrap();
        assert_eq!(f.row(1), &[3.0, 4.0, 5.0]);
        assert!(!f.is_empty());
    }

    #[test]
    fn from_rows_rejects_ragged() {
        assert!(Features::from_rows(&[vec![1.0f32, 2.0], vec![3.0]]).is_err());
        let f = Features::from_rows(&[[1.0f32, 2.0], [3.0, 4.0]]).unwrap();
        assert_eq!((f.n, f.d), (2, 2));
    }

    #[test]
    fn normalisation_floors_zero_rows() {
        let f = Features::from_rows(&[[3.0f32, 4.0], [0.0, 0.0]]).unwrap();
        let z = f.normalized_rows_f64();
        assert!((z[0] - 0.6).abs() < 1e-12 && (z[1] - 0.8).abs() < 1e-12);
        assert_eq!(&z[2..], &[0.0, 0.0]);
    }
}
