//! CorInfoMax: correlative information maximisation.
//!
//! Ozsoy, Hamdan, Arik, Yuret & Erdogan, "Self-Supervised Learning with an Information
//! Maximization Criterion", NeurIPS 2022. Spec: `docs/spec/objectives.md` §2.14.
//!
//! Two views, row-normalised: `z1, z2 ∈ R^{N×d}`. Each branch keeps a running mean `μ` and a
//! running covariance `R` (initialised to `0` and `R_ini·I`); per step and branch
//!
//! * `μ_new = λ_μ·μ + (1−λ_μ)·mean(z)`,
//! * `R_new = λ_R·R + (1−λ_R)·(z−μ_new)ᵀ(z−μ_new)/N`,
//!
//! and `L = −[logdet(R1_new + εI) + logdet(R2_new + εI)]/d + α·mse(z1, z2)`. `λ_μ`, `λ_R` are
//! forgetting factors weighting the **old** value. The gradient flows through the current batch
//! only (`μ`, `R` are constants); `sg(μ_new)`, `sg(R_new)` are stored after a training-mode
//! [`Objective::loss`].
//!
//! The state is kept in float64 as in the reference code (on Metal, which has no f64, in the
//! builder's dtype), and the statistics are computed in that dtype; the log-determinants are
//! taken in f64 on the host with `ε` added there ([`ssl_linalg::logdet::logdet_spd_batched`]), so
//! the published `ε = 1e-8` is not lost below f32 resolution.
//!
//! The state lives in four buffers created through the builder:
//! `branch{1,2}.running_mean` (`μ`, `[d]`) and `branch{1,2}.running_var` (`R`, `[d, d]` — the
//! running **covariance**, not a variance vector; the suffix makes the trainer treat it as a
//! buffer that is checkpointed and never optimised).
//!
//! Smallest batch: `B = 1` (spec §5): the running covariance keeps `R_new` definite, but a single
//! sample gives no batch covariance to speak of; the criterion is meaningful for `B ≥ 2`.
//!
//! # Example
//!
//! The two views `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]` each, f64)
//! from the initial state (`μ = 0`, `R = I`) and the spec's known answers:
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use ssl_corinfomax::{corinfomax_loss, corinfomax_terms, CorInfoMaxConfig};
//!
//! let dev = &Device::Cpu;
//! let za = Tensor::new(&[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]], dev)?;
//! let zb = Tensor::new(&[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]], dev)?;
//! let z = Tensor::stack(&[&za, &zb], 0)?; // [V = 2, B = 4, d = 3]
//! let mean = Tensor::zeros((2, 3), DType::F64, dev)?; // μ of each branch
//! let eye = Tensor::eye(3, DType::F64, dev)?;
//! let cov = Tensor::stack(&[&eye, &eye], 0)?; // R of each branch
//! let cfg = CorInfoMaxConfig::default();
//! let terms = corinfomax_terms(&z, &mean, &cov, &cfg)?;
//! assert!((terms.covariance.to_scalar::<f64>()? - 5.3157861974).abs() < 1e-9);
//! assert!((terms.invariance.to_scalar::<f64>()? - 0.0968435108).abs() < 1e-9);
//! assert!((corinfomax_loss(&terms, &cfg)?.to_scalar::<f64>()? - 29.5266639018).abs() < 1e-8);
//! assert_eq!(terms.cov.dims(), [2, 3, 3]); // R_new, stored for the next step
//! # Ok::<(), candle_core::Error>(())
//! ```

use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use candle_nn::Init;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::logdet::logdet_spd_batched;

pub use ssl_linalg::normalize_rows;

/// The CorInfoMax terms of one step, and the updated statistics.
pub struct CorInfoMaxTerms {
    /// `cov_loss = −[logdet(R1_new + εI) + logdet(R2_new + εI)]/d`, in `z`'s dtype.
    pub covariance: Tensor,
    /// `mse(ẑ1, ẑ2)`, mean over all elements.
    pub invariance: Tensor,
    /// `μ_new` of both branches, `[2, d]`, in the state's dtype (still attached to the graph).
    pub mean: Tensor,
    /// `R_new` of both branches, `[2, d, d]`, in the state's dtype (still attached to the graph).
    pub cov: Tensor,
}

/// One CorInfoMax step (spec §2.14) for `z`: `[2, N, d]` (projector outputs; rows normalised
/// here) and the stored state `mean`: `[2, d]`, `cov`: `[2, d, d]` (used as constants). The
/// statistics are computed in the state's dtype.
pub fn corinfomax_terms(
    z: &Tensor,
    mean: &Tensor,
    cov: &Tensor,
    cfg: &CorInfoMaxConfig,
) -> candle_core::Result<CorInfoMaxTerms> {
    let (v, n, d) = z.dims3()?;
    if v != 2 {
        candle_core::bail!("CorInfoMax takes exactly 2 views, got {v}");
    }
    if n == 0 {
        candle_core::bail!("CorInfoMax: the batch is empty");
    }
    let z_hat = normalize_rows(z)?;
    let invariance = (z_hat.get(0)? - z_hat.get(1)?)?.sqr()?.mean_all()?;

    let zs = z_hat.to_dtype(cov.dtype())?;
    let mean = ((mean.detach() * cfg.lambda_mu)? + (zs.mean(1)? * (1.0 - cfg.lambda_mu))?)?;
    let centred = zs.broadcast_sub(&mean.unsqueeze(1)?)?;
    let batch_cov = (centred.transpose(1, 2)?.matmul(&centred)? / n as f64)?;
    let cov = ((cov.detach() * cfg.lambda_r)? + (batch_cov * (1.0 - cfg.lambda_r))?)?;
    let covariance =
        (logdet_spd_batched(&cov, cfg.eps)?.sum_all()? * (-1.0 / d as f64))?.to_dtype(z.dtype())?;
    Ok(CorInfoMaxTerms {
        covariance,
        invariance,
        mean,
        cov,
    })
}

/// `cov_loss + α·mse` from [`CorInfoMaxTerms`].
pub fn corinfomax_loss(
    terms: &CorInfoMaxTerms,
    cfg: &CorInfoMaxConfig,
) -> candle_core::Result<Tensor> {
    &terms.covariance + (&terms.invariance * cfg.alpha)?
}

/// CorInfoMax hyper-parameters (CIFAR-10 command of the reference code).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorInfoMaxConfig {
    /// Weight α of the invariance (mse) term.
    pub alpha: f64,
    /// Forgetting factor λ_μ of the running mean (weight of the old value).
    pub lambda_mu: f64,
    /// Forgetting factor λ_R of the running covariance (weight of the old value).
    pub lambda_r: f64,
    /// Ridge ε added to `R_new` inside the log-determinant.
    pub eps: f64,
    /// Initial running covariance `R_ini·I`.
    pub r_ini: f64,
}

impl Default for CorInfoMaxConfig {
    fn default() -> Self {
        Self {
            alpha: 250.0,
            lambda_mu: 0.01,
            lambda_r: 0.01,
            eps: 1e-8,
            r_ini: 1.0,
        }
    }
}

impl ObjectiveConfig for CorInfoMaxConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.alpha.is_finite() && self.alpha >= 0.0,
            "`alpha` must be a finite weight ≥ 0, got {}",
            self.alpha
        );
        for (key, value) in [("lambda_mu", self.lambda_mu), ("lambda_r", self.lambda_r)] {
            anyhow::ensure!(
                (0.0..1.0).contains(&value),
                "`{key}` must be a forgetting factor in [0, 1) (1 would ignore every batch), got {value}"
            );
        }
        anyhow::ensure!(
            self.eps.is_finite() && self.eps >= 0.0,
            "`eps` must be a finite ridge ≥ 0, got {}",
            self.eps
        );
        anyhow::ensure!(
            self.r_ini.is_finite() && self.r_ini > 0.0,
            "`r_ini` must be > 0 (the initial covariance R_ini·I must be positive definite), got {}",
            self.r_ini
        );
        Ok(())
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let d = ctx.projection_dim;
        anyhow::ensure!(d > 0, "CorInfoMax needs a projection width > 0");
        let dev = ctx.vb.device();
        let dtype = match dev.is_metal() {
            true => ctx.vb.dtype(),
            false => DType::F64,
        };
        let mut mean = Vec::with_capacity(2);
        let mut cov = Vec::with_capacity(2);
        for branch in ["branch1", "branch2"] {
            let vb = ctx.vb.pp(branch);
            mean.push(vb.get_with_hints_dtype(d, "running_mean", Init::Const(0.0), dtype)?);
            let r = vb.get_with_hints_dtype((d, d), "running_var", Init::Const(0.0), dtype)?;
            // A fresh buffer is all zeros (never a valid covariance); an existing one is kept.
            let fresh = r
                .abs()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?
                == 0.0;
            if fresh {
                r.slice_set(&(Tensor::eye(d, dtype, dev)? * self.r_ini)?, 0, 0)?;
            }
            cov.push(r);
        }
        Ok(Box::new(CorInfoMax {
            cfg: self.clone(),
            mean,
            cov,
        }))
    }
}

/// The CorInfoMax objective with its running statistics (buffers shared with the builder's
/// store, so they are checkpointed).
pub struct CorInfoMax {
    cfg: CorInfoMaxConfig,
    mean: Vec<Tensor>,
    cov: Vec<Tensor>,
}

impl CorInfoMax {
    /// The stored `μ` of both branches, `[2, d]`.
    pub fn running_mean(&self) -> candle_core::Result<Tensor> {
        Tensor::stack(&self.mean, 0)
    }
    /// The stored running covariance `R` of both branches, `[2, d, d]`.
    pub fn running_cov(&self) -> candle_core::Result<Tensor> {
        Tensor::stack(&self.cov, 0)
    }
}

impl Objective for CorInfoMax {
    fn requirements(&self) -> Requirements {
        Requirements {
            max_views: Some(2),
            min_batch: 1,
            min_batch_reason: "the running covariance keeps R definite; the batch covariance is \
                               only meaningful for B ≥ 2",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let terms = corinfomax_terms(&z, &self.running_mean()?, &self.running_cov()?, &self.cfg)
            .with_context(|| {
                format!(
                    "CorInfoMax covariance term (eps = {:e}; raise `eps` if R is singular)",
                    self.cfg.eps
                )
            })?;
        let loss = corinfomax_loss(&terms, &self.cfg)?;
        if batch.train {
            for k in 0..2 {
                self.mean[k].slice_set(&terms.mean.get(k)?.detach(), 0, 0)?;
                self.cov[k].slice_set(&terms.cov.get(k)?.detach(), 0, 0)?;
            }
        }
        Ok(LossOutput::new(loss)
            .with_term("covariance", terms.covariance)
            .with_term("invariance", terms.invariance))
    }
}

register_objective! {
    name: "corinfomax",
    aliases: &[],
    summary: "Log-determinant of running per-branch covariances + α·mse (correlative information maximisation)",
    paper: "Ozsoy, Hamdan, Arik, Yuret, Erdogan. Self-Supervised Learning with an Information Maximization Criterion. NeurIPS 2022",
    keys: &[
        ConfigKey { name: "alpha", doc: "weight α of mse(z1, z2) (250 CIFAR-10, 1000 CIFAR-100, 500 Tiny-ImageNet)" },
        ConfigKey { name: "lambda_mu", doc: "forgetting factor λ_μ of the running mean: weight of the old value, in [0, 1)" },
        ConfigKey { name: "lambda_r", doc: "forgetting factor λ_R of the running covariance: weight of the old value, in [0, 1)" },
        ConfigKey { name: "eps", doc: "ridge ε in logdet(R + εI) (1e-8 in the published commands)" },
        ConfigKey { name: "r_ini", doc: "initial running covariance R_ini·I" },
    ],
    config: CorInfoMaxConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use candle_nn::VarBuilder;
    use ssl_core::testing::{close, randn, scalar, spec_za_zb};
    use ssl_core::{Ids, ParamStore};

    fn za_zb() -> candle_core::Result<Tensor> {
        let (a, b) = spec_za_zb()?;
        Tensor::stack(&[a, b], 0)
    }

    fn initial_state(d: usize, dtype: DType) -> candle_core::Result<(Tensor, Tensor)> {
        let eye = Tensor::eye(d, dtype, &Device::Cpu)?;
        Ok((
            Tensor::zeros((2, d), dtype, &Device::Cpu)?,
            Tensor::stack(&[&eye, &eye], 0)?,
        ))
    }

    const KAT_COV: f64 = 5.3157861974;
    const KAT_MSE: f64 = 0.0968435108;
    const KAT_L: f64 = 29.5266639018;

    #[test]
    fn known_answers_spec_2_14() -> candle_core::Result<()> {
        let cfg = CorInfoMaxConfig::default();
        let (mean, cov) = initial_state(3, DType::F64)?;
        let t = corinfomax_terms(&za_zb()?, &mean, &cov, &cfg)?;
        close(scalar(&t.covariance), KAT_COV, 1e-9);
        close(scalar(&t.invariance), KAT_MSE, 1e-9);
        close(scalar(&corinfomax_loss(&t, &cfg)?), KAT_L, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answers_in_f32() -> candle_core::Result<()> {
        let cfg = CorInfoMaxConfig::default();
        let z = za_zb()?.to_dtype(DType::F32)?;
        // f32 projections with an f64 state (the trainer on CPU/CUDA) and with an f32 state
        // (Metal).
        for state in [DType::F64, DType::F32] {
            let (mean, cov) = initial_state(3, state)?;
            let t = corinfomax_terms(&z, &mean, &cov, &cfg)?;
            assert_eq!(t.covariance.dtype(), DType::F32);
            assert_eq!(t.cov.dtype(), state);
            close(scalar(&t.covariance), KAT_COV, 1e-4);
            close(scalar(&t.invariance), KAT_MSE, 1e-4);
            close(scalar(&corinfomax_loss(&t, &cfg)?), KAT_L, 1e-4);
        }
        Ok(())
    }

    /// The recurrence of spec §2.14 for one branch, with host loops.
    fn naive_update(
        z: &[Vec<f64>],
        mu: &[f64],
        r: &[Vec<f64>],
        cfg: &CorInfoMaxConfig,
    ) -> (Vec<f64>, Vec<Vec<f64>>) {
        let n = z.len() as f64;
        let d = mu.len();
        let unit: Vec<Vec<f64>> = z
            .iter()
            .map(|row| {
                let norm = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                row.iter().map(|x| x / norm).collect()
            })
            .collect();
        let mu_new: Vec<f64> = (0..d)
            .map(|j| {
                let m = unit.iter().map(|row| row[j]).sum::<f64>() / n;
                cfg.lambda_mu * mu[j] + (1.0 - cfg.lambda_mu) * m
            })
            .collect();
        let r_new = (0..d)
            .map(|i| {
                (0..d)
                    .map(|j| {
                        let c = unit
                            .iter()
                            .map(|row| (row[i] - mu_new[i]) * (row[j] - mu_new[j]))
                            .sum::<f64>()
                            / n;
                        cfg.lambda_r * r[i][j] + (1.0 - cfg.lambda_r) * c
                    })
                    .collect()
            })
            .collect();
        (mu_new, r_new)
    }

    fn build_in(vb: VarBuilder<'static>, d: usize, overrides: &str) -> Result<Box<dyn Objective>> {
        let ctx = BuildContext {
            vb: vb.pp("objective"),
            num_instances: 10,
            num_classes: None,
            instance_labels: None,
            projection_dim: d,
            feature_dim: d,
            views: 2,
            global_views: 2,
            batch_size: 4,
            patches: None,
        };
        let value: serde_yaml::Value = serde_yaml::from_str(overrides)?;
        (ssl_core::find("corinfomax")?.build)(&value, &ctx)
    }

    fn run(objective: &mut dyn Objective, z: &Tensor, train: bool) -> Result<LossOutput> {
        let b = z.dim(1)?;
        let indices = Ids::range(b, &Device::Cpu)?;
        let batch = Batch {
            train,
            ..ssl_core::testing::batch(z, &indices, None)
        };
        objective.loss(&batch)
    }

    fn buffer(store: &ParamStore, name: &str) -> Tensor {
        store.tensors()[name].clone()
    }

    #[test]
    fn state_follows_the_recurrence_over_two_steps() -> Result<()> {
        let cfg = CorInfoMaxConfig {
            lambda_mu: 0.3,
            lambda_r: 0.2,
            ..CorInfoMaxConfig::default()
        };
        let (n, d) = (6, 4);
        let store = ParamStore::new(7);
        let vb = store.var_builder(&Device::Cpu).set_dtype(DType::F32);
        let mut objective = build_in(vb, d, "lambda_mu: 0.3\nlambda_r: 0.2")?;
        let steps = [
            randn(0f64, 1., (2, n, d), &Device::Cpu)?,
            randn(0f64, 1., (2, n, d), &Device::Cpu)?,
        ];
        let mut mu = vec![vec![0.0; d]; 2];
        let mut r: Vec<Vec<Vec<f64>>> = (0..2)
            .map(|_| {
                (0..d)
                    .map(|i| (0..d).map(|j| f64::from(u8::from(i == j))).collect())
                    .collect()
            })
            .collect();
        for z in &steps {
            // The loss uses the state before this step's update.
            let state_mean = Tensor::new(mu.clone(), &Device::Cpu)?;
            let state_cov = Tensor::new(r.clone(), &Device::Cpu)?;
            let want = corinfomax_terms(z, &state_mean, &state_cov, &cfg)?;
            let out = run(objective.as_mut(), z, true)?;
            close(
                scalar(&out.loss),
                scalar(&corinfomax_loss(&want, &cfg)?),
                1e-12,
            );
            for k in 0..2 {
                (mu[k], r[k]) = naive_update(&z.get(k)?.to_vec2::<f64>()?, &mu[k], &r[k], &cfg);
            }
        }
        for (k, branch) in ["branch1", "branch2"].iter().enumerate() {
            let mean = buffer(&store, &format!("objective.{branch}.running_mean"));
            let cov = buffer(&store, &format!("objective.{branch}.running_var"));
            assert_eq!(mean.dtype(), DType::F64);
            for (a, b) in mean.to_vec1::<f64>()?.iter().zip(&mu[k]) {
                close(*a, *b, 1e-12);
            }
            for (ra, rb) in cov.to_vec2::<f64>()?.iter().zip(&r[k]) {
                for (a, b) in ra.iter().zip(rb) {
                    assert!((a - b).abs() < 1e-13, "{a} vs {b}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn evaluation_mode_leaves_the_state_alone() -> Result<()> {
        let store = ParamStore::new(7);
        let vb = store.var_builder(&Device::Cpu).set_dtype(DType::F64);
        let mut objective = build_in(vb, 3, "")?;
        let first = run(objective.as_mut(), &za_zb()?, false)?;
        let again = run(objective.as_mut(), &za_zb()?, false)?;
        close(scalar(&first.loss), KAT_L, 1e-9);
        close(scalar(&again.loss), KAT_L, 1e-9);
        let cov = buffer(&store, "objective.branch1.running_var");
        assert_eq!(
            cov.to_vec2::<f64>()?,
            Tensor::eye(3, DType::F64, &Device::Cpu)?.to_vec2::<f64>()?
        );
        let trained = run(objective.as_mut(), &za_zb()?, true)?;
        close(scalar(&trained.loss), KAT_L, 1e-9);
        let after = run(objective.as_mut(), &za_zb()?, false)?;
        assert!((scalar(&after.loss) - KAT_L).abs() > 1e-3);
        let names: Vec<&str> = trained.terms.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names, ["covariance", "invariance"]);
        Ok(())
    }

    #[test]
    fn trainer_store_holds_detached_f64_buffers() -> Result<()> {
        let store = ssl_core::ParamStore::new(3);
        let mut objective = build_in(store.var_builder(&Device::Cpu), 3, "r_ini: 2")?;
        let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "objective.branch1.running_mean",
                "objective.branch1.running_var",
                "objective.branch2.running_mean",
                "objective.branch2.running_var",
            ]
        );
        assert!(names.iter().all(|n| ssl_core::ParamStore::is_buffer(n)));
        let r = &store.tensors()["objective.branch2.running_var"];
        assert_eq!(r.dtype(), DType::F64);
        assert_eq!(r.to_vec2::<f64>()?[1], [0.0, 2.0, 0.0]);
        let z = Var::from_tensor(&za_zb()?.to_dtype(DType::F32)?)?;
        let out = run(objective.as_mut(), z.as_tensor(), true)?;
        let grads = out.loss.backward()?;
        assert!(grads.get(z.as_tensor()).is_some());
        for (name, var) in store.vars() {
            assert!(
                grads.get(var.as_tensor()).is_none(),
                "{name} is in the graph"
            );
        }
        // Updated in place: the store sees the new state.
        let r = &store.tensors()["objective.branch2.running_var"];
        assert!(r.to_vec2::<f64>()?[1][1] < 1.0);
        // A second build on the same store keeps the state.
        let _again = build_in(store.var_builder(&Device::Cpu), 3, "r_ini: 2")?;
        let kept = &store.tensors()["objective.branch2.running_var"];
        assert_eq!(kept.to_vec2::<f64>()?, r.to_vec2::<f64>()?);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences_with_the_state_fixed() -> candle_core::Result<()> {
        let cfg = CorInfoMaxConfig {
            alpha: 2.0,
            ..CorInfoMaxConfig::default()
        };
        let (n, d) = (5, 3);
        let dev = Device::Cpu;
        let mean = randn(0f64, 0.3, (2, d), &dev)?;
        let x = randn(0f64, 1., (2, 7, d), &dev)?;
        let cov = (x.transpose(1, 2)?.matmul(&x)? / 7.0)?;
        let z = randn(0f64, 1., (2, n, d), &dev)?;
        let loss = |z: &Tensor| corinfomax_loss(&corinfomax_terms(z, &mean, &cov, &cfg)?, &cfg);
        let err = ssl_core::testing::max_gradient_error(&z, loss)?;
        assert!(err < 1e-6, "relative gradient error {err}");
        // Default α and the first-step state, B < d (R_new definite only through the state).
        let (mean, cov) = initial_state(6, DType::F64)?;
        let cfg = CorInfoMaxConfig::default();
        let z = randn(0f64, 1., (2, 3, 6), &dev)?;
        let err = ssl_core::testing::max_gradient_error(&z, |z| {
            corinfomax_loss(&corinfomax_terms(z, &mean, &cov, &cfg)?, &cfg)
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    #[test]
    fn no_gradient_reaches_the_stored_state() -> candle_core::Result<()> {
        let (mean, cov) = initial_state(3, DType::F64)?;
        let (mean, cov) = (Var::from_tensor(&mean)?, Var::from_tensor(&cov)?);
        let z = Var::from_tensor(&za_zb()?)?;
        let cfg = CorInfoMaxConfig::default();
        let t = corinfomax_terms(z.as_tensor(), mean.as_tensor(), cov.as_tensor(), &cfg)?;
        let grads = corinfomax_loss(&t, &cfg)?.backward()?;
        assert!(grads.get(z.as_tensor()).is_some());
        assert!(grads.get(mean.as_tensor()).is_none());
        assert!(grads.get(cov.as_tensor()).is_none());
        Ok(())
    }

    #[test]
    fn singular_running_covariance_is_a_clear_error() -> Result<()> {
        // λ_R = 0 and ε = 0: R_new is the batch covariance, exactly zero on the three
        // dimensions the embeddings never use.
        let store = ParamStore::new(7);
        let vb = store.var_builder(&Device::Cpu).set_dtype(DType::F64);
        let mut objective = build_in(vb, 5, "lambda_r: 0\neps: 0")?;
        let z = Tensor::cat(
            &[
                randn(0f64, 1., (2, 3, 2), &Device::Cpu)?,
                Tensor::zeros((2, 3, 3), DType::F64, &Device::Cpu)?,
            ],
            2,
        )?;
        let err = format!("{:#}", run(objective.as_mut(), &z, true).err().unwrap());
        assert!(
            err.contains("not positive definite") && err.contains("raise `eps`"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn requirements_two_views_and_any_batch() -> Result<()> {
        let store = ParamStore::new(7);
        let vb = store.var_builder(&Device::Cpu).set_dtype(DType::F64);
        let req = build_in(vb, 3, "")?.requirements();
        req.check("corinfomax", 2, 1, false)?;
        let err = req
            .check("corinfomax", 3, 8, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 2 views"), "{err}");
        let err = req
            .check("corinfomax", 1, 8, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least 2 views"), "{err}");
        // B = 1 is defined with the default state: the loss is finite.
        let (mean, cov) = initial_state(4, DType::F64)?;
        let z = randn(0f64, 1., (2, 1, 4), &Device::Cpu)?;
        let cfg = CorInfoMaxConfig::default();
        let t = corinfomax_terms(&z, &mean, &cov, &cfg)?;
        assert!(scalar(&corinfomax_loss(&t, &cfg)?).is_finite());
        let three = randn(0f64, 1., (3, 4, 4), &Device::Cpu)?;
        let err = corinfomax_terms(&three, &mean, &cov, &cfg)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("exactly 2 views"), "{err}");
        Ok(())
    }

    #[test]
    fn identical_views_have_zero_invariance() -> candle_core::Result<()> {
        let z = za_zb()?;
        let a = z.get(0)?;
        let same = Tensor::stack(&[&a, &(&a * 4.0)?], 0)?;
        let (mean, cov) = initial_state(3, DType::F64)?;
        let t = corinfomax_terms(&same, &mean, &cov, &CorInfoMaxConfig::default())?;
        assert!(scalar(&t.invariance).abs() < 1e-15);
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("corinfomax").unwrap();
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["alpha"].as_f64(), Some(250.0));
        assert_eq!(defaults["lambda_mu"].as_f64(), Some(0.01));
        assert_eq!(defaults["lambda_r"].as_f64(), Some(0.01));
        assert_eq!(defaults["eps"].as_f64(), Some(1e-8));
        assert_eq!(defaults["r_ini"].as_f64(), Some(1.0));
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let parse = |text: &str| {
            let v: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            format!(
                "{:#}",
                ssl_core::registry::parse_config::<CorInfoMaxConfig>("corinfomax", &v).unwrap_err()
            )
        };
        let err = parse("la_R: 0.1");
        assert!(
            err.contains("unknown field `la_R`") && err.contains("lambda_r"),
            "{err}"
        );
        let err = parse("lambda_r: 1");
        assert!(
            err.contains("`lambda_r`") && err.contains("[0, 1)"),
            "{err}"
        );
        let err = parse("r_ini: 0");
        assert!(err.contains("`r_ini`"), "{err}");
        let err = parse("eps: -1e-8");
        assert!(err.contains("`eps`"), "{err}");
    }
}
