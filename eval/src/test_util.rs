//! Deterministic pseudo-random data for the unit tests (no `rand` dependency).

use crate::Features;

/// Whether `got` is within `rel` of `want`, relative to `|want|`.
pub(crate) fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs().max(1e-300)
}

/// Whether `got` is within `tol` of `want`: absolutely where `|want| ≤ 1`, relatively above.
pub(crate) fn close_or_small(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol * want.abs().max(1.0)
}

/// xorshift64* generator with uniform and Gaussian draws.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `n × d` standard-normal features.
    pub(crate) fn features(&mut self, n: usize, d: usize) -> Features {
        let data = (0..n * d).map(|_| self.normal() as f32).collect();
        Features::new(data, n, d).expect("consistent shape")
    }

    /// A `d × d` orthogonal matrix (row-major, `f64`): Gram–Schmidt on Gaussian columns.
    pub(crate) fn orthogonal(&mut self, d: usize) -> Vec<f64> {
        let mut cols: Vec<Vec<f64>> = Vec::with_capacity(d);
        while cols.len() < d {
            let mut v: Vec<f64> = (0..d).map(|_| self.normal()).collect();
            for c in &cols {
                let p: f64 = v.iter().zip(c).map(|(a, b)| a * b).sum();
                v.iter_mut().zip(c).for_each(|(a, b)| *a -= p * b);
            }
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            if norm > 1e-6 {
                v.iter_mut().for_each(|a| *a /= norm);
                cols.push(v);
            }
        }
        (0..d * d).map(|idx| cols[idx % d][idx / d]).collect()
    }
}

/// `x · m` for an `n × d` feature matrix and a row-major `d × p` matrix `m`, in `f64`, rounded to
/// `f32`.
pub(crate) fn matmul(x: &Features, m: &[f64], p: usize) -> Features {
    assert_eq!(m.len(), x.d * p);
    let data = x
        .data
        .chunks(x.d)
        .flat_map(|row| {
            (0..p).map(move |c| {
                row.iter()
                    .enumerate()
                    .map(|(j, &v)| f64::from(v) * m[j * p + c])
                    .sum::<f64>() as f32
            })
        })
        .collect();
    Features::new(data, x.n, p).expect("consistent shape")
}
