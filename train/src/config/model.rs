//! `model:` — the encoder and the projector.

use anyhow::{ensure, Result};
use serde::{Deserialize, Serialize};
use ssl_models::{PosEmbed, Stem, VitConfig, VitPool};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// One of [`ENCODERS`], or an encoder a linked crate registered (default: `digits_cnn`;
    /// `resnet18_3d` for MedMNIST volumes).
    pub encoder: String,
    /// MLP widths (hidden…, output) when `encoder: mlp`.
    pub mlp: Vec<usize>,
    /// Stem of the 2D ResNets: `imagenet` (7×7 stride-2 conv + max-pool) or `cifar` (3×3
    /// stride-1 conv, no pool; for images of 32 px and less).
    pub stem: Stem,
    /// Start the last batch norm of every residual block at weight 0 (Goyal et al. 2017).
    pub zero_init_residual: bool,
    /// ViT patch side in pixels; 0: the encoder's own (16). Another side learns the positional
    /// embedding for `data.size` (so timm's 224-px weights no longer fit): ViT-T with 4-px
    /// patches on the 16-px digits is a 4 × 4 grid.
    pub patch_size: usize,
    /// What a ViT's features are: `class`, its class token (timm, MAE), or `mean`, the mean of
    /// its patch tokens (I-JEPA's evaluation).
    pub pool: VitPool,
    /// A ViT's positions: `learned` (ViT, timm) or `sincos`, the fixed 2D sine–cosine
    /// embedding the official MAE and I-JEPA encoders use (not trained, not in the weights).
    pub pos_embed: PosEmbed,
    /// Initial encoder weights: a safetensors file with PyTorch state-dict keys, or
    /// `torchvision:resnet50` / `timm:vit_small_patch16_224` for a converted file in the weights
    /// directory (see `ssl run --help`).
    pub init: Option<String>,
    /// Projector widths: Linear–BN–ReLU for all but the last, then Linear.
    pub projector: Vec<usize>,
    /// Batch norm over the global batch of a data-parallel run (PyTorch's `SyncBatchNorm`): every
    /// train-mode batch norm of encoder, projector, teacher and objective heads normalises with
    /// the statistics of all ranks' rows. Off: each rank's own rows (what one process with the
    /// per-rank batch computes). No effect on one process.
    pub sync_bn: bool,
}

/// The encoders `model.encoder` can name.
pub const ENCODERS: &[&str] = &[
    "digits_cnn",
    "mlp",
    "resnet18",
    "resnet34",
    "resnet50",
    "resnet18_3d",
    "vit_t16",
    "vit_s16",
    "vit_b16",
];

/// The encoders `model.encoder` can name in this program, for error messages: the built-in
/// ones and those linked crates registered ([`ssl_models::register_encoder!`]).
pub fn known_encoders() -> String {
    let registered: Vec<&str> = ssl_models::registered_encoders()
        .iter()
        .map(|r| r.name)
        .collect();
    match registered.is_empty() {
        true => format!("built in: {}", ENCODERS.join(", ")),
        false => format!(
            "built in: {}; registered: {}",
            ENCODERS.join(", "),
            registered.join(", ")
        ),
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            encoder: "digits_cnn".into(),
            mlp: vec![64, 64, 2],
            stem: Stem::Imagenet,
            zero_init_residual: false,
            patch_size: 0,
            pool: VitPool::Class,
            pos_embed: PosEmbed::Learned,
            init: None,
            projector: vec![512, 512],
            sync_bn: false,
        }
    }
}

impl ModelConfig {
    /// The ViT `encoder` names for images of side `image_side`, with `patch_size`, `pool` and
    /// `pos_embed` applied; `None` for other encoders.
    pub fn vit_config(&self, image_side: usize) -> Option<VitConfig> {
        let mut vit = match self.encoder.as_str() {
            "vit_t16" => VitConfig::tiny(),
            "vit_s16" => VitConfig::small(),
            "vit_b16" => VitConfig::base(),
            _ => return None,
        };
        if self.patch_size > 0 {
            (vit.patch_size, vit.img_size) = (self.patch_size, image_side);
        }
        (vit.pool, vit.pos_embed) = (self.pool, self.pos_embed);
        Some(vit)
    }

    pub(super) fn validate(&self) -> Result<()> {
        ensure!(
            self.vit_config(224).is_some()
                || (self.patch_size == 0
                    && self.pool == VitPool::Class
                    && self.pos_embed == PosEmbed::Learned),
            "model.patch_size, model.pool and model.pos_embed apply to ViT encoders (vit_t16, \
             vit_s16, vit_b16), \
             and model.encoder is `{}`; remove them or use a ViT",
            self.encoder
        );
        ensure!(
            ENCODERS.contains(&self.encoder.as_str())
                || ssl_models::find_encoder(&self.encoder).is_some(),
            "unknown model.encoder `{}`; {}",
            self.encoder,
            known_encoders()
        );
        ensure!(
            !self.mlp.is_empty() && !self.mlp.contains(&0),
            "model.mlp must list widths ≥ 1 (hidden…, output; default [64, 64, 2]), got {:?}",
            self.mlp
        );
        ensure!(
            !self.projector.is_empty(),
            "model.projector needs at least one width (the output), e.g. [512, 512]"
        );
        ensure!(
            !self.projector.contains(&0),
            "model.projector widths must be ≥ 1 (default [512, 512]), got {:?}",
            self.projector
        );
        Ok(())
    }
}
