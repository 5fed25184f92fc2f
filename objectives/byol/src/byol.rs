//! BYOL (spec `docs/spec/objectives.md` §2.18): predictions of the online network regress onto the
//! EMA teacher's projections, `ℓ(v→w) = mean_i (2 − 2·cos(q_i^(v), sg(z'_i^(w))))`,
//! `L = Σ_{(v,w)} ℓ(v→w)` over the ordered view pairs of the crate docs (at two views
//! `L = ℓ(1→2) + ℓ(2→1)`, a sum). After each step the teacher follows `ξ ← τ_k ξ + (1 − τ_k) θ`
//! with `τ_k = 1 − (1 − τ_base)(cos(πk/K) + 1)/2` (spec §3).

use anyhow::{bail, Result};
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements, RunFacts, StepContext, TeacherSpec,
};
use ssl_linalg::normalize_rows;

use crate::{mean_pair_cosine, Predictor, MIN_BATCH_REASON};

/// `mean_i (2 − 2·cos(p_i, sg(z_i)))` of predictions `p`: `[B, D]` and targets `z`: `[B, D]`,
/// in `[0, 4]`.
pub fn regression_loss(p: &Tensor, z: &Tensor) -> candle_core::Result<Tensor> {
    let cos = (normalize_rows(p)? * normalize_rows(&z.detach())?)?.sum(D::Minus1)?;
    cos.mean_all()?.affine(-2.0, 2.0)
}

/// The BYOL loss `Σ_{w<V_g} Σ_{v≠w} mean_i (2 − 2·cos(q_i^(v), sg(z_i^(w))))` of online
/// predictions `q`: `[V, B, D]` (all crops) and teacher projections `z`: `[V_g, B, D]` (the
/// global crops, view `w` of `z` is view `w` of `q`); equals `P·(2 − 2c̄)` with `P = V_g(V − 1)`
/// pairs and `c̄` their mean cosine ([`crate::mean_pair_cosine`]). Lies in `[0, 4P]`.
pub fn byol_loss(q: &Tensor, z: &Tensor) -> candle_core::Result<Tensor> {
    let (mean, pairs) = mean_pair_cosine(q, z)?;
    let pairs = pairs as f64;
    mean.affine(-2.0 * pairs, 2.0 * pairs)
}

/// BYOL hyper-parameters (paper defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ByolConfig {
    /// Base EMA momentum τ_base of the cosine schedule (0.996 paper; 0.99 IConE baseline).
    pub tau_base: f64,
    /// Hidden width of the predictor `D → hidden → D` (4096 in the paper).
    pub predictor_hidden: usize,
}

impl Default for ByolConfig {
    fn default() -> Self {
        Self {
            tau_base: 0.996,
            predictor_hidden: 4096,
        }
    }
}

impl ObjectiveConfig for ByolConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.tau_base),
            "`tau_base` must lie in [0, 1] (0.996 in the paper), got {}",
            self.tau_base
        );
        anyhow::ensure!(
            self.predictor_hidden > 0,
            "`predictor_hidden` must be at least 1 (4096 in the paper), got 0"
        );
        Ok(())
    }

    /// A predictor much wider than the projections it reads (the paper's 4096 on 256) is
    /// fitted to them ([`RunFacts::fit_head_width`]).
    fn fit_to_data(&mut self, run: &RunFacts, defaulted: &dyn Fn(&str) -> bool) -> Vec<String> {
        let paper = "256-d projections";
        (run.fit_head_width(
            "predictor_hidden",
            &mut self.predictor_hidden,
            run.projection_dim,
            paper,
            defaulted,
        ))
        .into_iter()
        .collect()
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Byol {
            config: self.clone(),
            predictor: Predictor::new(
                ctx.projection_dim,
                self.predictor_hidden,
                ctx.vb.pp("predictor"),
            )?,
        }))
    }
}

/// The BYOL objective: owns the predictor, asks the trainer for a train-mode EMA teacher.
pub struct Byol {
    config: ByolConfig,
    predictor: Predictor,
}

impl Objective for Byol {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: MIN_BATCH_REASON,
            teacher: Some(TeacherSpec { train_mode: true }),
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let Some(teacher) = batch.teacher else {
            bail!(
                "objective `byol` needs the EMA teacher's projections (Batch::teacher), but the batch \
                 has none; the trainer provides them when requirements().teacher is set"
            );
        };
        if teacher.dim(0)? != batch.global_views {
            bail!(
                "objective `byol` expects teacher projections of the {} global views, got {:?}",
                batch.global_views,
                teacher.dims()
            );
        }
        let q = self
            .predictor
            .forward_views(batch.projections, batch.train)?;
        Ok(LossOutput::new(byol_loss(&q, teacher)?))
    }

    fn after_step(&mut self, ctx: &StepContext<'_>) -> Result<()> {
        ctx.ema_update(ctx.progress.cosine_ramp(self.config.tau_base, 1.0))
    }
}

register_objective! {
    name: "byol",
    aliases: &[],
    summary: "predictor regresses onto an EMA teacher's projections (2 − 2·cos, summed over view pairs)",
    paper: "Grill, Strub, Altché, Tallec, Richemond, Buchatskaya, Doersch, Pires, Guo, Azar, Piot, \
            Kavukcuoglu, Munos, Valko. Bootstrap Your Own Latent: A New Approach to Self-Supervised \
            Learning. NeurIPS 2020",
    keys: &[
        ConfigKey { name: "tau_base", doc: "base EMA momentum τ_base, cosine-ramped to 1 over training (0.996; 0.99 in the IConE baseline)" },
        ConfigKey { name: "predictor_hidden", doc: "hidden width of the predictor D → hidden → D (4096)" },
    ],
    config: ByolConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{build, config_error, loss_error, spec_p_z};
    use candle_core::{DType, Device, Var};
    use ssl_core::testing::{batch, close, max_gradient_error, randn, scalar};
    use ssl_core::{Ids, ParamStore, Progress};

    const KAT_L: f64 = 0.5553555388;

    #[test]
    fn known_answer_spec_2_18() -> candle_core::Result<()> {
        let (p, z) = spec_p_z()?;
        close(scalar(&byol_loss(&p, &z)?), KAT_L, 1e-9);
        let two_directions = scalar(&regression_loss(&p.get(0)?, &z.get(1)?)?)
            + scalar(&regression_loss(&p.get(1)?, &z.get(0)?)?);
        close(two_directions, KAT_L, 1e-9);
        let (p32, z32) = (p.to_dtype(DType::F32)?, z.to_dtype(DType::F32)?);
        close(scalar(&byol_loss(&p32, &z32)?), KAT_L, 1e-4);
        Ok(())
    }

    #[test]
    fn multi_crop_sums_every_global_target_with_every_other_view() -> candle_core::Result<()> {
        let dev = &Device::Cpu;
        let (v, vg) = (4, 2);
        let q = randn(0f64, 1., (v, 5, 3), dev)?;
        let z = randn(0f64, 1., (vg, 5, 3), dev)?;
        let mut expected = 0.0;
        for w in 0..vg {
            for o in (0..v).filter(|&o| o != w) {
                expected += scalar(&regression_loss(&q.get(o)?, &z.get(w)?)?);
            }
        }
        let loss = scalar(&byol_loss(&q, &z)?);
        close(loss, expected, 1e-12);
        assert!((0.0..=4.0 * 6.0).contains(&loss));
        // Predictions equal to the targets' directions reach the minimum 0 at two views.
        let z2 = randn(0f64, 1., (2, 5, 3), dev)?;
        let aligned = Tensor::stack(&[(z2.get(1)? * 3.0)?, (z2.get(0)? * 0.5)?], 0)?;
        assert!(scalar(&byol_loss(&aligned, &z2)?).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences_and_skips_the_targets() -> candle_core::Result<()> {
        let dev = &Device::Cpu;
        for (v, vg) in [(2, 2), (3, 2), (3, 1)] {
            let q = randn(0f64, 1., (v, 4, 3), dev)?;
            let z = randn(0f64, 1., (vg, 4, 3), dev)?;
            let err = max_gradient_error(&q, |q| byol_loss(q, &z))?;
            assert!(err < 1e-6, "V={v}, V_g={vg}: relative gradient error {err}");
            let target = Var::from_tensor(&z)?;
            let grads = byol_loss(&q, target.as_tensor())?.backward()?;
            assert!(grads.get(target.as_tensor()).is_none());
        }
        Ok(())
    }

    fn progress(step: usize, total_steps: usize) -> Progress {
        Progress {
            step,
            epoch: 0,
            steps_per_epoch: total_steps,
            total_steps,
            seed: 0,
        }
    }

    #[test]
    fn momentum_schedule_spec_2_18() {
        for (k, tau) in [(0, 0.996), (50, 0.998), (100, 1.0)] {
            close(progress(k, 100).cosine_ramp(0.996, 1.0), tau, 1e-12);
        }
    }

    #[test]
    fn after_step_moves_the_teacher_with_the_scheduled_momentum() -> Result<()> {
        let dev = &Device::Cpu;
        let store = ParamStore::new(0);
        let mut objective = build("byol", "predictor_hidden: 4", &store, 3)?;
        let student = vec![("w".to_string(), Var::new(&[1f32, 2., 3.], dev)?)];
        let teacher = vec![("w".to_string(), Var::new(&[0f32, 0., 0.], dev)?)];
        objective.after_step(&StepContext {
            progress: progress(50, 100),
            student: &student,
            teacher: Some(&teacher),
        })?;
        let got = teacher[0].1.as_tensor().to_vec1::<f32>()?;
        for (g, s) in got.iter().zip([1.0, 2.0, 3.0]) {
            close(*g as f64, (1.0 - 0.998) * s, 1e-4);
        }
        let err = objective
            .after_step(&StepContext {
                progress: progress(0, 100),
                student: &student,
                teacher: None,
            })
            .unwrap_err();
        assert!(err.to_string().contains("teacher"), "{err}");
        Ok(())
    }

    #[test]
    fn objective_built_from_the_registry_trains_its_predictor() -> Result<()> {
        let dev = &Device::Cpu;
        let store = ParamStore::new(7);
        let mut objective = build("byol", "predictor_hidden: 16", &store, 8)?;
        let req = objective.requirements();
        assert_eq!(req.teacher, Some(TeacherSpec { train_mode: true }));
        assert!(req.projector && !req.labels);
        assert_eq!((req.min_views, req.max_views, req.min_batch), (2, None, 2));
        assert_eq!(
            store.tensors()["objective.predictor.0.weight"].dims(),
            [16, 8]
        );
        assert_eq!(
            store.tensors()["objective.predictor.3.weight"].dims(),
            [8, 16]
        );

        let z = Var::from_tensor(&randn(0f32, 1., (3, 4, 8), dev)?)?;
        let teacher = randn(0f32, 1., (2, 4, 8), dev)?;
        let indices = Ids::range(4, dev)?;
        let b = Batch {
            teacher: Some(&teacher),
            global_views: 2,
            ..batch(z.as_tensor(), &indices, None)
        };
        let out = objective.loss(&b)?;
        let loss = scalar(&out.loss);
        assert!(loss.is_finite() && (0.0..=16.0).contains(&loss), "{loss}");
        let grads = out.loss.backward()?;
        assert!(grads.get(z.as_tensor()).is_some());
        let (_, w) = &store.vars_with_prefix("objective.predictor.0.weight")[0];
        assert!(grads.get(w.as_tensor()).is_some());

        let err = loss_error(objective.as_mut(), &batch(z.as_tensor(), &indices, None));
        assert!(err.contains("teacher"), "{err}");
        let wrong = Batch {
            teacher: Some(&teacher),
            ..batch(z.as_tensor(), &indices, None)
        };
        let err = loss_error(objective.as_mut(), &wrong);
        assert!(err.contains("3 global views"), "{err}");
        Ok(())
    }

    #[test]
    fn a_batch_of_one_is_refused_with_the_reason() -> Result<()> {
        let dev = &Device::Cpu;
        let store = ParamStore::new(0);
        let mut objective = build("byol", "predictor_hidden: 4", &store, 3)?;
        let req = objective.requirements();
        let err = format!("{:#}", req.check("byol", 2, 1, false).unwrap_err());
        assert!(
            err.contains("batch size ≥ 2") && err.contains("batch norm"),
            "{err}"
        );
        assert!(req.check("byol", 2, 2, false).is_ok());
        let z = randn(0f32, 1., (2, 1, 3), dev)?;
        let indices = Ids::new(&[0], dev)?;
        let b = Batch {
            teacher: Some(&z),
            ..batch(&z, &indices, None)
        };
        let err = loss_error(objective.as_mut(), &b);
        assert!(err.contains("at least 2 instances"), "{err}");
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("byol").unwrap();
        assert!(reg.paper.contains("NeurIPS 2020") && reg.paper.contains("Grill"));
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["tau_base"].as_f64(), Some(0.996));
        assert_eq!(defaults["predictor_hidden"].as_u64(), Some(4096));
    }

    #[test]
    fn unknown_key_and_bad_values_are_clear_errors() {
        let err = config_error::<ByolConfig>("byol", "tau: 0.99");
        assert!(
            err.contains("unknown field `tau`") && err.contains("tau_base"),
            "{err}"
        );
        let err = config_error::<ByolConfig>("byol", "tau_base: 1.5");
        assert!(err.contains("`tau_base`") && err.contains("1.5"), "{err}");
        let err = config_error::<ByolConfig>("byol", "predictor_hidden: 0");
        assert!(err.contains("`predictor_hidden`"), "{err}");
    }
}
