//! Weighted k-NN classifier (`docs/spec/metrics.md` §3, DINO / CARP protocol).
//!
//! Train and test rows are L2-normalised, cosine similarities `s_j` to all training samples are
//! computed (as an `f32` matrix product, in parallel over blocks of test rows), the `k` most
//! similar training samples are taken (ties: lower index first; all of them if fewer than `k`),
//! and each votes for its label with weight `exp(s_j / T)`. Prediction = arg-max class score,
//! lowest class index on ties. Class indices are the raw `u32` labels (`0..=max train label`).
//!
//! [`knn_sweep`] evaluates a whole `k × T` grid (the duality paper's [`SWEEP_KS`] ×
//! [`SWEEP_TEMPERATURES`]) from one similarity computation and one `max(k)` neighbour search.

use anyhow::{ensure, Result};
use nalgebra::DMatrix;
use rayon::prelude::*;
use serde::Serialize;

use crate::Features;

/// Default temperature `T` (spec §3).
pub const DEFAULT_KNN_T: f64 = 0.07;
/// Default number of neighbours (CARP's per-dataset setting).
pub const DEFAULT_KNN_K: usize = 20;

/// Test rows processed per matrix product.
const BLOCK: usize = 256;

/// Class scores (`n_test` rows of `max(train_y) + 1` values).
pub fn knn_scores(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    k: usize,
    t: f64,
) -> Result<Vec<Vec<f64>>> {
    check_bank(train, train_y, test)?;
    ensure!(k > 0, "k-NN: k must be positive");
    check_temperature(t)?;
    let num_classes = num_classes(train_y);
    for_each_neighbours(train, test, k, |top| {
        let mut scores = vec![0.0f64; num_classes];
        for &(j, s) in top {
            scores[train_y[j] as usize] += (f64::from(s) / t).exp();
        }
        scores
    })
}

/// Checks the memory bank, its labels and the test dimension.
fn check_bank(train: &Features, train_y: &[u32], test: &Features) -> Result<()> {
    ensure!(train.n > 0, "k-NN: empty training set");
    ensure!(
        train_y.len() == train.n,
        "k-NN: {} training labels for {} training samples",
        train_y.len(),
        train.n
    );
    ensure!(
        test.d == train.d,
        "k-NN: test dimension {} differs from train dimension {}",
        test.d,
        train.d
    );
    ensure!(train.d > 0, "k-NN: zero-dimensional features");
    Ok(())
}

fn check_temperature(t: f64) -> Result<()> {
    ensure!(
        t.is_finite() && t > 0.0,
        "k-NN: temperature must be positive (got {t})"
    );
    Ok(())
}

fn check_test_labels(test: &Features, test_y: &[u32]) -> Result<()> {
    ensure!(test.n > 0, "k-NN: empty test set");
    ensure!(
        test_y.len() == test.n,
        "k-NN: {} test labels for {} test samples",
        test_y.len(),
        test.n
    );
    Ok(())
}

/// Number of class-score slots: `max(train_y) + 1` (`train_y` is non-empty).
fn num_classes(train_y: &[u32]) -> usize {
    train_y.iter().max().map_or(0, |&m| m as usize + 1)
}

/// Calls `per_row` with the `min(k, n_train)` most similar training samples of every test row,
/// as `(train index, cosine similarity)` sorted by descending similarity (ties: lower index
/// first), and collects the results in test order.
///
/// This is the single code path that computes similarities (an `f32` matrix product per block of
/// [`BLOCK`] test rows, blocks in parallel), so the neighbour list of a row does not depend on
/// `k` beyond its length: the list for `k` is exactly the first `k` entries of the list for any
/// larger `k` (the order is a strict total order). [`knn_sweep`] relies on this.
fn for_each_neighbours<R, F>(
    train: &Features,
    test: &Features,
    k: usize,
    per_row: F,
) -> Result<Vec<R>>
where
    R: Send,
    F: Fn(&[(usize, f32)]) -> R + Sync,
{
    let d = train.d;
    let k = k.min(train.n);
    let to_f32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    // Column-major d × n_train = row-major n_train × d, i.e. the normalised bank transposed.
    let bank_t = DMatrix::from_column_slice(d, train.n, &to_f32(train.normalized_rows_f64()));
    let queries = to_f32(test.normalized_rows_f64());

    let blocks: Vec<Vec<R>> = queries
        .par_chunks(BLOCK * d)
        .map(|chunk| {
            let b = chunk.len() / d;
            let q = DMatrix::from_row_slice(b, d, chunk);
            let sims = q * &bank_t; // b × n_train
            let mut cand: Vec<(usize, f32)> = Vec::with_capacity(train.n);
            (0..b)
                .map(|r| {
                    cand.clear();
                    cand.extend(sims.row(r).iter().copied().enumerate());
                    let order = |a: &(usize, f32), b: &(usize, f32)| {
                        b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
                    };
                    if k < cand.len() {
                        cand.select_nth_unstable_by(k - 1, order);
                    }
                    let top = &mut cand[..k];
                    top.sort_by(order);
                    per_row(top)
                })
                .collect()
        })
        .collect();
    Ok(blocks.into_iter().flatten().collect())
}

/// Predicted labels (arg-max class score, lowest index on ties).
pub fn knn_predict(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    k: usize,
    t: f64,
) -> Result<Vec<u32>> {
    Ok(knn_scores(train, train_y, test, k, t)?
        .iter()
        .map(|s| top_class(s))
        .collect())
}

/// Top-1 accuracy of the weighted k-NN classifier.
pub fn knn_accuracy(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    test_y: &[u32],
    k: usize,
    t: f64,
) -> Result<f64> {
    knn_topk_accuracy(train, train_y, test, test_y, k, t, 1)
}

/// Fraction of test samples whose label is among the `top` best class scores (top-5: `top = 5`).
pub fn knn_topk_accuracy(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    test_y: &[u32],
    k: usize,
    t: f64,
    top: usize,
) -> Result<f64> {
    check_test_labels(test, test_y)?;
    ensure!(top > 0, "k-NN: top must be positive");
    let scores = knn_scores(train, train_y, test, k, t)?;
    let hits = scores
        .iter()
        .zip(test_y)
        .filter(|(s, &y)| ranked_classes(s).iter().take(top).any(|&c| c == y))
        .count();
    Ok(hits as f64 / test.n as f64)
}

/// `k` values of the duality paper's k-NN sweep (spec §3).
pub const SWEEP_KS: [usize; 6] = [1, 5, 10, 20, 50, 200];
/// Temperatures of the duality paper's k-NN sweep (spec §3).
pub const SWEEP_TEMPERATURES: [f64; 6] = [0.05, 0.07, 0.1, 0.2, 0.5, 1.0];

/// One `(k, T)` cell of a [`knn_sweep`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KnnCell {
    /// Requested number of neighbours (all training samples are used when fewer exist).
    pub k: usize,
    /// Temperature `T`.
    pub t: f64,
    /// Top-1 accuracy on the test set.
    pub accuracy: f64,
}

/// Top-1 accuracies of the weighted k-NN classifier over a `k × T` grid ([`knn_sweep`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KnnSweep {
    /// Cells in k-major order (`ks[0]` with every temperature, then `ks[1]`, …); never empty.
    cells: Vec<KnnCell>,
}

impl KnnSweep {
    /// All cells, k-major (`ks.len() × temperatures.len()` of them, in the order given).
    pub fn cells(&self) -> &[KnnCell] {
        &self.cells
    }

    /// The cell with the highest accuracy; ties go to the first one in k-major order.
    pub fn best(&self) -> KnnCell {
        let mut best = self.cells[0];
        for c in &self.cells[1..] {
            if c.accuracy > best.accuracy {
                best = *c;
            }
        }
        best
    }

    /// Accuracy of the first cell with exactly this `k` and `t`, if it was swept.
    pub fn accuracy(&self, k: usize, t: f64) -> Option<f64> {
        self.cells
            .iter()
            .find(|c| c.k == k && c.t == t)
            .map(|c| c.accuracy)
    }
}

/// Top-1 accuracy of the weighted k-NN classifier for every `(k, T)` in `ks × temperatures`
/// (e.g. [`SWEEP_KS`] × [`SWEEP_TEMPERATURES`], the duality paper's grid).
///
/// `train`: `n_train × d` with labels `train_y` (`n_train`); `test`: `n_test × d` with labels
/// `test_y` (`n_test`). The similarity matrix and the `max(ks)` nearest neighbours of every test
/// row are computed once; each cell then accumulates the votes of the first `k` of them, in the
/// same order as [`knn_scores`], so every cell equals [`knn_accuracy`]`(…, k, T)` exactly.
pub fn knn_sweep(
    train: &Features,
    train_y: &[u32],
    test: &Features,
    test_y: &[u32],
    ks: &[usize],
    temperatures: &[f64],
) -> Result<KnnSweep> {
    check_bank(train, train_y, test)?;
    check_test_labels(test, test_y)?;
    ensure!(!ks.is_empty(), "k-NN sweep: no k values");
    ensure!(
        ks.iter().all(|&k| k > 0),
        "k-NN sweep: every k must be positive (got {ks:?})"
    );
    ensure!(!temperatures.is_empty(), "k-NN sweep: no temperatures");
    for &t in temperatures {
        check_temperature(t)?;
    }
    let num_classes = num_classes(train_y);
    let k_max = ks.iter().copied().max().expect("non-empty");
    // ends_at[p]: indices of the ks whose neighbour list ends at position p.
    let mut ends_at = vec![Vec::new(); k_max.min(train.n)];
    for (ki, &k) in ks.iter().enumerate() {
        ends_at[k.min(train.n) - 1].push(ki);
    }
    let n_t = temperatures.len();
    let predictions = for_each_neighbours(train, test, k_max, |top| {
        let mut pred = vec![0u32; ks.len() * n_t];
        let mut scores = vec![0.0f64; num_classes];
        for (ti, &t) in temperatures.iter().enumerate() {
            scores.iter_mut().for_each(|s| *s = 0.0);
            for (&(j, s), ends) in top.iter().zip(&ends_at) {
                scores[train_y[j] as usize] += (f64::from(s) / t).exp();
                for &ki in ends {
                    pred[ki * n_t + ti] = top_class(&scores);
                }
            }
        }
        pred
    })?;
    let mut hits = vec![0usize; ks.len() * n_t];
    for (pred, &y) in predictions.iter().zip(test_y) {
        for (h, &p) in hits.iter_mut().zip(pred) {
            *h += usize::from(p == y);
        }
    }
    let cells = ks
        .iter()
        .flat_map(|&k| temperatures.iter().map(move |&t| (k, t)))
        .zip(&hits)
        .map(|((k, t), &h)| KnnCell {
            k,
            t,
            accuracy: h as f64 / test.n as f64,
        })
        .collect();
    Ok(KnnSweep { cells })
}

/// The arg-max class (lowest index on ties), i.e. `ranked_classes(scores)[0]`.
fn top_class(scores: &[f64]) -> u32 {
    let mut best = 0;
    for c in 1..scores.len() {
        if scores[c].total_cmp(&scores[best]) == std::cmp::Ordering::Greater {
            best = c;
        }
    }
    best as u32
}

/// Class indices by descending score (stable: lower index first on ties).
fn ranked_classes(scores: &[f64]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    idx.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
    idx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::Rng;

    fn data() -> (Features, Vec<u32>, Features, Vec<u32>) {
        let train = Features::from_rows(&[
            [1.0f32, 0.0],
            [0.8, 0.6],
            [0.0, 1.0],
            [-1.0, 0.0],
            [0.6, -0.8],
        ])
        .unwrap();
        let test = Features::from_rows(&[[1.0f32, 0.2], [-0.2, 1.0]]).unwrap();
        (train, vec![0, 0, 1, 1, 2], test, vec![0, 1])
    }

    fn assert_scores(got: &[Vec<f64>], want: &[[f64; 3]]) {
        for (g, w) in got.iter().zip(want) {
            for (a, b) in g.iter().zip(w) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.max(1.0),
                    "got {got:?}, want {want:?}"
                );
            }
        }
    }

    #[test]
    fn knn_kat() {
        let (train, ty, test, sy) = data();
        let s1 = knn_scores(&train, &ty, &test, 1, 0.5).unwrap();
        assert_scores(&s1, &[[7.1075766679, 0.0, 0.0], [0.0, 7.1075766679, 0.0]]);
        let s2 = knn_scores(&train, &ty, &test, 2, 0.5).unwrap();
        assert_scores(
            &s2,
            &[[13.1831018989, 0.0, 0.0], [2.370049864, 7.1075766679, 0.0]],
        );
        let s3 = knn_scores(&train, &ty, &test, 3, 0.5).unwrap();
        assert_scores(
            &s3,
            &[
                [13.1831018989, 0.0, 2.370049864],
                [2.370049864, 8.5878581647, 0.0],
            ],
        );
        for k in 1..=3 {
            for t in [0.5, DEFAULT_KNN_T] {
                assert_eq!(knn_predict(&train, &ty, &test, k, t).unwrap(), vec![0, 1]);
                assert_eq!(knn_accuracy(&train, &ty, &test, &sy, k, t).unwrap(), 1.0);
            }
        }
        // k larger than the bank uses all samples.
        assert_eq!(knn_scores(&train, &ty, &test, 50, 0.5).unwrap().len(), 2);
        assert_eq!(
            knn_topk_accuracy(&train, &ty, &test, &[2, 2], 1, 0.5, 3).unwrap(),
            1.0
        );
    }

    #[test]
    fn ties_prefer_lower_index() {
        // Two identical bank entries with different labels: k = 1 must pick index 0.
        let train = Features::from_rows(&[[1.0f32, 0.0], [1.0, 0.0]]).unwrap();
        let test = Features::from_rows(&[[2.0f32, 0.0]]).unwrap();
        assert_eq!(
            knn_predict(&train, &[1, 0], &test, 1, 0.1).unwrap(),
            vec![1]
        );
        assert_eq!(
            knn_predict(&train, &[0, 1], &test, 1, 0.1).unwrap(),
            vec![0]
        );
        // Equal class scores: lowest class wins.
        assert_eq!(
            knn_predict(&train, &[1, 0], &test, 2, 0.1).unwrap(),
            vec![0]
        );
    }

    /// `n` samples of `classes` noisy clusters in `d` dimensions (labels `i % classes`).
    fn clusters(
        rng: &mut Rng,
        n: usize,
        d: usize,
        classes: u32,
        centres: &Features,
    ) -> (Features, Vec<u32>) {
        let labels: Vec<u32> = (0..n as u32).map(|i| i % classes).collect();
        let mut x = rng.features(n, d);
        for (row, &y) in x.data.chunks_mut(d).zip(&labels) {
            for (v, c) in row.iter_mut().zip(centres.row(y as usize)) {
                *v = 3.0 * *v + c;
            }
        }
        (x, labels)
    }

    #[test]
    fn sweep_cells_equal_knn_accuracy() {
        let mut rng = Rng::new(7);
        let (d, classes) = (16, 4);
        let centres = rng.features(classes as usize, d);
        let (train, ty) = clusters(&mut rng, 300, d, classes, &centres);
        let (test, sy) = clusters(&mut rng, 100, d, classes, &centres);
        // 500 > n_train exercises the "use all" rule; 3 is a k not in the paper's grid.
        let ks: Vec<usize> = SWEEP_KS.iter().copied().chain([3, 500]).collect();
        let sweep = knn_sweep(&train, &ty, &test, &sy, &ks, &SWEEP_TEMPERATURES).unwrap();
        assert_eq!(sweep.cells().len(), ks.len() * SWEEP_TEMPERATURES.len());
        let mut distinct = Vec::new();
        for (idx, cell) in sweep.cells().iter().enumerate() {
            assert_eq!(cell.k, ks[idx / SWEEP_TEMPERATURES.len()]);
            assert_eq!(cell.t, SWEEP_TEMPERATURES[idx % SWEEP_TEMPERATURES.len()]);
            let want = knn_accuracy(&train, &ty, &test, &sy, cell.k, cell.t).unwrap();
            assert_eq!(cell.accuracy, want, "cell {cell:?}");
            assert_eq!(sweep.accuracy(cell.k, cell.t), Some(want));
            if !distinct.contains(&cell.accuracy) {
                distinct.push(cell.accuracy);
            }
        }
        // The data is neither trivially separable nor random: the grid matters.
        assert!(distinct.len() > 2, "accuracies {distinct:?}");
        let best = sweep.best();
        assert!(sweep.cells().iter().all(|c| c.accuracy <= best.accuracy));
        assert!(best.accuracy > 0.5 && best.accuracy < 1.0, "{best:?}");
        assert_eq!(sweep.accuracy(7, 0.07), None);
    }

    #[test]
    fn sweep_kat() {
        let (train, ty, test, sy) = data();
        let sweep = knn_sweep(
            &train,
            &ty,
            &test,
            &sy,
            &[1, 2, 3, 200],
            &[0.5, DEFAULT_KNN_T],
        )
        .unwrap();
        // Predictions [0, 1] for every k and T of the spec (k = 200 uses all 5 samples).
        for cell in &sweep.cells()[..6] {
            assert_eq!(cell.accuracy, 1.0, "{cell:?}");
        }
        for cell in sweep.cells() {
            let want = knn_accuracy(&train, &ty, &test, &sy, cell.k, cell.t).unwrap();
            assert_eq!(cell.accuracy, want);
        }
        // Ties in best(): the first cell in k-major order wins.
        assert_eq!((sweep.best().k, sweep.best().t), (1, 0.5));
        let hand = KnnSweep {
            cells: vec![
                KnnCell {
                    k: 1,
                    t: 0.1,
                    accuracy: 0.5,
                },
                KnnCell {
                    k: 5,
                    t: 0.1,
                    accuracy: 0.75,
                },
                KnnCell {
                    k: 5,
                    t: 0.2,
                    accuracy: 0.75,
                },
                KnnCell {
                    k: 10,
                    t: 0.1,
                    accuracy: 0.25,
                },
            ],
        };
        assert_eq!((hand.best().k, hand.best().t), (5, 0.1));
    }

    #[test]
    fn sweep_errors() {
        let (train, ty, test, sy) = data();
        let t = [0.07];
        assert!(knn_sweep(&train, &ty, &test, &sy, &[], &t).is_err());
        assert!(knn_sweep(&train, &ty, &test, &sy, &[1, 0], &t).is_err());
        assert!(knn_sweep(&train, &ty, &test, &sy, &[1], &[]).is_err());
        assert!(knn_sweep(&train, &ty, &test, &sy, &[1], &[0.1, -1.0]).is_err());
        assert!(knn_sweep(&train, &ty, &test, &sy, &[1], &[f64::NAN]).is_err());
        assert!(knn_sweep(&train, &ty[..4], &test, &sy, &[1], &t).is_err());
        assert!(knn_sweep(&train, &ty, &test, &sy[..1], &[1], &t).is_err());
        let empty = Features::new(vec![], 0, 2).unwrap();
        assert!(knn_sweep(&train, &ty, &empty, &[], &[1], &t).is_err());
        assert!(knn_sweep(&empty, &[], &test, &sy, &[1], &t).is_err());
        let wide = Features::new(vec![0.0; 6], 2, 3).unwrap();
        assert!(knn_sweep(&train, &ty, &wide, &sy, &[1], &t).is_err());
    }

    #[test]
    fn errors() {
        let (train, ty, test, sy) = data();
        assert!(knn_accuracy(&train, &ty[..4], &test, &sy, 1, 0.5).is_err());
        assert!(knn_accuracy(&train, &ty, &test, &sy[..1], 1, 0.5).is_err());
        assert!(knn_accuracy(&train, &ty, &test, &sy, 0, 0.5).is_err());
        assert!(knn_accuracy(&train, &ty, &test, &sy, 1, 0.0).is_err());
        let empty = Features::new(vec![], 0, 2).unwrap();
        assert!(knn_accuracy(&empty, &[], &test, &sy, 1, 0.5).is_err());
        assert!(knn_accuracy(&train, &ty, &empty, &[], 1, 0.5).is_err());
    }
}
