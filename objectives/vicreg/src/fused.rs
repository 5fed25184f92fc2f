//! [`vicreg_terms`](crate::vicreg_terms) on the CPU as one op each way.
//!
//! The composed terms (the mean view and the distances from it, each view centred
//! dimension-major, the per-dimension variances and their hinge, each view's smaller Gram
//! matrix and its squared sums) are about twenty Candle ops forward and more backward over
//! `[V, B, d]`; at the main job's `[2, 128, 512]` their dispatch and buffers cost more than the
//! Gram products. Here the forward is one pass per view plus its Gram product, and the backward
//! one pass plus one product per view, from what the forward kept.
//!
//! With `C_v` the view centred over the batch, `s_j = Σ_b C_bj²`, `σ_j = √(s_j/(B−1) + 1e-4)`,
//! `G_v = C_v C_vᵀ` (or `C_vᵀC_v` when `B > d`) and upstream gradients `g_i`, `g_v`, `g_c`:
//!
//! - invariance `(2/((V−1)Bd)) Σ_v ‖Z_v − Z̄‖²`: `∂/∂Z_v = (4/((V−1)Bd))·(Z_v − Z̄)`;
//! - variance `(1/(Vd)) Σ_v Σ_j relu(1 − σ_j)`: `∂/∂C_bj = −[σ_j < 1]·C_bj/((B−1)·σ_j·V·d)`;
//! - covariance `(2/(Vd)) Σ_v (‖G_v‖² − Σ_j s_j²)/(B−1)²`:
//!   `∂/∂C_v = (8/(Vd(B−1)²))·(G_v C_v − C_v diag(s))` (`C_v G_v` for the `d × d` Gram);
//!
//! and through the centring, `∂/∂Z = ∂/∂C − mean_b ∂/∂C`.

use candle_core::{Result, Shape, Tensor, WithDType};
use ssl_linalg::TermsKernel;
use ssl_linalg::{apply_terms, for_each_chunk_mut, smaller_gram_blocks, smaller_gram_times};

/// `[3]`: the unweighted invariance, variance and covariance terms of `z`: `[V, B, d]`.
pub(crate) fn terms(z: &Tensor) -> Result<Tensor> {
    apply_terms::<VicregTerms>(z)
}

/// The variance's epsilon under the square root (spec §2.3).
const EPS: f64 = 1e-4;

/// What the forward keeps for the backward.
pub(crate) struct Saved<T> {
    /// `[V, B, d]`: each view centred over the batch.
    centred: Vec<T>,
    /// `[V, d]`: each dimension's mean over the batch, which `centred` lacks.
    column_means: Vec<f64>,
    /// `[V, d]`: `s_j`, each dimension's sum of squares.
    squares: Vec<f64>,
    /// `[V, R, R]`: each view's smaller Gram matrix.
    gram: Vec<T>,
    /// `[B, d]`: the mean view.
    mean: Vec<f64>,
}

struct VicregTerms;

impl TermsKernel for VicregTerms {
    const NAME: &'static str = "ssl-vicreg-terms";
    type Saved<T: WithDType> = Saved<T>;

    fn terms_shape(_dims: &[usize]) -> Shape {
        Shape::from(3)
    }

    fn forward<T: WithDType>(z: &[T], dims: &[usize]) -> Result<(Vec<T>, Saved<T>)> {
        forward(z, (dims[0], dims[1], dims[2]))
    }

    fn backward<T: WithDType>(saved: &Saved<T>, grad: &[T], dims: &[usize]) -> Result<Vec<T>> {
        backward(saved, grad, (dims[0], dims[1], dims[2]))
    }
}

/// The terms `[3]` and what the backward needs, of `z`: `[V, B, d]`.
fn forward<T: WithDType>(z: &[T], (v, b, d): (usize, usize, usize)) -> Result<(Vec<T>, Saved<T>)> {
    let mut mean = vec![0f64; b * d];
    for view in z.chunks_exact(b * d) {
        for (m, x) in mean.iter_mut().zip(view) {
            *m += x.to_f64() / v as f64;
        }
    }
    let spread: f64 = z
        .chunks_exact(b * d)
        .flat_map(|view| view.iter().zip(&mean))
        .map(|(x, m)| (x.to_f64() - m) * (x.to_f64() - m))
        .sum();
    let mut centred = z.to_vec();
    let mut squares = vec![0f64; v * d];
    let mut column_means = vec![0f64; v * d];
    let mut hinge = 0f64;
    let per_view = centred
        .chunks_exact_mut(b * d)
        .zip(squares.chunks_exact_mut(d))
        .zip(column_means.chunks_exact_mut(d));
    for ((view, squares), column_mean) in per_view {
        for row in view.chunks_exact(d) {
            for (m, x) in column_mean.iter_mut().zip(row) {
                *m += x.to_f64() / b as f64;
            }
        }
        for row in view.chunks_exact_mut(d) {
            for ((x, m), s) in row
                .iter_mut()
                .zip(column_mean.iter())
                .zip(squares.iter_mut())
            {
                let c = x.to_f64() - m;
                *x = T::from_f64(c);
                *s += c * c;
            }
        }
        for s in squares.iter() {
            hinge += (1.0 - (s / (b as f64 - 1.0) + EPS).sqrt()).max(0.0);
        }
    }
    let gram = smaller_gram_blocks(&centred, (v, b, d))?;
    let r = b.min(d);
    let off_diagonal: f64 = gram
        .chunks_exact(r * r)
        .zip(squares.chunks_exact(d))
        .map(|(g, s)| {
            let total: f64 = g.iter().map(|x| x.to_f64() * x.to_f64()).sum();
            total - s.iter().map(|s| s * s).sum::<f64>()
        })
        .sum();
    let vd = (v * d) as f64;
    let out = [
        spread * 2.0 / ((v - 1) * b * d) as f64,
        hinge / vd,
        off_diagonal * 2.0 / (vd * (b as f64 - 1.0).powi(2)),
    ];
    let saved = Saved {
        centred,
        column_means,
        squares,
        gram,
        mean,
    };
    Ok((out.map(T::from_f64).to_vec(), saved))
}

/// `∂L/∂Z` from the gradients of the three terms.
fn backward<T: WithDType>(
    saved: &Saved<T>,
    grad: &[T],
    (v, b, d): (usize, usize, usize),
) -> Result<Vec<T>> {
    let [g_inv, g_var, g_cov] = [0, 1, 2].map(|i| grad[i].to_f64());
    // `G C` (or `C G`), every view.
    let mut out = smaller_gram_times(&saved.centred, &saved.gram, (v, b, d))?;
    let vd = (v * d) as f64;
    let n1 = b as f64 - 1.0;
    let cov_scale = g_cov * 8.0 / (vd * n1 * n1);
    let inv_scale = g_inv * 4.0 / ((v - 1) * b * d) as f64;
    for_each_chunk_mut(
        &mut out,
        b * d,
        Vec::new,
        |column_mean: &mut Vec<f64>, i, view| {
            let c = &saved.centred[i * b * d..][..b * d];
            let squares = &saved.squares[i * d..][..d];
            let var_scale: Vec<f64> = squares
                .iter()
                .map(|s| {
                    let sigma = (s / n1 + EPS).sqrt();
                    match sigma < 1.0 {
                        true => -g_var / (n1 * sigma * vd),
                        false => 0.0,
                    }
                })
                .collect();
            // ∂L/∂C, and its mean over the batch by dimension.
            column_mean.clear();
            column_mean.resize(d, 0.0);
            for (j, value) in view.iter_mut().enumerate() {
                let col = j % d;
                let x = c[j].to_f64();
                let g = cov_scale * (value.to_f64() - x * squares[col]) + var_scale[col] * x;
                *value = T::from_f64(g);
                column_mean[col] += g / b as f64;
            }
            let means = &saved.column_means[i * d..][..d];
            for (j, value) in view.iter_mut().enumerate() {
                let z = c[j].to_f64() + means[j % d];
                let invariance = inv_scale * (z - saved.mean[j]);
                *value = T::from_f64(value.to_f64() - column_mean[j % d] + invariance);
            }
        },
    );
    Ok(out)
}
