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
        pool: VitPool::Class,
        pos_embed: PosEmbed::Learned,
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
    // A class token and positional embedding away from ~0, so the test sees them.
    let (store, vit) = perturbed_vit(&tiny_config(1), 7, 0, DType::F64);
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
    let cfg = tiny_config(2);
    let (store, vit) = perturbed_vit(&cfg, 9, 40, DType::F64);
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

/// A small ViT (4×4 px patches on 16 px images: 16 patches, width 16, 2 blocks) with its
/// class token and positional embedding moved away from ~0, so that tests see them.
fn masking_vit(seed: u64, dtype: DType) -> (ParamStore, VisionTransformer) {
    let cfg = VitConfig {
        patch_size: 4,
        embed_dim: 16,
        depth: 2,
        num_heads: 2,
        mlp_ratio: 2,
        in_channels: 1,
        img_size: 16,
        pool: VitPool::Class,
        pos_embed: PosEmbed::Learned,
    };
    perturbed_vit(&cfg, seed, seed + 100, dtype)
}

/// A ViT of `cfg` initialised from `seed`, every variable then moved by 0.3 × noise drawn from
/// `noise_seed` upward (one seed per variable), so that the class token and positional
/// embedding, initialised near 0, count in what the tests compare.
fn perturbed_vit(
    cfg: &VitConfig,
    seed: u64,
    noise_seed: u64,
    dtype: DType,
) -> (ParamStore, VisionTransformer) {
    let store = ParamStore::new(seed);
    let vit =
        VisionTransformer::new(cfg, store.var_builder(&Device::Cpu).set_dtype(dtype)).unwrap();
    for (name, (_, var)) in store.vars().iter().enumerate() {
        let noise = rand_tensor(noise_seed + name as u64, var.dims(), dtype);
        var.set(&(var.as_tensor() + (noise * 0.3).unwrap()).unwrap())
            .unwrap();
    }
    (store, vit)
}

/// A tiny ViT for gradient checks: 4×4 px patches on 8 px images (4 patches), width 8.
fn tiny_config(depth: usize) -> VitConfig {
    VitConfig {
        patch_size: 4,
        embed_dim: 8,
        depth,
        num_heads: 2,
        mlp_ratio: 2,
        in_channels: 1,
        img_size: 8,
        pool: VitPool::Class,
        pos_embed: PosEmbed::Learned,
    }
}

fn keep_tensor(rows: &[Vec<u32>]) -> Tensor {
    let width = rows.first().map_or(0, Vec::len);
    Tensor::from_vec(rows.concat(), (rows.len(), width), &Device::Cpu).unwrap()
}

#[test]
fn unmasked_tokens_equal_the_forward_and_keeping_every_patch_in_order() {
    let (_store, vit) = masking_vit(50, DType::F32);
    let x = rand_tensor(51, &[3, 1, 16, 16], DType::F32);
    let all = vit.forward_tokens(&x, None).unwrap();
    assert_eq!(all.cls.dims(), &[3, 16]);
    assert_eq!(all.patches.dims(), &[3, 16, 16]);
    assert!(max_abs_diff(&all.cls, &vit.forward(&x).unwrap()) < 1e-5);
    let in_order = keep_tensor(&vec![(0..16).collect(); 3]);
    let kept = vit.forward_tokens(&x, Some(&in_order)).unwrap();
    assert!(max_abs_diff(&kept.cls, &all.cls) < 1e-5);
    assert!(max_abs_diff(&kept.patches, &all.patches) < 1e-5);
}

/// Attention is permutation-equivariant, and each token's positional embedding moves with it:
/// a permuted `keep` gives the same class token and the permuted patch tokens.
#[test]
fn a_permuted_keep_permutes_the_patch_tokens_and_keeps_the_class_token() {
    let (_store, vit) = masking_vit(52, DType::F32);
    let x = rand_tensor(53, &[2, 1, 16, 16], DType::F32);
    let all = vit.forward_tokens(&x, None).unwrap();
    let orders: Vec<Vec<u32>> = vec![
        (0..16).rev().collect(),
        (0..16).map(|i| (i * 5 + 3) % 16).collect(),
    ];
    let permuted = vit.forward_tokens(&x, Some(&keep_tensor(&orders))).unwrap();
    assert!(max_abs_diff(&permuted.cls, &all.cls) < 1e-5);
    for (n, order) in orders.iter().enumerate() {
        let expected = all
            .patches
            .get(n)
            .unwrap()
            .index_select(&Tensor::new(order.as_slice(), &Device::Cpu).unwrap(), 0)
            .unwrap();
        let got = permuted.patches.get(n).unwrap();
        assert!(max_abs_diff(&got, &expected) < 1e-5, "image {n}");
    }
}

/// The dropped patches never enter the encoder: changing their pixels changes nothing, and a
/// subset is not the unmasked output restricted to it (the kept tokens attend to fewer).
#[test]
fn masked_patches_do_not_reach_the_output() {
    let (_store, vit) = masking_vit(54, DType::F32);
    let x = rand_tensor(55, &[2, 1, 16, 16], DType::F32);
    let keep = keep_tensor(&[vec![5, 0, 10], vec![15, 3, 6]]);
    let masked = vit.forward_tokens(&x, Some(&keep)).unwrap();
    assert_eq!(masked.patches.dims(), &[2, 3, 16]);
    // Overwrite every pixel outside the kept patches (patch i covers rows 4⌊i/4⌋.., cols 4(i%4)..).
    let mut pixels: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    for (n, kept) in [[5, 0, 10], [15, 3, 6]].iter().enumerate() {
        for (i, pixel) in pixels[n * 256..(n + 1) * 256].iter_mut().enumerate() {
            let patch = (i / 16 / 4) * 4 + (i % 16) / 4;
            if !kept.contains(&patch) {
                *pixel = 7.0;
            }
        }
    }
    let changed = Tensor::from_vec(pixels, x.shape(), &Device::Cpu).unwrap();
    let again = vit.forward_tokens(&changed, Some(&keep)).unwrap();
    assert_eq!(max_abs_diff(&again.cls, &masked.cls), 0.0);
    assert_eq!(max_abs_diff(&again.patches, &masked.patches), 0.0);
    let all = vit.forward_tokens(&x, None).unwrap();
    assert!(max_abs_diff(&all.cls, &masked.cls) > 1e-3);
}

/// Gradients reach the pixels of the kept patches (and no others), the patch embedding and the
/// positional embedding through the gather, on the tiny ViT of the unmasked test.
#[test]
fn masked_gradients_match_finite_differences() {
    let (store, vit) = perturbed_vit(&tiny_config(1), 60, 61, DType::F64);
    // 2×2 patches; each image keeps two, in a different order.
    let keep = keep_tensor(&[vec![2, 0], vec![3, 1]]);
    let x0 = rand_tensor(70, &[2, 1, 8, 8], DType::F64);
    let (r_cls, r_patches) = (
        rand_tensor(71, &[2, 8], DType::F64),
        rand_tensor(72, &[2, 2, 8], DType::F64),
    );
    let loss = |x: &Tensor| {
        let out = vit.forward_tokens(x, Some(&keep)).unwrap();
        ((out.cls * &r_cls).unwrap().sum_all().unwrap()
            + (out.patches * &r_patches).unwrap().sum_all().unwrap())
        .unwrap()
    };
    let x = Var::from_tensor(&x0).unwrap();
    let grads = loss(x.as_tensor()).backward().unwrap();
    let g: Vec<f64> = grads
        .get(&x)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let kept = [[2, 0], [3, 1]];
    for i in (0..g.len()).step_by(3) {
        let fd = finite_diff_step(&x0, i, 1e-6, &|xp| loss(xp).to_scalar::<f64>().unwrap());
        assert!(
            (fd - g[i]).abs() < 1e-7 * (1.0 + fd.abs()),
            "dx[{i}]: {fd} vs {}",
            g[i]
        );
        let (n, pixel) = (i / 64, i % 64);
        let patch = (pixel / 8 / 4) * 2 + (pixel % 8) / 4;
        if !kept[n].contains(&patch) {
            assert_eq!(g[i], 0.0, "dx[{i}] of a dropped patch");
        }
    }
    for (name, var) in store.vars() {
        let gv: Vec<f64> = grads
            .get(&var)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let v0 = var.as_tensor().copy().unwrap();
        for i in [0, gv.len() / 2, gv.len() - 1] {
            let fd = finite_diff_step(&v0, i, 1e-6, &|vp| {
                var.set(vp).unwrap();
                loss(&x0).to_scalar::<f64>().unwrap()
            });
            var.set(&v0).unwrap();
            assert!(
                (fd - gv[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                "{name}[{i}]: {fd} vs {}",
                gv[i]
            );
        }
    }
}

#[test]
fn bad_keep_tensors_are_clear_errors_naming_the_shape() {
    let (_store, vit) = masking_vit(56, DType::F32);
    let x = rand_tensor(57, &[2, 1, 16, 16], DType::F32);
    let error = |keep: Tensor| vit.forward_tokens(&x, Some(&keep)).unwrap_err().to_string();
    let out_of_range = error(keep_tensor(&[vec![0, 16], vec![1, 2]]));
    assert!(
        out_of_range.contains("names patch 16")
            && out_of_range.contains("4×4 = 16 patches")
            && out_of_range.contains("[2, 2]"),
        "{out_of_range}"
    );
    let rank = error(Tensor::new(&[0u32, 1, 2], &Device::Cpu).unwrap());
    assert!(
        rank.contains("[N, K] = [2, K]") && rank.contains("shape [3]"),
        "{rank}"
    );
    let batch = error(keep_tensor(&[vec![0, 1], vec![1, 2], vec![2, 3]]));
    assert!(batch.contains("shape [3, 2]"), "{batch}");
    let empty = error(Tensor::zeros((2, 0), DType::U32, &Device::Cpu).unwrap());
    assert!(
        empty.contains("K ≥ 1") && empty.contains("[2, 0]"),
        "{empty}"
    );
    let dtype = error(Tensor::new(&[[0i64, 1], [2, 3]], &Device::Cpu).unwrap());
    assert!(dtype.contains("u32") && dtype.contains("I64"), "{dtype}");
    // At another image size the indices are those of its own (resampled) grid: 20 px has 25.
    let wide = rand_tensor(58, &[2, 1, 20, 20], DType::F32);
    let keep = keep_tensor(&[vec![24, 0], vec![3, 17]]);
    assert_eq!(
        vit.forward_tokens(&wide, Some(&keep))
            .unwrap()
            .patches
            .dims(),
        &[2, 2, 16]
    );
    let keep = keep_tensor(&[vec![25, 0], vec![3, 17]]);
    let beyond = vit
        .forward_tokens(&wide, Some(&keep))
        .unwrap_err()
        .to_string();
    assert!(beyond.contains("5×5 = 25 patches"), "{beyond}");
}

#[test]
fn mean_pooling_averages_the_normed_patch_tokens_and_class_pooling_takes_the_class_token() {
    let (_, vit) = masking_vit(7, DType::F64);
    let x = rand_tensor(3, &[2, 1, 16, 16], DType::F64);
    let tokens = vit.forward_tokens(&x, None).unwrap();
    assert!(max_abs_diff(&vit.forward(&x).unwrap(), &tokens.cls) < 1e-12);
    let mut mean_cfg = vit.cfg.clone();
    mean_cfg.pool = VitPool::Mean;
    let mean_vit = VisionTransformer {
        cfg: mean_cfg,
        ..vit.clone()
    };
    let pooled = mean_vit.forward(&x).unwrap();
    assert!(max_abs_diff(&pooled, &tokens.patches.mean(1).unwrap()) < 1e-12);
    assert!(max_abs_diff(&pooled, &tokens.cls) > 1e-3);
    let as_tokens: &dyn TokenEncoder = Encoder::tokens(&mean_vit).unwrap();
    assert_eq!((as_tokens.patch_size(), as_tokens.token_dim()), (4, 16));
}

/// Fixed sine–cosine positions: no `pos_embed` weight, and on any grid the function of a learned
/// ViT built for that grid whose `pos_embed` holds [`sincos_positions`] (so local views get the
/// embedding of their own grid, not a resampled one).
#[test]
fn sincos_positions_are_no_weight_and_equal_a_learned_embedding_set_to_them() {
    let sincos = VitConfig {
        pos_embed: PosEmbed::Sincos,
        ..tiny_config(2)
    };
    let store = ParamStore::new(60);
    let vit = VisionTransformer::new(&sincos, store.var_builder(&Device::Cpu)).unwrap();
    let mut weights: HashMap<String, Tensor> = store
        .vars()
        .into_iter()
        .map(|(name, var)| (name, var.as_tensor().clone()))
        .collect();
    assert!(!weights.contains_key("pos_embed") && weights.contains_key("cls_token"));
    for side in [8, 12] {
        let grid = side / 4;
        weights.insert(
            "pos_embed".into(),
            sincos_positions(8, (grid, grid), DType::F32, &Device::Cpu).unwrap(),
        );
        let learned = VitConfig {
            img_size: side,
            ..tiny_config(2)
        };
        let vb = VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu);
        let reference = VisionTransformer::new(&learned, vb).unwrap();
        let x = rand_tensor(61, &[2, 1, side, side], DType::F32);
        let (got, expected) = (
            vit.forward_tokens(&x, None).unwrap(),
            reference.forward_tokens(&x, None).unwrap(),
        );
        assert!(
            max_abs_diff(&got.patches, &expected.patches) < 1e-6,
            "{side} px"
        );
        assert!(max_abs_diff(&got.cls, &expected.cls) < 1e-6, "{side} px");
    }
    let odd = VitConfig {
        embed_dim: 6,
        num_heads: 2,
        ..sincos
    };
    let err = VisionTransformer::new(&odd, ParamStore::new(0).var_builder(&Device::Cpu))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("multiple of 4") && err.contains("model.pos_embed: learned"),
        "{err}"
    );
}
