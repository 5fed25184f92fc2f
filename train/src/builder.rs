//! A run configured in code: [`RunConfig::builder`] collects keys and
//! [`RunConfigBuilder::build`] reads them through the same path a YAML recipe takes
//! ([`RunConfig::from_yaml_value`]), so the defaults each data set implies, unknown keys and
//! every value check are the same as on the command line. A config made this way cannot reach
//! the trainer unchecked.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::config::{set_key, RunConfig};

/// Keys of a run, checked when built.
#[derive(Debug, Clone, Default)]
pub struct RunConfigBuilder {
    root: serde_yaml::Value,
    /// The first key that could not be turned into YAML, reported by `build`.
    error: Option<String>,
}

impl RunConfig {
    /// An empty set of keys over the defaults (VICReg on the digits).
    pub fn builder() -> RunConfigBuilder {
        RunConfigBuilder::default()
    }
}

impl RunConfigBuilder {
    /// Sets dotted `key` (as in YAML or `--set`, e.g. `train.lr` or `objective.params.lambda`) to
    /// `value`; a mapping merges into one already set.
    pub fn set(mut self, key: &str, value: impl Serialize) -> Self {
        if self.error.is_some() {
            return self;
        }
        let set = serde_yaml::to_value(value)
            .map_err(anyhow::Error::from)
            .and_then(|value| set_key(&mut self.root, key, value, key));
        if let Err(e) = set {
            self.error = Some(format!("{key}: {e:#}"));
        }
        self
    }

    /// The objective (`objective.name`), e.g. `vicreg`.
    pub fn objective(self, name: &str) -> Self {
        self.set("objective.name", name)
    }

    /// One of the objective's parameters (`objective.params.KEY`, e.g. `lambda`; `ssl describe
    /// NAME` lists them).
    pub fn objective_param(self, key: &str, value: impl Serialize) -> Self {
        self.set(&format!("objective.params.{key}"), value)
    }

    /// The data set (`data.name`), e.g. `digits` or `pathmnist`.
    pub fn data(self, name: &str) -> Self {
        self.set("data.name", name)
    }

    /// The encoder (`model.encoder`), built in or registered.
    pub fn encoder(self, name: &str) -> Self {
        self.set("model.encoder", name)
    }

    /// Training epochs (`train.epochs`).
    pub fn epochs(self, epochs: usize) -> Self {
        self.set("train.epochs", epochs)
    }

    /// Instances per batch (`train.batch_size`).
    pub fn batch_size(self, batch_size: usize) -> Self {
        self.set("train.batch_size", batch_size)
    }

    /// The run seed (`train.seed`).
    pub fn seed(self, seed: u64) -> Self {
        self.set("train.seed", seed)
    }

    /// The run directory (`out`).
    pub fn out(self, dir: impl AsRef<Path>) -> Self {
        self.set("out", dir.as_ref())
    }

    /// The configuration, resolved and checked as a YAML recipe with these keys would be.
    pub fn build(self) -> Result<RunConfig> {
        if let Some(error) = self.error {
            anyhow::bail!("{error}");
        }
        let root = match self.root {
            serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
            root => root,
        };
        RunConfig::from_yaml_value(root).context("the run configuration")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_code_equals_the_same_keys_read_from_yaml() -> Result<()> {
        let built = RunConfig::builder()
            .objective("barlow")
            .data("gmm")
            .epochs(3)
            .batch_size(32)
            .set("train.lr", 0.01)
            .objective_param("lambda", 0.01)
            .build()?;
        let yaml = RunConfig::from_yaml_value(serde_yaml::from_str(
            "{objective: {name: barlow, params: {lambda: 0.01}}, data: {name: gmm}, \
             train: {epochs: 3, batch_size: 32, lr: 0.01}}",
        )?)?;
        assert_eq!(built, yaml);
        Ok(())
    }

    #[test]
    fn bad_keys_and_values_are_errors_at_build_naming_the_key() {
        let unknown = RunConfig::builder()
            .set("train.epoch", 3)
            .build()
            .unwrap_err();
        assert!(format!("{unknown:#}").contains("epoch"), "{unknown:#}");
        let zero = RunConfig::builder().batch_size(0).build().unwrap_err();
        assert!(format!("{zero:#}").contains("batch_size"), "{zero:#}");
        let empty = RunConfig::builder()
            .set("model.projector", Vec::<usize>::new())
            .build()
            .unwrap_err();
        assert!(format!("{empty:#}").contains("projector"), "{empty:#}");
        let param = RunConfig::builder()
            .objective("vicreg")
            .objective_param("lamda", 25.0)
            .build()
            .unwrap_err();
        assert!(format!("{param:#}").contains("lamda"), "{param:#}");
        let encoder = RunConfig::builder().encoder("resnet9").build().unwrap_err();
        assert!(format!("{encoder:#}").contains("resnet9"), "{encoder:#}");
    }
}
