use super::*;
use candle_core::{DType, Device};
use ssl_core::testing::{batch, close, documented_defaults, max_gradient_error, randn, scalar};
use ssl_core::{Ids, ParamStore, Progress};
use ssl_linalg::normalize_rows;

const KAT_L: f64 = 10.4487920455;
const KAT_CENTER: [f64; 3] = [0.165, 0.025, -0.065];

/// Student `[2, 2, 3]`, teacher `[2, 2, 3]` logits and centre `[3]` of spec
/// `docs/spec/objectives.md` §2.22 (f64).
fn spec_inputs() -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let dev = &Device::Cpu;
    let s = Tensor::new(
        &[
            [[1f64, 0., -1.], [0., 2., 0.]],
            [[0.5, 0.5, 0.], [1., 1., 1.]],
        ],
        dev,
    )?;
    let t = Tensor::new(
        &[[[2f64, 0., 0.], [0., 1., 0.]], [[0., 0., 1.], [1., 0., 0.]]],
        dev,
    )?;
    let c = Tensor::new(&[0.1f64, 0., -0.1], dev)?;
    Ok((s, t, c))
}

fn vector(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    scalar(
        &(a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap(),
    )
}

fn progress(step: usize, epoch: usize) -> Progress {
    Progress {
        step,
        epoch,
        steps_per_epoch: 10,
        total_steps: 100,
        seed: 0,
    }
}

fn small(extra: &str) -> DinoConfig {
    let yaml = format!("out_dim: 6\nhead_hidden: 5\nbottleneck: 4\n{extra}");
    let value: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    ssl_core::registry::parse_config::<DinoConfig>("dino", &value).unwrap()
}

fn context(store: &ParamStore, feature_dim: usize) -> BuildContext<'static> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 16,
        num_classes: None,
        instance_labels: None,
        projection_dim: 3,
        feature_dim,
        views: 3,
        global_views: 3,
        batch_size: 4,
        patches: None,
    }
}

fn config_error(yaml: &str) -> String {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    match ssl_core::registry::parse_config::<DinoConfig>("dino", &value) {
        Ok(_) => panic!("`{yaml}` was accepted"),
        Err(e) => format!("{e:#}"),
    }
}

fn loss_error(objective: &mut dyn Objective, batch: &Batch<'_>) -> String {
    match objective.loss(batch) {
        Ok(_) => panic!("the loss was computed"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn known_answers_spec_2_22() -> candle_core::Result<()> {
    let (s, t, c) = spec_inputs()?;
    close(scalar(&dino_loss(&s, &t, &c, 0.1, 0.04)?), KAT_L, 1e-9);
    let new_c = vector(&updated_center(&c, &t, 0.9)?);
    for (got, want) in new_c.iter().zip(KAT_CENTER) {
        assert!((got - want).abs() < 1e-12, "{new_c:?}");
    }
    let f32s = |x: &Tensor| x.to_dtype(DType::F32);
    let loss32 = dino_loss(&f32s(&s)?, &f32s(&t)?, &f32s(&c)?, 0.1, 0.04)?;
    close(scalar(&loss32), KAT_L, 1e-4);
    let new_c32 = vector(&updated_center(&f32s(&c)?, &f32s(&t)?, 0.9)?);
    for (got, want) in new_c32.iter().zip(KAT_CENTER) {
        assert!((got - want).abs() < 1e-6, "{new_c32:?}");
    }
    // A `[K]` batch mean passes through unchanged.
    let mean = t.mean((0, 1))?;
    assert!(
        max_abs_diff(
            &updated_center(&c, &mean, 0.9)?,
            &updated_center(&c, &t, 0.9)?
        ) < 1e-15
    );
    Ok(())
}

#[test]
fn teacher_temperature_schedule_spec_2_22() {
    for (epoch, want) in [
        (0, 0.04),
        (1, 0.0410344828),
        (29, 0.07),
        (30, 0.07),
        (99, 0.07),
    ] {
        close(teacher_temperature(epoch, 0.04, 0.07, 30), want, 1e-8);
    }
    // linspace(a, b, 1) = [a]; no warm-up means the final value from the start.
    assert_eq!(teacher_temperature(0, 0.04, 0.07, 1), 0.04);
    assert_eq!(teacher_temperature(1, 0.04, 0.07, 1), 0.07);
    assert_eq!(teacher_temperature(0, 0.04, 0.07, 0), 0.07);
    let d = DinoConfig::default();
    for epoch in [0, 15, 29, 300] {
        let tau = teacher_temperature(
            epoch,
            d.warmup_teacher_temp,
            d.teacher_temp,
            d.warmup_teacher_temp_epochs,
        );
        assert_eq!(tau, 0.04);
    }
}

/// `(1/P) Σ_{a<V_g} Σ_{b≠a} mean_i −⟨q^a_i, log softmax(s^b_i/τ_s)⟩`, pair by pair.
fn explicit_pairs(s: &Tensor, t: &Tensor, c: &Tensor, tau_s: f64, tau_t: f64) -> f64 {
    let (v, b, _) = s.dims3().unwrap();
    let vg = t.dim(0).unwrap();
    let mut total = 0.0;
    let mut pairs = 0;
    for a in 0..vg {
        let q = candle_nn::ops::softmax_last_dim(
            &(t.get(a).unwrap().broadcast_sub(c).unwrap() / tau_t).unwrap(),
        )
        .unwrap();
        for o in (0..v).filter(|&o| o != a) {
            let log_p =
                candle_nn::ops::log_softmax(&(s.get(o).unwrap() / tau_s).unwrap(), D::Minus1)
                    .unwrap();
            total -= scalar(&(&q * log_p).unwrap().sum_all().unwrap()) / b as f64;
            pairs += 1;
        }
    }
    total / pairs as f64
}

#[test]
fn multi_crop_averages_every_global_target_with_every_other_crop() -> candle_core::Result<()> {
    let dev = &Device::Cpu;
    for (v, vg) in [(2, 2), (4, 2), (3, 1), (3, 3), (6, 2)] {
        let s = randn(0f64, 1., (v, 4, 5), dev)?;
        let t = randn(0f64, 1., (vg, 4, 5), dev)?;
        let c = randn(0f64, 0.3, 5, dev)?;
        let expected = explicit_pairs(&s, &t, &c, 0.1, 0.04);
        close(scalar(&dino_loss(&s, &t, &c, 0.1, 0.04)?), expected, 1e-10);
    }
    let (s, t, c) = spec_inputs()?;
    close(explicit_pairs(&s, &t, &c, 0.1, 0.04), KAT_L, 1e-9);
    Ok(())
}

#[test]
fn cross_entropy_is_bounded_below_by_the_teacher_entropy() -> candle_core::Result<()> {
    // Both global crops share their targets q, and softmax(s/τ_s) = q for both student crops:
    // every pair's cross-entropy equals the entropy of q, its minimum.
    let dev = &Device::Cpu;
    let t1 = randn(0f64, 1., (3, 5), dev)?;
    let t = Tensor::stack(&[&t1, &t1], 0)?;
    let c = randn(0f64, 0.2, 5, dev)?;
    let q = teacher_probabilities(&t, &c, 0.07)?;
    let s = (q.log()? * 0.1)?;
    let entropy = scalar(&mean_entropy(&q)?);
    close(scalar(&dino_loss(&s, &t, &c, 0.1, 0.07)?), entropy, 1e-10);
    let noise = randn(0f64, 0.1, (2, 3, 5), dev)?;
    assert!(scalar(&dino_loss(&(s + noise)?, &t, &c, 0.1, 0.07)?) > entropy);
    Ok(())
}

#[test]
fn gradient_matches_finite_differences_and_skips_teacher_and_centre() -> candle_core::Result<()> {
    let dev = &Device::Cpu;
    for (v, vg) in [(2, 2), (3, 2), (3, 1)] {
        let s = randn(0f64, 1., (v, 3, 4), dev)?;
        let t = randn(0f64, 1., (vg, 3, 4), dev)?;
        let c = randn(0f64, 0.3, 4, dev)?;
        let err = max_gradient_error(&s, |s| dino_loss(s, &t, &c, 0.1, 0.04))?;
        assert!(err < 1e-6, "V={v}, V_g={vg}: relative gradient error {err}");
        let (teacher, center) = (Var::from_tensor(&t)?, Var::from_tensor(&c)?);
        let student = Var::from_tensor(&s)?;
        let grads = dino_loss(
            student.as_tensor(),
            teacher.as_tensor(),
            center.as_tensor(),
            0.1,
            0.04,
        )?
        .backward()?;
        assert!(grads.get(student.as_tensor()).is_some());
        assert!(grads.get(teacher.as_tensor()).is_none());
        assert!(grads.get(center.as_tensor()).is_none());
        let new_c = updated_center(center.as_tensor(), teacher.as_tensor(), 0.9)?;
        assert!(new_c
            .sum_all()?
            .backward()?
            .get(center.as_tensor())
            .is_none());
    }
    Ok(())
}

#[test]
fn pair_cross_entropy_rejects_bad_shapes() -> candle_core::Result<()> {
    let dev = &Device::Cpu;
    let s = Tensor::zeros((2, 3, 4), DType::F64, dev)?;
    for t in [(3, 3, 4), (2, 2, 4), (2, 3, 5), (0, 3, 4)] {
        let err = pair_cross_entropy(&s, &Tensor::zeros(t, DType::F64, dev)?, 0.1).unwrap_err();
        assert!(err.to_string().contains("V_g"), "{err}");
    }
    let one = Tensor::zeros((1, 3, 4), DType::F64, dev)?;
    let err = pair_cross_entropy(&one, &one, 0.1).unwrap_err().to_string();
    assert!(err.contains("V ≥ 2"), "{err}");
    Ok(())
}

fn shape(use_bn: bool, layers: usize) -> HeadShape {
    HeadShape {
        in_dim: 3,
        layers,
        hidden: 5,
        bottleneck: 4,
        out_dim: 6,
        use_bn,
    }
}

#[test]
fn head_keys_follow_the_reference_dino_head() -> Result<()> {
    let cases: [(bool, usize, &[&str]); 3] = [
        (
            false,
            3,
            &[
                "last_layer.weight_v",
                "mlp.0.bias",
                "mlp.0.weight",
                "mlp.2.bias",
                "mlp.2.weight",
                "mlp.4.bias",
                "mlp.4.weight",
            ],
        ),
        (
            true,
            3,
            &[
                "last_layer.weight_v",
                "mlp.0.bias",
                "mlp.0.weight",
                "mlp.1.bias",
                "mlp.1.running_mean",
                "mlp.1.running_var",
                "mlp.1.weight",
                "mlp.3.bias",
                "mlp.3.weight",
                "mlp.4.bias",
                "mlp.4.running_mean",
                "mlp.4.running_var",
                "mlp.4.weight",
                "mlp.6.bias",
                "mlp.6.weight",
            ],
        ),
        (false, 1, &["last_layer.weight_v", "mlp.bias", "mlp.weight"]),
    ];
    for (use_bn, layers, expected) in cases {
        let store = ParamStore::new(0);
        let head = DinoHead::new(shape(use_bn, layers), store.var_builder(&Device::Cpu))?;
        let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, expected);
        let mut trained: Vec<&str> = head.params().iter().map(|(n, _)| n.as_str()).collect();
        trained.sort_unstable();
        let buffers: Vec<&str> = expected
            .iter()
            .copied()
            .filter(|n| !ParamStore::is_buffer(n))
            .collect();
        assert_eq!(trained, buffers);
        let tensors = store.tensors();
        assert_eq!(tensors["last_layer.weight_v"].dims(), [6, 4]);
        if layers == 3 {
            assert_eq!(tensors["mlp.0.weight"].dims(), [5, 3]);
            let last = if use_bn {
                "mlp.6.weight"
            } else {
                "mlp.4.weight"
            };
            assert_eq!(tensors[last].dims(), [4, 5]);
        }
    }
    Ok(())
}

#[test]
fn prototypes_are_weight_normalised_with_unit_gain() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(3);
    let head = DinoHead::new(shape(false, 3), store.var_builder(dev))?;
    let x = randn(0f32, 1., (7, 3), dev)?;
    let logits = head.forward(&x, true, false)?;
    assert_eq!(logits.dims(), [7, 6]);
    let (_, v) = &store.vars_with_prefix("last_layer.weight_v")[0];
    let expected =
        normalize_rows(&head.embed(&x, true)?)?.matmul(&normalize_rows(v.as_tensor())?.t()?)?;
    assert!(max_abs_diff(&logits, &expected) < 1e-6);
    assert!(scalar(&logits.abs()?.max_all()?) <= 1.0 + 1e-6);
    let norms = vector(&head.prototypes()?.sqr()?.sum(1)?);
    assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-6), "{norms:?}");
    // Only the directions of weight_v's rows matter.
    let scale = Tensor::new(&[[0.5f32], [3.], [10.], [0.01], [1.], [7.]], dev)?;
    v.set(&v.as_tensor().broadcast_mul(&scale)?)?;
    assert!(max_abs_diff(&head.forward(&x, true, false)?, &logits) < 1e-5);
    Ok(())
}

#[test]
fn frozen_last_layer_gets_no_gradient() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(1);
    let head = DinoHead::new(shape(false, 3), store.var_builder(dev))?;
    let x = randn(0f32, 1., (4, 3), dev)?;
    let weight = |name: &str| store.vars_with_prefix(name)[0].1.clone();
    let (v, w0) = (weight("last_layer.weight_v"), weight("mlp.0.weight"));
    for frozen in [true, false] {
        let logits = head.forward(&x, true, frozen)?;
        let grads = (logits.sqr()?.sum_all()?).backward()?;
        assert_eq!(grads.get(v.as_tensor()).is_none(), frozen);
        assert!(grads.get(w0.as_tensor()).is_some());
    }
    Ok(())
}

#[test]
fn teacher_head_starts_as_a_copy_and_follows_by_one_minus_m() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(5);
    let mut dino = Dino::new(small(""), &context(&store, 3))?;
    for ((name_s, s), (name_t, t)) in dino
        .head()
        .params()
        .iter()
        .zip(dino.teacher_head().params())
    {
        assert_eq!(name_s, name_t);
        assert_eq!(max_abs_diff(s.as_tensor(), t.as_tensor()), 0.0, "{name_s}");
    }
    let before: Vec<Tensor> = dino
        .teacher_head()
        .params()
        .iter()
        .map(|(_, t)| t.as_tensor().copy())
        .collect::<candle_core::Result<_>>()?;
    for (_, s) in dino.head().params() {
        s.set(&(s.as_tensor() + 1.0)?)?;
    }
    let student = vec![("w".to_string(), Var::new(&[1f32, 2.], dev)?)];
    let teacher = vec![("w".to_string(), Var::new(&[0f32, 0.], dev)?)];
    dino.after_step(&StepContext {
        progress: progress(50, 5),
        student: &student,
        teacher: Some(&teacher),
    })?;
    // m = 1 − (1 − 0.996)(cos(π/2) + 1)/2 = 0.998 at step 50 of 100.
    let m = 0.998;
    for ((name, t), old) in dino.teacher_head().params().iter().zip(&before) {
        let want = (old + (1.0 - m))?;
        assert!(max_abs_diff(t.as_tensor(), &want) < 1e-6, "{name}");
    }
    let backbone = vector(teacher[0].1.as_tensor());
    close(backbone[0], 1.0 - m, 1e-4);
    close(backbone[1], 2.0 * (1.0 - m), 1e-4);
    // No loss since the last step: the centre stays.
    assert_eq!(vector(dino.center()), vec![0.0; 6]);
    let err = dino
        .after_step(&StepContext {
            progress: progress(0, 0),
            student: &student,
            teacher: None,
        })
        .unwrap_err();
    assert!(err.to_string().contains("teacher"), "{err}");
    Ok(())
}

#[test]
fn loss_uses_both_heads_and_the_centre_follows_the_teacher_logits() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(9);
    let cfg = small("teacher_temp: 0.07\nwarmup_teacher_temp_epochs: 5");
    let mut dino = Dino::new(cfg, &context(&store, 8))?;
    // Make the teacher head differ from the student's.
    for (_, t) in dino.teacher_head().params() {
        t.set(&(t.as_tensor() * 1.5)?)?;
    }
    let c0 = Tensor::new(&[0.1f32, -0.2, 0.3, 0., 0.05, -0.1], dev)?;
    dino.center.set(&c0)?;
    let features = randn(0f32, 1., (3, 4, 8), dev)?;
    let teacher = randn(0f32, 1., (2, 4, 8), dev)?;
    let indices = Ids::range(4, dev)?;
    let b = Batch {
        teacher: Some(&teacher),
        global_views: 2,
        progress: progress(12, 2),
        ..batch(&features, &indices, None)
    };
    let out = dino.loss(&b)?;
    let s = dino.head().forward_views(&features, true, false)?;
    let t = dino.teacher_head().forward_views(&teacher, true, false)?;
    let tau_t = 0.04 + 0.03 * 2.0 / 4.0;
    close(
        scalar(&out.loss),
        scalar(&dino_loss(&s, &t, &c0, 0.1, tau_t)?),
        1e-5,
    );
    let entropy = scalar(&out.terms[0].1);
    assert_eq!(out.terms[0].0, "teacher_entropy");
    assert!(entropy > 0.0 && entropy <= 6f64.ln() + 1e-6, "{entropy}");

    // An evaluation-mode loss leaves the pending centre update alone.
    let eval = Batch { train: false, ..b };
    let teacher_other = (&teacher * 2.0)?;
    dino.loss(&Batch {
        teacher: Some(&teacher_other),
        ..eval
    })?;
    let student = vec![("w".to_string(), Var::new(&[1f32], dev)?)];
    let backbone = vec![("w".to_string(), Var::new(&[0f32], dev)?)];
    let step = |dino: &mut Dino| {
        dino.after_step(&StepContext {
            progress: progress(12, 2),
            student: &student,
            teacher: Some(&backbone),
        })
    };
    step(&mut dino)?;
    let want = updated_center(&c0, &t, 0.9)?;
    assert!(max_abs_diff(dino.center(), &want) < 1e-6);
    // Centre changes only after a loss.
    step(&mut dino)?;
    assert!(max_abs_diff(dino.center(), &want) < 1e-6);
    Ok(())
}

fn build(yaml: &str, store: &ParamStore, feature_dim: usize) -> Result<Box<dyn Objective>> {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml)?;
    (ssl_core::find("dino")?.build)(&value, &context(store, feature_dim))
}

#[test]
fn registry_built_objective_trains_the_student_head_only() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(7);
    let mut objective = build("out_dim: 32\nhead_hidden: 16\nbottleneck: 8", &store, 8)?;
    let req = objective.requirements();
    assert_eq!(req.teacher, Some(TeacherSpec { train_mode: true }));
    assert!(!req.projector && !req.labels);
    assert_eq!((req.min_views, req.max_views, req.min_batch), (2, None, 1));
    assert!(req.check("dino", 2, 1, false).is_ok());
    let err = format!("{:#}", req.check("dino", 1, 4, false).unwrap_err());
    assert!(err.contains("at least 2 views"), "{err}");
    let tensors = store.tensors();
    assert_eq!(tensors["objective.head.mlp.0.weight"].dims(), [16, 8]);
    assert_eq!(
        tensors["objective.teacher_head.last_layer.weight_v"].dims(),
        [32, 8]
    );
    assert_eq!(tensors["objective.center"].dims(), [32]);

    let features = Var::from_tensor(&randn(0f32, 1., (4, 5, 8), dev)?)?;
    let teacher = randn(0f32, 1., (2, 5, 8), dev)?;
    let indices = Ids::range(5, dev)?;
    let var = |name: &str| store.vars_with_prefix(name)[0].1.clone();
    for (epoch, frozen) in [(0, true), (1, false)] {
        let b = Batch {
            teacher: Some(&teacher),
            global_views: 2,
            progress: progress(epoch * 10, epoch),
            ..batch(features.as_tensor(), &indices, None)
        };
        let out = objective.loss(&b)?;
        let loss = scalar(&out.loss);
        assert!(loss.is_finite() && loss > 0.0, "{loss}");
        let grads = out.loss.backward()?;
        assert!(grads.get(features.as_tensor()).is_some());
        assert!(grads
            .get(var("objective.head.mlp.0.weight").as_tensor())
            .is_some());
        let prototypes = var("objective.head.last_layer.weight_v");
        assert_eq!(grads.get(prototypes.as_tensor()).is_none(), frozen);
        for (name, v) in store.vars_with_prefix("objective.teacher_head.") {
            assert!(grads.get(v.as_tensor()).is_none(), "{name}");
        }
        assert!(grads.get(var("objective.center").as_tensor()).is_none());
    }
    Ok(())
}

#[test]
fn batch_norm_head_trains_and_its_teacher_keeps_its_own_statistics() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(2);
    let mut objective = build(
        "out_dim: 6\nhead_hidden: 5\nbottleneck: 4\nuse_bn: true",
        &store,
        3,
    )?;
    let features = randn(0f32, 1., (2, 3, 3), dev)?;
    let indices = Ids::range(3, dev)?;
    let b = Batch {
        teacher: Some(&features),
        ..batch(&features, &indices, None)
    };
    assert!(scalar(&objective.loss(&b)?.loss).is_finite());
    let running = |prefix: &str| vector(&store.tensors()[&format!("{prefix}.mlp.1.running_mean")]);
    assert!(running("objective.teacher_head").iter().any(|x| *x != 0.0));
    assert!(running("objective.head").iter().any(|x| *x != 0.0));

    // One global crop of one instance gives the teacher's batch norm a single row.
    let one = features.narrow(0, 0, 1)?.narrow(1, 0, 1)?;
    let student = features.narrow(1, 0, 1)?;
    let first = Ids::range(1, dev)?;
    let single = Batch {
        teacher: Some(&one),
        global_views: 1,
        ..batch(&student, &first, None)
    };
    let err = loss_error(objective.as_mut(), &single);
    assert!(
        err.contains("use_bn") && err.contains("at least 2 rows"),
        "{err}"
    );
    Ok(())
}

#[test]
fn missing_or_mismatched_teacher_and_single_view_are_clear_errors() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(0);
    let mut objective = build("out_dim: 6\nhead_hidden: 5\nbottleneck: 4", &store, 3)?;
    let features = randn(0f32, 1., (3, 2, 3), dev)?;
    let indices = Ids::range(2, dev)?;
    let err = loss_error(objective.as_mut(), &batch(&features, &indices, None));
    assert!(err.contains("teacher"), "{err}");
    let teacher = features.narrow(0, 0, 2)?;
    let wrong = Batch {
        teacher: Some(&teacher),
        ..batch(&features, &indices, None)
    };
    let err = loss_error(objective.as_mut(), &wrong);
    assert!(
        err.contains("[3, 2, 3]") && err.contains("global views"),
        "{err}"
    );
    let one_view = features.narrow(0, 0, 1)?;
    let single = Batch {
        teacher: Some(&one_view),
        ..batch(&one_view, &indices, None)
    };
    let err = loss_error(objective.as_mut(), &single);
    assert!(err.contains("at least 2 views"), "{err}");
    // B = 1 is valid.
    let b1 = features.narrow(1, 0, 1)?;
    let t1 = b1.narrow(0, 0, 2)?;
    let first = Ids::range(1, dev)?;
    let ok = Batch {
        teacher: Some(&t1),
        global_views: 2,
        ..batch(&b1, &first, None)
    };
    assert!(scalar(&objective.loss(&ok)?.loss).is_finite());
    Ok(())
}

#[test]
fn registered_with_documented_defaults() {
    let reg = ssl_core::find("dino").unwrap();
    assert!(reg.paper.contains("ICCV 2021") && reg.paper.contains("Caron"));
    let d = documented_defaults(reg.name);
    for (key, want) in [
        ("out_dim", 65536),
        ("head_layers", 3),
        ("head_hidden", 2048),
    ] {
        assert_eq!(d[key].as_u64(), Some(want), "{key}");
    }
    for (key, want) in [("bottleneck", 256), ("warmup_teacher_temp_epochs", 30)] {
        assert_eq!(d[key].as_u64(), Some(want), "{key}");
    }
    assert_eq!(d["freeze_last_layer_epochs"].as_u64(), Some(1));
    assert_eq!(d["use_bn"].as_bool(), Some(false));
    for (key, want) in [
        ("student_temp", 0.1),
        ("teacher_temp", 0.04),
        ("warmup_teacher_temp", 0.04),
        ("center_momentum", 0.9),
        ("momentum_base", 0.996),
    ] {
        assert_eq!(d[key].as_f64(), Some(want), "{key}");
    }
}

#[test]
fn unknown_key_and_bad_values_are_clear_errors() {
    let err = config_error("teacher_temperature: 0.07");
    assert!(
        err.contains("unknown field `teacher_temperature`") && err.contains("teacher_temp"),
        "{err}"
    );
    for (yaml, key) in [
        ("teacher_temp: 0", "`teacher_temp`"),
        ("student_temp: -0.1", "`student_temp`"),
        ("warmup_teacher_temp: .nan", "`warmup_teacher_temp`"),
        ("center_momentum: 1.5", "`center_momentum`"),
        ("momentum_base: -0.1", "`momentum_base`"),
        ("out_dim: 1", "`out_dim`"),
        ("head_layers: 0", "`head_layers`"),
        ("bottleneck: 0", "`bottleneck`"),
    ] {
        let err = config_error(yaml);
        assert!(err.contains(key), "{yaml}: {err}");
    }
    let cfg = small("teacher_temp: 0.07\nhead_layers: 1");
    assert_eq!(
        (cfg.teacher_temp, cfg.head_layers, cfg.out_dim),
        (0.07, 1, 6)
    );
}

#[test]
fn a_short_training_loop_lowers_the_loss_and_moves_teacher_and_centre() -> Result<()> {
    let dev = &Device::Cpu;
    let store = ParamStore::new(11);
    let cfg = DinoConfig {
        out_dim: 16,
        ..small("freeze_last_layer_epochs: 0\nmomentum_base: 0.9")
    };
    let mut dino = Dino::new(cfg, &context(&store, 6))?;
    // Two global crops and one local crop of 8 instances: fixed, trainable "backbone outputs".
    let values: Vec<f32> = (0..3 * 8 * 6)
        .map(|k| ((k * 7 % 23) as f32 * 0.37).sin())
        .collect();
    let features = Var::from_tensor(&Tensor::from_vec(values, (3, 8, 6), dev)?)?;
    let indices = Ids::range(8, dev)?;
    let trained: Vec<Var> = dino
        .head()
        .params()
        .iter()
        .map(|(_, v)| v.clone())
        .chain([features.clone()])
        .collect();
    let teacher_v0 = dino.teacher_head().params()[0].1.as_tensor().copy()?;
    let mut losses = Vec::new();
    for step in 0..30 {
        let teacher = features.as_tensor().narrow(0, 0, 2)?.detach();
        let b = Batch {
            teacher: Some(&teacher),
            global_views: 2,
            progress: progress(step, 0),
            ..batch(features.as_tensor(), &indices, None)
        };
        let out = dino.loss(&b)?;
        losses.push(scalar(&out.loss));
        let grads = out.loss.backward()?;
        for v in &trained {
            if let Some(g) = grads.get(v.as_tensor()) {
                v.set(&(v.as_tensor() - (g * 0.5)?)?)?;
            }
        }
        dino.after_step(&StepContext {
            progress: progress(step, 0),
            student: &[],
            teacher: Some(&[]),
        })?;
    }
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    assert!(losses[29] < losses[0], "{losses:?}");
    let moved = dino.teacher_head().params()[0].1.as_tensor();
    assert!(max_abs_diff(moved, &teacher_v0) > 0.0);
    assert!(vector(dino.center()).iter().any(|c| *c != 0.0));
    Ok(())
}

/// The reference's groups: each student parameter's gradient (encoder and head, not the teacher
/// head) clipped to norm 3.0 on its own, and the student's prototypes frozen for the first
/// epoch; `clip_grad: 0` and `freeze_last_layer_epochs: 0` declare none, and a negative clip is
/// refused.
#[test]
fn declares_per_parameter_clipping_and_the_frozen_last_layer() -> Result<()> {
    let store = ParamStore::new(0);
    let dino = Dino::new(small(""), &context(&store, 3))?;
    let groups = dino.requirements().param_groups;
    assert_eq!(groups.len(), 2);
    let g = &groups[0];
    assert_eq!((g.clip_grad_norm, g.clip_per_parameter), (Some(3.0), true));
    assert!(g.matches("encoder.layers.0.weight"));
    assert!(g.matches("objective.head.last_layer.weight_v"));
    assert!(!g.matches("objective.teacher_head.last_layer.weight_v"));
    assert!(!g.matches("objective.center"));
    let frozen = &groups[1];
    assert_eq!(frozen.freeze_epochs, Some(1));
    let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
    let last: Vec<&String> = names.iter().filter(|n| frozen.matches(n)).collect();
    assert!(!last.is_empty(), "no last-layer parameter in {names:?}");
    assert!(last
        .iter()
        .all(|n| n.starts_with("objective.head.last_layer.")));
    let off = Dino::new(
        small("clip_grad: 0\nfreeze_last_layer_epochs: 0"),
        &context(&ParamStore::new(0), 3),
    )?;
    assert!(off.requirements().param_groups.is_empty());
    let err = config_error("clip_grad: -1");
    assert!(err.contains("`clip_grad` must be ≥ 0"), "{err}");
    Ok(())
}
