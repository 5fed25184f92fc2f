//! Configurations, objectives and registrations. Every registered name is one generic config
//! ([`SimclrConfigOf`] or [`DclConfigOf`]) instantiated with a [`Preset`] that fixes its defaults.

use std::marker::PhantomData;

use anyhow::Result;
use serde::{Deserialize, Serialize};
use ssl_core::{
    register_objective, Batch, BuildContext, ConfigKey, LossOutput, Objective, ObjectiveConfig,
    Requirements,
};

use crate::dcl::{dcl_terms, Weighting};
use crate::nt_xent::nt_xent_with;
use crate::similarity::{Preprocess, Similarity};

/// The defaults one registered name gives its config.
pub trait Preset: Send + Sync + 'static {
    /// Default temperature τ.
    const TEMPERATURE: f64;
    /// Default similarity function `f`.
    const SIMILARITY: Similarity;
    /// Default preprocessing (SimCLR only).
    const PREPROCESS: Preprocess = Preprocess::None;
}

/// The presets of the registered names.
pub mod presets {
    use super::{Preprocess, Preset, Similarity};

    macro_rules! preset {
        ($(#[$doc:meta])* $name:ident, $tau:expr, $f:ident $(, $p:ident)?) => {
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $name;
            impl Preset for $name {
                const TEMPERATURE: f64 = $tau;
                const SIMILARITY: Similarity = Similarity::$f;
                $(const PREPROCESS: Preprocess = Preprocess::$p;)?
            }
        };
    }

    preset!(/// `simclr`: τ = 0.5, cosine similarity.
        Simclr, 0.5, Identity);
    preset!(/// `simclr-abs`: `f(x) = |x|`.
        SimclrAbs, 0.5, Abs);
    preset!(/// `simclr-sq`: `f(x) = x²`.
        SimclrSq, 0.5, Sq);
    preset!(/// `simclr-centred`: scenario A.
        SimclrCentred, 0.5, Identity, Centre);
    preset!(/// `simclr-standardized`: scenario B.
        SimclrStandardized, 0.5, Identity, Standardize);
    preset!(/// `dcl`: τ = 0.1, cosine similarity.
        Dcl, 0.1, Identity);
    preset!(/// `dcl-abs`: `f(x) = |x|`.
        DclAbs, 0.1, Abs);
    preset!(/// `dcl-sq`: `f(x) = x²`.
        DclSq, 0.1, Sq);
}

fn check_temperature(temperature: f64) -> Result<()> {
    anyhow::ensure!(
        temperature.is_finite() && temperature > 0.0,
        "`temperature` must be a finite number > 0, got {temperature}"
    );
    Ok(())
}

/// NT-Xent hyper-parameters; `P` sets the defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, bound = "")]
pub struct SimclrConfigOf<P: Preset> {
    /// Temperature τ.
    pub temperature: f64,
    /// Similarity function `f`: `identity`, `abs` or `sq`.
    pub similarity: Similarity,
    /// Preprocessing: `none` (row-normalise), `centre` (scenario A), `standardize` (scenario B).
    pub preprocess: Preprocess,
    #[serde(skip)]
    preset: PhantomData<fn() -> P>,
}

impl<P: Preset> Default for SimclrConfigOf<P> {
    fn default() -> Self {
        Self {
            temperature: P::TEMPERATURE,
            similarity: P::SIMILARITY,
            preprocess: P::PREPROCESS,
            preset: PhantomData,
        }
    }
}

impl<P: Preset> ObjectiveConfig for SimclrConfigOf<P> {
    fn validate(&self) -> Result<()> {
        check_temperature(self.temperature)
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Simclr {
            temperature: self.temperature,
            similarity: self.similarity,
            preprocess: self.preprocess,
        }))
    }
}

/// Config of `simclr` (τ = 0.5, identity, row normalisation).
pub type SimclrConfig = SimclrConfigOf<presets::Simclr>;
/// Config of `simclr-abs`.
pub type SimclrAbsConfig = SimclrConfigOf<presets::SimclrAbs>;
/// Config of `simclr-sq`.
pub type SimclrSqConfig = SimclrConfigOf<presets::SimclrSq>;
/// Config of `simclr-centred`.
pub type SimclrCentredConfig = SimclrConfigOf<presets::SimclrCentred>;
/// Config of `simclr-standardized`.
pub type SimclrStandardizedConfig = SimclrConfigOf<presets::SimclrStandardized>;

/// The SimCLR objective (any similarity, any preprocessing).
#[derive(Debug, Clone)]
pub struct Simclr {
    pub temperature: f64,
    pub similarity: Similarity,
    pub preprocess: Preprocess,
}

impl Objective for Simclr {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason: match self.preprocess {
                Preprocess::None => "each anchor needs at least one negative from another instance",
                _ => "each anchor needs a negative from another instance, and centring over the batch needs two instances",
            },
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let loss = nt_xent_with(&z, self.temperature, self.similarity, self.preprocess)?;
        Ok(LossOutput::new(loss.clone()).with_term("nt_xent", loss))
    }
}

/// DCL hyper-parameters; `P` sets the defaults.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, bound = "")]
pub struct DclConfigOf<P: Preset> {
    /// Temperature τ.
    pub temperature: f64,
    /// Similarity function `f`: `identity`, `abs` or `sq`.
    pub similarity: Similarity,
    /// Positive-term weighting: `none` or `dclw`.
    pub weighting: Weighting,
    /// Width σ of the DCL-W weights (used only with `weighting: dclw`).
    pub sigma: f64,
    #[serde(skip)]
    preset: PhantomData<fn() -> P>,
}

impl<P: Preset> Default for DclConfigOf<P> {
    fn default() -> Self {
        Self {
            temperature: P::TEMPERATURE,
            similarity: P::SIMILARITY,
            weighting: Weighting::None,
            sigma: 0.5,
            preset: PhantomData,
        }
    }
}

impl<P: Preset> ObjectiveConfig for DclConfigOf<P> {
    fn validate(&self) -> Result<()> {
        check_temperature(self.temperature)?;
        anyhow::ensure!(
            self.sigma.is_finite() && self.sigma > 0.0,
            "`sigma` must be a finite number > 0, got {}",
            self.sigma
        );
        Ok(())
    }
    fn build(&self, _ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
        Ok(Box::new(Dcl {
            temperature: self.temperature,
            similarity: self.similarity,
            weighting: self.weighting,
            sigma: self.sigma,
        }))
    }
}

/// Config of `dcl` (τ = 0.1, identity, no weighting).
pub type DclConfig = DclConfigOf<presets::Dcl>;
/// Config of `dcl-abs`.
pub type DclAbsConfig = DclConfigOf<presets::DclAbs>;
/// Config of `dcl-sq`.
pub type DclSqConfig = DclConfigOf<presets::DclSq>;

/// The DCL objective (any similarity, optional DCL-W weighting).
#[derive(Debug, Clone)]
pub struct Dcl {
    pub temperature: f64,
    pub similarity: Similarity,
    pub weighting: Weighting,
    pub sigma: f64,
}

impl Objective for Dcl {
    fn requirements(&self) -> Requirements {
        Requirements {
            min_batch: 2,
            min_batch_reason:
                "the negatives are the other instances; with one the log-sum-exp is empty",
            ..Requirements::default()
        }
    }

    fn loss(&mut self, batch: &Batch<'_>) -> Result<LossOutput> {
        let z = batch.collective.all_gather(batch.projections, 1)?;
        let t = dcl_terms(
            &z,
            self.temperature,
            self.similarity,
            self.weighting,
            self.sigma,
        )?;
        Ok(LossOutput::new(t.loss()?)
            .with_term("alignment", t.alignment)
            .with_term("contrast", t.contrast))
    }
}

const SIMCLR_KEYS: &[ConfigKey] = &[
    ConfigKey { name: "temperature", doc: "softmax temperature τ" },
    ConfigKey { name: "similarity", doc: "f applied to every similarity before /τ: identity | abs | sq" },
    ConfigKey {
        name: "preprocess",
        doc: "none (row-normalise) | centre (per-view batch centring, then row-normalise) | standardize (per-view centring, columns scaled to norm √(N/d), raw dot products)",
    },
];

const DCL_KEYS: &[ConfigKey] = &[
    ConfigKey {
        name: "temperature",
        doc: "softmax temperature τ",
    },
    ConfigKey {
        name: "similarity",
        doc: "f applied to every cosine similarity before /τ: identity | abs | sq",
    },
    ConfigKey {
        name: "weighting",
        doc: "positive-term weighting: none | dclw (w = 2 − B·softmax(cos/σ), detached)",
    },
    ConfigKey {
        name: "sigma",
        doc: "σ of the DCL-W weights",
    },
];

const SIMCLR_PAPER: &str = "Chen, Kornblith, Norouzi, Hinton. A Simple Framework for Contrastive Learning of Visual Representations. ICML 2020";
const DUALITY_PAPER: &str = "Garrido, Chen, Bardes, Najman, LeCun. On the duality between contrastive and non-contrastive self-supervised learning. ICLR 2023";
const DCL_PAPER: &str =
    "Yeh, Hong, Hsu, Liu, Chen, LeCun. Decoupled Contrastive Learning. ECCV 2022";

register_objective! {
    name: "simclr",
    aliases: &["nt-xent", "ntxent"],
    summary: "Normalised temperature-scaled cross-entropy over all views (sample-contrastive)",
    paper: SIMCLR_PAPER,
    keys: SIMCLR_KEYS,
    config: SimclrConfig,
}

register_objective! {
    name: "simclr-abs",
    aliases: &[],
    summary: "SimCLR with f(x) = |x| on every cosine similarity (duality paper)",
    paper: DUALITY_PAPER,
    keys: SIMCLR_KEYS,
    config: SimclrAbsConfig,
}

register_objective! {
    name: "simclr-sq",
    aliases: &[],
    summary: "SimCLR with f(x) = x² on every cosine similarity (duality paper)",
    paper: DUALITY_PAPER,
    keys: SIMCLR_KEYS,
    config: SimclrSqConfig,
}

register_objective! {
    name: "simclr-centred",
    aliases: &["simclr-centered"],
    summary: "SimCLR on per-view batch-centred embeddings (duality paper scenario A)",
    paper: DUALITY_PAPER,
    keys: SIMCLR_KEYS,
    config: SimclrCentredConfig,
}

register_objective! {
    name: "simclr-standardized",
    aliases: &["simclr-dimstd", "simclr-standardised"],
    summary: "SimCLR on dimension-standardised embeddings, raw dot products (duality paper eq. 14)",
    paper: DUALITY_PAPER,
    keys: SIMCLR_KEYS,
    config: SimclrStandardizedConfig,
}

register_objective! {
    name: "dcl",
    aliases: &["decoupled-contrastive"],
    summary: "Decoupled contrastive loss: NT-Xent without the positive in the denominator",
    paper: DCL_PAPER,
    keys: DCL_KEYS,
    config: DclConfig,
}

register_objective! {
    name: "dcl-abs",
    aliases: &[],
    summary: "DCL with f(x) = |x| on every cosine similarity (duality paper)",
    paper: DUALITY_PAPER,
    keys: DCL_KEYS,
    config: DclAbsConfig,
}

register_objective! {
    name: "dcl-sq",
    aliases: &[],
    summary: "DCL with f(x) = x² on every cosine similarity (duality paper)",
    paper: DUALITY_PAPER,
    keys: DCL_KEYS,
    config: DclSqConfig,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{dcl, nt_xent_with};
    use candle_core::{DType, Device, Tensor};
    use ssl_core::testing::randn;
    use ssl_core::Ids;

    const SIMCLR_NAMES: [(&str, Similarity, Preprocess); 5] = [
        ("simclr", Similarity::Identity, Preprocess::None),
        ("simclr-abs", Similarity::Abs, Preprocess::None),
        ("simclr-sq", Similarity::Sq, Preprocess::None),
        ("simclr-centred", Similarity::Identity, Preprocess::Centre),
        (
            "simclr-standardized",
            Similarity::Identity,
            Preprocess::Standardize,
        ),
    ];
    const DCL_NAMES: [(&str, Similarity); 3] = [
        ("dcl", Similarity::Identity),
        ("dcl-abs", Similarity::Abs),
        ("dcl-sq", Similarity::Sq),
    ];

    fn all_names() -> impl Iterator<Item = &'static str> {
        SIMCLR_NAMES
            .iter()
            .map(|n| n.0)
            .chain(DCL_NAMES.iter().map(|n| n.0))
    }

    fn build(name: &str, overrides: &str) -> Result<Box<dyn Objective>> {
        let ctx = BuildContext {
            vb: ssl_core::ParamStore::new(7)
                .var_builder(&Device::Cpu)
                .set_dtype(DType::F64)
                .pp("objective"),
            num_instances: 10,
            num_classes: None,
            instance_labels: None,
            projection_dim: 4,
            feature_dim: 4,
            views: 3,
            global_views: 3,
            batch_size: 5,
            patches: None,
        };
        let value: serde_yaml::Value = serde_yaml::from_str(overrides)?;
        (ssl_core::find(name)?.build)(&value, &ctx)
    }

    fn loss_of(objective: &mut dyn Objective, z: &Tensor) -> Result<f64> {
        let b = z.dim(1)?;
        let indices = Ids::range(b, &Device::Cpu)?;
        let batch = ssl_core::testing::batch(z, &indices, None);
        Ok(objective.loss(&batch)?.loss.to_scalar::<f64>()?)
    }

    #[test]
    fn registrations_have_documented_defaults() {
        for name in all_names() {
            assert_eq!(ssl_core::find(name).unwrap().name, name);
            ssl_core::testing::documented_defaults(name);
        }
        let simclr = |name: &str| (ssl_core::find(name).unwrap().default_config)();
        for (name, f, p) in SIMCLR_NAMES {
            let d = simclr(name);
            assert_eq!(d["temperature"].as_f64(), Some(0.5), "{name}");
            assert_eq!(
                serde_yaml::from_value::<Similarity>(d["similarity"].clone()).unwrap(),
                f
            );
            assert_eq!(
                serde_yaml::from_value::<Preprocess>(d["preprocess"].clone()).unwrap(),
                p
            );
        }
        for (name, f) in DCL_NAMES {
            let d = simclr(name);
            assert_eq!(d["temperature"].as_f64(), Some(0.1), "{name}");
            assert_eq!(
                serde_yaml::from_value::<Similarity>(d["similarity"].clone()).unwrap(),
                f
            );
            assert_eq!(d["weighting"].as_str(), Some("none"));
            assert_eq!(d["sigma"].as_f64(), Some(0.5));
        }
    }

    #[test]
    fn aliases_find_their_objectives() {
        for (alias, name) in [
            ("NT-Xent", "simclr"),
            ("ntxent", "simclr"),
            ("simclr-dimstd", "simclr-standardized"),
            ("simclr-standardised", "simclr-standardized"),
            ("simclr-centered", "simclr-centred"),
            ("decoupled-contrastive", "dcl"),
        ] {
            assert_eq!(ssl_core::find(alias).unwrap().name, name);
        }
    }

    #[test]
    fn registered_objectives_compute_their_preset_losses() -> Result<()> {
        let z = randn(0f64, 1., (3, 5, 4), &Device::Cpu)?;
        for (name, f, p) in SIMCLR_NAMES {
            let got = loss_of(build(name, "")?.as_mut(), &z)?;
            let want = nt_xent_with(&z, 0.5, f, p)?.to_scalar::<f64>()?;
            assert!((got - want).abs() < 1e-12, "{name}: {got} vs {want}");
        }
        for (name, f) in DCL_NAMES {
            let got = loss_of(build(name, "")?.as_mut(), &z)?;
            let want = dcl(&z, 0.1, f)?.to_scalar::<f64>()?;
            assert!((got - want).abs() < 1e-12, "{name}: {got} vs {want}");
        }
        let got = loss_of(
            build(
                "simclr",
                "{similarity: sq, preprocess: centre, temperature: 0.2}",
            )?
            .as_mut(),
            &z,
        )?;
        let want = nt_xent_with(&z, 0.2, Similarity::Sq, Preprocess::Centre)?.to_scalar::<f64>()?;
        assert!((got - want).abs() < 1e-12);
        let got = loss_of(
            build("dcl-abs", "{weighting: dclw, sigma: 0.3}")?.as_mut(),
            &z,
        )?;
        let want = crate::dcl_w(&z, 0.1, Similarity::Abs, 0.3)?.to_scalar::<f64>()?;
        assert!((got - want).abs() < 1e-12);
        Ok(())
    }

    #[test]
    fn requirements_need_two_instances() -> Result<()> {
        for name in all_names() {
            let req = build(name, "")?.requirements();
            assert_eq!(req.min_views, 2);
            assert_eq!(req.max_views, None);
            let err = req.check(name, 2, 1, false).unwrap_err().to_string();
            assert!(
                err.contains(req.min_batch_reason) && err.contains("negative"),
                "{err}"
            );
            assert!(req.check(name, 1, 8, false).is_err());
            req.check(name, 8, 2, false)?;
        }
        Ok(())
    }

    #[test]
    fn bad_values_and_unknown_keys_are_clear_errors() {
        let err = |name: &str, yaml: &str| format!("{:#}", build(name, yaml).err().unwrap());
        let e = err("simclr", "similarity: cube");
        assert!(
            e.contains("unknown variant `cube`") && e.contains("identity") && e.contains("sq"),
            "{e}"
        );
        let e = err("simclr-abs", "preprocess: whiten");
        assert!(
            e.contains("unknown variant `whiten`") && e.contains("standardize"),
            "{e}"
        );
        let e = err("dcl", "weighting: dcl-w");
        assert!(
            e.contains("unknown variant `dcl-w`") && e.contains("dclw"),
            "{e}"
        );
        let e = err("simclr", "temprature: 0.1");
        assert!(
            e.contains("unknown field `temprature`") && e.contains("temperature"),
            "{e}"
        );
        let e = err("dcl-sq", "preprocess: centre");
        assert!(e.contains("unknown field `preprocess`"), "{e}");
        let e = err("simclr-sq", "temperature: 0");
        assert!(
            e.contains("`temperature` must be") && e.contains("got 0"),
            "{e}"
        );
        let e = err("dcl", "sigma: -1");
        assert!(e.contains("`sigma` must be") && e.contains("got -1"), "{e}");
    }

    #[test]
    fn spelling_variants_of_preprocess_are_accepted() {
        for (yaml, want) in [
            ("preprocess: center", Preprocess::Centre),
            ("preprocess: standardise", Preprocess::Standardize),
        ] {
            let v: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
            let c = ssl_core::registry::parse_config::<SimclrConfig>("simclr", &v).unwrap();
            assert_eq!(c.preprocess, want);
        }
    }
}
