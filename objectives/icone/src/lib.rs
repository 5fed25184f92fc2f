//! IConE: Instance-Contrasted Embeddings — collapse prevention that does not depend on the batch.
//!
//! Spec: `docs/spec/objectives.md` §1.1 (recipe) and §2.1 (loss). Every instance `n` of the
//! training set owns a learnable anchor `E_n` (table `[N, d]`, init `N(0, 0.02²)`, rows
//! normalised on the fly, trained by the same optimiser as the encoder). With `z_i^(v)` the
//! row-normalised backbone output of view `v` of instance `i` (no projector):
//!
//! * `L_vv` ([`view_view`]): mean cosine distance between the views of an instance;
//! * `L_vi` ([`view_instance`]): mean cosine distance between each view and its anchor;
//! * `L_div` ([`squared_hinge_diversity`]): squared positive cosine between distinct anchors,
//!   over the **whole table** every step, swept in tiles (memory `O(N·d + tile²)`).
//!
//! `L = L_vv + L_vi + L_div`; each term can be switched off for the paper's ablations, and the
//! repulsion can be replaced by IConE-VC or IConE-SIG ([`regularizers`]). Because the repulsion
//! lives in the table, `B = 1` is valid (with `V ≥ 2`). Supervised forms: IConE-Class (one
//! prototype per class) and IConE-Instance (instance table, anchors pooled per class, repulsion
//! across classes only).
//!
//! Choices the paper leaves open (spec §1.1): the table is in the weight-decayed group (what
//! `AdamW(model.parameters())` does); Adam's betas, warm-up and minimum learning rate are the
//! run's.
//!
//! # Example
//!
//! Spec §2.1's known answer: two views of instances 0 and 2 against a table `E` of three
//! instance embeddings. Neither the views' nor the table's scale matters.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use ssl_icone::icone_loss;
//!
//! let dev = &Device::Cpu;
//! let f = Tensor::new(
//!     &[[[1f64, 2., 2.], [0., 3., 4.]], [[2., 1., 2.], [0., 4., 3.]]],
//!     dev,
//! )?; // [V, B, d]
//! let e = Tensor::new(&[[1f64, 0., 1.], [0., 1., 0.], [1., 1., 0.]], dev)?; // [N, d]
//! let ids = Tensor::new(&[0u32, 2], dev)?;
//! let loss = icone_loss(&f, &e, &ids)?.to_scalar::<f64>()?;
//! assert!((loss - 0.6655892264).abs() < 1e-9);
//! let rescaled = icone_loss(&(&f * 3.0)?, &(&e * 0.5)?, &ids)?.to_scalar::<f64>()?;
//! assert!((rescaled - loss).abs() < 1e-12);
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod diversity;
pub mod regularizers;

use anyhow::{bail, ensure, Context, Result};
use candle_core::Tensor;
use candle_nn::Init;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

pub use diversity::{squared_hinge_diversity, Diversity, DEFAULT_TILE};
pub use regularizers::{covariance_penalty, sliced_epps_pulley, variance_hinge};
pub use ssl_linalg::normalize_rows;

/// `L_vv` of the row-normalised views `z`: `[V, B, d]`:
/// `(1/B) Σ_i 2/(V(V−1)) Σ_{m<n} (1 − ⟨z_i^(m), z_i^(n)⟩)`, computed in `O(V·B·d)` from
/// `Σ_{m<n} ⟨z^(m), z^(n)⟩ = (‖Σ_v z^(v)‖² − Σ_v ‖z^(v)‖²)/2`.
pub fn view_view(z: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, _) = z.dims3()?;
    if v < 2 {
        candle_core::bail!("L_vv needs at least two views, got {v}");
    }
    let pair_dots = ((z.sum(0)?.sqr()?.sum_all()? - z.sqr()?.sum_all()?)? / 2.0)?;
    let pairs = (b * v * (v - 1) / 2) as f64;
    (pair_dots / -pairs)? + 1.0
}

/// `L_vi` of the row-normalised views `z`: `[V, B, d]` and each instance's normalised anchor
/// `anchors`: `[B, d]`: `(1/(B·V)) Σ_i Σ_v (1 − ⟨z_i^(v), a_i⟩)`.
pub fn view_instance(z: &Tensor, anchors: &Tensor) -> candle_core::Result<Tensor> {
    let (v, b, _) = z.dims3()?;
    let dots = (z.sum(0)? * anchors)?.sum_all()?;
    (dots / -((b * v) as f64))? + 1.0
}

/// IConE-Instance's anchors: `ē_c = mean_{n: y_n = c} ẽ_n` (not re-normalised), `[C, d]`, of the
/// normalised table `e`: `[N, d]`, given the class `pooling` matrix of [`class_pooling`].
pub fn class_mean_anchors(e: &Tensor, pooling: &Tensor) -> candle_core::Result<Tensor> {
    pooling.matmul(e)
}

/// `[C, N]` matrix with `1/n_c` where `y_n = c`: left-multiplying a table averages it per class.
pub fn class_pooling(
    labels: &[u32],
    classes: usize,
    device: &candle_core::Device,
) -> Result<Tensor> {
    let mut counts = vec![0f32; classes];
    for &y in labels {
        ensure!(
            (y as usize) < classes,
            "instance label {y} outside the {classes} classes"
        );
        counts[y as usize] += 1.0;
    }
    let n = labels.len();
    let mut m = vec![0f32; classes * n];
    for (i, &y) in labels.iter().enumerate() {
        m[y as usize * n + i] = 1.0 / counts[y as usize];
    }
    Ok(Tensor::from_vec(m, (classes, n), device)?)
}

/// `L_vv + L_vi + L_div` for backbone outputs `f`: `[V, B, d]`, the raw table `e`: `[N, d]` and
/// the batch's instance ids `ids`: `[B]` (spec §2.1's unsupervised loss, all terms on).
pub fn icone_loss(f: &Tensor, e: &Tensor, ids: &Tensor) -> candle_core::Result<Tensor> {
    let z = normalize_rows(f)?;
    let table = normalize_rows(e)?;
    let anchors = table.index_select(ids, 0)?;
    view_view(&z)?
        + view_instance(&z, &anchors)?
        + squared_hinge_diversity(&table, DEFAULT_TILE, None)?
}

/// What keeps the table from collapsing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Regularizer {
    /// `L_div`, the squared hinge on the table's Gram (IConE).
    Div,
    /// Variance hinge + covariance penalty on the normalised table (IConE-VC, eq. 8).
    Vc,
    /// Sliced Epps–Pulley on the standardised raw table (IConE-SIG).
    Sig,
    /// Nothing (the "no L_div" ablation).
    None,
}

/// Where each view's anchor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchors {
    /// Row `id_i` of an `N`-row instance table (IConE).
    Instances,
    /// Row `y_i` of a `C`-row prototype table (IConE-Class).
    Classes,
    /// The mean of the normalised rows of class `y_i` of an `N`-row instance table; repulsion
    /// only across classes (IConE-Instance).
    PooledInstances,
}

/// IConE hyper-parameters (paper defaults: every term on, weight 1, σ = 0.02).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IconeConfig {
    /// Include `L_vv` (needs V ≥ 2).
    pub view_view: bool,
    /// Include `L_vi`.
    pub view_instance: bool,
    /// `div` (IConE), `vc` (IConE-VC), `sig` (IConE-SIG) or `none`.
    pub regularizer: Regularizer,
    /// Standard deviation of the table's normal initialisation.
    pub init_std: f64,
    /// Random slices per step of the `sig` regulariser.
    pub slices: usize,
    /// Block side of the tiled `L_div` sweep.
    pub tile: usize,
}

impl Default for IconeConfig {
    fn default() -> Self {
        Self {
            view_view: true,
            view_instance: true,
            regularizer: Regularizer::Div,
            init_std: 0.02,
            slices: 256,
            tile: DEFAULT_TILE,
        }
    }
}

impl IconeConfig {
    fn check(&self, anchors: Anchors) -> Result<()> {
        ensure!(
            self.init_std.is_finite() && self.init_std > 0.0,
            "`init_std` must be a positive standard deviation, got {}",
            self.init_std
        );
        ensure!(self.slices >= 1, "`slices` must be at least 1");
        ensure!(self.tile >= 1, "`tile` must be at least 1");
        ensure!(
            self.view_view || self.view_instance || self.regularizer != Regularizer::None,
            "every term is switched off; keep at least one of `view_view`, `view_instance`, `regularizer`"
        );
        if anchors != Anchors::Instances {
            ensure!(
                matches!(self.regularizer, Regularizer::Div | Regularizer::None),
                "the supervised IConE forms take `regularizer: div` or `none`, got `{}`",
                serde_yaml::to_string(&self.regularizer)?.trim()
            );
        }
        Ok(())
    }

    fn build_with(&self, anchors: Anchors, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        if self.view_view && ctx.views < 2 {
            bail!(
                "L_vv (view_view) compares the views of an instance and needs --views 2 or more, got --views {}; \
                 use --views 2, or drop the term with --set objective.params.view_view=false",
                ctx.views
            );
        }
        let d = ctx.feature_dim;
        let init = Init::Randn {
            mean: 0.0,
            stdev: self.init_std,
        };
        let device = ctx.vb.device().clone();
        let (table, labels, pooling) = match anchors {
            Anchors::Instances => (
                ctx.vb
                    .get_with_hints((ctx.num_instances, d), "table", init)?,
                None,
                None,
            ),
            Anchors::Classes => {
                let Some(classes) = ctx.num_classes else {
                    bail!(
                        "IConE-Class keeps one prototype per class, but the data set has no labels"
                    );
                };
                (
                    ctx.vb.get_with_hints((classes, d), "prototypes", init)?,
                    None,
                    None,
                )
            }
            Anchors::PooledInstances => {
                let (Some(labels), Some(classes)) = (ctx.instance_labels, ctx.num_classes) else {
                    bail!("IConE-Instance pools anchors by class, but the data set has no labels");
                };
                ensure!(
                    labels.len() == ctx.num_instances,
                    "{} instance labels for a table of {} rows",
                    labels.len(),
                    ctx.num_instances
                );
                let pooling = class_pooling(labels, classes, &device)?;
                let labels = Tensor::new(labels, &device)?;
                (
                    ctx.vb
                        .get_with_hints((ctx.num_instances, d), "table", init)?,
                    Some(labels),
                    Some(pooling),
                )
            }
        };
        let diversity = match self.regularizer {
            Regularizer::Div => Some(
                Diversity::new(table.dim(0)?, self.tile, labels.as_ref())
                    .context("IConE's L_div (regularizer: div)")?,
            ),
            _ => None,
        };
        Ok(Box::new(Icone {
            cfg: self.clone(),
            anchors,
            table,
            diversity,
            pooling,
        }))
    }
}

/// The IConE objective in any of its forms.
pub struct Icone {
    cfg: IconeConfig,
    anchors: Anchors,
    /// The raw table `[N, d]` (or prototypes `[C, d]`), a trainable variable.
    table: Tensor,
    /// `L_div` of the table (its rows' classes under IConE-Instance), with `regularizer: div`.
    diversity: Option<Diversity>,
    /// Class pooling `[C, N]` (IConE-Instance).
    pooling: Option<Tensor>,
}

impl Icone {
    fn name(&self) -> &'static str {
        match self.anchors {
            Anchors::Instances => "icone",
            Anchors::Classes => "icone-class",
            Anchors::PooledInstances => "icone-instance",
        }
    }

    /// The normalised anchors of the batch, `[B, d]`.
    fn batch_anchors(&self, table: &Tensor, batch: &Batch<'_>) -> Result<Tensor> {
        // What indexes the anchors, and how many anchors there are.
        let (index, what, anchors, unit) = match &self.pooling {
            None if self.anchors == Anchors::Instances => (
                batch.indices,
                "instance id",
                table.dim(0)?,
                "training instances",
            ),
            None => (
                batch.require_labels(self.name())?,
                "class label",
                table.dim(0)?,
                "classes",
            ),
            Some(pooling) => (
                batch.require_labels(self.name())?,
                "class label",
                pooling.dim(0)?,
                "classes",
            ),
        };
        index.check_below(anchors, |value| {
            format!(
                "{what} {value} is outside the {anchors}-row table of `{}`; the table was built for a data set of \
                 {anchors} {unit}. Train and resume on the same data set (and subset)",
                self.name(),
            )
        })?;
        let index = index.tensor();
        Ok(match &self.pooling {
            Some(pooling) => class_mean_anchors(table, pooling)?.index_select(index, 0)?,
            None => table.index_select(index, 0)?,
        })
    }
}

impl Objective for Icone {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_views: if self.cfg.view_view { 2 } else { 1 },
            min_batch: 1,
            labels: self.anchors != Anchors::Instances,
            projector: false,
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = normalize_rows(batch.projections)?;
        let table = normalize_rows(&self.table)?;
        let mut terms: Vec<(String, Tensor)> = Vec::new();
        if self.cfg.view_view {
            terms.push(("view_view".into(), view_view(&z)?));
        }
        if self.cfg.view_instance {
            let anchors = self.batch_anchors(&table, batch)?.to_dtype(z.dtype())?;
            terms.push(("view_instance".into(), view_instance(&z, &anchors)?));
        }
        match self.cfg.regularizer {
            Regularizer::Div => {
                let diversity = self.diversity.as_ref().expect("built with regularizer div");
                terms.push(("diversity".into(), diversity.loss(&table)?));
            }
            Regularizer::Vc => {
                terms.push(("variance".into(), variance_hinge(&table, 1.0, 1e-4)?));
                terms.push(("covariance".into(), covariance_penalty(&table)?));
            }
            Regularizer::Sig => {
                let mut rng = batch.progress.rng(0x51c);
                let d = self.table.dim(1)?;
                let directions = regularizers::random_directions(
                    d,
                    self.cfg.slices,
                    &mut rng,
                    self.table.device(),
                )?;
                terms.push(("sig".into(), sliced_epps_pulley(&self.table, &directions)?));
            }
            Regularizer::None => {}
        }
        let dtype = terms[0].1.dtype();
        let mut loss = terms[0].1.clone();
        for (_, t) in &terms[1..] {
            loss = (loss + t.to_dtype(dtype)?)?;
        }
        Ok(LossOutput { loss, terms })
    }
}

/// `given` (a YAML mapping, or null) over `defaults`; unknown keys stay errors.
fn with_defaults(defaults: &IconeConfig, given: serde_yaml::Value) -> Result<IconeConfig, String> {
    let mut merged = match serde_yaml::to_value(defaults).map_err(|e| e.to_string())? {
        serde_yaml::Value::Mapping(m) => m,
        _ => unreachable!("a struct serialises to a mapping"),
    };
    match given {
        serde_yaml::Value::Null => {}
        serde_yaml::Value::Mapping(m) => merged.extend(m),
        other => return Err(format!("expected a mapping of keys, got {other:?}")),
    }
    serde_yaml::from_value(serde_yaml::Value::Mapping(merged)).map_err(|e| e.to_string())
}

/// Declares a registered form of IConE: a config newtype with its own defaults and anchors.
macro_rules! icone_form {
    ($(#[$doc:meta])* $config:ident, $anchors:expr, $regularizer:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Serialize)]
        #[serde(transparent)]
        pub struct $config(pub IconeConfig);

        /// Keys absent from the input take this form's defaults (not [`IconeConfig`]'s).
        impl<'de> Deserialize<'de> for $config {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let given = serde_yaml::Value::deserialize(d)?;
                with_defaults(&$config::default().0, given)
                    .map(Self)
                    .map_err(serde::de::Error::custom)
            }
        }

        impl Default for $config {
            fn default() -> Self {
                Self(IconeConfig {
                    regularizer: $regularizer,
                    ..IconeConfig::default()
                })
            }
        }

        impl ObjectiveConfig for $config {
            fn validate(&self) -> Result<()> {
                self.0.check($anchors)
            }
            fn build(&self, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
                self.0.build_with($anchors, ctx)
            }
        }
    };
}

icone_form!(
    /// IConE (instance table, `L_div`).
    IconeDefault, Anchors::Instances, Regularizer::Div
);
icone_form!(
    /// IConE-VC (instance table, variance/covariance on the table).
    IconeVc, Anchors::Instances, Regularizer::Vc
);
icone_form!(
    /// IConE-SIG (instance table, sliced Epps–Pulley on the table).
    IconeSig, Anchors::Instances, Regularizer::Sig
);
icone_form!(
    /// IConE-Class (one prototype per class).
    IconeClass, Anchors::Classes, Regularizer::Div
);
icone_form!(
    /// IConE-Instance (instance table pooled per class, cross-class repulsion).
    IconeInstance, Anchors::PooledInstances, Regularizer::Div
);

const PAPER: &str = "IConE: batch-independent collapse prevention with instance-contrasted embeddings (learnable instance table; Appendix C.1 variants, Appendix E synthetic study)";

const KEYS: &[ConfigKey] = &[
    ConfigKey {
        name: "view_view",
        doc: "include L_vv, the view–view consistency (needs V ≥ 2)",
    },
    ConfigKey {
        name: "view_instance",
        doc: "include L_vi, the view–anchor alignment",
    },
    ConfigKey {
        name: "regularizer",
        doc: "div (L_div) | vc (IConE-VC) | sig (IConE-SIG) | none; supervised forms: div | none",
    },
    ConfigKey {
        name: "init_std",
        doc: "standard deviation σ of the table's N(0, σ²) initialisation",
    },
    ConfigKey {
        name: "slices",
        doc: "random directions per step of the sig regulariser (256, as LeJEPA's minimal example)",
    },
    ConfigKey {
        name: "tile",
        doc: "block side of the tiled L_div sweep (memory O(N·d + tile²))",
    },
];

register_objective! {
    name: "icone",
    aliases: &["instance-contrasted-embeddings"],
    summary: "Views agree with each other and with a learnable per-instance anchor; anchors repel over the whole table (works at B = 1)",
    paper: PAPER,
    keys: KEYS,
    config: IconeDefault,
}

register_objective! {
    name: "icone-vc",
    aliases: &[],
    summary: "IConE with VICReg-style variance/covariance on the table instead of L_div",
    paper: PAPER,
    keys: KEYS,
    config: IconeVc,
}

register_objective! {
    name: "icone-sig",
    aliases: &[],
    summary: "IConE with sliced Epps–Pulley (SIGReg) on the table instead of L_div",
    paper: PAPER,
    keys: KEYS,
    config: IconeSig,
}

register_objective! {
    name: "icone-class",
    aliases: &[],
    summary: "Supervised IConE: views align with a learnable prototype of their class; prototypes repel",
    paper: PAPER,
    keys: KEYS,
    config: IconeClass,
}

register_objective! {
    name: "icone-instance",
    aliases: &[],
    summary: "Supervised IConE: instance table, anchors pooled per class, repulsion across classes only",
    paper: PAPER,
    keys: KEYS,
    config: IconeInstance,
}

#[cfg(test)]
mod tests;
