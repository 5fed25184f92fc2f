use super::*;
use ssl_core::testing::{close, scalar};
use ssl_core::Ids;

type Mat = Vec<Vec<f64>>;

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn transpose(z: &Mat) -> Mat {
    (0..z[0].len())
        .map(|j| z.iter().map(|r| r[j]).collect())
        .collect()
}

/// `Σ_{i≠j} ⟨r_i, r_j⟩²` over the rows `r` of `z`, straight from the definition.
fn naive_off_diagonal(z: &Mat) -> f64 {
    let mut s = 0.0;
    for i in 0..z.len() {
        for j in 0..z.len() {
            if i != j {
                s += dot(&z[i], &z[j]).powi(2);
            }
        }
    }
    s
}

/// `Σ_r ‖r‖⁴` over the rows of `z`.
fn sum_norm4(z: &Mat) -> f64 {
    z.iter().map(|r| dot(r, r).powi(2)).sum()
}

fn rows(t: &Tensor) -> Mat {
    t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap()
}

fn gaussian(shape: &[usize], std: f64) -> Tensor {
    ssl_core::testing::randn(0f64, std, shape, &Device::Cpu).unwrap()
}

/// `Z = Kᵀ` for the spec's `K = [[1,2,0,−1],[3,−1,2,0],[0,1,1,2]]` (M = 3, N = 4).
fn kat_z() -> candle_core::Result<Tensor> {
    Tensor::new(
        &[[1f64, 2., 0., -1.], [3., -1., 2., 0.], [0., 1., 1., 2.]],
        &Device::Cpu,
    )?
    .t()?
    .contiguous()
}

/// The `docs/spec/objectives.md` §2.6 views `x1`, `x2` stacked as `[2, 3, 2]`.
fn scl_views() -> candle_core::Result<Tensor> {
    let dev = Device::Cpu;
    let x1 = Tensor::new(&[[1f64, 0.], [0., 1.], [-1., 1.]], &dev)?;
    let x2 = Tensor::new(&[[1f64, 0.2], [0.1, 1.], [-1., 0.5]], &dev)?;
    Tensor::stack(&[&x1, &x2], 0)
}

#[test]
fn known_answers_spec_2_2() -> candle_core::Result<()> {
    let z = kat_z()?;
    assert_eq!(z.dims(), &[4, 3]);
    let l_c = scalar(&sample_contrastive(&z)?);
    let l_nc = scalar(&dimension_contrastive(&z)?);
    close(l_c, 86.0, 1e-12);
    close(l_nc, 4.0, 1e-12);
    let dims4 = sum_norm4(&transpose(&rows(&z)));
    let embs4 = sum_norm4(&rows(&z));
    close(dims4, 268.0, 1e-12);
    close(embs4, 186.0, 1e-12);
    close(l_nc + dims4, 272.0, 1e-12);
    close(l_c + embs4, 272.0, 1e-12);
    // Transposing swaps the roles of samples and dimensions (and the Gram each one uses).
    let zt = z.t()?.contiguous()?;
    close(scalar(&sample_contrastive(&zt)?), 4.0, 1e-12);
    close(scalar(&dimension_contrastive(&zt)?), 86.0, 1e-12);
    // A stack of views gives one value per view.
    let stacked = Tensor::stack(&[&z, &(&z * 2.0)?], 0)?;
    let per_view = sample_contrastive(&stacked)?.to_vec1::<f64>()?;
    close(per_view[0], 86.0, 1e-12);
    close(per_view[1], 86.0 * 16.0, 1e-12);
    let per_view = dimension_contrastive(&stacked)?.to_vec1::<f64>()?;
    close(per_view[1], 4.0 * 16.0, 1e-12);
    Ok(())
}

#[test]
fn known_answers_spec_2_2_in_f32() -> candle_core::Result<()> {
    let z = kat_z()?.to_dtype(DType::F32)?;
    close(scalar(&sample_contrastive(&z)?), 86.0, 1e-4);
    close(scalar(&dimension_contrastive(&z)?), 4.0, 1e-4);
    Ok(())
}

#[test]
fn theorem_3_3_identity_over_random_shapes_and_scales() -> candle_core::Result<()> {
    let shapes = [
        (1, 4),
        (4, 1),
        (2, 7),
        (7, 2),
        (5, 5),
        (9, 30),
        (30, 9),
        (64, 3),
    ];
    for (n, m) in shapes {
        for scale in [1e-3, 1.0, 37.0, 1e3] {
            let z = gaussian(&[n, m], scale);
            let zm = rows(&z);
            let naive_c = naive_off_diagonal(&zm);
            let naive_nc = naive_off_diagonal(&transpose(&zm));
            let embs4 = sum_norm4(&zm);
            let dims4 = sum_norm4(&transpose(&zm));
            let side = naive_nc + dims4;
            let tol = 1e-10 * side;
            assert!(
                (side - (naive_c + embs4)).abs() <= tol,
                "identity (definition) fails for {n}x{m}, scale {scale}"
            );
            let l_c = scalar(&sample_contrastive(&z)?);
            let l_nc = scalar(&dimension_contrastive(&z)?);
            assert!(
                (l_c - naive_c).abs() <= tol,
                "L_c {l_c} vs {naive_c} ({n}x{m})"
            );
            assert!(
                (l_nc - naive_nc).abs() <= tol,
                "L_nc {l_nc} vs {naive_nc} ({n}x{m})"
            );
            assert!(
                ((l_nc + dims4) - (l_c + embs4)).abs() <= tol,
                "identity fails for {n}x{m}, scale {scale}"
            );
        }
    }
    Ok(())
}

#[test]
fn corollary_bounds_for_unit_norm_embeddings_and_dimensions() -> candle_core::Result<()> {
    for (n, m) in [(3, 8), (8, 3), (6, 6), (20, 5)] {
        let (nf, mf) = (n as f64, m as f64);
        let tol = 1e-9 * (nf * nf + mf * mf);
        // Unit-norm embeddings: L_nc − N + N²/M ≤ L_c ≤ L_nc − N + N².
        let z = normalize_rows(&gaussian(&[n, m], 1.0))?;
        let (l_c, l_nc) = (
            scalar(&sample_contrastive(&z)?),
            scalar(&dimension_contrastive(&z)?),
        );
        assert!(l_nc - nf + nf * nf / mf <= l_c + tol, "{n}x{m}");
        assert!(l_c <= l_nc - nf + nf * nf + tol, "{n}x{m}");
        // Unit-norm dimensions: L_c − M + M²/N ≤ L_nc ≤ L_c − M + M².
        let z = gaussian(&[n, m], 1.0);
        let z = z.broadcast_div(&z.sqr()?.sum_keepdim(0)?.sqrt()?)?;
        let (l_c, l_nc) = (
            scalar(&sample_contrastive(&z)?),
            scalar(&dimension_contrastive(&z)?),
        );
        assert!(l_c - mf + mf * mf / nf <= l_nc + tol, "{n}x{m}");
        assert!(l_nc <= l_c - mf + mf * mf + tol, "{n}x{m}");
        // The upper bound is reached by unit-norm embeddings collapsed onto one axis.
        let axis = Tensor::eye(m, DType::F64, &Device::Cpu)?.narrow(0, 0, 1)?;
        let collapsed = axis.broadcast_as((n, m))?;
        let (l_c, l_nc) = (
            scalar(&sample_contrastive(&collapsed)?),
            scalar(&dimension_contrastive(&collapsed)?),
        );
        close(l_c, nf * (nf - 1.0), 1e-10);
        close(l_c, l_nc - nf + nf * nf, 1e-10);
    }
    // Rows and columns both unit-norm (square ±1/√N): L_nc = L_c + N − M.
    let n = 7;
    let signs = gaussian(&[n, n], 1.0).ge(0.0)?.to_dtype(DType::F64)?;
    let z = signs.affine(2.0 / (n as f64).sqrt(), -1.0 / (n as f64).sqrt())?;
    let (l_c, l_nc) = (
        scalar(&sample_contrastive(&z)?),
        scalar(&dimension_contrastive(&z)?),
    );
    assert!(l_c > 0.0);
    close(l_nc, l_c, 1e-12);
    Ok(())
}

#[test]
fn criterion_gradients_match_finite_differences() -> candle_core::Result<()> {
    for shape in [&[3, 5][..], &[5, 3], &[2, 3, 4]] {
        let z = gaussian(shape, 1.0);
        let err = ssl_core::testing::max_gradient_error(&z, |z| sample_contrastive(z)?.sum_all())?;
        assert!(err < 1e-6, "L_c gradient error {err} for {shape:?}");
        let err =
            ssl_core::testing::max_gradient_error(&z, |z| dimension_contrastive(z)?.sum_all())?;
        assert!(err < 1e-6, "L_nc gradient error {err} for {shape:?}");
    }
    Ok(())
}

/// Row-normalised (`true`) or column-standardised copy of `z`, in plain Rust.
fn naive_preprocess(z: &Mat, samples: bool) -> Mat {
    let unit = |r: &Vec<f64>| {
        let norm = dot(r, r).sqrt();
        r.iter().map(|x| x / norm).collect::<Vec<f64>>()
    };
    if samples {
        z.iter().map(unit).collect()
    } else {
        let cols = transpose(z)
            .iter()
            .map(|c| {
                let mean = c.iter().sum::<f64>() / c.len() as f64;
                unit(&c.iter().map(|x| x - mean).collect())
            })
            .collect();
        transpose(&cols)
    }
}

/// `(invariance, criterion)` of the trainable criteria, straight from their definitions.
fn naive_terms(z: &Tensor, samples: bool) -> (f64, f64) {
    let views: Vec<Mat> = (0..z.dim(0).unwrap())
        .map(|v| naive_preprocess(&rows(&z.get(v).unwrap()), samples))
        .collect();
    let (b, d) = (views[0].len() as f64, views[0][0].len() as f64);
    let (count, pairs_of_units) = if samples {
        (b, b * (b - 1.0))
    } else {
        (d, d * (d - 1.0))
    };
    let mut inv = Vec::new();
    for a in 0..views.len() {
        for c in a + 1..views.len() {
            let dist: f64 = views[a]
                .iter()
                .flatten()
                .zip(views[c].iter().flatten())
                .map(|(x, y)| (x - y).powi(2))
                .sum();
            inv.push(dist / count);
        }
    }
    let crit: Vec<f64> = views
        .iter()
        .map(|z| {
            let units = if samples { z.clone() } else { transpose(z) };
            naive_off_diagonal(&units) / pairs_of_units
        })
        .collect();
    (
        inv.iter().sum::<f64>() / inv.len() as f64,
        crit.iter().sum::<f64>() / crit.len() as f64,
    )
}

#[test]
fn trainable_criteria_match_direct_computation_over_views() -> candle_core::Result<()> {
    for shape in [[2, 5, 3], [4, 3, 6], [3, 7, 7], [5, 8, 4]] {
        let z = gaussian(&shape, 2.0);
        let t = sample_contrastive_terms(&z)?;
        let (inv, crit) = naive_terms(&z, true);
        close(scalar(&t.invariance), inv, 1e-10);
        close(scalar(&t.criterion), crit, 1e-10);
        let t = dimension_contrastive_terms(&z)?;
        let (inv, crit) = naive_terms(&z, false);
        close(scalar(&t.invariance), inv, 1e-10);
        close(scalar(&t.criterion), crit, 1e-10);
    }
    let z = gaussian(&[3, 6, 5], 1.0);
    let cfg = SampleContrastiveConfig {
        invariance_weight: 0.5,
        criterion_weight: 3.0,
    };
    let t = sample_contrastive_terms(&z)?;
    close(
        scalar(&sample_contrastive_loss(&z, &cfg)?),
        0.5 * scalar(&t.invariance) + 3.0 * scalar(&t.criterion),
        1e-12,
    );
    let cfg = DimensionContrastiveConfig {
        invariance_weight: 2.0,
        criterion_weight: 0.25,
    };
    let t = dimension_contrastive_terms(&z)?;
    close(
        scalar(&dimension_contrastive_loss(&z, &cfg)?),
        2.0 * scalar(&t.invariance) + 0.25 * scalar(&t.criterion),
        1e-12,
    );
    Ok(())
}

#[test]
fn collapse_maximises_the_criteria_and_identical_views_have_no_invariance_cost(
) -> candle_core::Result<()> {
    // All embeddings equal: every cosine is 1.
    let one = gaussian(&[1, 1, 6], 1.0).broadcast_as((3, 5, 6))?;
    let t = sample_contrastive_terms(&one)?;
    close(scalar(&t.criterion), 1.0, 1e-10);
    assert!(scalar(&t.invariance).abs() < 1e-12);
    // Rank-one batch u vᵀ: every pair of dimensions is perfectly (anti-)correlated.
    let u = gaussian(&[5, 1], 1.0);
    let v = gaussian(&[1, 6], 1.0);
    let rank_one = u.matmul(&v)?.unsqueeze(0)?.broadcast_as((2, 5, 6))?;
    let t = dimension_contrastive_terms(&rank_one)?;
    close(scalar(&t.criterion), 1.0, 1e-10);
    assert!(scalar(&t.invariance).abs() < 1e-12);
    Ok(())
}

#[test]
fn terms_are_order_one_at_random_init() -> candle_core::Result<()> {
    // B = 128, D = 512, independent views: invariance ≈ 2, criteria ≈ 1/D resp. 1/(B−1).
    let z = ssl_core::testing::randn(0f32, 1., (2, 128, 512), &Device::Cpu)?;
    let t = sample_contrastive_terms(&z)?;
    let (inv, crit) = (scalar(&t.invariance), scalar(&t.criterion));
    assert!((1.8..2.2).contains(&inv), "{inv}");
    assert!((0.5 / 512.0..2.0 / 512.0).contains(&crit), "{crit}");
    let t = dimension_contrastive_terms(&z)?;
    let (inv, crit) = (scalar(&t.invariance), scalar(&t.criterion));
    assert!((1.8..2.2).contains(&inv), "{inv}");
    assert!((0.5 / 127.0..2.0 / 127.0).contains(&crit), "{crit}");
    Ok(())
}

#[test]
fn trainable_criteria_f32_agree_with_f64() -> candle_core::Result<()> {
    let z = gaussian(&[3, 16, 24], 1.0);
    let z32 = z.to_dtype(DType::F32)?;
    let s = SampleContrastiveConfig::default();
    close(
        scalar(&sample_contrastive_loss(&z32, &s)?),
        scalar(&sample_contrastive_loss(&z, &s)?),
        1e-4,
    );
    let d = DimensionContrastiveConfig::default();
    close(
        scalar(&dimension_contrastive_loss(&z32, &d)?),
        scalar(&dimension_contrastive_loss(&z, &d)?),
        1e-4,
    );
    Ok(())
}

#[test]
fn trainable_criteria_gradients_match_finite_differences() -> candle_core::Result<()> {
    for shape in [[2, 4, 3], [3, 3, 5]] {
        let z = gaussian(&shape, 1.0);
        let s = SampleContrastiveConfig::default();
        let err = ssl_core::testing::max_gradient_error(&z, |z| sample_contrastive_loss(z, &s))?;
        assert!(err < 1e-6, "sample-contrastive gradient error {err}");
        let d = DimensionContrastiveConfig::default();
        let err = ssl_core::testing::max_gradient_error(&z, |z| dimension_contrastive_loss(z, &d))?;
        assert!(err < 1e-6, "dimension-contrastive gradient error {err}");
    }
    Ok(())
}

#[test]
fn scl_known_answers_spec_2_8() -> candle_core::Result<()> {
    let z = scl_views()?;
    close(scalar(&scl_loss(&z, 1.0)?), -1.6566932868, 1e-9);
    // Inside the ball nothing is projected.
    close(scalar(&scl_loss(&(&z * 0.5)?, 1.0)?), -0.5546875, 1e-12);
    let unit = normalize_rows(&z)?;
    close(
        scalar(&scl_paper(&unit.get(0)?, &unit.get(1)?)?),
        -3.8486023279,
        1e-9,
    );
    let t = scl_terms(&z, 1.0)?;
    close(
        scalar(&t.positive) + scalar(&t.negative),
        -1.6566932868,
        1e-9,
    );
    Ok(())
}

#[test]
fn scl_known_answer_in_f32() -> candle_core::Result<()> {
    let z = scl_views()?.to_dtype(DType::F32)?;
    close(scalar(&scl_loss(&z, 1.0)?), -1.6566932868, 1e-4);
    Ok(())
}

#[test]
fn scl_ball_projection_and_mu() -> candle_core::Result<()> {
    let z = Tensor::new(&[[3f64, 4.], [0.3, 0.4], [0., 0.]], &Device::Cpu)?;
    let p = rows(&ball_project(&z, 4.0)?);
    close(p[0][0], 1.2, 1e-12);
    close(p[0][1], 1.6, 1e-12);
    assert_eq!(p[1], vec![0.3, 0.4]);
    assert_eq!(p[2], vec![0.0, 0.0]);
    // Radius √μ and division by μ: inputs scaled by √μ project like the μ = 1 inputs, the
    // positive part keeps its value and the negative part is multiplied by μ.
    let z = gaussian(&[2, 4, 3], 1.0);
    let mu: f64 = 10.0;
    let unit = scl_terms(&z, 1.0)?;
    close(
        scalar(&scl_loss(&(&z * mu.sqrt())?, mu)?),
        scalar(&unit.positive) + mu * scalar(&unit.negative),
        1e-12,
    );
    let views = scl_views()?;
    close(
        scalar(&scl_loss(&views, mu)?),
        naive_scl_pair(&rows(&views.get(0)?), &rows(&views.get(1)?), mu),
        1e-12,
    );
    Ok(())
}

/// Official two-view SCL straight from the spec formula.
fn naive_scl_pair(a: &Mat, b: &Mat, mu: f64) -> f64 {
    let project = |z: &Mat| -> Mat {
        z.iter()
            .map(|r| {
                let norm = dot(r, r).sqrt();
                if norm < mu.sqrt() {
                    r.clone()
                } else {
                    r.iter().map(|x| x * mu.sqrt() / norm).collect()
                }
            })
            .collect()
    };
    let (a, b) = (project(a), project(b));
    let n = a.len() as f64;
    let pos: f64 = a.iter().zip(&b).map(|(x, y)| dot(x, y)).sum::<f64>() / n;
    let mut neg = 0.0;
    for (i, x) in a.iter().enumerate() {
        for (j, y) in b.iter().enumerate() {
            if i != j {
                neg += dot(x, y).powi(2);
            }
        }
    }
    (-2.0 * pos + neg / (n * (n - 1.0))) / mu
}

#[test]
fn scl_multi_view_averages_view_pairs_and_is_symmetric() -> candle_core::Result<()> {
    let mu = 1.5;
    let z = gaussian(&[4, 5, 3], 0.9);
    let views: Vec<Mat> = (0..4).map(|v| rows(&z.get(v).unwrap())).collect();
    let mut ordered = 0.0;
    let mut unordered = 0.0;
    for a in 0..4 {
        for b in 0..4 {
            if a != b {
                let l = naive_scl_pair(&views[a], &views[b], mu);
                ordered += l / 12.0;
                if a < b {
                    unordered += l / 6.0;
                }
            }
        }
    }
    close(ordered, unordered, 1e-12);
    close(scalar(&scl_loss(&z, mu)?), unordered, 1e-10);
    let two = Tensor::stack(&[z.get(2)?, z.get(0)?], 0)?;
    close(
        scalar(&scl_loss(&two, mu)?),
        naive_scl_pair(&views[0], &views[2], mu),
        1e-10,
    );
    Ok(())
}

/// `[V, B, d]` with row norms drawn from values well inside and outside the unit ball.
fn away_from_boundary(shape: (usize, usize, usize)) -> candle_core::Result<Tensor> {
    let (v, b, d) = shape;
    let dirs = normalize_rows(&gaussian(&[v, b, d], 1.0))?;
    let norms: Vec<f64> = (0..v * b).map(|k| [0.4, 0.7, 1.6, 2.3][k % 4]).collect();
    dirs.broadcast_mul(&Tensor::from_vec(norms, (v, b, 1), &Device::Cpu)?)
}

#[test]
fn scl_gradients_match_finite_differences() -> candle_core::Result<()> {
    for shape in [(2, 4, 3), (3, 4, 5)] {
        let z = away_from_boundary(shape)?;
        let err = ssl_core::testing::max_gradient_error(&z, |z| scl_loss(z, 1.0))?;
        assert!(err < 1e-6, "SCL gradient error {err} for {shape:?}");
    }
    let z = gaussian(&[2, 4, 3], 1.0);
    let err = ssl_core::testing::max_gradient_error(&z, |z| scl_paper(&z.get(0)?, &z.get(1)?))?;
    assert!(err < 1e-6, "paper-form gradient error {err}");
    Ok(())
}

fn objectives() -> Vec<(&'static str, Box<dyn Objective>)> {
    vec![
        (
            "sample-contrastive",
            Box::new(SampleContrastiveObjective(Default::default())),
        ),
        (
            "dimension-contrastive",
            Box::new(DimensionContrastiveObjective(Default::default())),
        ),
        ("scl", Box::new(Scl(Default::default()))),
    ]
}

#[test]
fn requirements_need_two_instances() {
    for (name, objective) in objectives() {
        let req = objective.requirements();
        assert_eq!(req.min_batch, 2, "{name}");
        assert_eq!(req.max_views, None, "{name}");
        let err = req.check(name, 2, 1, false).unwrap_err().to_string();
        assert!(err.contains(req.min_batch_reason), "{err}");
        assert!(req.check(name, 2, 2, false).is_ok());
        assert!(req.check(name, 6, 2, false).is_ok());
        assert!(req.check(name, 1, 8, false).is_err());
    }
    let err = ensure_two_dimensions(1).unwrap_err().to_string();
    assert!(err.contains("width ≥ 2"), "{err}");
}

#[test]
fn objectives_report_the_pure_losses_and_their_terms() -> Result<()> {
    let z = gaussian(&[3, 6, 5], 1.0);
    let features = gaussian(&[3, 6, 2], 1.0);
    let indices = Ids::range(6, &Device::Cpu)?;
    let batch = Batch {
        features: &features,
        ..ssl_core::testing::batch(&z, &indices, None)
    };
    let expected = [
        scalar(&sample_contrastive_loss(&z, &Default::default())?),
        scalar(&dimension_contrastive_loss(&z, &Default::default())?),
        scalar(&scl_loss(&z, 1.0)?),
    ];
    for ((name, mut objective), want) in objectives().into_iter().zip(expected) {
        let out = objective.loss(&batch)?;
        close(scalar(&out.loss), want, 1e-12);
        assert_eq!(out.terms.len(), 2, "{name}");
        let sum: f64 = out.terms.iter().map(|(_, t)| scalar(t)).sum();
        if name == "scl" {
            close(sum, want, 1e-12);
        }
    }
    Ok(())
}

#[test]
fn registered_with_documented_defaults() {
    for (name, key, value) in [
        ("sample-contrastive", "invariance_weight", 1.0),
        ("sample-contrastive", "criterion_weight", 10.0),
        ("dimension-contrastive", "invariance_weight", 1.0),
        ("dimension-contrastive", "criterion_weight", 10.0),
        ("spectral-contrastive", "mu", 1.0),
    ] {
        let reg = ssl_core::find(name).unwrap();
        let defaults = ssl_core::testing::documented_defaults(reg.name);
        assert_eq!(defaults[key].as_f64(), Some(value), "{name}.{key}");
    }
    assert_eq!(ssl_core::find("spectral-contrastive").unwrap().name, "scl");
}

fn config_error<C: ObjectiveConfig + std::fmt::Debug>(name: &str, yaml: &str) -> String {
    let value: serde_yaml::Value = serde_yaml::from_str(yaml).unwrap();
    format!(
        "{:#}",
        ssl_core::registry::parse_config::<C>(name, &value).unwrap_err()
    )
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let err = config_error::<SclConfig>("scl", "radius: 2");
    assert!(
        err.contains("unknown field `radius`") && err.contains("mu"),
        "{err}"
    );
    let err = config_error::<SclConfig>("scl", "mu: 0");
    assert!(err.contains("`mu`") && err.contains("> 0"), "{err}");
    let err = config_error::<SampleContrastiveConfig>("sample-contrastive", "lambda: 1");
    assert!(
        err.contains("unknown field `lambda`") && err.contains("invariance_weight"),
        "{err}"
    );
    let err = config_error::<SampleContrastiveConfig>("sample-contrastive", "criterion_weight: -1");
    assert!(
        err.contains("`criterion_weight`") && err.contains("-1"),
        "{err}"
    );
    let err = config_error::<DimensionContrastiveConfig>(
        "dimension-contrastive",
        "invariance_weight: .nan",
    );
    assert!(err.contains("`invariance_weight`"), "{err}");
    let ok: serde_yaml::Value = serde_yaml::from_str("mu: 10").unwrap();
    let cfg = ssl_core::registry::parse_config::<SclConfig>("scl", &ok).unwrap();
    assert_eq!(cfg.mu, 10.0);
}
