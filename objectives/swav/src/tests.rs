use super::*;
use candle_core::Device;
use ssl_core::testing::{batch, close, first_step, max_gradient_error, randn, scalar, uniform};
use ssl_core::{Ids, ParamStore, Progress};

const KAT_Q: [[f64; 2]; 3] = [
    [0.99997245602, 0.00002754398],
    [0.98900978604, 0.01099021396],
    [1.8548e-7, 0.99999981452],
];
const KAT_L: f64 = 0.0201176272;
const KAT_CROP0: [[f64; 2]; 3] = [[0.9, 0.1], [0.8, 0.3], [0.2, 0.7]];
const KAT_CROP1: [[f64; 2]; 3] = [[0.7, 0.2], [0.9, 0.1], [0.1, 0.8]];

fn kat_scores() -> candle_core::Result<Tensor> {
    let dev = Device::Cpu;
    Tensor::stack(
        &[
            Tensor::new(&KAT_CROP0, &dev)?,
            Tensor::new(&KAT_CROP1, &dev)?,
        ],
        0,
    )
}

/// Spec `docs/spec/objectives.md` §2.21 Sinkhorn on the host, literally (`[K, B]` layout, no max
/// subtraction).
fn naive_sinkhorn(scores: &[Vec<f64>], eps: f64, iters: usize) -> Vec<Vec<f64>> {
    let (b, k) = (scores.len(), scores[0].len());
    let mut q: Vec<Vec<f64>> = (0..k)
        .map(|p| (0..b).map(|i| (scores[i][p] / eps).exp()).collect())
        .collect();
    let total: f64 = q.iter().flatten().sum();
    q.iter_mut().flatten().for_each(|x| *x /= total);
    for _ in 0..iters {
        for row in q.iter_mut() {
            let s: f64 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= s * k as f64);
        }
        for i in 0..b {
            let s: f64 = q.iter().map(|row| row[i]).sum();
            q.iter_mut().for_each(|row| row[i] /= s * b as f64);
        }
    }
    (0..b)
        .map(|i| (0..k).map(|p| q[p][i] * b as f64).collect())
        .collect()
}

/// The swapped-prediction loss on the host, pair by pair.
fn naive_loss(scores: &[Vec<Vec<f64>>], codes: &[Vec<Vec<f64>>], tau: f64) -> f64 {
    let v = scores.len();
    let mut total = 0.0;
    for (s, q) in codes.iter().enumerate() {
        let mut crop = 0.0;
        for (_, scores_t) in scores.iter().enumerate().filter(|(t, _)| *t != s) {
            let mut ce = 0.0;
            for (row, q_row) in scores_t.iter().zip(q) {
                let lse = row.iter().map(|x| (x / tau).exp()).sum::<f64>().ln();
                ce -= q_row
                    .iter()
                    .zip(row)
                    .map(|(qk, x)| qk * (x / tau - lse))
                    .sum::<f64>();
            }
            crop += ce / scores_t.len() as f64;
        }
        total += crop / (v - 1) as f64;
    }
    total / codes.len() as f64
}

fn build_in(
    store: &ParamStore,
    dtype: DType,
    d: usize,
    views: usize,
    yaml: &str,
) -> Result<Box<dyn Objective>> {
    build_crops(store, dtype, d, views, views, yaml)
}

/// [`build_in`] for a run of `views` views of which the first `global_views` are global.
fn build_crops(
    store: &ParamStore,
    dtype: DType,
    d: usize,
    views: usize,
    global_views: usize,
    yaml: &str,
) -> Result<Box<dyn Objective>> {
    let ctx = BuildContext {
        vb: store
            .var_builder(&Device::Cpu)
            .set_dtype(dtype)
            .pp("objective"),
        num_instances: 10,
        num_classes: None,
        instance_labels: None,
        projection_dim: d,
        feature_dim: d,
        views,
        global_views,
        batch_size: 4,
        patches: None,
    };
    let value: serde_yaml::Value = serde_yaml::from_str(yaml)?;
    (ssl_core::find("swav")?.build)(&value, &ctx)
}

fn var(store: &ParamStore, name: &str) -> Var {
    let vars = store.vars();
    let found = vars.iter().find(|(key, _)| key == name);
    found.expect("a stored variable").1.clone()
}

fn at(step: usize, epoch: usize) -> Progress {
    Progress {
        step,
        epoch,
        steps_per_epoch: 10,
        total_steps: 100,
        ..first_step()
    }
}

fn run(objective: &mut dyn Objective, z: &Tensor, progress: Progress) -> Result<Tensor> {
    let ids = Ids::range(z.dim(1)?, &Device::Cpu)?;
    let b = Batch {
        progress,
        ..batch(z, &ids, None)
    };
    Ok(objective.loss(&b)?.loss)
}

fn step_end(objective: &mut dyn Objective, progress: Progress) -> Result<()> {
    objective.after_step(&StepContext {
        progress,
        student: &[],
        teacher: None,
    })
}

fn row_norms(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .sqr()
        .unwrap()
        .sum(1)
        .unwrap()
        .sqrt()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

#[test]
fn sinkhorn_known_answer_spec_2_21() -> candle_core::Result<()> {
    let s0 = kat_scores()?.get(0)?;
    let q = sinkhorn(&s0, 0.05, 3)?.to_vec2::<f64>()?;
    for (row, want) in q.iter().zip(KAT_Q) {
        for (a, b) in row.iter().zip(want) {
            assert!((a - b).abs() <= 1e-10, "{a} vs {b}");
        }
    }
    let q32 = sinkhorn(&s0.to_dtype(DType::F32)?, 0.05, 3)?;
    assert_eq!(q32.dtype(), DType::F32);
    for (row, want) in q32.to_vec2::<f32>()?.iter().zip(KAT_Q) {
        for (a, b) in row.iter().zip(want) {
            close(*a as f64, b, 1e-4);
        }
    }
    Ok(())
}

#[test]
fn loss_known_answer_spec_2_21() -> candle_core::Result<()> {
    let scores = kat_scores()?;
    let codes = Tensor::stack(
        &[
            sinkhorn(&scores.get(0)?, 0.05, 3)?,
            sinkhorn(&scores.get(1)?, 0.05, 3)?,
        ],
        0,
    )?;
    close(
        scalar(&swapped_prediction_loss(&scores, &codes, 0.1)?),
        KAT_L,
        1e-8,
    );
    let (s32, c32) = (scores.to_dtype(DType::F32)?, codes.to_dtype(DType::F32)?);
    close(
        scalar(&swapped_prediction_loss(&s32, &c32, 0.1)?),
        KAT_L,
        1e-4,
    );
    Ok(())
}

/// Projections whose normalised rows score `KAT_CROP*` against the prototypes `e₁, e₂` of R³:
/// `z = scale·(s₁, s₂, √(1 − s₁² − s₂²))`.
fn kat_projections() -> candle_core::Result<Tensor> {
    let lift = |crop: [[f64; 2]; 3]| -> Vec<Vec<f64>> {
        crop.iter()
            .zip([2.0, 0.5, 3.0])
            .map(|(s, scale)| {
                let rest = (1.0 - s[0] * s[0] - s[1] * s[1]).sqrt();
                vec![scale * s[0], scale * s[1], scale * rest]
            })
            .collect()
    };
    Tensor::new(vec![lift(KAT_CROP0), lift(KAT_CROP1)], &Device::Cpu)
}

#[test]
fn objective_known_answer_through_normalisation() -> Result<()> {
    let unit_axes = Tensor::new(&[[1f64, 0., 0.], [0., 1., 0.]], &Device::Cpu)?;
    for (dtype, rel) in [(DType::F64, 1e-8), (DType::F32, 1e-4)] {
        let store = ParamStore::new(7);
        let mut objective = build_in(&store, dtype, 3, 2, "num_prototypes: 2")?;
        var(&store, "objective.prototypes.weight").set(&unit_axes.to_dtype(dtype)?)?;
        let z = kat_projections()?.to_dtype(dtype)?;
        close(
            scalar(&run(objective.as_mut(), &z, first_step())?),
            KAT_L,
            rel,
        );
    }
    Ok(())
}

#[test]
fn sinkhorn_matches_the_literal_algorithm_and_ignores_a_common_shift() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for (b, k) in [(5, 3), (3, 7), (8, 8)] {
        let s = uniform(-1f64, 1., (b, k), &dev)?;
        let want = naive_sinkhorn(&s.to_vec2::<f64>()?, 0.05, 3);
        for (row, want) in sinkhorn(&s, 0.05, 3)?.to_vec2::<f64>()?.iter().zip(&want) {
            for (a, b) in row.iter().zip(want) {
                assert!((a - b).abs() <= 1e-12, "{a} vs {b}");
            }
        }
        // exp(S/ε) overflows f64 for S = 40 at ε = 0.05; the max subtraction keeps it finite and
        // the codes equal those of the shifted scores, to the rounding of S + 25 (ulp(45)/2 =
        // 3.6e-15) amplified by 1/ε = 20 in the exponent and three Sinkhorn rounds.
        let big = ((s * 20.0)? + 25.0)?;
        let shifted = sinkhorn(&(&big - 25.0)?, 0.05, 3)?.to_vec2::<f64>()?;
        let q = sinkhorn(&big, 0.05, 3)?.to_vec2::<f64>()?;
        for (row, want) in q.iter().zip(&shifted) {
            for (a, b) in row.iter().zip(want) {
                assert!(a.is_finite() && (a - b).abs() <= 1e-10, "{a} vs {b}");
            }
        }
    }
    Ok(())
}

#[test]
fn sinkhorn_on_the_device_computes_the_hosts_codes() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    for (b, k) in [(5, 3), (3, 7), (64, 300)] {
        let s = uniform(-1f64, 1., (b, k), &dev)?;
        // Cosine scores, and scores 25 ± 20 (`S/ε` spans 800): f32's `exp` underflows on most of
        // those, which the log domain never takes. f32 carries `ln q` to about |S/ε|·2⁻²⁴, so its
        // codes (in [0, 1]) are held to 2e-6 on cosines and 1e-4 across the wide span.
        for (s, f32_limit) in [(s.clone(), 2e-6), (((&s * 20.0)? + 25.0)?, 1e-4)] {
            let host = sinkhorn(&s, 0.05, 3)?;
            let device = sinkhorn_on_device(&s, 0.05, 3)?;
            assert_eq!(device.dtype(), DType::F64);
            let f64_error = (&device - &host)?.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(f64_error <= 1e-12, "f64: {f64_error}");
            // f32 scores: the host widens to f64, the device works in f32.
            let s32 = s.to_dtype(DType::F32)?;
            let (host, device) = (sinkhorn(&s32, 0.05, 3)?, sinkhorn_on_device(&s32, 0.05, 3)?);
            assert_eq!(device.dtype(), DType::F32);
            let f32_error = (&device - &host)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(f32_error <= f32_limit, "f32 ({b}×{k}): {f32_error}");
        }
    }
    // A prototype whose every `exp(S/ε − max S/ε)` underflows in f32 (e⁻²⁰⁰ at ε = 0.01) still
    // gets its mass: the codes are the host's f64 ones, not 0/0.
    let far = Tensor::new(&[[1f32, -1.], [0.9, -1.], [0.8, -1.]], &dev)?;
    let (host, device) = (sinkhorn(&far, 0.01, 3)?, sinkhorn_on_device(&far, 0.01, 3)?);
    let error = (&device - &host)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(error <= 1e-6, "{error}: {device}");
    assert!(host.sum(0)?.to_vec1::<f32>()?[1] > 0.5);
    Ok(())
}

#[test]
fn sinkhorn_marginals() -> candle_core::Result<()> {
    let (b, k) = (6, 4);
    let s = uniform(-1f64, 1., (b, k), &Device::Cpu)?;
    // After the final column step every sample's codes sum to 1, whatever the iterations.
    for iters in [1, 3, 10] {
        for total in sinkhorn(&s, 0.05, iters)?.sum(1)?.to_vec1::<f64>()? {
            assert!((total - 1.0).abs() < 1e-12, "{iters} iterations: {total}");
        }
    }
    // At convergence the row step changes nothing either: every prototype holds B/K.
    let q = sinkhorn(&s, 0.5, 1000)?;
    for mass in q.sum(0)?.to_vec1::<f64>()? {
        assert!((mass - b as f64 / k as f64).abs() < 1e-9, "{mass}");
    }
    // Three iterations at ε = 0.05 are far from equipartition on a skewed input.
    let skewed = Tensor::new(&[[1f64, 0.], [0.9, 0.], [0.8, 0.], [0., 0.1]], &Device::Cpu)?;
    let mass = sinkhorn(&skewed, 0.05, 3)?.sum(0)?.to_vec1::<f64>()?;
    assert!((mass[0] - 2.0).abs() > 0.1, "{mass:?}");
    Ok(())
}

#[test]
fn single_sample_gives_uniform_codes_and_is_refused() -> Result<()> {
    let s = Tensor::new(&[[0.9f64, 0.1, -0.3]], &Device::Cpu)?;
    for q in sinkhorn(&s, 0.05, 3)?.flatten_all()?.to_vec1::<f64>()? {
        assert!((q - 1.0 / 3.0).abs() < 1e-15, "{q}");
    }
    let req = build_in(&ParamStore::new(7), DType::F32, 4, 2, "")?.requirements();
    assert_eq!((req.min_batch, req.min_views, req.max_views), (2, 2, None));
    assert!(req.projector && req.teacher.is_none());
    let err = format!("{:#}", req.check("swav", 2, 1, false).unwrap_err());
    assert!(
        err.contains("uniform") && err.contains("--batch-size 2"),
        "{err}"
    );
    assert!(req.check("swav", 2, 2, false).is_ok());
    let err = format!("{:#}", req.check("swav", 1, 8, false).unwrap_err());
    assert!(err.contains("at least 2 views"), "{err}");
    let queued = build_in(&ParamStore::new(7), DType::F32, 4, 2, "queue_size: 8")?.requirements();
    assert_eq!(queued.min_batch, 1);
    Ok(())
}

#[test]
fn gradient_matches_finite_differences() -> candle_core::Result<()> {
    for (v, g) in [(2, 2), (3, 1), (4, 2), (3, 3)] {
        let scores = uniform(-1f64, 1., (v, 4, 5), &Device::Cpu)?;
        let codes: Vec<Tensor> = (0..g)
            .map(|s| sinkhorn(&scores.get(s)?, 0.05, 3))
            .collect::<candle_core::Result<_>>()?;
        let codes = Tensor::stack(&codes, 0)?;
        let err = max_gradient_error(&scores, |x| swapped_prediction_loss(x, &codes, 0.1))?;
        assert!(
            err < 1e-6,
            "V = {v}, G = {g}: relative gradient error {err}"
        );
    }
    Ok(())
}

#[test]
fn matches_the_pairwise_definition_with_local_crops() -> Result<()> {
    let (v, g, b, d, k) = (4, 2, 5, 3, 6);
    let store = ParamStore::new(7);
    let mut objective = build_in(&store, DType::F64, d, v, "num_prototypes: 6")?;
    let c = var(&store, "objective.prototypes.weight")
        .as_tensor()
        .to_vec2::<f64>()?;
    assert_eq!(c.len(), k);
    let z = randn(0f64, 1., (v, b, d), &Device::Cpu)?;
    let scores: Vec<Vec<Vec<f64>>> = z
        .to_vec3::<f64>()?
        .iter()
        .map(|view| {
            view.iter()
                .map(|row| {
                    let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
                    c.iter()
                        .map(|p| p.iter().zip(row).map(|(a, x)| a * x / n).sum())
                        .collect()
                })
                .collect()
        })
        .collect();
    let codes: Vec<_> = scores[..g]
        .iter()
        .map(|s| naive_sinkhorn(s, 0.05, 3))
        .collect();
    let ids = Ids::range(b, &Device::Cpu)?;
    let multi_crop = Batch {
        global_views: g,
        ..batch(&z, &ids, None)
    };
    let loss = scalar(&objective.loss(&multi_crop)?.loss);
    close(loss, naive_loss(&scores, &codes, 0.1), 1e-10);
    Ok(())
}

#[test]
fn prototypes_have_unit_rows_after_build_and_after_every_step() -> Result<()> {
    let store = ParamStore::new(7);
    let mut objective = build_in(&store, DType::F32, 4, 2, "num_prototypes: 5")?;
    let prototypes = var(&store, "objective.prototypes.weight");
    assert_eq!(prototypes.dims(), &[5, 4]);
    for n in row_norms(prototypes.as_tensor()) {
        assert!((n - 1.0).abs() < 1e-6, "{n}");
    }
    let moved = (randn(0f32, 1., (5, 4), &Device::Cpu)? * 3.0)?;
    prototypes.set(&moved)?;
    step_end(objective.as_mut(), first_step())?;
    let now = prototypes.as_tensor().to_dtype(DType::F64)?;
    for n in row_norms(&now) {
        assert!((n - 1.0).abs() < 1e-6, "{n}");
    }
    let norms = Tensor::new(row_norms(&moved), &Device::Cpu)?.unsqueeze(1)?;
    let expected = moved.to_dtype(DType::F64)?.broadcast_div(&norms)?;
    let diff = scalar(&(now - expected)?.abs()?.max_all()?);
    assert!(diff < 1e-6, "{diff}");
    Ok(())
}

#[test]
fn prototypes_get_no_gradient_while_frozen() -> Result<()> {
    let store = ParamStore::new(7);
    let mut objective = build_in(&store, DType::F64, 3, 2, "freeze_prototypes_steps: 5")?;
    let prototypes = var(&store, "objective.prototypes.weight");
    let z = Var::from_tensor(&randn(0f64, 1., (2, 4, 3), &Device::Cpu)?)?;
    for step in [0, 4] {
        let grads = run(objective.as_mut(), z.as_tensor(), at(step, 0))?.backward()?;
        assert!(grads.get(prototypes.as_tensor()).is_none(), "step {step}");
        assert!(grads.get(z.as_tensor()).is_some(), "step {step}");
    }
    let grads = run(objective.as_mut(), z.as_tensor(), at(5, 0))?.backward()?;
    let g = grads
        .get(prototypes.as_tensor())
        .expect("prototypes train after the frozen steps");
    assert!(scalar(&g.abs()?.max_all()?) > 0.0);
    Ok(())
}

fn normalised_global(z: &Tensor, view: usize) -> Vec<Vec<f64>> {
    normalize_rows(&z.get(view).unwrap())
        .unwrap()
        .to_vec2::<f64>()
        .unwrap()
}

fn queue_state(store: &ParamStore) -> (Vec<Vec<Vec<f64>>>, usize, usize) {
    let get = |name: &str| var(store, &format!("objective.{name}")).as_tensor().clone();
    let count = |t: Tensor| t.to_vec1::<f64>().unwrap()[0] as usize;
    (
        get("queue").to_vec3::<f64>().unwrap(),
        count(get("queue_ptr")),
        count(get("queue_fill")),
    )
}

/// Loss with Sinkhorn run on `[queue_s Cᵀ; S_s]` for the two global views, computed directly.
fn loss_with_queue(store: &ParamStore, z: &Tensor) -> Result<f64> {
    let c = var(store, "objective.prototypes.weight")
        .as_tensor()
        .clone();
    let queue = var(store, "objective.queue").as_tensor().clone();
    let scores = normalize_rows(z)?.broadcast_matmul(&c.t()?)?;
    let (size, b) = (queue.dim(1)?, z.dim(1)?);
    let codes: Vec<Tensor> = (0..2)
        .map(|s| {
            let all = Tensor::cat(&[&queue.get(s)?.matmul(&c.t()?)?, &scores.get(s)?], 0)?;
            sinkhorn(&all, 0.05, 3)?.narrow(0, size, b)
        })
        .collect::<candle_core::Result<_>>()?;
    Ok(scalar(&swapped_prediction_loss(
        &scores,
        &Tensor::stack(&codes, 0)?,
        0.1,
    )?))
}

fn loss_without_queue(store: &ParamStore, z: &Tensor) -> Result<f64> {
    let c = var(store, "objective.prototypes.weight")
        .as_tensor()
        .clone();
    let scores = normalize_rows(z)?.broadcast_matmul(&c.t()?)?;
    let codes = Tensor::stack(
        &[
            sinkhorn(&scores.get(0)?, 0.05, 3)?,
            sinkhorn(&scores.get(1)?, 0.05, 3)?,
        ],
        0,
    )?;
    Ok(scalar(&swapped_prediction_loss(&scores, &codes, 0.1)?))
}

#[test]
fn queue_is_a_fifo_used_once_full_and_restored_from_the_store() -> Result<()> {
    let (b, d) = (3, 3);
    let store = ParamStore::new(7);
    let config = "num_prototypes: 4\nqueue_size: 4\nqueue_start_epoch: 1";
    let mut objective = build_crops(&store, DType::F64, d, 3, 2, config)?;
    let batches: Vec<Tensor> = (0..4)
        .map(|_| randn(0f64, 1., (3, b, d), &Device::Cpu))
        .collect::<candle_core::Result<_>>()?;
    let ids = Ids::range(b, &Device::Cpu)?;
    let global_at = |z, progress| Batch {
        global_views: 2,
        progress,
        ..batch(z, &ids, None)
    };
    let global = |z, step| global_at(z, at(step, 1));

    // Epoch 0 (before `queue_start_epoch`): nothing is queued.
    objective.loss(&global_at(&batches[0], at(0, 0)))?;
    step_end(objective.as_mut(), at(0, 0))?;
    let (queue, pointer, filled) = queue_state(&store);
    assert_eq!((pointer, filled), (0, 0));
    assert!(queue.iter().flatten().flatten().all(|x| *x == 0.0));

    // Epoch 1: the first batch fills rows 0..3; the queue is not full, so it is not used.
    let first = scalar(&objective.loss(&global(&batches[1], 400))?.loss);
    close(first, loss_without_queue(&store, &batches[1])?, 1e-12);
    step_end(objective.as_mut(), at(400, 1))?;
    let (queue, pointer, filled) = queue_state(&store);
    assert_eq!((pointer, filled), (3, 3));
    for (view, slot) in queue.iter().enumerate() {
        assert_eq!(&slot[..3], &normalised_global(&batches[1], view)[..]);
    }
    assert_eq!(
        queue.len(),
        2,
        "one slot per global view, none for the local crop"
    );

    // The next batch wraps: its first row lands in row 3, the other two in rows 0 and 1.
    objective.loss(&global(&batches[2], 401))?;
    step_end(objective.as_mut(), at(401, 1))?;
    let (queue, pointer, filled) = queue_state(&store);
    assert_eq!((pointer, filled), (2, 4));
    for (view, slot) in queue.iter().enumerate() {
        let old = normalised_global(&batches[1], view);
        let new = normalised_global(&batches[2], view);
        assert_eq!(
            *slot,
            vec![
                new[1].clone(),
                new[2].clone(),
                old[2].clone(),
                new[0].clone()
            ]
        );
    }

    // Full: Sinkhorn sees the queue. An evaluation-mode loss queues nothing.
    let third = Batch {
        train: false,
        ..global(&batches[3], 402)
    };
    let with_queue = scalar(&objective.loss(&third)?.loss);
    close(with_queue, loss_with_queue(&store, &batches[3])?, 1e-12);
    let without = loss_without_queue(&store, &batches[3])?;
    assert!(
        (with_queue - without).abs() > 1e-9,
        "{with_queue} vs {without}"
    );
    step_end(objective.as_mut(), at(402, 1))?;
    assert_eq!(queue_state(&store), (queue.clone(), 2, 4));

    // A run resumed from the stored tensors sees the same queue.
    let restored = ParamStore::new(7);
    let mut resumed = build_crops(&restored, DType::F64, d, 3, 2, config)?;
    restored.load(&store.tensors())?;
    let again = scalar(&resumed.loss(&third)?.loss);
    close(again, with_queue, 1e-12);
    // …and enqueues where the uninterrupted run does (its pointer read from the store).
    for objective in [&mut objective, &mut resumed] {
        objective.loss(&global(&batches[0], 403))?;
        step_end(objective.as_mut(), at(403, 1))?;
    }
    assert_eq!(queue_state(&restored), queue_state(&store));
    assert_eq!(queue_state(&store).1, 1);
    Ok(())
}

#[test]
fn queue_keeps_the_newest_rows_of_a_larger_batch() -> Result<()> {
    let store = ParamStore::new(7);
    let mut objective = build_in(
        &store,
        DType::F64,
        3,
        2,
        "queue_size: 2\nqueue_start_epoch: 0",
    )?;
    let z = randn(0f64, 1., (2, 5, 3), &Device::Cpu)?;
    run(objective.as_mut(), &z, first_step())?;
    step_end(objective.as_mut(), first_step())?;
    let (queue, pointer, filled) = queue_state(&store);
    assert_eq!((pointer, filled), (0, 2));
    for (view, slot) in queue.iter().enumerate() {
        assert_eq!(&slot[..], &normalised_global(&z, view)[3..]);
    }
    Ok(())
}

#[test]
fn stores_prototypes_and_queue_under_checkpoint_names() -> Result<()> {
    let names = |yaml: &str| -> Result<Vec<(String, Vec<usize>)>> {
        let store = ParamStore::new(7);
        build_in(&store, DType::F32, 8, 4, yaml)?;
        Ok(store
            .vars()
            .iter()
            .map(|(k, v)| (k.clone(), v.dims().to_vec()))
            .collect())
    };
    assert_eq!(
        names("")?,
        vec![("objective.prototypes.weight".to_string(), vec![3000, 8])]
    );
    assert_eq!(
        names("queue_size: 16\nnum_prototypes: 10")?,
        vec![
            ("objective.prototypes.weight".to_string(), vec![10, 8]),
            ("objective.queue".to_string(), vec![4, 16, 8]),
            ("objective.queue_fill".to_string(), vec![1]),
            ("objective.queue_ptr".to_string(), vec![1]),
        ]
    );
    Ok(())
}

#[test]
fn bad_batches_are_clear_errors() -> Result<()> {
    let mut objective = build_in(&ParamStore::new(7), DType::F64, 3, 2, "queue_size: 4")?;
    let ids = Ids::range(4, &Device::Cpu)?;
    let wide = randn(0f64, 1., (2, 4, 5), &Device::Cpu)?;
    let err = format!(
        "{:#}",
        objective.loss(&batch(&wide, &ids, None)).err().unwrap()
    );
    assert!(
        err.contains("5 wide") && err.contains("prototypes"),
        "{err}"
    );
    let z = randn(0f64, 1., (3, 4, 3), &Device::Cpu)?;
    let err = format!(
        "{:#}",
        objective.loss(&batch(&z, &ids, None)).err().unwrap()
    );
    assert!(
        err.contains("2 view slots") && err.contains("3 global"),
        "{err}"
    );
    let none_global = Batch {
        global_views: 0,
        ..batch(&z, &ids, None)
    };
    let err = format!("{:#}", objective.loss(&none_global).err().unwrap());
    assert!(err.contains("0 global views"), "{err}");
    let one_view = randn(0f64, 1., (1, 4, 3), &Device::Cpu)?;
    let codes = sinkhorn(&one_view.get(0)?, 0.05, 3)?.unsqueeze(0)?;
    assert!(swapped_prediction_loss(&one_view, &codes, 0.1).is_err());
    Ok(())
}

#[test]
fn registered_with_documented_defaults() {
    let reg = ssl_core::find("swav").unwrap();
    assert!(reg.paper.contains("NeurIPS 2020") && reg.paper.contains("Caron"));
    let defaults = ssl_core::testing::documented_defaults(reg.name);
    assert_eq!(defaults["num_prototypes"].as_u64(), Some(3000));
    assert_eq!(defaults["temperature"].as_f64(), Some(0.1));
    assert_eq!(defaults["epsilon"].as_f64(), Some(0.05));
    assert_eq!(defaults["sinkhorn_iterations"].as_u64(), Some(3));
    assert_eq!(defaults["freeze_prototypes_steps"].as_u64(), Some(313));
    assert_eq!(defaults["queue_size"].as_u64(), Some(0));
    assert_eq!(defaults["queue_start_epoch"].as_u64(), Some(15));
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let parse = |yaml: &str| {
        let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
        ssl_core::registry::parse_config::<SwavConfig>("swav", &value)
    };
    let err = format!("{:#}", parse("num_prototype: 30").unwrap_err());
    assert!(err.contains("unknown field `num_prototype`"), "{err}");
    for (yaml, key) in [
        ("num_prototypes: 1", "`num_prototypes`"),
        ("temperature: 0", "`temperature`"),
        ("epsilon: -0.05", "`epsilon`"),
        ("sinkhorn_iterations: 0", "`sinkhorn_iterations`"),
    ] {
        let err = format!("{:#}", parse(yaml).unwrap_err());
        assert!(err.contains(key), "{yaml}: {err}");
    }
    let cfg = parse("queue_size: 3840\nfreeze_prototypes_steps: 0").unwrap();
    assert_eq!((cfg.queue_size, cfg.freeze_prototypes_steps), (3840, 0));
}

/// Multi-crop with 2 global views and 4 local crops: the queue holds one slot per global view
/// (the build context's `global_views`, not its 6 `views`), and a step fills exactly those.
#[test]
fn queue_is_sized_by_the_global_views() -> Result<()> {
    let (b, d) = (3, 4);
    let store = ParamStore::new(3);
    let config = "num_prototypes: 5\nqueue_size: 6\nqueue_start_epoch: 0";
    let mut objective = build_crops(&store, DType::F64, d, 6, 2, config)?;
    let (queue, _, _) = queue_state(&store);
    assert_eq!((queue.len(), queue[0].len()), (2, 6));
    let z = randn(0f64, 1., (6, b, d), &Device::Cpu)?;
    let ids = Ids::range(b, &Device::Cpu)?;
    objective.loss(&Batch {
        global_views: 2,
        progress: at(0, 0),
        ..batch(&z, &ids, None)
    })?;
    step_end(objective.as_mut(), at(0, 0))?;
    let (queue, pointer, filled) = queue_state(&store);
    assert_eq!((pointer, filled), (b, b));
    for (view, slot) in queue.iter().enumerate() {
        assert_eq!(&slot[..b], &normalised_global(&z, view)[..]);
    }
    Ok(())
}
