//! The small CNN encoder for digit images: three conv3×3–BN–ReLU blocks (32, 64, 128 channels,
//! strides 1, 2, 2), global average pooling and a 128→128 linear layer.
//!
//! Internally the activations stay channel-major (`[C, N, H, W]`) so each convolution is one GEMM
//! ([`crate::conv`]) and each batch norm is a fused per-row op ([`crate::batch_norm`]).

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use crate::batch_norm::BatchNorm;
use crate::conv::{conv, Conv};
use crate::pool::global_average_pool_channel_major;
use crate::{linear, Encoder, Linear};

const OUT_DIM: usize = 128;

/// Digits CNN; keys `conv{1,2,3}.weight`, `bn{1,2,3}.*`, `fc.weight`, `fc.bias`.
#[derive(Debug, Clone)]
pub struct DigitsCnn {
    convs: Vec<Conv>,
    bns: Vec<BatchNorm>,
    fc: Linear,
}

impl DigitsCnn {
    /// Builds the network for images with `in_channels` channels (batch-norm momentum 0.1).
    pub fn new(in_channels: usize, vb: VarBuilder) -> Result<Self> {
        Self::with_bn_momentum(in_channels, Some(0.1), vb)
    }

    /// As [`DigitsCnn::new`] with another running-statistics momentum for every batch norm
    /// (`Some(1.0)`: the last batch's statistics; `None`: cumulative average).
    pub fn with_bn_momentum(
        in_channels: usize,
        bn_momentum: Option<f64>,
        vb: VarBuilder,
    ) -> Result<Self> {
        let spec = [(32, 1), (64, 2), (128, 2)];
        let mut convs = Vec::new();
        let mut bns = Vec::new();
        let mut c_in = in_channels;
        for (i, (c_out, stride)) in spec.into_iter().enumerate() {
            convs.push(conv(
                c_in,
                c_out,
                2,
                3,
                stride,
                1,
                false,
                vb.pp(format!("conv{}", i + 1)),
            )?);
            bns.push(BatchNorm::new(
                c_out,
                1e-5,
                bn_momentum,
                vb.pp(format!("bn{}", i + 1)),
            )?);
            c_in = c_out;
        }
        let fc = linear(c_in, OUT_DIM, vb.pp("fc"))?;
        Ok(Self { convs, bns, fc })
    }

    /// `[N, C, H, W]` images → `[N, 128]` features.
    pub fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut h = x.transpose(0, 1)?;
        for (conv, bn) in self.convs.iter().zip(&self.bns) {
            h = conv.forward_channel_major(&h)?;
            h = bn.forward_channel_major(&h, true, train)?;
        }
        let pooled = global_average_pool_channel_major(&h)?;
        self.fc.forward(&pooled)
    }

    /// Feature dimension (128).
    pub fn output_dim(&self) -> usize {
        OUT_DIM
    }
}

impl Encoder for DigitsCnn {
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        DigitsCnn::forward_t(self, x, train)
    }
    fn output_dim(&self) -> usize {
        OUT_DIM
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Mlp, Projector};
    use candle_core::{DType, Device};
    use ssl_core::testing::randn;

    #[test]
    fn shapes_and_keys() {
        let store = ssl_core::ParamStore::new(1);
        let vb = store.var_builder(&Device::Cpu);
        let enc = DigitsCnn::new(1, vb.pp("enc")).unwrap();
        let proj = Projector::new(enc.output_dim(), &[32, 16], vb.pp("proj")).unwrap();
        let mlp = Mlp::new(256, &[64, 10], vb.pp("mlp")).unwrap();
        let x = randn(0f32, 1.0, (4, 1, 16, 16), &Device::Cpu).unwrap();
        for train in [true, false] {
            let z = enc.forward_t(&x, train).unwrap();
            assert_eq!(z.dims(), &[4, 128]);
            assert_eq!(proj.forward_t(&z, train).unwrap().dims(), &[4, 16]);
            let m = Encoder::forward_t(&mlp, &x, train).unwrap();
            assert_eq!(m.dims(), &[4, 10]);
        }
        assert_eq!(z_dtype(&enc, &x), DType::F32);
        let keys: Vec<String> = store.vars().into_iter().map(|(k, _)| k).collect();
        for k in [
            "enc.conv1.weight",
            "enc.bn1.running_var",
            "enc.conv3.weight",
            "enc.bn3.bias",
            "enc.fc.weight",
            "enc.fc.bias",
            "proj.0.weight",
            "proj.0.bias",
            "proj.1.running_mean",
            "proj.3.weight",
            "proj.3.bias",
            "mlp.layers.0.weight",
            "mlp.layers.1.bias",
        ] {
            assert!(keys.iter().any(|n| n == k), "missing {k} in {keys:?}");
        }
        assert!(!keys.iter().any(|n| n == "enc.conv1.bias"));
    }

    fn z_dtype(enc: &DigitsCnn, x: &Tensor) -> DType {
        enc.forward_t(x, false).unwrap().dtype()
    }
}
