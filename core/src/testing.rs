//! Test support shared by objective crates: the spec's common known-answer inputs, reproducible
//! random inputs, golden arrays read from JSON, scalar and tensor comparison, and gradient
//! checks against finite differences.

use std::cell::RefCell;

use candle_core::{DType, Device, FloatDType, Result, Shape, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use crate::params::fnv1a;
use crate::{Batch, Ids, Progress, SingleProcess};

/// `Z_a`, `Z_b` of spec `docs/spec/objectives.md` §2.3 (`[4, 3]`, f64): the inputs most of the
/// spec's known answers use.
pub fn spec_za_zb() -> Result<(Tensor, Tensor)> {
    let a = Tensor::new(
        &[[1f64, 0., 2.], [0., 1., 1.], [2., 1., 0.], [1., 3., 1.]],
        &Device::Cpu,
    )?;
    let b = Tensor::new(
        &[[1f64, 1., 2.], [0., 0., 1.], [2., 2., 1.], [0., 3., 0.]],
        &Device::Cpu,
    )?;
    Ok((a, b))
}

/// The first step of a one-step run with seed 0.
pub fn first_step() -> Progress {
    Progress {
        step: 0,
        epoch: 0,
        steps_per_epoch: 1,
        total_steps: 1,
        seed: 0,
    }
}

/// A training-mode batch of projections `z`: `[V, B, D]` (also used as the features, every view
/// global) with instance ids `indices` and optional `labels`, at [`first_step`]. Override fields
/// with struct update syntax: `Batch { train: false, ..batch(&z, &ids, None) }`, with
/// `ids = Ids::range(B, device)`.
pub fn batch<'a>(z: &'a Tensor, indices: &'a Ids, labels: Option<&'a Ids>) -> Batch<'a> {
    Batch {
        projections: z,
        features: z,
        global_views: z.dims().first().copied().unwrap_or(0),
        indices,
        labels,
        teacher: None,
        progress: first_step(),
        train: true,
        collective: &SingleProcess,
    }
}

/// The default configuration of the objective registered as `name` (or an alias), after
/// asserting that its documented keys are exactly the default config's keys.
pub fn documented_defaults(name: &str) -> serde_yaml::Value {
    let reg = crate::find(name).expect("a registered objective");
    let defaults = (reg.default_config)();
    let mut keys: Vec<&str> = defaults
        .as_mapping()
        .expect("objective configs are mappings")
        .keys()
        .filter_map(|k| k.as_str())
        .collect();
    let mut documented: Vec<&str> = reg.keys.iter().map(|k| k.name).collect();
    keys.sort_unstable();
    documented.sort_unstable();
    assert_eq!(
        documented, keys,
        "{}: documented keys vs default config keys",
        reg.name
    );
    defaults
}

thread_local! {
    /// libtest runs every test on a thread named after it, so each test gets its own stream.
    static TEST_RNG: RefCell<ChaCha8Rng> = RefCell::new(ChaCha8Rng::seed_from_u64(fnv1a(
        std::thread::current().name().unwrap_or("main").as_bytes(),
    )));
}

/// `Tensor::randn`, reproducibly: a test draws the same values on every run and machine (from a
/// generator seeded by the test's name), so a draw that fails a tolerance fails every time, here
/// and in CI, instead of once in a few hundred runs.
pub fn randn<T: FloatDType>(
    mean: T,
    std: T,
    shape: impl Into<Shape>,
    device: &Device,
) -> Result<Tensor> {
    let scaled = (std.to_f64(), mean.to_f64());
    draw::<T>(shape, device, scaled, |rng| StandardNormal.sample(rng))
}

/// `Tensor::rand`, reproducibly (see [`randn`]): uniform on `[lo, up)`.
pub fn uniform<T: FloatDType>(
    lo: T,
    up: T,
    shape: impl Into<Shape>,
    device: &Device,
) -> Result<Tensor> {
    let (lo, up) = (lo.to_f64(), up.to_f64());
    draw::<T>(shape, device, (up - lo, lo), |rng| rng.random::<f64>())
}

/// `scale · sample + shift` for every value of `shape`, sampled from the test's generator, as a
/// `T` tensor on `device`.
fn draw<T: FloatDType>(
    shape: impl Into<Shape>,
    device: &Device,
    (scale, shift): (f64, f64),
    sample: impl Fn(&mut ChaCha8Rng) -> f64,
) -> Result<Tensor> {
    let shape = shape.into();
    let values: Vec<f64> =
        TEST_RNG.with_borrow_mut(|rng| (0..shape.elem_count()).map(|_| sample(rng)).collect());
    Tensor::from_vec(values, shape, &Device::Cpu)?
        .affine(scale, shift)?
        .to_dtype(T::DTYPE)?
        .to_device(device)
}

/// The value of a one-element tensor of any float dtype, as f64.
pub fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64)
        .and_then(|t| t.to_scalar::<f64>())
        .expect("a one-element float tensor")
}

/// Asserts `|a − b| ≤ rel · max(|b|, 1e-12)` (`b` the expected value).
pub fn close(a: f64, b: f64, rel: f64) {
    assert!((a - b).abs() <= rel * b.abs().max(1e-12), "{a} vs {b}");
}

/// Compares the autograd gradient of the scalar `loss(x)` at `x` (f64) with central finite
/// differences (step 1e-6) element by element; returns the largest error relative to
/// `1 + |finite difference|`. Use it as `assert!(max_gradient_error(...)? < 1e-6)`.
pub fn max_gradient_error(x: &Tensor, loss: impl Fn(&Tensor) -> Result<Tensor>) -> Result<f64> {
    let var = Var::from_tensor(x)?;
    let grads = loss(var.as_tensor())?.backward()?;
    let Some(grad) = grads.get(var.as_tensor()) else {
        candle_core::bail!("the loss does not depend on its input");
    };
    let analytic = grad.flatten_all()?.to_vec1::<f64>()?;
    let base = x.flatten_all()?.to_vec1::<f64>()?;
    let h = 1e-6;
    let mut worst = 0f64;
    for (k, g) in analytic.iter().enumerate() {
        let eval = |delta: f64| -> Result<f64> {
            let mut v = base.clone();
            v[k] += delta;
            loss(&Tensor::from_vec(v, x.shape(), x.device())?)?.to_scalar::<f64>()
        };
        let fd = (eval(h)? - eval(-h)?) / (2.0 * h);
        worst = worst.max((fd - g).abs() / (1.0 + fd.abs()));
    }
    Ok(worst)
}

/// Asserts that a fused op's terms equal their composed form at `x` within `tolerance`: the
/// terms, and the gradients of `Σ w · terms` (random weights `w`) with respect to `x`, each
/// against the composed side's largest magnitude (at least 1e-3).
pub fn assert_fused_matches_composed(
    x: &Tensor,
    tolerance: f64,
    fused: impl Fn(&Tensor) -> Result<Tensor>,
    composed: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<()> {
    let var = Var::from_tensor(x)?;
    let (fused, composed) = (fused(var.as_tensor())?, composed(var.as_tensor())?);
    let weights = randn(0f64, 1., composed.shape(), x.device())?.to_dtype(x.dtype())?;
    let gradient = |terms: &Tensor| -> Result<Tensor> {
        let grads = (terms * &weights)?.sum_all()?.backward()?;
        match grads.get(var.as_tensor()) {
            Some(g) => Ok(g.clone()),
            None => candle_core::bail!("the terms do not depend on their input"),
        }
    };
    let relative = |a: &Tensor, b: &Tensor| -> Result<f64> {
        let largest = |t: Tensor| t.abs()?.max_all()?.to_dtype(DType::F64)?.to_scalar::<f64>();
        Ok(largest((a - b)?)? / largest(b.clone())?.max(1e-3))
    };
    let values = relative(&fused, &composed)?;
    let gradients = relative(&gradient(&fused)?, &gradient(&composed)?)?;
    let at = x.dims();
    assert!(values < tolerance, "{at:?}: the terms differ by {values}");
    assert!(
        gradients < tolerance,
        "{at:?}: the gradients differ by {gradients}"
    );
    Ok(())
}

/// A nested JSON array of numbers (a golden file's array, as the official code's scripts write
/// them) as an f64 tensor of its shape.
pub fn json_tensor(value: &serde_json::Value) -> Result<Tensor> {
    let mut shape = Vec::new();
    let mut level = value;
    while let Some(items) = level.as_array() {
        shape.push(items.len());
        level = &items[0];
    }
    let mut flat = Vec::new();
    fn collect(value: &serde_json::Value, flat: &mut Vec<f64>) {
        match value {
            serde_json::Value::Array(items) => items.iter().for_each(|v| collect(v, flat)),
            number => flat.push(number.as_f64().expect("a golden array holds numbers")),
        }
    }
    collect(value, &mut flat);
    Tensor::from_vec(flat, shape, &Device::Cpu)
}

/// The largest `|a − e| / max(1, |e|)` over the entries, compared in f64, after checking the
/// shapes agree.
pub fn worst_relative_error(actual: &Tensor, expected: &Tensor) -> Result<f64> {
    assert_eq!(actual.dims(), expected.dims());
    let values = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
    let (a, e) = (values(actual)?, values(expected)?);
    Ok(a.iter()
        .zip(&e)
        .map(|(a, e)| (a - e).abs() / e.abs().max(1.0))
        .fold(0.0, f64::max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_a_correct_gradient_and_catches_a_wrong_one() -> Result<()> {
        let x = Tensor::new(&[0.5f64, -1.0, 2.0], &Device::Cpu)?;
        assert!(max_gradient_error(&x, |x| x.sqr()?.sum_all())? < 1e-8);
        // A stop-gradient halves the autograd gradient of x² while finite differences see 2x.
        assert!(max_gradient_error(&x, |x| (x.detach() * x)?.sum_all())? > 0.1);
        Ok(())
    }

    #[test]
    fn close_tolerates_rel_and_no_more() {
        close(1.0 + 1e-9, 1.0, 1e-8);
        assert!(std::panic::catch_unwind(|| close(1.0 + 1e-7, 1.0, 1e-8)).is_err());
        assert_eq!(scalar(&Tensor::new(2.5f32, &Device::Cpu).unwrap()), 2.5);
    }
}
