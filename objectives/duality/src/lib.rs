//! Sample- and dimension-contrastive criteria of the duality paper, two trainable objectives
//! built on them, and Spectral Contrastive Loss.
//!
//! * Garrido, Chen, Bardes, Najman & LeCun, "On the duality between contrastive and
//!   non-contrastive self-supervised learning", ICLR 2023. Spec: `docs/spec/objectives.md` §2.2
//!   (criteria `L_c`, `L_nc` and Theorem 3.3).
//! * HaoChen, Wei, Gaidon & Ma, "Provable Guarantees for Self-Supervised Deep Learning with
//!   Spectral Contrastive Loss", NeurIPS 2021. Spec §2.8 (official-code form, paper form of the
//!   duality paper's eq. 18).
//!
//! **Orientation.** The duality paper writes `K ∈ R^{M×N}` with columns = embeddings. Every
//! function here takes the batch matrix `Z = Kᵀ ∈ R^{N×M}` instead (rows = embeddings, the layout
//! of [`ssl_core::Batch::projections`]), so `KᵀK = ZZᵀ` is the `N×N` Gram of the embeddings and
//! `KKᵀ = ZᵀZ` the `M×M` Gram of the dimensions.
//!
//! **Trainable criteria (this crate's recipe; the spec gives the criteria but no training
//! recipe).** `sample-contrastive` and `dimension-contrastive` exist so that the two generic
//! criteria can be compared head to head. For views `Z_v ∈ R^{B×D}`:
//!
//! * `sample-contrastive`: every embedding is row-normalised (`Ẑ_v`, unit-norm embeddings, as the
//!   paper's corollaries assume);
//!   `L = w_inv · inv + w_crit · (1/V) Σ_v L_c(Ẑ_v) / (B(B−1))`, so the criterion is the mean
//!   squared cosine similarity between distinct embeddings, in `[0, 1]` (1 = complete collapse).
//! * `dimension-contrastive`: every dimension is centred over the batch and scaled to unit norm
//!   (`Ẑ_v`, unit-norm dimensions); `L = w_inv · inv + w_crit · (1/V) Σ_v L_nc(Ẑ_v) / (D(D−1))`,
//!   the mean squared correlation between distinct dimensions, in `[0, 1]`.
//!
//! The invariance term is the mean over the `V(V−1)/2` unordered view pairs of the mean squared
//! distance between corresponding unit vectors: `‖Ẑ_a − Ẑ_b‖_F² / B` for sample-contrastive
//! (B unit rows) and `‖Ẑ_a − Ẑ_b‖_F² / D` for dimension-contrastive (D unit columns), both in
//! `[0, 4]`. The `/D` is a deliberate choice: `/B` on unit-norm columns would scale the invariance
//! by `D/B` and make the default weights depend on the widths. It equals `‖·‖_F²/B` on the
//! dimension-standardised embeddings of the duality paper's eq. 14 (columns of norm `√(B/D)`,
//! unit-norm embeddings on average).
//!
//! Defaults `w_inv = 1`, `w_crit = 10`, tuned here (the paper trains neither criterion): at
//! `w_crit = 1` neither beat raw pixels on the digits main job (probe / 20-NN, seed 0:
//! sample-contrastive 97.5 / 91.7 %, dimension-contrastive 97.5 / 89.7 %, raw pixels
//! 97.8 / 98.6 %); at 10 they reach 98.6 / 97.8 % and 98.6 / 97.5 %. Both need B ≥ 2.
//!
//! **SCL multi-view** (not in the original): the official two-view loss averaged over the
//! `V(V−1)/2` unordered view pairs. The two-view loss is symmetric in its views, so ordered pairs
//! give the same value; at V = 2 it is the official loss. The cost is quadratic in V (one `B×B`
//! cross Gram per pair).
//!
//! # Example
//!
//! Spec §2.2's known answers for `Z = Kᵀ` (`N = 4` embeddings of `M = 3` dimensions), and
//! the paper's Theorem 3.3: the two criteria differ by the embeddings' and the dimensions'
//! `Σ‖·‖⁴` (186 and 268).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_duality::{dimension_contrastive, sample_contrastive};
//!
//! let k = Tensor::new(&[[1f64, 2., 0., -1.], [3., -1., 2., 0.], [0., 1., 1., 2.]], &Device::Cpu)?;
//! let z = k.t()?.contiguous()?; // [N = 4, M = 3]
//! let l_c = sample_contrastive(&z)?.to_scalar::<f64>()?;
//! let l_nc = dimension_contrastive(&z)?.to_scalar::<f64>()?;
//! assert!((l_c - 86.0).abs() < 1e-12 && (l_nc - 4.0).abs() < 1e-12);
//! assert!((l_c + 186.0 - (l_nc + 268.0)).abs() < 1e-12);
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::{centre_and_scale_columns, gram, gram_of_columns, l2_norm_keepdim, ColumnScale};

/// `1 − I` of size `n`: keeps the off-diagonal entries of a Gram matrix.
fn off_diagonal_mask(n: usize, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
    Tensor::eye(n, dtype, dev)?.affine(-1.0, 1.0)
}

/// Sum of squares over the last two dimensions: `[..., R, C]` → `[...]`.
fn sum_sq_last2(x: &Tensor) -> candle_core::Result<Tensor> {
    x.sqr()?.flatten_from(x.rank() - 2)?.sum(D::Minus1)
}

/// `‖G − diag(G)‖_F²` for the Gram `G` of the rows (`rows = true`, `G = ZZᵀ`) or of the columns
/// (`G = ZᵀZ`) of `z`: `[..., N, M]`. The requested Gram is formed and masked when it is the
/// smaller one; otherwise `‖ZZᵀ‖_F² = ‖ZᵀZ‖_F²` (= `tr((ZZᵀ)²)`) is taken from the smaller Gram
/// and the squared diagonal `Σ ‖·‖₂⁴` subtracted.
fn off_diagonal_energy(z: &Tensor, rows: bool) -> candle_core::Result<Tensor> {
    let rank = z.rank();
    if rank < 2 {
        candle_core::bail!(
            "expected a batch matrix [..., N, M], got shape {:?}",
            z.dims()
        );
    }
    let (n, m) = (z.dim(rank - 2)?, z.dim(rank - 1)?);
    let row_gram = || gram(z);
    let col_gram = || gram_of_columns(z);
    let (size, direct) = if rows { (n, n <= m) } else { (m, m <= n) };
    if direct {
        let g = if rows { row_gram()? } else { col_gram()? };
        let mask = off_diagonal_mask(size, z.dtype(), z.device())?;
        sum_sq_last2(&g.broadcast_mul(&mask)?)
    } else {
        let g = if rows { col_gram()? } else { row_gram()? };
        let axis = if rows { rank - 1 } else { rank - 2 };
        let norms_sq = z.sqr()?.sum(axis)?;
        sum_sq_last2(&g)? - norms_sq.sqr()?.sum(D::Minus1)?
    }
}

/// Sample-contrastive criterion `L_c = ‖KᵀK − diag(KᵀK)‖_F² = Σ_{i≠j} ⟨z_i, z_j⟩²` (spec §2.2),
/// with `K = Zᵀ`. `z`: `[N, M]` → scalar, or `[V, N, M]` → `[V]` (one value per view).
///
/// Uses the `N×N` Gram when `N ≤ M`; when `N > M` uses Theorem 3.3's identity
/// `L_c = ‖ZᵀZ‖_F² − Σ_i ‖z_i‖₂⁴` with the `M×M` Gram.
pub fn sample_contrastive(z: &Tensor) -> candle_core::Result<Tensor> {
    off_diagonal_energy(z, true)
}

/// Dimension-contrastive criterion `L_nc = ‖KKᵀ − diag(KKᵀ)‖_F² = Σ_{j≠k} ⟨Z_{:,j}, Z_{:,k}⟩²`
/// (spec §2.2), with `K = Zᵀ`. `z`: `[N, M]` → scalar, or `[V, N, M]` → `[V]`.
///
/// Uses the `M×M` Gram when `M ≤ N`; when `M > N` uses `L_nc = ‖ZZᵀ‖_F² − Σ_j ‖Z_{:,j}‖₂⁴` with
/// the `N×N` Gram.
pub fn dimension_contrastive(z: &Tensor) -> candle_core::Result<Tensor> {
    off_diagonal_energy(z, false)
}

pub use ssl_linalg::normalize_rows;

/// Columns of `z`: `[..., N, M]` centred over the batch (the `N` axis) and scaled to unit L2 norm
/// (unit-norm dimensions).
pub fn standardize_columns(z: &Tensor) -> candle_core::Result<Tensor> {
    centre_and_scale_columns(z, ColumnScale::Norm { norm: 1.0 })
}

/// Mean over the `V(V−1)/2` unordered view pairs of `‖Z_a − Z_b‖_F²`, for `z`: `[V, ...]`,
/// computed in time linear in V as `(2/(V−1)) Σ_a ‖Z_a − Z̄‖_F²` (`Z̄` = mean over views).
pub fn mean_pairwise_sq_distance(z: &Tensor) -> candle_core::Result<Tensor> {
    let v = z.dim(0)?;
    if v < 2 {
        candle_core::bail!("the invariance term needs at least 2 views, got {v}");
    }
    let centred = z.broadcast_sub(&z.mean_keepdim(0)?)?;
    centred.sqr()?.sum_all()? * (2.0 / (v as f64 - 1.0))
}

/// The two terms of `sample-contrastive` / `dimension-contrastive`, unweighted.
pub struct CriterionTerms {
    /// Mean over view pairs of the mean squared distance between corresponding unit vectors.
    pub invariance: Tensor,
    /// The criterion averaged over views, divided by `B(B−1)` (resp. `D(D−1)`).
    pub criterion: Tensor,
}

/// Terms of `sample-contrastive` for `z`: `[V, B, D]`, V ≥ 2, B ≥ 2: on row-normalised views,
/// `invariance = mean_{a<b} ‖Ẑ_a − Ẑ_b‖_F² / B`, `criterion = (1/V) Σ_v L_c(Ẑ_v) / (B(B−1))`.
pub fn sample_contrastive_terms(z: &Tensor) -> candle_core::Result<CriterionTerms> {
    let (_, b, _) = z.dims3()?;
    let zn = normalize_rows(z)?;
    Ok(CriterionTerms {
        invariance: (mean_pairwise_sq_distance(&zn)? / b as f64)?,
        criterion: (sample_contrastive(&zn)?.mean_all()? / (b * (b - 1)) as f64)?,
    })
}

/// Terms of `dimension-contrastive` for `z`: `[V, B, D]`, V ≥ 2, D ≥ 2: on column-standardised
/// views, `invariance = mean_{a<b} ‖Ẑ_a − Ẑ_b‖_F² / D`,
/// `criterion = (1/V) Σ_v L_nc(Ẑ_v) / (D(D−1))`.
pub fn dimension_contrastive_terms(z: &Tensor) -> candle_core::Result<CriterionTerms> {
    let (_, _, d) = z.dims3()?;
    let zs = standardize_columns(z)?;
    Ok(CriterionTerms {
        invariance: (mean_pairwise_sq_distance(&zs)? / d as f64)?,
        criterion: (dimension_contrastive(&zs)?.mean_all()? / (d * (d - 1)) as f64)?,
    })
}

/// Weights shared by `sample-contrastive` and `dimension-contrastive`.
fn validate_weights(invariance_weight: f64, criterion_weight: f64) -> Result<()> {
    for (key, value) in [
        ("invariance_weight", invariance_weight),
        ("criterion_weight", criterion_weight),
    ] {
        anyhow::ensure!(
            value.is_finite() && value >= 0.0,
            "`{key}` must be a finite weight ≥ 0, got {value}"
        );
    }
    Ok(())
}

/// `sample-contrastive` hyper-parameters (this crate's recipe, see the crate docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SampleContrastiveConfig {
    /// Weight of the invariance term.
    pub invariance_weight: f64,
    /// Weight of `L_c / (B(B−1))`.
    pub criterion_weight: f64,
}

impl Default for SampleContrastiveConfig {
    fn default() -> Self {
        Self {
            invariance_weight: 1.0,
            criterion_weight: 10.0,
        }
    }
}

/// `sample-contrastive` loss for `z`: `[V, B, D]`.
pub fn sample_contrastive_loss(
    z: &Tensor,
    cfg: &SampleContrastiveConfig,
) -> candle_core::Result<Tensor> {
    let t = sample_contrastive_terms(z)?;
    (t.invariance * cfg.invariance_weight)? + (t.criterion * cfg.criterion_weight)?
}

impl ObjectiveConfig for SampleContrastiveConfig {
    fn validate(&self) -> Result<()> {
        validate_weights(self.invariance_weight, self.criterion_weight)
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(SampleContrastiveObjective(self.clone())))
    }
}

/// The `sample-contrastive` objective.
pub struct SampleContrastiveObjective(pub SampleContrastiveConfig);

impl Objective for SampleContrastiveObjective {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason:
                "the sample-contrastive criterion needs a pair of distinct embeddings",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = sample_contrastive_terms(&z)?;
        let c = &self.0;
        let loss = ((&t.invariance * c.invariance_weight)? + (&t.criterion * c.criterion_weight)?)?;
        Ok(LossOutput::new(loss)
            .with_term("invariance", t.invariance)
            .with_term("sample_contrastive", t.criterion))
    }
}

register_objective! {
    name: "sample-contrastive",
    aliases: &[],
    summary: "Generic sample-contrastive criterion L_c on unit-norm embeddings + invariance (duality paper)",
    paper: "Garrido, Chen, Bardes, Najman, LeCun. On the duality between contrastive and non-contrastive self-supervised learning. ICLR 2023",
    keys: &[
        ConfigKey { name: "invariance_weight", doc: "weight of the mean squared distance between the unit-norm views of an instance" },
        ConfigKey { name: "criterion_weight", doc: "weight of L_c/(B(B−1)), the mean squared cosine between distinct embeddings" },
    ],
    config: SampleContrastiveConfig,
}

/// `dimension-contrastive` hyper-parameters (this crate's recipe, see the crate docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DimensionContrastiveConfig {
    /// Weight of the invariance term.
    pub invariance_weight: f64,
    /// Weight of `L_nc / (D(D−1))`.
    pub criterion_weight: f64,
}

impl Default for DimensionContrastiveConfig {
    fn default() -> Self {
        Self {
            invariance_weight: 1.0,
            criterion_weight: 10.0,
        }
    }
}

/// `dimension-contrastive` loss for `z`: `[V, B, D]`.
pub fn dimension_contrastive_loss(
    z: &Tensor,
    cfg: &DimensionContrastiveConfig,
) -> candle_core::Result<Tensor> {
    let t = dimension_contrastive_terms(z)?;
    (t.invariance * cfg.invariance_weight)? + (t.criterion * cfg.criterion_weight)?
}

/// The criterion divides by `D(D−1)`.
fn ensure_two_dimensions(d: usize) -> Result<()> {
    anyhow::ensure!(
        d >= 2,
        "objective `dimension-contrastive` needs projection width ≥ 2 (it contrasts pairs of \
         dimensions), got {d}"
    );
    Ok(())
}

impl ObjectiveConfig for DimensionContrastiveConfig {
    fn validate(&self) -> Result<()> {
        validate_weights(self.invariance_weight, self.criterion_weight)
    }
    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        ensure_two_dimensions(ctx.projection_dim)?;
        Ok(Box::new(DimensionContrastiveObjective(self.clone())))
    }
}

/// The `dimension-contrastive` objective.
pub struct DimensionContrastiveObjective(pub DimensionContrastiveConfig);

impl Objective for DimensionContrastiveObjective {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: "each dimension is centred over the batch, which zeroes it at B = 1",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        ensure_two_dimensions(batch.projections.dim(2)?)?;
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = dimension_contrastive_terms(&z)?;
        let c = &self.0;
        let loss = ((&t.invariance * c.invariance_weight)? + (&t.criterion * c.criterion_weight)?)?;
        Ok(LossOutput::new(loss)
            .with_term("invariance", t.invariance)
            .with_term("dimension_contrastive", t.criterion))
    }
}

register_objective! {
    name: "dimension-contrastive",
    aliases: &[],
    summary: "Generic dimension-contrastive criterion L_nc on standardised dimensions + invariance (duality paper)",
    paper: "Garrido, Chen, Bardes, Najman, LeCun. On the duality between contrastive and non-contrastive self-supervised learning. ICLR 2023",
    keys: &[
        ConfigKey { name: "invariance_weight", doc: "weight of the mean squared distance between the standardised dimensions of two views" },
        ConfigKey { name: "criterion_weight", doc: "weight of L_nc/(D(D−1)), the mean squared correlation between distinct dimensions" },
    ],
    config: DimensionContrastiveConfig,
}

/// Official SCL step 1: rows of `z`: `[..., N, d]` with norm ≥ √μ are scaled to norm √μ, the
/// others kept (`z` if `‖z‖ < √μ`, else `z·√μ/‖z‖`; the branch is not differentiated).
pub fn ball_project(z: &Tensor, mu: f64) -> candle_core::Result<Tensor> {
    let radius = mu.sqrt();
    let norm = l2_norm_keepdim(z, z.rank() - 1)?;
    let inside = norm.lt(radius)?.to_dtype(z.dtype())?;
    let outside_scale = (norm.recip()? * radius)?;
    let scale = (&inside + (inside.affine(-1.0, 1.0)? * outside_scale)?)?;
    z.broadcast_mul(&scale)
}

/// The two parts of SCL (their sum is the loss), each already divided by μ.
pub struct SclTerms {
    /// `−2·(1/N) Σ_i ⟨z1_i, z2_i⟩ / μ`, averaged over view pairs.
    pub positive: Tensor,
    /// `(1/(N(N−1))) Σ_{i≠j} ⟨z1_i, z2_j⟩² / μ`, averaged over view pairs.
    pub negative: Tensor,
}

/// Official SCL (spec §2.8 Default) for `z`: `[V, B, d]`, V ≥ 2, B ≥ 2, radius parameter `mu`:
/// ball projection, then per unordered view pair `(a, b)`
/// `[−2·(1/B) Σ_i ⟨z_ai, z_bi⟩ + (1/(B(B−1))) Σ_{i≠j} ⟨z_ai, z_bj⟩²] / μ`, averaged over pairs.
pub fn scl_terms(z: &Tensor, mu: f64) -> candle_core::Result<SclTerms> {
    let (v, b, _) = z.dims3()?;
    if v < 2 || b < 2 {
        candle_core::bail!("SCL needs V ≥ 2 views and B ≥ 2 instances, got V = {v}, B = {b}");
    }
    let z = ball_project(z, mu)?;
    let (first, second): (Vec<u32>, Vec<u32>) = (0..v as u32)
        .flat_map(|a| (a + 1..v as u32).map(move |b| (a, b)))
        .unzip();
    let pairs = first.len();
    let za = z.index_select(&Tensor::new(first, z.device())?, 0)?;
    let zb = z.index_select(&Tensor::new(second, z.device())?, 0)?;
    let positive = ((&za * &zb)?.sum_all()? * (-2.0 / (pairs * b) as f64 / mu))?;
    let cross = za.matmul(&zb.t()?)?;
    let mask = off_diagonal_mask(b, z.dtype(), z.device())?;
    let negative =
        (cross.broadcast_mul(&mask)?.sqr()?.sum_all()? / ((pairs * b * (b - 1)) as f64 * mu))?;
    Ok(SclTerms { positive, negative })
}

/// Official SCL loss (sum of [`scl_terms`]) for `z`: `[V, B, d]`.
pub fn scl_loss(z: &Tensor, mu: f64) -> candle_core::Result<Tensor> {
    let t = scl_terms(z, mu)?;
    t.positive + t.negative
}

/// SCL as written in the duality paper (eq. 18, spec §2.8 "paper form"):
/// `−2 Σ_i ⟨k_i, k'_i⟩ + ‖KᵀK − diag(KᵀK)‖_F²` — sums, within-view negatives of the first view,
/// no projection. `z1`, `z2`: `[N, d]` (rows = embeddings `k_i`, `k'_i`).
pub fn scl_paper(z1: &Tensor, z2: &Tensor) -> candle_core::Result<Tensor> {
    ((z1 * z2)?.sum_all()? * -2.0)? + sample_contrastive(z1)?
}

/// SCL hyper-parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SclConfig {
    /// Radius parameter μ: embeddings are projected onto the ball of radius √μ and the loss is
    /// divided by μ (1 in the official CIFAR config, 10 for ImageNet).
    pub mu: f64,
}

impl Default for SclConfig {
    fn default() -> Self {
        Self { mu: 1.0 }
    }
}

impl ObjectiveConfig for SclConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.mu.is_finite() && self.mu > 0.0,
            "`mu` must be a finite radius parameter > 0, got {}",
            self.mu
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Scl(self.clone())))
    }
}

/// The Spectral Contrastive Loss objective.
pub struct Scl(pub SclConfig);

impl Objective for Scl {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason:
                "the negative term averages over the B(B−1) cross-view pairs of distinct instances",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = scl_terms(&z, self.0.mu)?;
        let loss = (&t.positive + &t.negative)?;
        Ok(LossOutput::new(loss)
            .with_term("positive", t.positive)
            .with_term("negative", t.negative))
    }
}

register_objective! {
    name: "scl",
    aliases: &["spectral-contrastive"],
    summary: "Spectral contrastive loss, official form: ball projection, cross-view squared similarities (sample-contrastive)",
    paper: "HaoChen, Wei, Gaidon, Ma. Provable Guarantees for Self-Supervised Deep Learning with Spectral Contrastive Loss. NeurIPS 2021",
    keys: &[ConfigKey { name: "mu", doc: "radius parameter μ: ball of radius √μ, loss divided by μ (1 CIFAR, 10 ImageNet)" }],
    config: SclConfig,
}

#[cfg(test)]
mod tests;
