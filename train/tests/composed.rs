//! The composed Candle ops that a GPU runs (im2col by gathering, batch norm, pooling and
//! residual joins from Candle's ops), run on the CPU through whole networks and checked against
//! the fused CPU kernels: the GPU's code path, tested where CI has no GPU. `tests/cuda.rs` runs
//! the same comparison on a GPU, over all four rows and the masked objectives.

mod parity;

use candle_core::Device;
use parity::{assert_rows_match, ENCODER_ROWS, MASKED_ROWS};

/// ResNet-18 (CIFAR stem, VICReg) and the 3D ResNet-18 (IConE); the ViT's composed path is
/// Candle's own layer norm, softmax and GELU, checked op by op in `ssl-models`.
#[test]
fn resnets_on_the_composed_ops_train_as_on_the_fused_kernels() -> anyhow::Result<()> {
    assert_rows_match([&ENCODER_ROWS[0], &ENCODER_ROWS[3]], &Device::Cpu, true)
}

/// MAE, I-JEPA and LeJEPA on a ViT-T: the per-sample token gathers, mask tokens and EMA target
/// through the composed ops, as a GPU runs them.
#[test]
fn masked_objectives_on_the_composed_ops_train_as_on_the_fused_kernels() -> anyhow::Result<()> {
    assert_rows_match(&MASKED_ROWS, &Device::Cpu, true)
}
