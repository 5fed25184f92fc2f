//! ResNet-18/34/50 in 2D and 3D: He, Zhang, Ren & Sun, "Deep Residual Learning for Image
//! Recognition", CVPR 2016 (Table 1: BasicBlock stages `[2,2,2,2]` and `[3,4,6,3]`, Bottleneck
//! `[3,4,6,3]`; stride-2 convolution opening stages 2–4, 1×1 projection shortcuts where the shape
//! changes).
//!
//! The layout and initialisation are torchvision's `resnet.py` (v1.5: the stride of a Bottleneck
//! sits on its 3×3 convolution; Kaiming-normal fan-out convolutions; BN weight 1, bias 0; with
//! `zero_init_residual` the last BN of every block starts at weight 0, Goyal et al. 2017), so the
//! keys read like its state dict (`conv1.weight`, `layer2.0.downsample.1.running_var`) and
//! converted torchvision weights load without remapping. The classification `fc` is absent
//! unless [`ResNetConfig::fc_dim`] asks for one, as the IConE paper's 3D ResNet-18 does (512 →
//! 512).
//!
//! Two stems: ImageNet's (7×7 stride-2 convolution, 3×3 stride-2 max-pool) and CIFAR's (3×3
//! stride-1 convolution, no pooling; SimCLR Appendix B.9), for small images. With
//! `spatial_rank: 3` every convolution, batch norm and pool is 3D (inputs `[N, C, D, H, W]`),
//! the encoder of IConE's MedMNIST-3D experiments at 64³.
//!
//! Activations stay channel-major (`[C, N, *S]`) inside the network: each convolution is one
//! GEMM ([`crate::conv`]), each batch norm (+ReLU) one fused op ([`crate::batch_norm`]) and each
//! block's `relu(h + shortcut)` another ([`crate::residual`]). On CUDA they are channel-major in
//! shape only and lie batch-major in memory, as cuDNN takes them (`conv/cudnn.rs`).

use candle_core::{Module, Result, Tensor};
use candle_nn::init::{FanInOut, NonLinearity, NormalOrUniform};
use candle_nn::{Init, VarBuilder};
use serde::{Deserialize, Serialize};

use crate::batch_norm::BatchNorm;
use crate::conv::Conv;
use crate::pool::{global_average_pool_channel_major, max_pool_channel_major};
use crate::residual::residual_relu;
use crate::{linear, Encoder, Linear};

/// The first layers before the residual stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stem {
    /// 7×7 stride-2 convolution, BN, ReLU, 3×3 stride-2 max-pool (input side / 4).
    Imagenet,
    /// 3×3 stride-1 convolution, BN, ReLU, no pooling (for 32-px and smaller images).
    Cifar,
}

/// Residual block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// Two 3×3 convolutions (ResNet-18/34), expansion 1.
    Basic,
    /// 1×1 – 3×3 – 1×1 convolutions (ResNet-50), expansion 4.
    Bottleneck,
}

impl BlockKind {
    fn expansion(self) -> usize {
        match self {
            BlockKind::Basic => 1,
            BlockKind::Bottleneck => 4,
        }
    }
}

/// What [`ResNet::new`] builds.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    pub block: BlockKind,
    /// Blocks per stage (four stages of 64, 128, 256, 512 base channels).
    pub layers: [usize; 4],
    pub stem: Stem,
    /// 2 for images `[N, C, H, W]`, 3 for volumes `[N, C, D, H, W]`.
    pub spatial_rank: usize,
    pub in_channels: usize,
    /// Start the last BN of each block at weight 0, so every block begins as the identity.
    pub zero_init_residual: bool,
    /// A final `fc` layer to this width (PyTorch default init); `None`: the pooled features.
    pub fc_dim: Option<usize>,
    /// Running-statistics momentum of every batch norm (`None`: cumulative average).
    pub bn_momentum: Option<f64>,
}

impl ResNetConfig {
    /// ResNet-`depth` (18, 34 or 50) for 2D images with the given stem, torchvision defaults.
    pub fn new(depth: usize, stem: Stem, in_channels: usize) -> Result<Self> {
        let (block, layers) = match depth {
            18 => (BlockKind::Basic, [2, 2, 2, 2]),
            34 => (BlockKind::Basic, [3, 4, 6, 3]),
            50 => (BlockKind::Bottleneck, [3, 4, 6, 3]),
            d => candle_core::bail!("no ResNet-{d}; built in: 18, 34, 50"),
        };
        Ok(Self {
            block,
            layers,
            stem,
            spatial_rank: 2,
            in_channels,
            zero_init_residual: false,
            fc_dim: None,
            bn_momentum: Some(0.1),
        })
    }

    /// The IConE paper's 3D ResNet-18 (spec `docs/spec/objectives.md` §1.1): ResNet-18 with every
    /// layer in 3D, the ImageNet stem (7³ stride-2 convolution, 3³ stride-2 max-pool), one input
    /// channel and a final `fc` 512 → 512.
    pub fn resnet18_3d() -> Self {
        Self {
            block: BlockKind::Basic,
            layers: [2, 2, 2, 2],
            stem: Stem::Imagenet,
            spatial_rank: 3,
            in_channels: 1,
            zero_init_residual: false,
            fc_dim: Some(512),
            bn_momentum: Some(0.1),
        }
    }

    /// Width of the pooled features (512 for Basic, 2048 for Bottleneck).
    pub fn feature_dim(&self) -> usize {
        512 * self.block.expansion()
    }
}

/// A convolution with torchvision's ResNet init (Kaiming normal, fan-out, ReLU gain), no bias.
fn conv(
    cfg: &ResNetConfig,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    vb: VarBuilder,
) -> Result<Conv> {
    let mut shape = vec![c_out, c_in];
    shape.extend(std::iter::repeat_n(kernel, cfg.spatial_rank));
    let init = Init::Kaiming {
        dist: NormalOrUniform::Normal,
        fan: FanInOut::FanOut,
        non_linearity: NonLinearity::ReLU,
    };
    let weight = vb.get_with_hints(shape, "weight", init)?;
    Conv::new(weight, None, stride, kernel / 2)
}

fn bn(cfg: &ResNetConfig, channels: usize, weight: f64, vb: VarBuilder) -> Result<BatchNorm> {
    BatchNorm::with_weight(channels, 1e-5, cfg.bn_momentum, weight, vb)
}

/// Convolution followed by batch norm (+ReLU), on channel-major activations.
#[derive(Debug, Clone)]
struct ConvBn {
    conv: Conv,
    bn: BatchNorm,
}

impl ConvBn {
    fn forward(&self, x: &Tensor, relu: bool, train: bool) -> Result<Tensor> {
        self.bn
            .forward_channel_major(&self.conv.forward_channel_major(x)?, relu, train)
    }
}

/// One residual block: `relu(F(x) + shortcut(x))`.
#[derive(Debug, Clone)]
struct Block {
    /// `conv{i}` / `bn{i}` pairs, the last one without ReLU.
    layers: Vec<ConvBn>,
    /// 1×1 projection `downsample.0` (conv) / `downsample.1` (BN) where the shape changes.
    downsample: Option<ConvBn>,
}

impl Block {
    fn new(
        cfg: &ResNetConfig,
        c_in: usize,
        width: usize,
        stride: usize,
        vb: VarBuilder,
    ) -> Result<Self> {
        let c_out = width * cfg.block.expansion();
        // (in, out, kernel, stride) of conv1, conv2[, conv3].
        let shapes: Vec<(usize, usize, usize, usize)> = match cfg.block {
            BlockKind::Basic => vec![(c_in, width, 3, stride), (width, width, 3, 1)],
            BlockKind::Bottleneck => vec![
                (c_in, width, 1, 1),
                (width, width, 3, stride),
                (width, c_out, 1, 1),
            ],
        };
        let last = shapes.len() - 1;
        let layers = shapes
            .into_iter()
            .enumerate()
            .map(|(i, (ci, co, k, s))| {
                let gamma = match cfg.zero_init_residual && i == last {
                    true => 0.0,
                    false => 1.0,
                };
                Ok(ConvBn {
                    conv: conv(cfg, ci, co, k, s, vb.pp(format!("conv{}", i + 1)))?,
                    bn: bn(cfg, co, gamma, vb.pp(format!("bn{}", i + 1)))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let downsample = match stride != 1 || c_in != c_out {
            true => {
                let vb = vb.pp("downsample");
                Some(ConvBn {
                    conv: conv(cfg, c_in, c_out, 1, stride, vb.pp("0"))?,
                    bn: bn(cfg, c_out, 1.0, vb.pp("1"))?,
                })
            }
            false => None,
        };
        Ok(Self { layers, downsample })
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let last = self.layers.len() - 1;
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h, i < last, train)?;
        }
        let shortcut = match &self.downsample {
            Some(d) => d.forward(x, false, train)?,
            None => x.clone(),
        };
        residual_relu(&h, &shortcut)
    }
}

/// ResNet encoder: `[N, C, *S]` → `[N, feature_dim]` (or `[N, fc_dim]`).
#[derive(Debug, Clone)]
pub struct ResNet {
    stem: ConvBn,
    max_pool: bool,
    blocks: Vec<Block>,
    fc: Option<Linear>,
    spatial_rank: usize,
    out_dim: usize,
}

impl ResNet {
    /// Builds the network under `vb` with torchvision's keys and initialisation.
    pub fn new(cfg: &ResNetConfig, vb: VarBuilder) -> Result<Self> {
        if !(2..=3).contains(&cfg.spatial_rank) {
            candle_core::bail!(
                "ResNet spatial rank must be 2 (images) or 3 (volumes), got {}",
                cfg.spatial_rank
            );
        }
        let (kernel, stride) = match cfg.stem {
            Stem::Imagenet => (7, 2),
            Stem::Cifar => (3, 1),
        };
        let stem = ConvBn {
            conv: conv(cfg, cfg.in_channels, 64, kernel, stride, vb.pp("conv1"))?,
            bn: bn(cfg, 64, 1.0, vb.pp("bn1"))?,
        };
        let mut blocks = Vec::new();
        let mut c_in = 64;
        for (stage, &count) in cfg.layers.iter().enumerate() {
            let width = 64 << stage;
            let vb = vb.pp(format!("layer{}", stage + 1));
            for j in 0..count {
                let stride = if stage > 0 && j == 0 { 2 } else { 1 };
                blocks.push(Block::new(cfg, c_in, width, stride, vb.pp(j.to_string()))?);
                c_in = width * cfg.block.expansion();
            }
        }
        let fc = match cfg.fc_dim {
            Some(d) => Some(linear(c_in, d, vb.pp("fc"))?),
            None => None,
        };
        Ok(Self {
            stem,
            max_pool: cfg.stem == Stem::Imagenet,
            blocks,
            fc,
            spatial_rank: cfg.spatial_rank,
            out_dim: cfg.fc_dim.unwrap_or(c_in),
        })
    }

    /// `[N, C, *S]` → `[N, out]`; `train` selects batch statistics in every batch norm.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if x.rank() != self.spatial_rank + 2 {
            candle_core::bail!(
                "this ResNet takes {}-d inputs [N, C, {}], got shape {:?}",
                self.spatial_rank + 2,
                if self.spatial_rank == 2 {
                    "H, W"
                } else {
                    "D, H, W"
                },
                x.dims()
            );
        }
        // The channel-major view of the images: the CPU's convolution copies it channel-major,
        // cuDNN takes it as it lies.
        let mut h = self.stem.forward(&x.transpose(0, 1)?, true, train)?;
        if self.max_pool {
            h = max_pool_channel_major(&h, 3, 2, 1)?;
        }
        for block in &self.blocks {
            h = block.forward(&h, train)?;
        }
        let pooled = global_average_pool_channel_major(&h)?;
        match &self.fc {
            Some(fc) => fc.forward(&pooled),
            None => Ok(pooled),
        }
    }

    /// Output width.
    pub fn output_dim(&self) -> usize {
        self.out_dim
    }
}

impl Encoder for ResNet {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        ResNet::forward_t(self, x, train)
    }
    fn output_dim(&self) -> usize {
        self.out_dim
    }
}

#[cfg(test)]
mod tests;
