//! Optimisers for candle-ssl: AdamW, SGD with momentum/Nesterov and LARS updating Candle
//! [`Var`]s in place (one fused pass per parameter on the CPU, one launch over every
//! parameter on CUDA), the warm-up + cosine schedule, and parameter groups
//! ([`ssl_core::ParamGroup`]): per-group learning rate and schedule, weight decay, LARS
//! adaptation, gradient clipping and freezing. An [`Optimizer`] is made from its own
//! [`OptimizerSettings`], not from a run's configuration.
//!
//! ```
//! use candle_core::{Device, Var};
//! use ssl_core::Progress;
//! use ssl_optim::{Optimizer, OptimizerKind, OptimizerSettings};
//!
//! let w = Var::new(&[3f32, -2.0], &Device::Cpu)?;
//! let settings = OptimizerSettings { kind: OptimizerKind::Sgd, momentum: 0.0, weight_decay: 0.0, ..Default::default() };
//! let mut opt = Optimizer::new(&settings, vec![("w".into(), w.clone())], &[])?;
//! let at = Progress { step: 10, epoch: 5, steps_per_epoch: 2, total_steps: 20, seed: 0 };
//! let loss = w.as_tensor().sqr()?.sum_all()?; // gradient 2w
//! opt.step(&loss.backward()?, 0.25, &at)?;    // w ← w − 0.25 · 2w
//! assert_eq!(w.as_tensor().to_vec1::<f32>()?, [1.5, -1.0]);
//! # anyhow::Ok(())
//! ```
//!
//! Parameters of rank ≤ 1 (biases, batch-norm weights) are excluded from weight decay and from
//! LARS adaptation, as in solo-learn and the LARS papers: a built-in group, the first to apply,
//! which later groups may override. A parameter without a gradient in a step (buffers,
//! teachers) is left untouched.
//!
//! Where a group stands (its rate, whether it is frozen) follows from the step and epoch alone,
//! and each parameter's moments and update count are in [`Optimizer::state`], so a run resumed
//! inside a freeze or a step schedule continues exactly.

use std::collections::{BTreeSet, HashMap};

use anyhow::{bail, Result};
use candle_core::{backprop::GradStore, Tensor, Var};
use ssl_core::{groups::DEFAULT_GAMMA, ParamGroup, Progress, Schedule};

use serde::{Deserialize, Serialize};

/// The update rule.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Adam with decoupled weight decay (Loshchilov & Hutter, ICLR 2019).
    Adamw,
    /// SGD with momentum (and Nesterov's variant) and L2 weight decay, as PyTorch's.
    Sgd,
    /// SGD with layer-wise adaptive rates (You et al., 2017), solo-learn's form.
    Lars,
}

/// An optimiser's hyperparameters; the defaults are candle-ssl's trainer's (AdamW at 1e-3,
/// weight decay 1e-4, 2 warm-up epochs).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerSettings {
    pub kind: OptimizerKind,
    /// Peak learning rate: what the constant and step schedules of parameter groups start from.
    pub lr: f64,
    /// Epochs of linear warm-up, which a group's step schedule follows before its milestones.
    pub warmup_epochs: usize,
    /// Decoupled (AdamW) or L2 (SGD/LARS) weight decay; rank ≤ 1 parameters are excluded.
    pub weight_decay: f64,
    /// Adam's betas.
    pub betas: (f64, f64),
    /// SGD/LARS momentum and Nesterov switch.
    pub momentum: f64,
    pub nesterov: bool,
    /// LARS trust coefficient η.
    pub lars_eta: f64,
    /// Global gradient-norm bound over every parameter (0: off).
    pub clip_grad_norm: f64,
}

impl Default for OptimizerSettings {
    fn default() -> Self {
        Self {
            kind: OptimizerKind::Adamw,
            lr: 1e-3,
            warmup_epochs: 2,
            weight_decay: 1e-4,
            betas: (0.9, 0.999),
            momentum: 0.9,
            nesterov: false,
            lars_eta: 0.02,
            clip_grad_norm: 0.0,
        }
    }
}

mod adamw;
#[cfg(feature = "cuda")]
mod cuda;
pub mod sgd;
use adamw::AdamwStep;
use sgd::SgdStep;

/// The values of a contiguous CPU tensor's storage that its layout covers (the in-place steps'
/// operands).
fn part<'a, T>(values: &'a [T], l: &candle_core::Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&values[start..end]),
        None => candle_core::bail!("an in-place optimiser step takes contiguous tensors"),
    }
}

/// [`part`], mutable.
fn part_mut<'a, T>(
    values: &'a mut [T],
    l: &candle_core::Layout,
) -> candle_core::Result<&'a mut [T]> {
    match l.contiguous_offsets() {
        Some((start, end)) => Ok(&mut values[start..end]),
        None => candle_core::bail!("an in-place optimiser step takes contiguous tensors"),
    }
}

/// The settings of one parameter, after every group that matches it.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    /// Multiplies the run's learning rate.
    lr_scale: f64,
    schedule: Schedule,
    milestones: Vec<usize>,
    gamma: f64,
    weight_decay: f64,
    lars: bool,
    freeze_epochs: usize,
    freeze_steps: usize,
}

impl Settings {
    fn apply(&mut self, g: &ParamGroup, run_lr: f64) {
        if let Some(lr) = g.lr {
            self.lr_scale = lr / run_lr;
        }
        if let Some(s) = g.lr_scale {
            self.lr_scale = s;
        }
        if let Some(s) = g.schedule {
            self.schedule = s;
            self.milestones = g.milestones.clone();
            self.gamma = g.gamma.unwrap_or(DEFAULT_GAMMA);
        }
        if let Some(wd) = g.weight_decay {
            self.weight_decay = wd;
        }
        if let Some(l) = g.lars {
            self.lars = l;
        }
        if let Some(n) = g.freeze_epochs {
            self.freeze_epochs = n;
        }
        if let Some(n) = g.freeze_steps {
            self.freeze_steps = n;
        }
    }

    /// The learning rate at `at`, given the run's scheduled rate `lr` there.
    fn lr(&self, cfg: &OptimizerSettings, lr: f64, at: &Progress) -> f64 {
        let warming = at.step < cfg.warmup_epochs * at.steps_per_epoch;
        self.lr_scale
            * match self.schedule {
                Schedule::Cosine => lr,
                Schedule::Constant => cfg.lr,
                Schedule::Step if warming => lr,
                Schedule::Step => {
                    let passed = self.milestones.iter().filter(|&&m| at.epoch >= m).count();
                    cfg.lr * self.gamma.powi(passed as i32)
                }
            }
    }

    fn frozen(&self, at: &Progress) -> bool {
        at.epoch < self.freeze_epochs || at.step < self.freeze_steps
    }
}

/// One optimised parameter with its slots.
struct Slot {
    name: String,
    var: Var,
    settings: Settings,
    /// First / second moment (Adam) or momentum buffer (SGD, LARS).
    m: Option<Tensor>,
    v: Option<Tensor>,
    /// Updates this parameter has received: Adam's bias correction counts them per parameter,
    /// as PyTorch does, so a parameter frozen for the first steps (DINO's last layer, SwAV's
    /// prototypes) starts with a full-size step.
    steps: usize,
}

/// Gradients of `slots` (indices) scaled together so that their global norm is at most `max`,
/// or each on its own where `each`.
struct Clip {
    max: f64,
    each: bool,
    slots: Vec<usize>,
}

/// The optimiser of a run.
pub struct Optimizer {
    kind: OptimizerKind,
    slots: Vec<Slot>,
    clips: Vec<Clip>,
    cfg: OptimizerSettings,
}

impl Optimizer {
    /// An optimiser over `params` (`(name, var)`) with `groups` applied in order after the
    /// built-in one (rank ≤ 1 tensors out of weight decay and LARS). A group whose prefixes
    /// match no parameter, or whose values are invalid, is an error (objectives' groups are
    /// checked here; the config's also when the run's config is validated).
    pub fn new(
        cfg: &OptimizerSettings,
        params: Vec<(String, Var)>,
        groups: &[ParamGroup],
    ) -> Result<Self> {
        for g in groups {
            g.validate()?;
            let unmatched: Vec<&String> = g
                .params
                .list()
                .iter()
                .filter(|p| !params.iter().any(|(n, _)| n.starts_with(p.as_str())))
                .collect();
            if !unmatched.is_empty() {
                let existing: BTreeSet<String> =
                    params.iter().map(|(n, _)| top_prefix(n)).collect();
                bail!(
                    "parameter group prefix {} matches no trainable parameter; the parameters \
                     start with {} (write a prefix of one of them in `params`)",
                    unmatched
                        .iter()
                        .map(|p| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    existing.into_iter().collect::<Vec<_>>().join(", ")
                );
            }
        }
        let base = Settings {
            lr_scale: 1.0,
            schedule: Schedule::Cosine,
            milestones: Vec::new(),
            gamma: DEFAULT_GAMMA,
            weight_decay: cfg.weight_decay,
            lars: true,
            freeze_epochs: 0,
            freeze_steps: 0,
        };
        let mut no_decay = ParamGroup::new([""]);
        (no_decay.weight_decay, no_decay.lars) = (Some(0.0), Some(false));
        let slots: Vec<Slot> = params
            .into_iter()
            .map(|(name, var)| {
                let mut settings = base.clone();
                if var.rank() <= 1 {
                    settings.apply(&no_decay, cfg.lr);
                }
                for g in groups.iter().filter(|g| g.matches(&name)) {
                    settings.apply(g, cfg.lr);
                }
                Slot {
                    name,
                    var,
                    settings,
                    m: None,
                    v: None,
                    steps: 0,
                }
            })
            .collect();
        let mut clips: Vec<Clip> = groups
            .iter()
            .filter_map(|g| {
                let max = g.clip_grad_norm?;
                let members = (0..slots.len()).filter(|&i| g.matches(&slots[i].name));
                Some(Clip {
                    max,
                    each: g.clip_per_parameter,
                    slots: members.collect(),
                })
            })
            .collect();
        // 0 is off (a run's configuration refuses a negative value).
        let max = cfg.clip_grad_norm;
        if max > 0.0 {
            clips.push(Clip {
                max,
                each: false,
                slots: (0..slots.len()).collect(),
            });
        }
        Ok(Self {
            kind: cfg.kind,
            slots,
            clips,
            cfg: cfg.clone(),
        })
    }

    /// Per-slot gradient factors of the clipping groups, each over the global norm of its
    /// members' gradients (or each member's own norm, per parameter; a frozen parameter's
    /// included): `min(1, max / (norm + 1e-6))`, as PyTorch's `clip_grad_norm_` and DINO's
    /// `clip_gradients`. Each is a scalar f64 tensor on the gradients' device (`None`: the slot
    /// is in no clipping group), computed there: no norm is read to the host.
    fn clip_factors(&self, grads: &GradStore) -> Result<Vec<Option<Tensor>>> {
        let mut factors: Vec<Option<Tensor>> = vec![None; self.slots.len()];
        for clip in &self.clips {
            let mut squares = Vec::with_capacity(clip.slots.len());
            for &i in &clip.slots {
                if let Some(g) = grads.get(self.slots[i].var.as_tensor()) {
                    let sq = g.sqr()?.sum_all()?.to_dtype(candle_core::DType::F64)?;
                    squares.push((i, sq));
                }
            }
            let groups: Vec<Vec<(usize, Tensor)>> = match clip.each {
                true => squares.into_iter().map(|s| vec![s]).collect(),
                false => vec![squares],
            };
            for members in groups.into_iter().filter(|m| !m.is_empty()) {
                let sums: Vec<&Tensor> = members.iter().map(|(_, sq)| sq).collect();
                let norm = Tensor::stack(&sums, 0)?.sum_all()?.sqrt()?;
                let factor = ((norm + 1e-6)?.recip()? * clip.max)?.clamp(0.0, 1.0)?;
                for (i, _) in members {
                    factors[i] = Some(match factors[i].take() {
                        Some(f) => (f * &factor)?,
                        None => factor.clone(),
                    });
                }
            }
        }
        Ok(factors)
    }

    /// One update at `at`, where the run's schedule gives the learning rate `lr`: each
    /// parameter's group sets its own rate, decay, adaptation, clipping and freezing. On CUDA
    /// the in-place updates of all parameters go in one launch (two for LARS) after the last.
    pub fn step(&mut self, grads: &GradStore, lr: f64, at: &Progress) -> Result<()> {
        let factors = self.clip_factors(grads)?;
        let c = &self.cfg;
        #[cfg(feature = "cuda")]
        let mut on_gpu = Vec::new();
        for (slot, factor) in self.slots.iter_mut().zip(factors) {
            let Some(g) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            if slot.settings.frozen(at) {
                continue;
            }
            slot.steps += 1;
            let t = slot.steps as i32;
            let lr = slot.settings.lr(c, lr, at);
            let wd = slot.settings.weight_decay;
            let w = slot.var.as_tensor();
            // The clipped gradient; a CUDA entry scales it in its kernel instead.
            let clipped = || match &factor {
                Some(f) => g.broadcast_mul(&f.to_dtype(g.dtype())?),
                None => Ok(g.clone()),
            };
            let zeros = |state: &Option<Tensor>| state.clone().map_or_else(|| w.zeros_like(), Ok);
            let new = match self.kind {
                OptimizerKind::Adamw => {
                    let step = AdamwStep {
                        lr,
                        weight_decay: wd,
                        betas: c.betas,
                        t,
                    };
                    if AdamwStep::fuses(w, g, [&slot.m, &slot.v]) {
                        let (m, v) = (zeros(&slot.m)?, zeros(&slot.v)?);
                        (slot.m, slot.v) = (Some(m.clone()), Some(v.clone()));
                        #[cfg(feature = "cuda")]
                        if w.device().is_cuda() {
                            on_gpu.push(step.entry(w, g, &m, &v, factor)?);
                            continue;
                        }
                        step.in_place(w, &clipped()?, &m, &v)?;
                        continue;
                    }
                    let (new, m, v) =
                        step.composed(w, &clipped()?, slot.m.as_ref(), slot.v.as_ref())?;
                    (slot.m, slot.v) = (Some(m), Some(v));
                    new
                }
                OptimizerKind::Sgd | OptimizerKind::Lars => {
                    let adapts = self.kind == OptimizerKind::Lars && slot.settings.lars;
                    let step = SgdStep {
                        lr,
                        weight_decay: wd,
                        momentum: c.momentum,
                        nesterov: c.nesterov,
                        lars_eta: adapts.then_some(c.lars_eta),
                    };
                    if SgdStep::fuses(w, g, slot.m.as_ref()) {
                        let buf = zeros(&slot.m)?;
                        slot.m = Some(buf.clone());
                        #[cfg(feature = "cuda")]
                        if w.device().is_cuda() {
                            on_gpu.push(step.entry(w, g, &buf, factor)?);
                            continue;
                        }
                        step.in_place(w, &clipped()?, &buf)?;
                        continue;
                    }
                    let (new, buf) = step.composed(w, &clipped()?, slot.m.as_ref())?;
                    slot.m = Some(buf);
                    new
                }
            };
            slot.var.set(&new)?;
        }
        #[cfg(feature = "cuda")]
        match self.kind {
            OptimizerKind::Adamw => AdamwStep::launch(&on_gpu)?,
            OptimizerKind::Sgd | OptimizerKind::Lars => SgdStep::launch(&on_gpu)?,
        }
        Ok(())
    }

    /// Optimiser state for a checkpoint: `m.NAME`, `v.NAME` and `steps.NAME`, copies that later
    /// steps (which update the moments in place on the CPU) leave as they are.
    pub fn state(&self) -> Result<HashMap<String, Tensor>> {
        let mut out = HashMap::new();
        for s in &self.slots {
            if let Some(m) = &s.m {
                out.insert(format!("m.{}", s.name), m.copy()?);
            }
            if let Some(v) = &s.v {
                out.insert(format!("v.{}", s.name), v.copy()?);
            }
            out.insert(
                format!("steps.{}", s.name),
                Tensor::new(&[s.steps as f32], &candle_core::Device::Cpu)?,
            );
        }
        Ok(out)
    }

    /// Restores [`Optimizer::state`].
    pub fn load_state(&mut self, state: &HashMap<String, Tensor>) -> Result<()> {
        for s in &mut self.slots {
            let dev = s.var.device();
            // Copies, which the in-place CPU update may change without touching `state`.
            let moment = |key: String| {
                state
                    .get(&key)
                    .map(|t| t.to_device(dev)?.copy())
                    .transpose()
            };
            s.m = moment(format!("m.{}", s.name))?;
            s.v = moment(format!("v.{}", s.name))?;
        }
        // Checkpoints written before per-parameter counts kept one shared `steps`.
        let count = |t: &Tensor| -> Result<usize> {
            let steps = t.flatten_all()?.to_vec1::<f32>()?;
            match steps.as_slice() {
                [n] => Ok(*n as usize),
                _ => bail!(
                    "the optimiser state's step count holds {} values, not 1",
                    steps.len()
                ),
            }
        };
        let shared = state.get("steps").map(count).transpose()?.unwrap_or(0);
        for s in &mut self.slots {
            s.steps = match state.get(&format!("steps.{}", s.name)) {
                Some(t) => count(t)?,
                None if s.m.is_some() => shared,
                None => 0,
            };
        }
        Ok(())
    }
}

/// The first one or two components of a parameter name (`encoder.`, `objective.predictor.`),
/// to say which prefixes exist.
fn top_prefix(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    match parts.as_slice() {
        [one] => one.to_string(),
        [first, _] => format!("{first}."),
        [first, second, ..] => format!("{first}.{second}."),
        [] => String::new(),
    }
}

/// Learning rate at `step`: linear warm-up from 0 over `warmup` steps, then cosine to `min_lr`.
pub fn learning_rate(step: usize, total: usize, warmup: usize, lr: f64, min_lr: f64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let k = ((step - warmup) as f64 / span as f64).min(1.0);
    min_lr + (lr - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * k).cos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// The first step of a one-step run.
    const AT: Progress = Progress {
        step: 0,
        epoch: 0,
        steps_per_epoch: 1,
        total_steps: 1,
        seed: 0,
    };

    fn quadratic_descent(kind: OptimizerKind, nesterov: bool) -> f32 {
        let cfg = OptimizerSettings {
            kind,
            nesterov,
            weight_decay: 0.0,
            ..OptimizerSettings::default()
        };
        let w = Var::new(&[[3f32, -2.0], [1.0, 4.0]], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&cfg, vec![("w".into(), w.clone())], &[]).unwrap();
        for _ in 0..200 {
            let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            opt.step(&grads, 0.05, &AT).unwrap();
        }
        w.as_tensor()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn every_optimizer_minimises_a_quadratic() {
        assert!(quadratic_descent(OptimizerKind::Adamw, false) < 1e-2);
        assert!(quadratic_descent(OptimizerKind::Sgd, false) < 1e-4);
        assert!(quadratic_descent(OptimizerKind::Sgd, true) < 1e-4);
        assert!(quadratic_descent(OptimizerKind::Lars, false) < 1.0);
    }

    #[test]
    fn adamw_first_step_is_lr_times_sign() {
        // Bias-corrected Adam's first step is lr·g/|g| (up to ε); decay multiplies w by 1 − lr·wd.
        let cfg = OptimizerSettings {
            weight_decay: 0.1,
            ..OptimizerSettings::default()
        };
        let w = Var::new(&[[1f32, -1.0], [2.0, 0.5]], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&cfg, vec![("w".into(), w.clone())], &[]).unwrap();
        let grads = (w.as_tensor() * 3.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads, 0.01, &AT).unwrap();
        let got = w.as_tensor().to_vec2::<f32>().unwrap();
        let want = [
            [1.0 * 0.999 - 0.01, -0.999 - 0.01],
            [2.0 * 0.999 - 0.01, 0.5 * 0.999 - 0.01],
        ];
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    /// A parameter without gradients for its first steps (a frozen layer) then takes Adam's full
    /// first step, and its count survives a checkpoint round trip.
    #[test]
    fn adam_counts_steps_per_parameter() -> Result<()> {
        let cfg = OptimizerSettings {
            weight_decay: 0.0,
            ..OptimizerSettings::default()
        };
        let a = Var::new(&[1f32, 1.0], &Device::Cpu)?;
        let frozen = Var::new(&[1f32, 1.0], &Device::Cpu)?;
        let params = || vec![("a".into(), a.clone()), ("f".into(), frozen.clone())];
        let mut opt = Optimizer::new(&cfg, params(), &[]).unwrap();
        for _ in 0..5 {
            opt.step(&a.as_tensor().sum_all()?.backward()?, 0.01, &AT)?;
        }
        let both = (a.as_tensor().sum_all()? + frozen.as_tensor().sum_all()?)?;
        opt.step(&both.backward()?, 0.01, &AT)?;
        for v in frozen.as_tensor().to_vec1::<f32>()? {
            assert!(
                (v - 0.99).abs() < 1e-6,
                "first step of a late parameter: {v}"
            );
        }
        let mut restored = Optimizer::new(&cfg, params(), &[]).unwrap();
        restored.load_state(&opt.state()?)?;
        let counts: Vec<usize> = restored.slots.iter().map(|s| s.steps).collect();
        assert_eq!(counts, vec![6, 1]);
        // A damaged count is an error, not a panic.
        let mut damaged = opt.state()?;
        damaged.insert(
            "steps.a".into(),
            Tensor::zeros(0, DType::F32, &Device::Cpu)?,
        );
        let e = restored.load_state(&damaged).unwrap_err().to_string();
        assert!(e.contains("step count holds 0 values, not 1"), "{e}");
        Ok(())
    }

    /// The CPU update changes the moments in place: a saved state keeps the values it was saved
    /// with, and so does the state a run was restored from.
    #[test]
    fn saved_and_loaded_states_are_not_changed_by_later_steps() -> Result<()> {
        let cfg = OptimizerSettings::default();
        let w = Var::new(&[1f32, -2.0, 3.0], &Device::Cpu)?;
        let params = || vec![("w".into(), w.clone())];
        let mut opt = Optimizer::new(&cfg, params(), &[]).unwrap();
        let step = |opt: &mut Optimizer| -> Result<()> {
            opt.step(&w.as_tensor().sqr()?.sum_all()?.backward()?, 0.01, &AT)
        };
        step(&mut opt)?;
        let saved = opt.state()?;
        let values = |state: &HashMap<String, Tensor>| -> candle_core::Result<Vec<Vec<f32>>> {
            ["m.w", "v.w"]
                .iter()
                .map(|k| state[*k].to_vec1::<f32>())
                .collect()
        };
        let before = values(&saved)?;
        step(&mut opt)?;
        assert_eq!(
            values(&saved)?,
            before,
            "a later step changed the saved state"
        );
        let mut restored = Optimizer::new(&cfg, params(), &[]).unwrap();
        restored.load_state(&saved)?;
        step(&mut restored)?;
        assert_eq!(
            values(&saved)?,
            before,
            "a restored run's step changed its source"
        );
        assert_ne!(values(&restored.state()?)?, before);
        Ok(())
    }

    #[test]
    fn biases_are_not_decayed() -> Result<()> {
        // Gradient 1: a decayed value would move by 0.1·(1 + 0.5), an undecayed one by 0.1.
        let cfg = OptimizerSettings {
            weight_decay: 0.5,
            momentum: 0.0,
            kind: OptimizerKind::Sgd,
            ..OptimizerSettings::default()
        };
        let b = Var::new(&[1f32, 1.0], &Device::Cpu)?;
        let mut opt = Optimizer::new(&cfg, vec![("bias".into(), b.clone())], &[])?;
        ones_step(&mut opt, &[&b], 0.1, &AT)?;
        assert!((first(&b) - 0.9).abs() < 1e-6, "{}", first(&b));
        Ok(())
    }

    #[test]
    fn schedule_warms_up_then_follows_a_cosine() {
        assert!((learning_rate(0, 100, 10, 1.0, 0.0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(9, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((learning_rate(10, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((learning_rate(55, 100, 10, 1.0, 0.0) - 0.5).abs() < 1e-12);
        assert!((learning_rate(100, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
    }

    /// `loss = Σ w` over every parameter: each gradient is all ones, so plain SGD moves each
    /// value by exactly its learning rate.
    fn ones_step(opt: &mut Optimizer, vars: &[&Var], lr: f64, at: &Progress) -> Result<()> {
        let mut loss = vars[0].as_tensor().sum_all()?;
        for v in &vars[1..] {
            loss = (loss + v.as_tensor().sum_all()?)?;
        }
        opt.step(&loss.backward()?, lr, at)
    }

    fn sgd() -> OptimizerSettings {
        OptimizerSettings {
            kind: OptimizerKind::Sgd,
            momentum: 0.0,
            weight_decay: 0.0,
            lr: 0.1,
            warmup_epochs: 0,
            ..OptimizerSettings::default()
        }
    }

    fn group(yaml: &str) -> ParamGroup {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn at(step: usize, steps_per_epoch: usize, total_steps: usize) -> Progress {
        Progress {
            step,
            epoch: step / steps_per_epoch,
            steps_per_epoch,
            total_steps,
            seed: 0,
        }
    }

    fn first(v: &Var) -> f64 {
        v.as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()[0] as f64
    }

    /// A `constant` group keeps the peak rate while the run's cosine decays; a `step` group
    /// drops by `gamma` at each milestone epoch; `lr` and `lr_scale` set the group's peak.
    #[test]
    fn groups_follow_their_own_schedules() -> Result<()> {
        let cfg = sgd();
        let dev = &Device::Cpu;
        let enc = Var::new(&[[0f32; 2]; 2], dev)?;
        let pred = Var::new(&[[0f32; 2]; 2], dev)?;
        let stepped = Var::new(&[[0f32; 2]; 2], dev)?;
        let params = vec![
            ("encoder.w".into(), enc.clone()),
            ("objective.predictor.w".into(), pred.clone()),
            ("projector.w".into(), stepped.clone()),
        ];
        let groups = [
            group("{params: objective.predictor., schedule: constant}"),
            group("{params: projector., lr: 0.2, schedule: step, milestones: [1, 3], gamma: 0.5}"),
        ];
        let mut opt = Optimizer::new(&cfg, params, &groups)?;
        let (per_epoch, total) = (2, 8);
        let vars = [&enc, &pred, &stepped];
        for step in 0..total {
            let before: Vec<f64> = vars.iter().map(|v| first(v)).collect();
            let lr = learning_rate(step, total, 0, cfg.lr, 0.0);
            ones_step(&mut opt, &vars, lr, &at(step, per_epoch, total))?;
            let moved: Vec<f64> = vars
                .iter()
                .zip(&before)
                .map(|(v, b)| b - first(v))
                .collect();
            let epoch = step / per_epoch;
            let step_lr = 0.2 * 0.5f64.powi([0, 1, 1, 2][epoch]);
            for (got, want, what) in [
                (moved[0], lr, "cosine"),
                (moved[1], cfg.lr, "constant"),
                (moved[2], step_lr, "step"),
            ] {
                assert!(
                    (got - want).abs() < 1e-6,
                    "step {step}, {what}: {got} vs {want}"
                );
            }
        }
        assert!(
            learning_rate(total - 1, total, 0, cfg.lr, 0.0) < 0.01,
            "the cosine decayed"
        );
        Ok(())
    }

    /// Weight decay and LARS per group: a group without decay leaves a matrix undecayed, a
    /// group with decay decays a bias (overriding the built-in exclusion), and LARS adapts only
    /// where the group leaves it on.
    #[test]
    fn groups_set_weight_decay_and_lars() -> Result<()> {
        let cfg = OptimizerSettings {
            weight_decay: 0.5,
            ..sgd()
        };
        let dev = &Device::Cpu;
        let w = Var::new(&[[1f32; 2]; 2], dev)?;
        let kept = Var::new(&[[1f32; 2]; 2], dev)?;
        let bias = Var::new(&[1f32, 1.0], dev)?;
        let params = vec![
            ("a.w".into(), w.clone()),
            ("b.w".into(), kept.clone()),
            ("c.bias".into(), bias.clone()),
        ];
        let groups = [
            group("{params: b., weight_decay: 0}"),
            group("{params: c., weight_decay: 0.5}"),
        ];
        let mut opt = Optimizer::new(&cfg, params, &groups)?;
        // Gradient 1, decay 0.5·w = 0.5: a decayed value moves by 0.1·1.5, another by 0.1.
        ones_step(&mut opt, &[&w, &kept, &bias], 0.1, &AT)?;
        assert!((first(&w) - 0.85).abs() < 1e-6, "decayed: {}", first(&w));
        assert!((first(&kept) - 0.9).abs() < 1e-6, "the group without decay");
        assert!(
            (first(&bias) - 0.85).abs() < 1e-6,
            "the bias group with decay"
        );

        // LARS: the step of an adapted matrix is η·‖w‖/‖g‖ times the gradient's.
        let cfg = OptimizerSettings {
            kind: OptimizerKind::Lars,
            ..sgd()
        };
        let adapted = Var::new(&[[1f32; 2]; 2], dev)?;
        let plain = Var::new(&[[1f32; 2]; 2], dev)?;
        let params = vec![
            ("a.w".into(), adapted.clone()),
            ("b.w".into(), plain.clone()),
        ];
        let mut opt = Optimizer::new(&cfg, params, &[group("{params: b., lars: false}")])?;
        ones_step(&mut opt, &[&adapted, &plain], 0.1, &AT)?;
        assert!((first(&adapted) - (1.0 - 0.1 * cfg.lars_eta)).abs() < 1e-6);
        assert!((first(&plain) - 0.9).abs() < 1e-6, "LARS off");
        Ok(())
    }

    /// A clipping group scales its members' gradients together: with plain SGD at rate 1 the
    /// step's global norm is the clip (3.0), and a parameter outside the group keeps its full
    /// gradient; `train.clip_grad_norm` clips over every parameter.
    #[test]
    fn clipped_steps_have_the_clip_as_global_norm() -> Result<()> {
        let dev = &Device::Cpu;
        for (cfg, groups, outside_clipped) in [
            (
                OptimizerSettings { lr: 1.0, ..sgd() },
                vec![group("{params: [a., b.], clip_grad_norm: 3.0}")],
                false,
            ),
            (
                OptimizerSettings {
                    lr: 1.0,
                    clip_grad_norm: 3.0,
                    ..sgd()
                },
                vec![],
                true,
            ),
        ] {
            let a = Var::new(&[[0f32; 3]; 3], dev)?;
            let b = Var::new(&[[0f32; 2]; 2], dev)?;
            let c = Var::new(&[[0f32; 2]; 2], dev)?;
            let params = vec![
                ("a.w".into(), a.clone()),
                ("b.w".into(), b.clone()),
                ("c.w".into(), c.clone()),
            ];
            let mut opt = Optimizer::new(&cfg, params, &groups)?;
            let loss = ((a.as_tensor().sum_all()? * 4.0)? + (b.as_tensor().sum_all()? * 4.0)?)?;
            let loss = (loss + (c.as_tensor().sum_all()? * 4.0)?)?;
            opt.step(&loss.backward()?, 1.0, &AT)?;
            let sq = |v: &Var| -> Result<f64> {
                Ok(v.as_tensor().sqr()?.sum_all()?.to_scalar::<f32>()? as f64)
            };
            let (na, nb, nc) = (sq(&a)?, sq(&b)?, sq(&c)?);
            let norm = match outside_clipped {
                true => (na + nb + nc).sqrt(),
                false => (na + nb).sqrt(),
            };
            assert!((norm - 3.0).abs() < 1e-5, "clipped step's norm {norm}");
            if !outside_clipped {
                assert!((nc.sqrt() - 8.0).abs() < 1e-5, "unclipped: {}", nc.sqrt());
            }
        }
        // Per parameter: each gradient (norms 12 and 8) is clipped to 3.0 on its own.
        let a = Var::new(&[[0f32; 3]; 3], dev)?;
        let b = Var::new(&[[0f32; 2]; 2], dev)?;
        let params = vec![("a.w".into(), a.clone()), ("b.w".into(), b.clone())];
        let each = group("{params: [a., b.], clip_grad_norm: 3.0, clip_per_parameter: true}");
        let cfg = OptimizerSettings { lr: 1.0, ..sgd() };
        let mut opt = Optimizer::new(&cfg, params, &[each])?;
        let loss = ((a.as_tensor().sum_all()? * 4.0)? + (b.as_tensor().sum_all()? * 4.0)?)?;
        opt.step(&loss.backward()?, 1.0, &AT)?;
        for v in [&a, &b] {
            let norm = v.as_tensor().sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
            assert!((norm - 3.0).abs() < 1e-5, "per-parameter clip: {norm}");
        }
        Ok(())
    }

    /// A group frozen for its first epoch (or steps) is not updated then, and Adam's first step
    /// after the freeze is a full one.
    #[test]
    fn frozen_groups_wait_for_their_epoch_or_step() -> Result<()> {
        let cfg = OptimizerSettings {
            weight_decay: 0.0,
            ..OptimizerSettings::default()
        };
        let dev = &Device::Cpu;
        let a = Var::new(&[1f32, 1.0], dev)?;
        let by_epoch = Var::new(&[1f32, 1.0], dev)?;
        let by_step = Var::new(&[1f32, 1.0], dev)?;
        let params = vec![
            ("a".into(), a.clone()),
            ("last_layer".into(), by_epoch.clone()),
            ("s".into(), by_step.clone()),
        ];
        let groups = [
            group("{params: last_layer, freeze_epochs: 1}"),
            group("{params: s, freeze_steps: 3}"),
        ];
        let mut opt = Optimizer::new(&cfg, params, &groups)?;
        let vars = [&a, &by_epoch, &by_step];
        let mut history = Vec::new();
        for step in 0..6 {
            ones_step(&mut opt, &vars, 0.01, &at(step, 2, 6))?;
            history.push(vars.map(first));
        }
        let moved = |i: usize| -> Vec<bool> { history.iter().map(|h| h[i] != 1.0).collect() };
        assert_eq!(moved(0), [true; 6]);
        assert_eq!(
            moved(1),
            [false, false, true, true, true, true],
            "epoch 0 frozen"
        );
        assert_eq!(
            moved(2),
            [false, false, false, true, true, true],
            "3 steps frozen"
        );
        assert!(
            (history[2][1] - 0.99).abs() < 1e-6,
            "a full first Adam step"
        );
        Ok(())
    }

    /// SGD's and LARS's momentum buffers hold no autograd graph after steps with weight decay
    /// (a tracked buffer chains every step's graph: memory grew by a copy of the weights a
    /// step), and the steps are those of plain tensors.
    #[test]
    fn momentum_buffers_are_off_the_graph() -> Result<()> {
        for optimizer in [OptimizerKind::Sgd, OptimizerKind::Lars] {
            let cfg = OptimizerSettings {
                kind: optimizer,
                momentum: 0.9,
                weight_decay: 0.1,
                ..sgd()
            };
            let w = Var::new(&[[1f32, 2.0], [3.0, 4.0]], &Device::Cpu)?;
            let mut opt = Optimizer::new(&cfg, vec![("w".into(), w.clone())], &[])?;
            for step in 0..3 {
                ones_step(&mut opt, &[&w], 0.1, &at(step, 1, 3))?;
                let m = opt.slots[0].m.as_ref().expect("a momentum buffer");
                assert!(
                    !m.track_op(),
                    "{optimizer:?} step {step}: the buffer tracks its ops"
                );
            }
        }
        Ok(())
    }

    /// A prefix that matches no parameter is refused, naming the prefixes that exist.
    #[test]
    fn a_group_matching_nothing_names_the_existing_prefixes() {
        let w = Var::new(&[[1f32]], &Device::Cpu).unwrap();
        let params = vec![
            ("encoder.layer1.w".into(), w.clone()),
            ("projector.0.weight".into(), w),
        ];
        let e = Optimizer::new(
            &sgd(),
            params,
            &[group("{params: [encoder., head.], lr: 1}")],
        )
        .err()
        .expect("an unmatched prefix")
        .to_string();
        assert!(e.contains("`head.` matches no trainable parameter"), "{e}");
        assert!(e.contains("encoder.layer1., projector.0."), "{e}");
    }
}
