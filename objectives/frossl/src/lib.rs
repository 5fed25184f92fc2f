//! FroSSL: Frobenius-norm minimisation of the embedding Gram matrix.
//!
//! Skean, Dhakal, Jacobs & Giraldo, "FroSSL: Frobenius Norm Minimization for Self-Supervised
//! Learning", ECCV 2024. Spec: `docs/spec/objectives.md` §2.11 (recipe §1.3, disagreements §6.3).
//!
//! **Default (multi-view form of the official code).** Every view `Z_v ∈ R^{N×D}` is
//! column-normalised to `Ẑ_v` (no centring), `Z̄ = (1/V) Σ_v Ẑ_v`, and
//!
//! `L = Σ_v [ log ‖K_v / sg(tr K_v)‖_F² + λ·V·‖Ẑ_v − Z̄‖_F² / N ]`,
//!
//! with `K_v = Ẑ_vᵀẐ_v` if `N > D`, else `Ẑ_vẐ_vᵀ` (same non-zero spectrum, always the smaller
//! matrix). `log ‖K_v/tr K_v‖_F²` is minus the 2-order Rényi entropy of the normalised spectrum.
//! All views are processed together (batched `[V, ·, ·]` products), so the cost is linear in `V`.
//!
//! **Invariance scale** (`invariance_scale`). The factor `V` above is the official code's; its
//! sum over views is `λ·Σ_{v<w} ‖Ẑ_v − Ẑ_w‖_F² / N`, a sum over view pairs that grows like `V²`.
//! The paper tunes λ per setting without saying which form its multi-view runs used, so a recipe
//! may choose: `views` (default, the factor `V`), `per_view_pair` (the mean over the
//! `V(V − 1)/2` pairs, `λ·2/(V − 1)·Σ_v ‖Ẑ_v − Z̄‖_F² / N`) or `none` (`λ·Σ_v ‖Ẑ_v − Z̄‖_F² / N`).
//! `views` and `per_view_pair` agree at two views.
//!
//! **Legacy two-view form** (`legacy: true`, the paper's runs): columns standardised with the
//! unbiased std, column-normalised and scaled by `√D`;
//! `L = λ·mse(Ẑ_a, Ẑ_b) + log‖K_a/tr K_a‖_F² + log‖K_b/tr K_b‖_F²`.
//!
//! Needs `N ≥ 2`: at `N = 1` column normalisation maps the embedding to a sign vector.
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! and the spec's known answer (§2.11):
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_frossl::{frossl_loss, FrosslConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let loss = frossl_loss(&z, &FrosslConfig::default())?.to_scalar::<f64>()?;
//! assert!((loss + 1.0128998163).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

mod fused;

use anyhow::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

pub use ssl_linalg::normalize_columns;

/// Every column standardised, `(z − mean) / std_u` (unbiased std, no epsilon, as the legacy
/// code). `z`: `[N, D]` or `[V, N, D]`, N ≥ 2.
pub fn standardize_columns(z: &Tensor) -> candle_core::Result<Tensor> {
    let n = z.dim(D::Minus2)? as f64;
    let centred = z.broadcast_sub(&z.mean_keepdim(D::Minus2)?)?;
    let std = (centred.sqr()?.sum_keepdim(D::Minus2)? / (n - 1.0))?.sqrt()?;
    centred.broadcast_div(&std)
}

/// `reg_v = log ‖K_v / sg(tr K_v)‖_F²` for every view of `z_hat`: `[V, N, D]` → `[V]`
/// (spec §2.11 steps 3–4). `K_v = Ẑ_vᵀẐ_v` (`[D, D]`) if `N > D`, else `Ẑ_vẐ_vᵀ` (`[N, N]`);
/// `tr K_v = ‖Ẑ_v‖_F²` either way and carries no gradient.
pub fn frobenius_regularizers(z_hat: &Tensor) -> candle_core::Result<Tensor> {
    let (_, n, d) = z_hat.dims3()?;
    let gram = if n > d {
        ssl_linalg::gram_of_columns(z_hat)?
    } else {
        ssl_linalg::gram(z_hat)?
    };
    let frobenius_sq = gram.sqr()?.sum((1, 2))?;
    let trace = z_hat.sqr()?.sum((1, 2))?.detach();
    frobenius_sq.log()? - (trace.log()? * 2.0)?
}

/// `log ‖K / sg(tr K)‖_F²` of one column-normalised view `z_hat`: `[N, D]` → scalar
/// (see [`frobenius_regularizers`]). Lies in `[−log min(N, D), 0]`.
pub fn frobenius_regularizer(z_hat: &Tensor) -> candle_core::Result<Tensor> {
    frobenius_regularizers(&z_hat.unsqueeze(0)?)?.squeeze(0)
}

/// `inv_v = λ·V·‖Ẑ_v − Z̄‖_F² / N` (= `λ·V·D·mse(Ẑ_v, Z̄)`, spec §2.11 step 5) for every view of
/// `z_hat`: `[V, N, D]` → `[V]`, with `Z̄` the mean view.
pub fn invariance(z_hat: &Tensor, lambda: f64) -> candle_core::Result<Tensor> {
    let (v, n, _) = z_hat.dims3()?;
    let mean = ssl_linalg::mean_of_views(z_hat)?.unsqueeze(0)?;
    z_hat.broadcast_sub(&mean)?.sqr()?.sum((1, 2))? * (lambda * v as f64 / n as f64)
}

/// Per-view FroSSL terms of `z`: `[V, B, D]`.
pub struct FrosslTerms {
    /// `reg_v`, `[V]`.
    pub regularizers: Tensor,
    /// `inv_v` at λ = 1, `[V]`.
    pub invariances: Tensor,
}

/// Computes [`FrosslTerms`] for `z`: `[V, B, D]` (view-major), V ≥ 2, B ≥ 2: on the CPU as one
/// op each way (`fused.rs`), elsewhere as the composition of [`normalize_columns`],
/// [`frobenius_regularizers`] and [`invariance`].
pub fn frossl_terms(z: &Tensor) -> candle_core::Result<FrosslTerms> {
    if !z.device().is_cpu() {
        return composed_terms(z);
    }
    let terms = fused::terms(z)?;
    Ok(FrosslTerms {
        regularizers: terms.get(0)?,
        invariances: terms.get(1)?,
    })
}

/// [`frossl_terms`] as Candle ops.
fn composed_terms(z: &Tensor) -> candle_core::Result<FrosslTerms> {
    let z_hat = normalize_columns(z)?;
    Ok(FrosslTerms {
        regularizers: frobenius_regularizers(&z_hat)?,
        invariances: invariance(&z_hat, 1.0)?,
    })
}

/// Terms of the legacy two-view form for `z`: `[2, B, D]`.
pub struct LegacyTerms {
    /// `log ‖K_v / tr K_v‖_F²` of the two standardised views, `[2]`.
    pub regularizers: Tensor,
    /// `mse(Ẑ_a, Ẑ_b)` (mean over all elements), scalar.
    pub mse: Tensor,
}

/// Computes [`LegacyTerms`] for `z`: `[2, B, D]`: columns standardised (unbiased std),
/// column-normalised and multiplied by `√D`.
pub fn legacy_terms(z: &Tensor) -> candle_core::Result<LegacyTerms> {
    let (v, _, d) = z.dims3()?;
    if v != 2 {
        candle_core::bail!("the legacy FroSSL form takes exactly 2 views, got {v}");
    }
    let z_hat = (normalize_columns(&standardize_columns(z)?)? * (d as f64).sqrt())?;
    Ok(LegacyTerms {
        regularizers: frobenius_regularizers(&z_hat)?,
        mse: (z_hat.get(0)? - z_hat.get(1)?)?.sqr()?.mean_all()?,
    })
}

/// The FroSSL loss of `z`: `[V, B, D]`: `Σ_v (reg_v + λ·s·inv_v)` with `s` the
/// [`InvarianceScale::factor`], or with `cfg.legacy` the two-view form `λ·mse + reg_a + reg_b`.
pub fn frossl_loss(z: &Tensor, cfg: &FrosslConfig) -> candle_core::Result<Tensor> {
    if cfg.legacy {
        let t = legacy_terms(z)?;
        t.regularizers.sum_all()? + (t.mse * cfg.lambda)?
    } else {
        let t = frossl_terms(z)?;
        let scale = cfg.invariance_scale.factor(z.dim(0)?);
        t.regularizers.sum_all()? + (t.invariances.sum_all()? * (cfg.lambda * scale))?
    }
}

/// How the multi-view invariance is scaled with the number of views `V` (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvarianceScale {
    /// `λ·V·‖Ẑ_v − Z̄‖_F²/N` per view: the sum over view pairs (official code).
    Views,
    /// The mean over view pairs: `views` times `2/(V(V − 1))`.
    PerViewPair,
    /// `λ·‖Ẑ_v − Z̄‖_F²/N` per view: `views` divided by `V`.
    None,
}

impl InvarianceScale {
    /// The factor on [`invariance`] (which carries `V`) for `views` views.
    pub fn factor(self, views: usize) -> f64 {
        let v = views as f64;
        match self {
            InvarianceScale::Views => 1.0,
            InvarianceScale::PerViewPair => 2.0 / (v * (v - 1.0)),
            InvarianceScale::None => 1.0 / v,
        }
    }
}

/// FroSSL hyper-parameters (official defaults: λ = 1, multi-view form).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FrosslConfig {
    /// Invariance weight λ (1.0 for CIFAR/Tiny-ImageNet/IN-100; 1.4 STL-10, 2.0 IN-1k configs).
    pub lambda: f64,
    /// Use the paper's two-view form (standardise, column-normalise, ×√D; mse invariance).
    pub legacy: bool,
    /// How the invariance grows with the number of views (`views`, the official code's).
    pub invariance_scale: InvarianceScale,
}

impl Default for FrosslConfig {
    fn default() -> Self {
        Self {
            lambda: 1.0,
            legacy: false,
            invariance_scale: InvarianceScale::Views,
        }
    }
}

impl ObjectiveConfig for FrosslConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.lambda.is_finite() && self.lambda >= 0.0,
            "`lambda` must be a finite weight ≥ 0, got {}",
            self.lambda
        );
        anyhow::ensure!(
            !self.legacy || self.invariance_scale == InvarianceScale::Views,
            "`invariance_scale` applies to the multi-view form; the legacy two-view form weights \
             its mse by `lambda` alone (remove one of the two keys)"
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Frossl(self.clone())))
    }
}

/// The FroSSL objective.
pub struct Frossl(pub FrosslConfig);

impl Objective for Frossl {
    fn requirements(&self) -> Requirements {
        Requirements {
            max_views: self.0.legacy.then_some(2),
            min_batch: 2,
            min_batch_reason: "column normalisation over a single embedding leaves only a sign \
                               vector and a rank-one Gram matrix with no spectrum to spread",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let c = &self.0;
        if c.legacy {
            let t = legacy_terms(&z)?;
            let regularizer = t.regularizers.sum_all()?;
            let loss = (&regularizer + (&t.mse * c.lambda)?)?;
            Ok(LossOutput::new(loss)
                .with_term("regularizer", regularizer)
                .with_term("invariance", t.mse))
        } else {
            let t = frossl_terms(&z)?;
            let regularizer = t.regularizers.sum_all()?;
            let scale = c.invariance_scale.factor(z.dim(0)?);
            let invariance = (t.invariances.sum_all()? * scale)?;
            let loss = (&regularizer + (&invariance * c.lambda)?)?;
            Ok(LossOutput::new(loss)
                .with_term("regularizer", regularizer)
                .with_term("invariance", invariance))
        }
    }
}

register_objective! {
    name: "frossl",
    aliases: &[],
    summary: "Frobenius-norm (2-order Rényi entropy) regulariser plus mean-view invariance (dimension-contrastive)",
    paper: "Skean, Dhakal, Jacobs, Giraldo. FroSSL: Frobenius Norm Minimization for Self-Supervised Learning. ECCV 2024",
    keys: &[
        ConfigKey { name: "lambda", doc: "invariance weight λ (1.0; the STL-10 config uses 1.4, ImageNet-1k 2.0)" },
        ConfigKey { name: "legacy", doc: "paper's two-view form: standardise, column-normalise ×√D, mse invariance (max 2 views)" },
        ConfigKey { name: "invariance_scale", doc: "invariance growth with the view count V: views (λ·V per view, the sum over view pairs; official), per_view_pair (the mean over pairs), none" },
    ],
    config: FrosslConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar, spec_za_zb};
    use ssl_core::Ids;

    fn views() -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let (a, b) = spec_za_zb()?;
        let c = Tensor::new(
            &[[2f64, 0., 1.], [1., 1., 0.], [1., 0., 1.], [0., 2., 2.]],
            &Device::Cpu,
        )?;
        Ok((a, b, c))
    }

    fn vector(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap()
    }

    fn all_close(a: &[f64], b: &[f64], rel: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            close(*x, *y, rel);
        }
    }

    fn default_loss(z: &Tensor) -> candle_core::Result<Tensor> {
        frossl_loss(z, &FrosslConfig::default())
    }

    /// `log ‖G/tr G‖_F²` of an explicit Gram matrix `[M, M]` on the host.
    fn log_normalized_frobenius(gram: &Tensor) -> f64 {
        let g = gram.to_vec2::<f64>().unwrap();
        let trace: f64 = (0..g.len()).map(|i| g[i][i]).sum();
        let sq: f64 = g.iter().flatten().map(|x| (x / trace).powi(2)).sum();
        sq.ln()
    }

    #[test]
    fn known_answers_two_views_spec_2_11() -> candle_core::Result<()> {
        let (a, b, _) = views()?;
        let z = Tensor::stack(&[&a, &b], 0)?;
        let t = frossl_terms(&z)?;
        all_close(
            &vector(&t.regularizers),
            &[-0.6406761288, -0.5559189261],
            1e-8,
        );
        all_close(&vector(&t.invariances), &[0.0918476193; 2], 1e-8);
        close(scalar(&default_loss(&z)?), -1.0128998163, 1e-8);
        Ok(())
    }

    #[test]
    fn known_answers_three_views_spec_2_11() -> candle_core::Result<()> {
        let (a, b, c) = views()?;
        let z = Tensor::stack(&[&a, &b, &c], 0)?;
        let t = frossl_terms(&z)?;
        all_close(
            &vector(&t.regularizers),
            &[-0.6406761288, -0.5559189261, -0.6639480259],
            1e-8,
        );
        all_close(
            &vector(&t.invariances),
            &[0.1879647636, 0.3528543795, 0.5305525706],
            1e-8,
        );
        close(scalar(&default_loss(&z)?), -0.7891713671, 1e-8);
        Ok(())
    }

    #[test]
    fn known_answer_legacy_two_view_form() -> candle_core::Result<()> {
        let (a, b, _) = views()?;
        let z = Tensor::stack(&[&a, &b], 0)?;
        let cfg = FrosslConfig {
            legacy: true,
            ..FrosslConfig::default()
        };
        close(scalar(&frossl_loss(&z, &cfg)?), -1.1836847547, 1e-8);
        Ok(())
    }

    #[test]
    fn known_answers_in_f32() -> candle_core::Result<()> {
        let (a, b, c) = views()?;
        let z2 = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        let z3 = Tensor::stack(&[&a, &b, &c], 0)?.to_dtype(DType::F32)?;
        close(scalar(&default_loss(&z2)?), -1.0128998163, 1e-4);
        close(scalar(&default_loss(&z3)?), -0.7891713671, 1e-4);
        let legacy = FrosslConfig {
            legacy: true,
            ..FrosslConfig::default()
        };
        close(scalar(&frossl_loss(&z2, &legacy)?), -1.1836847547, 1e-4);
        Ok(())
    }

    #[test]
    fn lambda_weights_only_the_invariance() -> candle_core::Result<()> {
        let (a, b, c) = views()?;
        let z = Tensor::stack(&[&a, &b, &c], 0)?;
        let t = frossl_terms(&z)?;
        let cfg = FrosslConfig {
            lambda: 2.5,
            ..FrosslConfig::default()
        };
        let expected = scalar(&t.regularizers.sum_all()?) + 2.5 * scalar(&t.invariances.sum_all()?);
        close(scalar(&frossl_loss(&z, &cfg)?), expected, 1e-12);
        let z_hat = normalize_columns(&z)?;
        all_close(
            &vector(&invariance(&z_hat, 2.5)?),
            &vector(&(t.invariances * 2.5)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn regularizer_lower_bound_reached_iff_gram_is_isotropic() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        // N > D: orthogonal columns of equal norm, so ẐᵀẐ = I.
        let tall = Tensor::new(&[[1f64, 1.], [1., -1.], [1., 1.], [1., -1.]], &dev)?;
        // N ≤ D: orthogonal rows of equal norm after column normalisation, so ẐẐᵀ ∝ I.
        let wide = Tensor::new(&[[1f64, 2., 1., 3.], [1., -2., 1., -3.]], &dev)?;
        for z in [&tall, &wide] {
            let reg = scalar(&frobenius_regularizer(&normalize_columns(z)?)?);
            close(reg, -(2f64).ln(), 1e-12);
        }
        // Random views lie strictly inside [−log min(N, D), 0].
        for (n, d) in [(6, 3), (3, 6), (5, 5)] {
            let z = randn(0f64, 1., (n, d), &dev)?;
            let reg = scalar(&frobenius_regularizer(&normalize_columns(&z)?)?);
            let bound = -(n.min(d) as f64).ln();
            assert!(reg > bound + 1e-6 && reg < 0.0, "{reg} vs {bound}");
        }
        // Rank one (all columns parallel) reaches the upper bound 0.
        let rank_one = Tensor::new(&[[1f64, 2.], [2., 4.], [3., 6.]], &dev)?;
        let reg = scalar(&frobenius_regularizer(&normalize_columns(&rank_one)?)?);
        assert!(reg.abs() < 1e-12, "{reg}");
        Ok(())
    }

    #[test]
    fn both_gram_branches_give_the_same_value() -> candle_core::Result<()> {
        for (n, d) in [(7, 3), (3, 7), (4, 4)] {
            let z_hat = normalize_columns(&randn(0f64, 1., (n, d), &Device::Cpu)?)?;
            let primal = log_normalized_frobenius(&z_hat.t()?.matmul(&z_hat)?);
            let dual = log_normalized_frobenius(&z_hat.matmul(&z_hat.t()?)?);
            close(primal, dual, 1e-10);
            close(scalar(&frobenius_regularizer(&z_hat)?), primal, 1e-10);
        }
        Ok(())
    }

    #[test]
    fn invariant_to_positive_column_scaling() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let z = randn(0f64, 1., (3, 5, 4), &dev)?;
        let scale = Tensor::new(
            &[
                [[1f64, 1., 1., 1.]],
                [[0.1, 3., 7., 0.5]],
                [[1., 1., 1., 1.]],
            ],
            &dev,
        )?;
        let scaled = z.broadcast_mul(&scale)?;
        close(
            scalar(&default_loss(&scaled)?),
            scalar(&default_loss(&z)?),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn two_view_invariance_is_the_pairwise_distance() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (2, 6, 4), &Device::Cpu)?;
        let z_hat = normalize_columns(&z)?;
        let lambda = 1.7;
        let total = scalar(&invariance(&z_hat, lambda)?.sum_all()?);
        let distance = scalar(&(z_hat.get(0)? - z_hat.get(1)?)?.sqr()?.sum_all()?);
        close(total, lambda * distance / 6.0, 1e-12);
        Ok(())
    }

    #[test]
    fn multi_view_matches_direct_computation() -> candle_core::Result<()> {
        for (n, d) in [(6, 4), (3, 5)] {
            let v = 4;
            let z = randn(0f64, 1., (v, n, d), &Device::Cpu)?;
            let hats: Vec<Vec<Vec<f64>>> = (0..v)
                .map(|k| {
                    let x = z.get(k).unwrap().to_vec2::<f64>().unwrap();
                    let norms: Vec<f64> = (0..d)
                        .map(|j| x.iter().map(|r| r[j] * r[j]).sum::<f64>().sqrt())
                        .collect();
                    x.iter()
                        .map(|r| (0..d).map(|j| r[j] / norms[j]).collect())
                        .collect()
                })
                .collect();
            let mut expected = 0.0;
            for hat in &hats {
                let flat: Vec<f64> = hat.iter().flatten().copied().collect();
                let m = Tensor::from_vec(flat, (n, d), &Device::Cpu)?;
                expected += log_normalized_frobenius(&m.t()?.matmul(&m)?);
                let mut sq = 0.0;
                for i in 0..n {
                    for j in 0..d {
                        let mean = hats.iter().map(|h| h[i][j]).sum::<f64>() / v as f64;
                        sq += (hat[i][j] - mean).powi(2);
                    }
                }
                expected += v as f64 * sq / n as f64;
            }
            close(scalar(&default_loss(&z)?), expected, 1e-10);
        }
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = FrosslConfig {
            lambda: 1.3,
            ..FrosslConfig::default()
        };
        for shape in [(2, 6, 3), (2, 3, 5), (3, 6, 3), (3, 3, 5)] {
            let z = randn(0f64, 1., shape, &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| frossl_loss(z, &cfg))?;
            assert!(err < 1e-6, "{shape:?}: relative gradient error {err}");
        }
        let legacy = FrosslConfig {
            legacy: true,
            ..cfg
        };
        for shape in [(2, 6, 3), (2, 3, 5)] {
            let z = randn(0f64, 1., shape, &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| frossl_loss(z, &legacy))?;
            assert!(
                err < 1e-6,
                "legacy {shape:?}: relative gradient error {err}"
            );
        }
        Ok(())
    }

    /// The CPU's fused terms equal the composed ones in value and in gradient (against random
    /// weights on every term), for N ≤ D and N > D, two and three views, a zero column, in f64
    /// and in f32 at the main job's `[2, 128, 512]`.
    #[test]
    fn fused_terms_equal_the_composed_ops() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let mut with_zero_column = randn(0f64, 1., (2, 6, 4), &dev)?.to_vec3::<f64>()?;
        for view in &mut with_zero_column {
            for row in view {
                row[1] = 0.0;
            }
        }
        let cases = [
            (randn(0f64, 1., (2, 6, 3), &dev)?, 1e-12),
            (randn(0f64, 1., (3, 3, 5), &dev)?, 1e-12),
            (randn(0f64, 1., (3, 7, 4), &dev)?.transpose(1, 2)?, 1e-12),
            (Tensor::new(with_zero_column, &dev)?, 1e-12),
            (randn(0f32, 1., (2, 128, 512), &dev)?, 1e-4),
        ];
        let stacked = |t: FrosslTerms| Tensor::stack(&[t.regularizers, t.invariances], 0);
        for (z, tolerance) in cases {
            let (fused, composed) = (
                |z: &Tensor| stacked(frossl_terms(z)?),
                |z: &Tensor| stacked(composed_terms(z)?),
            );
            ssl_core::testing::assert_fused_matches_composed(&z, tolerance, fused, composed)?;
        }
        Ok(())
    }

    #[test]
    fn trace_normalisation_carries_no_gradient() -> candle_core::Result<()> {
        // With the trace constant, d reg/d Ẑ = 4·Ẑ·K/‖K‖_F² (N > D); a differentiated trace
        // would subtract 4·Ẑ/tr K.
        let z_hat = randn(0f64, 1., (5, 3), &Device::Cpu)?;
        let var = candle_core::Var::from_tensor(&z_hat)?;
        let grads = frobenius_regularizer(var.as_tensor())?.backward()?;
        let grad = grads.get(var.as_tensor()).unwrap();
        let k = z_hat.t()?.matmul(&z_hat)?;
        let expected = (z_hat.matmul(&k)? * (4.0 / scalar(&k.sqr()?.sum_all()?)))?;
        let diff = scalar(&(grad - expected)?.abs()?.max_all()?);
        assert!(diff < 1e-12, "{diff}");
        Ok(())
    }

    #[test]
    fn legacy_form_rejects_more_than_two_views() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (3, 4, 3), &Device::Cpu)?;
        assert!(legacy_terms(&z).is_err());
        Ok(())
    }

    fn build(yaml: &str) -> Box<dyn Objective> {
        let reg = ssl_core::find("frossl").unwrap();
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        let ctx = BuildContext {
            vb: candle_nn::VarBuilder::zeros(DType::F64, &Device::Cpu),
            num_instances: 10,
            num_classes: None,
            instance_labels: None,
            projection_dim: 3,
            feature_dim: 3,
            views: 2,
            global_views: 2,
            batch_size: 4,
            patches: None,
        };
        (reg.build)(&value, &ctx).unwrap()
    }

    #[test]
    fn requirements_depend_on_the_form() {
        let objective = build("{}");
        let req = objective.requirements();
        assert_eq!((req.min_batch, req.min_views, req.max_views), (2, 2, None));
        let err = format!("{:#}", req.check("frossl", 2, 1, false).unwrap_err());
        assert!(err.contains("column normalisation"), "{err}");
        assert!(req.check("frossl", 8, 2, false).is_ok());
        assert!(req.check("frossl", 1, 4, false).is_err());

        let legacy = build("legacy: true").requirements();
        assert_eq!(legacy.max_views, Some(2));
        assert!(legacy.check("frossl", 2, 2, false).is_ok());
        let err = format!("{:#}", legacy.check("frossl", 3, 4, false).unwrap_err());
        assert!(err.contains("at most 2 views"), "{err}");
    }

    #[test]
    fn objective_reports_the_loss_and_its_terms() -> Result<()> {
        let (a, b, c) = views()?;
        let z = Tensor::stack(&[&a, &b, &c], 0)?;
        let indices = Ids::range(4, &Device::Cpu)?;
        let batch = ssl_core::testing::batch(&z, &indices, None);
        let out = build("lambda: 2.0").loss(&batch)?;
        let term = |name: &str| scalar(&out.terms.iter().find(|(n, _)| n == name).unwrap().1);
        close(
            term("regularizer"),
            -0.6406761288 - 0.5559189261 - 0.6639480259,
            1e-8,
        );
        close(
            term("invariance"),
            0.1879647636 + 0.3528543795 + 0.5305525706,
            1e-8,
        );
        close(
            scalar(&out.loss),
            term("regularizer") + 2.0 * term("invariance"),
            1e-12,
        );
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("frossl").unwrap();
        assert!(reg.paper.contains("ECCV 2024") && reg.paper.contains("Skean"));
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["lambda"].as_f64(), Some(1.0));
        assert_eq!(defaults["legacy"].as_bool(), Some(false));
        assert_eq!(defaults["invariance_scale"].as_str(), Some("views"));
    }

    /// The three scales against their definitions on the spec's three views (N = 4, D = 3):
    /// `views` is the sum of `‖Ẑ_v − Ẑ_w‖_F²/N` over view pairs, `per_view_pair` its mean,
    /// `none` the sum of `‖Ẑ_v − Z̄‖_F²/N`; at two views `per_view_pair` equals `views`; the
    /// legacy form refuses a scale.
    #[test]
    fn invariance_scales_are_the_pair_sum_the_pair_mean_and_the_mean_view_distance() -> Result<()> {
        let (a, b, c) = views()?;
        let z = Tensor::stack(&[&a, &b, &c], 0)?;
        let z_hat = normalize_columns(&z)?;
        let n = 4.0;
        let sq =
            |x: &Tensor, y: &Tensor| scalar(&(x - y).unwrap().sqr().unwrap().sum_all().unwrap());
        let zs: Vec<Tensor> = (0..3)
            .map(|v| z_hat.get(v))
            .collect::<candle_core::Result<_>>()?;
        let pair_sum = (sq(&zs[0], &zs[1]) + sq(&zs[0], &zs[2]) + sq(&zs[1], &zs[2])) / n;
        let mean = (((&zs[0] + &zs[1])? + &zs[2])? / 3.0)?;
        let to_mean: f64 = zs.iter().map(|v| sq(v, &mean)).sum::<f64>() / n;
        let term = |yaml: &str, z: &Tensor| -> Result<f64> {
            let indices = Ids::range(4, &Device::Cpu)?;
            let out = build(yaml).loss(&ssl_core::testing::batch(z, &indices, None))?;
            Ok(scalar(
                &out.terms.iter().find(|(n, _)| n == "invariance").unwrap().1,
            ))
        };
        close(term("invariance_scale: views", &z)?, pair_sum, 1e-10);
        close(
            term("invariance_scale: per_view_pair", &z)?,
            pair_sum / 3.0,
            1e-10,
        );
        close(term("invariance_scale: none", &z)?, to_mean, 1e-10);
        let cfg = FrosslConfig {
            lambda: 2.0,
            invariance_scale: InvarianceScale::PerViewPair,
            ..FrosslConfig::default()
        };
        let reg = scalar(&frossl_terms(&z)?.regularizers.sum_all()?);
        close(
            scalar(&frossl_loss(&z, &cfg)?),
            reg + 2.0 * pair_sum / 3.0,
            1e-10,
        );
        let two = Tensor::stack(&[&a, &b], 0)?;
        close(
            term("invariance_scale: per_view_pair", &two)?,
            term("{}", &two)?,
            1e-12,
        );
        let config_error = |yaml: &str| {
            let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
            let parsed = ssl_core::registry::parse_config::<FrosslConfig>("frossl", &value);
            format!("{:#}", parsed.unwrap_err())
        };
        let err = config_error("legacy: true\ninvariance_scale: none");
        assert!(
            err.contains("`invariance_scale` applies to the multi-view form"),
            "{err}"
        );
        let err = config_error("invariance_scale: pairs");
        assert!(err.contains("unknown variant `pairs`"), "{err}");
        Ok(())
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let parse = |yaml: &str| {
            let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
            ssl_core::registry::parse_config::<FrosslConfig>("frossl", &value)
        };
        let err = format!("{:#}", parse("lamda: 3").unwrap_err());
        assert!(
            err.contains("unknown field `lamda`") && err.contains("lambda"),
            "{err}"
        );
        let err = format!("{:#}", parse("lambda: -1").unwrap_err());
        assert!(err.contains("`lambda`") && err.contains("-1"), "{err}");
        let cfg = parse("legacy: true\nlambda: 1.4").unwrap();
        assert!(cfg.legacy && cfg.lambda == 1.4);
    }
}
