//! Optimisers (AdamW, SGD with momentum/Nesterov, LARS) and the warm-up + cosine schedule.
//!
//! Parameters of rank ≤ 1 (biases, batch-norm weights) are excluded from weight decay and from
//! LARS adaptation, as in solo-learn and the LARS papers. A parameter without a gradient in a
//! step (buffers, teachers) is left untouched.

use std::collections::HashMap;

use anyhow::{bail, Result};
use candle_core::{backprop::GradStore, Tensor, Var};

use crate::config::{OptimizerKind, TrainConfig};

mod adamw;
use adamw::AdamwStep;

/// One optimised parameter with its slots.
struct Slot {
    name: String,
    var: Var,
    /// Decayed and (for LARS) adapted.
    regularised: bool,
    /// Multiplies the scheduled learning rate (the online probe has its own rate).
    lr_scale: f64,
    /// First / second moment (Adam) or momentum buffer (SGD, LARS).
    m: Option<Tensor>,
    v: Option<Tensor>,
    /// Updates this parameter has received: Adam's bias correction counts them per parameter,
    /// as PyTorch does, so a parameter frozen for the first steps (DINO's last layer, SwAV's
    /// prototypes) starts with a full-size step.
    steps: usize,
}

/// The optimiser of a run.
pub struct Optimizer {
    kind: OptimizerKind,
    slots: Vec<Slot>,
    cfg: TrainConfig,
}

impl Optimizer {
    /// `params`: `(name, var, lr_scale)`; weight decay and LARS skip rank ≤ 1 tensors and any
    /// name in `no_decay_prefixes`.
    pub fn new(
        cfg: &TrainConfig,
        params: Vec<(String, Var, f64)>,
        no_decay_prefixes: &[&str],
    ) -> Self {
        let slots = params
            .into_iter()
            .map(|(name, var, lr_scale)| Slot {
                regularised: var.rank() > 1
                    && !no_decay_prefixes.iter().any(|p| name.starts_with(p)),
                name,
                var,
                lr_scale,
                m: None,
                v: None,
                steps: 0,
            })
            .collect();
        Self {
            kind: cfg.optimizer,
            slots,
            cfg: cfg.clone(),
        }
    }

    /// One update with learning rate `lr`.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<()> {
        let c = &self.cfg;
        for slot in &mut self.slots {
            let Some(g) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            slot.steps += 1;
            let t = slot.steps as i32;
            let lr = lr * slot.lr_scale;
            let wd = if slot.regularised {
                c.weight_decay
            } else {
                0.0
            };
            let w = slot.var.as_tensor();
            let new = match self.kind {
                OptimizerKind::Adamw => {
                    let step = AdamwStep {
                        lr,
                        weight_decay: wd,
                        betas: c.betas,
                        t,
                    };
                    if AdamwStep::fuses(w, g, [&slot.m, &slot.v]) {
                        let moment =
                            |m: &Option<Tensor>| m.clone().map_or_else(|| w.zeros_like(), Ok);
                        let (m, v) = (moment(&slot.m)?, moment(&slot.v)?);
                        step.in_place(w, g, &m, &v)?;
                        (slot.m, slot.v) = (Some(m), Some(v));
                        continue;
                    }
                    let (new, m, v) = step.composed(w, g, slot.m.as_ref(), slot.v.as_ref())?;
                    (slot.m, slot.v) = (Some(m), Some(v));
                    new
                }
                OptimizerKind::Sgd | OptimizerKind::Lars => {
                    let mut d = if wd > 0.0 {
                        (g + (w * wd)?)?
                    } else {
                        g.clone()
                    };
                    if self.kind == OptimizerKind::Lars && slot.regularised {
                        let w_norm = w.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()? as f64;
                        let d_norm = d.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()? as f64;
                        if w_norm > 0.0 && d_norm > 0.0 {
                            d = (d * (c.lars_eta * w_norm / d_norm))?;
                        }
                    }
                    let buf = match &slot.m {
                        Some(m) => ((m * c.momentum)? + &d)?,
                        None => d.clone(),
                    };
                    let step = if c.nesterov {
                        (d + (&buf * c.momentum)?)?
                    } else {
                        buf.clone()
                    };
                    slot.m = Some(buf);
                    (w - (step * lr)?)?
                }
            };
            slot.var.set(&new)?;
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

    fn quadratic_descent(kind: OptimizerKind, nesterov: bool) -> f32 {
        let cfg = TrainConfig {
            optimizer: kind,
            nesterov,
            weight_decay: 0.0,
            ..TrainConfig::default()
        };
        let w = Var::new(&[[3f32, -2.0], [1.0, 4.0]], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&cfg, vec![("w".into(), w.clone(), 1.0)], &[]);
        for _ in 0..200 {
            let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            opt.step(&grads, 0.05).unwrap();
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
        let cfg = TrainConfig {
            weight_decay: 0.1,
            ..TrainConfig::default()
        };
        let w = Var::new(&[[1f32, -1.0], [2.0, 0.5]], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&cfg, vec![("w".into(), w.clone(), 1.0)], &[]);
        let grads = (w.as_tensor() * 3.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads, 0.01).unwrap();
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
        let cfg = TrainConfig {
            weight_decay: 0.0,
            ..TrainConfig::default()
        };
        let a = Var::new(&[1f32, 1.0], &Device::Cpu)?;
        let frozen = Var::new(&[1f32, 1.0], &Device::Cpu)?;
        let params = || {
            vec![
                ("a".into(), a.clone(), 1.0),
                ("f".into(), frozen.clone(), 1.0),
            ]
        };
        let mut opt = Optimizer::new(&cfg, params(), &[]);
        for _ in 0..5 {
            opt.step(&a.as_tensor().sum_all()?.backward()?, 0.01)?;
        }
        let both = (a.as_tensor().sum_all()? + frozen.as_tensor().sum_all()?)?;
        opt.step(&both.backward()?, 0.01)?;
        for v in frozen.as_tensor().to_vec1::<f32>()? {
            assert!(
                (v - 0.99).abs() < 1e-6,
                "first step of a late parameter: {v}"
            );
        }
        let mut restored = Optimizer::new(&cfg, params(), &[]);
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
        let cfg = TrainConfig::default();
        let w = Var::new(&[1f32, -2.0, 3.0], &Device::Cpu)?;
        let params = || vec![("w".into(), w.clone(), 1.0)];
        let mut opt = Optimizer::new(&cfg, params(), &[]);
        let step = |opt: &mut Optimizer| -> Result<()> {
            opt.step(&w.as_tensor().sqr()?.sum_all()?.backward()?, 0.01)
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
        let mut restored = Optimizer::new(&cfg, params(), &[]);
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
    fn biases_are_not_decayed() {
        let cfg = TrainConfig {
            weight_decay: 0.5,
            optimizer: OptimizerKind::Sgd,
            ..TrainConfig::default()
        };
        let b = Var::new(&[1f32, 1.0], &Device::Cpu).unwrap();
        let mut opt = Optimizer::new(&cfg, vec![("bias".into(), b.clone(), 1.0)], &[]);
        let grads = (b.as_tensor() * 0.0)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        opt.step(&grads, 0.1).unwrap();
        assert_eq!(b.as_tensor().to_vec1::<f32>().unwrap(), vec![1.0, 1.0]);
    }

    #[test]
    fn schedule_warms_up_then_follows_a_cosine() {
        assert!((learning_rate(0, 100, 10, 1.0, 0.0) - 0.1).abs() < 1e-12);
        assert!((learning_rate(9, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((learning_rate(10, 100, 10, 1.0, 0.0) - 1.0).abs() < 1e-12);
        assert!((learning_rate(55, 100, 10, 1.0, 0.0) - 0.5).abs() < 1e-12);
        assert!((learning_rate(100, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
    }
}
