//! Spec `docs/spec/objectives.md` §2.27: the official code's known answers (`golden/golden.json`,
//! written by `golden/make_golden.py`), identities, finite differences, a short training run,
//! then the objective through the registry.

use std::collections::HashMap;

use super::*;
use candle_core::{DType, Device, Var};
use candle_nn::{Optimizer, VarBuilder};
use ssl_core::testing::{
    close, documented_defaults, first_step, json_tensor, max_gradient_error, randn, scalar,
    worst_relative_error,
};
use ssl_core::{Ids, ParamStore, Progress, SingleProcess};
use ssl_masking::random_masking;
use ssl_models::vit::sincos_positions;
use ssl_models::{PosEmbed, VisionTransformer, VitConfig, VitPool};

const GOLDEN: &str = include_str!("../golden/golden.json");

fn golden() -> serde_json::Value {
    serde_json::from_str(GOLDEN).expect("golden.json parses")
}

fn usize_of(value: &serde_json::Value) -> usize {
    value.as_u64().expect("a count") as usize
}

#[test]
fn patchify_follows_the_official_order_and_unpatchify_inverts_it() -> Result<()> {
    let golden = golden();
    let cases = golden["patchify"].as_array().expect("patchify cases");
    assert_eq!(cases.len(), 3);
    for case in cases {
        let p = usize_of(&case["p"]);
        let imgs = json_tensor(&case["imgs"])?;
        let patches = patchify(&imgs, p)?;
        assert_eq!(
            worst_relative_error(&patches, &json_tensor(&case["patches"])?)?,
            0.0,
            "p = {p}"
        );
        let side = imgs.dim(2)? / p;
        assert_eq!(
            worst_relative_error(&unpatchify(&patches, p, 3, (side, side))?, &imgs)?,
            0.0
        );
    }
    // Other channel counts and non-square grids, which the official code does not take.
    let imgs = randn(0f64, 1.0, (2, 2, 6, 9), &Device::Cpu)?;
    let patches = patchify(&imgs, 3)?;
    assert_eq!(patches.dims(), [2, 6, 18]);
    // Patch (1, 2) of image 1 starts at pixel (3, 6): its channel values, then pixel (3, 7)'s.
    let row = patches.get(1)?.get(5)?.to_vec1::<f64>()?;
    let pixel = |c: usize, y: usize, x: usize| -> Result<f64> {
        Ok(imgs.get(1)?.get(c)?.get(y)?.get(x)?.to_scalar::<f64>()?)
    };
    assert_eq!(
        row[..4],
        [
            pixel(0, 3, 6)?,
            pixel(1, 3, 6)?,
            pixel(0, 3, 7)?,
            pixel(1, 3, 7)?
        ]
    );
    assert_eq!(
        worst_relative_error(&unpatchify(&patches, 3, 2, (2, 3))?, &imgs)?,
        0.0
    );
    let err = patchify(&imgs, 4).unwrap_err().to_string();
    assert!(err.contains("does not split into 4 × 4 patches"), "{err}");
    Ok(())
}

#[test]
fn the_official_loss_and_its_gradient_to_1e_10() -> Result<()> {
    let golden = golden();
    let cases = golden["forward_loss"].as_array().expect("loss cases");
    assert_eq!(cases.len(), 2);
    for case in cases {
        let norm_pix = case["norm_pix_loss"].as_bool().expect("flag");
        let target = patchify(&json_tensor(&case["imgs"])?, usize_of(&case["p"]))?;
        let pred = Var::from_tensor(&json_tensor(&case["pred"])?)?;
        let loss = mae_loss(
            pred.as_tensor(),
            &target,
            &json_tensor(&case["mask"])?,
            norm_pix,
        )?;
        close(scalar(&loss), case["loss"].as_f64().expect("loss"), 1e-10);
        let grad = loss
            .backward()?
            .get(pred.as_tensor())
            .expect("a gradient")
            .clone();
        let error = worst_relative_error(&grad, &json_tensor(&case["grad_pred"])?)?;
        assert!(
            error <= 1e-10,
            "norm_pix {norm_pix}: gradient off by {error:e}"
        );
        // Visible patches (mask 0) get no gradient.
        assert_eq!(
            grad.get(0)?.get(1)?.abs()?.max_all()?.to_scalar::<f64>()?,
            0.0
        );
    }
    Ok(())
}

#[test]
fn normalised_patches_have_zero_mean_and_unbiased_unit_variance() -> Result<()> {
    let target = randn(3f64, 2.0, (2, 5, 12), &Device::Cpu)?;
    let normalised = normalize_pixels(&target)?;
    let mean = normalised
        .mean_keepdim(2)?
        .abs()?
        .max_all()?
        .to_scalar::<f64>()?;
    assert!(mean < 1e-12, "{mean}");
    // Σ(t̂²)/(P − 1) = σ²/(σ² + ε) per patch, σ² the unbiased variance.
    let centred = target.broadcast_sub(&target.mean_keepdim(2)?)?;
    let var = (centred.sqr()?.sum_keepdim(2)? / 11.0)?;
    let expected = (&var / (&var + NORM_PIX_EPS)?)?;
    let actual = (normalised.sqr()?.sum_keepdim(2)? / 11.0)?;
    assert!(worst_relative_error(&actual, &expected)? < 1e-14);
    let one_value = Tensor::ones((1, 2, 1), DType::F64, &Device::Cpu)?;
    let err = normalize_pixels(&one_value).unwrap_err().to_string();
    assert!(err.contains("norm_pix_loss: false"), "{err}");
    Ok(())
}

/// The official tiny model of `golden.json`: its state dict as variables, our ViT encoder and
/// MAE decoder built from them, and its images and mask.
struct OfficialModel {
    vars: HashMap<String, Var>,
    encoder: VisionTransformer,
    decoder: MaeDecoder,
    imgs: Tensor,
    mask: RandomMask,
    case: serde_json::Value,
}

fn official_model() -> Result<OfficialModel> {
    let mut golden = golden();
    let case = golden["model"].take();
    let config = &case["config"];
    let size = |key: &str| usize_of(&config[key]);
    let mut vars = HashMap::new();
    for (name, value) in case["state_dict"].as_object().expect("state dict") {
        vars.insert(name.clone(), Var::from_tensor(&json_tensor(value)?)?);
    }
    let tensors = vars
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let vb = VarBuilder::from_tensors(tensors, DType::F64, &Device::Cpu);
    let encoder = VisionTransformer::new(
        &VitConfig {
            patch_size: size("patch_size"),
            embed_dim: size("embed_dim"),
            depth: size("depth"),
            num_heads: size("num_heads"),
            mlp_ratio: size("mlp_ratio"),
            in_channels: size("in_chans"),
            img_size: size("img_size"),
            pool: VitPool::Class,
            pos_embed: PosEmbed::Sincos,
        },
        vb.clone(),
    )?;
    let p = size("patch_size");
    let decoder = MaeDecoder::new(
        DecoderConfig {
            encoder_dim: size("embed_dim"),
            dim: size("decoder_embed_dim"),
            depth: size("decoder_depth"),
            heads: size("decoder_num_heads"),
            patch_values: p * p * size("in_chans"),
        },
        vb,
    )?;
    let noise = json_tensor(&case["noise"])?;
    let len = noise.dim(1)?;
    let noise: Vec<f32> = noise.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
    let mask = random_masking(&noise, len, case["mask_ratio"].as_f64().expect("ratio"))?;
    Ok(OfficialModel {
        vars,
        encoder,
        decoder,
        imgs: json_tensor(&case["imgs"])?,
        mask,
        case,
    })
}

#[test]
fn the_official_model_s_encoder_decoder_loss_and_gradients_to_1e_10() -> Result<()> {
    let model = official_model()?;
    let case = &model.case;
    // The same mask and unshuffling as the official random_masking on the recorded noise.
    assert_eq!(
        worst_relative_error(
            &model.mask.mask_tensor(&Device::Cpu)?,
            &json_tensor(&case["mask"])?
        )?,
        0.0
    );
    let restore = model
        .mask
        .restore_tensor(&Device::Cpu)?
        .to_dtype(DType::F64)?;
    assert_eq!(
        worst_relative_error(&restore, &json_tensor(&case["ids_restore"])?)?,
        0.0
    );
    // Our fixed encoder and decoder positions are the official get_2d_sincos_pos_embed's (the
    // encoder's are computed, not read from the state dict).
    let grid = usize_of(&case["config"]["img_size"]) / usize_of(&case["config"]["patch_size"]);
    for (key, width) in [
        ("pos_embed", "embed_dim"),
        ("decoder_pos_embed", "decoder_embed_dim"),
    ] {
        let dim = usize_of(&case["config"][width]);
        let positions = sincos_positions(dim, (grid, grid), DType::F64, &Device::Cpu)?;
        let official = json_tensor(&case["state_dict"][key])?;
        assert!(
            worst_relative_error(&positions, &official)? < 1e-15,
            "{key}"
        );
    }
    for (key, norm_pix) in [("norm_pix", true), ("raw_pix", false)] {
        let out = reconstruct(&model.encoder, &model.decoder, &model.imgs, &model.mask)?;
        let tokens = model
            .encoder
            .forward_tokens(&model.imgs, Some(&model.mask.keep.to_tensor(&Device::Cpu)?))?;
        let latent = Tensor::cat(&[&tokens.cls.unsqueeze(1)?, &tokens.patches], 1)?;
        assert!(worst_relative_error(&latent, &json_tensor(&case["latent"])?)? <= 1e-10);
        assert!(worst_relative_error(&out.pred, &json_tensor(&case["pred"])?)? <= 1e-10);
        let loss = mae_loss(&out.pred, &patchify(&model.imgs, 2)?, &out.mask, norm_pix)?;
        close(
            scalar(&loss),
            case[key]["loss"].as_f64().expect("loss"),
            1e-10,
        );
        let grads = loss.backward()?;
        let expected = case[key]["grads"].as_object().expect("grads");
        assert_eq!(expected.len(), 7);
        for (name, value) in expected {
            let grad = grads.get(model.vars[name].as_tensor()).expect(name);
            let error = worst_relative_error(grad, &json_tensor(value)?)?;
            assert!(error <= 1e-10, "{key}: gradient of {name} off by {error:e}");
        }
    }
    Ok(())
}

#[test]
fn decoder_gradients_match_finite_differences() -> Result<()> {
    let model = official_model()?;
    let keep = model.mask.keep.to_tensor(&Device::Cpu)?;
    let tokens = model.encoder.forward_tokens(&model.imgs, Some(&keep))?;
    let restore = model.mask.restore_tensor(&Device::Cpu)?;
    let mask = model.mask.mask_tensor(&Device::Cpu)?;
    let target = patchify(&model.imgs, 2)?;
    let (cls, visible) = (tokens.cls.detach(), tokens.patches.detach());
    for norm_pix in [true, false] {
        let loss = |cls: &Tensor, visible: &Tensor| {
            let pred = model.decoder.forward(cls, visible, &restore, (4, 4))?;
            mae_loss(&pred, &target, &mask, norm_pix)
        };
        let error = max_gradient_error(&visible, |v| loss(&cls, v))?;
        assert!(error < 1e-6, "visible tokens, norm_pix {norm_pix}: {error}");
        let error = max_gradient_error(&cls, |c| loss(c, &visible))?;
        assert!(error < 1e-6, "class token, norm_pix {norm_pix}: {error}");
    }
    Ok(())
}

#[test]
fn removed_patches_reach_the_loss_only_through_their_targets() -> Result<()> {
    let model = official_model()?;
    let device = Device::Cpu;
    // Pixel mask [N, 1, H, W]: 1 on the removed patches (4 × 4 grid of 2-px patches).
    let removed = model.mask.mask_tensor(&device)?.to_dtype(DType::F64)?;
    let pixels = unpatchify(&removed.unsqueeze(2)?.repeat((1, 1, 4))?, 2, 1, (4, 4))?;
    let noise = randn(0f64, 3.0, model.imgs.dims(), &device)?;
    let changed = (&model.imgs + noise.broadcast_mul(&pixels)?)?;
    let run = |imgs: &Tensor| reconstruct(&model.encoder, &model.decoder, imgs, &model.mask);
    let (before, after) = (run(&model.imgs)?, run(&changed)?);
    // The encoder and the decoder never see them: bit-identical outputs.
    assert_eq!(worst_relative_error(&after.pred, &before.pred)?, 0.0);
    assert_eq!(worst_relative_error(&after.cls, &before.cls)?, 0.0);
    // A visible patch's pixels do reach the prediction.
    let visible = (&model.imgs + noise.broadcast_mul(&(1.0 - &pixels)?)?)?;
    assert!(worst_relative_error(&run(&visible)?.pred, &before.pred)? > 1e-3);
    // The targets of the removed patches move the loss, unless norm_pix removes the change:
    // per patch x → 2.5·x + 0.7 leaves (t − μ)/√(σ² + ε) unchanged up to ε.
    let affine = (&model.imgs + (model.imgs.affine(1.5, 0.7)?.broadcast_mul(&pixels))?)?;
    let loss = |imgs: &Tensor, norm_pix: bool| -> Result<f64> {
        let pred = &run(imgs)?.pred;
        Ok(scalar(&mae_loss(
            pred,
            &patchify(imgs, 2)?,
            &before.mask,
            norm_pix,
        )?))
    };
    for norm_pix in [true, false] {
        let base = loss(&model.imgs, norm_pix)?;
        let moved = loss(&changed, norm_pix)?;
        assert!(
            (moved - base).abs() > 1e-3 * base,
            "{norm_pix}: {base} → {moved}"
        );
        let scaled = (loss(&affine, norm_pix)? - base).abs();
        match norm_pix {
            true => assert!(scaled < 1e-5 * base, "{scaled}"),
            false => assert!(scaled > 1e-2 * base, "{scaled}"),
        }
    }
    Ok(())
}

/// A ViT/4 on 16-px grey images, width 16, under `encoder.` in `store`.
fn tiny_vit(store: &ParamStore, depth: usize) -> Result<VisionTransformer> {
    let cfg = VitConfig {
        patch_size: 4,
        embed_dim: 16,
        depth,
        num_heads: 2,
        mlp_ratio: 4,
        in_channels: 1,
        img_size: 16,
        pool: VitPool::Class,
        pos_embed: PosEmbed::Learned,
    };
    Ok(VisionTransformer::new(
        &cfg,
        store.var_builder(&Device::Cpu).pp("encoder"),
    )?)
}

const TINY: &str = "{decoder_dim: 16, decoder_depth: 1, decoder_heads: 2}";

/// The patches of [`tiny_vit`]: 4 px, grey.
const GREY_4PX: Patches = Patches {
    size: 4,
    channels: 1,
    image: (16, 16),
};

fn context(
    store: &ParamStore,
    views: usize,
    global_views: usize,
    patches: Option<Patches>,
) -> BuildContext<'_> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 16,
        num_classes: None,
        instance_labels: None,
        projection_dim: 16,
        feature_dim: 16,
        views,
        global_views,
        batch_size: 4,
        patches,
    }
}

fn build(
    store: &ParamStore,
    params: &str,
    views: usize,
    global: usize,
) -> Result<Box<dyn Objective>> {
    build_for(store, params, views, global, Some(GREY_4PX))
}

fn build_for(
    store: &ParamStore,
    params: &str,
    views: usize,
    global: usize,
    patches: Option<Patches>,
) -> Result<Box<dyn Objective>> {
    let value: serde_yaml::Value = serde_yaml::from_str(params)?;
    (ssl_core::find("mae")?.build)(&value, &context(store, views, global, patches))
}

fn step(step: usize) -> Progress {
    Progress {
        step,
        total_steps: 100,
        ..first_step()
    }
}

fn pixel_loss(
    objective: &mut dyn Objective,
    encoder: &VisionTransformer,
    views: &[Tensor],
    progress: Progress,
) -> Result<PixelLoss> {
    let ids = Ids::range(views[0].dim(0)?, &Device::Cpu)?;
    objective.pixel_loss(&PixelBatch {
        views,
        global_views: views.len(),
        encoder,
        teacher: None,
        indices: &ids,
        labels: None,
        progress,
        train: true,
        collective: &SingleProcess,
    })
}

#[test]
fn each_view_has_its_own_reproducible_mask_and_the_loss_averages_the_views() -> Result<()> {
    let store = ParamStore::new(3);
    let encoder = tiny_vit(&store, 1)?;
    let mut objective = build(&store, TINY, 2, 2)?;
    let images = randn(0f32, 1.0, (4, 1, 16, 16), &Device::Cpu)?;
    let views = [images.clone(), images.clone()];
    let out = pixel_loss(objective.as_mut(), &encoder, &views, step(5))?;
    assert_eq!(out.embeddings.dims(), [2, 4, 16]);
    assert_eq!(out.output.terms.len(), 1);
    assert_eq!(out.output.terms[0].0, "reconstruction");
    // The same images under two masks: two different class tokens.
    let gap = (out.embeddings.get(0)? - out.embeddings.get(1)?)?
        .abs()?
        .max_all()?;
    assert!(gap.to_scalar::<f32>()? > 1e-4);
    // Each view's mask is the step's draw on its own stream; the loss is their mean.
    let decoder = MaeDecoder::new(
        DecoderConfig {
            encoder_dim: 16,
            dim: 16,
            depth: 1,
            heads: 2,
            patch_values: 16,
        },
        store.var_builder(&Device::Cpu).pp("objective"),
    )?;
    let mut expected = 0.0;
    for v in 0..2 {
        let mask = draw_random_masking(4, 16, 0.75, &mut step(5).rng(mask_stream(v)))?;
        assert_eq!(mask.keep.per_image(), 4);
        let r = reconstruct(&encoder, &decoder, &images, &mask)?;
        expected += scalar(&mae_loss(&r.pred, &patchify(&images, 4)?, &r.mask, true)?) / 2.0;
        let cls_error = worst_relative_error(&r.cls, &out.embeddings.get(v)?)?;
        assert_eq!(cls_error, 0.0);
    }
    close(scalar(&out.output.loss), expected, 1e-6);
    // The same step draws the same masks; another step others.
    let again = pixel_loss(objective.as_mut(), &encoder, &views, step(5))?;
    assert_eq!(scalar(&again.output.loss), scalar(&out.output.loss));
    let next = pixel_loss(objective.as_mut(), &encoder, &views, step(6))?;
    assert_ne!(scalar(&next.output.loss), scalar(&out.output.loss));
    // View 0's mask is ssl-masking's MAE mask of the step.
    let shared = ssl_masking::random_masking_for_step(4, 16, 0.75, &step(5))?;
    assert_eq!(
        shared,
        draw_random_masking(4, 16, 0.75, &mut step(5).rng(mask_stream(0)))?
    );
    Ok(())
}

#[test]
fn a_few_adamw_steps_train_the_encoder_and_the_decoder() -> Result<()> {
    let store = ParamStore::new(11);
    let encoder = tiny_vit(&store, 2)?;
    let mut objective = build(&store, TINY, 1, 1)?;
    // Smooth images (a few random plane waves), so the visible quarter predicts the rest.
    let device = Device::Cpu;
    let coords = Tensor::arange(0f32, 16.0, &device)?;
    let (ys, xs) = (
        coords
            .reshape((1, 1, 16, 1))?
            .broadcast_as((8, 1, 16, 16))?,
        coords
            .reshape((1, 1, 1, 16))?
            .broadcast_as((8, 1, 16, 16))?,
    );
    let mut images = Tensor::zeros((8, 1, 16, 16), DType::F32, &device)?;
    for _ in 0..3 {
        let fy = randn(0f32, 0.3, (8, 1, 1, 1), &device)?;
        let fx = randn(0f32, 0.3, (8, 1, 1, 1), &device)?;
        let phase = randn(0f32, 2.0, (8, 1, 1, 1), &device)?;
        let wave = (ys.broadcast_mul(&fy)? + xs.broadcast_mul(&fx)?)?.broadcast_add(&phase)?;
        images = (images + wave.sin()?)?;
    }
    let views = [images];
    let vars: Vec<Var> = store.vars().into_iter().map(|(_, v)| v).collect();
    let names: Vec<String> = store.vars().into_iter().map(|(k, _)| k).collect();
    assert!(names.iter().any(|n| n == "objective.decoder_pred.weight"));
    assert!(names
        .iter()
        .all(|n| !n.contains("pos_embed") || n.starts_with("encoder.")));
    let mut adamw = candle_nn::AdamW::new(
        vars,
        candle_nn::ParamsAdamW {
            lr: 3e-3,
            weight_decay: 0.05,
            ..Default::default()
        },
    )?;
    let first = pixel_loss(objective.as_mut(), &encoder, &views, step(0))?;
    let before = scalar(&first.output.loss);
    let grads = first.output.loss.backward()?;
    for name in [
        "encoder.patch_embed.proj.weight",
        "encoder.blocks.0.attn.qkv.weight",
        "encoder.cls_token",
        "objective.decoder_embed.weight",
        "objective.mask_token",
        "objective.decoder_blocks.0.mlp.fc1.weight",
        "objective.decoder_pred.weight",
    ] {
        let var = store
            .vars()
            .into_iter()
            .find(|(n, _)| n == name)
            .expect(name)
            .1;
        let grad = grads.get(var.as_tensor()).expect(name);
        let size = grad.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(size > 0.0, "{name} got no gradient");
    }
    adamw.step(&grads)?;
    for k in 1..60 {
        let loss = pixel_loss(objective.as_mut(), &encoder, &views, step(k))?
            .output
            .loss;
        assert!(scalar(&loss).is_finite());
        adamw.backward_step(&loss)?;
    }
    let after = scalar(
        &pixel_loss(objective.as_mut(), &encoder, &views, step(0))?
            .output
            .loss,
    );
    assert!(after < 0.7 * before, "loss {before} → {after}");
    Ok(())
}

#[test]
fn requirements_and_refusals_name_the_fix() -> Result<()> {
    let store = ParamStore::new(0);
    let mut objective = build(&store, TINY, 1, 1)?;
    let req = objective.requirements();
    assert!(req.pixels && !req.projector && req.teacher.is_none() && req.min_views == 1);
    let err = format!(
        "{:#}",
        build(&ParamStore::new(0), TINY, 4, 2)
            .err()
            .expect("local crops")
    );
    assert!(err.contains("--local-views 0"), "{err}");
    let encoder = tiny_vit(&store, 1)?;
    let grey = randn(0f32, 1.0, (2, 1, 16, 16), &Device::Cpu)?;
    // An encoder without patches.
    let err = format!(
        "{:#}",
        build_for(&ParamStore::new(0), TINY, 1, 1, None)
            .err()
            .expect("no patches")
    );
    assert!(err.contains("--set model.encoder=vit_t16"), "{err}");
    // 1-px grey patches have no variance to normalise by.
    let one_px = Patches {
        size: 1,
        channels: 1,
        image: (16, 16),
    };
    let err = format!(
        "{:#}",
        build_for(&ParamStore::new(0), TINY, 1, 1, Some(one_px))
            .err()
            .expect("1-px patches")
    );
    assert!(err.contains("`norm_pix_loss`"), "{err}");
    // A decoder built for other channels than the views'.
    let rgb = Patches {
        size: 4,
        channels: 3,
        image: (16, 16),
    };
    let mut wrong = build_for(&ParamStore::new(0), TINY, 1, 1, Some(rgb))?;
    let err = pixel_loss(
        wrong.as_mut(),
        &encoder,
        std::slice::from_ref(&grey),
        first_step(),
    )
    .err()
    .expect("channels")
    .to_string();
    assert!(
        err.contains("built to predict 4-px patches of 3 channels"),
        "{err}"
    );
    // Local crops in the batch.
    let ids = Ids::range(2, &Device::Cpu)?;
    let small = randn(0f32, 1.0, (2, 1, 8, 8), &Device::Cpu)?;
    let views = [grey.clone(), small];
    let err = objective
        .pixel_loss(&PixelBatch {
            views: &views,
            global_views: 1,
            encoder: &encoder,
            teacher: None,
            indices: &ids,
            labels: None,
            progress: first_step(),
            train: true,
            collective: &SingleProcess,
        })
        .err()
        .expect("local crops")
        .to_string();
    assert!(err.contains("--local-views 0"), "{err}");
    // A ratio that removes no patch of a small view.
    let mut light = build(
        &ParamStore::new(0),
        &TINY.replace('}', ", mask_ratio: 1e-17}"),
        1,
        1,
    )?;
    let err = pixel_loss(light.as_mut(), &encoder, &[grey], first_step())
        .err()
        .expect("nothing removed")
        .to_string();
    assert!(err.contains("raise mask_ratio"), "{err}");
    Ok(())
}

#[test]
fn registered_with_the_paper_defaults() -> Result<()> {
    let defaults = documented_defaults("mae");
    assert_eq!(defaults["mask_ratio"].as_f64(), Some(0.75));
    assert_eq!(defaults["norm_pix_loss"].as_bool(), Some(true));
    assert_eq!(defaults["decoder_dim"].as_u64(), Some(512));
    assert_eq!(defaults["decoder_depth"].as_u64(), Some(8));
    assert_eq!(defaults["decoder_heads"].as_u64(), Some(16));
    assert_eq!(ssl_core::find("masked-autoencoder")?.name, "mae");
    // The default decoder's parameters, under the official state dict's names.
    let store = ParamStore::new(0);
    let rgb_16px = Patches {
        size: 16,
        channels: 3,
        image: (224, 224),
    };
    build_for(&store, "{}", 1, 1, Some(rgb_16px))?;
    let vars = store.vars();
    let shape = |name: &str| {
        vars.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.dims().to_vec())
    };
    assert_eq!(shape("objective.decoder_embed.weight"), Some(vec![512, 16]));
    assert_eq!(shape("objective.mask_token"), Some(vec![1, 1, 512]));
    assert_eq!(
        shape("objective.decoder_blocks.7.attn.qkv.weight"),
        Some(vec![1536, 512])
    );
    assert_eq!(shape("objective.decoder_norm.weight"), Some(vec![512]));
    assert_eq!(shape("objective.decoder_pred.weight"), Some(vec![768, 512]));
    assert_eq!(vars.len(), 2 + 1 + 8 * 12 + 2 + 2);
    // Official init: Xavier-uniform linear layers (the blocks' too), zero biases.
    let qkv = vars
        .iter()
        .find(|(n, _)| n == "objective.decoder_blocks.0.attn.qkv.weight")
        .unwrap();
    let bound = (6.0f64 / (512.0 + 1536.0)).sqrt();
    let max = qkv.1.as_tensor().abs()?.max_all()?.to_scalar::<f32>()? as f64;
    assert!(max <= bound && max > 0.95 * bound, "{max} vs {bound}");
    Ok(())
}

#[test]
fn bad_configurations_name_the_key() {
    for (params, expect) in [
        ("{mask_ratio: 1.0}", "`mask_ratio`"),
        ("{mask_ratio: 0}", "`mask_ratio`"),
        ("{mask_ratio: .nan}", "`mask_ratio`"),
        ("{decoder_dim: 510}", "`decoder_dim`"),
        ("{decoder_dim: 24, decoder_heads: 16}", "`decoder_dim`"),
        ("{decoder_heads: 0}", "`decoder_heads`"),
        ("{decoder_depth: 0}", "`decoder_depth`"),
        ("{mask_ration: 0.5}", "unknown field `mask_ration`"),
    ] {
        let err = format!(
            "{:#}",
            build(&ParamStore::new(0), params, 1, 1)
                .err()
                .expect(params)
        );
        assert!(err.contains(expect), "{params}: {err}");
    }
}
