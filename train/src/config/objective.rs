//! `objective:` — the objective and its parameters, resolved against its paper defaults and
//! fitted to the run.

use anyhow::{bail, ensure, Result};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectiveSection {
    pub name: String,
    /// Objective keys (see `ssl describe NAME`); absent keys take the paper's defaults.
    pub params: serde_yaml::Value,
    /// The keys [`Self::resolve`] filled with the paper's defaults: the ones
    /// [`Self::fit_to_data`] may change. A resolved `config.yaml` gives every key, so a resumed
    /// run keeps the values it was fitted to.
    #[serde(skip)]
    pub defaulted: Vec<String>,
    /// The keys [`Self::fit_to_data`] changed, with the paper defaults they replaced: `params`
    /// holds what the run used, this what it was asked ([`Self::as_requested`]).
    #[serde(default, skip_serializing_if = "serde_yaml::Mapping::is_empty")]
    pub fitted: serde_yaml::Mapping,
}

impl ObjectiveSection {
    /// Fills the keys absent from `params` with the objective's defaults, so the resolved
    /// `config.yaml` records every hyperparameter the run used (and `ssl compare` notices when a
    /// default changes), then checks them as the objective's build will: a key it does not
    /// know, or a value out of range, is an error naming it.
    pub fn resolve(&mut self) -> Result<()> {
        ensure!(
            !self.name.trim().is_empty(),
            "objective.name is empty; name an objective (`ssl list` shows them; default vicreg)"
        );
        let registration = ssl_core::find(&self.name)?;
        let mut resolved = match (registration.default_config)() {
            serde_yaml::Value::Mapping(defaults) => defaults,
            _ => serde_yaml::Mapping::new(),
        };
        let given = |key: &serde_yaml::Value| self.params.get(key).is_some();
        self.defaulted = (resolved.keys())
            .filter(|key| !given(key))
            .filter_map(|key| key.as_str().map(str::to_string))
            .collect();
        match &self.params {
            serde_yaml::Value::Null => {}
            serde_yaml::Value::Mapping(given) => {
                for (key, value) in given {
                    resolved.insert(key.clone(), value.clone());
                }
            }
            other => bail!(
                "objective.params must be a mapping of keys (see `ssl describe {}`), got `{}`",
                self.name,
                serde_yaml::to_string(other).unwrap_or_default().trim()
            ),
        }
        self.params = serde_yaml::Value::Mapping(resolved);
        (registration.check)(&self.params)
    }

    /// Fits the defaulted keys that make no sense for `run` (prototypes or a queue beyond
    /// the training set, a head far wider than its input) to it; returns what changed, one
    /// sentence a change.
    pub fn fit_to_data(&mut self, run: &ssl_core::RunFacts) -> Result<Vec<String>> {
        let registration = ssl_core::find(&self.name)?;
        let defaulted = |key: &str| self.defaulted.iter().any(|k| k == key);
        let (params, notes) = (registration.fit_to_data)(&self.params, run, &defaulted)?;
        for (key, asked) in self.params.as_mapping().into_iter().flatten() {
            if params.get(key) != Some(asked) {
                self.fitted.insert(key.clone(), asked.clone());
            }
        }
        self.params = params;
        Ok(notes)
    }

    /// The section as it was asked for: the fitted keys back at their paper defaults. Two runs
    /// asked the same way compare equal through it, whatever their data fitted.
    pub fn as_requested(&self) -> Self {
        let mut params = self.params.clone();
        if let Some(map) = params.as_mapping_mut() {
            for (key, asked) in &self.fitted {
                map.insert(key.clone(), asked.clone());
            }
        }
        Self {
            name: self.name.clone(),
            params,
            defaulted: self.defaulted.clone(),
            fitted: serde_yaml::Mapping::new(),
        }
    }
}

impl Default for ObjectiveSection {
    fn default() -> Self {
        Self {
            name: "vicreg".into(),
            params: serde_yaml::Value::Mapping(Default::default()),
            defaulted: Vec::new(),
            fitted: serde_yaml::Mapping::new(),
        }
    }
}
