//! Parameter groups: optimiser settings for the parameters whose names start with given
//! prefixes, as PyTorch's `param_groups`. An objective declares its defaults through
//! [`crate::Requirements::param_groups`]; a run's `train.param_groups` adds to them.
//!
//! Every group that matches a parameter applies, in order, each overriding the settings it
//! gives: the trainer's built-in groups (biases and norm weights out of weight decay and LARS,
//! the online probe at its own rate), then the objective's, then the config's.

use anyhow::{bail, ensure, Result};
use serde::{Deserialize, Serialize};

/// How a group's learning rate follows training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// The run's warm-up and cosine decay.
    Cosine,
    /// The peak rate at every step: no warm-up, no decay (SimSiam's predictor).
    Constant,
    /// The run's warm-up, then the peak rate times `gamma` for every milestone epoch reached.
    Step,
}

/// One prefix or several.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prefixes {
    One(String),
    Many(Vec<String>),
}

impl Prefixes {
    /// The prefixes as a list.
    pub fn list(&self) -> &[String] {
        match self {
            Prefixes::One(p) => std::slice::from_ref(p),
            Prefixes::Many(ps) => ps,
        }
    }
}

/// A parameter group: the parameters whose names start with one of `params`, and the
/// settings that differ from the run's (`None`: the run's, or an earlier group's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamGroup {
    /// Name prefixes, e.g. `projector.` or `[encoder., projector.]`.
    pub params: Prefixes,
    /// Peak learning rate of the group (exclusive with `lr_scale`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Multiplies the run's learning rate (exclusive with `lr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Epochs at which a `step` schedule multiplies the rate by `gamma`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub milestones: Vec<usize>,
    /// Factor of a `step` schedule (0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// LARS trust-ratio adaptation (with `train.optimizer: lars`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lars: Option<bool>,
    /// Scales the group's gradients so that their global norm is at most this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// Clips each parameter's gradient to `clip_grad_norm` on its own instead (DINO's
    /// `clip_gradients`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub clip_per_parameter: bool,
    /// No update during the first N epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_epochs: Option<usize>,
    /// No update during the first N optimiser steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze_steps: Option<usize>,
}

impl ParamGroup {
    /// A group over `prefixes` that changes nothing yet.
    pub fn new<S: Into<String>>(prefixes: impl IntoIterator<Item = S>) -> Self {
        let mut list: Vec<String> = prefixes.into_iter().map(Into::into).collect();
        Self {
            params: match list.len() {
                1 => Prefixes::One(list.remove(0)),
                _ => Prefixes::Many(list),
            },
            lr: None,
            lr_scale: None,
            schedule: None,
            milestones: Vec::new(),
            gamma: None,
            weight_decay: None,
            lars: None,
            clip_grad_norm: None,
            clip_per_parameter: false,
            freeze_epochs: None,
            freeze_steps: None,
        }
    }

    /// Whether `name` belongs to the group.
    pub fn matches(&self, name: &str) -> bool {
        self.params.list().iter().any(|p| name.starts_with(p))
    }

    /// Value checks, naming the group and the fix.
    pub fn validate(&self) -> Result<()> {
        let at = self.params.list().join(", ");
        ensure!(
            !self.params.list().is_empty(),
            "a parameter group needs at least one prefix in `params`"
        );
        if self.lr.is_some() && self.lr_scale.is_some() {
            bail!("parameter group `{at}` sets both `lr` and `lr_scale`; keep one");
        }
        for (key, value) in [
            ("lr", self.lr),
            ("lr_scale", self.lr_scale),
            ("weight_decay", self.weight_decay),
        ] {
            if let Some(v) = value {
                ensure!(
                    v.is_finite() && v >= 0.0,
                    "parameter group `{at}`: `{key}` must be ≥ 0, got {v}"
                );
            }
        }
        if let Some(c) = self.clip_grad_norm {
            ensure!(
                c.is_finite() && c > 0.0,
                "parameter group `{at}`: `clip_grad_norm` must be > 0, got {c}"
            );
        }
        if self.clip_per_parameter && self.clip_grad_norm.is_none() {
            bail!("parameter group `{at}`: `clip_per_parameter` needs `clip_grad_norm`");
        }
        if let Some(g) = self.gamma {
            ensure!(
                g > 0.0 && g <= 1.0,
                "parameter group `{at}`: `gamma` must be in (0, 1], got {g}"
            );
        }
        let step = self.schedule == Some(Schedule::Step);
        if step == self.milestones.is_empty() || (self.gamma.is_some() && !step) {
            bail!(
                "parameter group `{at}`: `milestones` (and `gamma`) go with `schedule: step`, \
                 which needs at least one milestone epoch"
            );
        }
        Ok(())
    }

    /// One line for `ssl describe`: the prefixes, then the settings the group gives.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(v) = self.lr {
            parts.push(format!("lr {v}"));
        }
        if let Some(v) = self.lr_scale {
            parts.push(format!("lr ×{v}"));
        }
        if let Some(s) = self.schedule {
            parts.push(format!("{s:?} schedule").to_lowercase());
        }
        if !self.milestones.is_empty() {
            parts.push(format!(
                "×{} at epochs {:?}",
                self.gamma.unwrap_or(DEFAULT_GAMMA),
                self.milestones
            ));
        }
        if let Some(v) = self.weight_decay {
            parts.push(format!("weight decay {v}"));
        }
        if let Some(v) = self.lars {
            parts.push(format!("LARS {}", if v { "on" } else { "off" }));
        }
        if let Some(v) = self.clip_grad_norm {
            let each = if self.clip_per_parameter {
                " per parameter"
            } else {
                ""
            };
            parts.push(format!("gradient norm clipped to {v}{each}"));
        }
        if let Some(n) = self.freeze_epochs {
            parts.push(format!("frozen for {n} epoch(s)"));
        }
        if let Some(n) = self.freeze_steps {
            parts.push(format!("frozen for {n} step(s)"));
        }
        format!("{}: {}", self.params.list().join(" "), parts.join(", "))
    }
}

fn is_false(b: &bool) -> bool {
    !b
}

/// `gamma` of a step schedule that does not give one.
pub const DEFAULT_GAMMA: f64 = 0.1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_parse_from_yaml_and_refuse_unknown_keys_and_bad_values() {
        let g: ParamGroup = serde_yaml::from_str(
            "{params: projector., lr: 0.05, schedule: constant, weight_decay: 0, lars: false, \
             clip_grad_norm: 3.0, freeze_epochs: 1}",
        )
        .unwrap();
        g.validate().unwrap();
        assert!(g.matches("projector.0.weight") && !g.matches("encoder.w"));
        assert_eq!(g.schedule, Some(Schedule::Constant));
        let many: ParamGroup = serde_yaml::from_str("{params: [a., b.], lr_scale: 2}").unwrap();
        assert!(many.matches("b.x") && many.matches("a.y") && !many.matches("c."));
        let e = serde_yaml::from_str::<ParamGroup>("{params: a., learning_rate: 1}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `learning_rate`"), "{e}");
        for (yaml, want) in [
            (
                "{params: a., lr: 1, lr_scale: 2}",
                "both `lr` and `lr_scale`",
            ),
            (
                "{params: a., schedule: step}",
                "needs at least one milestone",
            ),
            ("{params: a., milestones: [3]}", "go with `schedule: step`"),
            ("{params: a., clip_grad_norm: 0}", "must be > 0"),
            (
                "{params: a., clip_per_parameter: true}",
                "needs `clip_grad_norm`",
            ),
            ("{params: [], lr: 1}", "at least one prefix"),
        ] {
            let g: ParamGroup = serde_yaml::from_str(yaml).unwrap();
            let e = g.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
