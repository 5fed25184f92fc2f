//! One training step computed two ways from the same start, compared: the CPU's fused kernels
//! against the GPU (`tests/cuda.rs`) or against the composed Candle ops that every other
//! device runs, on the CPU (`tests/composed.rs`). The same seed gives both the same weights
//! (the parameter store draws them on the host), and the inputs are the same numbers, so
//! losses and gradients must agree to f32 rounding, as amplified by the network itself: a
//! train-mode CIFAR ResNet-18's gradients move by about 1 % when its inputs move by one f32
//! rounding (measured here), so an encoder row allows each quantity a few times the change that
//! such a perturbation makes on the reference path.

use std::collections::HashMap;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use ssl_core::Progress;
use ssl_train::config::{apply_set, RunConfig};
use ssl_train::model;
use ssl_train::setup::DataSplit;
use ssl_train::trainer::{self, StepInput};

/// Relative error of a loss: f32 sums in different orders and kernels.
const LOSS_TOLERANCE: f64 = 1e-4;
/// Error, in norm, of one parameter's gradient relative to the larger of its own norm and
/// [`ZERO_GRADIENT_FLOOR`] times the whole gradient's: deeper chains of f32 rounding.
const GRADIENT_TOLERANCE: f64 = 2e-3;
/// A bias followed by batch norm, or a projector's last bias under a shift-invariant loss, has
/// a gradient of exactly zero; both sides compute rounding noise for it (norms of 1e-10 to
/// 1e-5 on the H200 against O(1) for the weights), so its error is measured against this
/// fraction of the whole gradient's norm instead of its own.
const ZERO_GRADIENT_FLOOR: f64 = 1e-4;
/// How many times the reference's own change under a one-rounding input perturbation a
/// quantity may differ by (each loss, each parameter's gradient).
const SENSITIVITY_FACTOR: f64 = 4.0;

/// The run configuration of `sets` on the defaults, without the online probe or warm-up.
pub fn config(sets: &[&str]) -> Result<RunConfig> {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for s in ["train.probe_lr=0", "train.warmup_epochs=0"]
        .iter()
        .chain(sets)
    {
        apply_set(&mut root, s)?;
    }
    RunConfig::from_yaml_value(root)
}

/// `[n, shape...]` uniform values in [−1, 1) from a fixed xorshift sequence, on the CPU.
fn inputs(n: usize, shape: &[usize]) -> Result<Tensor> {
    let mut dims = vec![n];
    dims.extend(shape);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let values: Vec<f32> = (0..dims.iter().product::<usize>())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    Ok(Tensor::from_vec(values, dims, &Device::Cpu)?)
}

fn norm(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?
        .sqr()?
        .sum_all()?
        .sqrt()?
        .to_scalar()?)
}

/// What one side computed for the first step: the loss and every parameter's gradient (on
/// the CPU), then the losses of `steps` training steps from the same start.
pub struct Trace {
    pub loss: f64,
    gradients: HashMap<String, Tensor>,
    pub losses: Vec<f64>,
}

/// The first step's loss and gradients and `steps` training steps' losses of `cfg` on
/// `images` `[V·B, ...]` (view-major) with `labels` `[B]`, computed on `device`; with
/// `composed`, through the composed ops there even on the CPU.
pub fn trace(
    cfg: &RunConfig,
    data: &DataSplit,
    images: &Tensor,
    labels: &[u32],
    steps: usize,
    device: &Device,
    composed: bool,
) -> Result<Trace> {
    let _composed = composed.then(ssl_models::dispatch::composed_only);
    let mut model = model::build_model(cfg, data, device)?;
    let images = images.to_device(device)?;
    let b = labels.len();
    let ids: Vec<u32> = (0..b as u32).collect();
    let input = |step: usize| StepInput {
        images: images.clone(),
        views: cfg.train.views,
        local_images: None,
        instance_ids: &ids,
        labels,
        progress: Progress {
            step,
            epoch: 0,
            steps_per_epoch: 100,
            total_steps: 100,
            seed: 0,
        },
        lr: cfg.train.lr,
    };
    let (out, grads) = trainer::forward_backward(&mut model, &input(0))?;
    let mut gradients = HashMap::new();
    for (name, var) in model.store.vars() {
        if let Some(g) = grads.get(var.as_tensor()) {
            gradients.insert(name, g.to_device(&Device::Cpu)?);
        }
    }
    let mut optimizer = model::optimizer(cfg, &model)?;
    let losses = (0..steps)
        .map(|step| Ok(trainer::training_step(&mut model, &mut optimizer, &input(step))?.loss))
        .collect::<Result<_>>()?;
    Ok(Trace {
        loss: out.logged.read()?.loss,
        gradients,
        losses,
    })
}

/// Every disagreement of `other` with the `reference` trace, one line each, and the largest
/// relative gradient error. Each quantity may differ by the larger of its fixed tolerance and
/// [`SENSITIVITY_FACTOR`] times the difference of `jitter` (the reference path on inputs one
/// rounding away) from the reference, where given.
pub fn compare(
    reference: &Trace,
    other: &Trace,
    jitter: Option<&Trace>,
    trajectory_tolerance: f64,
) -> Result<(Vec<String>, f64)> {
    let mut total = 0.0f64;
    for g in reference.gradients.values() {
        total += norm(g)?.powi(2);
    }
    let floor = ZERO_GRADIENT_FLOOR * total.sqrt();
    let loss_error = |a: f64, b: f64| (a - b).abs() / a.abs().max(1e-12);
    let gradient_error = |name: &str, t: &Trace| -> Result<Option<f64>> {
        let r = &reference.gradients[name];
        match t.gradients.get(name) {
            Some(g) => Ok(Some(norm(&(r - g)?)? / norm(r)?.max(floor))),
            None => Ok(None),
        }
    };
    let allowed = |base: f64, sensitivity: Option<f64>| match sensitivity {
        Some(s) => base.max(SENSITIVITY_FACTOR * s),
        None => base,
    };
    let mut problems = Vec::new();
    let error = loss_error(reference.loss, other.loss);
    let limit = allowed(
        LOSS_TOLERANCE,
        jitter.map(|j| loss_error(reference.loss, j.loss)),
    );
    if error > limit {
        problems.push(format!(
            "loss {} against {} (relative error {error:.1e}, allowed {limit:.1e})",
            other.loss, reference.loss
        ));
    }
    let mut names: Vec<&String> = reference.gradients.keys().collect();
    names.sort();
    let mut largest = 0.0f64;
    for name in names {
        let Some(error) = gradient_error(name, other)? else {
            problems.push(format!("{name}: no gradient, where the reference has one"));
            continue;
        };
        let sensitivity = match jitter {
            Some(j) => gradient_error(name, j)?,
            None => None,
        };
        let limit = allowed(GRADIENT_TOLERANCE, sensitivity);
        largest = largest.max(error);
        if error > limit {
            problems.push(format!(
                "{name}: gradient relative error {error:.1e}, allowed {limit:.1e}"
            ));
        }
    }
    if other.gradients.len() != reference.gradients.len() {
        problems.push(format!(
            "{} gradients, where the reference has {}",
            other.gradients.len(),
            reference.gradients.len()
        ));
    }
    for (step, (&r, &o)) in reference.losses.iter().zip(&other.losses).enumerate() {
        let error = loss_error(r, o);
        let limit = allowed(
            trajectory_tolerance,
            jitter.map(|j| loss_error(r, j.losses[step])),
        );
        if error > limit {
            problems.push(format!(
                "step {step}: loss {o} against {r} (relative error {error:.1e}, allowed {limit:.1e})"
            ));
        }
    }
    Ok((problems, largest))
}

/// A shrunk row of the `train_step` bench: `--set` assignments and the sample shape.
pub struct EncoderRow {
    pub name: &'static str,
    pub sets: &'static [&'static str],
    pub shape: &'static [usize],
}

/// The four rows of the `train_step` bench at test size (smaller inputs and batches).
pub const ENCODER_ROWS: [EncoderRow; 4] = [
    EncoderRow {
        name: "ResNet-18 CIFAR stem, VICReg",
        sets: &[
            "model.encoder=resnet18",
            "model.stem=cifar",
            "model.projector=[512,512]",
            "objective.name=vicreg",
            "train.batch_size=8",
            "train.views=2",
            "train.lr=1e-3",
        ],
        shape: &[3, 32, 32],
    },
    EncoderRow {
        name: "ResNet-18 CIFAR stem, FroSSL V = 4",
        sets: &[
            "model.encoder=resnet18",
            "model.stem=cifar",
            "model.projector=[512,512]",
            "objective.name=frossl",
            "train.batch_size=8",
            "train.views=4",
            "train.lr=1e-3",
        ],
        shape: &[3, 32, 32],
    },
    EncoderRow {
        name: "ViT-S/16 at 64², IConE",
        sets: &[
            "model.encoder=vit_s16",
            "objective.name=icone",
            "train.batch_size=4",
            "train.views=2",
            "train.lr=1e-4",
        ],
        shape: &[3, 64, 64],
    },
    EncoderRow {
        name: "3D ResNet-18 at 32³, IConE",
        sets: &[
            "model.encoder=resnet18_3d",
            "objective.name=icone",
            "train.batch_size=4",
            "train.views=2",
            "train.lr=1e-4",
        ],
        shape: &[1, 32, 32, 32],
    },
];

/// The masked and predictive objectives on the compare-masked-vit grid's encoder (ViT-T, 4-px
/// patches on 16-px one-channel images) with a light decoder or predictor: MAE's random
/// masking and I-JEPA's blocks gather the kept tokens per sample, and their masks, like
/// LeJEPA's random slices, are drawn on the host from the seed and step, so every device sees
/// the same ones.
pub const MASKED_ROWS: [EncoderRow; 3] = [
    EncoderRow {
        name: "ViT-T/4 at 16², MAE",
        sets: &[
            "model.encoder=vit_t16",
            "model.patch_size=4",
            "objective.name=mae",
            "objective.params={decoder_dim: 64, decoder_depth: 1, decoder_heads: 2}",
            "train.batch_size=8",
            "train.views=1",
            "train.lr=1e-4",
        ],
        shape: &[1, 16, 16],
    },
    EncoderRow {
        name: "ViT-T/4 at 16², I-JEPA",
        sets: &[
            "model.encoder=vit_t16",
            "model.patch_size=4",
            "objective.name=ijepa",
            "objective.params={predictor_dim: 64, predictor_depth: 2, predictor_heads: 2, target_scale: [0.25, 0.35], targets: 2, min_keep: 1}",
            "train.batch_size=8",
            "train.views=1",
            "train.lr=1e-4",
        ],
        shape: &[1, 16, 16],
    },
    EncoderRow {
        name: "ViT-T/4 at 16², LeJEPA",
        sets: &[
            "model.encoder=vit_t16",
            "model.patch_size=4",
            "objective.name=lejepa",
            "objective.params.slices=64",
            "train.batch_size=8",
            "train.views=2",
            "train.lr=1e-4",
        ],
        shape: &[1, 16, 16],
    },
];

/// `row` on `device` (with `composed`, through the composed ops) against the fused CPU
/// kernels: the first step's loss and gradients, then three steps, with tolerances scaled by
/// the reference's own sensitivity. Prints the comparison; returns its disagreements.
fn check_encoder_row(row: &EncoderRow, device: &Device, composed: bool) -> Result<Vec<String>> {
    let cfg = config(row.sets)?;
    let data = DataSplit::shape_only(row.shape, 64);
    let (b, v) = (cfg.train.batch_size, cfg.train.views);
    let images = inputs(v * b, row.shape)?;
    // One f32 rounding of every input.
    let nudged = (&images * (1.0 + f64::from(f32::EPSILON)))?;
    let labels: Vec<u32> = (0..b as u32).collect();
    let name = row.name;
    let trace_on = |images: &Tensor, device: &Device, composed: bool| {
        trace(&cfg, &data, images, &labels, 3, device, composed).with_context(|| name.to_string())
    };
    let reference = trace_on(&images, &Device::Cpu, false)?;
    let jitter = trace_on(&nudged, &Device::Cpu, false)?;
    let other = trace_on(&images, device, composed)?;
    let (problems, largest) = compare(&reference, &other, Some(&jitter), 1e-2)?;
    let (_, sensitivity) = compare(&reference, &jitter, None, 1e-2)?;
    println!(
        "{name}: loss {:.6} / {:.6}, largest gradient error {largest:.1e} (inputs one rounding \
         away: {sensitivity:.1e}), losses {:?} / {:?}",
        reference.loss, other.loss, reference.losses, other.losses
    );
    Ok(problems
        .into_iter()
        .map(|p| format!("{name}: {p}"))
        .collect())
}

/// Panics listing every disagreement of [`check_encoder_row`] over `rows`.
pub fn assert_rows_match<'a>(
    rows: impl IntoIterator<Item = &'a EncoderRow>,
    device: &Device,
    composed: bool,
) -> Result<()> {
    let mut report = Vec::new();
    for row in rows {
        report.extend(check_encoder_row(row, device, composed)?);
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}
