use std::path::Path;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use ssl_core::{Batch, Collective, Ids, ParamStore, Progress, SingleProcess};

use crate::checkpoint;
use crate::config::RunConfig;
use crate::evaluate;
use crate::model::{self, Model};
use crate::rundir::Start;
use crate::setup::{self, DataSplit};
use ssl_optim::Optimizer;

use super::epoch::*;
use super::resume::*;
use super::step::*;
use super::*;

/// Trains `cfg` through the front door, in this process alone.
fn run(cfg: &RunConfig, start: Start) -> anyhow::Result<RunOutcome> {
    crate::Trainer::new(cfg.clone()).start(start).fit()
}

/// A model and optimiser of the GMM study (MLP encoder, IConE): no batch norm, and a loss
/// whose batch terms are means over instances, so accumulating two half batches must give
/// the full batch's update.
fn gmm_model(cfg: &RunConfig, data: &DataSplit) -> (Model, Optimizer) {
    let model = model::build_model(cfg, data, &Device::Cpu).unwrap();
    let optimizer = model::optimizer(cfg, &model).unwrap();
    (model, optimizer)
}

/// The GMM study's config (MLP encoder, IConE, no probe) with `sets` applied.
fn gmm_config(sets: &[&str]) -> RunConfig {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for s in [
        "data.name=gmm",
        "model.encoder=mlp",
        "objective.name=icone",
        "train.probe_lr=0",
    ]
    .iter()
    .chain(sets)
    {
        crate::config::apply_set(&mut root, s).unwrap();
    }
    RunConfig::from_yaml_value(root).unwrap()
}

/// The first `b` training instances of `data` (clean), their ids `0..b` and labels, and the
/// progress of a one-step run.
fn first_instances(data: &DataSplit, b: usize) -> (Tensor, Vec<u32>, Vec<u32>, Progress) {
    let positions: Vec<usize> = data.train[..b].to_vec();
    let clean = setup::samples(data, &positions, &Device::Cpu).unwrap();
    let progress = Progress {
        step: 0,
        epoch: 0,
        steps_per_epoch: 1,
        total_steps: 1,
        seed: 0,
    };
    let labels = setup::labels(&data.dataset, &positions);
    (clean, (0..b as u32).collect(), labels, progress)
}

/// A variable's shares arriving out of order are summed in pass order and added to the loss
/// graph's gradient once every pass that reaches it is in; a variable only the loss graph
/// holds, or none at all, is complete from the start, one reached without a gradient
/// completes with none, and after a failed pass nothing more is added.
#[test]
fn view_sums_add_in_pass_order_and_stop_at_the_first_error() {
    let cpu = &Device::Cpu;
    let store = ParamStore::new(0);
    let vb = store.var_builder(cpu);
    let [w, x, y, z] =
        [("w", 1), ("x", 2), ("y", 1), ("z", 1)].map(|(name, n)| vb.get(n, name).unwrap());
    let [w, x, y, z] = [w, x, y, z].map(|t| Var::from_tensor(&t).unwrap());
    let g = |v: &[f32]| Tensor::new(v, cpu).unwrap();
    let values = |t: &Tensor| t.to_vec1::<f32>().unwrap();
    // Passes 0 and 2 reach x, pass 1 reaches y; the loss graph holds x and z; no graph w.
    let roots = [
        x.as_tensor().sum_all().unwrap(),
        y.as_tensor().sum_all().unwrap(),
        (x.as_tensor() * 2.0).unwrap().sum_all().unwrap(),
    ];
    let mut loss = GradStore::default();
    loss.insert(x.as_tensor(), g(&[10.0, 10.0]));
    loss.insert(z.as_tensor(), g(&[3.0]));
    let mut sums = ViewSums::new(&roots, loss);
    assert_eq!(
        sums.unreached(&store),
        [w.as_tensor().id(), z.as_tensor().id()]
    );
    let early = sums.add(2, x.as_tensor().id(), Some(&g(&[4.0, 1.0])));
    assert!(early.unwrap().is_none(), "pass 2 waits for pass 0");
    let x_total = sums.add(0, x.as_tensor().id(), Some(&g(&[1.0, 1.0])));
    assert_eq!(values(&x_total.unwrap().unwrap().unwrap()), [15.0, 12.0]);
    let y_total = sums.add(1, y.as_tensor().id(), None).unwrap();
    assert!(
        matches!(y_total, Some(None)),
        "y is complete, without a gradient"
    );
    let total = sums.into_total().unwrap();
    assert_eq!(values(total.get(x.as_tensor()).unwrap()), [15.0, 12.0]);
    assert_eq!(values(total.get(z.as_tensor()).unwrap()), [3.0]);
    assert!(total.get(y.as_tensor()).is_none());

    let mut sums = ViewSums::new(&roots, GradStore::default());
    sums.error = Some(candle_core::Error::Msg("pass 1 failed".into()));
    let e = sums.add(0, x.as_tensor().id(), Some(&g(&[1.0, 1.0])));
    assert!(e.unwrap_err().to_string().contains("pass 1 failed"));
    let e = sums.into_total().unwrap_err().to_string();
    assert!(e.contains("pass 1 failed"), "{e}");
}

/// A failed step names where training stopped (1-based epoch) and the checkpoint that is
/// left to resume from, if any.
#[test]
fn a_failed_step_says_where_it_stopped_and_what_is_kept() {
    let out = Path::new("runs/a");
    let kept = stopped_at(out, Some(40), 57, 2);
    assert!(
        kept.starts_with("training stopped at step 57 (epoch 3); "),
        "{kept}"
    );
    let dir = out.join("checkpoint");
    let named = format!("the checkpoint of step 40 in {} is kept", dir.display());
    assert!(
        kept.contains(&named) && kept.ends_with("(continue with --resume)"),
        "{kept}"
    );
    let none = stopped_at(out, None, 3, 0);
    assert_eq!(
        none,
        "training stopped at step 3 (epoch 1); no checkpoint had been written yet"
    );
}

#[test]
fn bf16_training_follows_f32_within_bf16_precision() {
    let losses = |precision: &str| -> Vec<f64> {
        let cfg = gmm_config(&[&format!("train.precision={precision}")]);
        let data = setup::data(&cfg).unwrap();
        let (mut model, mut optimizer) = gmm_model(&cfg, &data);
        let b = 16;
        let positions: Vec<usize> = data.train[..b].to_vec();
        let clean = setup::samples(&data, &positions, &Device::Cpu).unwrap();
        let images = Tensor::cat(&[(&clean + 0.1).unwrap(), (&clean - 0.1).unwrap()], 0).unwrap();
        let ids: Vec<u32> = (0..b as u32).collect();
        let labels = setup::labels(&data.dataset, &positions);
        (0..5)
            .map(|step| {
                let input = StepInput {
                    images: images.clone(),
                    views: 2,
                    local_images: None,
                    instance_ids: &ids,
                    labels: &labels,
                    progress: Progress {
                        step,
                        epoch: 0,
                        steps_per_epoch: 5,
                        total_steps: 5,
                        seed: 0,
                    },
                    lr: 1e-2,
                };
                training_step(&mut model, &mut optimizer, &input)
                    .unwrap()
                    .loss
            })
            .collect()
    };
    let (full, bf16) = (losses("f32"), losses("bf16"));
    assert!(full[4] < full[0], "training lowers the loss: {full:?}");
    let mut largest = 0.0f64;
    for (a, b) in full.iter().zip(&bf16) {
        let relative = (a - b).abs() / a.abs();
        assert!(relative < 1e-2, "f32 {full:?} vs bf16 {bf16:?}");
        largest = largest.max(relative);
    }
    assert!(
        largest > 0.0,
        "bf16 operands must change the numbers: {bf16:?}"
    );
}

/// A collective of two ranks that both hold this rank's rows, counting its gathers.
struct Counted(std::sync::atomic::AtomicUsize);

impl Collective for Counted {
    fn world_size(&self) -> usize {
        2
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Tensor::cat(&[t, t], dim)
    }
}

/// The batch-norm collective handed to a step is used by the step's train-mode batch norms
/// (the digits CNN's and the projector's) and by nothing after it: the random-init
/// baseline's train-mode calibration, which rank 0 runs alone, gathers nothing.
#[test]
fn the_batch_norm_collective_ends_with_the_step() {
    let cfg = RunConfig::default();
    let mut data = setup::data(&cfg).unwrap();
    data.train.truncate(64);
    let b = 8;
    let (clean, ids, labels, progress) = first_instances(&data, b);
    let input = StepInput {
        images: Tensor::cat(&[&clean, &(&clean * 0.9).unwrap()], 0).unwrap(),
        views: 2,
        local_images: None,
        instance_ids: &ids,
        labels: &labels,
        progress,
        lr: 0.1,
    };
    let mut model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
    let counted = Arc::new(Counted(Default::default()));
    let gathers = || counted.0.load(std::sync::atomic::Ordering::Relaxed);
    let batch_norm: Arc<dyn Collective> = counted.clone();
    let ranks = StepCollectives {
        gather: &SingleProcess,
        batch_norm: Some(&batch_norm),
    };
    forward_backward_on(&mut model, &input, ranks, &|_, _| Ok(())).unwrap();
    let in_step = gathers();
    assert!(in_step > 0, "the step's batch norms gather");
    assert!(!ssl_models::sync_bn::synchronised());
    let (train, _) = evaluate::clean_inputs(&data, &Device::Cpu);
    setup::calibrated_random_encoder(&cfg, &data.dataset, &train.x, &Device::Cpu).unwrap();
    model.embed(&train.x).unwrap();
    assert_eq!(gathers(), in_step, "work after the step gathers nothing");
}

/// The eval encoder records no graph (so each activation is freed once read) and computes
/// what the training encoder computes in eval mode, with the weights and batch-norm
/// statistics as training leaves them: the digits CNN (batch norm) and a ViT.
#[test]
fn the_eval_encoder_records_no_graph_and_follows_the_training_encoder() {
    for encoder in [&[][..], &["model.encoder=vit_t16", "model.patch_size=4"]] {
        let mut root = serde_yaml::Value::Mapping(Default::default());
        for s in encoder {
            crate::config::apply_set(&mut root, s).unwrap();
        }
        let cfg = RunConfig::from_yaml_value(root).unwrap();
        let data = setup::data(&cfg).unwrap();
        let (x, ..) = first_instances(&data, 8);
        let model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
        // As an optimiser step and a train-mode pass leave them: every weight moved in place,
        // the running statistics updated.
        for (_, var) in model.store.vars_with_prefix("encoder.") {
            var.set(&((var.as_tensor() * 1.1).unwrap() + 0.01).unwrap())
                .unwrap();
        }
        model.encoder.forward_t(&(&x * 0.5).unwrap(), true).unwrap();
        let trained = model.encoder.forward_t(&x, false).unwrap();
        let eval = model.eval_encoder.forward_t(&x, false).unwrap();
        assert!(trained.track_op() && !eval.track_op(), "{encoder:?}");
        let diff = (trained - &eval).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(diff.to_scalar::<f32>().unwrap(), 0.0, "{encoder:?}");
        assert_eq!(
            model.features(&x).unwrap().to_vec2::<f32>().unwrap(),
            eval.to_vec2::<f32>().unwrap()
        );
    }
}

/// With `eval.encoder: teacher` the eval encoder (the monitor's and the table's features)
/// is the EMA teacher's, weights and batch-norm statistics, not the student's.
#[test]
fn the_eval_encoder_reads_the_teacher_when_told() {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    for s in [
        "objective.name=byol",
        "eval.encoder=teacher",
        "train.probe_lr=0",
    ] {
        crate::config::apply_set(&mut root, s).unwrap();
    }
    let cfg = RunConfig::from_yaml_value(root).unwrap();
    let data = setup::data(&cfg).unwrap();
    let (x, ..) = first_instances(&data, 8);
    let model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
    let (teacher, _) = model.teacher.as_ref().unwrap();
    for (_, var) in model.store.vars_with_prefix("teacher.encoder.") {
        var.set(&((var.as_tensor() * 0.9).unwrap() - 0.01).unwrap())
            .unwrap();
    }
    teacher.forward_t(&(&x * 0.5).unwrap(), true).unwrap();
    let expected = teacher
        .forward_t(&x, false)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(
        model.features(&x).unwrap().to_vec2::<f32>().unwrap(),
        expected
    );
    let student = model.encoder.forward_t(&x, false).unwrap();
    assert_ne!(student.to_vec2::<f32>().unwrap(), expected);
}

/// `forward_backward` takes each view's graph back on its own from the loss's gradients at
/// the views' outputs; the gradients must be those of one backward through the whole graph
/// (three views, so that the views outnumber two threads, and an online probe).
#[test]
fn backward_view_by_view_equals_one_backward_through_the_whole_graph() {
    let cfg = gmm_config(&["train.probe_lr=0.1"]);
    let data = setup::data(&cfg).unwrap();
    let (b, v) = (8, 3);
    let (clean, ids, labels, progress) = first_instances(&data, b);
    let views: Vec<Tensor> = (0..v)
        .map(|i| (&clean * (1.0 - 0.1 * i as f64)).unwrap())
        .collect();
    let input = StepInput {
        images: Tensor::cat(&views, 0).unwrap(),
        views: v,
        local_images: None,
        instance_ids: &ids,
        labels: &labels,
        progress,
        lr: 0.1,
    };
    let (mut model, _) = gmm_model(&cfg, &data);
    assert!(model.probe.is_some());
    let (_, grads) = forward_backward(&mut model, &input).unwrap();

    let (f, p) = forward_views(
        model.encoder.as_ref(),
        model.projector.as_ref(),
        &views,
        true,
    )
    .unwrap();
    let features = Tensor::cat(&f, 0).unwrap();
    let projections = Tensor::cat(&p, 0).unwrap();
    let batch = Batch {
        projections: &projections.reshape((v, b, ())).unwrap(),
        features: &features.reshape((v, b, ())).unwrap(),
        global_views: v,
        indices: &Ids::new(&ids, &Device::Cpu).unwrap(),
        labels: Some(&Ids::new(&labels, &Device::Cpu).unwrap()),
        teacher: None,
        progress,
        train: true,
        collective: &SingleProcess,
    };
    let loss = model.objective.loss(&batch).unwrap().loss;
    let probe = model.probe.as_ref().unwrap();
    let ce = probe.loss(&features, &labels, v, &SingleProcess).unwrap();
    let whole = (loss + ce).unwrap().backward().unwrap();

    let mut compared = 0;
    for (name, var) in model.store.vars() {
        let (ours, reference) = (grads.get(var.as_tensor()), whole.get(var.as_tensor()));
        assert_eq!(ours.is_some(), reference.is_some(), "{name}");
        let (Some(ours), Some(reference)) = (ours, reference) else {
            continue;
        };
        let max = |t: &Tensor| -> f32 {
            t.abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar()
                .unwrap()
        };
        let scale = max(reference);
        assert!(scale > 0.0, "{name} has a zero gradient");
        let diff = max(&(ours - reference).unwrap());
        assert!(
            diff <= 1e-5 * scale,
            "{name}: {diff} against a largest {scale}"
        );
        compared += 1;
    }
    assert!(compared >= 4, "only {compared} gradients compared");
}

#[test]
fn accumulating_two_half_batches_equals_one_full_batch_step() {
    // Plain SGD: the update is proportional to the gradient (Adam's first step is about its
    // sign), so a wrongly summed or scaled gradient shows.
    let cfg = gmm_config(&[
        "train.optimizer=sgd",
        "train.momentum=0",
        "train.weight_decay=0",
    ]);
    let data = setup::data(&cfg).unwrap();
    let (b, v) = (8, 2);
    let (clean, ids, labels, progress) = first_instances(&data, b);
    let views: Vec<Tensor> = (0..v)
        .map(|i| (&clean + (i as f64 + 1.0) * 0.1).unwrap())
        .collect();
    let input = |range: std::ops::Range<usize>| StepInput {
        images: Tensor::cat(
            &views
                .iter()
                .map(|x| x.narrow(0, range.start, range.len()).unwrap())
                .collect::<Vec<_>>(),
            0,
        )
        .unwrap(),
        views: v,
        local_images: None,
        instance_ids: &ids[range.clone()],
        labels: &labels[range.clone()],
        progress,
        lr: 0.1,
    };
    let (mut full, mut full_opt) = gmm_model(&cfg, &data);
    training_step(&mut full, &mut full_opt, &input(0..b)).unwrap();

    let (mut halves, mut halves_opt) = gmm_model(&cfg, &data);
    let (_, first) = forward_backward(&mut halves, &input(0..b / 2)).unwrap();
    let (_, second) = forward_backward(&mut halves, &input(b / 2..b)).unwrap();
    let mut sum = add_grads(&halves.store, first, &second).unwrap();
    scale_grads(&halves.store, &mut sum, 0.5).unwrap();
    halves_opt.step(&sum, 0.1, &progress).unwrap();

    let before = gmm_model(&cfg, &data).0.store.tensors();
    let (after_full, after_halves) = (full.store.tensors(), halves.store.tensors());
    let mut moved = 0.0f64;
    for (name, t) in &after_full {
        let diff = |a: &Tensor, b: &Tensor| -> f64 {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as f64
        };
        assert!(diff(t, &after_halves[name]) < 1e-7, "{name}");
        moved = moved.max(diff(t, &before[name]));
    }
    assert!(
        moved > 1e-4,
        "the step must move the weights, moved {moved}"
    );
}

/// Reading the logged values once per interval logs every step with the values a read
/// after each step gives, and a diverging run names the same first non-finite step.
#[test]
fn values_read_per_interval_are_those_of_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let config = |every: usize, sets: &[&str]| {
        let every = format!("train.log_every={every}");
        let sets = [&["train.epochs=2", "train.batch_size=64", &every][..], sets].concat();
        let mut cfg = gmm_config(&sets);
        cfg.out = dir.path().join(format!("every-{every}-{}", sets.len()));
        cfg
    };
    let logged = |every: usize| {
        let cfg = config(every, &[]);
        run(&cfg, Start::Fresh).unwrap();
        let text = std::fs::read_to_string(cfg.out.join(crate::runlog::METRICS)).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r.get("loss").is_some())
            .map(|mut r| {
                let record = r.as_object_mut().unwrap();
                record.remove("images_per_s");
                record.remove("data_wait_ms");
                r
            })
            .collect::<Vec<_>>()
    };
    let each = logged(1);
    let data = setup::data(&config(1, &[])).unwrap();
    // Whole batches (train.drop_last); an interval that does not divide the epoch, whose
    // end reads the remainder.
    let per_epoch = data.train.len() / 64;
    assert_ne!(per_epoch % 4, 0);
    assert_eq!(each.len(), 2 * per_epoch);
    assert_eq!(logged(4), each);
    let diverged = |every: usize| {
        let cfg = config(every, &["train.optimizer=sgd", "train.lr=1e30"]);
        match run(&cfg, Start::Fresh) {
            Ok(_) => panic!("a run at lr 1e30 must diverge"),
            Err(e) => format!("{e:#}"),
        }
    };
    let first = diverged(1);
    assert!(first.contains("non-finite"), "{first}");
    assert!(first.contains("lower train.lr"), "{first}");
    let named = |e: &str| e[e.find("non-finite").unwrap()..].to_string();
    assert_eq!(named(&diverged(5)), named(&first));
}

/// A non-finite loss suggests the learning rate only once an update has been applied.
#[test]
fn a_non_finite_loss_blames_the_learning_rate_only_after_an_update() {
    let values = StepValues {
        loss: f64::NAN,
        terms: vec![("invariance".into(), f64::NAN), ("variance".into(), 1.0)],
        probe_ce: None,
    };
    let at = |step| values.check_finite(step, 1e-3).unwrap_err().to_string();
    let (first, later) = (at(0), at(3));
    for e in [&first, &later] {
        assert!(
            e.contains("loss term `invariance` became non-finite (NaN)"),
            "{e}"
        );
    }
    assert!(
        first.contains("not the cause") && !first.contains("lower train.lr"),
        "{first}"
    );
    assert!(
        later.contains("at step 3") && later.contains("lower train.lr"),
        "{later}"
    );
    let finite = StepValues {
        loss: 0.5,
        terms: vec![("variance".into(), 0.5)],
        probe_ce: None,
    };
    assert!(finite.check_finite(0, 1e-3).is_ok());
}

/// The final evaluation reuses the last epoch's monitor features: its rows equal those
/// computed afresh from the checkpointed weights.
#[test]
fn the_final_evaluation_equals_one_from_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = gmm_config(&[
        "train.epochs=3",
        "train.batch_size=64",
        "eval.monitor_every=1",
    ]);
    cfg.out = dir.path().join("run");
    let outcome = run(&cfg, Start::Fresh).unwrap();
    let data = setup::data(&cfg).unwrap();
    let mut model = model::build_model(&cfg, &data, &Device::Cpu).unwrap();
    let mut optimizer = model::optimizer(&cfg, &model).unwrap();
    restore(&cfg.out, &mut model, &mut optimizer).unwrap();
    let fresh = evaluate::with_baselines(&cfg, &data, &model, &Device::Cpu, None).unwrap();
    assert_eq!(outcome.evaluation.len(), 3);
    assert_eq!(format!("{:?}", outcome.evaluation), format!("{fresh:?}"));
}

/// A run stopped inside a parameter group's freeze and resumed ends with the weights of an
/// uninterrupted run; the frozen group did not move during its freeze and did after it.
#[test]
fn a_run_resumed_inside_a_freeze_equals_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = |out: &std::path::Path, stop: usize| {
        let mut cfg = gmm_config(&[
            "train.epochs=3",
            "train.warmup_epochs=1",
            "train.batch_size=64",
            "train.checkpoint_every=1",
            &format!("train.stop_after_epochs={stop}"),
            "train.param_groups=[{params: encoder., freeze_epochs: 2}, \
             {params: objective., schedule: constant, clip_grad_norm: 1.0}]",
        ]);
        cfg.out = out.to_path_buf();
        cfg
    };
    let weights = |out: &std::path::Path| {
        checkpoint::load_tensors(&out.join("checkpoint/model.safetensors")).unwrap()
    };
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    run(&config(&whole, 0), Start::Fresh).unwrap();
    run(&config(&split, 1), Start::Fresh).unwrap();
    let stopped = weights(&split);
    let cfg = config(&split, 0);
    let data = setup::data(&cfg).unwrap();
    let initial = model::build_model(&cfg, &data, &Device::Cpu)
        .unwrap()
        .store
        .tensors();
    let encoder: Vec<&String> = initial
        .keys()
        .filter(|k| k.starts_with("encoder."))
        .collect();
    assert!(!encoder.is_empty());
    for name in &encoder {
        let same = (&stopped[*name] - &initial[*name]).unwrap().abs().unwrap();
        let max = same
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(max, 0.0, "{name} moved during its freeze");
    }
    run(&cfg, Start::Resume).unwrap();
    let (a, b) = (weights(&whole), weights(&split));
    assert_eq!(a.len(), b.len());
    let mut moved = false;
    for (name, t) in &a {
        let diff = (t - &b[name])
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap();
        let diff = diff.max(0).unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(diff, 0.0, "{name} differs from the uninterrupted run");
        if name.starts_with("encoder.") {
            let d = (t - &initial[name])
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap();
            moved |= d.max(0).unwrap().to_scalar::<f32>().unwrap() > 0.0;
        }
    }
    assert!(moved, "the encoder must train after its freeze");
}

/// CARP's teacher follows the reference's order: each step's EMA update uses the student
/// weights that produced that step's loss, before the optimiser moves them. After one step
/// the teacher is still its initial copy of the student (`m·θ_t⁰ + (1 − m)·θ_s⁰ = θ_s⁰`);
/// after the second it is `m₁·θ_t¹ + (1 − m₁)·θ_s¹`, `θ_s¹` the student after the first
/// step (the order after the optimiser step would give `θ_s²` there).
#[test]
fn carp_updates_its_teacher_before_the_optimiser_step() {
    let dir = tempfile::tempdir().unwrap();
    let config = |stop: usize| {
        let mut cfg = gmm_config(&[
            "objective.name=carp",
            "objective.params={num_prototypes: 64, block_size: 16, bottleneck: 8, head_hidden: 16}",
            "data.train_size=64",
            "train.batch_size=64",
            "train.epochs=2",
            "train.warmup_epochs=0",
            "train.lr=0.05",
            "train.checkpoint_every=1",
            &format!("train.stop_after_epochs={stop}"),
        ]);
        cfg.out = dir.path().to_path_buf();
        cfg
    };
    let weights =
        || checkpoint::load_tensors(&dir.path().join("checkpoint/model.safetensors")).unwrap();
    let first = config(1);
    let data = setup::data(&first).unwrap();
    let initial = model::build_model(&first, &data, &Device::Cpu)
        .unwrap()
        .store
        .tensors();
    // (teacher name, student name) of every EMA-updated parameter.
    let pairs: Vec<(String, String)> = initial
        .keys()
        .filter(|k| !ssl_core::ParamStore::is_buffer(k))
        .filter_map(|k| {
            let student = match k.strip_prefix("teacher.") {
                Some(rest) => rest.to_string(),
                None => k.replacen("objective.teacher_head.", "objective.head.", 1),
            };
            (student != *k).then(|| (k.clone(), student))
        })
        .collect();
    assert!(pairs.iter().any(|(t, _)| t.starts_with("teacher.encoder.")));
    assert!(pairs
        .iter()
        .any(|(t, _)| t.starts_with("objective.teacher_head.")));
    let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
        let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
        d.max(0).unwrap().to_scalar::<f32>().unwrap()
    };

    run(&first, Start::Fresh).unwrap();
    let after_one = weights();
    let mut student_moved = 0f32;
    for (t, s) in &pairs {
        // Equal up to the rounding of m·x + (1 − m)·x in f32.
        assert!(
            max_diff(&after_one[t], &initial[t]) < 1e-6,
            "{t} moved at step 0"
        );
        student_moved = student_moved.max(max_diff(&after_one[s], &initial[s]));
    }
    assert!(student_moved > 0.0, "the student must train");

    run(&config(0), Start::Resume).unwrap();
    let after_two = weights();
    let progress = Progress {
        step: 1,
        epoch: 1,
        steps_per_epoch: 1,
        total_steps: 2,
        seed: 0,
    };
    let m = progress.cosine_ramp(0.99, 1.0);
    let ema = |t: &Tensor, s: &Tensor| ((t * m).unwrap() + (s * (1.0 - m)).unwrap()).unwrap();
    let mut apart = 0f32;
    for (t, s) in &pairs {
        let want = ema(&after_one[t], &after_one[s]);
        let late = ema(&after_one[t], &after_two[s]);
        assert!(
            max_diff(&after_two[t], &want) < 1e-6,
            "{t}: not m·θ_t¹ + (1 − m)·θ_s¹"
        );
        apart = apart.max(max_diff(&want, &late));
    }
    assert!(
        apart > 1e-5,
        "the two orders must differ for the check to mean anything"
    );
}

/// A data-parallel run's record reads back as written; a resume on another world size is
/// refused naming both and the command, and a run without a record counts as one process.
#[test]
fn the_distributed_record_reads_back_and_guards_the_world_size() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    assert_eq!(DistributedRecord::read(dir.path())?, None);
    check_world_size(dir.path(), 1, 128)?;
    let record = DistributedRecord {
        world_size: 2,
        batch_size_per_rank: 64,
        global_batch: 128,
        sync_bn: false,
    };
    record.write(dir.path())?;
    assert_eq!(DistributedRecord::read(dir.path())?, Some(record));
    check_world_size(dir.path(), 2, 64)?;
    let e = check_world_size(dir.path(), 1, 64).unwrap_err().to_string();
    assert!(
        e.contains("trained on 2 rank(s)") && e.contains("mpirun -np 2 ssl run --resume"),
        "{e}"
    );
    std::fs::write(dir.path().join(DISTRIBUTED_JSON), "{\"world\": 2}")?;
    let e = format!("{:#}", DistributedRecord::read(dir.path()).unwrap_err());
    assert!(e.contains("distributed.json is damaged"), "{e}");
    Ok(())
}
