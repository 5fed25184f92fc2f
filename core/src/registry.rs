//! Registration records collected with `inventory` from every linked objective crate.

use anyhow::{anyhow, bail, Context, Result};

use crate::{
    BuildContext, Objective, ObjectiveConfig, ParamStore, Patches, Requirements, RunFacts,
};

/// One documented configuration key of an objective (shown by `ssl describe`).
#[derive(Debug, Clone, Copy)]
pub struct ConfigKey {
    pub name: &'static str,
    pub doc: &'static str,
}

/// Training instances of the reference run that [`Registration::requirements`] builds for
/// (about the digits' training set).
pub const REFERENCE_INSTANCES: usize = 1_000;

/// How an objective makes itself known. Submit one with [`crate::register_objective!`].
pub struct Registration {
    /// Canonical name used on the command line (`ssl run --objective NAME`).
    pub name: &'static str,
    /// Other accepted names.
    pub aliases: &'static [&'static str],
    /// One line for `ssl list`.
    pub summary: &'static str,
    /// Paper citation (authors, title, venue, year).
    pub paper: &'static str,
    /// Documented config keys, in display order.
    pub keys: &'static [ConfigKey],
    /// The default configuration as YAML (the paper's defaults).
    pub default_config: fn() -> serde_yaml::Value,
    /// Parses and validates a YAML mapping of overrides without building: a run's configuration
    /// is checked with it before any data is read.
    pub check: fn(&serde_yaml::Value) -> Result<()>,
    /// Parses, validates and builds from a YAML mapping of overrides.
    pub build: fn(&serde_yaml::Value, &BuildContext<'_>) -> Result<Box<dyn Objective>>,
    /// [`ObjectiveConfig::fit_to_data`] on a YAML mapping: the mapping with the fitted keys, and
    /// the sentences saying what changed.
    pub fit_to_data: FitToData,
}

/// [`Registration::fit_to_data`]: a YAML mapping, the run, which keys were left at their
/// defaults → the fitted mapping and what changed.
pub type FitToData = fn(
    &serde_yaml::Value,
    &RunFacts,
    &dyn Fn(&str) -> bool,
) -> Result<(serde_yaml::Value, Vec<String>)>;

inventory::collect!(Registration);

impl Registration {
    /// Whether `name` is this objective's name or one of its aliases (case-insensitive).
    pub fn answers_to(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
            || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }

    /// The objective's limits with `params` (its views, smallest batch, labels, teacher, …),
    /// read from an instance built for a reference run: batches of `batch_size` from a data set
    /// of [`REFERENCE_INSTANCES`] (or one batch, if more) in 2 classes, on 2 views of 8-wide
    /// projections (narrow, since some objectives bound the width by a batch: W-MSE) and
    /// a ViT/16 on 224-px RGB images (an objective that decodes pixels builds for its patches,
    /// one that masks blocks checks them on its 14 × 14 grid), on the CPU. `ssl describe`
    /// prints them; `ssl compare --smoke` sizes its batches by them.
    pub fn requirements(
        &self,
        params: &serde_yaml::Value,
        batch_size: usize,
    ) -> Result<Requirements> {
        let store = ParamStore::new(0);
        let num_instances = batch_size.max(REFERENCE_INSTANCES);
        let labels: Vec<u32> = (0..num_instances as u32).map(|i| i % 2).collect();
        let ctx = BuildContext {
            vb: store.var_builder(&candle_core::Device::Cpu).pp("objective"),
            num_instances,
            patches: Some(Patches {
                size: 16,
                channels: 3,
                image: (224, 224),
            }),
            num_classes: Some(2),
            instance_labels: Some(&labels),
            projection_dim: 8,
            feature_dim: 8,
            views: 2,
            global_views: 2,
            batch_size,
        };
        Ok((self.build)(params, &ctx)?.requirements())
    }
}

/// The typed defaults of `C` as YAML.
pub fn default_config_of<C: ObjectiveConfig>() -> serde_yaml::Value {
    serde_yaml::to_value(C::default()).expect("objective configs serialise to YAML")
}

/// Parses `C` from a YAML mapping (missing keys default, unknown keys are errors) and validates.
pub fn parse_config<C: ObjectiveConfig>(name: &str, value: &serde_yaml::Value) -> Result<C> {
    let value = match value {
        serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
        v => v.clone(),
    };
    let config: C = serde_yaml::from_value(value)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| {
            format!("invalid configuration for objective `{name}` (see `ssl describe {name}`)")
        })?;
    config
        .validate()
        .with_context(|| format!("invalid configuration for objective `{name}`"))?;
    Ok(config)
}

/// Parses, validates and builds `C`; the `build` entry of a [`Registration`].
pub fn build_from<C: ObjectiveConfig>(
    name: &str,
    value: &serde_yaml::Value,
    ctx: &BuildContext<'_>,
) -> Result<Box<dyn Objective>> {
    parse_config::<C>(name, value)?.build(ctx)
}

/// Parses `C`, fits its defaulted keys to `data` and serialises it back; the `fit_to_data`
/// entry of a [`Registration`].
pub fn fit_from<C: ObjectiveConfig>(
    name: &str,
    value: &serde_yaml::Value,
    data: &RunFacts,
    defaulted: &dyn Fn(&str) -> bool,
) -> Result<(serde_yaml::Value, Vec<String>)> {
    let mut config = parse_config::<C>(name, value)?;
    let notes = config.fit_to_data(data, defaulted);
    if notes.is_empty() {
        return Ok((value.clone(), notes));
    }
    config
        .validate()
        .with_context(|| format!("objective `{name}` fitted to the data set"))?;
    Ok((serde_yaml::to_value(&config)?, notes))
}

/// All linked objectives, sorted by name.
pub fn registry() -> Vec<&'static Registration> {
    let mut all: Vec<_> = inventory::iter::<Registration>.into_iter().collect();
    all.sort_by_key(|r| r.name);
    all
}

/// Finds an objective by name or alias; an unknown name gets the closest known one suggested.
pub fn find(name: &str) -> Result<&'static Registration> {
    let all = registry();
    if let Some(r) = all.iter().find(|r| r.answers_to(name)) {
        return Ok(r);
    }
    let lower = name.to_ascii_lowercase();
    let closest = all
        .iter()
        .flat_map(|r| std::iter::once(r.name).chain(r.aliases.iter().copied()))
        .map(|n| (strsim::jaro_winkler(&lower, &n.to_ascii_lowercase()), n))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let known: Vec<_> = all.iter().map(|r| r.name).collect();
    match closest {
        Some((score, n)) if score > 0.7 => bail!(
            "unknown objective `{name}`; did you mean `{n}`? (known: {}; see `ssl list`)",
            known.join(", ")
        ),
        _ => bail!(
            "unknown objective `{name}` (known: {}; see `ssl list`)",
            known.join(", ")
        ),
    }
}

/// Registers an objective:
///
/// ```ignore
/// ssl_core::register_objective! {
///     name: "vicreg", aliases: &[], summary: "…", paper: "…",
///     keys: &[ConfigKey { name: "lambda", doc: "invariance weight" }],
///     config: VicregConfig,
/// }
/// ```
#[macro_export]
macro_rules! register_objective {
    (name: $name:expr, aliases: $aliases:expr, summary: $summary:expr, paper: $paper:expr,
     keys: $keys:expr, config: $config:ty $(,)?) => {
        $crate::inventory::submit! {
            $crate::Registration {
                name: $name,
                aliases: $aliases,
                summary: $summary,
                paper: $paper,
                keys: $keys,
                default_config: $crate::registry::default_config_of::<$config>,
                check: |value| $crate::registry::parse_config::<$config>($name, value).map(drop),
                build: |value, ctx| $crate::registry::build_from::<$config>($name, value, ctx),
                fit_to_data: |value, data, defaulted| {
                    $crate::registry::fit_from::<$config>($name, value, data, defaulted)
                },
            }
        }
    };
}
