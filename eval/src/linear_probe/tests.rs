//! Tests of the linear probe: known-answer fits, balanced accuracy, the choice of `C` and the
//! stratified split, and its errors.

use super::*;
use crate::test_util::{close_or_small, Rng};

const TRAIN: [[f32; 3]; 9] = [
    [0., 1., 2.],
    [1., 0., 1.],
    [2., 2., 0.],
    [0., 2., 1.],
    [3., 1., 1.],
    [1., 3., 0.],
    [2., 0., 2.],
    [0., 0., 3.],
    [3., 3., 1.],
];
const TEST: [[f32; 3]; 4] = [[1., 1., 1.], [2., 3., 0.], [0., 1., 3.], [3., 2., 0.]];

fn assert_all_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(close_or_small(*g, *w, tol), "got {got:?}, want {want:?}");
    }
}

fn tight() -> LinearProbeConfig {
    LinearProbeConfig {
        tol: 1e-10,
        ..Default::default()
    }
}

#[test]
fn multinomial_kat() {
    let train = Features::from_rows(&TRAIN).unwrap();
    let test = Features::from_rows(&TEST).unwrap();
    let y = [0, 0, 1, 2, 1, 2, 0, 0, 1];
    let model = fit_logistic(&train, &y, &tight()).unwrap();
    assert_all_close(
        &model.mean,
        &[1.3333333333, 1.3333333333, 1.2222222222],
        1e-9,
    );
    assert_all_close(
        &model.scale,
        &[1.1547005384, 1.1547005384, 0.9162456946],
        1e-9,
    );
    let w = [
        -0.2898831312,
        -0.8334348961,
        0.6226785372,
        0.9656053602,
        0.2070563338,
        -0.2811396876,
        -0.675722229,
        0.6263785623,
        -0.3415388496,
    ];
    assert_all_close(&model.weights, &w, 1e-6);
    assert_all_close(
        &model.bias,
        &[0.3892896663, -0.0291215046, -0.3601681617],
        1e-6,
    );
    assert!(close_or_small(model.objective, 0.4507545604, 1e-8));
    assert!(model.converged);
    let proba = model.predict_proba(&test).unwrap();
    let want = [
        [0.5375542443, 0.2270191481, 0.2354266076],
        [0.0306517545, 0.6242804638, 0.3450677817],
        [0.9137803041, 0.0180914034, 0.0681282925],
        [0.03595619, 0.882187105, 0.081856705],
    ];
    for (p, w) in proba.iter().zip(&want) {
        assert_all_close(p, w, 1e-6);
    }

    // Default tolerance: same predictions, objective within 1e-6.
    let res = linear_probe(&train, &y, &test, &[0, 2, 0, 1], &Default::default()).unwrap();
    assert_eq!(res.predictions, vec![0, 1, 0, 1]);
    assert!(close_or_small(res.balanced_accuracy, 0.6666666667, 1e-9));
    assert!(close_or_small(res.accuracy, 0.75, 1e-12));
    assert!(close_or_small(res.objective, 0.4507545604, 1e-6));
    assert!(res.iterations > 0 && res.iterations <= 1000);
}

#[test]
fn binary_kat() {
    let train = Features::from_rows(&TRAIN).unwrap();
    let test = Features::from_rows(&TEST).unwrap();
    let y = [0, 0, 1, 1, 1, 0, 0, 0, 1];
    let model = fit_logistic(&train, &y, &tight()).unwrap();
    assert!(model.is_binary());
    assert_all_close(
        &model.weights,
        &[0.6366408747, 0.5469077373, -0.3263810637],
        1e-6,
    );
    assert_all_close(&model.bias, &[-0.3031011649], 1e-6);
    assert_eq!(model.predict(&test).unwrap(), vec![0, 1, 0, 1]);
    // Relabelled classes map back to the original labels.
    let y2: Vec<u32> = y.iter().map(|&c| if c == 1 { 9 } else { 4 }).collect();
    let m2 = fit_logistic(&train, &y2, &tight()).unwrap();
    assert_eq!(m2.predict(&test).unwrap(), vec![4, 9, 4, 9]);
    assert_all_close(&m2.weights, &model.weights, 1e-9);
}

#[test]
fn balanced_accuracy_kat() {
    let b = balanced_accuracy(&[0, 0, 0, 1, 1, 2], &[0, 0, 1, 1, 0, 2]);
    assert!(close_or_small(b, 0.7222222222, 1e-9));
    // Predicted classes absent from y_true add nothing.
    assert!(close_or_small(
        balanced_accuracy(&[0, 0], &[0, 5]),
        0.5,
        1e-12
    ));
    assert!(balanced_accuracy(&[], &[]).is_nan());
}

#[test]
fn errors_instead_of_panics() {
    let train = Features::from_rows(&TRAIN).unwrap();
    let test = Features::from_rows(&TEST).unwrap();
    let cfg = LinearProbeConfig::default();
    let y = [0u32; 9];
    assert!(linear_probe(&train, &y, &test, &[0; 4], &cfg).is_err());
    assert!(linear_probe(&train, &y[..8], &test, &[0; 4], &cfg).is_err());
    let y = [0, 0, 1, 2, 1, 2, 0, 0, 1];
    assert!(linear_probe(&train, &y, &test, &[0; 3], &cfg).is_err());
    let empty = Features::new(vec![], 0, 3).unwrap();
    assert!(linear_probe(&empty, &[], &test, &[0; 4], &cfg).is_err());
    assert!(linear_probe(&train, &y, &empty, &[], &cfg).is_err());
    let bad = LinearProbeConfig { c: 0.0, ..cfg };
    assert!(linear_probe(&train, &y, &test, &[0; 4], &bad).is_err());
}

/// Three classes whose means differ by ~1 per dimension, hidden under a 3-dimensional
/// nuisance factor of standard deviation 5 shared by all 20 dimensions. Heavy regularisation
/// shrinks the probe towards the (nuisance-dominated) class-mean directions; a weakly
/// regularised probe projects the nuisance out.
fn nuisance_problem(n_per_class: usize, seed: u64) -> (Features, Vec<u32>) {
    let (d, k, m) = (20, 3, 3);
    let mut rng = Rng::new(seed);
    let means = rng.features(k, d);
    let loadings = rng.features(m, d);
    let mut data = Vec::with_capacity(n_per_class * k * d);
    let mut labels = Vec::with_capacity(n_per_class * k);
    for i in 0..n_per_class * k {
        let y = i % k;
        let u: Vec<f64> = (0..m).map(|_| 5.0 * rng.normal()).collect();
        for j in 0..d {
            let nuisance: f64 = (0..m).map(|a| u[a] * f64::from(loadings.row(a)[j])).sum();
            let v = f64::from(means.row(y)[j]) + nuisance + 0.3 * rng.normal();
            data.push(v as f32);
        }
        labels.push(y as u32);
    }
    (Features::new(data, n_per_class * k, d).unwrap(), labels)
}

#[test]
fn select_c_avoids_harmful_regularisation() {
    let (all, all_y) = nuisance_problem(90, 17);
    let (x, y) = (
        select_rows(&all, &(0..180).collect::<Vec<_>>()),
        &all_y[..180],
    );
    let (test, test_y) = (
        select_rows(&all, &(180..270).collect::<Vec<_>>()),
        &all_y[180..],
    );
    let sel = select_c(&x, y, &DEFAULT_C_GRID, 0.25, 1).unwrap();
    eprintln!("C selection: {sel:?}");
    assert_eq!(sel.scores.len(), DEFAULT_C_GRID.len());
    assert_eq!((sel.n_subtrain, sel.n_validation), (135, 45));
    for (&(c, acc), &g) in sel.scores.iter().zip(&DEFAULT_C_GRID) {
        assert_eq!(c, g);
        assert!((0.0..=1.0).contains(&acc));
    }
    assert!(sel.c > DEFAULT_C_GRID[0], "chose the smallest C: {sel:?}");
    let best = sel.scores.iter().find(|s| s.0 == sel.c).unwrap().1;
    assert!(best >= sel.scores[0].1 + 0.1, "{sel:?}");
    // The chosen C is the first (smallest) one reaching the maximum.
    let max = sel.scores.iter().map(|s| s.1).fold(0.0, f64::max);
    assert_eq!(best, max);
    assert!(sel.scores.iter().all(|s| s.1 < max || s.0 >= sel.c));
    // Determinism for a fixed seed.
    assert_eq!(select_c(&x, y, &DEFAULT_C_GRID, 0.25, 1).unwrap(), sel);
    // Refit on the full training set with the chosen C.
    let cfg = LinearProbeConfig {
        c: sel.c,
        ..Default::default()
    };
    let res = linear_probe(&x, y, &test, test_y, &cfg).unwrap();
    assert!(res.balanced_accuracy > 0.9, "{res:?}");
}

#[test]
fn select_c_ties_go_to_the_smaller_c() {
    // Trivially separable: every C scores 1 on validation, so the smallest C wins whatever
    // the grid order.
    let x = Features::from_rows(&[
        [0.0f32, 0.1],
        [0.1, 0.0],
        [0.0, 0.0],
        [0.1, 0.1],
        [10.0, 10.1],
        [10.1, 10.0],
        [10.0, 10.0],
        [10.1, 10.1],
    ])
    .unwrap();
    let y = [0, 0, 0, 0, 1, 1, 1, 1];
    let sel = select_c(&x, &y, &[10.0, 0.5, 1.0], 0.5, 3).unwrap();
    assert!(sel.scores.iter().all(|s| s.1 == 1.0), "{sel:?}");
    assert_eq!(sel.c, 0.5);
}

#[test]
fn stratified_split_is_deterministic_and_keeps_every_class() {
    let labels: Vec<u32> = (0..103u32).map(|i| i % 4).chain([7]).collect();
    let (sub, val) = stratified_split(&labels, 0.2, 42).unwrap();
    assert_eq!(
        stratified_split(&labels, 0.2, 42).unwrap(),
        (sub.clone(), val.clone())
    );
    assert_ne!(stratified_split(&labels, 0.2, 43).unwrap().1, val);
    let mut all: Vec<usize> = sub.iter().chain(&val).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..labels.len()).collect::<Vec<_>>());
    for c in 0..4u32 {
        let n_c = labels.iter().filter(|&&y| y == c).count();
        let n_val = val.iter().filter(|&&i| labels[i] == c).count();
        assert_eq!(
            n_val,
            ((0.2 * n_c as f64).round() as usize).clamp(1, n_c - 1)
        );
    }
    // The singleton class 7 stays in the sub-train part.
    assert!(sub.contains(&103) && !val.contains(&103));
    // Small classes still send one sample to validation and keep one.
    let (sub, val) = stratified_split(&[0, 0, 1, 1, 1], 0.01, 0).unwrap();
    assert_eq!((sub.len(), val.len()), (3, 2));
    let (sub, val) = stratified_split(&[0, 0, 1, 1], 0.99, 0).unwrap();
    assert_eq!((sub.len(), val.len()), (2, 2));
}

#[test]
fn select_c_with_a_singleton_class_and_errors() {
    let mut rows = TRAIN.to_vec();
    rows.push([3.0, 0.0, 3.0]);
    let x = Features::from_rows(&rows).unwrap();
    let y = [0, 0, 1, 2, 1, 2, 0, 0, 1, 3];
    let sel = select_c(&x, &y, &DEFAULT_C_GRID, 0.3, 0).unwrap();
    assert_eq!((sel.n_subtrain, sel.n_validation), (7, 3));
    assert!(DEFAULT_C_GRID.contains(&sel.c));

    let train = Features::from_rows(&TRAIN).unwrap();
    let y = [0, 0, 1, 2, 1, 2, 0, 0, 1];
    assert!(select_c(&train, &y, &[], 0.3, 0).is_err());
    assert!(select_c(&train, &y, &[1.0, 0.0], 0.3, 0).is_err());
    assert!(select_c(&train, &y, &[f64::INFINITY], 0.3, 0).is_err());
    for bad in [0.0, 1.0, -0.5, f64::NAN] {
        assert!(select_c(&train, &y, &[1.0], bad, 0).is_err());
    }
    assert!(select_c(&train, &y[..8], &[1.0], 0.3, 0).is_err());
    assert!(select_c(&train, &[5; 9], &[1.0], 0.3, 0).is_err());
    // Every class a singleton: nothing to validate on.
    let three = Features::from_rows(&TRAIN[..3]).unwrap();
    let err = select_c(&three, &[0, 1, 2], &[1.0], 0.3, 0).unwrap_err();
    assert!(err.to_string().contains("validation"), "{err}");
    let empty = Features::new(vec![], 0, 3).unwrap();
    assert!(select_c(&empty, &[], &[1.0], 0.3, 0).is_err());
}

#[test]
fn zero_variance_dimension_is_harmless() {
    let rows: Vec<[f32; 4]> = TRAIN.iter().map(|r| [r[0], r[1], r[2], 7.0]).collect();
    let train = Features::from_rows(&rows).unwrap();
    let y = [0, 0, 1, 2, 1, 2, 0, 0, 1];
    let model = fit_logistic(&train, &y, &tight()).unwrap();
    assert_eq!(model.scale[3], 1.0);
    assert!(close_or_small(model.objective, 0.4507545604, 1e-8));
}

#[test]
fn moderate_problem_is_fast() {
    // Deterministic pseudo-random 1500×128 features, 10 classes with class-dependent shifts.
    let (n, d, k) = (1500usize, 128usize, 10u32);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let labels: Vec<u32> = (0..n as u32).map(|i| i % k).collect();
    let data: Vec<f32> = (0..n * d)
        .map(|idx| {
            let (i, j) = (idx / d, idx % d);
            let shift = if j % k as usize == labels[i] as usize {
                0.3
            } else {
                0.0
            };
            (next() + shift) as f32
        })
        .collect();
    let x = Features::new(data, n, d).unwrap();
    let start = std::time::Instant::now();
    let res = linear_probe(&x, &labels, &x, &labels, &Default::default()).unwrap();
    let secs = start.elapsed().as_secs_f64();
    assert!(res.accuracy > 0.5, "train accuracy {}", res.accuracy);
    assert!(secs < 5.0, "took {secs} s");
    eprintln!(
        "1500×128, 10 classes: {secs:.3} s, {} iterations, J = {}",
        res.iterations, res.objective
    );
    // The default stop (max |∇J| ≤ 1e-4) is close to, and above, the optimum.
    let tight_model = fit_logistic(&x, &labels, &tight()).unwrap();
    eprintln!(
        "tight: {} iterations, J = {}",
        tight_model.iterations, tight_model.objective
    );
    assert!(tight_model.converged);
    let gap = res.objective - tight_model.objective;
    assert!((0.0..1e-3).contains(&gap), "objective gap {gap}");
}
