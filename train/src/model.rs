//! The networks of a run, built from its configuration: the student encoder and projector, an
//! EMA teacher where the objective keeps one, the objective's own modules, the online probe,
//! and the optimiser over the trainable ones. Every weight lives in one [`ParamStore`] seeded by
//! `train.seed`, named as a PyTorch state dict would name it (`encoder.…`, `projector.…`,
//! `teacher.…`, `objective.…`, `probe.…`).

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor, Var};
use ssl_core::{BuildContext, Objective, ParamGroup, ParamStore, Patches};
use ssl_models::autocast::Precision;
use ssl_models::{Encoder, Projector};
use ssl_optim::Optimizer;

use crate::config::{EvaluatedEncoder, RunConfig};
use crate::online_probe::OnlineProbe;
use crate::setup::{self, DataSplit};

/// The registered objectives that keep an EMA teacher with their default parameters.
fn objectives_with_a_teacher() -> Vec<&'static str> {
    ssl_core::registry()
        .into_iter()
        .filter(|r| {
            r.requirements(&serde_yaml::Value::Null, 64)
                .is_ok_and(|req| req.teacher.is_some())
        })
        .map(|r| r.name)
        .collect()
}

/// Variables with their names, as a [`ParamStore`] lists them.
pub type NamedVars = Vec<(String, Var)>;

/// A model being trained: student networks, optional teacher, objective, probe.
pub struct Model {
    pub store: ParamStore,
    pub encoder: Box<dyn Encoder>,
    /// The same encoder for evaluation ([`setup::eval_encoder`]): its weights detached, so its
    /// forward records no graph.
    pub eval_encoder: Box<dyn Encoder>,
    pub projector: Option<Projector>,
    pub teacher: Option<(Box<dyn Encoder>, Option<Projector>)>,
    pub probe: Option<OnlineProbe>,
    pub objective: Box<dyn Objective>,
    /// Precision of the training step's matrix products (evaluation is f32).
    pub precision: Precision,
}

/// Builds every module of `cfg` in a fresh store seeded by the run seed.
pub fn build_model(cfg: &RunConfig, data: &DataSplit, device: &Device) -> Result<Model> {
    let registration = ssl_core::find(&cfg.objective.name)?;
    let store = ParamStore::new(cfg.train.seed);
    let vb = store.var_builder(device);
    let dataset = &data.dataset;
    let encoder = setup::encoder(cfg, dataset, vb.pp("encoder"))?;
    let feature_dim = encoder.output_dim();
    let projection_dim = *cfg
        .model
        .projector
        .last()
        .context("model.projector is empty; give its layer widths, e.g. [2048, 2048, 2048]")?;
    // What the objective trains on: the train split, then any unlabeled images (whose labels
    // are placeholders: an objective that needs labels is refused below).
    let pretraining = data.pretraining();
    let train_labels = setup::labels(dataset, &pretraining);
    let ctx = BuildContext {
        vb: vb.pp("objective"),
        num_instances: pretraining.len(),
        num_classes: Some(dataset.num_classes),
        instance_labels: Some(&train_labels),
        projection_dim,
        feature_dim,
        views: cfg.train.views + cfg.train.local_views,
        global_views: cfg.train.views,
        batch_size: cfg.train.batch_size,
        // A token encoder takes 2D images, [C, H, W], and the global views keep that shape.
        patches: encoder.tokens().map(|t| Patches {
            size: t.patch_size(),
            channels: dataset.shape[0],
            image: match dataset.shape[..] {
                [_, height, width] => (height, width),
                _ => (0, 0),
            },
        }),
    };
    let objective = (registration.build)(&cfg.objective.params, &ctx)?;
    let req = objective.requirements();
    let (global, local) = (cfg.train.views, cfg.train.local_views);
    let checked = req.check(
        registration.name,
        global + local,
        cfg.train.batch_size,
        true,
    );
    match local {
        0 => checked?,
        m => checked.with_context(|| {
            format!(
                "{global} global views + {m} local crops (--local-views) count as {} views",
                global + m
            )
        })?,
    }
    if cfg.eval.encoder == EvaluatedEncoder::Teacher && req.teacher.is_none() {
        bail!(
            "eval.encoder: teacher reads the EMA teacher, and objective `{}` keeps none; \
             evaluate the student (eval.encoder: student) or train one that keeps a teacher: {}",
            registration.name,
            objectives_with_a_teacher().join(", ")
        );
    }
    if req.labels && !data.unlabeled.is_empty() {
        bail!(
            "{} learns from labels, and {} of the pretraining images have none (data.split: \
             train+unlabeled, or images given without labels); train on labelled images only",
            registration.name,
            data.unlabeled.len()
        );
    }
    if req.pixels && encoder.tokens().is_none() {
        bail!(
            "objective `{}` encodes the views itself from their patches, and model.encoder `{}` has \
             none; use a ViT (--set model.encoder=vit_t16, with model.patch_size=4 on the 16-px digits)",
            registration.name,
            cfg.model.encoder
        );
    }
    check_projector_batch(cfg, registration.name, req.projector, pretraining.len())?;
    let projector = if req.projector {
        Some(setup::projector(cfg, feature_dim, vb.pp("projector"))?)
    } else {
        None
    };
    let teacher = match req.teacher {
        Some(_) => {
            // Detached parameters: the teacher's forward records no graph (it gets no gradient).
            let tvb = store.frozen_var_builder(device).pp("teacher");
            let enc = setup::encoder(cfg, dataset, tvb.pp("encoder"))?;
            let proj = match req.projector {
                true => Some(setup::projector(cfg, feature_dim, tvb.pp("projector"))?),
                false => None,
            };
            copy_student_to_teacher(&store)?;
            Some((enc, proj))
        }
        None => None,
    };
    let probe = match cfg.train.probe_lr > 0.0 {
        true => Some(OnlineProbe::new(
            feature_dim,
            dataset.num_classes,
            vb.pp("probe"),
        )?),
        false => None,
    };
    Ok(Model {
        eval_encoder: setup::eval_encoder(cfg, dataset, &store, device)?,
        store,
        encoder,
        projector,
        teacher,
        probe,
        objective,
        precision: cfg.train.precision,
    })
}

/// The optimiser of `cfg.train` over `model`'s trainable variables (every student parameter,
/// not the EMA teacher's, not the batch-norm buffers) with its parameter groups, in order: the
/// online probe's (`probe_lr`, no weight decay or LARS), the objective's, the config's.
pub fn optimizer(cfg: &RunConfig, model: &Model) -> Result<Optimizer> {
    Optimizer::new(
        &cfg.train.optimizer_settings(),
        trainable(&model.store),
        &param_groups(cfg, model),
    )
}

/// The parameter groups of a run, in the order they apply ([`optimizer`]).
fn param_groups(cfg: &RunConfig, model: &Model) -> Vec<ParamGroup> {
    let t = &cfg.train;
    let probe = model.probe.as_ref().map(|_| {
        let mut g = ParamGroup::new(["probe."]);
        (g.lr, g.weight_decay, g.lars) = (Some(t.probe_lr), Some(0.0), Some(false));
        g
    });
    probe
        .into_iter()
        .chain(model.objective.requirements().param_groups)
        .chain(t.param_groups.iter().cloned())
        .collect()
}

/// The variables the optimiser updates, sorted by name: every one but the EMA teacher's and the
/// batch-norm buffers (the ones whose gradients data-parallel ranks average).
pub fn trainable(store: &ParamStore) -> Vec<(String, Var)> {
    store
        .vars()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("teacher.") && !ParamStore::is_buffer(n))
        .collect()
}

/// Sets every `teacher.*` variable to its student counterpart (an EMA teacher starts as a copy).
fn copy_student_to_teacher(store: &ParamStore) -> Result<()> {
    let student = store.tensors();
    for (name, var) in store.vars_with_prefix("teacher.") {
        var.set(&student[&name["teacher.".len()..]])?;
    }
    Ok(())
}

/// Sets the encoder (and its EMA teacher) from the weights `model.init` names, if any.
pub fn apply_init(cfg: &RunConfig, model: &Model) -> Result<()> {
    let Some(spec) = &cfg.model.init else {
        return Ok(());
    };
    let loaded = crate::pretrained::load(&model.store, spec, &cfg.model.encoder)?;
    copy_student_to_teacher(&model.store)?;
    let (counters, named): (Vec<_>, Vec<_>) = loaded
        .skipped
        .iter()
        .partition(|k| k.ends_with("num_batches_tracked"));
    let mut skipped: Vec<String> = named.into_iter().cloned().collect();
    if !counters.is_empty() {
        skipped.push(format!("{} num_batches_tracked", counters.len()));
    }
    eprintln!(
        "initialised {} encoder tensors from {}{}",
        loaded.tensors,
        loaded.path.display(),
        match loaded.skipped.len() {
            0 => String::new(),
            n => format!(
                " (skipped {n} it has and the encoder lacks: {})",
                skipped.join(", ")
            ),
        }
    );
    Ok(())
}

/// The smallest batch size `cfg` trains at: its objective's own limit
/// ([`ssl_core::Requirements::min_batch`], read as [`ssl_core::Registration::requirements`]
/// builds it at `cfg`'s batch size), and 2 where the views reach the projector's batch norm.
pub fn smallest_batch(cfg: &RunConfig) -> Result<usize> {
    let objective = &cfg.objective;
    let req =
        ssl_core::find(&objective.name)?.requirements(&objective.params, cfg.train.batch_size)?;
    Ok(match batch_normed_projector(cfg, req.projector) {
        true => req.min_batch.max(2),
        false => req.min_batch,
    })
}

/// Whether the views reach batch norm in the projector (its hidden layers have it).
fn batch_normed_projector(cfg: &RunConfig, uses_projector: bool) -> bool {
    uses_projector && cfg.model.projector.len() >= 2
}

/// The projector's hidden layers use batch norm, which is undefined on one sample (spec
/// `docs/spec/objectives.md` §0): refuse, before training, a run whose views would reach it one
/// instance at a time.
fn check_projector_batch(
    cfg: &RunConfig,
    objective: &str,
    uses_projector: bool,
    instances: usize,
) -> Result<()> {
    if !batch_normed_projector(cfg, uses_projector) {
        return Ok(());
    }
    let b = cfg.train.batch_size;
    if b < 2 {
        bail!(
            "objective `{objective}` trains through the projector, whose batch norm needs at least 2 instances \
             per view, got --batch-size {b}; use --batch-size 2 or more, or a projector without hidden \
             layers (--set model.projector=[{}])",
            cfg.model.projector[cfg.model.projector.len() - 1]
        );
    }
    if !cfg.train.drop_last && instances % b == 1 {
        bail!(
            "the last batch of every epoch would hold 1 instance ({instances} training instances, batch size {b}), \
             and the projector's batch norm needs at least 2; set train.drop_last=true or another batch size"
        );
    }
    Ok(())
}

impl Model {
    /// What an objective's step hooks ([`ssl_core::StepContext`]) see: the student's trainable
    /// encoder and projector parameters, sorted by name, and the teacher's (when there is one)
    /// under the same names.
    pub fn hook_parameters(&self) -> (NamedVars, Option<NamedVars>) {
        let student = self
            .store
            .vars()
            .into_iter()
            .filter(|(n, _)| {
                (n.starts_with("encoder.") || n.starts_with("projector."))
                    && !ParamStore::is_buffer(n)
            })
            .collect();
        let teacher = self.teacher.as_ref().map(|_| {
            self.store
                .vars_with_prefix("teacher.")
                .into_iter()
                .filter(|(n, _)| !ParamStore::is_buffer(n))
                .map(|(n, v)| (n["teacher.".len()..].to_string(), v))
                .collect()
        });
        (student, teacher)
    }

    /// Backbone features in eval mode, `[n, F]`, computed in chunks by the eval encoder.
    pub fn features(&self, x: &Tensor) -> Result<Tensor> {
        setup::forward_in_chunks(self.eval_encoder.as_ref(), x, false)
    }

    /// Backbone features in eval mode of clean samples, `[n, F]`, read and encoded in chunks
    /// by the eval encoder.
    pub fn embed(&self, x: &setup::CleanSamples) -> Result<Tensor> {
        x.encode(self.eval_encoder.as_ref(), false)
    }

    /// Online-probe predictions for eval-mode `features`, standardised with the statistics of
    /// `train_features`, the clean train images' ([`crate::online_probe`]).
    pub fn probe_predictions(
        &self,
        features: &Tensor,
        train_features: &Tensor,
    ) -> Result<Option<Vec<u32>>> {
        self.probe
            .as_ref()
            .map(|p| p.predict(features, train_features))
            .transpose()
    }
}
