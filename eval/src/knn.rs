//! Weighted k-NN classifier (spec §3, DINO / CARP protocol).
//!
//! Train and test rows are L2-normalised, cosine similarities `s_j` to all training samples are
//! computed (as an `f32` matrix product, in parallel over blocks of test rows), the `k` most
//! similar training samples are taken (ties: lower index first; all of them if fewer than `k`),
//! and each votes for its label with weight `exp(s_j / T)`. Prediction = arg-max class score,
//! lowest class index on ties. Class indices are the raw `u32` labels (`0..=max train label`).

use anyhow::{ensure, Result};
use nalgebra::DMatrix;
use rayon::prelude::*;

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
    ensure!(k > 0, "k-NN: k must be positive");
    ensure!(
        t.is_finite() && t > 0.0,
        "k-NN: temperature must be positive (got {t})"
    );
    let num_classes = *train_y.iter().max().expect("non-empty") as usize + 1;
    let d = train.d;
    let k = k.min(train.n);
    let to_f32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
    // Column-major d × n_train = row-major n_train × d, i.e. the normalised bank transposed.
    let bank_t = DMatrix::from_column_slice(d, train.n, &to_f32(train.normalized_rows_f64()));
    let queries = to_f32(test.normalized_rows_f64());

    let blocks: Vec<Vec<Vec<f64>>> = queries
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
                    let mut scores = vec![0.0f64; num_classes];
                    for &(j, s) in top.iter() {
                        scores[train_y[j] as usize] += (f64::from(s) / t).exp();
                    }
                    scores
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
        .map(|s| ranked_classes(s)[0])
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
    ensure!(test.n > 0, "k-NN: empty test set");
    ensure!(
        test_y.len() == test.n,
        "k-NN: {} test labels for {} test samples",
        test_y.len(),
        test.n
    );
    ensure!(top > 0, "k-NN: top must be positive");
    let scores = knn_scores(train, train_y, test, k, t)?;
    let hits = scores
        .iter()
        .zip(test_y)
        .filter(|(s, &y)| ranked_classes(s).iter().take(top).any(|&c| c == y))
        .count();
    Ok(hits as f64 / test.n as f64)
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
