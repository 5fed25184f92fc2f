//! SimSiam (spec `docs/spec/objectives.md` §2.19): `D(p, z) = −cos(p, sg(z))`,
//! `L = ½ D(p₁, z₂) + ½ D(p₂, z₁)`, with `z` the student's own projections and `p` the predictor's
//! output; no teacher, no EMA.
//!
//! The paper's projector ends in batch norm without affine parameters; the trainer's projector
//! ends in a linear layer, so with `output_bn` (default) the objective standardises each view's
//! projections over the batch (`(z − mean)/sqrt(var + 1e-5)`, train-mode statistics) before the
//! predictor and the targets — over the global batch under `model.sync_bn`, as the paper's
//! SyncBN projector ([`ssl_models::sync_bn::standardize_rows`]).
//!
//! The predictor (`objective.predictor.`) trains at the constant peak learning rate while the
//! rest follows the run's schedule (the paper's `fix_pred_lr`): a parameter group it declares,
//! which `train.param_groups` may override (`schedule: cosine`).
//!
//! **More than two views** (not in the paper): `L` is the mean of `D(p_v, z_w)` over the ordered
//! view pairs of the crate docs (targets `w` among the global crops, `v ≠ w` over all crops),
//! which is exactly the paper's formula at two views.

use anyhow::Result;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    ParamGroup, Requirements, Schedule,
};

use crate::{mean_pair_cosine, Predictor, MIN_BATCH_REASON};

/// ε of the projector-output batch norm (PyTorch's `BatchNorm1d` default).
const OUTPUT_BN_EPS: f64 = 1e-5;

/// The SimSiam loss `−(1/P) Σ_{w<V_g} Σ_{v≠w} mean_i cos(p_i^(v), sg(z_i^(w)))` of predictions
/// `p`: `[V, B, D]` and projections `z`: `[V_g, B, D]` (the first `V_g ≤ V` views; `V_g = V`
/// when every view is global), `P = V_g(V − 1)` ordered pairs. Lies in `[−1, 1]`; no gradient
/// reaches `z`.
pub fn simsiam_loss(p: &Tensor, z: &Tensor) -> candle_core::Result<Tensor> {
    mean_pair_cosine(p, z)?.0.neg()
}

/// The projector-output batch norm of projections `z`: `[V, B, D]`, each view's dimensions
/// standardised over its `B` rows (the global batch's under `model.sync_bn`).
fn output_batch_norm(z: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    let rows = z.transpose(1, 2)?.contiguous()?.reshape((v * d, b))?;
    ssl_models::sync_bn::standardize_rows(&rows, OUTPUT_BN_EPS)?
        .reshape((v, d, b))?
        .transpose(1, 2)?
        .contiguous()
}

/// SimSiam hyper-parameters (paper defaults).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimsiamConfig {
    /// Hidden (bottleneck) width of the predictor `D → hidden → D` (512 in the paper, for D =
    /// 2048).
    pub predictor_hidden: usize,
    /// Batch norm without affine on the projector's output, per view (the paper's projector).
    pub output_bn: bool,
}

impl Default for SimsiamConfig {
    fn default() -> Self {
        Self {
            predictor_hidden: 512,
            output_bn: true,
        }
    }
}

impl ObjectiveConfig for SimsiamConfig {
    fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.predictor_hidden > 0,
            "`predictor_hidden` must be at least 1 (512 in the paper), got 0"
        );
        Ok(())
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Simsiam {
            predictor: Predictor::new(
                ctx.projection_dim,
                self.predictor_hidden,
                ctx.vb.pp("predictor"),
            )?,
            output_bn: self.output_bn,
        }))
    }
}

/// The SimSiam objective: owns the predictor; the targets are the student's own projections.
pub struct Simsiam {
    predictor: Predictor,
    output_bn: bool,
}

impl Objective for Simsiam {
    fn requirements(&self) -> Requirements {
        // The paper's predictor keeps its initial learning rate (`fix_pred_lr`): no decay.
        let mut predictor = ParamGroup::new(["objective.predictor."]);
        predictor.schedule = Some(Schedule::Constant);
        Requirements {
            min_batch: 2,
            min_batch_reason: MIN_BATCH_REASON,
            param_groups: vec![predictor],
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = &match self.output_bn {
            true => output_batch_norm(batch.projections)?,
            false => batch.projections.clone(),
        };
        let p = self.predictor.forward_views(z, batch.train)?;
        let targets = z.narrow(0, 0, batch.global_views)?;
        Ok(LossOutput::new(simsiam_loss(&p, &targets)?))
    }
}

register_objective! {
    name: "simsiam",
    aliases: &[],
    summary: "predictor regresses onto the stop-gradient projection of the other view (−cos, symmetrised)",
    paper: "Chen, He. Exploring Simple Siamese Representation Learning. CVPR 2021",
    keys: &[
        ConfigKey { name: "predictor_hidden", doc: "hidden (bottleneck) width of the predictor D → hidden → D (512)" },
        ConfigKey { name: "output_bn", doc: "batch norm without affine on each view's projections, as the paper's projector ends (true)" },
    ],
    config: SimsiamConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{build, config_error, loss_error, spec_p_z};
    use candle_core::{DType, Device, Var};
    use ssl_core::testing::{batch, close, max_gradient_error, randn, scalar, uniform};
    use ssl_core::{Ids, ParamStore};

    const KAT_L: f64 = -0.8611611153;

    /// `D(p, z) = −mean_i cos(p_i, z_i)` on the host.
    fn negative_cosine(p: &Tensor, z: &Tensor) -> f64 {
        let (p, z) = (p.to_vec2::<f64>().unwrap(), z.to_vec2::<f64>().unwrap());
        let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let cos: f64 = p
            .iter()
            .zip(&z)
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b)))
            .sum();
        -cos / p.len() as f64
    }

    #[test]
    fn known_answer_spec_2_19() -> candle_core::Result<()> {
        let (p, z) = spec_p_z()?;
        close(scalar(&simsiam_loss(&p, &z)?), KAT_L, 1e-9);
        let formula = 0.5 * negative_cosine(&p.get(0)?, &z.get(1)?)
            + 0.5 * negative_cosine(&p.get(1)?, &z.get(0)?);
        close(formula, KAT_L, 1e-9);
        let (p32, z32) = (p.to_dtype(DType::F32)?, z.to_dtype(DType::F32)?);
        close(scalar(&simsiam_loss(&p32, &z32)?), KAT_L, 1e-4);
        Ok(())
    }

    #[test]
    fn three_views_average_the_six_ordered_pairs() -> candle_core::Result<()> {
        let dev = &Device::Cpu;
        let p = randn(0f64, 1., (3, 5, 4), dev)?;
        let z = randn(0f64, 1., (3, 5, 4), dev)?;
        let mut sum = 0.0;
        for w in 0..3 {
            for v in (0..3).filter(|&v| v != w) {
                sum += negative_cosine(&p.get(v)?, &z.get(w)?);
            }
        }
        close(scalar(&simsiam_loss(&p, &z)?), sum / 6.0, 1e-12);
        Ok(())
    }

    #[test]
    fn loss_lies_in_minus_one_to_one() -> candle_core::Result<()> {
        let dev = &Device::Cpu;
        for (v, vg, b, d) in [(2, 2, 3, 2), (2, 2, 16, 8), (4, 2, 5, 3), (3, 1, 1, 6)] {
            for _ in 0..5 {
                let p = randn(0f64, 1., (v, b, d), dev)?;
                let z = randn(0f64, 1., (vg, b, d), dev)?;
                let l = scalar(&simsiam_loss(&p, &z)?);
                assert!((-1.0..=1.0).contains(&l), "{l}");
            }
        }
        // The bounds are reached by (anti-)parallel predictions.
        let z = randn(0f64, 1., (2, 4, 3), dev)?;
        let swapped = Tensor::stack(&[z.get(1)?, z.get(0)?], 0)?;
        close(scalar(&simsiam_loss(&(&swapped * 2.0)?, &z)?), -1.0, 1e-12);
        close(scalar(&simsiam_loss(&swapped.neg()?, &z)?), 1.0, 1e-12);
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences_and_stops_at_the_targets() -> candle_core::Result<()> {
        let dev = &Device::Cpu;
        for (v, vg) in [(2, 2), (3, 3), (3, 1)] {
            let p = randn(0f64, 1., (v, 4, 3), dev)?;
            let z = randn(0f64, 1., (vg, 4, 3), dev)?;
            let err = max_gradient_error(&p, |p| simsiam_loss(p, &z))?;
            assert!(err < 1e-6, "V={v}, V_g={vg}: relative gradient error {err}");
            let target = Var::from_tensor(&z)?;
            let grads = simsiam_loss(&p, target.as_tensor())?.backward()?;
            assert!(grads.get(target.as_tensor()).is_none());
        }
        // With p = z (the same tensor) only the prediction path carries a gradient: half of the
        // gradient finite differences see, as for a loss with a stop-gradient on one factor.
        let z = randn(0f64, 1., (2, 4, 3), dev)?;
        assert!(max_gradient_error(&z, |z| simsiam_loss(z, z))? > 1e-3);
        Ok(())
    }

    #[test]
    fn objective_built_from_the_registry_gives_a_finite_loss() -> Result<()> {
        let dev = &Device::Cpu;
        let store = ParamStore::new(3);
        let mut objective = build("simsiam", "{}", &store, 8)?;
        let req = objective.requirements();
        assert_eq!(req.teacher, None);
        assert!(req.projector && !req.labels);
        assert_eq!((req.min_views, req.max_views, req.min_batch), (2, None, 2));
        assert_eq!(
            store.tensors()["objective.predictor.0.weight"].dims(),
            [512, 8]
        );

        let z = Var::from_tensor(&randn(0f32, 1., (2, 4, 8), dev)?)?;
        let indices = Ids::range(4, dev)?;
        for global_views in [2, 1] {
            let b = Batch {
                global_views,
                ..batch(z.as_tensor(), &indices, None)
            };
            let out = objective.loss(&b)?;
            let loss = scalar(&out.loss);
            assert!(loss.is_finite() && (-1.0..=1.0).contains(&loss), "{loss}");
            let grads = out.loss.backward()?;
            assert!(grads.get(z.as_tensor()).is_some());
            let (_, w) = &store.vars_with_prefix("objective.predictor.3.weight")[0];
            assert!(grads.get(w.as_tensor()).is_some());
        }
        Ok(())
    }

    /// With the output batch norm the loss cannot see a per-view, per-dimension affine change of
    /// the projections (BN's invariance); without it, it can.
    #[test]
    fn output_batch_norm_makes_the_loss_invariant_to_column_affine_maps() -> Result<()> {
        let dev = &Device::Cpu;
        let z = randn(0f32, 1., (2, 16, 8), dev)?;
        let scale = uniform(0.5f32, 3.0, (2, 1, 8), dev)?;
        let shift = randn(0f32, 4.0, (2, 1, 8), dev)?;
        let moved = z.broadcast_mul(&scale)?.broadcast_add(&shift)?;
        let indices = Ids::range(16, dev)?;
        for (params, invariant) in [("{}", true), ("output_bn: false", false)] {
            let store = ParamStore::new(5);
            let mut objective = build("simsiam", params, &store, 8)?;
            let mut loss = |z: &Tensor| -> Result<f64> {
                Ok(scalar(&objective.loss(&batch(z, &indices, None))?.loss))
            };
            let (a, b) = (loss(&z)?, loss(&moved)?);
            assert_eq!((a - b).abs() < 1e-5, invariant, "{params}: {a} vs {b}");
        }
        Ok(())
    }

    #[test]
    fn a_batch_of_one_is_refused_with_the_reason() -> Result<()> {
        let dev = &Device::Cpu;
        let store = ParamStore::new(0);
        let mut objective = build("simsiam", "predictor_hidden: 4", &store, 3)?;
        let req = objective.requirements();
        let err = format!("{:#}", req.check("simsiam", 2, 1, false).unwrap_err());
        assert!(
            err.contains("batch size ≥ 2") && err.contains("batch norm"),
            "{err}"
        );
        let z = randn(0f32, 1., (2, 1, 3), dev)?;
        let indices = Ids::new(&[0], dev)?;
        let err = loss_error(objective.as_mut(), &batch(&z, &indices, None));
        assert!(err.contains("at least 2 instances"), "{err}");
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("simsiam").unwrap();
        assert!(reg.paper.contains("CVPR 2021") && reg.paper.contains("Chen"));
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["predictor_hidden"].as_u64(), Some(512));
    }

    #[test]
    fn unknown_key_and_bad_value_are_clear_errors() {
        let err = config_error::<SimsiamConfig>("simsiam", "hidden: 512");
        assert!(
            err.contains("unknown field `hidden`") && err.contains("predictor_hidden"),
            "{err}"
        );
        let err = config_error::<SimsiamConfig>("simsiam", "predictor_hidden: 0");
        assert!(err.contains("`predictor_hidden`"), "{err}");
    }

    /// The predictor is a constant-rate parameter group (the paper's `fix_pred_lr`) over every
    /// predictor parameter the objective creates, and over nothing else.
    #[test]
    fn declares_a_constant_rate_predictor_group() -> anyhow::Result<()> {
        let store = ssl_core::ParamStore::new(0);
        let objective = build("simsiam", "predictor_hidden: 3", &store, 4)?;
        let groups = objective.requirements().param_groups;
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].schedule, Some(Schedule::Constant));
        let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
        let predictor: Vec<&String> = names.iter().filter(|n| groups[0].matches(n)).collect();
        assert!(!predictor.is_empty(), "no predictor parameter in {names:?}");
        assert!(predictor
            .iter()
            .all(|n| n.starts_with("objective.predictor.")));
        Ok(())
    }
}
