use super::*;
use candle_core::{Device, Var, D};
use rand::{Rng, SeedableRng};
use ssl_core::testing::{batch, close, documented_defaults, max_gradient_error, scalar};
use ssl_core::{Ids, ParamStore};

const KAT_PARTITION: [u32; 4] = [2, 0, 3, 1];
const KAT_L_C: f64 = 0.6570656664;
const KAT_L_KL: f64 = 0.0005849814;
const KAT_L: f64 = 0.6576506478;

/// Student `[2, 2, 4]` and teacher `[2, 2, 4]` logits of spec `docs/spec/objectives.md` §2.17
/// (f64).
fn spec_logits() -> candle_core::Result<(Tensor, Tensor)> {
    let dev = &Device::Cpu;
    let s = Tensor::new(
        &[
            [[1f64, 0., 2., -1.], [0.5, 0.5, 0., 1.]],
            [[0., 1., 1., 0.], [2., 0., -1., 0.]],
        ],
        dev,
    )?;
    let t = Tensor::new(
        &[
            [[1f64, 0., 1., 0.], [0., 0., 0., 2.]],
            [[0., 0., 2., 0.], [1., 1., 0., 0.]],
        ],
        dev,
    )?;
    Ok((s, t))
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn all_close(a: &[f64], b: &[f64], rel: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        close(*x, *y, rel);
    }
}

fn uniform(seed: u64, dims: &[usize], scale: f64) -> Tensor {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
    Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
}

fn progress(step: usize, seed: u64) -> Progress {
    Progress {
        step,
        epoch: 0,
        steps_per_epoch: 10,
        total_steps: 100,
        seed,
    }
}

#[test]
fn known_answers_spec_2_17() -> candle_core::Result<()> {
    let (s, t) = spec_logits()?;
    let index = partition_index(&KAT_PARTITION, 4, 2, &Device::Cpu)?;
    let gather = |x: &Tensor| x.index_select(&index, D::Minus1);
    let blocks = block_probabilities(&gather(&s.get(0)?)?, 2)?;
    assert_eq!(blocks.dims(), [2, 2, 2]);
    let want = [
        0.7310585786,
        0.2689414214,
        0.2689414214,
        0.7310585786,
        0.3775406688,
        0.6224593312,
        0.6224593312,
        0.3775406688,
    ];
    all_close(&flat(&blocks), &want, 1e-9);

    let sp = block_probabilities(&gather(&s)?, 2)?;
    let tp = block_probabilities(&gather(&t)?, 2)?;
    let p_bar = mean_block_probabilities(&sp, &tp, &SingleProcess)?;
    let want_p_bar = [0.5046027748, 0.4953972252, 0.4762600842, 0.5237399158];
    all_close(&flat(&p_bar), &want_p_bar, 1e-9);

    let (l_c, l_kl) = carp_loss(&s, &t, &KAT_PARTITION, 2)?;
    close(scalar(&l_c), KAT_L_C, 1e-9);
    close(scalar(&l_kl), KAT_L_KL, 1e-6);
    close(scalar(&(l_c + l_kl)?), KAT_L, 1e-9);
    Ok(())
}

#[test]
fn known_answers_in_f32() -> candle_core::Result<()> {
    let (s, t) = spec_logits()?;
    let (s, t) = (s.to_dtype(DType::F32)?, t.to_dtype(DType::F32)?);
    let (l_c, l_kl) = carp_loss(&s, &t, &KAT_PARTITION, 2)?;
    assert_eq!(l_c.dtype(), DType::F32);
    close(scalar(&l_c), KAT_L_C, 1e-4);
    close(scalar(&(l_c + l_kl)?), KAT_L, 1e-4);
    Ok(())
}

/// `(L_c, L_kl)` computed on the host in f64 from the definitions of spec §2.17, one pair and
/// one block at a time: `s` `[V][B][K]`, `t` `[V_g][B][K]`, `blocks` lists of prototype indices.
fn host_loss(s: &[Vec<Vec<f64>>], t: &[Vec<Vec<f64>>], blocks: &[Vec<usize>]) -> (f64, f64) {
    let eps = f64::EPSILON;
    let softmax = |row: &[f64], block: &[usize]| -> Vec<f64> {
        let e: Vec<f64> = block.iter().map(|&c| row[c].exp()).collect();
        let z: f64 = e.iter().sum();
        e.iter().map(|x| x / z).collect()
    };
    let n = s[0].len();
    let (mut total, mut pairs) = (0.0, 0);
    for (v, sv) in s.iter().enumerate() {
        for (w, tw) in t.iter().enumerate() {
            if v == w {
                continue;
            }
            let mut pair = 0.0;
            for block in blocks {
                for i in 0..n {
                    let (p, q) = (softmax(&sv[i], block), softmax(&tw[i], block));
                    let dot: f64 = p.iter().zip(&q).map(|(a, b)| a * b).sum();
                    pair -= dot.clamp(eps, 1.0 - eps).ln();
                }
            }
            total += pair / (blocks.len() * n) as f64;
            pairs += 1;
        }
    }
    let mut kl = 0.0;
    for block in blocks {
        let mut p_bar = vec![0.0; block.len()];
        for row in s.iter().chain(t).flatten() {
            for (acc, p) in p_bar.iter_mut().zip(softmax(row, block)) {
                *acc += p / ((s.len() + t.len()) * n) as f64;
            }
        }
        let plogp: f64 = p_bar.iter().map(|p| p * p.clamp(eps, 1.0 - eps).ln()).sum();
        kl += ((block.len() as f64).ln() + plogp) / blocks.len() as f64;
    }
    (total / pairs as f64, kl)
}

fn nested(t: &Tensor) -> Vec<Vec<Vec<f64>>> {
    t.to_vec3::<f64>().unwrap()
}

#[test]
fn multi_crop_pairs_and_dropped_remainder_match_the_definition() -> Result<()> {
    // 2 global + 2 local student crops, 2 teacher crops; K = 11, N_B = 3 → N_P = 3, 2 dropped.
    let s = uniform(1, &[4, 5, 11], 3.0);
    let t = uniform(2, &[2, 5, 11], 3.0);
    let partition = random_partition(&progress(3, 9), 11, 3)?;
    assert_eq!(partition.len(), 9);
    let blocks: Vec<Vec<usize>> = partition
        .chunks(3)
        .map(|c| c.iter().map(|&i| i as usize).collect())
        .collect();
    let (l_c, l_kl) = carp_loss(&s, &t, &partition, 3)?;
    let (want_c, want_kl) = host_loss(&nested(&s), &nested(&t), &blocks);
    close(scalar(&l_c), want_c, 1e-10);
    close(scalar(&l_kl), want_kl, 1e-9);
    // One global crop with local crops: every local crop pairs with the single teacher crop.
    let t1 = t.narrow(0, 0, 1)?;
    let (l_c, l_kl) = carp_loss(&s, &t1, &partition, 3)?;
    let (want_c, want_kl) = host_loss(&nested(&s), &nested(&t1), &blocks);
    close(scalar(&l_c), want_c, 1e-10);
    close(scalar(&l_kl), want_kl, 1e-9);
    Ok(())
}

#[test]
fn gradient_matches_finite_differences_and_skips_the_teacher() -> candle_core::Result<()> {
    let s = uniform(3, &[3, 4, 7], 2.0);
    let t = uniform(4, &[2, 4, 7], 2.0);
    let partition = [5u32, 0, 3, 6, 2, 4];
    for term in 0..2 {
        let err = max_gradient_error(&s, |x| {
            let (l_c, l_kl) = carp_loss(x, &t, &partition, 3)?;
            Ok(if term == 0 { l_c } else { l_kl })
        })?;
        assert!(err < 1e-6, "term {term}: gradient error {err}");
    }
    let (sv, tv) = (Var::from_tensor(&s)?, Var::from_tensor(&t)?);
    let (l_c, l_kl) = carp_loss(sv.as_tensor(), tv.as_tensor(), &partition, 3)?;
    let grads = (l_c + l_kl)?.backward()?;
    assert!(grads.get(tv.as_tensor()).is_none());
    let gs = grads.get(sv.as_tensor()).expect("a student gradient");
    // Prototype 1 is in no block (7 = 2·3 + 1): its logit gets exactly zero gradient.
    let dropped = flat(&gs.narrow(2, 1, 1)?);
    assert!(dropped.iter().all(|g| *g == 0.0), "{dropped:?}");
    assert!(flat(gs).iter().any(|g| g.abs() > 1e-6));
    Ok(())
}

#[test]
fn fused_block_softmax_matches_the_composed_softmax() -> candle_core::Result<()> {
    let x = (uniform(6, &[3, 2, 12], 4.0) + 50.0)?;
    for dtype in [DType::F64, DType::F32] {
        let x = x.to_dtype(dtype)?;
        let fused = block_probabilities(&x, 4)?;
        assert_eq!(fused.dims(), [3, 2, 3, 4]);
        let want = candle_nn::ops::softmax(&x.reshape((3, 2, 3, 4))?, D::Minus1)?;
        let diff = scalar(&(&fused - &want)?.abs()?.max_all()?);
        assert!(diff < 1e-6, "{dtype:?}: {diff}");
    }
    let r = uniform(7, &[3, 2, 3, 4], 1.0);
    let err = max_gradient_error(&x, |x| (block_probabilities(x, 4)? * &r)?.sum_all())?;
    assert!(err < 1e-7, "gradient error {err}");
    assert!(block_probabilities(&x, 5).is_err());
    Ok(())
}

#[test]
fn teacher_rows_enter_the_mean_of_the_kl_term() -> candle_core::Result<()> {
    let (s, t) = spec_logits()?;
    let (_, kl) = carp_loss(&s, &t, &KAT_PARTITION, 2)?;
    let (_, kl_other_teacher) = carp_loss(&s, &(t * 3.0)?, &KAT_PARTITION, 2)?;
    assert!((scalar(&kl) - scalar(&kl_other_teacher)).abs() > 1e-4);
    Ok(())
}

#[test]
fn loss_rejects_bad_partitions_and_shapes() -> candle_core::Result<()> {
    let (s, t) = spec_logits()?;
    let err = |r: candle_core::Result<(Tensor, Tensor)>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    assert!(err(carp_loss(&s, &t, &[2, 0, 3], 2)).contains("multiple of the block size"));
    assert!(err(carp_loss(&s, &t, &[2, 0, 3, 4], 2)).contains("out of range"));
    assert!(err(carp_loss(&s, &t, &[2, 2, 3, 1], 2)).contains("repeated"));
    assert!(err(carp_loss(&s, &t.narrow(2, 0, 3)?, &[2, 0], 2)).contains("teacher logits"));
    assert!(err(carp_loss(&s.narrow(0, 0, 1)?, &t, &[2, 0], 2)).contains("V ≥ 2"));
    Ok(())
}

#[test]
fn partitions_differ_across_steps_and_repeat_for_the_same_step_and_seed() -> Result<()> {
    let (k, n_b) = (1000, 64);
    let a = random_partition(&progress(5, 1), k, n_b)?;
    assert_eq!(a.len(), k / n_b * n_b);
    let mut sorted = a.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), a.len());
    assert!(sorted.iter().all(|&i| (i as usize) < k));
    assert_eq!(a, random_partition(&progress(5, 1), k, n_b)?);
    assert_ne!(a, random_partition(&progress(6, 1), k, n_b)?);
    assert_ne!(a, random_partition(&progress(5, 2), k, n_b)?);
    let full = random_partition(&progress(0, 0), 8, 4)?;
    let mut all = full.clone();
    all.sort_unstable();
    assert_eq!(all, (0..8).collect::<Vec<u32>>());
    assert!(random_partition(&progress(0, 0), 8, 9).is_err());
    Ok(())
}

fn small_config() -> CarpConfig {
    CarpConfig {
        num_prototypes: 40,
        block_size: 8,
        bottleneck: 6,
        head_hidden: 12,
        momentum_base: 0.99,
    }
}

fn context(store: &ParamStore, feature_dim: usize) -> BuildContext<'static> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 16,
        num_classes: None,
        instance_labels: None,
        projection_dim: feature_dim,
        feature_dim,
        views: 3,
        global_views: 3,
        batch_size: 4,
        patches: None,
    }
}

#[test]
fn prototypes_are_weight_normalised_with_unit_gain() -> Result<()> {
    let store = ParamStore::new(3);
    let carp = Carp::new(small_config(), &context(&store, 5))?;
    let norms = flat(&carp.head().prototypes()?.sqr()?.sum(1)?.sqrt()?);
    assert_eq!(norms.len(), 40);
    assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-6), "{norms:?}");
    let x = uniform(5, &[4, 5], 1.0).to_dtype(DType::F32)?;
    let logits = carp.head().forward(&x, false, None)?;
    assert_eq!(logits.dims(), [4, 40]);
    let embedding = carp.head().embed(&x, false)?;
    let want = embedding.matmul(
        &ssl_linalg::normalize_rows(&store.tensors()["objective.head.prototypes.weight_v"])?.t()?,
    )?;
    let diff = scalar(&(&logits - &want)?.abs()?.max_all()?);
    assert!(diff < 1e-6);
    // Rescaling the directions changes nothing; the embedding is not normalised.
    let (_, v) = carp.head().params().last().expect("weight_v").clone();
    v.set(&(v.as_tensor() * 3.0)?)?;
    let rescaled = carp.head().forward(&x, false, None)?;
    assert!(scalar(&(&logits - &rescaled)?.abs()?.max_all()?) < 1e-6);
    // A partition selects and orders the prototypes without computing the others.
    let partition = random_partition(&progress(2, 0), 40, 8)?;
    let index = partition_index(&partition, 40, 8, &Device::Cpu)?;
    let selected = carp.head().forward(&x, false, Some(&index))?;
    let gathered = rescaled.index_select(&index, 1)?;
    assert!(scalar(&(&selected - &gathered)?.abs()?.max_all()?) < 1e-6);
    let row_norms = flat(&embedding.sqr()?.sum(1)?.sqrt()?);
    assert!(row_norms.iter().any(|n| (n - 1.0).abs() > 1e-3));
    Ok(())
}

#[test]
fn head_keys_follow_the_reference_with_batch_norm() -> Result<()> {
    let store = ParamStore::new(0);
    let carp = Carp::new(small_config(), &context(&store, 5))?;
    let names: Vec<String> = store.vars().into_iter().map(|(n, _)| n).collect();
    for head in ["head", "teacher_head"] {
        for key in [
            "mlp.0.weight",
            "mlp.0.bias",
            "mlp.1.weight",
            "mlp.1.bias",
            "mlp.1.running_mean",
            "mlp.1.running_var",
            "mlp.3.weight",
            "mlp.4.running_var",
            "mlp.6.weight",
            "mlp.6.bias",
            "prototypes.weight_v",
        ] {
            let name = format!("objective.{head}.{key}");
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }
    assert_eq!(names.len(), 2 * 15);
    assert_eq!(carp.head().params().len(), 11);
    let tensors = store.tensors();
    assert_eq!(tensors["objective.head.mlp.6.weight"].dims(), [6, 12]);
    assert_eq!(
        tensors["objective.head.prototypes.weight_v"].dims(),
        [40, 6]
    );
    Ok(())
}

#[test]
fn teacher_head_starts_as_a_copy_and_follows_by_one_minus_m() -> Result<()> {
    let store = ParamStore::new(5);
    let mut carp = Carp::new(small_config(), &context(&store, 5))?;
    let tensors = store.tensors();
    for (name, _) in carp.head().params() {
        let s = &tensors[&format!("objective.head.{name}")];
        let t = &tensors[&format!("objective.teacher_head.{name}")];
        assert_eq!(flat(s), flat(t), "{name}");
    }
    let (name, v) = carp.head().params()[0].clone();
    let old = flat(v.as_tensor());
    v.set(&(v.as_tensor() + 1.0)?)?;
    let p = progress(30, 0);
    let empty: Vec<(String, Var)> = Vec::new();
    carp.before_step(&StepContext {
        progress: p,
        student: &empty,
        teacher: Some(&empty),
    })?;
    let m = p.cosine_ramp(0.99, 1.0);
    assert!(m > 0.99 && m < 1.0);
    let teacher = flat(&store.tensors()[&format!("objective.teacher_head.{name}")]);
    let want: Vec<f64> = old.iter().map(|o| m * o + (1.0 - m) * (o + 1.0)).collect();
    all_close(&teacher, &want, 1e-5);
    Ok(())
}

fn build(yaml: &str, store: &ParamStore, feature_dim: usize) -> Result<Box<dyn Objective>> {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml)?;
    (ssl_core::find("carp")?.build)(&value, &context(store, feature_dim))
}

#[test]
fn registry_built_objective_gives_a_finite_loss_on_random_features() -> Result<()> {
    let store = ParamStore::new(7);
    let yaml = "num_prototypes: 64\nblock_size: 16\nbottleneck: 8\nhead_hidden: 16";
    let mut objective = build(yaml, &store, 10)?;
    let req = objective.requirements();
    assert!(!req.projector);
    assert_eq!(req.teacher, Some(TeacherSpec { train_mode: true }));
    let features = uniform(8, &[3, 4, 10], 1.0).to_dtype(DType::F32)?;
    let teacher = uniform(9, &[2, 4, 10], 1.0).to_dtype(DType::F32)?;
    let ids = Ids::new(&[0, 1, 2, 3], &Device::Cpu)?;
    let b = Batch {
        teacher: Some(&teacher),
        global_views: 2,
        ..batch(&features, &ids, None)
    };
    let out = objective.loss(&b)?;
    let names: Vec<&str> = out.terms.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["consistency", "kl"]);
    let (l_c, l_kl) = (scalar(&out.terms[0].1), scalar(&out.terms[1].1));
    let loss = scalar(&out.loss);
    assert!(loss.is_finite() && l_c > 0.0 && l_kl >= 0.0);
    close(loss, l_c + l_kl, 1e-6);
    // Only the student head is differentiated.
    let grads = out.loss.backward()?;
    for (name, var) in store.vars() {
        let has = grads.get(var.as_tensor()).is_some();
        let trained = name.starts_with("objective.head.") && !ParamStore::is_buffer(&name);
        assert_eq!(has, trained, "{name}");
    }
    // Same step, same partition: the loss repeats; the next step draws another partition.
    let again = scalar(&objective.loss(&b)?.loss);
    close(again, loss, 1e-5);
    let next = Batch {
        progress: progress(1, 0),
        ..b
    };
    let other = scalar(&objective.loss(&next)?.loss);
    assert!((other - loss).abs() > 1e-7, "{other} vs {loss}");
    Ok(())
}

#[test]
fn missing_teacher_and_bad_views_are_clear_errors() -> Result<()> {
    let store = ParamStore::new(0);
    let yaml = "num_prototypes: 16\nblock_size: 4\nbottleneck: 4\nhead_hidden: 8";
    let mut objective = build(yaml, &store, 3)?;
    let features = uniform(1, &[2, 3, 3], 1.0).to_dtype(DType::F32)?;
    let ids = Ids::new(&[0, 1, 2], &Device::Cpu)?;
    let mut err = |b: &Batch<'_>| match objective.loss(b) {
        Ok(_) => panic!("accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err(&batch(&features, &ids, None)).contains("Batch::teacher"));
    let wrong = uniform(2, &[1, 3, 3], 1.0).to_dtype(DType::F32)?;
    let b = Batch {
        teacher: Some(&wrong),
        ..batch(&features, &ids, None)
    };
    assert!(err(&b).contains("[V_g, B, F] = [2, 3, 3]"));
    let one = features.narrow(0, 0, 1)?;
    let t1 = one.clone();
    let b = Batch {
        teacher: Some(&t1),
        ..batch(&one, &ids, None)
    };
    assert!(err(&b).contains("at least 2 views"));
    let single = features.narrow(1, 0, 1)?;
    let t_single = single.narrow(0, 0, 1)?;
    let ids1 = Ids::new(&[0], &Device::Cpu)?;
    let b = Batch {
        teacher: Some(&t_single),
        global_views: 1,
        ..batch(&single, &ids1, None)
    };
    assert!(err(&b).contains("at least 2 rows"));
    Ok(())
}

#[test]
fn registered_with_documented_defaults() {
    let defaults = documented_defaults("carp");
    let cfg: CarpConfig = serde_yaml::from_value(defaults).unwrap();
    assert_eq!(cfg.num_prototypes, 65536);
    assert_eq!(cfg.block_size, 512);
    assert_eq!(cfg.bottleneck, 256);
    assert_eq!(cfg.head_hidden, 2048);
    assert_eq!(cfg.momentum_base, 0.99);
    assert_eq!(cfg.num_prototypes / cfg.block_size, 128);
}

fn config_error(yaml: &str) -> String {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    match ssl_core::registry::parse_config::<CarpConfig>("carp", &value) {
        Ok(_) => panic!("`{yaml}` was accepted"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn invalid_block_size_and_other_values_are_clear_errors() {
    let e = config_error("block_size: 1");
    assert!(
        e.contains("`block_size` must lie in [2, num_prototypes = 65536]"),
        "{e}"
    );
    let e = config_error("num_prototypes: 100\nblock_size: 101");
    assert!(e.contains("`block_size`") && e.contains("got 101"), "{e}");
    assert!(config_error("num_prototypes: 1").contains("`num_prototypes` must be ≥ 2"));
    assert!(config_error("bottleneck: 0").contains("`head_hidden` and `bottleneck`"));
    assert!(config_error("momentum_base: 1.5").contains("`momentum_base`"));
    assert!(config_error("temperature: 0.1").contains("unknown field"));
    let ok = "num_prototypes: 100\nblock_size: 100";
    let value: serde_yaml::Value = serde_yaml::from_str(ok).unwrap();
    assert!(ssl_core::registry::parse_config::<CarpConfig>("carp", &value).is_ok());
}
