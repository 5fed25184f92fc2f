//! The predictor family: BYOL and SimSiam.
//!
//! * Grill et al., "Bootstrap Your Own Latent: A New Approach to Self-Supervised Learning",
//!   NeurIPS 2020. Spec: `docs/spec/objectives.md` §2.18, EMA teacher §3, disagreements §6.11.
//! * Chen & He, "Exploring Simple Siamese Representation Learning", CVPR 2021. Spec §2.19.
//!
//! Both put an objective-owned [`Predictor`] (Linear → BN → ReLU → Linear, `D → hidden → D`) on
//! the trainer's projections and regress, per instance, the prediction of one view onto the
//! stop-gradient projection of another view: BYOL onto the EMA teacher's projection
//! (`2 − 2·cos`, summed over view pairs), SimSiam onto the student's own projection (`−cos`,
//! averaged over view pairs).
//!
//! **View pairs.** With `V` views of which the first `V_g` are global crops, the ordered pairs
//! are (online view `v`, target view `w`) with `w < V_g`, `v < V`, `v ≠ w`: targets come from the
//! global crops, predictions from every other crop (spec §4); there are `P = V_g·(V − 1)` pairs.
//! At `V = V_g = 2` these are the two symmetric directions of both papers.
//!
//! Batch size: the losses are defined at `B = 1`, but the predictor's batch norm is not (spec
//! §0, §5), so a training batch needs `B ≥ 2`.
//!
//! # Example
//!
//! The known answers of spec §2.18 and §2.19 on two views of two instances. At `V = V_g = 2`
//! there are `P = 2` pairs, so BYOL's loss `P·(2 − 2c̄)` is `4 − 4c̄`, SimSiam's is `−c̄`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_byol::{byol_loss, simsiam_loss};
//!
//! let dev = &Device::Cpu;
//! let p = Tensor::new(&[[[1f64, 2.], [0., 1.]], [[2., 1.], [1., 1.]]], dev)?; // [V, B, D]
//! let z = Tensor::new(&[[[1f64, 1.], [1., 0.]], [[0., 1.], [1., 2.]]], dev)?; // [V_g, B, D]
//! let byol = byol_loss(&p, &z)?.to_scalar::<f64>()?;
//! let simsiam = simsiam_loss(&p, &z)?.to_scalar::<f64>()?;
//! assert!((byol - 0.5553555388).abs() < 1e-9);
//! assert!((simsiam + 0.8611611153).abs() < 1e-9);
//! assert!((byol - (4.0 + 4.0 * simsiam)).abs() < 1e-12);
//! # Ok::<(), candle_core::Error>(())
//! ```

mod byol;
mod simsiam;

pub use byol::{byol_loss, regression_loss, Byol, ByolConfig};
pub use simsiam::{simsiam_loss, Simsiam, SimsiamConfig};

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;
use ssl_linalg::normalize_rows;
use ssl_models::Projector;

/// Why both objectives need `B ≥ 2` (quoted by [`ssl_core::Requirements::check`]).
const MIN_BATCH_REASON: &str =
    "the predictor's batch norm normalises each view with batch statistics, undefined for one instance";

/// The objective's predictor head `q = W₂·ReLU(BN(W₁ z + b₁)) + b₂`, `D → hidden → D`, with
/// PyTorch `nn.Sequential` keys (`0.weight`, `1.running_mean`, `3.bias`, …).
pub struct Predictor(Projector);

impl Predictor {
    /// A predictor for projections of width `dim` with `hidden` units, created under `vb`.
    pub fn new(dim: usize, hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self(Projector::new(dim, &[hidden, dim], vb)?))
    }

    /// Predictions `[V, B, D]` of projections `z`: `[V, B, D]`. Each view goes through the head
    /// on its own (batch-norm statistics per view, as the references forward each view
    /// separately); `train` selects batch statistics, which need `B ≥ 2`.
    pub fn forward_views(&self, z: &Tensor, train: bool) -> Result<Tensor> {
        let (v, b, _) = z.dims3()?;
        if train && b < 2 {
            candle_core::bail!(
                "the predictor needs at least 2 instances per batch in training mode ({MIN_BATCH_REASON}), \
                 got {b}; use a batch size of 2 or more"
            );
        }
        let views = (0..v)
            .map(|k| self.0.forward_t(&z.get(k)?, train))
            .collect::<Result<Vec<_>>>()?;
        Tensor::stack(&views, 0)
    }
}

/// Mean cosine over the ordered view pairs of the module docs,
/// `c̄ = (1/(P·B)) Σ_{w<V_g} Σ_{v≠w} Σ_i cos(p_i^(v), sg(z_i^(w)))`, and the number of pairs
/// `P = V_g·(V − 1)`. `p`: predictions `[V, B, D]`; `z`: targets `[V_g, B, D]` (view `w` of `z`
/// is view `w` of `p`), `1 ≤ V_g ≤ V`, `V ≥ 2`.
///
/// Computed in `O(V·B·D)` as `Σ_w Σ_i ⟨(Σ_v p̂_i^(v)) − p̂_i^(w), ẑ_i^(w)⟩` with unit rows `p̂`,
/// `ẑ`.
pub fn mean_pair_cosine(p: &Tensor, z: &Tensor) -> Result<(Tensor, usize)> {
    let (v, b, d) = p.dims3()?;
    let (vg, bz, dz) = z.dims3()?;
    if (bz, dz) != (b, d) {
        candle_core::bail!(
            "predictions [V, B, D] = {:?} and targets [V_g, B, D] = {:?} differ in B or D",
            p.dims(),
            z.dims()
        );
    }
    if v < 2 || vg == 0 || vg > v {
        candle_core::bail!(
            "view pairs need V ≥ 2 prediction views and 1 ≤ V_g ≤ V target views, got V = {v}, V_g = {vg}"
        );
    }
    let p_hat = normalize_rows(p)?;
    let z_hat = normalize_rows(&z.detach())?;
    let others = p_hat
        .sum_keepdim(0)?
        .broadcast_sub(&p_hat.narrow(0, 0, vg)?)?;
    let pairs = vg * (v - 1);
    let mean = ((others * z_hat)?.sum_all()? / (pairs * b) as f64)?;
    Ok((mean, pairs))
}

#[cfg(test)]
pub(crate) mod test_support {
    use candle_core::{Device, Result, Tensor};
    use ssl_core::{Batch, BuildContext, Objective, ParamStore};

    /// `(p, z)` of spec §2.18/§2.19: `p = [p1, p2]`, `z = [z1, z2]`, each `[2, 2, 2]` f64.
    pub fn spec_p_z() -> Result<(Tensor, Tensor)> {
        let dev = &Device::Cpu;
        let p = Tensor::new(&[[[1f64, 2.], [0., 1.]], [[2., 1.], [1., 1.]]], dev)?;
        let z = Tensor::new(&[[[1f64, 1.], [1., 0.]], [[0., 1.], [1., 2.]]], dev)?;
        Ok((p, z))
    }

    /// Builds the registered objective `name` from the YAML `params`, its parameters created
    /// in `store` under `objective.`, for projections of width `dim`.
    pub fn build(
        name: &str,
        params: &str,
        store: &ParamStore,
        dim: usize,
    ) -> anyhow::Result<Box<dyn Objective>> {
        let ctx = BuildContext {
            vb: store.var_builder(&Device::Cpu).pp("objective"),
            num_instances: 16,
            num_classes: None,
            instance_labels: None,
            projection_dim: dim,
            feature_dim: dim,
            views: 2,
            global_views: 2,
            batch_size: 4,
            patches: None,
        };
        let value: serde_yaml::Value = serde_yaml::from_str(params)?;
        (ssl_core::find(name)?.build)(&value, &ctx)
    }

    /// The error text of a loss that must fail.
    pub fn loss_error(objective: &mut dyn Objective, batch: &Batch<'_>) -> String {
        match objective.loss(batch) {
            Ok(_) => panic!("the loss was computed"),
            Err(e) => format!("{e:#}"),
        }
    }

    /// Parses the registered objective's config from YAML and returns the error text.
    pub fn config_error<C: ssl_core::ObjectiveConfig>(name: &str, yaml: &str) -> String {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        match ssl_core::registry::parse_config::<C>(name, &value) {
            Ok(_) => panic!("`{yaml}` was accepted"),
            Err(e) => format!("{e:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar};
    use ssl_core::ParamStore;

    #[test]
    fn mean_pair_cosine_matches_explicit_pairs() -> Result<()> {
        let dev = &Device::Cpu;
        let cos = |a: &Tensor, b: &Tensor| -> Result<f64> {
            let (a, b) = (normalize_rows(a)?, normalize_rows(b)?);
            Ok(scalar(&(a * b)?.sum_all()?))
        };
        for (v, vg) in [(2, 2), (4, 2), (3, 1), (5, 5)] {
            let p = randn(0f64, 1., (v, 6, 5), dev)?;
            let z = randn(0f64, 1., (vg, 6, 5), dev)?;
            let mut sum = 0.0;
            for w in 0..vg {
                for o in (0..v).filter(|&o| o != w) {
                    sum += cos(&p.get(o)?, &z.get(w)?)?;
                }
            }
            let (mean, pairs) = mean_pair_cosine(&p, &z)?;
            assert_eq!(pairs, vg * (v - 1));
            close(scalar(&mean), sum / (pairs * 6) as f64, 1e-12);
        }
        Ok(())
    }

    #[test]
    fn mean_pair_cosine_rejects_bad_shapes() -> Result<()> {
        let dev = &Device::Cpu;
        let p = Tensor::zeros((2, 3, 4), DType::F64, dev)?;
        for z in [(3, 3, 4), (2, 2, 4), (2, 3, 5), (0, 3, 4)] {
            assert!(mean_pair_cosine(&p, &Tensor::zeros(z, DType::F64, dev)?).is_err());
        }
        let one_view = Tensor::zeros((1, 3, 4), DType::F64, dev)?;
        let err = mean_pair_cosine(&one_view, &one_view)
            .unwrap_err()
            .to_string();
        assert!(err.contains("V ≥ 2"), "{err}");
        Ok(())
    }

    #[test]
    fn predictor_maps_each_view_through_its_own_batch_norm() -> anyhow::Result<()> {
        let store = ParamStore::new(1);
        let predictor = Predictor::new(3, 5, store.var_builder(&Device::Cpu).pp("predictor"))?;
        let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "predictor.0.bias",
                "predictor.0.weight",
                "predictor.1.bias",
                "predictor.1.running_mean",
                "predictor.1.running_var",
                "predictor.1.weight",
                "predictor.3.bias",
                "predictor.3.weight",
            ]
        );
        assert_eq!(store.tensors()["predictor.0.weight"].dims(), [5, 3]);
        let z = randn(0f32, 1., (2, 4, 3), &Device::Cpu)?;
        let q = predictor.forward_views(&z, true)?;
        assert_eq!(q.dims(), [2, 4, 3]);
        // Shifting one view moves only that view's batch statistics: its predictions are unchanged
        // (train-mode BN removes a per-feature shift) and the other view's are untouched.
        let shift = Tensor::new(&[[[0f32, 0., 0.]], [[5., -3., 2.]]], &Device::Cpu)?;
        let q_shifted = predictor.forward_views(&z.broadcast_add(&shift)?, true)?;
        let diff = scalar(&(q_shifted - &q)?.abs()?.max_all()?);
        assert!(diff < 1e-4, "{diff}");
        let err = predictor
            .forward_views(&z.narrow(1, 0, 1)?, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least 2 instances"), "{err}");
        assert_eq!(
            predictor.forward_views(&z.narrow(1, 0, 1)?, false)?.dims(),
            [2, 1, 3]
        );
        Ok(())
    }
}
