//! Spec `docs/spec/objectives.md` §2.20: the known answers, gradients and stop-gradients, the FIFO
//! queue, then the objective built through the registry.

use super::*;
use candle_core::{Device, Var};
use ssl_core::testing::{close, max_gradient_error, randn, scalar};
use ssl_core::{Ids, ParamStore, Progress};

/// The spec's `q`, `k` (`[2, 2]`) and queue (`[3, 2]`), normalised, f64.
fn spec_inputs() -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let dev = &Device::Cpu;
    let q = normalize_rows(&Tensor::new(&[[1f64, 0.], [0., 1.]], dev)?)?;
    let k = normalize_rows(&Tensor::new(&[[1f64, 0.1], [0.2, 1.]], dev)?)?;
    let queue = normalize_rows(&Tensor::new(&[[1f64, 1.], [-1., 0.], [0., -1.]], dev)?)?;
    Ok((q, k, queue))
}

/// `|a − b| ≤ tol·max(|b|, 1)` element by element.
fn all_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol * y.abs().max(1.0), "{a:?} vs {b:?}");
    }
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap()
}

const ROW0: [f64; 4] = [4.975185951, 3.5355339059, -5.0, 0.0];
const ROW1: [f64; 4] = [4.9029033785, 3.5355339059, 0.0, -5.0];
const LOSS: f64 = 0.2255999584;

#[test]
fn known_answers_spec_2_20() -> candle_core::Result<()> {
    let (q, k, queue) = spec_inputs()?;
    let logits = rows(&moco_logits(&q, &k, &queue, 0.2)?);
    all_close(&logits[0], &ROW0, 1e-9);
    all_close(&logits[1], &ROW1, 1e-9);
    close(scalar(&moco_loss(&q, &k, &queue, 0.2)?), LOSS, 1e-9);
    Ok(())
}

#[test]
fn known_answers_in_f32() -> candle_core::Result<()> {
    let (q, k, queue) = spec_inputs()?;
    let (q, k, queue) = (
        q.to_dtype(DType::F32)?,
        k.to_dtype(DType::F32)?,
        queue.to_dtype(DType::F32)?,
    );
    let logits = rows(&moco_logits(&q, &k, &queue, 0.2)?);
    all_close(&logits[0], &ROW0, 1e-4);
    all_close(&logits[1], &ROW1, 1e-4);
    close(scalar(&moco_loss(&q, &k, &queue, 0.2)?), LOSS, 1e-4);
    Ok(())
}

#[test]
fn loss_is_the_cross_entropy_of_label_zero() -> candle_core::Result<()> {
    let dev = &Device::Cpu;
    let q = normalize_rows(&randn(0f64, 1., (5, 4), dev)?)?;
    let k = normalize_rows(&randn(0f64, 1., (5, 4), dev)?)?;
    let queue = normalize_rows(&randn(0f64, 1., (7, 4), dev)?)?;
    let t = 0.07;
    let logits = rows(&moco_logits(&q, &k, &queue, t)?);
    let (qv, kv, qu) = (rows(&q), rows(&k), rows(&queue));
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut expected = 0.0;
    for i in 0..5 {
        let mut row = vec![dot(&qv[i], &kv[i]) / t];
        row.extend(qu.iter().map(|n| dot(&qv[i], n) / t));
        all_close(&logits[i], &row, 1e-12);
        let lse = row.iter().map(|x| x.exp()).sum::<f64>().ln();
        expected += (lse - row[0]) / 5.0;
    }
    close(scalar(&moco_loss(&q, &k, &queue, t)?), expected, 1e-12);
    Ok(())
}

#[test]
fn gradient_matches_finite_differences() -> candle_core::Result<()> {
    let dev = &Device::Cpu;
    for (b, d, size) in [(2, 2, 3), (4, 3, 6), (1, 5, 4)] {
        let q = randn(0f64, 1., (b, d), dev)?;
        let k = normalize_rows(&randn(0f64, 1., (b, d), dev)?)?;
        let queue = normalize_rows(&randn(0f64, 1., (size, d), dev)?)?;
        let err = max_gradient_error(&q, |q| moco_loss(&normalize_rows(q)?, &k, &queue, 0.2))?;
        assert!(
            err < 1e-6,
            "B={b} D={d} K={size}: relative gradient error {err}"
        );
    }
    Ok(())
}

#[test]
fn no_gradient_reaches_keys_or_queue() -> candle_core::Result<()> {
    let (q, k, queue) = spec_inputs()?;
    let (q, k, queue) = (
        Var::from_tensor(&q)?,
        Var::from_tensor(&k)?,
        Var::from_tensor(&queue)?,
    );
    let grads = moco_loss(q.as_tensor(), k.as_tensor(), queue.as_tensor(), 0.2)?.backward()?;
    assert!(grads.get(q.as_tensor()).is_some());
    assert!(grads.get(k.as_tensor()).is_none());
    assert!(grads.get(queue.as_tensor()).is_none());
    Ok(())
}

/// A `[K, 1]` queue holding `0, 1, …, K−1`, and `[B, 1]` keys `100, 101, …`.
fn numbered(size: usize, b: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let dev = &Device::Cpu;
    let queue = Tensor::arange(0f64, size as f64, dev)?.unsqueeze(1)?;
    let keys = Tensor::arange(100f64, 100. + b as f64, dev)?.unsqueeze(1)?;
    Ok((queue, keys))
}

fn column(t: &Tensor) -> Vec<f64> {
    t.squeeze(1).unwrap().to_vec1::<f64>().unwrap()
}

#[test]
fn enqueue_is_fifo_with_wrap_around() -> candle_core::Result<()> {
    let (queue, keys) = numbered(5, 2)?;
    let (q1, p1) = enqueue(&queue, 0, &keys)?;
    assert_eq!((column(&q1), p1), (vec![100., 101., 2., 3., 4.], 2));
    let (queue, keys) = numbered(5, 3)?;
    let (q2, p2) = enqueue(&queue, 3, &keys)?;
    assert_eq!((column(&q2), p2), (vec![102., 1., 2., 100., 101.], 1));
    let (q3, p3) = enqueue(&queue, 2, &keys)?;
    assert_eq!((column(&q3), p3), (vec![0., 1., 100., 101., 102.], 0));
    let (queue, keys) = numbered(4, 4)?;
    let (q4, p4) = enqueue(&queue, 0, &keys)?;
    assert_eq!((column(&q4), p4), (vec![100., 101., 102., 103.], 0));
    // More keys than rows: key j lands on row (ptr + j) mod K, the last K keys stay.
    let (queue, keys) = numbered(3, 5)?;
    let (q5, p5) = enqueue(&queue, 1, &keys)?;
    assert_eq!((column(&q5), p5), (vec![102., 103., 104.], 0));
    Ok(())
}

#[test]
fn enqueue_matches_a_row_by_row_fifo() -> candle_core::Result<()> {
    for size in 1..7 {
        for b in 1..9 {
            for ptr in 0..size {
                let (queue, keys) = numbered(size, b)?;
                let mut want: Vec<f64> = (0..size).map(|r| r as f64).collect();
                for j in 0..b {
                    want[(ptr + j) % size] = 100. + j as f64;
                }
                let (got, next) = enqueue(&queue, ptr, &keys)?;
                assert_eq!(column(&got), want, "K={size} B={b} ptr={ptr}");
                assert_eq!(next, (ptr + b) % size);
            }
        }
    }
    Ok(())
}

#[test]
fn enqueue_rejects_bad_pointer_and_width() -> candle_core::Result<()> {
    let (queue, keys) = numbered(4, 2)?;
    let err = enqueue(&queue, 4, &keys).unwrap_err().to_string();
    assert!(err.contains("pointer 4"), "{err}");
    let wide = Tensor::zeros((2, 3), DType::F64, &Device::Cpu)?;
    let err = enqueue(&queue, 0, &wide).unwrap_err().to_string();
    assert!(err.contains("width 3"), "{err}");
    Ok(())
}

/// Builds `moco` (or an alias) with `overrides` in a fresh seeded store, as the trainer does.
fn build(
    name: &str,
    overrides: &str,
    d: usize,
    views: usize,
    batch_size: usize,
    seed: u64,
) -> Result<(ParamStore, Box<dyn Objective>)> {
    build_crops(name, overrides, d, (views, views), batch_size, seed)
}

/// [`build`] for a run of `views.0` views of which the first `views.1` are global.
fn build_crops(
    name: &str,
    overrides: &str,
    d: usize,
    (views, global_views): (usize, usize),
    batch_size: usize,
    seed: u64,
) -> Result<(ParamStore, Box<dyn Objective>)> {
    let store = ParamStore::new(seed);
    let ctx = BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 10,
        num_classes: None,
        instance_labels: None,
        projection_dim: d,
        feature_dim: d,
        views,
        global_views,
        batch_size,
        patches: None,
    };
    let value: serde_yaml::Value = serde_yaml::from_str(overrides)?;
    let objective = (ssl_core::find(name)?.build)(&value, &ctx)?;
    Ok((store, objective))
}

/// A copy of the store's current `name` (the stored tensor itself changes in place).
fn stored(store: &ParamStore, name: &str) -> Tensor {
    store.tensors()[name].copy().unwrap()
}

fn pointer(store: &ParamStore) -> f32 {
    stored(store, "objective.queue_ptr")
        .to_vec1::<f32>()
        .unwrap()[0]
}

fn step(k: usize) -> Progress {
    Progress {
        step: k,
        epoch: 0,
        steps_per_epoch: 100,
        total_steps: 100,
        seed: 0,
    }
}

/// One training loss on student projections `z` `[V, B, D]` and key projections `t`
/// `[V_g, B, D]`, then `after_step` with a one-parameter student and teacher.
fn train_step(objective: &mut dyn Objective, z: &Tensor, t: &Tensor, k: usize) -> Result<f64> {
    let ids = Ids::range(z.dim(1)?, &Device::Cpu)?;
    let batch = Batch {
        teacher: Some(t),
        global_views: t.dim(0)?,
        progress: step(k),
        ..ssl_core::testing::batch(z, &ids, None)
    };
    let loss = scalar(&objective.loss(&batch)?.loss);
    let student = vec![("w".to_string(), Var::new(&[1f32], &Device::Cpu)?)];
    let teacher = vec![("w".to_string(), Var::new(&[0f32], &Device::Cpu)?)];
    objective.after_step(&StepContext {
        progress: step(k),
        student: &student,
        teacher: Some(&teacher),
    })?;
    Ok(loss)
}

#[test]
fn queue_starts_as_seeded_unit_gaussian_rows() -> Result<()> {
    let (store, _) = build("moco", "queue_size: 64", 8, 2, 4, 3)?;
    let queue = stored(&store, "objective.queue");
    assert_eq!(queue.dims(), [1, 64, 8]);
    let norms = queue
        .sqr()?
        .sum(2)?
        .sqrt()?
        .flatten_all()?
        .to_vec1::<f32>()?;
    for n in norms {
        assert!((n - 1.0).abs() < 1e-5, "row norm {n}");
    }
    let flat = queue.flatten_all()?.to_vec1::<f32>()?;
    assert!(flat.iter().all(|x| x.abs() < 1.0) && flat.iter().any(|x| *x < -0.1));
    assert_eq!(pointer(&store), 0.0);
    let (again, _) = build("moco", "queue_size: 64", 8, 2, 4, 3)?;
    let (other, _) = build("moco", "queue_size: 64", 8, 2, 4, 4)?;
    assert_eq!(
        stored(&again, "objective.queue").to_vec3::<f32>()?,
        queue.to_vec3::<f32>()?
    );
    assert_ne!(
        stored(&other, "objective.queue").to_vec3::<f32>()?,
        queue.to_vec3::<f32>()?
    );
    let (symmetric, _) = build("moco", "queue_size: 64\nsymmetric: true", 8, 3, 4, 3)?;
    assert_eq!(stored(&symmetric, "objective.queue").dims(), [3, 64, 8]);
    Ok(())
}

#[test]
fn steps_use_the_old_queue_then_enqueue_at_the_pointer() -> Result<()> {
    let dev = &Device::Cpu;
    let (d, b, size) = (3, 2, 4);
    let (store, mut objective) = build("mocov2", "queue_size: 4", d, 2, b, 0)?;
    for k in 0..3 {
        let z = randn(0f64, 1., (2, b, d), dev)?;
        let t = randn(0f64, 1., (2, b, d), dev)?;
        let before = stored(&store, "objective.queue")
            .get(0)?
            .to_dtype(DType::F64)?;
        let ptr = pointer(&store) as usize;
        assert_eq!(ptr, (k * b) % size);
        let expected = moco_loss(
            &normalize_rows(&z.get(0)?)?,
            &normalize_rows(&t.get(1)?)?,
            &before,
            0.2,
        )?;
        let loss = train_step(objective.as_mut(), &z, &t, k)?;
        close(loss, scalar(&expected), 1e-6);
        let after = rows(&stored(&store, "objective.queue").get(0)?);
        let keys = rows(&normalize_rows(&t.get(1)?)?);
        let old = rows(&before);
        for (r, row) in after.iter().enumerate() {
            let want = match (r + size - ptr) % size {
                j if j < b => &keys[j],
                _ => &old[r],
            };
            all_close(row, want, 1e-6);
        }
        assert_eq!(pointer(&store) as usize, (ptr + b) % size);
    }
    Ok(())
}

#[test]
fn evaluation_losses_leave_the_queue_alone() -> Result<()> {
    let dev = &Device::Cpu;
    let (store, mut objective) = build("moco", "queue_size: 4", 3, 2, 2, 0)?;
    let z = randn(0f64, 1., (2, 2, 3), dev)?;
    let ids = Ids::range(2, dev)?;
    let before = stored(&store, "objective.queue").to_vec3::<f32>()?;
    let batch = Batch {
        teacher: Some(&z),
        train: false,
        ..ssl_core::testing::batch(&z, &ids, None)
    };
    objective.loss(&batch)?;
    let student = vec![("w".to_string(), Var::new(&[1f32], dev)?)];
    let teacher = vec![("w".to_string(), Var::new(&[0f32], dev)?)];
    objective.after_step(&StepContext {
        progress: step(0),
        student: &student,
        teacher: Some(&teacher),
    })?;
    assert_eq!(stored(&store, "objective.queue").to_vec3::<f32>()?, before);
    assert_eq!(pointer(&store), 0.0);
    Ok(())
}

#[test]
fn queue_never_receives_a_gradient() -> Result<()> {
    let dev = &Device::Cpu;
    let (store, mut objective) = build("moco", "queue_size: 4", 3, 2, 2, 0)?;
    let z = Var::from_tensor(&randn(0f32, 1., (2, 2, 3), dev)?)?;
    let t = randn(0f32, 1., (2, 2, 3), dev)?;
    let ids = Ids::range(2, dev)?;
    let batch = Batch {
        teacher: Some(&t),
        ..ssl_core::testing::batch(z.as_tensor(), &ids, None)
    };
    let grads = objective.loss(&batch)?.loss.backward()?;
    assert!(grads.get(z.as_tensor()).is_some());
    for (name, var) in store.vars() {
        assert!(
            grads.get(var.as_tensor()).is_none(),
            "{name} got a gradient"
        );
    }
    Ok(())
}

#[test]
fn batch_of_one_takes_its_negatives_from_the_queue() -> Result<()> {
    let dev = &Device::Cpu;
    let (store, mut objective) = build("moco", "queue_size: 3", 2, 2, 1, 0)?;
    let req = objective.requirements();
    assert_eq!((req.min_batch, req.min_views, req.max_views), (1, 2, None));
    assert!(req.projector);
    assert_eq!(req.teacher, Some(TeacherSpec { train_mode: true }));
    assert!(req.check("moco", 2, 1, false).is_ok());
    let z = Tensor::new(&[[[1f64, 0.]], [[0.5, 0.5]]], dev)?;
    let t = Tensor::new(&[[[0.3f64, 1.]], [[1., 0.1]]], dev)?;
    let queue = stored(&store, "objective.queue").get(0)?;
    let expected = moco_loss(
        &normalize_rows(&z.get(0)?)?,
        &normalize_rows(&t.get(1)?)?,
        &queue,
        0.2,
    )?;
    let loss = train_step(objective.as_mut(), &z, &t, 0)?;
    close(loss, scalar(&expected), 1e-6);
    assert!(loss.is_finite() && loss > 0.0);
    assert_eq!(pointer(&store), 1.0);
    Ok(())
}

#[test]
fn symmetric_variant_averages_both_directions_with_a_queue_per_view() -> Result<()> {
    let dev = &Device::Cpu;
    let (d, b) = (4, 2);
    let (store, mut objective) = build("moco-v2", "queue_size: 6\nsymmetric: true", d, 2, b, 1)?;
    let z = randn(0f64, 1., (2, b, d), dev)?;
    let t = randn(0f64, 1., (2, b, d), dev)?;
    let queues = stored(&store, "objective.queue");
    let (q, k) = (normalize_rows(&z)?, normalize_rows(&t)?);
    let l12 = moco_loss(&q.get(0)?, &k.get(1)?, &queues.get(1)?, 0.2)?;
    let l21 = moco_loss(&q.get(1)?, &k.get(0)?, &queues.get(0)?, 0.2)?;
    let loss = train_step(objective.as_mut(), &z, &t, 0)?;
    close(loss, (scalar(&l12) + scalar(&l21)) / 2.0, 1e-6);
    let after = stored(&store, "objective.queue");
    for w in 0..2 {
        let rows_after = rows(&after.get(w)?);
        all_close(&rows_after[0], &rows(&k.get(w)?)[0], 1e-6);
        all_close(&rows_after[1], &rows(&k.get(w)?)[1], 1e-6);
        assert_eq!(rows_after[2..], rows(&queues.get(w)?)[2..]);
    }
    assert_eq!(pointer(&store), 2.0);
    Ok(())
}

#[test]
fn extra_views_query_the_key_views() -> Result<()> {
    let dev = &Device::Cpu;
    let (d, b) = (3, 2);
    let z = randn(0f64, 1., (3, b, d), dev)?;
    let (q, k) = (normalize_rows(&z)?, normalize_rows(&z.narrow(0, 0, 2)?)?);
    let pair = |v: usize, w: usize, queue: &Tensor| -> f64 {
        scalar(&moco_loss(&q.get(v).unwrap(), &k.get(w).unwrap(), queue, 0.2).unwrap())
    };
    // Two global views and one local crop: keys from view 1, queries from views 0 and 2.
    let (store, mut objective) = build_crops("moco", "queue_size: 4", d, (3, 2), b, 0)?;
    let queue = stored(&store, "objective.queue").get(0)?;
    let loss = train_step(objective.as_mut(), &z, &k, 0)?;
    close(loss, (pair(0, 1, &queue) + pair(2, 1, &queue)) / 2.0, 1e-6);
    // Symmetric: pairs (1→0), (2→0) with queue 0 and (0→1), (2→1) with queue 1.
    let (store, mut objective) =
        build_crops("moco", "queue_size: 4\nsymmetric: true", d, (3, 2), b, 0)?;
    let queues = stored(&store, "objective.queue");
    assert_eq!(queues.dims(), [2, 4, d], "one queue per global view");
    let (q0, q1) = (queues.get(0)?, queues.get(1)?);
    let loss = train_step(objective.as_mut(), &z, &k, 0)?;
    let want = (pair(1, 0, &q0) + pair(2, 0, &q0) + pair(0, 1, &q1) + pair(2, 1, &q1)) / 4.0;
    close(loss, want, 1e-6);
    Ok(())
}

#[test]
fn after_step_moves_the_key_encoder() -> Result<()> {
    let dev = &Device::Cpu;
    let student = vec![("w".to_string(), Var::new(&[1f32, 2.], dev)?)];
    for (overrides, k, m) in [
        ("", 40, 0.999),
        ("momentum: 0.99\ncosine_momentum: true", 50, 0.995),
        ("momentum: 0.99\ncosine_momentum: true", 0, 0.99),
    ] {
        let (_, mut objective) = build("moco", overrides, 2, 2, 2, 0)?;
        let teacher = vec![("w".to_string(), Var::new(&[0f32, 0.], dev)?)];
        objective.after_step(&StepContext {
            progress: step(k),
            student: &student,
            teacher: Some(&teacher),
        })?;
        let got = teacher[0].1.as_tensor().to_vec1::<f32>()?;
        close(got[0] as f64, 1.0 - m, 1e-4);
        close(got[1] as f64, 2.0 * (1.0 - m), 1e-4);
    }
    Ok(())
}

#[test]
fn resume_restores_queue_and_pointer() -> Result<()> {
    let dev = &Device::Cpu;
    let batches: Vec<(Tensor, Tensor)> = (0..3)
        .map(|_| {
            (
                randn(0f32, 1., (2, 2, 3), dev).unwrap(),
                randn(0f32, 1., (2, 2, 3), dev).unwrap(),
            )
        })
        .collect();
    let (store, mut objective) = build("moco", "queue_size: 6", 3, 2, 2, 0)?;
    train_step(objective.as_mut(), &batches[0].0, &batches[0].1, 0)?;
    let (resumed, mut continued) = build("moco", "queue_size: 6", 3, 2, 2, 9)?;
    assert!(resumed.load(&store.tensors())?.is_empty());
    assert_eq!(pointer(&resumed), 2.0);
    for (k, (z, t)) in batches.iter().enumerate().skip(1) {
        let a = train_step(objective.as_mut(), z, t, k)?;
        let b = train_step(continued.as_mut(), z, t, k)?;
        assert_eq!(a, b);
    }
    assert_eq!(
        stored(&store, "objective.queue").to_vec3::<f32>()?,
        stored(&resumed, "objective.queue").to_vec3::<f32>()?
    );
    assert_eq!(pointer(&resumed), 0.0);
    Ok(())
}

#[test]
fn missing_teacher_and_mismatched_shapes_are_errors() -> Result<()> {
    let dev = &Device::Cpu;
    let (_, mut objective) = build("moco", "queue_size: 4", 3, 2, 2, 0)?;
    let z = randn(0f32, 1., (2, 2, 3), dev)?;
    let ids = Ids::range(2, dev)?;
    let err = objective
        .loss(&ssl_core::testing::batch(&z, &ids, None))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("Batch::teacher"), "{err}");
    let short = z.narrow(0, 0, 1)?;
    let batch = Batch {
        teacher: Some(&short),
        ..ssl_core::testing::batch(&z, &ids, None)
    };
    let err = objective.loss(&batch).err().unwrap().to_string();
    assert!(err.contains("[V_g, B, D] = [2, 2, 3]"), "{err}");
    let wide = randn(0f32, 1., (2, 2, 5), dev)?;
    let batch = Batch {
        teacher: Some(&wide),
        ..ssl_core::testing::batch(&wide, &ids, None)
    };
    let err = objective.loss(&batch).err().unwrap().to_string();
    assert!(err.contains("width 3"), "{err}");
    Ok(())
}

#[test]
fn queue_size_must_be_a_positive_multiple_of_the_batch() {
    let err = format!(
        "{:#}",
        build("moco", "queue_size: 1000", 8, 2, 256, 0)
            .err()
            .unwrap()
    );
    assert!(
        err.contains("multiple of the batch size") && err.contains("768 or 1024"),
        "{err}"
    );
    let err = format!(
        "{:#}",
        build("moco", "queue_size: 100", 8, 2, 256, 0)
            .err()
            .unwrap()
    );
    assert!(err.contains("use queue_size = 256"), "{err}");
    let err = format!(
        "{:#}",
        build("moco", "queue_size: 0", 8, 2, 4, 0).err().unwrap()
    );
    assert!(
        err.contains("`queue_size`") && err.contains("got 0"),
        "{err}"
    );
    assert!(build("moco", "queue_size: 1024", 8, 2, 256, 0).is_ok());
}

#[test]
fn bad_values_and_unknown_keys_are_clear_errors() {
    let parse = |yaml: &str| {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        ssl_core::registry::parse_config::<MocoConfig>("moco", &value)
    };
    for (yaml, key) in [
        ("temperature: 0", "`temperature`"),
        ("temperature: -0.2", "`temperature`"),
        ("momentum: 1.5", "`momentum`"),
        ("queue_size: 16777217", "`queue_size`"),
    ] {
        let err = format!("{:#}", parse(yaml).unwrap_err());
        assert!(err.contains(key), "{yaml}: {err}");
    }
    let err = format!("{:#}", parse("queue: 4096").unwrap_err());
    assert!(
        err.contains("unknown field `queue`") && err.contains("queue_size"),
        "{err}"
    );
    let cfg = parse("queue_size: 4096\nmomentum: 0.99\nsymmetric: true").unwrap();
    assert!(cfg.queue_size == 4096 && cfg.momentum == 0.99 && cfg.symmetric);
}

#[test]
fn registered_with_documented_defaults() {
    let reg = ssl_core::find("moco").unwrap();
    assert!(reg.paper.contains("Improved Baselines") && reg.paper.contains("CVPR 2020"));
    for alias in ["mocov2", "moco-v2", "MoCo"] {
        assert_eq!(ssl_core::find(alias).unwrap().name, "moco");
    }
    let defaults = ssl_core::testing::documented_defaults(reg.name);
    assert_eq!(defaults["temperature"].as_f64(), Some(0.2));
    assert_eq!(defaults["queue_size"].as_u64(), Some(65_536));
    assert_eq!(defaults["momentum"].as_f64(), Some(0.999));
    assert_eq!(defaults["cosine_momentum"].as_bool(), Some(false));
    assert_eq!(defaults["symmetric"].as_bool(), Some(false));
}

/// Symmetric MoCo with 2 global views and 4 local crops keeps 2 queues (one per key view), not
/// 6, and a step enqueues each global view's keys in its own queue.
#[test]
fn symmetric_queues_are_sized_by_the_global_views() -> Result<()> {
    let (d, b) = (4, 2);
    let (store, mut objective) =
        build_crops("moco", "queue_size: 4\nsymmetric: true", d, (6, 2), b, 5)?;
    assert_eq!(stored(&store, "objective.queue").dims(), [2, 4, d]);
    let z = randn(0f32, 1., (6, b, d), &Device::Cpu)?;
    let t = randn(0f32, 1., (2, b, d), &Device::Cpu)?;
    train_step(objective.as_mut(), &z, &t, 0)?;
    let queues = stored(&store, "objective.queue");
    for w in 0..2 {
        let keys = normalize_rows(&t.get(w)?)?.to_vec2::<f32>()?;
        let head = queues.get(w)?.narrow(0, 0, b)?.to_vec2::<f32>()?;
        for (k, q) in keys.iter().flatten().zip(head.iter().flatten()) {
            assert!((k - q).abs() < 1e-6, "queue {w}: {q} against key {k}");
        }
    }
    Ok(())
}
