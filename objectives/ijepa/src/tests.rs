//! Spec `docs/spec/objectives.md` §2.28: the official code's known answers
//! (`golden/golden.json`, written by `golden/make_golden.py` from the pinned official code in
//! float64), finite differences, the stop-gradient and the EMA, the masks' grids, a few training
//! steps of a tiny ViT, then the objective through the registry.

use std::collections::HashMap;

use super::*;
use candle_core::{DType, Device, Var};
use candle_nn::{Optimizer, VarBuilder, VarMap};
use ssl_core::testing::{
    close, documented_defaults, first_step, json_tensor, max_gradient_error, randn, scalar,
    worst_relative_error,
};
use ssl_core::{Ids, ParamStore, Progress, SingleProcess};
use ssl_models::vit::sincos_2d;
use ssl_models::{PosEmbed, VisionTransformer, VitConfig, VitPool};

const GOLDEN: &str = include_str!("../golden/golden.json");

fn golden() -> serde_json::Value {
    serde_json::from_str(GOLDEN).expect("golden.json parses")
}

/// A golden array as an f64 tensor of its shape ([`json_tensor`]).
fn tensor(value: &serde_json::Value) -> Tensor {
    json_tensor(value).expect("a golden array of numbers")
}

/// [`worst_relative_error`] of tensors of the same shape.
fn worst_error(actual: &Tensor, expected: &Tensor) -> f64 {
    worst_relative_error(actual, expected).expect("f64-convertible tensors")
}

/// A list of `[B, K]` index arrays as u32 masks.
fn masks(value: &serde_json::Value) -> Vec<Tensor> {
    value
        .as_array()
        .expect("a list of masks")
        .iter()
        .map(|m| tensor(m).to_dtype(DType::U32).expect("a mask"))
        .collect()
}

fn count(value: &serde_json::Value, key: &str) -> usize {
    value[key].as_u64().expect(key) as usize
}

#[test]
fn apply_masks_and_repeat_interleave_batch_match_the_official_code() -> Result<()> {
    let golden = golden();
    let case = &golden["apply_masks"];
    let out = apply_masks(&tensor(&case["x"]), &masks(&case["masks"]))?;
    assert_eq!(out.dims(), [2 * 3, 4, 2]);
    assert_eq!(worst_error(&out, &tensor(&case["out"])), 0.0);

    let case = &golden["repeat_interleave_batch"];
    let out = repeat_interleave_batch(
        &tensor(&case["x"]),
        count(case, "batch"),
        count(case, "repeat"),
    )?;
    assert_eq!(worst_error(&out, &tensor(&case["out"])), 0.0);

    // The gather's gradient lands on the gathered rows only, once per use.
    let x = Var::from_tensor(&Tensor::zeros((2, 3, 1), DType::F64, &Device::Cpu)?)?;
    let m = [
        Tensor::new(&[[0u32], [2]], &Device::Cpu)?,
        Tensor::new(&[[0u32], [1]], &Device::Cpu)?,
    ];
    let grads = apply_masks(x.as_tensor(), &m)?.sum_all()?.backward()?;
    let grad = grads.get(x.as_tensor()).expect("a gradient");
    assert_eq!(
        grad.flatten_all()?.to_vec1::<f64>()?,
        [2., 0., 0., 0., 1., 1.]
    );
    Ok(())
}

#[test]
fn bad_masks_and_blocks_are_errors_that_name_the_problem() -> Result<()> {
    let dev = &Device::Cpu;
    let x = Tensor::zeros((2, 4, 3), DType::F32, dev)?;
    let err = |r: candle_core::Result<Tensor>| r.expect_err("an error").to_string();
    let e = err(apply_masks(&x, &[Tensor::new(&[[4u32], [0]], dev)?]));
    assert!(e.contains("names token 4") && e.contains("L = 4"), "{e}");
    let e = err(apply_masks(&x, &[Tensor::new(&[[1i64], [0]], dev)?]));
    assert!(e.contains("not u32"), "{e}");
    let e = err(apply_masks(&x, &[Tensor::new(&[[1u32, 2, 3]], dev)?]));
    assert!(e.contains("mask 0 has shape [1, 3]"), "{e}");
    let e = err(apply_masks(
        &x,
        &[
            Tensor::new(&[[1u32], [0]], dev)?,
            Tensor::new(&[[1u32, 2], [0, 1]], dev)?,
        ],
    ));
    assert!(e.contains("mask 1"), "{e}");
    assert!(err(apply_masks(&x, &[])).contains("no masks"));
    let e = err(repeat_interleave_batch(&x, 3, 2));
    assert!(e.contains("batch = 3"), "{e}");
    let e = err(ijepa_loss(&x, &x.narrow(1, 0, 2)?));
    assert!(e.contains("same shape"), "{e}");
    Ok(())
}

/// A `VarBuilder` over the golden predictor's state dict, each tensor a `Var` (for gradients).
fn golden_predictor(case: &serde_json::Value) -> Result<(Predictor, HashMap<String, Var>)> {
    let varmap = VarMap::new();
    let mut vars = HashMap::new();
    {
        let mut data = varmap.data().lock().expect("varmap lock");
        for (name, value) in case["state_dict"].as_object().expect("a state dict") {
            let var = Var::from_tensor(&tensor(value))?;
            data.insert(name.clone(), var.clone());
            vars.insert(name.clone(), var);
        }
    }
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let predictor = Predictor::new(
        count(case, "embed_dim"),
        count(case, "predictor_dim"),
        count(case, "depth"),
        count(case, "heads"),
        vb,
    )?;
    assert_eq!(
        varmap.all_vars().len(),
        vars.len(),
        "every key is the official one"
    );
    Ok((predictor, vars))
}

#[test]
fn the_predictor_matches_the_official_forward_and_gradients_to_1e_10() -> Result<()> {
    let golden = golden();
    let case = &golden["predictor"];
    let grid = count(case, "grid");
    // The fixed positions are the official buffer's.
    let positions = Tensor::from_vec(
        sincos_2d(count(case, "predictor_dim"), grid, grid),
        (grid * grid, count(case, "predictor_dim")),
        &Device::Cpu,
    )?;
    assert!(worst_error(&positions, &tensor(&case["pos_embed"])) < 1e-15);

    let (predictor, vars) = golden_predictor(case)?;
    let context = Var::from_tensor(&tensor(&case["context"]))?;
    let out = predictor.forward(
        context.as_tensor(),
        &masks(&case["masks_x"]),
        &masks(&case["masks"]),
        (grid, grid),
    )?;
    // T·C·B = 3·2·2 rows of the 3 target patches.
    assert_eq!(out.dims(), [12, 3, count(case, "embed_dim")]);
    let error = worst_error(&out, &tensor(&case["out"]));
    assert!(error <= 1e-10, "forward off by {error:e}");

    let grads = (out * tensor(&case["weights"]))?.sum_all()?.backward()?;
    for (expected, var) in [
        ("grad_context", &context),
        ("grad_mask_token", &vars["mask_token"]),
        (
            "grad_predictor_embed_weight",
            &vars["predictor_embed.weight"],
        ),
    ] {
        let grad = grads.get(var.as_tensor()).expect(expected);
        let error = worst_error(grad, &tensor(&case[expected]));
        assert!(error <= 1e-10, "{expected} off by {error:e}");
    }
    Ok(())
}

#[test]
fn predictor_gradients_match_finite_differences() -> Result<()> {
    let golden = golden();
    let case = &golden["predictor"];
    let grid = count(case, "grid");
    let (context_masks, target_masks) = (masks(&case["masks_x"]), masks(&case["masks"]));
    let weights = tensor(&case["weights"]);
    let state: HashMap<String, Tensor> = case["state_dict"]
        .as_object()
        .expect("a state dict")
        .iter()
        .map(|(k, v)| (k.clone(), tensor(v)))
        .collect();
    let context = tensor(&case["context"]);
    // The weighted output as a function of the context tokens, or of one parameter.
    let score = |context: &Tensor, replaced: Option<(&str, &Tensor)>| {
        let mut state = state.clone();
        if let Some((name, value)) = replaced {
            state.insert(name.to_string(), value.clone());
        }
        let vb = VarBuilder::from_tensors(state, DType::F64, &Device::Cpu);
        let predictor = Predictor::new(
            count(case, "embed_dim"),
            count(case, "predictor_dim"),
            count(case, "depth"),
            count(case, "heads"),
            vb,
        )?;
        (predictor.forward(context, &context_masks, &target_masks, (grid, grid))? * &weights)?
            .sum_all()
    };
    let error = max_gradient_error(&context, |x| score(x, None))?;
    assert!(error < 1e-6, "context: {error:e}");
    for name in [
        "mask_token",
        "predictor_blocks.0.attn.qkv.weight",
        "predictor_blocks.1.mlp.fc2.bias",
        "predictor_norm.weight",
        "predictor_proj.weight",
    ] {
        let error = max_gradient_error(&state[name], |p| score(&context, Some((name, p))))?;
        assert!(error < 1e-6, "{name}: {error:e}");
    }
    Ok(())
}

#[test]
fn the_target_pipeline_and_the_loss_match_the_official_code_to_1e_10() -> Result<()> {
    let golden = golden();
    let case = &golden["loss"];
    let h = tensor(&case["h"]);
    let target = repeat_interleave_batch(
        &apply_masks(&target_layer_norm(&h)?, &masks(&case["masks"]))?,
        h.dim(0)?,
        count(case, "masks_x_count"),
    )?;
    let expected_target = tensor(&case["target"]);
    assert!(worst_error(&target, &expected_target) <= 1e-10);

    let z = Var::from_tensor(&tensor(&case["z"]))?;
    let loss = ijepa_loss(z.as_tensor(), &target)?;
    close(scalar(&loss), case["loss"].as_f64().expect("loss"), 1e-10);
    let grads = loss.backward()?;
    let grad = grads.get(z.as_tensor()).expect("a gradient");
    let error = worst_error(grad, &tensor(&case["grad_z"]));
    assert!(error <= 1e-10, "gradient off by {error:e}");
    // Both branches of the smooth L1 are exercised.
    let outside = (z.as_tensor() - &target)?
        .abs()?
        .gt(1.0)?
        .to_dtype(DType::F64)?
        .mean_all()?;
    let outside = scalar(&outside);
    assert!(outside > 0.2 && outside < 0.8, "{outside}");
    // The layer norm has no affine part: every row has mean 0 and variance 1/(1 + ε/σ²).
    let normed = target_layer_norm(&h)?;
    let mean = normed.mean_keepdim(D::Minus1)?.abs()?.max_all()?;
    assert!(scalar(&mean) < 1e-12);
    Ok(())
}

use candle_core::D;

fn progress(step: usize, steps_per_epoch: usize, epochs: usize) -> Progress {
    Progress {
        step,
        epoch: step / steps_per_epoch,
        steps_per_epoch,
        total_steps: steps_per_epoch * epochs,
        seed: 0,
    }
}

#[test]
fn the_momentum_schedule_is_the_official_generator_s() {
    let golden = golden();
    for schedule in golden["momentum"].as_array().expect("schedules") {
        let ema = schedule["ema"].as_array().expect("ema");
        let (start, end) = (ema[0].as_f64().unwrap(), ema[1].as_f64().unwrap());
        let ipe_scale = schedule["ipe_scale"].as_f64().unwrap();
        let (ipe, epochs) = (
            count(schedule, "steps_per_epoch"),
            count(schedule, "epochs"),
        );
        let values = schedule["values"].as_array().expect("values");
        // Every value the official generator yields, the k-th at step k.
        for (k, expected) in values.iter().enumerate() {
            let m = momentum(start, end, ipe_scale, &progress(k, ipe, epochs));
            close(m, expected.as_f64().unwrap(), 1e-15);
        }
    }
    // The first step uses ema_start; the run's last step is short of ema_end by one step's share.
    close(
        momentum(0.996, 1.0, 1.0, &progress(0, 10, 10)),
        0.996,
        1e-15,
    );
    close(
        momentum(0.996, 1.0, 1.0, &progress(99, 10, 10)),
        1.0 - 0.004 / 100.0,
        1e-15,
    );
    assert_eq!(momentum(0.996, 1.0, 0.5, &progress(60, 10, 10)), 1.0);
}

/// A ViT of width 16 on 16-px RGB images with 4-px patches (a 4 × 4 grid), mean-pooled.
fn tiny_vit_config(depth: usize) -> VitConfig {
    VitConfig {
        patch_size: 4,
        embed_dim: 16,
        depth,
        num_heads: 2,
        mlp_ratio: 4,
        in_channels: 3,
        img_size: 16,
        pool: VitPool::Mean,
        pos_embed: PosEmbed::Learned,
    }
}

/// Settings for 4 × 4 patch grids (crate docs).
const SMALL_GRID: &str = "{predictor_dim: 16, predictor_depth: 1, predictor_heads: 2, \
                          target_scale: [0.25, 0.35], targets: 2, min_keep: 1}";

fn build_context(store: &ParamStore, views: usize, global_views: usize) -> BuildContext<'_> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 16,
        num_classes: None,
        instance_labels: None,
        projection_dim: 16,
        feature_dim: 16,
        views,
        global_views,
        batch_size: 4,
        patches: Some(ssl_core::Patches {
            size: 4,
            channels: 1,
            image: (16, 16),
        }),
    }
}

fn build(params: &str, store: &ParamStore) -> Result<Box<dyn Objective>> {
    let value: serde_yaml::Value = serde_yaml::from_str(params)?;
    (ssl_core::find("ijepa")?.build)(&value, &build_context(store, 1, 1))
}

/// The student and its teacher as the trainer keeps them: two stores, the teacher a copy of
/// the student (same seed, same names).
struct Encoders {
    student_store: ParamStore,
    teacher_store: ParamStore,
    student: VisionTransformer,
    teacher: VisionTransformer,
}

fn encoders(depth: usize) -> Result<Encoders> {
    let cfg = tiny_vit_config(depth);
    let (student_store, teacher_store) = (ParamStore::new(3), ParamStore::new(3));
    let student =
        VisionTransformer::new(&cfg, student_store.var_builder(&Device::Cpu).pp("encoder"))?;
    let teacher =
        VisionTransformer::new(&cfg, teacher_store.var_builder(&Device::Cpu).pp("encoder"))?;
    Ok(Encoders {
        student_store,
        teacher_store,
        student,
        teacher,
    })
}

fn pixel_batch<'a>(
    views: &'a [Tensor],
    encoders: &'a Encoders,
    ids: &'a Ids,
    progress: Progress,
) -> PixelBatch<'a> {
    PixelBatch {
        views,
        global_views: views.len(),
        encoder: &encoders.student,
        teacher: Some(&encoders.teacher),
        indices: ids,
        labels: None,
        progress,
        train: true,
        collective: &SingleProcess,
    }
}

#[test]
fn the_target_carries_no_gradient_and_the_ema_moves_the_teacher() -> Result<()> {
    let dev = &Device::Cpu;
    let encoders = encoders(1)?;
    let objective_store = ParamStore::new(5);
    let mut objective = build(SMALL_GRID, &objective_store)?;
    let views = [randn(0f32, 1.0, (4, 3, 16, 16), dev)?];
    let ids = Ids::range(4, dev)?;
    let out = objective.pixel_loss(&pixel_batch(&views, &encoders, &ids, first_step()))?;
    assert_eq!(out.embeddings.dims(), [1, 4, 16]);
    // The embedding is the teacher's patch tokens averaged (before the target's layer norm).
    let expected = encoders
        .teacher
        .forward_tokens(&views[0], None)?
        .patches
        .mean(1)?;
    assert!(scalar(&(out.embeddings.get(0)? - expected)?.abs()?.max_all()?) < 1e-6);
    let grads = out.output.loss.backward()?;
    let student = encoders.student_store.vars();
    let teacher = encoders.teacher_store.vars();
    for (name, var) in &teacher {
        assert!(
            grads.get(var.as_tensor()).is_none(),
            "teacher {name} got a gradient"
        );
    }
    // Every parameter of the context encoder gets a gradient (the class token too: the patch
    // tokens attend to it).
    for (name, var) in &student {
        let grad = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("student {name} has no gradient"));
        assert!(scalar(&grad.abs()?.sum_all()?) > 0.0, "{name}");
    }
    for (name, var) in objective_store.vars() {
        let grad = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("predictor {name} has no gradient"));
        assert!(scalar(&grad.abs()?.sum_all()?) > 0.0, "{name}");
    }

    // Move the student, then the EMA step k = 5 of 10: ξ ← m ξ + (1 − m) θ, m = 0.996 + 5·0.0004.
    for (_, var) in &student {
        var.set(&(var.as_tensor() + 0.5)?)?;
    }
    let before: Vec<Tensor> = teacher
        .iter()
        .map(|(_, v)| v.as_tensor().copy())
        .collect::<candle_core::Result<_>>()?;
    objective.after_step(&StepContext {
        progress: progress(5, 10, 1),
        student: &student,
        teacher: Some(&teacher),
    })?;
    let m = 0.996 + 5.0 * 0.004 / 10.0;
    for ((name, t), (old, (_, s))) in teacher.iter().zip(before.iter().zip(&student)) {
        let expected = ((old * m)? + (s.as_tensor() * (1.0 - m))?)?;
        let diff = scalar(&(t.as_tensor() - &expected)?.abs()?.max_all()?);
        assert!(diff < 1e-6, "{name}: {diff}");
        assert!(
            scalar(&(t.as_tensor() - old)?.abs()?.max_all()?) > 1e-4,
            "{name} did not move"
        );
    }
    let err = objective
        .after_step(&StepContext {
            progress: first_step(),
            student: &student,
            teacher: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains("teacher"), "{err}");
    Ok(())
}

#[test]
fn masks_follow_the_run_seed_and_step_and_differ_between_views() -> Result<()> {
    let dev = &Device::Cpu;
    let encoders = encoders(1)?;
    let mut objective = build(SMALL_GRID, &ParamStore::new(5))?;
    let view = randn(0f32, 1.0, (4, 3, 16, 16), dev)?;
    let ids = Ids::range(4, dev)?;
    let mut loss_at = |views: &[Tensor], step: usize| -> Result<f64> {
        let progress = Progress {
            step,
            total_steps: 10,
            ..first_step()
        };
        Ok(scalar(
            &objective
                .pixel_loss(&pixel_batch(views, &encoders, &ids, progress))?
                .output
                .loss,
        ))
    };
    let one = [view.clone()];
    let at3 = loss_at(&one, 3)?;
    assert_eq!(loss_at(&one, 3)?, at3);
    assert_ne!(loss_at(&one, 4)?, at3);
    // Two copies of the same view: view 0 draws the step's masks, view 1 its own, so the mean
    // differs from view 0's loss.
    let two = [view.clone(), view];
    let both = loss_at(&two, 3)?;
    assert!((both - at3).abs() > 1e-7, "{both} vs {at3}");
    Ok(())
}

#[test]
fn grids_too_small_for_the_blocks_are_refused_with_the_key_to_change() -> Result<()> {
    let dev = &Device::Cpu;
    let encoders = encoders(1)?;
    let ids = Ids::range(2, dev)?;
    // At build, from the views' size the context gives (16 px in 4-px patches).
    let err = build(
        "{predictor_dim: 16, predictor_depth: 1, predictor_heads: 2}",
        &ParamStore::new(0),
    )
    .err()
    .expect("min_keep 10 on a 4×4 grid")
    .to_string();
    assert!(
        err.contains("4×4 patch grid") && err.contains("`min_keep`") && err.contains("target"),
        "{err}"
    );
    // At the step, from the views themselves.
    let mut objective = build(SMALL_GRID, &ParamStore::new(0))?;
    let tiny = [randn(0f32, 1.0, (2, 3, 16, 4), dev)?];
    let err = objective
        .pixel_loss(&pixel_batch(&tiny, &encoders, &ids, first_step()))
        .err()
        .expect("a 4×1 grid")
        .to_string();
    assert!(
        err.contains("4×1 patch grid") && err.contains("2×2"),
        "{err}"
    );
    // The documented small-grid settings draw masks at every step, on 4 × 4 and on 8 × 8.
    for (grid, params) in [((4, 4), SMALL_GRID), ((8, 8), "{min_keep: 4}")] {
        let config: IjepaConfig = serde_yaml::from_str(params)?;
        config.validate()?;
        let masks = config.masks();
        for step in 0..300 {
            let progress = Progress {
                step,
                total_steps: 300,
                ..first_step()
            };
            let drawn = masks.sample_for_step(8, grid, &progress)?;
            assert!(drawn.context[0].per_image() > config.min_keep);
            assert!(drawn.targets[0].per_image() > config.min_keep);
        }
    }
    Ok(())
}

#[test]
fn a_tiny_vit_learns_to_predict_its_teacher() -> Result<()> {
    let dev = &Device::Cpu;
    let encoders = encoders(2)?;
    let objective_store = ParamStore::new(11);
    let mut objective = build(SMALL_GRID, &objective_store)?;
    // Eight fixed images: smooth patterns, so neighbouring patches are predictable.
    let coords = Tensor::arange(0f32, 16.0, dev)?.affine(0.4, 0.0)?;
    let rows = coords
        .reshape((1, 1, 16, 1))?
        .broadcast_as((8, 3, 16, 16))?;
    let cols = coords
        .reshape((1, 1, 1, 16))?
        .broadcast_as((8, 3, 16, 16))?;
    let phase = randn(0f32, 1.0, (8, 3, 1, 1), dev)?;
    let views = [(rows.broadcast_add(&phase)?.sin()? + cols.broadcast_mul(&phase)?.cos()?)?];
    let ids = Ids::range(8, dev)?;
    let student = encoders.student_store.vars();
    let teacher = encoders.teacher_store.vars();
    let mut trained: Vec<Var> = student.iter().map(|(_, v)| v.clone()).collect();
    trained.extend(objective_store.vars().into_iter().map(|(_, v)| v));
    let mut optimiser = candle_nn::AdamW::new(
        trained,
        candle_nn::ParamsAdamW {
            lr: 2e-3,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let snapshot = |vars: &[(String, Var)]| -> candle_core::Result<Vec<Tensor>> {
        vars.iter().map(|(_, v)| v.as_tensor().copy()).collect()
    };
    let (student_before, teacher_before) = (snapshot(&student)?, snapshot(&teacher)?);
    let predictor_before = snapshot(&objective_store.vars())?;
    let steps = 40;
    let mut losses = Vec::new();
    for step in 0..steps {
        let progress = Progress {
            step,
            steps_per_epoch: steps,
            total_steps: steps,
            ..first_step()
        };
        // The same masks every step, so the loss is comparable across steps.
        let fixed = Progress {
            step: 0,
            ..progress
        };
        let out = objective.pixel_loss(&pixel_batch(&views, &encoders, &ids, fixed))?;
        losses.push(scalar(&out.output.loss));
        optimiser.backward_step(&out.output.loss)?;
        objective.after_step(&StepContext {
            progress,
            student: &student,
            teacher: Some(&teacher),
        })?;
    }
    let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
    let last: f64 = losses[steps - 3..].iter().sum::<f64>() / 3.0;
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(last < 0.7 * first, "loss {first} → {last}: {losses:?}");
    // The optimiser moved the encoder and the predictor, the EMA the teacher.
    for (vars, before, what) in [
        (&student, &student_before, "encoder"),
        (&teacher, &teacher_before, "teacher"),
        (&objective_store.vars(), &predictor_before, "predictor"),
    ] {
        let moved = vars
            .iter()
            .zip(before)
            .filter(|((_, v), b)| {
                scalar(
                    &(v.as_tensor() - *b)
                        .unwrap()
                        .abs()
                        .unwrap()
                        .max_all()
                        .unwrap(),
                ) > 0.0
            })
            .count();
        assert_eq!(
            moved,
            vars.len(),
            "{what}: {moved} of {} tensors moved",
            vars.len()
        );
    }
    Ok(())
}

#[test]
fn local_views_a_missing_teacher_and_other_widths_are_refused() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(0);
    let value: serde_yaml::Value = serde_yaml::from_str(SMALL_GRID)?;
    let err = (ssl_core::find("ijepa")?.build)(&value, &build_context(&store, 3, 1))
        .err()
        .expect("local views");
    assert!(err.to_string().contains("train.local_views: 0"), "{err}");

    let encoders = encoders(1)?;
    let mut objective = build(SMALL_GRID, &ParamStore::new(0))?;
    let requirements = objective.requirements();
    assert!(requirements.pixels && !requirements.projector);
    assert_eq!(requirements.teacher, Some(TeacherSpec { train_mode: true }));
    assert_eq!((requirements.min_views, requirements.min_batch), (1, 1));
    let ids = Ids::range(2, dev)?;
    let global = randn(0f32, 1.0, (2, 3, 16, 16), dev)?;
    let local = randn(0f32, 1.0, (2, 3, 8, 8), dev)?;
    let views = [global.clone(), local];
    let with_local = PixelBatch {
        global_views: 1,
        ..pixel_batch(&views, &encoders, &ids, first_step())
    };
    let err = objective
        .pixel_loss(&with_local)
        .err()
        .expect("a local crop")
        .to_string();
    assert!(
        err.contains("no local crops") && err.contains("train.local_views: 0"),
        "{err}"
    );
    let one = [global];
    let no_teacher = PixelBatch {
        teacher: None,
        ..pixel_batch(&one, &encoders, &ids, first_step())
    };
    let err = objective
        .pixel_loss(&no_teacher)
        .err()
        .expect("no teacher")
        .to_string();
    assert!(err.contains("teacher"), "{err}");
    // A predictor built for other token widths.
    let store = ParamStore::new(0);
    let ctx = BuildContext {
        feature_dim: 24,
        ..build_context(&store, 1, 1)
    };
    let mut wide = (ssl_core::find("ijepa")?.build)(&value, &ctx)?;
    let err = wide
        .pixel_loss(&pixel_batch(&one, &encoders, &ids, first_step()))
        .err()
        .expect("a width mismatch")
        .to_string();
    assert!(err.contains("24-wide") && err.contains("16"), "{err}");
    Ok(())
}

#[test]
fn registered_with_the_official_defaults() -> Result<()> {
    let defaults = documented_defaults("ijepa");
    assert_eq!(defaults["predictor_dim"].as_u64(), Some(384));
    assert_eq!(defaults["predictor_depth"].as_u64(), Some(12));
    assert_eq!(defaults["predictor_heads"].as_u64(), Some(12));
    assert_eq!(defaults["ema_start"].as_f64(), Some(0.996));
    assert_eq!(defaults["ema_end"].as_f64(), Some(1.0));
    assert_eq!(defaults["ipe_scale"].as_f64(), Some(1.0));
    assert_eq!(defaults["targets"].as_u64(), Some(4));
    assert_eq!(defaults["contexts"].as_u64(), Some(1));
    assert_eq!(defaults["min_keep"].as_u64(), Some(10));
    assert_eq!(defaults["allow_overlap"].as_bool(), Some(false));
    let pair = |key: &str| -> Vec<f64> {
        defaults[key]
            .as_sequence()
            .expect(key)
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    assert_eq!(pair("context_scale"), [0.85, 1.0]);
    assert_eq!(pair("target_scale"), [0.15, 0.2]);
    assert_eq!(pair("aspect_ratio"), [0.75, 1.5]);
    assert_eq!(IjepaConfig::default().masks(), MultiBlockConfig::default());
    let reg = ssl_core::find("i-jepa")?;
    assert_eq!(reg.name, "ijepa");
    assert!(reg.paper.contains("CVPR 2023") && reg.paper.contains("Assran"));

    // The predictor's parameters carry the official keys, initialised as the released code
    // (the default blocks on the 14 × 14 grid of a ViT/16 at 224 px).
    let store = ParamStore::new(0);
    let vit16 = BuildContext {
        patches: Some(ssl_core::Patches {
            size: 16,
            channels: 1,
            image: (224, 224),
        }),
        ..build_context(&store, 1, 1)
    };
    (ssl_core::find("ijepa")?.build)(&serde_yaml::Value::Null, &vit16)?;
    let tensors = store.tensors();
    assert_eq!(
        tensors["objective.predictor_embed.weight"].dims(),
        [384, 16]
    );
    assert_eq!(tensors["objective.mask_token"].dims(), [1, 1, 384]);
    assert_eq!(
        tensors["objective.predictor_blocks.11.mlp.fc2.weight"].dims(),
        [384, 1536]
    );
    assert_eq!(tensors["objective.predictor_proj.weight"].dims(), [16, 384]);
    assert!(
        !tensors.keys().any(|k| k.contains("pos_embed")),
        "the positions are not trained"
    );
    let std = |name: &str| -> Result<f64> {
        let t = tensors[name].to_dtype(DType::F64)?;
        Ok(scalar(&t.sqr()?.mean_all()?).sqrt())
    };
    // fix_init_weight's rescaling is undone by init_model: the last block's fc2 is N(0, 0.02²).
    close(
        std("objective.predictor_blocks.11.mlp.fc2.weight")?,
        0.02,
        0.02,
    );
    close(std("objective.mask_token")?, 0.02, 0.15);
    assert_eq!(std("objective.predictor_proj.bias")?, 0.0);
    Ok(())
}

#[test]
fn bad_configurations_name_the_key() {
    let store = ParamStore::new(0);
    for (params, expect) in [
        ("{predictor_dim: 30}", "`predictor_dim`"),
        ("{predictor_heads: 5}", "`predictor_heads`"),
        ("{ema_start: 1.5}", "`ema_start`"),
        ("{ema_end: -0.1}", "`ema_end`"),
        ("{ipe_scale: 0}", "`ipe_scale`"),
        ("{targets: 0}", "`targets`"),
        ("{target_scale: [0.3, 0.2]}", "target_scale"),
        ("{aspect_ratio: [0, 1]}", "aspect_ratio"),
        ("{ema: [0.99, 1.0]}", "unknown field `ema`"),
    ] {
        let err = format!("{:#}", build(params, &store).err().expect(params));
        assert!(err.contains(expect), "{params}: {err}");
    }
}
