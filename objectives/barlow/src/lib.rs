//! Barlow Twins.
//!
//! Zbontar, Jing, Misra, LeCun & Deny, "Barlow Twins: Self-Supervised Learning via Redundancy
//! Reduction", ICML 2021, eqs. 1–2 — spec `docs/spec/objectives.md` §2.9.
//!
//! Every dimension of every view is standardised over the batch like batch-norm without affine
//! (`Ẑ = (Z − mean)/sqrt(var_p + 1e-5)`), `C = Ẑ_aᵀ Ẑ_b / N`, and
//! `L = scale_loss · (Σ_i (1 − C_ii)² + λ Σ_{i≠j} C_ij²)` with λ = 0.0051 (the official code;
//! the paper text says 5e-3) and `scale_loss` = 1 (one framework uses 0.024, spec §6.10). For
//! `V > 2` both sums are averaged over the `V(V−1)/2` view pairs (spec §4). Needs B ≥ 2.
//!
//! The `d × d` matrices `C` are never formed in the loss: `Σ_{ij} C_ij² = ⟨Ẑ_aẐ_aᵀ, Ẑ_bẐ_bᵀ⟩/N²`
//! uses the `B × B` Gram matrix of each view (one per view, so that part is linear in `V`), and
//! the diagonals `C_ii` of all pairs come from one batched `[d, V, N] × [d, N, V]` product. This
//! keeps memory at `V·B² + d·V²` instead of `V²·d²` (the paper's projector has d = 8192).
//! [`cross_correlation`] forms `C` explicitly for analysis and tests.
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! and the spec's known answers:
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_barlow::{barlow_twins_loss, cross_correlation, BarlowConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let c = cross_correlation(&za, &zb)?.to_vec2::<f64>()?; // [d, d]
//! assert!((c[0][0] - 0.8527881354).abs() < 1e-9);
//! let loss = barlow_twins_loss(&z, &BarlowConfig::default())?.to_scalar::<f64>()?;
//! assert!((loss - 0.3606087145).abs() < 1e-9);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::{centre_and_scale_columns, gram, ColumnScale};

/// Added to the batch variance before the square root, as in batch-norm.
pub const BN_EPS: f64 = 1e-5;

/// Standardises every dimension over the batch axis (the second-to-last), batch-norm style
/// without affine: `(Z − mean)/sqrt(var_p + 1e-5)`. `z`: `[N, d]` or `[V, N, d]`.
pub fn standardize(z: &Tensor) -> candle_core::Result<Tensor> {
    centre_and_scale_columns(z, ColumnScale::BatchNorm { eps: BN_EPS })
}

/// The cross-correlation matrix `C = Ẑ_aᵀ Ẑ_b / N` of two raw views `za, zb`: `[N, d]`
/// (standardised here), `[d, d]`.
pub fn cross_correlation(za: &Tensor, zb: &Tensor) -> candle_core::Result<Tensor> {
    let n = za.dim(0)? as f64;
    standardize(za)?.t()?.matmul(&standardize(zb)?)? / n
}

/// The unweighted Barlow Twins terms, each averaged over the view pairs.
pub struct BarlowTerms {
    /// `Σ_i (1 − C_ii)²`.
    pub on_diagonal: Tensor,
    /// `Σ_{i≠j} C_ij²`.
    pub off_diagonal: Tensor,
}

/// [`BarlowTerms`] of `z`: `[V, B, d]`, V ≥ 2, averaged over the `V(V−1)/2` pairs of views.
pub fn barlow_terms(z: &Tensor) -> candle_core::Result<BarlowTerms> {
    let (v, n, _) = z.dims3()?;
    if v < 2 {
        candle_core::bail!("Barlow Twins needs at least 2 views, got {v}");
    }
    let zs = standardize(z)?;
    let n2 = (n * n) as f64;
    // ⟨G_u, G_v⟩ / N² = Σ_ij C^{uv}_ij², G_v = Ẑ_v Ẑ_vᵀ: [V, V].
    let gram = gram(&zs)?.reshape((v, n * n))?;
    let all_squares = (gram.matmul(&gram.t()?)? / n2)?;
    // C^{uv}_ii for every dimension i and pair of views: [d, V, V].
    let per_dim = zs.permute((2, 0, 1))?.contiguous()?;
    let diagonal = (per_dim.matmul(&per_dim.transpose(1, 2)?)? / n as f64)?;
    let on = (1.0 - &diagonal)?.sqr()?.sum(0)?;
    let off = (all_squares - diagonal.sqr()?.sum(0)?)?;
    let pairs = upper_pairs(v, z)?;
    let count = (v * (v - 1) / 2) as f64;
    Ok(BarlowTerms {
        on_diagonal: ((on * &pairs)?.sum_all()? / count)?,
        off_diagonal: ((off * &pairs)?.sum_all()? / count)?,
    })
}

/// `[V, V]` with ones where `u < v`, in the dtype and on the device of `like`.
fn upper_pairs(v: usize, like: &Tensor) -> candle_core::Result<Tensor> {
    let idx = Tensor::arange(0u32, v as u32, like.device())?;
    idx.unsqueeze(1)?
        .broadcast_lt(&idx.unsqueeze(0)?)?
        .to_dtype(like.dtype())
}

/// `scale_loss · (on + λ·off)` for `z`: `[V, B, d]`.
pub fn barlow_twins_loss(z: &Tensor, cfg: &BarlowConfig) -> candle_core::Result<Tensor> {
    let t = barlow_terms(z)?;
    cfg.combine(&t)
}

/// Barlow Twins hyper-parameters (official code: λ = 0.0051, no loss scaling).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BarlowConfig {
    /// Weight λ of the off-diagonal (redundancy-reduction) term.
    pub lambda: f64,
    /// Factor on the whole loss (1 in the official code; one framework uses 0.024).
    pub scale_loss: f64,
}

impl Default for BarlowConfig {
    fn default() -> Self {
        Self {
            lambda: 0.0051,
            scale_loss: 1.0,
        }
    }
}

impl BarlowConfig {
    fn combine(&self, t: &BarlowTerms) -> candle_core::Result<Tensor> {
        (&t.on_diagonal + (&t.off_diagonal * self.lambda)?)? * self.scale_loss
    }
}

impl ObjectiveConfig for BarlowConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.lambda.is_finite() && self.lambda >= 0.0,
            "`lambda` must be a finite weight ≥ 0, got {}",
            self.lambda
        );
        anyhow::ensure!(
            self.scale_loss.is_finite() && self.scale_loss > 0.0,
            "`scale_loss` must be a finite factor > 0, got {}",
            self.scale_loss
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(BarlowTwins(self.clone())))
    }
}

/// The Barlow Twins objective.
pub struct BarlowTwins(pub BarlowConfig);

impl Objective for BarlowTwins {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "the embeddings are standardised over the batch (B = 1 turns them \
                               all into zeros)",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = barlow_terms(&z)?;
        let loss = self.0.combine(&t)?;
        Ok(LossOutput::new(loss)
            .with_term("on_diagonal", t.on_diagonal)
            .with_term("off_diagonal", t.off_diagonal))
    }
}

register_objective! {
    name: "barlow-twins",
    aliases: &["barlow", "barlowtwins"],
    summary: "Cross-correlation of the standardised views pushed to the identity (redundancy reduction)",
    paper: "Zbontar, Jing, Misra, LeCun, Deny. Barlow Twins: Self-Supervised Learning via Redundancy Reduction. ICML 2021",
    keys: &[
        ConfigKey { name: "lambda", doc: "weight λ of the off-diagonal term (official code 0.0051; paper text 5e-3)" },
        ConfigKey { name: "scale_loss", doc: "factor > 0 on the whole loss (official 1; one framework uses 0.024)" },
    ],
    config: BarlowConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar, spec_za_zb as za_zb};

    /// `(Σ_i (1 − C_ii)², Σ_{i≠j} C_ij²)` of an explicit `C`, with plain loops.
    fn naive_terms(c: &Tensor) -> (f64, f64) {
        let c = c.to_vec2::<f64>().unwrap();
        let (mut on, mut off) = (0.0, 0.0);
        for (i, row) in c.iter().enumerate() {
            for (j, x) in row.iter().enumerate() {
                if i == j {
                    on += (1.0 - x).powi(2);
                } else {
                    off += x * x;
                }
            }
        }
        (on, off)
    }

    #[test]
    fn known_answers_spec_2_9() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let expected = [
            [0.8527881354, 0.6324466778, 0.0],
            [-0.4841945646, 0.7181789498, -0.9733146955],
            [-0.4263940677, -0.3162233389, 0.4999900002],
        ];
        let c = cross_correlation(&a, &b)?.to_vec2::<f64>()?;
        for (row, want) in c.iter().zip(&expected) {
            for (&x, &w) in row.iter().zip(want) {
                assert!((x - w).abs() <= 1e-9 * w.abs().max(1.0), "{x} vs {w}");
            }
        }
        let z = Tensor::stack(&[&a, &b], 0)?;
        let t = barlow_terms(&z)?;
        close(scalar(&t.on_diagonal), 0.3511044373, 1e-8);
        close(scalar(&t.off_diagonal), 1.8635837741, 1e-8);
        let cfg = BarlowConfig::default();
        close(scalar(&barlow_twins_loss(&z, &cfg)?), 0.3606087145, 1e-8);
        let scaled = BarlowConfig {
            scale_loss: 0.024,
            ..cfg
        };
        close(
            scalar(&barlow_twins_loss(&z, &scaled)?),
            0.024 * 0.3606087145,
            1e-8,
        );
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> candle_core::Result<()> {
        let (a, b) = za_zb()?;
        let z = Tensor::stack(&[&a, &b], 0)?.to_dtype(DType::F32)?;
        close(
            scalar(&barlow_twins_loss(&z, &BarlowConfig::default())?),
            0.3606087145,
            1e-4,
        );
        Ok(())
    }

    #[test]
    fn standardize_is_batch_norm_without_affine() -> candle_core::Result<()> {
        let z = randn(3f64, 2., (2, 9, 4), &Device::Cpu)?;
        let s = standardize(&z)?;
        let mean = s.mean(1)?.abs()?.max_all()?.to_scalar::<f64>()?;
        assert!(mean < 1e-12, "{mean}");
        // var_p(Ẑ) = var_p / (var_p + 1e-5) per dimension.
        let var_p = z.broadcast_sub(&z.mean_keepdim(1)?)?.sqr()?.mean(1)?;
        let expected = (&var_p / (&var_p + BN_EPS)?)?.to_vec2::<f64>()?;
        let got = s.sqr()?.mean(1)?.to_vec2::<f64>()?;
        for (g, e) in got.iter().flatten().zip(expected.iter().flatten()) {
            close(*g, *e, 1e-12);
        }
        close(
            scalar(&standardize(&z.get(1)?)?.sum_all()?),
            scalar(&s.get(1)?.sum_all()?),
            1e-9,
        );
        Ok(())
    }

    #[test]
    fn gram_form_matches_the_explicit_cross_correlation() -> candle_core::Result<()> {
        // d > B and d < B, two views, both orders.
        for (n, d) in [(4, 7), (9, 3)] {
            let a = randn(0f64, 1., (n, d), &Device::Cpu)?;
            let b = randn(0.5f64, 2., (n, d), &Device::Cpu)?;
            let (on, off) = naive_terms(&cross_correlation(&a, &b)?);
            for z in [Tensor::stack(&[&a, &b], 0)?, Tensor::stack(&[&b, &a], 0)?] {
                let t = barlow_terms(&z)?;
                close(scalar(&t.on_diagonal), on, 1e-10);
                close(scalar(&t.off_diagonal), off, 1e-10);
            }
        }
        Ok(())
    }

    #[test]
    fn multi_view_is_the_mean_over_view_pairs() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (4, 6, 5), &Device::Cpu)?;
        let cfg = BarlowConfig {
            lambda: 0.3,
            scale_loss: 1.0,
        };
        let mut losses = Vec::new();
        for u in 0..4 {
            for v in u + 1..4 {
                let (on, off) = naive_terms(&cross_correlation(&z.get(u)?, &z.get(v)?)?);
                losses.push(on + cfg.lambda * off);
            }
        }
        let naive = losses.iter().sum::<f64>() / losses.len() as f64;
        close(scalar(&barlow_twins_loss(&z, &cfg)?), naive, 1e-10);
        Ok(())
    }

    #[test]
    fn f32_gram_form_is_accurate_at_training_size() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (3, 128, 512), &Device::Cpu)?;
        let exact = barlow_terms(&z)?;
        let single = barlow_terms(&z.to_dtype(DType::F32)?)?;
        close(
            scalar(&single.on_diagonal),
            scalar(&exact.on_diagonal),
            1e-4,
        );
        close(
            scalar(&single.off_diagonal),
            scalar(&exact.off_diagonal),
            1e-4,
        );
        let grad = |z: &Tensor| -> candle_core::Result<Tensor> {
            let var = candle_core::Var::from_tensor(z)?;
            let loss = barlow_twins_loss(var.as_tensor(), &BarlowConfig::default())?;
            loss.backward()?
                .get(var.as_tensor())
                .unwrap()
                .to_dtype(DType::F64)
        };
        let g64 = grad(&z)?;
        let g32 = grad(&z.to_dtype(DType::F32)?)?;
        let err = scalar(&(&g32 - &g64)?.sqr()?.sum_all()?.sqrt()?)
            / scalar(&g64.sqr()?.sum_all()?.sqrt()?);
        assert!(err < 1e-4, "relative f32 gradient error {err}");
        Ok(())
    }

    #[test]
    fn single_sample_batch_gives_d() -> candle_core::Result<()> {
        let z = randn(0f64, 1., (2, 1, 6), &Device::Cpu)?;
        let t = barlow_terms(&z)?;
        close(scalar(&t.on_diagonal), 6.0, 1e-12);
        assert_eq!(scalar(&t.off_diagonal), 0.0);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> candle_core::Result<()> {
        let cfg = BarlowConfig {
            lambda: 0.2,
            scale_loss: 1.0,
        };
        for views in [2, 3] {
            let z = randn(0f64, 1., (views, 5, 3), &Device::Cpu)?;
            let err = ssl_core::testing::max_gradient_error(&z, |z| barlow_twins_loss(z, &cfg))?;
            assert!(err < 1e-6, "V = {views}: relative gradient error {err}");
        }
        Ok(())
    }

    #[test]
    fn requirements_name_the_reason() {
        let req = BarlowTwins(BarlowConfig::default()).requirements();
        let err = req
            .check("barlow-twins", 2, 1, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("standardised over the batch"), "{err}");
        assert!(req.check("barlow-twins", 8, 2, false).is_ok());
        assert!(req.check("barlow-twins", 1, 8, false).is_err());
        let one_view = Tensor::zeros((1, 4, 3), DType::F64, &Device::Cpu).unwrap();
        assert!(barlow_terms(&one_view).is_err());
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("barlow-twins").unwrap();
        assert_eq!(ssl_core::find("barlow").unwrap().name, "barlow-twins");
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["lambda"].as_f64(), Some(0.0051));
        assert_eq!(defaults["scale_loss"].as_f64(), Some(1.0));
    }

    #[test]
    fn unknown_key_and_bad_values_are_clear_errors() {
        let parse = |text: &str| {
            let value: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            format!(
                "{:#}",
                ssl_core::registry::parse_config::<BarlowConfig>("barlow-twins", &value)
                    .unwrap_err()
            )
        };
        let err = parse("lambd: 0.1");
        assert!(
            err.contains("unknown field `lambd`") && err.contains("lambda"),
            "{err}"
        );
        let err = parse("scale_loss: 0");
        assert!(err.contains("`scale_loss`") && err.contains("> 0"), "{err}");
        let err = parse("lambda: -0.1");
        assert!(err.contains("`lambda`"), "{err}");
    }
}
