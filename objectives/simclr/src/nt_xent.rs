//! NT-Xent (SimCLR) in its practical multi-view form and the duality paper's "paper form"
//! (spec `docs/spec/objectives.md` §2.6).

use candle_core::{Tensor, D};

use crate::similarity::{
    normalize_rows, preprocess, similarity_logits, InstanceMasks, Preprocess, Similarity, MASKED,
};

/// Practical NT-Xent with identity similarity and row normalisation (SimCLR eq. 1, spec §2.6).
/// `z`: `[V, B, d]`.
pub fn nt_xent(z: &Tensor, tau: f64) -> candle_core::Result<Tensor> {
    nt_xent_with(z, tau, Similarity::Identity, Preprocess::None)
}

/// Practical multi-view NT-Xent (spec §2.6 Default, §4): the `V·B` embeddings of
/// `z`: `[V, B, d]` are prepared with `preprocess`, stacked, and `s_ab = f(⟨z_a, z_b⟩)/τ`;
/// for anchor `a` with positives `P(a)` (the other views of its instance)
/// `ℓ_a = −log(Σ_{p∈P(a)} e^{s_ap} / Σ_{b≠a} e^{s_ab})`; the result is the mean over anchors.
pub fn nt_xent_with(
    z: &Tensor,
    tau: f64,
    similarity: Similarity,
    preprocess_mode: Preprocess,
) -> candle_core::Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    let z = preprocess(z, preprocess_mode)?.reshape((v * b, d))?;
    let masks = InstanceMasks::new(v, b, z.dtype(), z.device())?;
    let logits = (similarity_logits(&z, similarity, tau)? + InstanceMasks::hide(&masks.diagonal)?)?;
    let denominator = crate::similarity::logsumexp_rows(&logits)?;
    let positives = (&masks.same - &masks.diagonal)?;
    let numerator =
        crate::similarity::logsumexp_rows(&(logits + InstanceMasks::hide_unless(&positives)?)?)?;
    (denominator - numerator)?.mean_all()
}

/// The duality paper's form of SimCLR / SimCLR-abs / SimCLR-sq (Garrido et al. eqs. 16–17,
/// 30–31; spec §2.6 "paper form"): one direction (anchors from `x1`: `[N, d]`, positives the same
/// rows of `x2`: `[N, d]`), negatives from the anchor's own view only, summed over anchors:
/// `Σ_i [−f(⟨k_i,k'_i⟩)/τ + log(e^{f(⟨k_i,k'_i⟩)/τ} + Σ_{j≠i} e^{f(⟨k_i,k_j⟩)/τ})]` with
/// row-normalised `k = x1`, `k' = x2`.
pub fn nt_xent_paper(
    x1: &Tensor,
    x2: &Tensor,
    tau: f64,
    similarity: Similarity,
) -> candle_core::Result<Tensor> {
    let (positive, same_view) = paper_logits(x1, x2, tau, similarity)?;
    let all = Tensor::cat(&[&positive.unsqueeze(1)?, &same_view], 1)?;
    (crate::similarity::logsumexp_rows(&all)? - positive)?.sum_all()
}

/// Positive logits `[N]` and same-view logits `[N, N]` (diagonal masked) of the paper forms.
pub(crate) fn paper_logits(
    x1: &Tensor,
    x2: &Tensor,
    tau: f64,
    similarity: Similarity,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (k, k2) = (normalize_rows(x1)?, normalize_rows(x2)?);
    let n = k.dim(0)?;
    let positive = (similarity.apply(&(&k * &k2)?.sum(D::Minus1)?)? / tau)?;
    let diagonal = Tensor::eye(n, k.dtype(), k.device())?;
    let same_view = (similarity_logits(&k, similarity, tau)? + (diagonal * MASKED)?)?;
    Ok((positive, same_view))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use candle_core::{DType, Device};
    pub use ssl_core::testing::{close, scalar};
    use ssl_core::testing::{randn, uniform};

    pub fn x1_x2() -> candle_core::Result<(Tensor, Tensor)> {
        let dev = Device::Cpu;
        let x1 = Tensor::new(&[[1f64, 0.], [0., 1.], [-1., 1.]], &dev)?;
        let x2 = Tensor::new(&[[1f64, 0.2], [0.1, 1.], [-1., 0.5]], &dev)?;
        Ok((x1, x2))
    }

    pub fn views() -> candle_core::Result<Tensor> {
        let (x1, x2) = x1_x2()?;
        Tensor::stack(&[&x1, &x2], 0)
    }

    pub const ALL_F: [Similarity; 3] = [Similarity::Identity, Similarity::Abs, Similarity::Sq];
    const ALL_P: [Preprocess; 3] = [
        Preprocess::None,
        Preprocess::Centre,
        Preprocess::Standardize,
    ];

    pub fn f_naive(f: Similarity, x: f64) -> f64 {
        match f {
            Similarity::Identity => x,
            Similarity::Abs => x.abs(),
            Similarity::Sq => x * x,
        }
    }

    pub fn lse_naive(xs: impl IntoIterator<Item = f64>) -> f64 {
        let xs: Vec<f64> = xs.into_iter().collect();
        let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }

    /// Stacked rows `v·B + i` of `z` prepared with plain loops (an independent reference).
    pub fn prepared_naive(z: &Tensor, mode: Preprocess) -> Vec<Vec<f64>> {
        let z = z.to_vec3::<f64>().unwrap();
        let (n, d) = (z[0].len(), z[0][0].len());
        let unit = |r: &[f64]| {
            let norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
            r.iter().map(|x| x / norm).collect::<Vec<_>>()
        };
        let mut rows = Vec::new();
        for view in &z {
            let mean: Vec<f64> = (0..d)
                .map(|j| view.iter().map(|r| r[j]).sum::<f64>() / n as f64)
                .collect();
            let centred: Vec<Vec<f64>> = view
                .iter()
                .map(|r| (0..d).map(|j| r[j] - mean[j]).collect())
                .collect();
            let col: Vec<f64> = (0..d)
                .map(|j| centred.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
                .collect();
            for (r, c) in view.iter().zip(&centred) {
                rows.push(match mode {
                    Preprocess::None => unit(r),
                    Preprocess::Centre => unit(c),
                    Preprocess::Standardize => (0..d)
                        .map(|j| c[j] / col[j] * (n as f64 / d as f64).sqrt())
                        .collect(),
                });
            }
        }
        rows
    }

    pub fn dot(a: &[f64], b: &[f64]) -> f64 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn nt_xent_naive(z: &Tensor, tau: f64, f: Similarity, mode: Preprocess) -> f64 {
        let b = z.dim(1).unwrap();
        let rows = prepared_naive(z, mode);
        let n = rows.len();
        let s = |a: usize, c: usize| f_naive(f, dot(&rows[a], &rows[c])) / tau;
        let mut total = 0.0;
        for a in 0..n {
            let den = lse_naive((0..n).filter(|&c| c != a).map(|c| s(a, c)));
            let num = lse_naive(
                (0..n)
                    .filter(|&c| c != a && c % b == a % b)
                    .map(|c| s(a, c)),
            );
            total += den - num;
        }
        total / n as f64
    }

    #[test]
    fn known_answers_practical_spec_2_6() -> candle_core::Result<()> {
        let z = views()?;
        close(scalar(&nt_xent(&z, 0.5)?), 0.6129270798, 1e-9);
        close(scalar(&nt_xent(&z, 0.1)?), 0.0371517277, 1e-8);
        let with = |f| nt_xent_with(&z, 0.5, f, Preprocess::None).map(|t| scalar(&t));
        close(with(Similarity::Identity)?, 0.6129270798, 1e-9);
        close(with(Similarity::Abs)?, 0.9822533591, 1e-9);
        close(with(Similarity::Sq)?, 0.8049833465, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answers_paper_form_spec_2_6() -> candle_core::Result<()> {
        let (x1, x2) = x1_x2()?;
        let paper = |f| nt_xent_paper(&x1, &x2, 0.5, f).map(|t| scalar(&t));
        close(paper(Similarity::Identity)?, 1.1939373344, 1e-9);
        close(paper(Similarity::Abs)?, 1.8756111126, 1e-9);
        close(paper(Similarity::Sq)?, 1.4894468892, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answer_scenario_a_centred() -> candle_core::Result<()> {
        let loss = nt_xent_with(&views()?, 0.5, Similarity::Identity, Preprocess::Centre)?;
        close(scalar(&loss), 0.3003888016, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answers_scenario_b_standardised() -> candle_core::Result<()> {
        let z = views()?;
        let standardised = preprocess(&z, Preprocess::Standardize)?;
        let expected = [[0.8660254038, -1.], [0., 0.5], [-0.8660254038, 0.5]];
        for (row, want) in standardised.get(0)?.to_vec2::<f64>()?.iter().zip(expected) {
            for (got, want) in row.iter().zip(want) {
                assert!((got - want).abs() < 1e-9, "{got} vs {want}");
            }
        }
        // ‖Z_v‖_F² = N: embeddings have unit norm on average.
        for v in 0..2 {
            close(scalar(&standardised.get(v)?.sqr()?.sum_all()?), 3.0, 1e-12);
        }
        let loss = nt_xent_with(&z, 0.5, Similarity::Identity, Preprocess::Standardize)?;
        close(scalar(&loss), 0.4849453219, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answers_in_f32() -> candle_core::Result<()> {
        let z = views()?.to_dtype(DType::F32)?;
        let (x1, x2) = (z.get(0)?, z.get(1)?);
        let f32_close = |t: Tensor, want: f64| close(scalar(&t), want, 1e-4);
        f32_close(nt_xent(&z, 0.5)?, 0.6129270798);
        f32_close(
            nt_xent_with(&z, 0.5, Similarity::Sq, Preprocess::None)?,
            0.8049833465,
        );
        f32_close(
            nt_xent_with(&z, 0.5, Similarity::Identity, Preprocess::Standardize)?,
            0.4849453219,
        );
        f32_close(nt_xent_paper(&x1, &x2, 0.5, Similarity::Abs)?, 1.8756111126);
        Ok(())
    }

    #[test]
    fn single_instance_gives_zero_loss() -> candle_core::Result<()> {
        // Spec §2.6: at N = 1 every anchor's only candidate is its positive.
        let z = randn(0f64, 1., (2, 1, 4), &Device::Cpu)?;
        for f in ALL_F {
            assert!(scalar(&nt_xent_with(&z, 0.5, f, Preprocess::None)?).abs() < 1e-12);
        }
        Ok(())
    }

    #[test]
    fn invariances_of_each_preprocessing() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let z = randn(0f64, 1., (2, 5, 3), &dev)?;
        let loss =
            |z: &Tensor, p| nt_xent_with(z, 0.5, Similarity::Identity, p).map(|t| scalar(&t));
        // Row normalisation: any positive rescaling of embeddings.
        let rows = uniform(0.1f64, 3., (2, 5, 1), &dev)?;
        close(
            loss(&z.broadcast_mul(&rows)?, Preprocess::None)?,
            loss(&z, Preprocess::None)?,
            1e-12,
        );
        // Centring: a translation of each view.
        let shift = randn(0f64, 5., (2, 1, 3), &dev)?;
        close(
            loss(&z.broadcast_add(&shift)?, Preprocess::Centre)?,
            loss(&z, Preprocess::Centre)?,
            1e-10,
        );
        // Standardisation: a positive rescaling and a translation of each dimension of each view.
        let cols = uniform(0.1f64, 3., (2, 1, 3), &dev)?;
        let moved = z.broadcast_mul(&cols)?.broadcast_add(&shift)?;
        close(
            loss(&moved, Preprocess::Standardize)?,
            loss(&z, Preprocess::Standardize)?,
            1e-10,
        );
        Ok(())
    }

    #[test]
    fn multi_view_matches_naive_loop() -> candle_core::Result<()> {
        for (v, b) in [(2, 4), (3, 4), (4, 3)] {
            let z = randn(0f64, 1., (v, b, 5), &Device::Cpu)?;
            for f in ALL_F {
                for p in ALL_P {
                    close(
                        scalar(&nt_xent_with(&z, 0.3, f, p)?),
                        nt_xent_naive(&z, 0.3, f, p),
                        1e-10,
                    );
                }
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
            let s = |a: &[f64], b: &[f64]| f_naive(f, dot(a, b)) / 0.2;
            let want: f64 = (0..5)
                .map(|i| {
                    let pos = s(&k[i], &k2[i]);
                    let neg = (0..5).filter(|&j| j != i).map(|j| s(&k[i], &k[j]));
                    -pos + lse_naive(std::iter::once(pos).chain(neg))
                })
                .sum();
            close(
                scalar(&nt_xent_paper(&z.get(0)?, &z.get(1)?, 0.2, f)?),
                want,
                1e-10,
            );
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (3, 3, 4), &Device::Cpu)?;
        for f in ALL_F {
            for p in ALL_P {
                let err =
                    ssl_core::testing::max_gradient_error(&z, |z| nt_xent_with(z, 0.5, f, p))?;
                assert!(err < 1e-6, "{f:?} {p:?}: relative gradient error {err}");
            }
            let pair = z.narrow(0, 0, 2)?;
            let err = ssl_core::testing::max_gradient_error(&pair, |z| {
                nt_xent_paper(&z.get(0)?, &z.get(1)?, 0.5, f)
            })?;
            assert!(err < 1e-6, "paper {f:?}: relative gradient error {err}");
        }
        Ok(())
    }
}
