//! [`frossl_terms`](crate::frossl_terms) on the CPU as one op each way.
//!
//! The composed form (column normalisation, Gram matrices, Frobenius and trace sums, the mean
//! view and the differences from it) is about a dozen Candle ops forward and twice as many
//! backward, each a pass over `[V, N, D]` with its own buffer; at the main job's 128 × 512
//! projections their dispatch and memory traffic cost more than the two Gram products. Here the
//! forward is one pass per view plus its Gram product, and the backward one pass plus one
//! product `K_v Ẑ_v` (or `Ẑ_v K_v`), from what the forward kept.
//!
//! With `Ẑ_v = Z_v / c` (column norms `c_j = max(‖Z_v[:, j]‖, 1e-12)`), `F_v = ‖K_v‖_F²`,
//! `reg_v = log F_v − 2 log sg(‖Ẑ_v‖_F²)` and `inv_v = (V/N)·‖Ẑ_v − Z̄‖_F²`, for output
//! gradients `r_v`, `s_v`:
//!
//! `∂L/∂Ẑ_v = r_v·(4/F_v)·K_v Ẑ_v + (2V/N)·(s_v (Ẑ_v − Z̄) − (1/V) Σ_w s_w (Ẑ_w − Z̄))`
//!
//! (`Ẑ_v K_v` where `K_v = Ẑ_vᵀẐ_v`), and through the normalisation, column by column,
//! `∂L/∂Z = (G − Ẑ ⟨G, Ẑ⟩) / c` (`G / c` for a column under the floor, as the composed
//! clamp passes no gradient).

use candle_core::{Result, Shape, Tensor, WithDType};
use ssl_linalg::TermsKernel;
use ssl_linalg::{apply_terms, for_each_chunk_mut, smaller_gram_blocks, smaller_gram_times};

/// `[2, V]`: each view's `reg_v` (row 0) and `inv_v` at λ = 1 (row 1) of `z`: `[V, N, D]`.
pub(crate) fn terms(z: &Tensor) -> Result<Tensor> {
    apply_terms::<FrosslTerms>(z)
}

/// The smallest column norm divided by (spec §0), as `normalize_columns`.
const NORM_FLOOR: f64 = 1e-12;

/// What the forward keeps for the backward.
pub(crate) struct Saved<T> {
    /// `[V, N, D]`: the normalised views.
    z_hat: Vec<T>,
    /// `[V, D]`: the column norms, `None` where a column was under the floor.
    norms: Vec<Option<f64>>,
    /// `[V, R, R]`: each view's smaller Gram matrix.
    gram: Vec<T>,
    /// `[V]`: `‖K_v‖_F²`.
    frobenius: Vec<f64>,
    /// `[N, D]`: the mean view `Z̄`.
    mean: Vec<f64>,
}

struct FrosslTerms;

impl TermsKernel for FrosslTerms {
    const NAME: &'static str = "ssl-frossl-terms";
    type Saved<T: WithDType> = Saved<T>;

    fn terms_shape(dims: &[usize]) -> Shape {
        Shape::from((2, dims[0]))
    }

    fn forward<T: WithDType>(z: &[T], dims: &[usize]) -> Result<(Vec<T>, Saved<T>)> {
        forward(z, (dims[0], dims[1], dims[2]))
    }

    fn backward<T: WithDType>(saved: &Saved<T>, grad: &[T], dims: &[usize]) -> Result<Vec<T>> {
        backward(saved, grad, (dims[0], dims[1], dims[2]))
    }
}

/// The terms `[2·V]` and what the backward needs, of `z`: `[V, N, D]`.
fn forward<T: WithDType>(z: &[T], (v, n, d): (usize, usize, usize)) -> Result<(Vec<T>, Saved<T>)> {
    let mut z_hat = z.to_vec();
    let mut norms = vec![None; v * d];
    for (view, norms) in z_hat.chunks_exact_mut(n * d).zip(norms.chunks_exact_mut(d)) {
        let mut sums = vec![0f64; d];
        for row in view.chunks_exact(d) {
            for (s, x) in sums.iter_mut().zip(row) {
                *s += x.to_f64() * x.to_f64();
            }
        }
        for (norm, s) in norms.iter_mut().zip(&sums) {
            let c = s.sqrt();
            *norm = (c >= NORM_FLOOR).then_some(c);
        }
        let inverse: Vec<f64> = norms
            .iter()
            .map(|c| 1.0 / c.unwrap_or(NORM_FLOOR))
            .collect();
        for row in view.chunks_exact_mut(d) {
            for (x, inv) in row.iter_mut().zip(&inverse) {
                *x = T::from_f64(x.to_f64() * inv);
            }
        }
    }
    let gram = smaller_gram_blocks(&z_hat, (v, n, d))?;
    let r = n.min(d);
    let frobenius: Vec<f64> = gram
        .chunks_exact(r * r)
        .map(|k| k.iter().map(|x| x.to_f64() * x.to_f64()).sum())
        .collect();
    let mut mean = vec![0f64; n * d];
    for view in z_hat.chunks_exact(n * d) {
        for (m, x) in mean.iter_mut().zip(view) {
            *m += x.to_f64() / v as f64;
        }
    }
    let mut out = vec![T::zero(); 2 * v];
    for (i, view) in z_hat.chunks_exact(n * d).enumerate() {
        let (mut trace, mut spread) = (0f64, 0f64);
        for (x, m) in view.iter().zip(&mean) {
            let x = x.to_f64();
            trace += x * x;
            spread += (x - m) * (x - m);
        }
        out[i] = T::from_f64(frobenius[i].ln() - 2.0 * trace.ln());
        out[v + i] = T::from_f64(spread * v as f64 / n as f64);
    }
    let saved = Saved {
        z_hat,
        norms,
        gram,
        frobenius,
        mean,
    };
    Ok((out, saved))
}

/// `∂L/∂Z` from the gradients of the terms, `[2, V]`.
fn backward<T: WithDType>(
    saved: &Saved<T>,
    grad: &[T],
    (v, n, d): (usize, usize, usize),
) -> Result<Vec<T>> {
    let (reg, inv): (Vec<f64>, Vec<f64>) = (0..v)
        .map(|i| (grad[i].to_f64(), grad[v + i].to_f64()))
        .unzip();
    // `K_v Ẑ_v` (or `Ẑ_v K_v`), every view.
    let mut out = smaller_gram_times(&saved.z_hat, &saved.gram, (v, n, d))?;
    // (1/V) Σ_w s_w (Ẑ_w − Z̄), the share of every view's invariance gradient through Z̄.
    let weight_sum: f64 = inv.iter().sum();
    let mut pull: Vec<f64> = saved.mean.iter().map(|m| -m * weight_sum).collect();
    for (z_w, s_w) in saved.z_hat.chunks_exact(n * d).zip(&inv) {
        for (p, x) in pull.iter_mut().zip(z_w) {
            *p += s_w * x.to_f64();
        }
    }
    let per_view = 2.0 * v as f64 / n as f64;
    for_each_chunk_mut(&mut out, n * d, Vec::new, |dots: &mut Vec<f64>, i, view| {
        let z_hat = &saved.z_hat[i * n * d..][..n * d];
        let scale = reg[i] * 4.0 / saved.frobenius[i];
        // G, and ⟨G, Ẑ⟩ by column.
        dots.clear();
        dots.resize(d, 0.0);
        for (j, value) in view.iter_mut().enumerate() {
            let (x, m) = (z_hat[j].to_f64(), saved.mean[j]);
            let g = scale * value.to_f64() + per_view * (inv[i] * (x - m) - pull[j] / v as f64);
            *value = T::from_f64(g);
            dots[j % d] += g * x;
        }
        // Through the normalisation: `(G − Ẑ⟨G, Ẑ⟩) / c`.
        let norms = &saved.norms[i * d..][..d];
        for (j, value) in view.iter_mut().enumerate() {
            let (c, g) = (j % d, value.to_f64());
            *value = T::from_f64(match norms[c] {
                Some(norm) => (g - z_hat[j].to_f64() * dots[c]) / norm,
                None => g / NORM_FLOOR,
            });
        }
    });
    Ok(out)
}
