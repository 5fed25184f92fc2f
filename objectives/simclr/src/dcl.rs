//! Decoupled contrastive learning (spec `docs/spec/objectives.md` §2.7): NT-Xent with the positive
//! removed from the denominator, in a practical multi-view form and the duality paper's "paper
//! form", with the optional DCL-W weighting of the positive term.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::nt_xent::paper_logits;
use crate::similarity::{
    logsumexp_rows, normalize_rows, similarity_logits, InstanceMasks, Similarity,
};

/// Weighting of DCL's positive term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weighting {
    /// Every positive counts once (DCL).
    None,
    /// DCL-W: the von Mises–Fisher weights of [`dclw_weights`].
    Dclw,
}

/// The two parts of the practical DCL loss; `loss = alignment + contrast`.
pub struct DclTerms {
    /// `−mean_a mean_{p∈P(a)} w_ap·s_ap` (the positive term, weighted for DCL-W).
    pub alignment: Tensor,
    /// `mean_a lse_{b∈Neg(a)} s_ab`.
    pub contrast: Tensor,
}

impl DclTerms {
    /// `alignment + contrast`.
    pub fn loss(&self) -> candle_core::Result<Tensor> {
        &self.alignment + &self.contrast
    }
}

/// Practical DCL (Yeh et al. eq. 6; spec §2.7 Default) of `z`: `[V, B, d]`, row-normalised.
/// With `s_ab = f(⟨z_a, z_b⟩)/τ` over the `V·B` stacked embeddings, anchor `a` has positives
/// `P(a)` (the other `V−1` views of its instance) and negatives `Neg(a)` (every view of every other
/// instance): `ℓ_a = −mean_{p∈P(a)} s_ap + lse_{b∈Neg(a)} s_ab`, averaged over the `V·B` anchors.
/// At V = 2 this is the reference library's `½(mean_i ℓ_i^{(1→2)} + mean_i ℓ_i^{(2→1)})`.
pub fn dcl(z: &Tensor, tau: f64, similarity: Similarity) -> candle_core::Result<Tensor> {
    dcl_terms(z, tau, similarity, Weighting::None, 0.5)?.loss()
}

/// [`dcl`] with DCL-W weights of width `sigma` (see [`dclw_weights`]).
pub fn dcl_w(
    z: &Tensor,
    tau: f64,
    similarity: Similarity,
    sigma: f64,
) -> candle_core::Result<Tensor> {
    dcl_terms(z, tau, similarity, Weighting::Dclw, sigma)?.loss()
}

/// The [`DclTerms`] of `z`: `[V, B, d]`; `sigma` is used only by [`Weighting::Dclw`].
pub fn dcl_terms(
    z: &Tensor,
    tau: f64,
    similarity: Similarity,
    weighting: Weighting,
    sigma: f64,
) -> candle_core::Result<DclTerms> {
    let weights = match weighting {
        Weighting::None => None,
        Weighting::Dclw => Some(dclw_weights(z, sigma)?),
    };
    dcl_terms_weighted(z, tau, similarity, weights.as_ref())
}

/// DCL-W weights (Yeh et al. eq. 8; spec §2.7), detached: for views `u ≠ v` of instance `i`,
/// `w_i^{uv} = 2 − B·softmax_i(⟨z_i^u, z_i^v⟩/σ)` with the softmax over the `B` instances and
/// row-normalised `z`: `[V, B, d]` → `[B, V, V]`. The weights use the cosine itself, whatever
/// the similarity function `f` of the loss.
pub fn dclw_weights(z: &Tensor, sigma: f64) -> candle_core::Result<Tensor> {
    let b = z.dim(1)?;
    let cosine = instance_gram(&normalize_rows(&z.detach())?)?;
    let softmax = candle_nn::ops::softmax(&(cosine / sigma)?, 0)?;
    softmax.affine(-(b as f64), 2.0)
}

/// `[B, V, V]` Gram matrices of the views of each instance of `z`: `[V, B, d]`.
fn instance_gram(z: &Tensor) -> candle_core::Result<Tensor> {
    let per_instance = z.transpose(0, 1)?.contiguous()?;
    per_instance.matmul(&per_instance.t()?)
}

/// [`dcl_terms`] with given positive weights `[B, V, V]` (none: all 1).
pub(crate) fn dcl_terms_weighted(
    z: &Tensor,
    tau: f64,
    similarity: Similarity,
    weights: Option<&Tensor>,
) -> candle_core::Result<DclTerms> {
    let (v, b, d) = z.dims3()?;
    let z = normalize_rows(z)?;
    let flat = z.reshape((v * b, d))?;
    let masks = InstanceMasks::new(v, b, z.dtype(), z.device())?;
    let negatives =
        (similarity_logits(&flat, similarity, tau)? + InstanceMasks::hide(&masks.same)?)?;
    let contrast = logsumexp_rows(&negatives)?.mean_all()?;
    let positives = (similarity.apply(&instance_gram(&z)?)? / tau)?;
    let positives = match weights {
        Some(w) => (positives * w)?,
        None => positives,
    };
    let other_views = Tensor::eye(v, z.dtype(), z.device())?.affine(-1.0, 1.0)?;
    let alignment =
        (positives.broadcast_mul(&other_views)?.sum_all()? / -((v * b * (v - 1)) as f64))?;
    Ok(DclTerms {
        alignment,
        contrast,
    })
}

/// The duality paper's DCL / DCL-abs / DCL-sq (Garrido et al. eq. 15/27; spec §2.7 paper form):
/// anchors `x1`: `[N, d]`, positives the same rows of `x2`: `[N, d]`, both row-normalised,
/// negatives from the anchor's own view only, summed over anchors:
/// `Σ_i [−f(⟨k_i,k'_i⟩)/τ + lse_{j≠i} f(⟨k_i,k_j⟩)/τ]`.
pub fn dcl_paper(
    x1: &Tensor,
    x2: &Tensor,
    tau: f64,
    similarity: Similarity,
) -> candle_core::Result<Tensor> {
    let (positive, same_view) = paper_logits(x1, x2, tau, similarity)?;
    (logsumexp_rows(&same_view)? - positive)?.sum_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nt_xent::tests::{
        close, dot, f_naive, lse_naive, prepared_naive, scalar, views, x1_x2, ALL_F,
    };
    use crate::Preprocess;
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    /// Naive multi-view DCL; `sigma` gives DCL-W weights computed with plain loops.
    fn dcl_naive(z: &Tensor, tau: f64, f: Similarity, sigma: Option<f64>) -> f64 {
        let (v, b) = (z.dim(0).unwrap(), z.dim(1).unwrap());
        let rows = prepared_naive(z, Preprocess::None);
        let n = rows.len();
        let cos = |a: usize, c: usize| dot(&rows[a], &rows[c]);
        let weight = |a: usize, p: usize| match sigma {
            None => 1.0,
            Some(sigma) => {
                let (u, w, i) = (a / b, p / b, a % b);
                let logits: Vec<f64> = (0..b).map(|j| cos(u * b + j, w * b + j) / sigma).collect();
                let softmax = (logits[i] - lse_naive(logits.iter().cloned())).exp();
                2.0 - b as f64 * softmax
            }
        };
        let s = |a: usize, c: usize| f_naive(f, cos(a, c)) / tau;
        let mut total = 0.0;
        for a in 0..n {
            let positives: Vec<usize> = (0..n).filter(|&c| c != a && c % b == a % b).collect();
            let pos: f64 = positives
                .iter()
                .map(|&p| weight(a, p) * s(a, p))
                .sum::<f64>()
                / positives.len() as f64;
            total += -pos + lse_naive((0..n).filter(|&c| c % b != a % b).map(|c| s(a, c)));
        }
        assert_eq!(n, v * b);
        total / n as f64
    }

    #[test]
    fn known_answer_practical_spec_2_7() -> candle_core::Result<()> {
        close(
            scalar(&dcl(&views()?, 0.1, Similarity::Identity)?),
            -4.6795972396,
            1e-9,
        );
        Ok(())
    }

    #[test]
    fn known_answers_paper_form_spec_2_7() -> candle_core::Result<()> {
        let (x1, x2) = x1_x2()?;
        let paper = |f| dcl_paper(&x1, &x2, 0.5, f).map(|t| scalar(&t));
        close(paper(Similarity::Identity)?, -2.5275068432, 1e-9);
        close(paper(Similarity::Abs)?, -0.4775710171, 1e-9);
        close(paper(Similarity::Sq)?, -1.3836043873, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answers_in_f32() -> candle_core::Result<()> {
        let z = views()?.to_dtype(DType::F32)?;
        close(
            scalar(&dcl(&z, 0.1, Similarity::Identity)?),
            -4.6795972396,
            1e-4,
        );
        let paper = dcl_paper(&z.get(0)?, &z.get(1)?, 0.5, Similarity::Sq)?;
        close(scalar(&paper), -1.3836043873, 1e-4);
        Ok(())
    }

    #[test]
    fn two_views_equal_the_two_direction_reference_form() -> candle_core::Result<()> {
        // Spec §2.7: L = ½(mean_i ℓ_i^{(1→2)} + mean_i ℓ_i^{(2→1)}), Neg = both views of j ≠ i.
        let z = randn(0f64, 1., (2, 5, 4), &Device::Cpu)?;
        let rows = prepared_naive(&z, Preprocess::None);
        let (k1, k2) = rows.split_at(5);
        for f in ALL_F {
            let s = |a: &[f64], c: &[f64]| f_naive(f, dot(a, c)) / 0.1;
            let direction = |x: &[Vec<f64>], y: &[Vec<f64>]| {
                (0..5)
                    .map(|i| {
                        let neg = (0..5)
                            .filter(|&j| j != i)
                            .flat_map(|j| [s(&x[i], &x[j]), s(&x[i], &y[j])]);
                        -s(&x[i], &y[i]) + lse_naive(neg)
                    })
                    .sum::<f64>()
                    / 5.0
            };
            let want = 0.5 * (direction(k1, k2) + direction(k2, k1));
            close(scalar(&dcl(&z, 0.1, f)?), want, 1e-12);
        }
        Ok(())
    }

    #[test]
    fn multi_view_matches_naive_loop() -> candle_core::Result<()> {
        for (v, b) in [(2, 4), (3, 4), (4, 3)] {
            let z = randn(0f64, 1., (v, b, 5), &Device::Cpu)?;
            for f in ALL_F {
                close(
                    scalar(&dcl(&z, 0.3, f)?),
                    dcl_naive(&z, 0.3, f, None),
                    1e-10,
                );
                close(
                    scalar(&dcl_w(&z, 0.3, f, 0.5)?),
                    dcl_naive(&z, 0.3, f, Some(0.5)),
                    1e-10,
                );
            }
        }
        Ok(())
    }

    #[test]
    fn paper_form_matches_naive_loop() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (2, 5, 3), &Device::Cpu)?;
        let rows = prepared_naive(&z, Preprocess::None);
        let (k, k2) = rows.split_at(5);
        for f in ALL_F {
            let s = |a: &[f64], c: &[f64]| f_naive(f, dot(a, c)) / 0.2;
            let want: f64 = (0..5)
                .map(|i| {
                    -s(&k[i], &k2[i])
                        + lse_naive((0..5).filter(|&j| j != i).map(|j| s(&k[i], &k[j])))
                })
                .sum();
            close(
                scalar(&dcl_paper(&z.get(0)?, &z.get(1)?, 0.2, f)?),
                want,
                1e-10,
            );
        }
        Ok(())
    }

    #[test]
    fn dclw_with_equal_positive_similarities_is_dcl() -> candle_core::Result<()> {
        // Both views identical: every positive cosine is 1, the softmax is uniform, w = 1.
        let x = randn(0f64, 1., (1, 4, 3), &Device::Cpu)?;
        let z = Tensor::cat(&[&x, &x.affine(2.0, 0.0)?], 0)?;
        let w = dclw_weights(&z, 0.5)?.flatten_all()?.to_vec1::<f64>()?;
        assert!(w.iter().all(|w| (w - 1.0).abs() < 1e-12), "{w:?}");
        close(
            scalar(&dcl_w(&z, 0.1, Similarity::Identity, 0.5)?),
            scalar(&dcl(&z, 0.1, Similarity::Identity)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (3, 3, 4), &Device::Cpu)?;
        let pair = z.narrow(0, 0, 2)?;
        let weights = dclw_weights(&z, 0.5)?;
        for f in ALL_F {
            let err = ssl_core::testing::max_gradient_error(&z, |z| dcl(z, 0.5, f))?;
            assert!(err < 1e-6, "{f:?}: relative gradient error {err}");
            // DCL-W's weights are detached: the gradient is that of the loss with frozen weights.
            let err = ssl_core::testing::max_gradient_error(&z, |x| {
                dcl_terms_weighted(x, 0.5, f, Some(&weights))?.loss()
            })?;
            assert!(err < 1e-6, "DCL-W {f:?}: relative gradient error {err}");
            let err = ssl_core::testing::max_gradient_error(&pair, |z| {
                dcl_paper(&z.get(0)?, &z.get(1)?, 0.5, f)
            })?;
            assert!(err < 1e-6, "paper {f:?}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn dclw_weights_carry_no_gradient() -> candle_core::Result<()> {
        let z = candle_core::Var::from_tensor(&randn(0f64, 1., (2, 4, 3), &Device::Cpu)?)?;
        let frozen = dclw_weights(&z, 0.5)?;
        let with = dcl_w(&z, 0.5, Similarity::Identity, 0.5)?.backward()?;
        let reference = dcl_terms_weighted(&z, 0.5, Similarity::Identity, Some(&frozen))?
            .loss()?
            .backward()?;
        let diff = (with.get(&z).unwrap() - reference.get(&z).unwrap())?
            .abs()?
            .max_all()?;
        assert!(scalar(&diff) < 1e-14);
        Ok(())
    }
}
