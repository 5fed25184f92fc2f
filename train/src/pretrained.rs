//! Published PyTorch weights as the starting point of a run (`ssl run --init`).
//!
//! The encoders' keys are torchvision's and timm's state-dict keys, so a checkpoint converted
//! with `safetensors.torch.save_file(model.state_dict(), path)` loads without remapping. The
//! tensors the encoder lacks (the classifier `fc.*` / `head.*`, batch norm's
//! `num_batches_tracked`) are skipped and listed; every encoder tensor must be present with its
//! shape. `FRAMEWORK:NAME` names a file `$SSL_WEIGHTS/FRAMEWORK/NAME.safetensors` (default
//! directory `~/.cache/candle-ssl/weights`), and checks that it fits the configured encoder.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use ssl_core::ParamStore;

use crate::export::{load_encoder, ENCODER_PREFIX};

/// Published architectures and the encoder each fits: `(framework, name, model.encoder)`.
const PUBLISHED: &[(&str, &str, &str)] = &[
    ("torchvision", "resnet18", "resnet18"),
    ("torchvision", "resnet34", "resnet34"),
    ("torchvision", "resnet50", "resnet50"),
    ("timm", "vit_tiny_patch16_224", "vit_t16"),
    ("timm", "vit_small_patch16_224", "vit_s16"),
    ("timm", "vit_base_patch16_224", "vit_b16"),
];

/// The directory `FRAMEWORK:NAME` files live in: `$SSL_WEIGHTS`, else
/// `~/.cache/candle-ssl/weights`.
pub fn weights_dir() -> PathBuf {
    std::env::var_os("SSL_WEIGHTS")
        .map_or_else(|| ssl_data::user_cache().join("weights"), PathBuf::from)
}

/// The file `spec` names for `encoder`: a path, or `FRAMEWORK:NAME` in [`weights_dir`].
pub fn resolve(spec: &str, encoder: &str) -> Result<PathBuf> {
    let Some((framework, name)) = spec.split_once(':') else {
        let path = PathBuf::from(spec);
        if !path.is_file() {
            bail!("--init {spec}: no such file; give a safetensors file or FRAMEWORK:NAME (e.g. torchvision:resnet50)");
        }
        return Ok(path);
    };
    let Some((_, _, fits)) = PUBLISHED
        .iter()
        .find(|(f, n, _)| *f == framework && *n == name)
    else {
        let known: Vec<String> = PUBLISHED
            .iter()
            .map(|(f, n, _)| format!("{f}:{n}"))
            .collect();
        bail!(
            "--init {spec}: unknown weights; known: {}",
            known.join(", ")
        );
    };
    if *fits != encoder {
        bail!(
            "--init {spec} holds a {fits} encoder, the run's is {encoder}; add `--encoder {fits}`"
        );
    }
    let path = weights_dir()
        .join(framework)
        .join(format!("{name}.safetensors"));
    if !path.is_file() {
        let constructor = match framework {
            "torchvision" => format!("torchvision.models.{name}(weights='DEFAULT')"),
            _ => format!("timm.create_model('{name}', pretrained=True)"),
        };
        let dir = path.parent().unwrap_or(&path).display();
        bail!(
            "--init {spec}: {} does not exist. Convert the published weights once (needs PyTorch):\n  \
             python3 -c \"import os, {framework}, safetensors.torch as st; \
             os.makedirs('{dir}', exist_ok=True); \
             st.save_file({constructor}.state_dict(), '{}')\"\n\
             or set SSL_WEIGHTS to the directory that holds {framework}/{name}.safetensors",
            path.display(),
            path.display()
        );
    }
    Ok(path)
}

/// What [`load`] did.
#[derive(Debug)]
pub struct Loaded {
    pub path: PathBuf,
    /// Encoder tensors set from the file.
    pub tensors: usize,
    /// Names in the file the encoder does not have (a classifier, `num_batches_tracked`).
    pub skipped: Vec<String>,
}

/// Sets the `encoder.*` variables of `store` from the weights `spec` names.
pub fn load(store: &ParamStore, spec: &str, encoder: &str) -> Result<Loaded> {
    let path = resolve(spec, encoder)?;
    let tensors: HashMap<String, Tensor> = candle_core::safetensors::load(&path, &Device::Cpu)
        .with_context(|| format!("--init: cannot read {} as safetensors", path.display()))?;
    let read = load_encoder(store, &tensors).with_context(|| {
        format!(
            "--init {spec}: {} does not fit the {encoder} encoder",
            path.display()
        )
    })?;
    let mut skipped: Vec<String> = tensors
        .keys()
        .filter(|k| !read.contains(k.as_str()))
        .cloned()
        .collect();
    skipped.sort();
    Ok(Loaded {
        path,
        tensors: store.vars_with_prefix(ENCODER_PREFIX).len(),
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_weights_must_fit_the_encoder_and_exist() {
        let err = resolve("torchvision:resnet50", "resnet18")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--encoder resnet50"), "{err}");
        let err = resolve("torchvision:resnet51", "resnet50")
            .unwrap_err()
            .to_string();
        assert!(err.contains("known: torchvision:resnet18"), "{err}");
        let err = resolve("/no/such/file.safetensors", "resnet50")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no such file"), "{err}");
    }

    /// What a file holds beyond the encoder is listed as skipped, whether its keys carry a run
    /// checkpoint's `encoder.` prefix or an export's none; what was loaded is not.
    #[test]
    fn only_what_the_encoder_lacks_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = ParamStore::new(0);
        store
            .var_builder(&Device::Cpu)
            .pp("encoder")
            .get(2, "w")
            .unwrap();
        let w = Tensor::new(&[1f32, 2.], &Device::Cpu).unwrap();
        for (file, encoder_key, extra) in [
            ("checkpoint.safetensors", "encoder.w", "projector.v"),
            ("export.safetensors", "w", "fc.weight"),
        ] {
            let path = dir.path().join(file);
            let tensors = HashMap::from([
                (encoder_key.to_string(), w.clone()),
                (extra.to_string(), w.clone()),
            ]);
            candle_core::safetensors::save(&tensors, &path).unwrap();
            let loaded = load(&store, path.to_str().unwrap(), "digits_cnn").unwrap();
            assert_eq!(
                (loaded.tensors, loaded.skipped),
                (1, vec![extra.to_string()])
            );
        }
    }
}
