//! LeJEPA: a joint-embedding objective whose only defence against collapse is SIGReg, a test
//! that the embeddings are an isotropic Gaussian.
//!
//! Balestriero & LeCun, "LeJEPA: Provable and Scalable Self-Supervised Learning Without the
//! Heuristics", arXiv:2511.08544, 2025 (official code: github.com/rbalestr-lab/lejepa). Spec:
//! `docs/spec/objectives.md` §2.26.
//!
//! The loss reads the projector outputs `z` `[V, B, D]`, the `V_g` global views first, then the
//! local crops (multi-crop; without local crops every view is global). No teacher, predictor,
//! stop-gradient or schedule:
//!
//! * **prediction** ([`prediction_loss`]): every view moves towards the centre of its instance's
//!   global views, `μ_i = (1/V_g) Σ_{v<V_g} z_{v,i}`, in squared Euclidean distance averaged over
//!   every element, `L_pred = (1/(V·B·D)) Σ_{v,i} ‖μ_i − z_{v,i}‖²`. The centre is not detached:
//!   it is pulled towards the views as they are pulled towards it (the paper's Algorithm 2).
//! * **SIGReg** ([`sigreg()`]): `M` unit directions `a_m`, drawn afresh every step from the run's
//!   seed and step (the same on every worker and after `--resume`), project each view; the
//!   Epps–Pulley statistic `T = N ∫ |φ̂(t) − e^{−t²/2}|² e^{−t²/2} dt` compares the projections'
//!   empirical characteristic function `φ̂` over the global batch (`N` rows) with the standard
//!   normal's, and `L_sig` is its mean over the `M` directions and the `V` views. The integral
//!   is a trapezoid rule on `[0, R]`, doubled ([`Quadrature`]).
//! * `L = (1 − λ)·L_pred + λ·L_sig`.
//!
//! Defaults: `λ = 0.05` and `M = 1024` slices (the paper's recommendations), `R = 3` with 17
//! knots (the official code's `EppsPulley` and minimal example; the paper's text suggests
//! `[−5, 5]`, i.e. `t_max: 5`). The official minimal example's projector is an MLP with batch
//! norm, `--set model.projector=[2048,2048,128]` in this trainer; the paper's views are 2 global
//! and 6–8 local crops (`train.views: 2`, `train.local_views: 6`).
//!
//! Data-parallel runs gather only the characteristic function's sums (`[2(K−1), V, M]` per
//! worker, the official all-reduce) through [`ssl_core::Collective`]; the prediction term is per
//! instance and stays local.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use rand::SeedableRng;
//! use ssl_core::SingleProcess;
//! use ssl_lejepa::{lejepa_loss, random_directions, Quadrature};
//!
//! # fn main() -> candle_core::Result<()> {
//! let device = Device::Cpu;
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
//! let directions = random_directions(16, 256, &mut rng, &device)?; // [D, M]
//! // V = 4 views (2 global, 2 local) of B = 512 instances, D = 16: Gaussian, then collapsed.
//! let spread = ssl_core::testing::randn(0f32, 1.0, (4, 512, 16), &device)?;
//! let collapsed = Tensor::ones((4, 512, 16), candle_core::DType::F32, &device)?;
//! let score = |z: &Tensor| -> candle_core::Result<(f32, f32)> {
//!     let out = lejepa_loss(z, 2, &directions, &Quadrature::LEJEPA, 0.05, &SingleProcess)?;
//!     Ok((out.prediction.to_scalar()?, out.sigreg.to_scalar()?))
//! };
//! let (spread_prediction, spread_sigreg) = score(&spread)?;
//! let (collapsed_prediction, collapsed_sigreg) = score(&collapsed)?;
//! // Collapse satisfies the prediction term, and SIGReg alone rules it out.
//! assert!(collapsed_prediction == 0.0 && spread_prediction > 0.5);
//! assert!(spread_sigreg < 2.0 && collapsed_sigreg > 50.0);
//! # Ok(())
//! # }
//! ```

pub mod sigreg;

#[cfg(test)]
mod tests;

pub use sigreg::{
    epps_pulley, epps_pulley_views, random_directions, sigreg, sliced_epps_pulley, Quadrature,
};

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, Collective, ConfigKey, LossOutput, Objective,
    ObjectiveConfig, Requirements,
};

/// `L_pred = (1/(V·B·D)) Σ_{v,i} ‖μ_i − z_{v,i}‖²` of `z` `[V, B, D]` with
/// `μ_i = mean_{v < global_views} z_{v,i}` (not detached).
pub fn prediction_loss(z: &Tensor, global_views: usize) -> candle_core::Result<Tensor> {
    let views = z.dim(0)?;
    if global_views == 0 || global_views > views {
        candle_core::bail!(
            "LeJEPA's centres average the global views, so 1 ≤ global views ≤ views; got \
             {global_views} global of {views}"
        );
    }
    let centres = z.narrow(0, 0, global_views)?.mean(0)?;
    z.broadcast_sub(&centres)?.sqr()?.mean_all()
}

/// The LeJEPA loss and its two terms (scalars).
pub struct LejepaTerms {
    /// `(1 − λ)·prediction + λ·sigreg`.
    pub loss: Tensor,
    /// `L_pred` ([`prediction_loss`]).
    pub prediction: Tensor,
    /// `L_sig` ([`sigreg()`]).
    pub sigreg: Tensor,
}

/// `(1 − λ)·L_pred + λ·L_sig` of the views `z` `[V, B, D]` (the first `global_views` global),
/// SIGReg on the unit `directions` `[D, M]` with `quadrature` and the characteristic function
/// over the global batch of `collective`.
///
/// SIGReg is computed in f64 for f64 embeddings and in f32 otherwise (half precision is widened);
/// every term comes back in the dtype of `z`.
pub fn lejepa_loss(
    z: &Tensor,
    global_views: usize,
    directions: &Tensor,
    quadrature: &Quadrature,
    lambda: f64,
    collective: &dyn Collective,
) -> candle_core::Result<LejepaTerms> {
    let prediction = prediction_loss(z, global_views)?;
    let work = match z.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let sigreg = sigreg::sigreg(&z.to_dtype(work)?, directions, quadrature, collective)?
        .to_dtype(z.dtype())?;
    let loss = ((&prediction * (1.0 - lambda))? + (&sigreg * lambda)?)?;
    Ok(LejepaTerms {
        loss,
        prediction,
        sigreg,
    })
}

/// LeJEPA hyper-parameters (the paper's recommended defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LejepaConfig {
    /// `λ`, SIGReg's share of the loss (0.05).
    pub lambda: f64,
    /// `M`, random directions drawn every step (1024).
    pub slices: usize,
    /// `R`: the Epps–Pulley integral runs over `[−R, R]` (3, the official code's).
    pub t_max: f64,
    /// Quadrature knots on `[0, R]` (17).
    pub knots: usize,
}

impl Default for LejepaConfig {
    fn default() -> Self {
        Self {
            lambda: 0.05,
            slices: 1024,
            t_max: Quadrature::LEJEPA.t_max,
            knots: Quadrature::LEJEPA.knots,
        }
    }
}

impl LejepaConfig {
    fn quadrature(&self) -> Quadrature {
        Quadrature {
            t_max: self.t_max,
            knots: self.knots,
        }
    }
}

impl ObjectiveConfig for LejepaConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.lambda.is_finite() && (0.0..=1.0).contains(&self.lambda),
            "`lambda` weighs SIGReg against the prediction term and must lie in [0, 1] (LeJEPA \
             recommends 0.05), got {}",
            self.lambda
        );
        ensure!(
            self.slices >= 1,
            "`slices` must be at least 1 (LeJEPA recommends 1024), got 0"
        );
        ensure!(
            self.t_max.is_finite() && self.t_max > 0.0,
            "`t_max` must be a finite range > 0 (the official code uses 3, the paper suggests 5), \
             got {}",
            self.t_max
        );
        ensure!(
            self.knots >= 2,
            "`knots` must be at least 2 (the trapezoid rule needs both ends; LeJEPA uses 17), \
             got {}",
            self.knots
        );
        Ok(())
    }

    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Lejepa { cfg: self.clone() }))
    }
}

/// The generator stream of SIGReg's directions (see [`ssl_core::Progress::rng`]).
const SLICE_STREAM: u64 = 0x1e_1e9a;

/// The LeJEPA objective; stateless apart from its configuration.
pub struct Lejepa {
    cfg: LejepaConfig,
}

impl Objective for Lejepa {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: 2,
            min_batch: 2,
            min_batch_reason: "SIGReg tests the distribution of the batch's embeddings; with one \
                               embedding per view it can only pull it to the origin",
            projector: true,
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let (views, _, dim) = batch.projections.dims3()?;
        ensure!(
            views >= 2,
            "objective `lejepa` pulls every view to the centre of the global views and needs at \
             least 2 views per instance, got {views}; use --views 2 or more"
        );
        ensure!(
            (1..=views).contains(&batch.global_views),
            "objective `lejepa` needs between 1 and {views} global views, got {}",
            batch.global_views
        );
        let mut rng = batch.progress.rng(SLICE_STREAM);
        let directions =
            random_directions(dim, self.cfg.slices, &mut rng, batch.projections.device())?;
        let terms = lejepa_loss(
            batch.projections,
            batch.global_views,
            &directions,
            &self.cfg.quadrature(),
            self.cfg.lambda,
            batch.collective,
        )?;
        Ok(LossOutput::new(terms.loss)
            .with_term("prediction", terms.prediction)
            .with_term("sigreg", terms.sigreg))
    }
}

register_objective! {
    name: "lejepa",
    aliases: &["le-jepa"],
    summary: "every view predicts the centre of the global views; SIGReg (sliced Epps–Pulley) keeps the embeddings an isotropic Gaussian",
    paper: "Balestriero, LeCun. LeJEPA: Provable and Scalable Self-Supervised Learning Without \
            the Heuristics. arXiv:2511.08544, 2025",
    keys: &[
        ConfigKey { name: "lambda", doc: "λ: loss = (1 − λ)·prediction + λ·SIGReg (0.05)" },
        ConfigKey { name: "slices", doc: "random unit directions M drawn every step for SIGReg (1024)" },
        ConfigKey { name: "t_max", doc: "Epps–Pulley integral over [−t_max, t_max] (3, the official code's; the paper suggests 5)" },
        ConfigKey { name: "knots", doc: "trapezoid knots on [0, t_max], the integrand being even (17)" },
    ],
    config: LejepaConfig,
}
