//! W-MSE: whitening followed by the cosine MSE between views.
//!
//! Ermolov, Siarohin, Sangineto & Sebe, "Whitening for Self-Supervised Representation Learning",
//! ICML 2021. Spec: `docs/spec/objectives.md` §2.15.
//!
//! For each of `w_iter` repetitions the batch is randomly permuted and cut into sub-batches of
//! `w_size` instances; every sub-batch of every view is Cholesky-whitened
//! ([`ssl_linalg::cholesky::cholesky_whiten_batched`], gradients through the mean, covariance and
//! Cholesky factor; no stop-gradient), and the loss is the mean over repetitions and the
//! `V(V−1)/2` view pairs of `2 − 2·mean_i cos(w_i^(a), w_i^(b))` (original code, §6 item 7).
//!
//! **Batch sizes.** The original requires `B` to be a multiple of `w_size`; the configured batch
//! size is checked at build time. A smaller last batch (trainer with `drop_last = false`) whose
//! size is not a multiple uses `floor(B / w_size)` sub-batches and leaves the remaining
//! `B mod w_size` instances, drawn at random by the permutation, out of that step's loss;
//! `B < w_size` is an error. With `eps = 0` the sub-batch covariance must be positive definite,
//! so `w_size ≥ d + 1` (checked at build time against the projection width).
//!
//! # Example
//!
//! Spec §2.15's known answer: two views of five instances whitened as one sub-batch
//! (`w_size = 5`, the identity order, no shrinkage).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_wmse::wmse_loss;
//!
//! let dev = &Device::Cpu;
//! let a = Tensor::new(&[[1f64, 0.], [0., 1.], [2., 1.], [1., 3.], [0., 0.]], dev)?;
//! let b = Tensor::new(&[[1f64, 1.], [0., 0.], [2., 2.], [0., 3.], [1., 0.]], dev)?;
//! let z = Tensor::stack(&[&a, &b], 0)?; // [V = 2, B = 5, d = 2]
//! let loss = wmse_loss(&z, &[vec![0, 1, 2, 3, 4]], 5, 0.0)?.to_scalar::<f64>()?;
//! assert!((loss - 0.7306691862).abs() < 1e-9);
//! # Ok::<(), anyhow::Error>(())
//! ```

use anyhow::{bail, ensure, Context, Result};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};
use ssl_linalg::cholesky::cholesky_whiten_batched;

/// Stream of [`ssl_core::Progress::rng`] used for the sub-batch permutations.
const PERMUTATION_STREAM: u64 = 0x3753;

pub use ssl_linalg::normalize_rows;

/// `w_iter` random permutations of `0..batch`, one per repetition.
pub fn draw_permutations(rng: &mut impl Rng, batch: usize, w_iter: usize) -> Vec<Vec<u32>> {
    (0..w_iter)
        .map(|_| {
            let mut p: Vec<u32> = (0..batch as u32).collect();
            p.shuffle(rng);
            p
        })
        .collect()
}

/// Whitened views for each repetition: `z`: `[V, B, d]`, `perms`: `R` orderings of the batch
/// (each of length ≥ `S·w_size`, `S = floor(B / w_size)`) → `[R, V, S·w_size, d]`, where row
/// `s·w_size + j` of view `v` in repetition `r` is instance `perms[r][s·w_size + j]` whitened
/// within its sub-batch `s` of view `v` (spec §2.15).
pub fn whiten_sub_batches(
    z: &Tensor,
    perms: &[Vec<u32>],
    w_size: usize,
    eps: f64,
) -> Result<Tensor> {
    let (v, b, d) = z.dims3()?;
    ensure!(!perms.is_empty(), "W-MSE needs at least one permutation");
    ensure!(w_size >= 2, "W-MSE needs w_size ≥ 2, got {w_size}");
    ensure!(
        b >= w_size,
        "W-MSE whitens sub-batches of w_size={w_size} samples but the batch has {b} instances; \
         use a batch size that is a multiple of {w_size} (with train.drop_last=true) or lower \
         objective.params.w_size"
    );
    let s = b / w_size;
    let used = s * w_size;
    let mut gathered = Vec::with_capacity(perms.len());
    for p in perms {
        ensure!(
            p.len() >= used && p.iter().all(|&i| (i as usize) < b),
            "W-MSE permutation must list at least {used} indices below {b}"
        );
        let idx = Tensor::from_slice(&p[..used], used, z.device())?;
        gathered.push(z.index_select(&idx, 1)?.reshape((v * s, w_size, d))?);
    }
    let stacked = Tensor::cat(&gathered, 0)?;
    let white = cholesky_whiten_batched(&stacked, eps).with_context(|| {
        format!("W-MSE: whitening a sub-batch of {w_size} samples in {d} dimensions failed")
    })?;
    Ok(white.reshape((perms.len(), v, used, d))?)
}

/// Mean over the leading axis `R` and the `V(V−1)/2` view pairs of `2 − 2·mean_i cos(w_a, w_b)`
/// for `w`: `[R, V, N, d]`. Linear in `V`: `Σ_{a<b} ⟨u_a, u_b⟩ = (‖Σ_v u_v‖² − Σ_v ‖u_v‖²)/2`
/// for the row-normalised `u_v`.
pub fn pairwise_cosine_mse(w: &Tensor) -> candle_core::Result<Tensor> {
    let (r, v, n, _) = w.dims4()?;
    if v < 2 {
        candle_core::bail!("W-MSE needs at least 2 views, got {v}");
    }
    let u = normalize_rows(w)?;
    let pair_sum = ((u.sum(1)?.sqr()?.sum_all()? - u.sqr()?.sum_all()?)? * 0.5)?;
    let pairs = (v * (v - 1) / 2) as f64;
    let mean_cos = (pair_sum / (r as f64 * pairs * n as f64))?;
    (mean_cos * -2.0)? + 2.0
}

/// The W-MSE loss of `z`: `[V, B, d]` with the sub-batch orderings `perms` (one per repetition;
/// see [`whiten_sub_batches`]) and shrinkage `eps` (spec §2.15).
pub fn wmse_loss(z: &Tensor, perms: &[Vec<u32>], w_size: usize, eps: f64) -> Result<Tensor> {
    Ok(pairwise_cosine_mse(&whiten_sub_batches(
        z, perms, w_size, eps,
    )?)?)
}

/// W-MSE hyper-parameters (defaults of the original code).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WmseConfig {
    /// Sub-batch size for whitening (must exceed the projection width when `eps = 0`).
    pub w_size: usize,
    /// Repetitions with a fresh random partition of the batch.
    pub w_iter: usize,
    /// Shrinkage ε in `Σ' = (1−ε)Σ + εI`.
    pub eps: f64,
}

impl Default for WmseConfig {
    fn default() -> Self {
        Self {
            w_size: 128,
            w_iter: 1,
            eps: 0.0,
        }
    }
}

impl ObjectiveConfig for WmseConfig {
    fn validate(&self) -> Result<()> {
        ensure!(
            self.w_size >= 2,
            "`w_size` must be ≥ 2 (an unbiased covariance), got {}",
            self.w_size
        );
        ensure!(
            self.w_iter >= 1,
            "`w_iter` must be ≥ 1, got {}",
            self.w_iter
        );
        ensure!(
            self.eps.is_finite() && (0.0..1.0).contains(&self.eps),
            "`eps` must be in [0, 1), got {}",
            self.eps
        );
        Ok(())
    }

    fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        let (w, d, b) = (self.w_size, ctx.projection_dim, ctx.batch_size);
        if self.eps == 0.0 && w < d + 1 {
            bail!(
                "W-MSE whitens sub-batches of w_size={w} samples but the projection has {d} \
                 dimensions, so the sub-batch covariance is singular; use a projector whose output \
                 is ≤ {} (e.g. --set model.projector=[512,64]) or raise objective.params.w_size \
                 to ≥ {} (the paper recommends w_size ≥ 2d)",
                w - 1,
                d + 1
            );
        }
        if b < w || b % w != 0 {
            bail!(
                "W-MSE splits each batch into sub-batches of w_size={w} instances, so the batch size \
                 must be a multiple of {w}, got --batch-size {b}; use --batch-size {} or set \
                 objective.params.w_size to a divisor of {b}",
                (b / w).max(1) * w
            );
        }
        Ok(Box::new(Wmse(self.clone())))
    }
}

/// The W-MSE objective.
pub struct Wmse(pub WmseConfig);

impl Objective for Wmse {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: self.0.w_size,
            min_batch_reason: "W-MSE whitens sub-batches of objective.params.w_size instances",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let c = &self.0;
        let mut rng = batch.progress.rng(PERMUTATION_STREAM);
        let perms = draw_permutations(&mut rng, z.dim(1)?, c.w_iter);
        let loss = wmse_loss(&z, &perms, c.w_size, c.eps)?;
        Ok(LossOutput::new(loss.clone()).with_term("wmse", loss))
    }
}

register_objective! {
    name: "wmse",
    aliases: &["w-mse"],
    summary: "Cholesky whitening of sub-batches, then cosine MSE between views (dimension-contrastive)",
    paper: "Ermolov, Siarohin, Sangineto, Sebe. Whitening for Self-Supervised Representation Learning. ICML 2021",
    keys: &[
        ConfigKey { name: "w_size", doc: "instances per whitened sub-batch; the batch size must be a multiple, and > projection width when eps = 0" },
        ConfigKey { name: "w_iter", doc: "repetitions with a fresh random partition of the batch (loss averaged)" },
        ConfigKey { name: "eps", doc: "covariance shrinkage ε in (1−ε)Σ + εI, in [0, 1)" },
    ],
    config: WmseConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use ssl_core::testing::{close, randn, scalar};
    use ssl_core::{Ids, Progress, SingleProcess};

    fn spec_views() -> candle_core::Result<Tensor> {
        let dev = Device::Cpu;
        let a = Tensor::new(&[[1f64, 0.], [0., 1.], [2., 1.], [1., 3.], [0., 0.]], &dev)?;
        let b = Tensor::new(&[[1f64, 1.], [0., 0.], [2., 2.], [0., 3.], [1., 0.]], &dev)?;
        Tensor::stack(&[&a, &b], 0)
    }

    fn identity(b: usize) -> Vec<Vec<u32>> {
        vec![(0..b as u32).collect()]
    }

    /// `2 − 2·mean_i cos` of two `[N, d]` matrices, element by element.
    fn naive_pair(x: &Tensor, y: &Tensor) -> f64 {
        let x = x.to_vec2::<f64>().unwrap();
        let y = y.to_vec2::<f64>().unwrap();
        let cos: f64 = x
            .iter()
            .zip(&y)
            .map(|(p, q)| {
                let dot: f64 = p.iter().zip(q).map(|(a, b)| a * b).sum();
                let np = p.iter().map(|a| a * a).sum::<f64>().sqrt();
                let nq = q.iter().map(|a| a * a).sum::<f64>().sqrt();
                dot / (np * nq)
            })
            .sum();
        2.0 - 2.0 * cos / x.len() as f64
    }

    #[test]
    fn known_answer_spec_2_15() -> Result<()> {
        let z = spec_views()?;
        close(
            scalar(&wmse_loss(&z, &identity(5), 5, 0.0)?),
            0.7306691862,
            1e-9,
        );
        let white = whiten_sub_batches(&z, &identity(5), 5, 0.0)?;
        let a = white.get(0)?.get(0)?.to_vec2::<f64>()?;
        close(a[0][1], -0.902077169, 1e-8);
        close(a[3][1], 1.6237389042, 1e-9);
        Ok(())
    }

    #[test]
    fn known_answer_in_f32() -> Result<()> {
        let z = spec_views()?.to_dtype(DType::F32)?;
        let loss = wmse_loss(&z, &identity(5), 5, 0.0)?;
        assert_eq!(loss.dtype(), DType::F32);
        close(scalar(&loss), 0.7306691862, 1e-4);
        Ok(())
    }

    #[test]
    fn single_sub_batch_ignores_the_permutation() -> Result<()> {
        let z = spec_views()?;
        let shuffled = vec![vec![3u32, 0, 4, 1, 2]];
        close(
            scalar(&wmse_loss(&z, &shuffled, 5, 0.0)?),
            0.7306691862,
            1e-9,
        );
        Ok(())
    }

    #[test]
    fn invariant_to_lower_triangular_affine_maps_per_view() -> Result<()> {
        // Cholesky whitening undoes x ↦ A x + c for lower-triangular A with positive diagonal.
        let z = randn(0f64, 1., (2, 8, 3), &Device::Cpu)?;
        let a = Tensor::new(
            &[[2f64, 0., 0.], [0.5, 1., 0.], [-1., 3., 0.2]],
            &Device::Cpu,
        )?;
        let moved = Tensor::stack(&[(z.get(0)?.matmul(&a.t()?)? + 5.0)?, z.get(1)?], 0)?;
        let perms = identity(8);
        close(
            scalar(&wmse_loss(&moved, &perms, 4, 0.0)?),
            scalar(&wmse_loss(&z, &perms, 4, 0.0)?),
            1e-10,
        );
        Ok(())
    }

    #[test]
    fn multi_view_sub_batches_and_repetitions_match_direct_computation() -> Result<()> {
        let dev = Device::Cpu;
        let (v, b, d, w) = (3, 8, 2, 4);
        let z = randn(0f64, 1., (v, b, d), &dev)?;
        let perms = vec![
            vec![5u32, 2, 7, 0, 1, 6, 3, 4],
            vec![0, 1, 2, 3, 4, 5, 6, 7],
        ];
        let mut want = 0.0;
        for p in &perms {
            let whiten = |view: usize| -> Tensor {
                let chunks: Vec<Tensor> = p
                    .chunks(w)
                    .map(|c| {
                        let idx = Tensor::from_slice(c, c.len(), &dev).unwrap();
                        let x = z.get(view).unwrap().index_select(&idx, 0).unwrap();
                        ssl_linalg::cholesky::cholesky_whiten(&x, 0.0).unwrap()
                    })
                    .collect();
                Tensor::cat(&chunks, 0).unwrap()
            };
            let white: Vec<Tensor> = (0..v).map(whiten).collect();
            for i in 0..v {
                for j in i + 1..v {
                    want += naive_pair(&white[i], &white[j]) / 3.0 / 2.0;
                }
            }
        }
        close(scalar(&wmse_loss(&z, &perms, w, 0.0)?), want, 1e-10);
        // Repetitions average: the two-permutation loss is the mean of the single ones.
        let one = scalar(&wmse_loss(&z, &perms[..1], w, 0.0)?);
        let two = scalar(&wmse_loss(&z, &perms[1..], w, 0.0)?);
        close(want, (one + two) / 2.0, 1e-10);
        Ok(())
    }

    #[test]
    fn remainder_of_a_short_last_batch_is_left_out() -> Result<()> {
        let z = randn(0f64, 1., (2, 7, 2), &Device::Cpu)?;
        let perm = vec![vec![6u32, 1, 4, 0, 2, 5, 3]];
        let kept = Tensor::from_slice(&[6u32, 1, 4, 0, 2, 5], 6, &Device::Cpu)?;
        let direct = wmse_loss(&z.index_select(&kept, 1)?, &identity(6), 3, 0.0)?;
        close(
            scalar(&wmse_loss(&z, &perm, 3, 0.0)?),
            scalar(&direct),
            1e-12,
        );
        let err = format!("{:#}", wmse_loss(&z, &identity(7), 8, 0.0).unwrap_err());
        assert!(
            err.contains("w_size=8") && err.contains("objective.params.w_size"),
            "{err}"
        );
        Ok(())
    }

    #[test]
    fn gradient_matches_finite_differences() -> Result<()> {
        let z = randn(0f64, 1., (2, 6, 2), &Device::Cpu)?;
        let perms = vec![vec![4u32, 1, 5, 0, 3, 2], vec![0, 1, 2, 3, 4, 5]];
        let err = ssl_core::testing::max_gradient_error(&z, |z| {
            wmse_loss(z, &perms, 3, 0.0).map_err(candle_core::Error::wrap)
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
        let z = randn(0f64, 1., (3, 5, 3), &Device::Cpu)?;
        let err = ssl_core::testing::max_gradient_error(&z, |z| {
            wmse_loss(z, &identity(5), 5, 0.1).map_err(candle_core::Error::wrap)
        })?;
        assert!(err < 1e-6, "relative gradient error {err}");
        Ok(())
    }

    fn build(cfg: &WmseConfig, projection_dim: usize, batch_size: usize) -> Result<Wmse> {
        let ctx = BuildContext {
            vb: candle_nn::VarBuilder::zeros(DType::F32, &Device::Cpu),
            num_instances: 100,
            num_classes: None,
            instance_labels: None,
            projection_dim,
            feature_dim: 16,
            views: 2,
            global_views: 2,
            batch_size,
            patches: None,
        };
        cfg.build(&ctx)?;
        Ok(Wmse(cfg.clone()))
    }

    #[test]
    fn build_checks_projection_width_and_batch_size() {
        let cfg = WmseConfig::default();
        let err = format!("{:#}", build(&cfg, 512, 512).err().unwrap());
        assert!(
            err.contains("w_size=128")
                && err.contains("512 dimensions")
                && err.contains("≤ 127")
                && err.contains("model.projector"),
            "{err}"
        );
        let err = format!("{:#}", build(&cfg, 64, 200).err().unwrap());
        assert!(
            err.contains("multiple of 128") && err.contains("--batch-size 128"),
            "{err}"
        );
        let err = format!("{:#}", build(&cfg, 64, 100).err().unwrap());
        assert!(err.contains("multiple of 128"), "{err}");
        assert!(build(&cfg, 64, 512).is_ok());
        assert!(build(&cfg, 127, 256).is_ok());
        let shrunk = WmseConfig {
            eps: 0.1,
            ..WmseConfig::default()
        };
        assert!(build(&shrunk, 512, 128).is_ok());
    }

    #[test]
    fn requirements_name_the_sub_batch() {
        let req = Wmse(WmseConfig::default()).requirements();
        let err = req.check("wmse", 2, 64, false).unwrap_err().to_string();
        assert!(err.contains("≥ 128") && err.contains("w_size"), "{err}");
        assert!(req.check("wmse", 1, 128, false).is_err());
        assert!(req.check("wmse", 4, 256, false).is_ok());
    }

    #[test]
    fn objective_loss_is_deterministic_per_step() -> Result<()> {
        let z = randn(0f32, 1., (2, 8, 3), &Device::Cpu)?;
        let idx = Ids::range(8, &Device::Cpu)?;
        let progress = |step| Progress {
            step,
            epoch: 0,
            steps_per_epoch: 10,
            total_steps: 10,
            seed: 7,
        };
        let mut obj = Wmse(WmseConfig {
            w_size: 4,
            w_iter: 2,
            eps: 0.0,
        });
        let mut run = |step| -> Result<f64> {
            let batch = Batch {
                projections: &z,
                features: &z,
                global_views: 2,
                indices: &idx,
                labels: None,
                teacher: None,
                progress: progress(step),
                train: true,
                collective: &SingleProcess,
            };
            let out = obj.loss(&batch)?;
            assert_eq!(out.terms[0].0, "wmse");
            Ok(scalar(&out.loss))
        };
        let (first, again, other) = (run(3)?, run(3)?, run(4)?);
        assert_eq!(first, again);
        assert_ne!(first, other);
        let perms = draw_permutations(&mut progress(3).rng(PERMUTATION_STREAM), 8, 2);
        close(first, scalar(&wmse_loss(&z, &perms, 4, 0.0)?), 1e-6);
        Ok(())
    }

    #[test]
    fn registered_with_documented_defaults() {
        let reg = ssl_core::find("W-MSE").unwrap();
        assert_eq!(reg.name, "wmse");
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults["w_size"].as_u64(), Some(128));
        assert_eq!(defaults["w_iter"].as_u64(), Some(1));
        assert_eq!(defaults["eps"].as_f64(), Some(0.0));
    }

    #[test]
    fn unknown_key_and_bad_values_are_clear_errors() {
        let parse = |s: &str| {
            let v: serde_yaml::Value = serde_yaml::from_str(s).unwrap();
            ssl_core::registry::parse_config::<WmseConfig>("wmse", &v)
                .err()
                .map(|e| format!("{e:#}"))
        };
        let err = parse("wsize: 64").unwrap();
        assert!(err.contains("unknown field `wsize`"), "{err}");
        assert!(parse("w_size: 1").unwrap().contains("`w_size`"));
        assert!(parse("w_iter: 0").unwrap().contains("`w_iter`"));
        assert!(parse("eps: 1.0").unwrap().contains("`eps`"));
        assert!(parse("w_size: 64\nw_iter: 4\neps: 0.01").is_none());
    }
}
