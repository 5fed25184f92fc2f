//! Spec `docs/spec/objectives.md` §2.26: the official code's known answers (`golden/golden.json`,
//! written by `golden/make_golden.py`), the invariants, finite differences, the data-parallel
//! statistic, then the objective through the registry.

use super::*;
use candle_core::{Device, Var};
use ssl_core::testing::{
    close, documented_defaults, first_step, json_tensor, max_gradient_error, randn, scalar,
    worst_relative_error,
};
use ssl_core::{Ids, ParamStore, Progress, SingleProcess};

const GOLDEN: &str = include_str!("../golden/golden.json");

#[test]
fn the_official_code_s_values_and_gradients_to_1e_10() -> Result<()> {
    let golden: serde_json::Value = serde_json::from_str(GOLDEN)?;
    let lambda = golden["lambda"].as_f64().expect("lambda");
    let cases = golden["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 4);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let count = |key: &str| case[key].as_u64().expect(key) as usize;
        // A case's own inputs, else the shared ones.
        let input = |key: &str| json_tensor(case.get(key).unwrap_or(&golden[key]));
        let z = input("embeddings")?.narrow(0, 0, count("views"))?;
        let directions = input("directions")?;
        let quadrature = Quadrature::new(case["t_max"].as_f64().expect("t_max"), count("knots"))?;
        for term in ["loss", "prediction", "sigreg"] {
            let z = Var::from_tensor(&z)?;
            let terms = lejepa_loss(
                z.as_tensor(),
                count("global_views"),
                &directions,
                &quadrature,
                lambda,
                &SingleProcess,
            )?;
            let value = match term {
                "loss" => terms.loss,
                "prediction" => terms.prediction,
                _ => terms.sigreg,
            };
            let expected = case[term].as_f64().expect(term);
            close(scalar(&value), expected, 1e-10);
            let grad = value
                .backward()?
                .get(z.as_tensor())
                .expect("a gradient")
                .clone();
            let error = worst_relative_error(&grad, &json_tensor(&case[format!("grad_{term}")])?)?;
            assert!(
                error <= 1e-10,
                "{name}: gradient of {term} off by {error:e}"
            );
        }
    }
    Ok(())
}

#[test]
fn the_prediction_term_vanishes_when_all_views_agree() -> Result<()> {
    let view = randn(0f64, 1.0, (1, 5, 3), &Device::Cpu)?;
    let z = Var::from_tensor(&view.repeat((4, 1, 1))?)?;
    let prediction = prediction_loss(z.as_tensor(), 2)?;
    assert_eq!(scalar(&prediction), 0.0);
    let grad = prediction
        .backward()?
        .get(z.as_tensor())
        .expect("a gradient")
        .clone();
    assert_eq!(grad.abs()?.max_all()?.to_scalar::<f64>()?, 0.0);
    // With different views, the centre is that of the global views only.
    let z = randn(0f64, 1.0, (3, 4, 2), &Device::Cpu)?;
    let centre = z.narrow(0, 0, 2)?.mean(0)?;
    let local_only = (z.get(2)? - &centre)?.sqr()?.sum_all()?;
    let global = (z.narrow(0, 0, 2)?.broadcast_sub(&centre)?)
        .sqr()?
        .sum_all()?;
    close(
        scalar(&prediction_loss(&z, 2)?),
        (scalar(&local_only) + scalar(&global)) / 24.0,
        1e-12,
    );
    assert!(prediction_loss(&z, 0).is_err() && prediction_loss(&z, 4).is_err());
    Ok(())
}

#[test]
fn sigreg_is_small_for_gaussian_embeddings_and_large_for_collapsed_ones() -> Result<()> {
    let device = Device::Cpu;
    let mut rng = first_step().rng(0);
    let directions = random_directions(8, 128, &mut rng, &device)?.to_dtype(DType::F64)?;
    let score = |z: &Tensor| -> Result<f64> {
        Ok(scalar(&sigreg(
            z,
            &directions,
            &Quadrature::LEJEPA,
            &SingleProcess,
        )?))
    };
    let gaussian = randn(0f64, 1.0, (2, 1024, 8), &device)?;
    // One point; a line (dimensional collapse, the shortcut moment matching of VICReg's kind
    // would miss in a few dimensions); the right shape at the wrong scale.
    let point = randn(0f64, 1.0, (1, 1, 8), &device)?.repeat((2, 1024, 1))?;
    let axis = randn(0f64, 1.0, (1, 1, 8), &device)?;
    let line = randn(0f64, 1.0, (2, 1024, 1), &device)?.broadcast_mul(&axis)?;
    let wide = (&gaussian * 3.0)?;
    let gaussian = score(&gaussian)?;
    // Under normality each statistic averages Σ_k W_k (1 − φ_k²) ≈ 1.06 whatever B.
    assert!(gaussian < 1.5, "gaussian {gaussian}");
    for (what, z) in [("point", point), ("line", line), ("wide", wide)] {
        let collapsed = score(&z)?;
        assert!(
            collapsed > 50.0 * gaussian,
            "{what} {collapsed}, gaussian {gaussian}"
        );
    }
    Ok(())
}

#[test]
fn a_batch_at_the_origin_scores_the_batch_size_times_the_window_gap() -> Result<()> {
    // x ≡ 0 makes φ̂ ≡ 1, so T = N Σ_k W_k (1 − φ_k)² on every slice: 0.4020475797 per row
    // with R = 3 and 17 knots, whatever the directions, and a zero gradient (0 is its minimum
    // among point masses).
    let z = Var::from_tensor(&Tensor::zeros((2, 10, 3), DType::F64, &Device::Cpu)?)?;
    let directions = random_directions(3, 4, &mut first_step().rng(3), &Device::Cpu)?;
    let value = sigreg(
        z.as_tensor(),
        &directions,
        &Quadrature::LEJEPA,
        &SingleProcess,
    )?;
    close(scalar(&value), 10.0 * 0.40204757973166455, 1e-12);
    let grad = value
        .backward()?
        .get(z.as_tensor())
        .expect("a gradient")
        .clone();
    assert_eq!(grad.abs()?.max_all()?.to_scalar::<f64>()?, 0.0);
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let device = Device::Cpu;
    let z = randn(0.3f64, 1.2, (3, 5, 4), &device)?;
    let directions = random_directions(4, 6, &mut first_step().rng(1), &device)?;
    for quadrature in [Quadrature::LEJEPA, Quadrature::new(5.0, 9)?] {
        let error = max_gradient_error(&z, |z| {
            Ok(lejepa_loss(z, 2, &directions, &quadrature, 0.3, &SingleProcess)?.loss)
        })?;
        assert!(error < 1e-6, "{quadrature:?}: {error}");
    }
    Ok(())
}

/// Two workers holding the same rows: the global batch is the local one twice.
struct TwoIdenticalWorkers;

impl Collective for TwoIdenticalWorkers {
    fn world_size(&self) -> usize {
        2
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_gather(&self, t: &Tensor, dim: usize) -> candle_core::Result<Tensor> {
        Tensor::cat(&[t, t], dim)
    }
}

#[test]
fn data_parallel_sigreg_is_that_of_the_global_batch() -> Result<()> {
    let device = Device::Cpu;
    let z = randn(0f64, 1.5, (2, 6, 4), &device)?;
    let directions = random_directions(4, 5, &mut first_step().rng(2), &device)?;
    let quadrature = Quadrature::LEJEPA;
    let local = Var::from_tensor(&z)?;
    let gathered = sigreg(
        local.as_tensor(),
        &directions,
        &quadrature,
        &TwoIdenticalWorkers,
    )?;
    let global = Var::from_tensor(&Tensor::cat(&[&z, &z], 1)?)?;
    let whole = sigreg(global.as_tensor(), &directions, &quadrature, &SingleProcess)?;
    close(scalar(&gathered), scalar(&whole), 1e-12);
    // The same as the local batch's with N doubled: the statistic scales with the sample size.
    let alone = sigreg(&z, &directions, &quadrature, &SingleProcess)?;
    assert!((scalar(&gathered) - 2.0 * scalar(&alone)).abs() < 1e-12);
    // Each worker's rows get the global statistic's gradient times the 2 workers, as a gather's
    // backward gives them (the trainer's mean over the workers divides by 2).
    let local_grad = gathered
        .backward()?
        .get(local.as_tensor())
        .expect("grad")
        .clone();
    let global_grad = whole
        .backward()?
        .get(global.as_tensor())
        .expect("grad")
        .clone();
    let error = worst_relative_error(&local_grad, &(global_grad.narrow(1, 0, 6)? * 2.0)?)?;
    assert!(error < 1e-12, "{error}");
    Ok(())
}

fn context(store: &ParamStore, views: usize, global_views: usize) -> BuildContext<'_> {
    BuildContext {
        vb: store.var_builder(&Device::Cpu).pp("objective"),
        num_instances: 16,
        num_classes: None,
        instance_labels: None,
        projection_dim: 6,
        feature_dim: 6,
        views,
        global_views,
        batch_size: 8,
        patches: None,
    }
}

fn build(params: &str) -> Result<Box<dyn Objective>> {
    let store = ParamStore::new(0);
    let value: serde_yaml::Value = serde_yaml::from_str(params)?;
    let ctx = context(&store, 4, 2);
    (ssl_core::find("lejepa")?.build)(&value, &ctx)
}

fn step(step: usize) -> Progress {
    Progress {
        step,
        total_steps: 10,
        ..first_step()
    }
}

#[test]
fn the_objective_draws_fresh_directions_each_step_and_weighs_the_terms() -> Result<()> {
    let mut objective = build("{slices: 16}")?;
    let z = randn(0f32, 1.0, (4, 8, 6), &Device::Cpu)?;
    let ids = Ids::range(8, &Device::Cpu)?;
    let mut at = |progress: Progress, global_views: usize| {
        let batch = Batch {
            global_views,
            progress,
            ..ssl_core::testing::batch(&z, &ids, None)
        };
        objective.loss(&batch)
    };
    let out = at(step(3), 2)?;
    let names: Vec<_> = out.terms.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["prediction", "sigreg"]);
    let (prediction, sigreg_value) = (scalar(&out.terms[0].1), scalar(&out.terms[1].1));
    close(
        scalar(&out.loss),
        0.95 * prediction + 0.05 * sigreg_value,
        1e-6,
    );
    // The directions are the run's draw for the step: the same step again gives the same value,
    // another step other directions.
    let directions = random_directions(6, 16, &mut step(3).rng(SLICE_STREAM), &Device::Cpu)?;
    let expected = sigreg(&z, &directions, &Quadrature::LEJEPA, &SingleProcess)?;
    close(sigreg_value, scalar(&expected), 1e-6);
    assert_eq!(scalar(&at(step(3), 2)?.terms[1].1), sigreg_value);
    assert_ne!(scalar(&at(step(4), 2)?.terms[1].1), sigreg_value);
    // The centre comes from the run's global views.
    let all_global = scalar(&at(step(3), 4)?.terms[0].1);
    close(all_global, scalar(&prediction_loss(&z, 4)?), 1e-6);
    assert!((all_global - prediction).abs() > 1e-3);
    Ok(())
}

#[test]
fn too_few_views_are_refused_with_the_fix() -> Result<()> {
    let mut objective = build("{}")?;
    let requirements = objective.requirements();
    assert_eq!(
        (
            requirements.min_views,
            requirements.min_batch,
            requirements.projector
        ),
        (2, 2, true)
    );
    let z = randn(0f32, 1.0, (1, 8, 6), &Device::Cpu)?;
    let ids = Ids::range(8, &Device::Cpu)?;
    let err = objective
        .loss(&ssl_core::testing::batch(&z, &ids, None))
        .err()
        .expect("one view")
        .to_string();
    assert!(err.contains("--views 2"), "{err}");
    let z = randn(0f32, 1.0, (2, 8, 6), &Device::Cpu)?;
    let batch = Batch {
        global_views: 3,
        ..ssl_core::testing::batch(&z, &ids, None)
    };
    let err = objective.loss(&batch).err().expect("3 of 2").to_string();
    assert!(err.contains("between 1 and 2 global views"), "{err}");
    Ok(())
}

#[test]
fn registered_with_the_paper_defaults() -> Result<()> {
    let defaults = documented_defaults("lejepa");
    assert_eq!(defaults["lambda"].as_f64(), Some(0.05));
    assert_eq!(defaults["slices"].as_u64(), Some(1024));
    assert_eq!(defaults["t_max"].as_f64(), Some(3.0));
    assert_eq!(defaults["knots"].as_u64(), Some(17));
    assert_eq!(ssl_core::find("le-jepa")?.name, "lejepa");
    Ok(())
}

#[test]
fn bad_configurations_name_the_key() {
    for (params, expect) in [
        ("{lambda: 1.5}", "`lambda`"),
        ("{lambda: .nan}", "`lambda`"),
        ("{slices: 0}", "`slices`"),
        ("{t_max: 0}", "`t_max`"),
        ("{knots: 1}", "`knots`"),
        ("{lamda: 0.1}", "unknown field `lamda`"),
    ] {
        let err = format!("{:#}", build(params).err().expect(params));
        assert!(err.contains(expect), "{params}: {err}");
    }
}
