//! Spec `docs/spec/objectives.md` §2.1, one test per known answer and invariant, then the objective
//! through the registry.

use super::*;
use candle_core::{DType, Device, Var};
use ssl_core::testing::{close, max_gradient_error, scalar};
use ssl_core::{Ids, ParamStore};

/// The spec's batch: ids `[0, 2]`, views `[V=2, B=2, 3]`, table `E: [3, 3]`.
fn spec_inputs() -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let dev = &Device::Cpu;
    let f = Tensor::new(
        &[[[1f64, 2., 2.], [0., 3., 4.]], [[2., 1., 2.], [0., 4., 3.]]],
        dev,
    )?;
    let e = Tensor::new(&[[1f64, 0., 1.], [0., 1., 0.], [1., 1., 0.]], dev)?;
    let ids = Tensor::new(&[0u32, 2], dev)?;
    Ok((f, e, ids))
}

#[test]
fn known_answers_of_every_term() -> Result<()> {
    let (f, e, ids) = spec_inputs()?;
    let z = normalize_rows(&f)?;
    let table = normalize_rows(&e)?;
    close(scalar(&view_view(&z)?), 0.0755555556, 1e-9);
    let anchors = table.index_select(&ids, 0)?;
    close(scalar(&view_instance(&z, &anchors)?), 0.3400336709, 1e-9);
    close(
        scalar(&squared_hinge_diversity(&table, 2, None)?),
        0.25,
        1e-12,
    );
    close(scalar(&icone_loss(&f, &e, &ids)?), 0.6655892264, 1e-9);
    let gram = table.matmul(&table.t()?)?.to_vec2::<f64>()?;
    close(gram[1][2], std::f64::consts::FRAC_1_SQRT_2, 1e-9);
    Ok(())
}

#[test]
fn supervised_known_answers() -> Result<()> {
    let (f, e, _) = spec_inputs()?;
    let z = normalize_rows(&f)?;
    let dev = &Device::Cpu;
    // IConE-Instance, table labels [0, 1, 0], both batch instances of class 0.
    let table = normalize_rows(&e)?;
    let pooling = class_pooling(&[0, 1, 0], 2, dev)?.to_dtype(DType::F64)?;
    let batch_labels = Tensor::new(&[0u32, 0], dev)?;
    let anchors = class_mean_anchors(&table, &pooling)?.index_select(&batch_labels, 0)?;
    close(scalar(&view_instance(&z, &anchors)?), 0.3694964534, 1e-9);
    let y = Tensor::new(&[0u32, 1, 0], dev)?;
    close(
        scalar(&squared_hinge_diversity(&table, 1, Some(&y))?),
        0.25,
        1e-12,
    );
    // IConE-Class, prototypes [[1,1,0],[0,1,1]], batch labels [0, 1].
    let protos = normalize_rows(&Tensor::new(&[[1f64, 1., 0.], [0., 1., 1.]], dev)?)?;
    let anchors = protos.index_select(&Tensor::new(&[0u32, 1], dev)?, 0)?;
    close(scalar(&view_instance(&z, &anchors)?), 0.1514718626, 1e-9);
    close(
        scalar(&squared_hinge_diversity(&protos, 2, None)?),
        0.25,
        1e-12,
    );
    Ok(())
}

#[test]
fn invariants() -> Result<()> {
    let (f, e, ids) = spec_inputs()?;
    let base = scalar(&icone_loss(&f, &e, &ids)?);
    // Positive rescaling of any row of E or of any f changes nothing.
    let row_scale = Tensor::new(&[[3f64], [0.2], [7.0]], &Device::Cpu)?;
    let view_scale = Tensor::new(&[[[0.5f64], [4.0]], [[9.0], [0.1]]], &Device::Cpu)?;
    let scaled = icone_loss(
        &f.broadcast_mul(&view_scale)?,
        &e.broadcast_mul(&row_scale)?,
        &ids,
    )?;
    close(scalar(&scaled), base, 1e-12);
    // L_vv = 0 when the views of each instance coincide.
    let same = Tensor::stack(&[f.get(0)?, (f.get(0)? * 2.0)?], 0)?;
    assert!(scalar(&view_view(&normalize_rows(&same)?)?).abs() < 1e-15);
    Ok(())
}

#[test]
fn views_beyond_two_use_every_pair() -> Result<()> {
    // V = 3: mean over the three pairs, against a direct double loop.
    let dev = &Device::Cpu;
    let f = Tensor::new(
        &[
            [[1f64, 0.], [0.3, 1.]],
            [[0.6, 0.8], [1., 1.]],
            [[0., 1.], [-1., 2.]],
        ],
        dev,
    )?;
    let z = normalize_rows(&f)?.to_vec3::<f64>()?;
    let mut want = 0.0;
    for instance in 0..2 {
        let views: Vec<&Vec<f64>> = z.iter().map(|view| &view[instance]).collect();
        for (a, b) in [
            (views[0], views[1]),
            (views[0], views[2]),
            (views[1], views[2]),
        ] {
            want += 1.0 - (a[0] * b[0] + a[1] * b[1]);
        }
    }
    close(scalar(&view_view(&normalize_rows(&f)?)?), want / 6.0, 1e-12);
    Ok(())
}

#[test]
fn gradient_matches_finite_differences_in_views_and_table() -> Result<()> {
    let (f, e, ids) = spec_inputs()?;
    assert!(max_gradient_error(&f, |f| icone_loss(f, &e, &ids))? < 1e-6);
    assert!(max_gradient_error(&e, |e| icone_loss(&f, e, &ids))? < 1e-6);
    Ok(())
}

fn context<'a>(
    store: &ParamStore,
    n: usize,
    d: usize,
    views: usize,
    labels: Option<&'a [u32]>,
) -> BuildContext<'a> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: n,
        num_classes: Some(2),
        instance_labels: labels,
        projection_dim: d,
        feature_dim: d,
        views,
        global_views: views,
        batch_size: 1,
        patches: None,
    }
}

fn build(name: &str, params: &str, ctx: &BuildContext<'_>) -> Result<Box<dyn Objective>> {
    let value: serde_yaml::Value = serde_yaml::from_str(params)?;
    (ssl_core::find(name)?.build)(&value, ctx)
}

fn batch_loss(
    objective: &mut dyn Objective,
    f: &Tensor,
    ids: &[u32],
    labels: Option<&[u32]>,
) -> Result<LossOutput> {
    let dev = &Device::Cpu;
    let indices = Ids::new(ids, dev)?;
    let labels = labels.map(|l| Ids::new(l, dev)).transpose()?;
    objective.loss(&ssl_core::testing::batch(f, &indices, labels.as_ref()))
}

#[test]
fn a_batch_of_one_trains_the_view_and_the_whole_table() -> Result<()> {
    let store = ParamStore::new(0);
    let mut objective = build("icone", "{}", &context(&store, 5, 4, 2, None))?;
    assert_eq!(objective.requirements().min_batch, 1);
    let f = Var::from_tensor(&Tensor::new(
        &[[[1f32, 2., 0., 1.]], [[0.5, 2., 1., 1.]]],
        &Device::Cpu,
    )?)?;
    let out = batch_loss(objective.as_mut(), f.as_tensor(), &[3], None)?;
    let names: Vec<_> = out.terms.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["view_view", "view_instance", "diversity"]);
    let grads = out.loss.backward()?;
    assert!(grads.get(f.as_tensor()).is_some());
    let (_, table) = &store.vars_with_prefix("objective.table")[0];
    let g = grads
        .get(table.as_tensor())
        .expect("table gradient")
        .to_vec2::<f32>()?;
    // L_div reaches every row; L_vi only row 3, so row 3's gradient differs from L_div's alone.
    assert!(g.iter().all(|row| row.iter().any(|x| *x != 0.0)), "{g:?}");
    // The table starts at N(0, 0.02²).
    let values = table.as_tensor().flatten_all()?.to_vec1::<f32>()?;
    let std = (values.iter().map(|x| x * x).sum::<f32>() / values.len() as f32).sqrt();
    assert!((0.005..0.05).contains(&std), "init std {std}");
    Ok(())
}

#[test]
fn the_ablations_drop_their_terms() -> Result<()> {
    let f = Tensor::new(&[[[1f32, 2., 0., 1.]], [[0.5, 2., 1., 1.]]], &Device::Cpu)?;
    for (params, terms) in [
        ("{view_view: false}", vec!["view_instance", "diversity"]),
        ("{view_instance: false}", vec!["view_view", "diversity"]),
        ("{regularizer: none}", vec!["view_view", "view_instance"]),
        (
            "{regularizer: vc}",
            vec!["view_view", "view_instance", "variance", "covariance"],
        ),
        (
            "{regularizer: sig, slices: 8}",
            vec!["view_view", "view_instance", "sig"],
        ),
    ] {
        let store = ParamStore::new(0);
        let mut objective = build("icone", params, &context(&store, 6, 4, 2, None))?;
        let out = batch_loss(objective.as_mut(), &f, &[0], None)?;
        let names: Vec<_> = out.terms.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, terms, "{params}");
        assert!(scalar(&out.loss).is_finite());
    }
    // The named forms are the same objective with another regulariser.
    let store = ParamStore::new(0);
    let mut vc = build("icone-vc", "{}", &context(&store, 6, 4, 2, None))?;
    let out = batch_loss(vc.as_mut(), &f, &[0], None)?;
    assert!(out.terms.iter().any(|(n, _)| n == "covariance"));
    Ok(())
}

#[test]
fn one_view_is_refused_with_l_vv_and_accepted_without() -> Result<()> {
    let store = ParamStore::new(0);
    let err = build("icone", "{}", &context(&store, 6, 4, 1, None))
        .err()
        .expect("V = 1 with L_vv must be refused")
        .to_string();
    assert!(
        err.contains("view_view") && err.contains("--views 2"),
        "{err}"
    );
    let store = ParamStore::new(0);
    let mut objective = build(
        "icone",
        "{view_view: false}",
        &context(&store, 6, 4, 1, None),
    )?;
    assert_eq!(objective.requirements().min_views, 1);
    let f = Tensor::new(&[[[1f32, 2., 0., 1.]]], &Device::Cpu)?;
    assert!(scalar(&batch_loss(objective.as_mut(), &f, &[5], None)?.loss).is_finite());
    Ok(())
}

#[test]
fn ids_beyond_the_table_are_refused() -> Result<()> {
    let store = ParamStore::new(0);
    let mut objective = build("icone", "{}", &context(&store, 6, 4, 2, None))?;
    let f = Tensor::new(&[[[1f32, 2., 0., 1.]], [[0.5, 2., 1., 1.]]], &Device::Cpu)?;
    let err = batch_loss(objective.as_mut(), &f, &[6], None)
        .err()
        .expect("id 6 of a 6-row table")
        .to_string();
    assert!(
        err.contains("instance id 6 is outside the 6-row table"),
        "{err}"
    );
    Ok(())
}

#[test]
fn supervised_forms_need_labels() -> Result<()> {
    let f = Tensor::new(&[[[1f32, 2., 0., 1.]], [[0.5, 2., 1., 1.]]], &Device::Cpu)?;
    let labels = [0u32, 1, 1, 0];
    for name in ["icone-class", "icone-instance"] {
        let store = ParamStore::new(0);
        let mut objective = build(name, "{}", &context(&store, 4, 4, 2, Some(&labels)))?;
        assert!(objective.requirements().labels);
        let err = batch_loss(objective.as_mut(), &f, &[2], None)
            .err()
            .expect("no labels")
            .to_string();
        assert!(err.contains("needs class labels"), "{name}: {err}");
        let out = batch_loss(objective.as_mut(), &f, &[2], Some(&[1]))?;
        assert!(scalar(&out.loss).is_finite(), "{name}");
        let err = batch_loss(objective.as_mut(), &f, &[2], Some(&[2]))
            .err()
            .expect("label 2 of two classes")
            .to_string();
        assert!(err.contains("class label 2 is outside"), "{name}: {err}");
    }
    let store = ParamStore::new(0);
    let err = build("icone-instance", "{}", &context(&store, 4, 4, 2, None))
        .err()
        .expect("no instance labels")
        .to_string();
    assert!(err.contains("no labels"), "{err}");
    let store = ParamStore::new(0);
    assert_eq!(
        build(
            "icone-class",
            "{}",
            &context(&store, 4, 4, 2, Some(&labels))
        )?
        .requirements()
        .min_batch,
        1
    );
    Ok(())
}

#[test]
fn every_form_is_registered_with_documented_paper_defaults() {
    for (name, regularizer) in [
        ("icone", "div"),
        ("icone-vc", "vc"),
        ("icone-sig", "sig"),
        ("icone-class", "div"),
        ("icone-instance", "div"),
    ] {
        let defaults = ssl_core::testing::documented_defaults(name);
        assert_eq!(
            defaults["regularizer"].as_str(),
            Some(regularizer),
            "{name}"
        );
        assert_eq!(defaults["init_std"].as_f64(), Some(0.02), "{name}");
        assert_eq!(defaults["view_view"].as_bool(), Some(true), "{name}");
    }
}

#[test]
fn bad_configurations_name_the_key() {
    let store = ParamStore::new(0);
    let ctx = context(&store, 4, 4, 2, None);
    for (params, expect) in [
        ("{init_std: 0}", "init_std"),
        ("{tile: 0}", "tile"),
        (
            "{view_view: false, view_instance: false, regularizer: none}",
            "every term",
        ),
        ("{regularizer: whitening}", "unknown variant"),
        ("{lambda: 1}", "unknown field"),
    ] {
        let err = format!("{:#}", build("icone", params, &ctx).err().expect(params));
        assert!(err.contains(expect), "{params}: {err}");
    }
    let err = format!(
        "{:#}",
        build("icone-class", "{regularizer: sig}", &ctx)
            .err()
            .expect("sig")
    );
    assert!(err.contains("div` or `none"), "{err}");
}
