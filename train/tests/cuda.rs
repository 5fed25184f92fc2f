//! The training step on a CUDA GPU against the CPU's fused kernels (see `parity/mod.rs`): the
//! GPU runs cuDNN's convolutions, Candle's CUDA kernels, cuBLAS and our composed ops; the CPU
//! our Winograd and im2col convolutions, fused batch/layer norm and attention, so each side
//! checks the other. cuDNN runs without TF32 here (exact f32); `ssl run` allows it, as PyTorch.
//!
//! Built only with `--features cuda`, and needs a GPU:
//! `cargo test --release -p ssl-train --features cuda --test cuda -- --test-threads 1`.
//! CI builds the CPU workspace, where this file compiles to nothing.
#![cfg(feature = "cuda")]

mod parity;

use anyhow::Result;
use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use parity::{assert_rows_match, compare, config, trace, ENCODER_ROWS, MASKED_ROWS};
use ssl_models::attention::multi_head_attention;
use ssl_models::autocast::{autocast, Precision};
use ssl_models::dispatch::composed_only;
use ssl_models::gelu::gelu_erf;
use ssl_models::layer_norm::layer_norm;
use ssl_models::pool::max_pool_channel_major;
use ssl_models::residual::residual_relu;
use ssl_models::softmax::softmax_last_dim;
use ssl_models::{BatchNorm, Conv, Linear};
use ssl_train::setup;

fn gpu() -> Device {
    ssl_models::conv::cudnn::set_tf32(false);
    // As training opens it (cudarc's per-buffer events off).
    setup::device("cuda")
        .expect("this test needs a CUDA GPU (it is built only with --features cuda)")
}

/// The largest difference between `a` and `b` over the largest magnitude of `a`.
fn relative_error(a: &Tensor, b: &Tensor) -> Result<f64> {
    let scalar = |t: Tensor| -> Result<f64> { Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?) };
    let scale = scalar(a.abs()?.max_all()?)?;
    Ok(scalar((a - b.to_device(a.device())?)?.abs()?.max_all()?)? / scale.max(f64::MIN_POSITIVE))
}

/// Whether `error` is at most `limit` (false for a NaN).
fn within(error: f64, limit: f64) -> bool {
    error <= limit
}

/// `f` of the inputs `xs` as variables on `device`, and the gradients of `Σ f(xs)·r` with
/// respect to each, all brought to the CPU.
fn value_and_gradients(
    xs: &[&Tensor],
    r: &Tensor,
    device: &Device,
    f: impl Fn(&[Tensor]) -> candle_core::Result<Tensor>,
) -> Result<Vec<Tensor>> {
    let vars = xs
        .iter()
        .map(|x| Var::from_tensor(&x.to_device(device)?))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let inputs: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&inputs)?;
    let grads = (&y * r.to_device(device)?)?.sum_all()?.backward()?;
    let mut out = vec![y.to_device(&Device::Cpu)?];
    for v in &inputs {
        out.push(grads.get(v).expect("a gradient").to_device(&Device::Cpu)?);
    }
    Ok(out)
}

/// Compares the CPU op's tensors with the GPU's, each within 1e-5 of the CPU tensor's largest
/// magnitude, and adds a line to `report` for each that is not.
fn check_within_1e5(
    report: &mut Vec<String>,
    what: &str,
    cpu: &[Tensor],
    gpu: &[Tensor],
) -> Result<()> {
    for (i, (a, b)) in cpu.iter().zip(gpu).enumerate() {
        let error = relative_error(a, b)?;
        println!("{what} [{i}]: largest error {error:.1e}");
        if !within(error, 1e-5) {
            report.push(format!("{what} [{i}]: relative error {error:.2e}"));
        }
    }
    Ok(())
}

/// Our CUDA kernels against the CPU ops, values and every gradient within 1e-5 of each
/// tensor's largest magnitude, f32 and f64: train-mode batch norm with its ReLU (rows long
/// enough to split into segments, inputs off zero mean; channel-major and batch-major in
/// memory, 2D, 3D and `[C, N]`), its running statistics and eval mode from them, the
/// residual join, and 2D/3D max pooling over ReLU outputs (ties at zero, the first maximum).
#[test]
fn our_cuda_kernels_match_the_cpu_ops() -> Result<()> {
    let device = gpu();
    let mut report = Vec::new();
    let mut check =
        |what: &str, cpu: &[Tensor], gpu: &[Tensor]| check_within_1e5(&mut report, what, cpu, gpu);
    for dtype in [DType::F32, DType::F64] {
        let shapes: [&[usize]; 4] = [
            &[64, 8, 16, 16],
            &[8, 8, 64, 64],
            &[24, 32],
            &[8, 4, 3, 4, 5],
        ];
        for shape in shapes {
            let c = shape[0];
            let x =
                ((Tensor::randn(0f64, 1.0, shape, &Device::Cpu)? * 3.0)? + 2.0)?.to_dtype(dtype)?;
            let gamma = Tensor::randn(1f64, 0.5, c, &Device::Cpu)?.to_dtype(dtype)?;
            let beta = Tensor::randn(0f64, 0.5, c, &Device::Cpu)?.to_dtype(dtype)?;
            let r = x.randn_like(0.0, 1.0)?;
            // `lying`: the input lies batch-major in memory, as our convolutions leave it on
            // CUDA (and as `forward_rows` sees `[N, C]`), and is normalised where it lies.
            let run = |device: &Device, lying: bool| -> Result<Vec<Tensor>> {
                let map = VarMap::new();
                let vb = VarBuilder::from_varmap(&map, dtype, device);
                let bn = BatchNorm::new(c, 1e-5, Some(0.1), vb)?;
                let vars = map.data().lock().expect("the var map").clone();
                vars["weight"].set(&gamma.to_device(device)?)?;
                vars["bias"].set(&beta.to_device(device)?)?;
                let (held, input) = match lying {
                    false => {
                        let x = Var::from_tensor(&x.to_device(device)?)?;
                        (x.clone(), x.as_tensor().clone())
                    }
                    true => {
                        let x = Var::from_tensor(&x.transpose(0, 1)?.to_device(device)?)?;
                        (x.clone(), x.transpose(0, 1)?)
                    }
                };
                let y = bn.forward_channel_major(&input, true, true)?;
                if lying {
                    assert!(y.transpose(0, 1)?.is_contiguous(), "{shape:?}: copied");
                }
                let grads = (&y * r.to_device(device)?)?.sum_all()?.backward()?;
                let grad = |t: &Tensor| grads.get(t).expect("a gradient").to_device(&Device::Cpu);
                let dx = grad(held.as_tensor())?;
                // Eval mode from the running statistics the step left, with and without ReLU
                // (one kernel on CUDA, where the input lies).
                let eval = |relu: bool| -> Result<Tensor> {
                    let y = bn.forward_channel_major(&input, relu, false)?;
                    if lying {
                        assert!(y.transpose(0, 1)?.is_contiguous(), "{shape:?}: eval copied");
                    }
                    Ok(y.to_device(&Device::Cpu)?)
                };
                Ok(vec![
                    y.to_device(&Device::Cpu)?,
                    if lying { dx.transpose(0, 1)? } else { dx },
                    grad(vars["weight"].as_tensor())?,
                    grad(vars["bias"].as_tensor())?,
                    bn.running_mean().to_device(&Device::Cpu)?,
                    bn.running_var().to_device(&Device::Cpu)?,
                    eval(true)?,
                    eval(false)?,
                ])
            };
            let cpu = run(&Device::Cpu, false)?;
            for lying in [false, true] {
                check(
                    &format!("batch norm {dtype:?} {shape:?}, batch-major in memory: {lying}"),
                    &cpu,
                    &run(&device, lying)?,
                )?;
            }
        }
        let h = Tensor::randn(0f64, 1.0, (64, 8, 8, 8), &Device::Cpu)?.to_dtype(dtype)?;
        let shortcut = h.randn_like(0.0, 1.0)?;
        let r = h.randn_like(0.0, 1.0)?;
        let join = |device: &Device| {
            value_and_gradients(&[&h, &shortcut], &r, device, |t| {
                residual_relu(&t[0], &t[1])
            })
        };
        check(
            &format!("residual join {dtype:?}"),
            &join(&Device::Cpu)?,
            &join(&device)?,
        )?;
        for shape in [&[4usize, 2, 17, 17][..], &[4, 2, 9, 9, 9]] {
            let x = Tensor::randn(0f64, 1.0, shape, &Device::Cpu)?
                .relu()?
                .to_dtype(dtype)?;
            let y = max_pool_channel_major(&x, 3, 2, 1)?;
            let r = y.randn_like(0.0, 1.0)?;
            let pool = |device: &Device| {
                value_and_gradients(&[&x], &r, device, |t| {
                    max_pool_channel_major(&t[0], 3, 2, 1)
                })
            };
            check(
                &format!("max pool {dtype:?} {shape:?}"),
                &pool(&Device::Cpu)?,
                &pool(&device)?,
            )?;
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// Our CUDA layer norm, softmax, GELU, linear layer and attention against the CPU ops, values and every gradient within
/// 1e-5 of each tensor's largest magnitude, f32 and f64, at ViT-S/16's shapes (2 images of 197
/// tokens: norms of width 384, 6 heads' 197 × 197 attention weights, the MLP's 1536 hidden
/// units) and at odd row lengths, 7 (1000 rows) and 1000 (7 rows): layer norm with its weight
/// and bias gradients on inputs off zero mean, softmax of logits up to ±20, GELU also at zero,
/// tiny and tail inputs (where its backward does not read `Φ` off the output); and ViT-S/16's
/// MLP layer and attention, which on CUDA keep for the backward only what the CPU's fused ops
/// keep (the bias added after a detached product; the attention weights), against those ops.
#[test]
fn our_transformer_kernels_match_the_cpu_ops() -> Result<()> {
    let device = gpu();
    let mut report = Vec::new();
    let mut check =
        |what: &str, cpu: &[Tensor], gpu: &[Tensor]| check_within_1e5(&mut report, what, cpu, gpu);
    let randn = |shape: &[usize], scale: f64, shift: f64, dtype: DType| -> Result<Tensor> {
        let x = Tensor::randn(0f64, 1.0, shape, &Device::Cpu)?;
        Ok(((x * scale)? + shift)?.to_dtype(dtype)?)
    };
    let rows: [&[usize]; 3] = [&[2, 197, 384], &[1000, 7], &[7, 1000]];
    for dtype in [DType::F32, DType::F64] {
        for shape in rows {
            let d = shape[shape.len() - 1];
            let x = randn(shape, 3.0, 2.0, dtype)?;
            let gamma = randn(&[d], 0.5, 1.0, dtype)?;
            let beta = randn(&[d], 0.5, 0.0, dtype)?;
            let r = randn(shape, 1.0, 0.0, dtype)?;
            let run = |device: &Device| -> Result<Vec<Tensor>> {
                let map = VarMap::new();
                let ln = layer_norm(d, 1e-6, VarBuilder::from_varmap(&map, dtype, device))?;
                let vars = map.data().lock().expect("the var map").clone();
                vars["weight"].set(&gamma.to_device(device)?)?;
                vars["bias"].set(&beta.to_device(device)?)?;
                let x = Var::from_tensor(&x.to_device(device)?)?;
                let y = ln.forward(x.as_tensor())?;
                let grads = (&y * r.to_device(device)?)?.sum_all()?.backward()?;
                let grad = |t: &Tensor| grads.get(t).expect("a gradient").to_device(&Device::Cpu);
                Ok(vec![
                    y.to_device(&Device::Cpu)?,
                    grad(x.as_tensor())?,
                    grad(vars["weight"].as_tensor())?,
                    grad(vars["bias"].as_tensor())?,
                ])
            };
            check(
                &format!("layer norm {dtype:?} {shape:?}"),
                &run(&Device::Cpu)?,
                &run(&device)?,
            )?;
        }
        let attention: &[usize] = &[2, 6, 197, 197];
        for shape in [attention, rows[1], rows[2]] {
            let x = randn(shape, 5.0, 0.0, dtype)?;
            let r = randn(shape, 1.0, 0.0, dtype)?;
            let softmax = |device: &Device| {
                value_and_gradients(&[&x], &r, device, |t| softmax_last_dim(&t[0]))
            };
            check(
                &format!("softmax {dtype:?} {shape:?}"),
                &softmax(&Device::Cpu)?,
                &softmax(&device)?,
            )?;
        }
        // ViT-S/16's MLP input layer (384 → 1536 over 2 × 197 tokens) with its bias, the node
        // that adds the bias after a detached product on CUDA against the CPU's fused op.
        let x = randn(&[2, 197, 384], 1.0, 0.0, dtype)?;
        let w = randn(&[1536, 384], 0.05, 0.0, dtype)?;
        let b = randn(&[1536], 0.5, 0.0, dtype)?;
        let r = randn(&[2, 197, 1536], 1.0, 0.0, dtype)?;
        let linear = |device: &Device| {
            value_and_gradients(&[&x, &w, &b], &r, device, |t| {
                Linear::new(t[1].clone(), Some(t[2].clone())).forward(&t[0])
            })
        };
        check(
            &format!("linear {dtype:?}"),
            &linear(&Device::Cpu)?,
            &linear(&device)?,
        )?;
        // ViT-S/16's attention (6 heads of 64 over 197 tokens), the op that keeps only its
        // weights on CUDA against the CPU's fused op.
        let qkv = randn(&[2, 197, 3 * 384], 1.0, 0.0, dtype)?;
        let r = randn(&[2, 197, 384], 1.0, 0.0, dtype)?;
        let attention = |device: &Device| {
            value_and_gradients(&[&qkv], &r, device, |t| multi_head_attention(&t[0], 6))
        };
        check(
            &format!("attention {dtype:?}"),
            &attention(&Device::Cpu)?,
            &attention(&device)?,
        )?;
        let special = [
            0.0, -0.0, 1e-35, -1e-35, 1e-31, 3e-7, -3e-7, -9.0, -16.0, 7.0, 40.0,
        ];
        let special = Tensor::new(&special[..], &Device::Cpu)?.to_dtype(dtype)?;
        for x in [
            randn(&[2, 197, 1536], 3.0, 0.0, dtype)?,
            randn(&[1001], 3.0, 0.0, dtype)?,
            special,
        ] {
            let r = x.randn_like(0.0, 1.0)?;
            let gelu =
                |device: &Device| value_and_gradients(&[&x], &r, device, |t| gelu_erf(&t[0]));
            check(
                &format!("GELU {dtype:?} {:?}", x.dims()),
                &gelu(&Device::Cpu)?,
                &gelu(&device)?,
            )?;
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// cuDNN's convolution and both its gradients against the CPU kernels at our encoders' shapes
/// (3×3 at strides 1 and 2, 1×1 at strides 1 and 2, the 7×7 stems, their 3D versions; inputs
/// that lie channel-major and, in f32, batch-major in memory, as activations do on CUDA), as
/// errors relative to each f32 tensor's largest magnitude: f32 within 1e-4 (sums over up to
/// 74k products in another order, 1.5e-5 seen); bf16 products within 8× the distance from f32
/// of the CPU's composed ops on bf16-rounded operands. The GPU also rounds `dy` and its results
/// to bf16, so its distance is of that order, not equal: 1.2–1.5× on most shapes, 3× (2D) and
/// 6× (3D, 1.6e-2) on the stems' input gradients, whose cuDNN bf16 kernels sum 22k products a
/// value.
#[test]
fn cudnn_convolutions_match_the_cpu_kernels() -> Result<()> {
    let device = gpu();
    // (C, O, kernel, stride, padding, [N, *S])
    type Case = (usize, usize, usize, usize, usize, &'static [usize]);
    let cases: [Case; 10] = [
        (3, 64, 3, 1, 1, &[8, 32, 32]),
        (64, 256, 1, 1, 0, &[8, 16, 16]),
        (64, 64, 3, 1, 1, &[8, 32, 32]),
        (64, 128, 3, 2, 1, &[8, 32, 32]),
        (64, 128, 1, 2, 0, &[8, 32, 32]),
        (3, 64, 7, 2, 3, &[4, 64, 64]),
        (1, 64, 7, 2, 3, &[2, 32, 32, 32]),
        (64, 64, 3, 1, 1, &[2, 8, 8, 8]),
        (64, 128, 3, 2, 1, &[2, 8, 8, 8]),
        (64, 128, 1, 2, 0, &[2, 8, 8, 8]),
    ];
    let mut report = Vec::new();
    for (c, o, k, stride, padding, batch_and_size) in cases {
        let (n, size) = (batch_and_size[0], &batch_and_size[1..]);
        let mut x_dims = vec![c, n];
        x_dims.extend(size);
        let mut w_dims = vec![o, c];
        w_dims.extend(std::iter::repeat_n(k, size.len()));
        let x = Tensor::randn(0f32, 1.0, x_dims, &Device::Cpu)?;
        let w = (Tensor::randn(0f32, 1.0, w_dims, &Device::Cpu)? / ((c * k * k) as f64).sqrt())?;
        let out = Conv::new(w.clone(), None, stride, padding)?.forward_channel_major(&x)?;
        let r = out.randn_like(0.0, 1.0)?;
        let conv = |device: &Device, precision: Precision| {
            let _precision = autocast(precision);
            value_and_gradients(&[&x, &w], &r, device, |t| {
                Conv::new(t[1].clone(), None, stride, padding)?.forward_channel_major(&t[0])
            })
        };
        let exact = conv(&Device::Cpu, Precision::F32)?;
        let emulated = {
            // The operands rounded, then multiplied in f32 by Candle's ops: the distance from
            // f32 that bf16 operands alone make, on every shape (the CPU's own bf16 path keeps
            // Winograd's layers in f32).
            let _composed = composed_only();
            conv(&Device::Cpu, Precision::Bf16)?
        };
        // The input as activations lie on CUDA: batch-major in memory, convolved where it lies.
        let lying = || -> Result<Vec<Tensor>> {
            let held = Var::from_tensor(&x.transpose(0, 1)?.to_device(&device)?)?;
            let wg = Var::from_tensor(&w.to_device(&device)?)?;
            let y = Conv::new(wg.as_tensor().clone(), None, stride, padding)?
                .forward_channel_major(&held.transpose(0, 1)?)?;
            assert!(y.transpose(0, 1)?.is_contiguous(), "the output was copied");
            let grads = (&y * r.to_device(&device)?)?.sum_all()?.backward()?;
            let grad = |v: &Var| grads.get(v).expect("a gradient").to_device(&Device::Cpu);
            Ok(vec![
                y.to_device(&Device::Cpu)?,
                grad(&held)?.transpose(0, 1)?,
                grad(&wg)?,
            ])
        };
        let runs = [
            (Precision::F32, "", conv(&device, Precision::F32)?),
            (Precision::F32, ", lying batch-major", lying()?),
            (Precision::Bf16, "", conv(&device, Precision::Bf16)?),
        ];
        for (precision, lies, gpu) in runs {
            for (i, name) in ["y", "dx", "dw"].iter().enumerate() {
                let error = relative_error(&exact[i], &gpu[i])?;
                let limit = match precision {
                    Precision::F32 => 1e-4,
                    Precision::Bf16 => 8.0 * relative_error(&exact[i], &emulated[i])?,
                };
                let what = format!(
                    "{c}→{o} k{k} s{stride} p{padding} on {batch_and_size:?}, {precision:?}{lies}, \
                     {name}"
                );
                println!("{what}: largest error {error:.1e} (allowed {limit:.1e})");
                if !within(error, limit) {
                    report.push(format!(
                        "{what}: relative error {error:.2e}, allowed {limit:.1e}"
                    ));
                }
            }
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// The four rows of the `train_step` bench at test size.
#[test]
fn every_encoder_trains_on_cuda_as_on_the_cpu() -> Result<()> {
    assert_rows_match(&ENCODER_ROWS, &gpu(), false)
}

/// MAE, I-JEPA and LeJEPA on a ViT-T with 4-px patches (the registered objectives' test below
/// runs the digits CNN, which these refuse).
#[test]
fn masked_objectives_train_on_cuda_as_on_the_cpu() -> Result<()> {
    assert_rows_match(&MASKED_ROWS, &gpu(), false)
}

/// Every registered objective on the main job's encoder (digits CNN, projector 512-512), B = 16
/// digits × 2 views: the first step's loss and gradients, then three steps' losses. An objective
/// the default configuration refuses must be refused on both devices.
#[test]
fn every_objective_gives_the_cpu_loss_and_gradients_on_cuda() -> Result<()> {
    let device = gpu();
    let base = config(&[])?;
    let data = setup::data(&base)?;
    let b = 16;
    let positions: Vec<usize> = data.train[..b].to_vec();
    let clean = setup::samples(&data, &positions, &Device::Cpu)?;
    let images = Tensor::cat(&[(&clean + 0.1)?, (&clean * 0.9)?], 0)?;
    let labels = setup::labels(&data.dataset, &positions);
    let mut report = Vec::new();
    for registration in ssl_core::registry() {
        let name = registration.name;
        let cfg = config(&[
            &format!("objective.name={name}"),
            &format!("train.batch_size={b}"),
            "train.views=2",
        ])?;
        let cpu = match trace(&cfg, &data, &images, &labels, 3, &Device::Cpu, false) {
            Ok(t) => t,
            Err(refused) => {
                let on_gpu = trace(&cfg, &data, &images, &labels, 3, &device, false);
                println!("{name}: refused on the CPU ({})", refused.root_cause());
                if on_gpu.is_ok() {
                    report.push(format!("{name}: refused on the CPU, trained on the GPU"));
                }
                continue;
            }
        };
        let gpu = match trace(&cfg, &data, &images, &labels, 3, &device, false) {
            Ok(t) => t,
            Err(e) => {
                report.push(format!("{name}: failed on the GPU: {e:#}"));
                continue;
            }
        };
        let (problems, largest) = compare(&cpu, &gpu, None, 1e-2)?;
        println!(
            "{name}: loss {:.6} / {:.6}, largest gradient error {largest:.1e}",
            cpu.loss, gpu.loss
        );
        report.extend(problems.into_iter().map(|p| format!("{name}: {p}")));
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
    Ok(())
}

/// SwAV's Sinkhorn–Knopp at the paper's size (B = 256, K = 3000) runs on the GPU in the log
/// domain and gives the codes of the CPU's f64 loops: to 1e-12 in f64 and, from f32 cosine
/// scores, within f32's rounding of `ln q` (the CPU test holds 2e-6; the GPU's reductions add
/// up in another order).
#[test]
fn sinkhorn_on_cuda_gives_the_cpu_codes() -> Result<()> {
    let device = gpu();
    let z = ssl_core::testing::randn(0f64, 1., (256, 64), &Device::Cpu)?;
    let c = ssl_core::testing::randn(0f64, 1., (3000, 64), &Device::Cpu)?;
    let unit = |t: &Tensor| -> Result<Tensor> { Ok(ssl_linalg::normalize_rows(t)?) };
    let scores = unit(&z)?.matmul(&unit(&c)?.t()?)?;
    for (dtype, limit) in [(DType::F64, 1e-12), (DType::F32, 5e-6)] {
        let scores = scores.to_dtype(dtype)?;
        let host = ssl_swav::sinkhorn(&scores, 0.05, 3)?;
        let on_gpu = ssl_swav::sinkhorn(&scores.to_device(&device)?, 0.05, 3)?;
        assert_eq!(on_gpu.dtype(), dtype);
        let error = (on_gpu.to_device(&Device::Cpu)? - &host)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        assert!(error <= limit, "{dtype:?}: {error}");
    }
    Ok(())
}

/// `train.precision: bf16` on the GPU multiplies in bf16 (the CPU only rounds the operands):
/// five steps follow f32's losses within bf16's precision, and differ from them.
#[test]
fn bf16_training_on_cuda_follows_f32() -> Result<()> {
    let device = gpu();
    let losses = |precision: &str| -> Result<Vec<f64>> {
        let cfg = config(&[
            "objective.name=icone",
            &format!("train.precision={precision}"),
        ])?;
        let data = setup::data(&cfg)?;
        let b = 32;
        let positions: Vec<usize> = data.train[..b].to_vec();
        let clean = setup::samples(&data, &positions, &Device::Cpu)?;
        let images = Tensor::cat(&[(&clean + 0.1)?, (&clean - 0.1)?], 0)?;
        let labels = setup::labels(&data.dataset, &positions);
        Ok(trace(&cfg, &data, &images, &labels, 5, &device, false)?.losses)
    };
    let (full, bf16) = (losses("f32")?, losses("bf16")?);
    println!("f32 {full:?}\nbf16 {bf16:?}");
    assert!(full[4] < full[0], "training lowers the loss: {full:?}");
    let mut largest = 0.0f64;
    for (a, b) in full.iter().zip(&bf16) {
        let relative = (a - b).abs() / a.abs();
        assert!(relative < 2e-2, "f32 {full:?} vs bf16 {bf16:?}");
        largest = largest.max(relative);
    }
    assert!(largest > 0.0, "bf16 products must change the numbers");
    Ok(())
}

/// SGD and LARS on CUDA (our kernels; LARS's norms summed on the device and turned into the
/// trust ratio there, with no read to the host) keep the parameter and its momentum buffer
/// equal to the CPU's in-place step over four steps: plain, Nesterov and decayed SGD, LARS with
/// and without Nesterov, and LARS on a zero parameter (the unadapted step), on more values than
/// one block takes; f32 within 1e-6 of their scale (different summation orders of the norms),
/// f64 within 1e-12.
#[test]
fn sgd_and_lars_steps_match_the_cpu() -> Result<()> {
    use ssl_optim::sgd::SgdStep;
    let gpu = gpu();
    let step = |momentum, nesterov, weight_decay, lars_eta| SgdStep {
        lr: 0.1,
        weight_decay,
        momentum,
        nesterov,
        lars_eta,
    };
    let cases = [
        ("sgd", step(0.9, false, 0.0, None), false),
        ("sgd nesterov", step(0.9, true, 0.0, None), false),
        ("sgd decay", step(0.9, false, 0.05, None), false),
        ("lars", step(0.9, false, 0.05, Some(0.02)), false),
        ("lars nesterov", step(0.9, true, 0.05, Some(0.02)), false),
        (
            "lars zero parameter",
            step(0.9, false, 0.0, Some(0.02)),
            true,
        ),
    ];
    for (dtype, limit) in [(DType::F32, 1e-6), (DType::F64, 1e-12)] {
        for (name, step, zero) in cases {
            let w0 = Tensor::randn(0f64, 1.0, (37, 1051), &Device::Cpu)?.to_dtype(dtype)?;
            let w0 = if zero { w0.zeros_like()? } else { w0 };
            let (w, buf) = (w0.copy()?, w0.zeros_like()?);
            let (gw, gbuf) = (w0.to_device(&gpu)?, w0.zeros_like()?.to_device(&gpu)?);
            for _ in 0..4 {
                let g = Tensor::randn(0f64, 1.0, (37, 1051), &Device::Cpu)?.to_dtype(dtype)?;
                let gg = g.to_device(&gpu)?;
                assert!(
                    SgdStep::fuses(&gw, &gg, Some(&gbuf)),
                    "{name}: not our kernels"
                );
                step.in_place(&w, &g, &buf)?;
                step.in_place(&gw, &gg, &gbuf)?;
            }
            for (what, cpu, cuda) in [("w", &w, &gw), ("buf", &buf, &gbuf)] {
                let error = relative_error(cpu, cuda)?;
                assert!(within(error, limit), "{dtype:?} {name}, {what}: {error:e}");
            }
        }
    }
    Ok(())
}

/// The optimiser's CUDA step — every parameter in one launch (two for LARS), the clipping
/// factor applied in the kernel — keeps the parameters and the optimiser's state as the CPU's
/// per-parameter passes do over four steps: AdamW, SGD with Nesterov and LARS, with and without
/// global clipping (on: the gradients' norm is ~200, so the factor is < 1), over parameters of
/// one value, of fewer values than a block's chunk and of more (38,887), matrices and vectors
/// (out of decay and LARS). To 10⁻⁵ of their scale: each side sums the gradients' squares for
/// the clipping factor in f32, in its own order.
#[test]
fn every_parameter_steps_in_one_launch_as_on_the_cpu() -> Result<()> {
    use ssl_core::Progress;
    use ssl_optim::{Optimizer, OptimizerKind, OptimizerSettings};
    let gpu = gpu();
    let shapes: [&[usize]; 4] = [&[1], &[300], &[37, 1051], &[5, 7]];
    let randn = || -> Result<Vec<Tensor>> {
        let draw = |s: &&[usize]| Tensor::randn(0f32, 1.0, *s, &Device::Cpu);
        Ok(shapes
            .iter()
            .map(draw)
            .collect::<candle_core::Result<_>>()?)
    };
    let at = Progress {
        step: 0,
        epoch: 0,
        steps_per_epoch: 1,
        total_steps: 1,
        seed: 0,
    };
    for kind in [
        OptimizerKind::Adamw,
        OptimizerKind::Sgd,
        OptimizerKind::Lars,
    ] {
        for clip in [0.0, 1.0] {
            let cfg = OptimizerSettings {
                kind,
                nesterov: kind == OptimizerKind::Sgd,
                weight_decay: 0.05,
                clip_grad_norm: clip,
                ..OptimizerSettings::default()
            };
            let initial = randn()?;
            let vars = |dev: &Device| -> Result<Vec<(String, Var)>> {
                let var = |(i, t): (usize, &Tensor)| -> Result<(String, Var)> {
                    Ok((format!("p{i}"), Var::from_tensor(&t.to_device(dev)?)?))
                };
                initial.iter().enumerate().map(var).collect()
            };
            let sides = [vars(&Device::Cpu)?, vars(&gpu)?];
            let mut optimisers = sides
                .iter()
                .map(|vars| Optimizer::new(&cfg, vars.clone(), &[]))
                .collect::<Result<Vec<_>>>()?;
            for _ in 0..4 {
                let r = randn()?;
                for (vars, optimiser) in sides.iter().zip(&mut optimisers) {
                    // Σᵢ Σ wᵢ·rᵢ: each parameter's gradient is its rᵢ.
                    let dev = vars[0].1.device();
                    let mut loss = Tensor::zeros((), DType::F32, dev)?;
                    for ((_, w), r) in vars.iter().zip(&r) {
                        loss = (loss + (w.as_tensor() * r.to_device(dev)?)?.sum_all()?)?;
                    }
                    optimiser.step(&loss.backward()?, 0.1, &at)?;
                }
            }
            let case = format!("{kind:?}, clip {clip}");
            for ((name, cpu), (_, cuda)) in sides[0].iter().zip(&sides[1]) {
                let error = relative_error(cpu.as_tensor(), cuda.as_tensor())?;
                assert!(within(error, 1e-5), "{case}, {name}: {error:e}");
            }
            let (cpu, cuda) = (optimisers[0].state()?, optimisers[1].state()?);
            assert_eq!(cpu.len(), cuda.len(), "{case}: state entries");
            for (key, value) in &cpu {
                let error = relative_error(value, &cuda[key])?;
                assert!(within(error, 1e-5), "{case}, {key}: {error:e}");
            }
        }
    }
    Ok(())
}

/// Batches staged on a loader thread — copied through page-locked buffers (reused in turn) on
/// that thread's stream — read on the training thread as the values they were made from,
/// global and local views alike, for more batches than there are buffers in turn.
#[test]
fn batches_staged_on_the_loader_thread_arrive_intact() -> Result<()> {
    use ssl_data::ViewBatch;
    use ssl_train::staging::Stager;
    let gpu = gpu();
    let (b, views, locals) = (4, 2, 3);
    let (sample, local) = ([3, 32, 32], [3, 16, 16]);
    let batches: Vec<ViewBatch> = (0..5)
        .map(|k| {
            let values = |n: usize| (0..n).map(|i| (k * 1_000_003 + i) as f32).collect();
            ViewBatch {
                views: values(views * b * 3 * 32 * 32),
                instance_ids: (0..b as u32).collect(),
                labels: vec![0; b],
                batch_size: b,
                views_count: views,
                local_views: values(locals * b * 3 * 16 * 16),
                local_count: locals,
                local_shape: local.to_vec(),
                made_in: std::time::Duration::ZERO,
            }
        })
        .collect();
    let expected: Vec<(Vec<f32>, Vec<f32>)> = batches
        .iter()
        .map(|b| (b.views.clone(), b.local_views.clone()))
        .collect();
    let (sender, received) = std::sync::mpsc::channel();
    let mut stager = Stager::new(&gpu, &sample);
    let loader = std::thread::spawn(move || {
        for batch in batches {
            sender.send(stager.stage(batch)).unwrap();
        }
    });
    for (k, (views, local_views)) in expected.iter().enumerate() {
        let staged = received.recv()??;
        let (images, local_images) = staged.tensors()?;
        assert_eq!(images.dims(), [views.len() / (3 * 32 * 32), 3, 32, 32]);
        assert_eq!(&images.flatten_all()?.to_vec1::<f32>()?, views, "batch {k}");
        let local_images = local_images.expect("local views staged");
        assert_eq!(
            &local_images.flatten_all()?.to_vec1::<f32>()?,
            local_views,
            "batch {k}, local views"
        );
    }
    loader.join().unwrap();
    Ok(())
}

/// Strided ops upload each distinct layout (dims and strides) once and reuse it (the vendored
/// Candle's layout cache, `vendor/README.md`): two uploads of one layout are the same device
/// buffer, and ops on several layouts taken in turn, each many times, still give the CPU's
/// values.
#[test]
fn strided_ops_reuse_each_layout_upload_and_give_the_cpu_values() -> Result<()> {
    use candle_core::cuda_backend::SlicePtrOrNull;
    let device = gpu();
    let cuda = device.as_cuda_device()?;
    let layout = vec![4, 6, 1, 4];
    let cached = |params: Vec<usize>| match SlicePtrOrNull::params_from_vec(cuda, params) {
        Ok(SlicePtrOrNull::Cached(slice)) => Ok(slice),
        Ok(_) => anyhow::bail!("a layout upload was not cached"),
        Err(e) => Err(e.into()),
    };
    let (first, again) = (cached(layout.clone())?, cached(layout)?);
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    assert!(!std::sync::Arc::ptr_eq(&first, &cached(vec![6, 4, 4, 1])?));

    let x = ssl_core::testing::randn(0f32, 1., (6, 8), &Device::Cpu)?;
    let strided = |x: &Tensor| -> candle_core::Result<Vec<Tensor>> {
        let t = x.t()?;
        let narrow = x.narrow(1, 2, 5)?;
        Ok(vec![
            t.exp()?,
            t.contiguous()?,
            narrow.affine(2., 1.)?,
            t.broadcast_add(&x.narrow(0, 0, 1)?.t()?)?,
            narrow.sum_keepdim(1)?,
        ])
    };
    let expected = strided(&x)?;
    let x_gpu = x.to_device(&device)?;
    for round in 0..3 {
        for (k, (on_gpu, cpu)) in strided(&x_gpu)?.iter().zip(&expected).enumerate() {
            let error = relative_error(cpu, on_gpu)?;
            assert!(within(error, 1e-6), "round {round}, op {k}: {error:e}");
        }
    }
    Ok(())
}
