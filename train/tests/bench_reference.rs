//! The PyTorch side of the `train_step` bench (`tools/twins/train_step.py`) computes the same
//! losses as candle-ssl: the numbers below are what `python3 tools/twins/train_step.py --check`
//! prints (PyTorch 2.15, float64) for inputs both sides build from one formula.

use candle_core::{DType, Device, Tensor};
use ssl_frossl::{frossl_loss, FrosslConfig};
use ssl_icone::icone_loss;
use ssl_ijepa::{apply_masks, ijepa_loss, target_layer_norm};
use ssl_mae::{mae_loss, patchify};
use ssl_vicreg::{vicreg_loss, VicregConfig};

/// `x[k] = sin(a·k + c)` over the row-major flat index `k` of `shape` (the script's `formula`).
fn formula(shape: &[usize], a: f64, c: f64) -> Tensor {
    let n = shape.iter().product::<usize>();
    let values = (0..n).map(|k| (a * k as f64 + c).sin()).collect::<Vec<_>>();
    Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
}

fn close(got: &Tensor, want: f64) {
    let got = got
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(
        (got - want).abs() <= 1e-9 * want.abs().max(1.0),
        "{got} vs PyTorch {want}"
    );
}

#[test]
fn vicreg_and_frossl_equal_the_pytorch_bench_for_three_views() {
    let wide = formula(&[3, 4, 6], 0.37, 0.1);
    let tall = formula(&[3, 6, 4], 0.37, 0.1);
    close(
        &vicreg_loss(&tall, &VicregConfig::default()).unwrap(),
        42.551734099852574,
    );
    close(
        &vicreg_loss(&wide, &VicregConfig::default()).unwrap(),
        42.31150121249471,
    );
    close(
        &frossl_loss(&tall, &FrosslConfig::default()).unwrap(),
        4.735890218751272,
    );
    close(
        &frossl_loss(&wide, &FrosslConfig::default()).unwrap(),
        11.038330103214417,
    );
}

#[test]
fn icone_equals_the_pytorch_bench_for_three_views() {
    let f = formula(&[3, 4, 6], 0.37, 0.1);
    let table = formula(&[5, 6], 0.53, 0.2);
    let ids = Tensor::new(&[4u32, 0, 2, 1], &Device::Cpu).unwrap();
    close(&icone_loss(&f, &table, &ids).unwrap(), 2.8977042202323453);
}

#[test]
fn mae_equals_the_pytorch_bench_with_and_without_normalised_pixels() {
    let target = patchify(&formula(&[2, 3, 4, 4], 0.37, 0.1), 2).unwrap();
    let pred = formula(&[2, 4, 12], 0.53, 0.2);
    let mask = Tensor::new(&[[1f64, 0., 1., 0.], [0., 1., 1., 1.]], &Device::Cpu).unwrap();
    close(
        &mae_loss(&pred, &target, &mask, true).unwrap(),
        1.230779168779599,
    );
    close(
        &mae_loss(&pred, &target, &mask, false).unwrap(),
        0.848405355320728,
    );
}

#[test]
fn ijepa_equals_the_pytorch_bench_for_two_target_blocks() {
    let device = Device::Cpu;
    let h = target_layer_norm(&formula(&[2, 5, 6], 0.37, 0.1)).unwrap();
    let masks = [
        Tensor::new(&[[0u32, 2, 4], [1, 3, 0]], &device).unwrap(),
        Tensor::new(&[[4u32, 4, 1], [2, 0, 3]], &device).unwrap(),
    ];
    let pred = (formula(&[4, 3, 6], 0.53, 0.2) * 3.0).unwrap();
    close(
        &ijepa_loss(&pred, &apply_masks(&h, &masks).unwrap()).unwrap(),
        1.623150564074204,
    );
}
