//! One training step, the seam the trainer, the benches and the parity tests share: a batch of
//! views in; the loss, its logged values and every variable's gradient out ([`forward_backward`],
//! [`training_step`]). The views' forward and backward passes and their gradient sums live here.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::utils::barrier_pool;
use candle_core::{Tensor, TensorId, Var};
use ssl_core::{
    Batch, Collective, Ids, LossOutput, ParamStore, PixelBatch, PixelLoss, Progress, SingleProcess,
};
use ssl_dist::Complete;
use ssl_models::autocast::autocast;
use ssl_models::{Encoder, Projector};

use crate::model::Model;
use crate::phases::{self, timed, Phase};
use crate::staging::StagedBatch;
use ssl_optim::Optimizer;

/// One staged batch as the step's inputs, its ids and labels borrowed from it.
pub(super) fn step_input(
    staged: &StagedBatch,
    progress: Progress,
    lr: f64,
) -> Result<StepInput<'_>> {
    let (images, local_images) = staged.tensors()?;
    let batch = &staged.batch;
    Ok(StepInput {
        images,
        views: batch.views_count,
        local_images,
        instance_ids: &batch.instance_ids,
        labels: &batch.labels,
        progress,
        lr,
    })
}

/// The inputs of one optimisation step.
pub struct StepInput<'a> {
    /// `[V·B, ...]` images, view-major (row `v·B + i` is view `v` of instance `i`).
    pub images: Tensor,
    pub views: usize,
    /// Multi-crop local views `[M·B, ...]` at their own (smaller) size, view-major; `None`
    /// without local crops.
    pub local_images: Option<Tensor>,
    /// Stable instance ids `[B]` and class labels `[B]`.
    pub instance_ids: &'a [u32],
    pub labels: &'a [u32],
    pub progress: Progress,
    pub lr: f64,
}

/// What one step computed.
pub struct StepOutput {
    pub logged: Logged,
    /// The projections of the global views the loss saw, `[V, B, D]` (detached).
    pub projections: Tensor,
}

/// A step's logged values, on the step's device until they are read ([`Self::read`]; the
/// trainer reads `train.log_every` steps' at once).
pub struct Logged {
    /// `[K]` f64: the objective's loss, its terms in the order of [`Self::terms`], then the
    /// online probe's cross-entropy if there is a probe (detached).
    pub values: Tensor,
    /// The names of the objective's loss terms.
    pub terms: Vec<String>,
    pub probe: bool,
}

/// One step's logged values on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct StepValues {
    pub loss: f64,
    pub terms: Vec<(String, f64)>,
    /// The online probe's cross-entropy, if there is a probe.
    pub probe_ce: Option<f64>,
}

impl Logged {
    /// The values on the host (one device-to-host copy).
    pub fn read(&self) -> Result<StepValues> {
        Ok(self.values_of(&self.values.to_vec1::<f64>()?))
    }

    /// The values of `row`, laid out as [`Self::values`].
    pub(super) fn values_of(&self, row: &[f64]) -> StepValues {
        let n = self.terms.len();
        StepValues {
            loss: row[0],
            terms: self
                .terms
                .iter()
                .cloned()
                .zip(row[1..=n].to_vec())
                .collect(),
            probe_ce: self.probe.then(|| row[n + 1]),
        }
    }
}

impl StepValues {
    /// Refuses a non-finite loss or term, naming it, its step and the learning rate. The views
    /// were checked finite on the loader's thread, so the objective made it: at step 0 no
    /// update has been applied yet and the learning rate cannot be the cause; later, lowering
    /// it can help.
    pub fn check_finite(&self, step: usize, lr: f64) -> Result<()> {
        let what = match self.terms.iter().find(|(_, v)| !v.is_finite()) {
            Some((name, value)) => format!("loss term `{name}` became non-finite ({value})"),
            None if !self.loss.is_finite() => {
                format!("the loss became non-finite ({})", self.loss)
            }
            None => return Ok(()),
        };
        let fix = match step {
            0 => "on finite views at the initial weights, before any update, so the learning \
                  rate is not the cause: check the objective's settings (`ssl describe \
                  OBJECTIVE`) and whether the views differ at all (constant images)"
                .to_string(),
            _ => "on finite views; lower train.lr (or lengthen train.warmup_epochs) and train \
                  again, or resume from the last checkpoint with --allow-changed train.lr"
                .to_string(),
        };
        bail!("{what} at step {step} (lr {lr:e}) {fix}")
    }
}

/// Encoder and projector outputs of each view, `[B, F]` and `[B, D]`, with every view forwarded
/// as its own batch — as the official VICReg, BYOL and solo-learn code do: batch-norm statistics
/// are per view, and the cost is linear in V (one pass over 4·B images costs more than four over
/// B).
pub(super) fn forward_views(
    encoder: &dyn Encoder,
    projector: Option<&Projector>,
    views: &[Tensor],
    train: bool,
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let mut features = Vec::with_capacity(views.len());
    let mut projections = Vec::with_capacity(views.len());
    for view in views {
        let f = encoder.forward_t(view, train)?;
        projections.push(match projector {
            Some(p) => p.forward_t(&f, train)?,
            None => f.clone(),
        });
        features.push(f);
    }
    Ok((features, projections))
}

/// The loss graph's gradients `grads` plus those of every variable behind `roots` (each a
/// scalar, one view's share of the loss), each variable of `store` handed to `complete` with its
/// total as soon as it is complete: one no root reaches at once (with the loss graph's
/// gradient, or none when it is not in this step's graph at all — a frozen head, say — as DDP
/// marks unused parameters ready, so that its bucket does not hold back the buckets after it),
/// another when every pass that reaches it has given its share. The roots' backward passes
/// share no node but the variables; on the CPU they run side by side, one to a Candle worker at
/// a time, every op of a pass on the thread that took it. A pass on its own thread needs no
/// barrier between its ops and multiplies whole matrices (2 threads, ViT-S's linear layers:
/// 0.91–0.95 of the time of the same products each split over both threads). A variable's
/// shares are added in root order whatever the thread count, each as soon as the ones before it
/// are in. Other devices take the roots in turn, and so does synchronised batch norm, whose
/// gathers' backward passes must reach the ranks' collectives in the same order everywhere.
pub(super) fn backward_views(
    roots: Vec<Tensor>,
    grads: GradStore,
    store: &ParamStore,
    complete: &Complete,
) -> Result<GradStore> {
    let count = roots.len();
    let side_by_side =
        roots.iter().all(|r| r.device().is_cpu()) && !ssl_models::sync_bn::synchronised();
    let sums = ViewSums::new(&roots, grads);
    for id in sums.unreached(store) {
        complete(id, sums.total.get_id(id))?;
    }
    let roots: Vec<Mutex<Option<Tensor>>> =
        roots.into_iter().map(|r| Mutex::new(Some(r))).collect();
    let sums = Mutex::new(sums);
    let take_back = |i: usize| {
        let Some(root) = roots[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        let lock = || sums.lock().unwrap_or_else(PoisonError::into_inner);
        let pass = root.backward_with(|var, grad| {
            let Some(total) = lock().add(i, var.id(), grad)? else {
                return Ok(());
            };
            complete(var.id(), total.as_ref())
                .map_err(|e| candle_core::Error::msg(format!("{e:#}")))
        });
        // The root, and with it the view's graph, goes before the next pass.
        drop(root);
        if let Err(e) = pass {
            lock().error.get_or_insert(e);
        }
    };
    match side_by_side {
        true => barrier_pool().execute_chunked(count, |range| range.for_each(take_back)),
        false => (0..count).for_each(take_back),
    }
    sums.into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .into_total()
}

/// Each variable's gradient summed over the backward passes that reach it, in pass order,
/// whatever order the passes give their shares in.
pub(super) struct ViewSums {
    /// The loss graph's gradients, then each variable's total as it completes.
    total: GradStore,
    reached: HashMap<TensorId, ViewSum>,
    /// The first error of a pass or a sum; nothing is added after it.
    pub(super) error: Option<candle_core::Error>,
}

/// One variable's shares.
pub(super) struct ViewSum {
    /// The passes that reach it, in order, and how many of them are in the sum.
    passes: Vec<usize>,
    added: usize,
    sum: Option<Tensor>,
    /// Shares that came before an earlier pass's.
    waiting: BTreeMap<usize, Option<Tensor>>,
}

impl ViewSums {
    pub(super) fn new(roots: &[Tensor], grads: GradStore) -> Self {
        let mut reached: HashMap<TensorId, ViewSum> = HashMap::new();
        for (i, root) in roots.iter().enumerate() {
            for var in root.sorted_nodes().into_iter().filter(|n| n.is_variable()) {
                let entry = reached.entry(var.id()).or_insert_with(|| ViewSum {
                    passes: Vec::new(),
                    added: 0,
                    sum: None,
                    waiting: BTreeMap::new(),
                });
                entry.passes.push(i);
            }
        }
        Self {
            total: grads,
            reached,
            error: None,
        }
    }

    /// The variables of `store` that no pass reaches: complete already, with the loss graph's
    /// gradient or none.
    pub(super) fn unreached(&self, store: &ParamStore) -> Vec<TensorId> {
        store
            .vars()
            .into_iter()
            .map(|(_, var)| var.as_tensor().id())
            .filter(|id| !self.reached.contains_key(id))
            .collect()
    }

    /// Adds pass `pass`'s share `grad` of variable `id`; returns its total once every pass that
    /// reaches it is in (`Some(None)`: no gradient anywhere), `None` before.
    pub(super) fn add(
        &mut self,
        pass: usize,
        id: TensorId,
        grad: Option<&Tensor>,
    ) -> candle_core::Result<Option<Option<Tensor>>> {
        if let Some(e) = &self.error {
            candle_core::bail!("another view's backward pass failed: {e}");
        }
        let Some(var) = self.reached.get_mut(&id) else {
            candle_core::bail!("a backward pass reached a variable its graph does not hold");
        };
        var.waiting.insert(pass, grad.cloned());
        while let Some(share) = var
            .passes
            .get(var.added)
            .and_then(|next| var.waiting.remove(next))
        {
            var.added += 1;
            var.sum = match (var.sum.take(), share) {
                (Some(sum), Some(share)) => Some(sum.add(&share)?),
                (sum, share) => sum.or(share),
            };
        }
        if var.added < var.passes.len() {
            return Ok(None);
        }
        // The loss graph's gradient comes first, as one pass's total would have been added to it.
        if let Some(sum) = var.sum.take() {
            let total = match self.total.get_id(id) {
                Some(loss) => loss.add(&sum)?,
                None => sum,
            };
            self.total.insert_id(id, total);
        }
        Ok(Some(self.total.get_id(id).cloned()))
    }

    pub(super) fn into_total(self) -> Result<GradStore> {
        if let Some(e) = self.error {
            return Err(e.into());
        }
        let open = self
            .reached
            .values()
            .filter(|v| v.added < v.passes.len())
            .count();
        ensure!(
            open == 0,
            "{open} variables' backward passes did not all run"
        );
        Ok(self.total)
    }
}

/// One step: encoder (train mode, view by view, global views then local crops) → projector →
/// objective loss (+ the online probe's cross-entropy on the global views' detached features) →
/// backward → optimiser. A teacher sees the global views only. A non-finite loss or term is an
/// error raised before the weights change. Returns the step's values, read to the host.
pub fn training_step(
    model: &mut Model,
    optimizer: &mut Optimizer,
    input: &StepInput<'_>,
) -> Result<StepValues> {
    let (out, grads) = forward_backward(model, input)?;
    let values = out.logged.read()?;
    values.check_finite(input.progress.step, input.lr)?;
    optimizer.step(&grads, input.lr, &input.progress)?;
    Ok(values)
}

/// `sum + other` for every variable of `store` with a gradient in either.
pub fn add_grads(store: &ParamStore, mut sum: GradStore, other: &GradStore) -> Result<GradStore> {
    for (_, var) in store.vars() {
        let t = var.as_tensor();
        if let Some(g) = other.get(t) {
            let total = match sum.get(t) {
                Some(s) => (s + g)?,
                None => g.clone(),
            };
            sum.insert(t, total);
        }
    }
    Ok(sum)
}

/// Multiplies every gradient of `store`'s variables in `grads` by `factor`.
pub fn scale_grads(store: &ParamStore, grads: &mut GradStore, factor: f64) -> Result<()> {
    for (_, var) in store.vars() {
        let t = var.as_tensor();
        if let Some(g) = grads.get(t) {
            let scaled = (g * factor)?;
            grads.insert(t, scaled);
        }
    }
    Ok(())
}

/// The accumulated batches' outputs as one: their mean values (on the device), the last
/// batch's projections.
pub(super) fn mean_output(outs: Vec<StepOutput>) -> Result<StepOutput> {
    let values = match outs.as_slice() {
        [_] => None,
        many => {
            let values: Vec<&Tensor> = many.iter().map(|o| &o.logged.values).collect();
            Some(Tensor::stack(&values, 0)?.mean(0)?)
        }
    };
    let mut last = outs.into_iter().last().context("at least one batch")?;
    if let Some(values) = values {
        last.logged.values = values;
    }
    Ok(last)
}

/// Forward, loss and backward of one batch (no optimiser step): its outputs and gradients.
pub fn forward_backward(
    model: &mut Model,
    input: &StepInput<'_>,
) -> Result<(StepOutput, GradStore)> {
    let one = StepCollectives::gather_over(&SingleProcess);
    forward_backward_on(model, input, one, &|_, _| Ok(()))
}

/// What a training step shares with the other ranks. It is handed to the step, which every rank
/// takes, and to nothing else: work one rank does alone (evaluation, baselines, monitoring,
/// export) has no collective to enter, and its batch norms use that rank's rows.
#[derive(Clone, Copy)]
pub struct StepCollectives<'a> {
    /// The objective's gathers of the global batch (`Batch::collective`).
    pub gather: &'a dyn Collective,
    /// With `model.sync_bn`: the collective over which every train-mode batch norm of the step
    /// takes the global batch's statistics; `None`: each rank's own rows.
    pub batch_norm: Option<&'a Arc<dyn Collective>>,
}

impl<'a> StepCollectives<'a> {
    /// Gathers over `collective`, batch norm per rank.
    pub fn gather_over(collective: &'a dyn Collective) -> Self {
        Self {
            gather: collective,
            batch_norm: None,
        }
    }
}

/// [`forward_backward`] of this rank's shard, the objective gathering the global batch through
/// `ranks.gather` and the batch norms synchronised over `ranks.batch_norm` for the step's forward
/// and backward passes alone. The gradients are this rank's; each variable's is also handed to
/// `complete` as soon as the backward has completed it (for [`GradientAveraging`] to average it
/// over the ranks while the backward goes on).
pub fn forward_backward_on(
    model: &mut Model,
    input: &StepInput<'_>,
    ranks: StepCollectives<'_>,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    match ranks.batch_norm {
        Some(collective) => {
            ssl_models::sync_bn::with_global_statistics(Arc::clone(collective), || {
                step_on(model, input, ranks.gather, complete)
            })
        }
        None => step_on(model, input, ranks.gather, complete),
    }
}

/// [`forward_backward_on`] with batch norm as the caller set it.
pub(super) fn step_on(
    model: &mut Model,
    input: &StepInput<'_>,
    collective: &dyn Collective,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    let _precision = autocast(model.precision);
    let device = input.images.device();
    let (v, b) = (input.views, input.instance_ids.len());
    let views = input.images.chunk(v, 0)?;
    let mut student_views = views.clone();
    if let Some(local) = &input.local_images {
        student_views.extend(local.chunk(local.dims()[0] / b, 0)?);
    }
    if model.objective.requirements().pixels {
        return pixel_step(model, input, &student_views, collective, complete);
    }
    let all_views = student_views.len();
    let (view_features, view_projections) = timed(Phase::Forward, || {
        forward_views(
            model.encoder.as_ref(),
            model.projector.as_ref(),
            &student_views,
            true,
        )
    })?;
    // The loss's graph starts from leaves holding the views' outputs, and each view's own graph
    // is taken back afterwards from the loss's gradients at those leaves (`backward_views`).
    let features = Var::from_tensor(&Tensor::cat(&view_features, 0)?.detach())?;
    let projections = Var::from_tensor(&Tensor::cat(&view_projections, 0)?.detach())?;
    let teacher_out = match &model.teacher {
        Some((enc, proj)) => {
            let train_mode = model
                .objective
                .requirements()
                .teacher
                .is_some_and(|s| s.train_mode);
            let (_, p) = timed(Phase::Forward, || {
                forward_views(enc.as_ref(), proj.as_ref(), &views, train_mode)
            })?;
            Some(Tensor::cat(&p, 0)?.detach().reshape((v, b, ()))?)
        }
        None => None,
    };
    let loss_started = Instant::now();
    let indices = Ids::new(input.instance_ids, device)?;
    let labels = Ids::new(input.labels, device)?;
    let features_v = features.reshape((all_views, b, ()))?;
    let projections_v = projections.reshape((all_views, b, ()))?;
    let batch = Batch {
        projections: &projections_v,
        features: &features_v,
        global_views: v,
        indices: &indices,
        labels: Some(&labels),
        teacher: teacher_out.as_ref(),
        progress: input.progress,
        train: true,
        collective,
    };
    let out = model.objective.loss(&batch)?;
    let (mut values, terms) = logged_values(&out)?;
    let mut total = out.loss;
    if let Some(probe) = &model.probe {
        let ce = probe.loss(&features.narrow(0, 0, v * b)?, input.labels, v, collective)?;
        values.push(scalar(&ce)?);
        total = (total + ce)?;
    }
    let mut grads = total.backward()?;
    // Each view's share of the loss, `⟨output, ∂L/∂output⟩` summed over its features and
    // projections, has the loss's gradients for that view's graph; the roots own the views'
    // graphs from here, so each graph is freed as soon as its pass is done.
    let leaf_grads = [grads.remove(&features), grads.remove(&projections)];
    let mut roots = Vec::with_capacity(all_views);
    for (view, outputs) in view_features.into_iter().zip(view_projections).enumerate() {
        let mut root: Option<Tensor> = None;
        for (output, grad) in [outputs.0, outputs.1].iter().zip(&leaf_grads) {
            if let Some(grad) = grad {
                let share = (output * grad.narrow(0, view * b, b)?)?.sum_all()?;
                root = Some(match root {
                    Some(root) => (root + share)?,
                    None => share,
                });
            }
        }
        roots.extend(root);
    }
    phases::add_since(Phase::Loss, loss_started);
    let grads = timed(Phase::Backward, || {
        backward_views(roots, grads, &model.store, complete)
    })?;
    let out = StepOutput {
        logged: Logged {
            values: Tensor::stack(&values, 0)?,
            terms,
            probe: model.probe.is_some(),
        },
        projections: projections_v.narrow(0, 0, v)?.detach(),
    };
    Ok((out, grads))
}

/// [`step_on`] for an objective that encodes the views itself ([`Requirements::pixels`]): it
/// gets the views and the encoders' patch tokens, returns its loss and an embedding of every
/// global view (for the spectrum); the online probe trains on the encoder's detached output for
/// the whole global views. One backward pass through the whole graph.
///
/// [`Requirements::pixels`]: ssl_core::Requirements::pixels
pub(super) fn pixel_step(
    model: &mut Model,
    input: &StepInput<'_>,
    views: &[Tensor],
    collective: &dyn Collective,
    complete: &Complete,
) -> Result<(StepOutput, GradStore)> {
    let device = input.images.device();
    let v = input.views;
    let no_tokens = || anyhow!("the objective encodes patch tokens and the encoder has none");
    let encoder = model.encoder.tokens().ok_or_else(no_tokens)?;
    let teacher = match &model.teacher {
        Some((enc, _)) => Some(enc.tokens().ok_or_else(no_tokens)?),
        None => None,
    };
    let indices = Ids::new(input.instance_ids, device)?;
    let labels = Ids::new(input.labels, device)?;
    let batch = PixelBatch {
        views,
        global_views: v,
        encoder,
        teacher,
        indices: &indices,
        labels: Some(&labels),
        progress: input.progress,
        train: true,
        collective,
    };
    // The objective encodes the views itself: its forward and its loss are one phase here.
    let PixelLoss { output, embeddings } =
        timed(Phase::Forward, || model.objective.pixel_loss(&batch))?;
    let embeddings = embeddings.detach();
    let (mut values, terms) = logged_values(&output)?;
    let mut total = output.loss;
    if let Some(probe) = &model.probe {
        // The probe reads the encoder's output on the whole global views, as it does with the
        // other objectives and is evaluated on, not the objective's embedding of a masked view
        // or of the teacher (on which it stayed at chance). Through the eval encoder: the same
        // function (a token encoder has no batch norm), and no graph held beside the step's. It
        // is the student's: `eval.encoder: teacher` runs without the probe (config validation).
        let global = Tensor::cat(&views[..v], 0)?;
        let features = model.eval_encoder.forward_t(&global, true)?;
        let ce = probe.loss(&features, input.labels, v, collective)?;
        values.push(scalar(&ce)?);
        total = (total + ce)?;
    }
    let grads = timed(Phase::Backward, || {
        backward_views(Vec::new(), total.backward()?, &model.store, complete)
    })?;
    let out = StepOutput {
        logged: Logged {
            values: Tensor::stack(&values, 0)?,
            terms,
            probe: model.probe.is_some(),
        },
        projections: embeddings,
    };
    Ok((out, grads))
}

/// A logged scalar: detached, f64, shape `[]`.
pub(super) fn scalar(t: &Tensor) -> Result<Tensor> {
    Ok(t.detach().to_dtype(candle_core::DType::F64)?.reshape(())?)
}

/// The loss and its terms as logged scalars, and the terms' names.
pub(super) fn logged_values(out: &LossOutput) -> Result<(Vec<Tensor>, Vec<String>)> {
    let mut values = vec![scalar(&out.loss)?];
    let mut names = Vec::with_capacity(out.terms.len());
    for (name, value) in &out.terms {
        names.push(name.clone());
        values.push(scalar(value)?);
    }
    Ok((values, names))
}
