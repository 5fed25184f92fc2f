//! Offline linear probe (`docs/spec/metrics.md` §1): train-statistics standardisation,
//! L2-regularised logistic regression with an unpenalised intercept solved by L-BFGS in `f64`, and
//! balanced accuracy.
//!
//! * `K ≥ 3` classes: multinomial (softmax) model, `J = (1/n) Σ CE + ‖W‖²_F / (2Cn)`; the returned
//!   intercepts are shifted to sum to zero (the objective is invariant to a common shift).
//! * `K = 2` classes: binary sigmoid model with one weight vector
//!   (`J = (1/n) Σ log(1+e^{−ỹ(w·x+b)}) + ‖w‖²/(2Cn)`); the larger class label is the positive
//!   class.
//!
//! Class labels are arbitrary `u32`s; the model works on the sorted distinct training labels.
//!
//! [`select_c`] chooses `C` from a grid ([`DEFAULT_C_GRID`]) by balanced accuracy on a
//! stratified validation split of the training features (the spec's protocol fixes `C = 1`;
//! this is the tuned variant).

use std::collections::{BTreeMap, VecDeque};

use anyhow::{bail, ensure, Result};
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::Features;

/// L-BFGS history length (reference: 10).
const LBFGS_MEMORY: usize = 10;
/// Relative-decrease stopping criterion (the reference uses `64·eps`).
const FTOL: f64 = 64.0 * f64::EPSILON;
/// Wolfe constants (sufficient decrease, curvature).
const WOLFE_C1: f64 = 1e-4;
const WOLFE_C2: f64 = 0.9;
/// Maximum function evaluations per line search.
const MAX_LINE_SEARCH: usize = 50;

/// Linear-probe hyper-parameters (spec §1 defaults: `C = 1`, 1000 iterations, `tol = 1e-4`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinearProbeConfig {
    /// Inverse L2 regularisation strength.
    pub c: f64,
    /// Maximum number of L-BFGS iterations.
    pub max_iter: usize,
    /// Stop when the max-abs gradient is at most `tol`.
    pub tol: f64,
}

impl Default for LinearProbeConfig {
    fn default() -> Self {
        Self {
            c: 1.0,
            max_iter: 1000,
            tol: 1e-4,
        }
    }
}

/// Result of [`linear_probe`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// Mean per-class recall over the classes present in the test labels.
    pub balanced_accuracy: f64,
    /// Plain top-1 accuracy on the test set.
    pub accuracy: f64,
    /// Final training objective `J`.
    pub objective: f64,
    /// L-BFGS iterations performed.
    pub iterations: usize,
    /// Predicted test labels.
    pub predictions: Vec<u32>,
    /// Test class probabilities, one row per sample, columns in the order of `classes`.
    #[serde(skip)]
    pub probabilities: Vec<Vec<f64>>,
    /// Sorted distinct training labels: the columns of `probabilities`.
    #[serde(skip)]
    pub classes: Vec<u32>,
}

/// A fitted logistic-regression model, including the training standardisation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogisticModel {
    /// Sorted distinct training labels; column `k` of scores corresponds to `classes[k]`.
    pub classes: Vec<u32>,
    /// Training mean per dimension.
    pub mean: Vec<f64>,
    /// Training population std per dimension (`1` where it was `0`).
    pub scale: Vec<f64>,
    /// Weights in standardised space, row-major: `K × d` (multinomial) or `1 × d` (binary).
    pub weights: Vec<f64>,
    /// Intercepts: `K` (multinomial, summing to zero) or 1 (binary).
    pub bias: Vec<f64>,
    /// Feature dimension.
    pub d: usize,
    /// Final objective value.
    pub objective: f64,
    /// L-BFGS iterations performed.
    pub iterations: usize,
    /// Whether a stopping criterion (gradient or relative decrease) was met before `max_iter`.
    pub converged: bool,
}

impl LogisticModel {
    /// Whether the binary (sigmoid) parameterisation is used.
    pub fn is_binary(&self) -> bool {
        self.classes.len() == 2
    }

    fn standardized(&self, x: &Features) -> Result<DMatrix<f64>> {
        ensure!(
            x.d == self.d,
            "feature dimension {} does not match the model's {}",
            x.d,
            self.d
        );
        Ok(standardized_matrix(x, &self.mean, &self.scale))
    }

    /// Decision values (`n × rows` with rows = K, or 1 for the binary model).
    fn decision(&self, x: &Features) -> Result<DMatrix<f64>> {
        let xs = self.standardized(x)?;
        let rows = self.bias.len();
        let wt = DMatrix::from_column_slice(self.d, rows, &self.weights);
        let mut z = xs * wt;
        for (c, &b) in self.bias.iter().enumerate() {
            z.column_mut(c).add_scalar_mut(b);
        }
        Ok(z)
    }

    /// Class probabilities, one `Vec` of length K per sample.
    pub fn predict_proba(&self, x: &Features) -> Result<Vec<Vec<f64>>> {
        let z = self.decision(x)?;
        Ok((0..x.n)
            .map(|i| {
                if self.is_binary() {
                    let p = sigmoid(z[(i, 0)]);
                    vec![1.0 - p, p]
                } else {
                    let row: Vec<f64> = z.row(i).iter().copied().collect();
                    let lse = log_sum_exp(&row);
                    row.iter().map(|v| (v - lse).exp()).collect()
                }
            })
            .collect())
    }

    /// Predicted labels (arg-max; ties go to the lowest class index).
    pub fn predict(&self, x: &Features) -> Result<Vec<u32>> {
        let z = self.decision(x)?;
        Ok((0..x.n)
            .map(|i| {
                let k = if self.is_binary() {
                    usize::from(z[(i, 0)] > 0.0)
                } else {
                    argmax(z.row(i).iter().copied())
                };
                self.classes[k]
            })
            .collect())
    }
}

/// Fits the §1 logistic regression on `train` (standardised with its own statistics).
pub fn fit_logistic(
    train: &Features,
    train_y: &[u32],
    cfg: &LinearProbeConfig,
) -> Result<LogisticModel> {
    ensure!(train.n > 0, "linear probe: empty training set");
    ensure!(train.d > 0, "linear probe: zero-dimensional features");
    ensure!(
        train_y.len() == train.n,
        "linear probe: {} training labels for {} training samples",
        train_y.len(),
        train.n
    );
    ensure!(
        cfg.c.is_finite() && cfg.c > 0.0,
        "linear probe: C must be positive and finite (got {})",
        cfg.c
    );
    ensure!(
        cfg.tol >= 0.0,
        "linear probe: tol must be non-negative (got {})",
        cfg.tol
    );
    ensure!(
        train.data.iter().all(|v| v.is_finite()),
        "linear probe: training features contain NaN or infinity"
    );
    let mut classes: Vec<u32> = train_y.to_vec();
    classes.sort_unstable();
    classes.dedup();
    if classes.len() < 2 {
        bail!(
            "linear probe: the training labels contain a single class ({}); need at least 2",
            classes[0]
        );
    }
    let index: BTreeMap<u32, usize> = classes.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let y: Vec<usize> = train_y.iter().map(|c| index[c]).collect();

    let (mean, scale) = column_stats(train);
    let x = standardized_matrix(train, &mean, &scale);
    let (n, d, k) = (train.n, train.d, classes.len());
    let inv_n = 1.0 / n as f64;
    let reg = 1.0 / (cfg.c * n as f64);

    let (weights, mut bias, outcome) = if k == 2 {
        let sign: Vec<f64> = y.iter().map(|&c| if c == 1 { 1.0 } else { -1.0 }).collect();
        let fg = |theta: &[f64], grad: &mut [f64]| -> f64 {
            let w = DVector::from_column_slice(&theta[..d]);
            let b = theta[d];
            let z = &x * &w;
            let mut loss = 0.0;
            let r = DVector::from_iterator(
                n,
                (0..n).map(|i| {
                    let m = -sign[i] * (z[i] + b);
                    loss += softplus(m);
                    -sign[i] * sigmoid(m) * inv_n
                }),
            );
            let gw = x.tr_mul(&r);
            for j in 0..d {
                grad[j] = gw[j] + reg * theta[j];
            }
            grad[d] = r.sum();
            loss * inv_n + 0.5 * reg * w.norm_squared()
        };
        let out = lbfgs(fg, vec![0.0; d + 1], cfg.max_iter, cfg.tol)?;
        (out.x[..d].to_vec(), vec![out.x[d]], out)
    } else {
        let fg = |theta: &[f64], grad: &mut [f64]| -> f64 {
            // Row-major K×d weights are exactly the column-major d×K matrix Wᵀ.
            let wt = DMatrix::from_column_slice(d, k, &theta[..k * d]);
            let b = &theta[k * d..];
            let mut g = &x * &wt; // logits, then P − Y
            let mut loss = 0.0;
            let mut row = vec![0.0; k];
            for i in 0..n {
                for c in 0..k {
                    row[c] = g[(i, c)] + b[c];
                }
                let lse = log_sum_exp(&row);
                loss += lse - row[y[i]];
                for c in 0..k {
                    g[(i, c)] = (row[c] - lse).exp() * inv_n;
                }
                g[(i, y[i])] -= inv_n;
            }
            let gwt = x.tr_mul(&g); // d×K = (∂J/∂W)ᵀ without the penalty
            let mut pen = 0.0;
            for (idx, (gr, &w)) in grad[..k * d].iter_mut().zip(&theta[..k * d]).enumerate() {
                pen += w * w;
                *gr = gwt[idx] + reg * w;
            }
            for c in 0..k {
                grad[k * d + c] = g.column(c).sum();
            }
            loss * inv_n + 0.5 * reg * pen
        };
        let out = lbfgs(fg, vec![0.0; k * d + k], cfg.max_iter, cfg.tol)?;
        (out.x[..k * d].to_vec(), out.x[k * d..].to_vec(), out)
    };
    if k > 2 {
        let shift = bias.iter().sum::<f64>() / k as f64;
        bias.iter_mut().for_each(|b| *b -= shift);
    }
    Ok(LogisticModel {
        classes,
        mean,
        scale,
        weights,
        bias,
        d,
        objective: outcome.f,
        iterations: outcome.iterations,
        converged: outcome.converged,
    })
}

/// Runs the §1 linear probe: fit on `train`, predict `test`, report (balanced) accuracy.
pub fn linear_probe(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    test_y: &[u32],
    cfg: &LinearProbeConfig,
) -> Result<ProbeResult> {
    ensure!(test.n > 0, "linear probe: empty test set");
    ensure!(
        test_y.len() == test.n,
        "linear probe: {} test labels for {} test samples",
        test_y.len(),
        test.n
    );
    ensure!(
        test.d == train.d,
        "linear probe: test dimension {} differs from train dimension {}",
        test.d,
        train.d
    );
    let model = fit_logistic(train, train_y, cfg)?;
    let predictions = model.predict(test)?;
    let correct = predictions
        .iter()
        .zip(test_y)
        .filter(|(p, t)| p == t)
        .count();
    Ok(ProbeResult {
        balanced_accuracy: balanced_accuracy(test_y, &predictions),
        accuracy: correct as f64 / test.n as f64,
        objective: model.objective,
        iterations: model.iterations,
        predictions,
        probabilities: model.predict_proba(test)?,
        classes: model.classes,
    })
}

/// Default grid of inverse regularisation strengths for [`select_c`].
pub const DEFAULT_C_GRID: [f64; 6] = [1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0];

/// Result of [`select_c`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CSelection {
    /// The chosen `C`: the highest validation balanced accuracy; ties go to the smaller `C`
    /// (stronger regularisation).
    pub c: f64,
    /// `(C, validation balanced accuracy)` for every grid value, in grid order.
    pub scores: Vec<(f64, f64)>,
    /// Number of samples the models were fitted on.
    pub n_subtrain: usize,
    /// Number of validation samples.
    pub n_validation: usize,
}

/// Chooses the L2 strength `C` of the §1 probe on a validation split of the training set.
///
/// `train`: `n × d` features with labels `train_y` (`n`). The samples are split stratified by
/// class, deterministically from `seed`: a class with `n_c ≥ 2` samples sends
/// `round(validation_fraction · n_c)`, clamped to `[1, n_c − 1]`, randomly chosen samples to
/// validation, so every class keeps at least one training sample; **a class with a single sample
/// stays entirely in the sub-train part** (it is fitted but not scored). For every `C` in `grid`
/// (e.g. [`DEFAULT_C_GRID`]) [`fit_logistic`] is run on the sub-train part (standardised with its
/// own statistics; `max_iter` and `tol` from [`LinearProbeConfig::default`]), and the balanced
/// accuracy is measured on the validation part. Fits run in parallel over the grid.
///
/// The caller then refits on the full training set with the chosen `C`:
/// `linear_probe(train, train_y, test, test_y, &LinearProbeConfig { c: sel.c, ..Default::default() })`.
pub fn select_c(
    train: &Features,
    train_y: &[u32],
    grid: &[f64],
    validation_fraction: f64,
    seed: u64,
) -> Result<CSelection> {
    ensure!(train.n > 0, "C selection: empty training set");
    ensure!(train.d > 0, "C selection: zero-dimensional features");
    ensure!(
        train_y.len() == train.n,
        "C selection: {} training labels for {} training samples",
        train_y.len(),
        train.n
    );
    ensure!(!grid.is_empty(), "C selection: empty grid");
    ensure!(
        grid.iter().all(|c| c.is_finite() && *c > 0.0),
        "C selection: every C must be positive and finite (got {grid:?})"
    );
    ensure!(
        validation_fraction > 0.0 && validation_fraction < 1.0,
        "C selection: validation_fraction must lie in (0, 1) (got {validation_fraction})"
    );
    let (sub_idx, val_idx) = stratified_split(train_y, validation_fraction, seed)?;
    let sub = select_rows(train, &sub_idx);
    let sub_y: Vec<u32> = sub_idx.iter().map(|&i| train_y[i]).collect();
    let val = select_rows(train, &val_idx);
    let val_y: Vec<u32> = val_idx.iter().map(|&i| train_y[i]).collect();
    let accuracies: Vec<f64> = grid
        .par_iter()
        .map(|&c| {
            let cfg = LinearProbeConfig {
                c,
                ..Default::default()
            };
            let model = fit_logistic(&sub, &sub_y, &cfg)?;
            Ok(balanced_accuracy(&val_y, &model.predict(&val)?))
        })
        .collect::<Result<_>>()?;
    let scores: Vec<(f64, f64)> = grid.iter().copied().zip(accuracies).collect();
    let mut best = scores[0];
    for &(c, acc) in &scores[1..] {
        if acc > best.1 || (acc == best.1 && c < best.0) {
            best = (c, acc);
        }
    }
    Ok(CSelection {
        c: best.0,
        scores,
        n_subtrain: sub_idx.len(),
        n_validation: val_idx.len(),
    })
}

/// Stratified split of sample indices into (sub-train, validation), both ascending; see
/// [`select_c`] for the per-class counts. Classes are visited in ascending label order and each
/// is shuffled (Fisher–Yates) with one SplitMix64 stream seeded by `seed`.
fn stratified_split(labels: &[u32], fraction: f64, seed: u64) -> Result<(Vec<usize>, Vec<usize>)> {
    let mut by_class: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, &y) in labels.iter().enumerate() {
        by_class.entry(y).or_default().push(i);
    }
    ensure!(
        by_class.len() >= 2,
        "C selection: the training labels contain a single class; need at least 2"
    );
    let mut state = seed;
    let mut next = move || {
        // SplitMix64.
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut in_validation = vec![false; labels.len()];
    for idx in by_class.values_mut() {
        let n_c = idx.len();
        if n_c < 2 {
            continue;
        }
        for i in (1..n_c).rev() {
            let j = ((u128::from(next()) * (i as u128 + 1)) >> 64) as usize;
            idx.swap(i, j);
        }
        let n_val = ((fraction * n_c as f64).round() as usize).clamp(1, n_c - 1);
        for &i in &idx[..n_val] {
            in_validation[i] = true;
        }
    }
    let (val, sub): (Vec<usize>, Vec<usize>) = (0..labels.len()).partition(|&i| in_validation[i]);
    ensure!(
        !val.is_empty(),
        "C selection: no class has at least 2 samples, so nothing can be held out for validation"
    );
    Ok((sub, val))
}

fn select_rows(x: &Features, idx: &[usize]) -> Features {
    let mut data = Vec::with_capacity(idx.len() * x.d);
    for &i in idx {
        data.extend_from_slice(x.row(i));
    }
    Features {
        data,
        n: idx.len(),
        d: x.d,
    }
}

/// Balanced accuracy: mean over the classes present in `y_true` of the per-class recall.
///
/// Returns `NaN` for empty input. Panics if the two slices differ in length.
pub fn balanced_accuracy(y_true: &[u32], y_pred: &[u32]) -> f64 {
    assert_eq!(
        y_true.len(),
        y_pred.len(),
        "balanced_accuracy: y_true and y_pred differ in length"
    );
    if y_true.is_empty() {
        return f64::NAN;
    }
    let mut per_class: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for (&t, &p) in y_true.iter().zip(y_pred) {
        let e = per_class.entry(t).or_default();
        e.1 += 1;
        if t == p {
            e.0 += 1;
        }
    }
    per_class
        .values()
        .map(|&(hit, tot)| hit as f64 / tot as f64)
        .sum::<f64>()
        / per_class.len() as f64
}

/// Per-column mean and population std (0 → 1), in `f64`.
fn column_stats(x: &Features) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; x.d];
    for row in x.data.chunks(x.d) {
        for (m, &v) in mean.iter_mut().zip(row) {
            *m += f64::from(v);
        }
    }
    mean.iter_mut().for_each(|m| *m /= x.n as f64);
    let mut var = vec![0.0; x.d];
    for row in x.data.chunks(x.d) {
        for ((s, &v), m) in var.iter_mut().zip(row).zip(&mean) {
            let c = f64::from(v) - m;
            *s += c * c;
        }
    }
    let scale = var
        .into_iter()
        .map(|s| {
            let sd = (s / x.n as f64).sqrt();
            if sd == 0.0 {
                1.0
            } else {
                sd
            }
        })
        .collect();
    (mean, scale)
}

fn standardized_matrix(x: &Features, mean: &[f64], scale: &[f64]) -> DMatrix<f64> {
    DMatrix::from_fn(x.n, x.d, |i, j| {
        (f64::from(x.data[i * x.d + j]) - mean[j]) / scale[j]
    })
}

fn log_sum_exp(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !m.is_finite() {
        return m;
    }
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// `log(1 + e^t)`, stable for large `|t|`.
fn softplus(t: f64) -> f64 {
    t.max(0.0) + (-t.abs()).exp().ln_1p()
}

fn sigmoid(t: f64) -> f64 {
    if t >= 0.0 {
        1.0 / (1.0 + (-t).exp())
    } else {
        let e = t.exp();
        e / (1.0 + e)
    }
}

/// Index of the maximum; the lowest index wins ties.
fn argmax(it: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in it.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn max_abs(a: &[f64]) -> f64 {
    a.iter().fold(0.0, |m, v| m.max(v.abs()))
}

struct LbfgsOutcome {
    x: Vec<f64>,
    f: f64,
    iterations: usize,
    converged: bool,
}

/// Minimises a smooth function with L-BFGS (two-loop recursion, memory 10) and a bracketing
/// weak-Wolfe line search. `fg(x, grad)` returns `f(x)` and writes `∇f(x)` into `grad`.
fn lbfgs<F>(mut fg: F, mut x: Vec<f64>, max_iter: usize, gtol: f64) -> Result<LbfgsOutcome>
where
    F: FnMut(&[f64], &mut [f64]) -> f64,
{
    let p = x.len();
    let mut g = vec![0.0; p];
    let mut f = fg(&x, &mut g);
    ensure!(
        f.is_finite(),
        "L-BFGS: objective is not finite at the start"
    );
    let mut hist: VecDeque<(Vec<f64>, Vec<f64>, f64)> = VecDeque::with_capacity(LBFGS_MEMORY);
    let mut iterations = 0;
    let mut converged = max_abs(&g) <= gtol;
    let mut xn = vec![0.0; p];
    let mut gn = vec![0.0; p];
    let mut alphas = [0.0; LBFGS_MEMORY];
    while !converged && iterations < max_iter {
        // Two-loop recursion: dir = −H g.
        let mut q = g.clone();
        for (idx, (s, y, rho)) in hist.iter().enumerate().rev() {
            let a = rho * dot(s, &q);
            alphas[idx] = a;
            q.iter_mut().zip(y).for_each(|(qi, yi)| *qi -= a * yi);
        }
        if let Some((s, y, _)) = hist.back() {
            let gamma = dot(s, y) / dot(y, y);
            q.iter_mut().for_each(|v| *v *= gamma);
        }
        for (idx, (s, y, rho)) in hist.iter().enumerate() {
            let beta = rho * dot(y, &q);
            let a = alphas[idx];
            q.iter_mut()
                .zip(s)
                .for_each(|(qi, si)| *qi += (a - beta) * si);
        }
        let mut dir: Vec<f64> = q.iter().map(|v| -v).collect();
        let mut gd = dot(&g, &dir);
        if gd >= 0.0 || !gd.is_finite() {
            hist.clear();
            dir = g.iter().map(|v| -v).collect();
            gd = -dot(&g, &g);
        }
        let mut step = if hist.is_empty() {
            (1.0 / dot(&g, &g).sqrt()).min(1.0)
        } else {
            1.0
        };
        let (mut lo, mut hi) = (0.0f64, f64::INFINITY);
        let mut accepted = false;
        let mut f_new = f64::NAN;
        for _ in 0..MAX_LINE_SEARCH {
            for ((xni, xi), di) in xn.iter_mut().zip(&x).zip(&dir) {
                *xni = xi + step * di;
            }
            f_new = fg(&xn, &mut gn);
            if !f_new.is_finite() || f_new > f + WOLFE_C1 * step * gd {
                hi = step;
            } else if dot(&gn, &dir) < WOLFE_C2 * gd {
                lo = step;
            } else {
                accepted = true;
                break;
            }
            step = if hi.is_finite() {
                0.5 * (lo + hi)
            } else {
                2.0 * lo
            };
        }
        let improved = f_new.is_finite() && f_new < f;
        if !(accepted || improved) {
            // No progress possible at machine precision.
            break;
        }
        let s: Vec<f64> = xn.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y: Vec<f64> = gn.iter().zip(&g).map(|(a, b)| a - b).collect();
        let sy = dot(&s, &y);
        if sy > 1e-10 * dot(&y, &y).sqrt() * dot(&s, &s).sqrt() && sy > 0.0 {
            if hist.len() == LBFGS_MEMORY {
                hist.pop_front();
            }
            hist.push_back((s, y, 1.0 / sy));
        }
        let rel_decrease = (f - f_new) / f.abs().max(f_new.abs()).max(1.0);
        std::mem::swap(&mut x, &mut xn);
        std::mem::swap(&mut g, &mut gn);
        f = f_new;
        iterations += 1;
        converged = max_abs(&g) <= gtol || rel_decrease <= FTOL;
    }
    Ok(LbfgsOutcome {
        x,
        f,
        iterations,
        converged,
    })
}

#[cfg(test)]
mod tests;
