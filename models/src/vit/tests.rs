use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarBuilder;
use ssl_core::ParamStore;

use super::*;
use crate::util::testing::{finite_diff_step, max_abs_diff, rand_tensor};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

#[test]
fn keys_and_shapes_equal_timm_vit_small_patch16_224() {
    let expected: BTreeMap<String, Vec<usize>> =
        include_str!("../../tests/fixtures/timm_vit_small_patch16_224.tsv")
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("head."))
            .map(|l| {
                let (key, shape) = l.split_once('\t').expect("key<TAB>shape");
                let dims = shape.split(',').map(|d| d.parse().unwrap()).collect();
                (key.to_string(), dims)
            })
            .collect();
    assert_eq!(expected.len(), 150);
    let store = ssl_core::ParamStore::new(0);
    let vit = VisionTransformer::new(&VitConfig::small(), store.var_builder(&Device::Cpu)).unwrap();
    assert_eq!(vit.output_dim(), 384);
    let ours: BTreeMap<String, Vec<usize>> = store
        .vars()
        .into_iter()
        .map(|(k, v)| (k, v.dims().to_vec()))
        .collect();
    assert_eq!(ours, expected);
}

/// timm's own ViT (weights, inputs and outputs from `tests/golden/vit_timm.py`), loaded by key:
/// the forward equals timm's at the learned size and with the resampled positional embedding.
#[test]
fn forward_equals_timm_at_the_learned_and_at_another_size() {
    let tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(format!("{GOLDEN}/vit_timm.safetensors"), &Device::Cpu)
            .unwrap();
    let vb = VarBuilder::from_tensors(tensors.clone(), DType::F32, &Device::Cpu);
    let cfg = VitConfig {
        patch_size: 16,
        embed_dim: 24,
        depth: 2,
        num_heads: 2,
        mlp_ratio: 4,
        in_channels: 3,
        img_size: 32,
    };
    let vit = VisionTransformer::new(&cfg, vb).unwrap();
    for side in [32, 48] {
        let y = vit
            .forward(&tensors[&format!("test.input_{side}")])
            .unwrap();
        let d = max_abs_diff(&y, &tensors[&format!("test.output_{side}")]);
        assert!(d < 1e-5, "{side} px: {d}");
    }
}

#[test]
fn resampling_weights_equal_timm_resample_abs_pos_embed() {
    let text = include_str!("../../tests/golden/pos_embed_bicubic.txt");
    let mut lines = text.lines();
    let grid: Vec<f64> = (2..34).map(|k| (0.7 * k as f64).sin()).collect(); // after the class row
    let mut cases = 0;
    while let (Some(size), Some(values)) = (lines.next(), lines.next()) {
        let (gh, gw) = size.split_once(' ').unwrap();
        let (gh, gw): (usize, usize) = (gh.parse().unwrap(), gw.parse().unwrap());
        let expected: Vec<f64> = values.split(' ').map(|v| v.parse().unwrap()).collect();
        let (mh, mw) = (resample_matrix(4, gh), resample_matrix(4, gw));
        for i in 0..gh {
            for j in 0..gw {
                for c in 0..2 {
                    let mut v = 0.0;
                    for a in 0..4 {
                        for b in 0..4 {
                            v += mh[i * 4 + a] * mw[j * 4 + b] * grid[(a * 4 + b) * 2 + c];
                        }
                    }
                    let e = expected[(i * gw + j) * 2 + c];
                    assert!((v - e).abs() < 1e-5, "{gh}x{gw} [{i},{j},{c}]: {v} vs {e}");
                }
            }
        }
        cases += 1;
    }
    assert_eq!(cases, 4);
    // The same grid is the identity (timm computes in f32, hence 1e-5 above).
    let same = resample_matrix(5, 5);
    for i in 0..5 {
        for j in 0..5 {
            assert!((same[i * 5 + j] - f64::from(u8::from(i == j))).abs() < 1e-12);
        }
    }
}

#[test]
fn gradients_match_finite_differences() {
    let cfg = VitConfig {
        patch_size: 4,
        embed_dim: 8,
        depth: 1,
        num_heads: 2,
        mlp_ratio: 2,
        in_channels: 1,
        img_size: 8,
    };
    let store = ParamStore::new(7);
    let vit = VisionTransformer::new(&cfg, store.var_builder(&Device::Cpu).set_dtype(DType::F64))
        .unwrap();
    // A class token and positional embedding away from ~0, so the test sees them.
    for (name, (_, var)) in store.vars().iter().enumerate() {
        let noise = rand_tensor(name as u64, var.dims(), DType::F64);
        var.set(&(var.as_tensor() + (noise * 0.3).unwrap()).unwrap())
            .unwrap();
    }
    // 12 px: the 2×2 learned grid resampled to 3×3.
    let x0 = rand_tensor(20, &[2, 1, 12, 12], DType::F64);
    let r = rand_tensor(21, &[2, 8], DType::F64);
    let loss = |x: &Tensor| (vit.forward(x).unwrap() * &r).unwrap().sum_all().unwrap();
    let x = Var::from_tensor(&x0).unwrap();
    let grads = loss(x.as_tensor()).backward().unwrap();
    let g: Vec<f64> = grads
        .get(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for i in (0..g.len()).step_by(13) {
        let fd = finite_diff_step(&x0, i, 1e-6, &|xp| loss(xp).to_scalar::<f64>().unwrap());
        assert!(
            (fd - g[i]).abs() < 1e-7 * (1.0 + fd.abs()),
            "dx[{i}]: {fd} vs {}",
            g[i]
        );
    }
    // Every parameter, the positional embedding through its resampling included.
    for (_, var) in store.vars() {
        let gv: Vec<f64> = grads
            .get(&var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let v0 = var.as_tensor().copy().unwrap();
        let i = gv.len() / 2;
        let fd = finite_diff_step(&v0, i, 1e-6, &|vp| {
            var.set(vp).unwrap();
            loss(&x0).to_scalar::<f64>().unwrap()
        });
        var.set(&v0).unwrap();
        assert!(
            (fd - gv[i]).abs() < 1e-7 * (1.0 + fd.abs()),
            "{:?}[{i}]: {fd} vs {}",
            var.dims(),
            gv[i]
        );
    }
}

#[test]
fn train_and_eval_agree_and_bad_sizes_are_clear_errors() {
    let store = ssl_core::ParamStore::new(3);
    let mut cfg = VitConfig::tiny();
    cfg.depth = 1;
    let vit = VisionTransformer::new(&cfg, store.var_builder(&Device::Cpu)).unwrap();
    let x = rand_tensor(4, &[2, 3, 32, 48], DType::F32);
    let train = Encoder::forward_t(&vit, &x, true).unwrap();
    assert_eq!(train.dims(), &[2, 192]);
    assert_eq!(
        max_abs_diff(&train, &Encoder::forward_t(&vit, &x, false).unwrap()),
        0.0
    );
    let err = vit
        .forward(&rand_tensor(5, &[2, 3, 30, 32], DType::F32))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("multiples of 16") && err.contains("--size 16"),
        "{err}"
    );
    assert!(vit
        .forward(&rand_tensor(5, &[2, 1, 32, 32], DType::F32))
        .is_err());
}

/// The encoder's last block computes the class token's row alone; values and every gradient
/// must equal those of the whole block with the other rows dropped after it.
#[test]
fn the_class_token_alone_in_the_last_block_equals_the_whole_block() {
    let cfg = VitConfig {
        patch_size: 4,
        embed_dim: 8,
        depth: 2,
        num_heads: 2,
        mlp_ratio: 2,
        in_channels: 1,
        img_size: 8,
    };
    let store = ParamStore::new(9);
    let vit = VisionTransformer::new(&cfg, store.var_builder(&Device::Cpu).set_dtype(DType::F64))
        .unwrap();
    for (name, (_, var)) in store.vars().iter().enumerate() {
        let noise = rand_tensor(40 + name as u64, var.dims(), DType::F64);
        var.set(&(var.as_tensor() + (noise * 0.3).unwrap()).unwrap())
            .unwrap();
    }
    let x = rand_tensor(30, &[3, 1, 8, 8], DType::F64);
    let whole_blocks = |x: &Tensor| -> Result<Tensor> {
        let (tokens, gh, gw) = vit.embed_patches(x)?;
        let cls = vit
            .cls_token
            .broadcast_as((tokens.dim(0)?, 1, cfg.embed_dim))?;
        let mut h = Tensor::cat(&[&cls, &tokens], 1)?.broadcast_add(&vit.positions(gh, gw)?)?;
        for block in &vit.blocks {
            h = block.forward(&h)?;
        }
        vit.norm.forward(&h.narrow(1, 0, 1)?.squeeze(1)?)
    };
    let (ours, whole) = (vit.forward(&x).unwrap(), whole_blocks(&x).unwrap());
    assert_eq!(ours.dims(), &[3, 8]);
    assert!(max_abs_diff(&ours, &whole) < 1e-12);
    let r = rand_tensor(31, &[3, 8], DType::F64);
    let grads = |y: Tensor| (y * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let (g_ours, g_whole) = (grads(ours), grads(whole));
    for (name, var) in store.vars() {
        let (a, b) = (g_ours.get(&var).unwrap(), g_whole.get(&var).unwrap());
        assert!(max_abs_diff(a, b) < 1e-12, "{name}");
    }
}
