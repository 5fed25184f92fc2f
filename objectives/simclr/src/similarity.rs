//! What SimCLR and DCL share: the similarity function `f`, the preprocessing of the embeddings
//! (spec `docs/spec/objectives.md` §2.6: row normalisation, scenario A centring, scenario B
//! dimension standardisation), the logits `f(⟨z_a, z_b⟩)/τ` and the same-instance masks of the
//! stacked `V·B` embeddings.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

/// Added to logits that must not count (masked out of a log-sum-exp).
pub(crate) const MASKED: f64 = -1e9;

/// The function `f` applied to every similarity before dividing by τ (duality paper §4,
/// spec §2.6: SimCLR, SimCLR-abs, SimCLR-sq; §2.7 for DCL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Similarity {
    /// `f(x) = x` (SimCLR, DCL).
    Identity,
    /// `f(x) = |x|` (-abs variants).
    Abs,
    /// `f(x) = x²` (-sq variants).
    Sq,
}

impl Similarity {
    /// `f` applied element-wise.
    pub fn apply(self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Similarity::Identity => Ok(x.clone()),
            Similarity::Abs => x.abs(),
            Similarity::Sq => x.sqr(),
        }
    }
}

/// How each view's embeddings are prepared before the similarities (spec §2.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preprocess {
    /// Row-normalise every embedding (standard SimCLR): similarities are cosines.
    None,
    /// Scenario A: per view, subtract the batch mean of every dimension, then row-normalise.
    #[serde(alias = "center")]
    Centre,
    /// Scenario B (duality paper eq. 14): per view, centre every dimension over the batch and
    /// scale it to L2 norm `sqrt(N/d)`; no row normalisation (similarities are raw dot products).
    #[serde(alias = "standardise")]
    Standardize,
}

use ssl_linalg::{centre_and_scale_columns, gram, ColumnScale};
pub use ssl_linalg::{logsumexp_rows, normalize_rows};

/// Applies `mode` to `z`: `[V, B, d]` view by view (batch statistics over the `B` axis).
pub fn preprocess(z: &Tensor, mode: Preprocess) -> candle_core::Result<Tensor> {
    match mode {
        Preprocess::None => normalize_rows(z),
        Preprocess::Centre => normalize_rows(&centre_and_scale_columns(z, ColumnScale::None)?),
        Preprocess::Standardize => {
            let (_, n, d) = z.dims3()?;
            let norm = (n as f64 / d as f64).sqrt();
            centre_and_scale_columns(z, ColumnScale::Norm { norm })
        }
    }
}

/// Logits `f(z zᵀ)/τ` of stacked embeddings `z`: `[R, d]` → `[R, R]`.
pub fn similarity_logits(
    z: &Tensor,
    similarity: Similarity,
    tau: f64,
) -> candle_core::Result<Tensor> {
    similarity.apply(&gram(z)?)? / tau
}

/// Masks over the `[VB, VB]` logits of `V·B` stacked embeddings (row `v·B + i`), built on the
/// device with tensor ops, each of dtype `dtype`.
pub(crate) struct InstanceMasks {
    /// `1` where row and column are the same instance (the diagonal included), else `0`.
    pub same: Tensor,
    /// `1` on the diagonal, else `0`.
    pub diagonal: Tensor,
}

impl InstanceMasks {
    pub fn new(
        views: usize,
        batch: usize,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Self> {
        let n = views * batch;
        let instance = Tensor::arange(0u32, batch as u32, dev)?.repeat(views)?;
        let row = Tensor::arange(0u32, n as u32, dev)?;
        let outer = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.unsqueeze(1)?
                .broadcast_eq(&x.unsqueeze(0)?)?
                .to_dtype(dtype)
        };
        Ok(Self {
            same: outer(&instance)?,
            diagonal: outer(&row)?,
        })
    }

    /// Additive mask hiding `keep == 0` entries: `(1 − keep)·MASKED`.
    pub fn hide_unless(keep: &Tensor) -> candle_core::Result<Tensor> {
        keep.affine(-MASKED, MASKED)
    }

    /// Additive mask hiding `hide == 1` entries: `hide·MASKED`.
    pub fn hide(hide: &Tensor) -> candle_core::Result<Tensor> {
        hide.affine(MASKED, 0.0)
    }
}
