//! The official MedMNIST evaluation metrics, ACC and AUC per task type: `getACC` / `getAUC` of
//! MedMNIST v2 (Yang et al., Scientific Data 2023), official `evaluator.py` of the `medmnist`
//! package (unchanged in v3):
//!
//! * `multi-class` and `ordinal-regression`: ACC of the argmax (ties: the lowest index, as
//!   numpy); AUC one-vs-rest, the mean over all `K` classes;
//! * `binary-class`: ACC of `p > 0.5` with `p` the last score column; AUC of `p`;
//! * `multi-label, binary-class`: per label `l`, ACC of `p_l > 0.5` and AUC of `p_l`, each the
//!   mean over labels.
//!
//! Scores are the probabilities the official training script passes: softmax for multi-class,
//! ordinal and binary tasks, sigmoid for multi-label. AUC is scikit-learn's `roc_auc_score`
//! ([`roc_auc`]). Golden values: `eval/golden/medmnist_metrics.py`.

use anyhow::{anyhow, bail, ensure, Result};
use serde::{Deserialize, Serialize};
use ssl_data::MedMnistTask;

/// Decision threshold of `getACC` for binary and multi-label tasks (`score > threshold`).
pub const MEDMNIST_THRESHOLD: f64 = 0.5;

/// MedMNIST ACC and AUC of one split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MedMnistScores {
    /// `getACC`.
    pub acc: f64,
    /// `getAUC`.
    pub auc: f64,
}

/// Area under the ROC curve of `score` for the binary labels `y_true` (`true` = positive), both of
/// length `n`.
///
/// Computed in the Mann–Whitney form, `P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)` over all (positive, negative)
/// pairs, by one sort (`O(n log n)`) with exact integer pair counts; this equals scikit-learn's
/// `roc_auc_score` (the trapezoidal area under the ROC curve). Errors when the lengths differ,
/// `n = 0`, a score is not finite (scikit-learn rejects NaN and ±∞ too) or only one class is
/// present (the AUC is undefined).
pub fn roc_auc(y_true: &[bool], score: &[f64]) -> Result<f64> {
    let n = y_true.len();
    ensure!(
        score.len() == n,
        "roc_auc: {n} labels but {} scores",
        score.len()
    );
    ensure!(n > 0, "roc_auc: no samples");
    if let Some(i) = score.iter().position(|s| !s.is_finite()) {
        bail!("roc_auc: score {i} is {}; scores must be finite", score[i]);
    }
    let positives = y_true.iter().filter(|&&y| y).count();
    let negatives = n - positives;
    ensure!(
        positives > 0 && negatives > 0,
        "roc_auc: only one class present in y_true ({positives} positive, {negatives} negative); \
         ROC AUC is undefined"
    );

    let mut order: Vec<usize> = (0..n).collect();
    order.sort_unstable_by(|&a, &b| score[a].total_cmp(&score[b]));
    // Twice the Mann–Whitney U of the positives: a (positive, negative) pair counts 2 when the
    // positive scores higher and 1 when they tie. Groups of equal scores are contiguous in the
    // sorted order (`total_cmp` puts −0 right before +0, which `==` then merges).
    let mut twice_u: u128 = 0;
    let mut negatives_below: u64 = 0;
    for group in order.chunk_by(|&a, &b| score[a] == score[b]) {
        let p = group.iter().filter(|&&i| y_true[i]).count() as u64;
        let q = group.len() as u64 - p;
        twice_u += u128::from(p) * u128::from(2 * negatives_below + q);
        negatives_below += q;
    }
    Ok(twice_u as f64 / (2.0 * positives as f64 * negatives as f64))
}

/// MedMNIST ACC and AUC (official `getACC` / `getAUC`, threshold [`MEDMNIST_THRESHOLD`]).
///
/// * `scores`: row-major `n × k` probabilities, `k ≥ 1`, all finite.
/// * `labels`: the row-major label matrix as stored in the MedMNIST `.npz` files: `n × 1` (one
///   label per sample, `labels.len() == n`) for multi-class, ordinal and binary tasks, `n × k`
///   (0/1, `labels.len() == n·k`) for multi-label.
///
/// Shape rules: multi-class and ordinal need `k ≥ 2` and labels `< k`; binary needs `k ∈ {1, 2}`
/// (the last column is `P(1)`) and labels in `{0, 1}`; multi-label needs labels in `{0, 1}`. Every
/// AUC term needs both classes present (each class for multi-class, each label column for
/// multi-label), as scikit-learn does; violations are errors naming the problem.
pub fn medmnist_metrics(
    task: MedMnistTask,
    labels: &[u32],
    scores: &[f64],
    k: usize,
) -> Result<MedMnistScores> {
    let (acc, auc) = acc_and_auc(task, labels, scores, k)?;
    Ok(MedMnistScores { acc, auc: auc? })
}

/// `getACC` alone, with [`medmnist_metrics`]'s shape rules: defined where the AUC is not (a
/// class or label column with only one class present in `labels`).
pub fn medmnist_acc(task: MedMnistTask, labels: &[u32], scores: &[f64], k: usize) -> Result<f64> {
    Ok(acc_and_auc(task, labels, scores, k)?.0)
}

/// ACC, and the AUC or why it is undefined, after the shape checks.
fn acc_and_auc(
    task: MedMnistTask,
    labels: &[u32],
    scores: &[f64],
    k: usize,
) -> Result<(f64, Result<f64>)> {
    ensure!(k > 0, "{task} task: scores need at least one column");
    let n = scores.len() / k;
    ensure!(
        n * k == scores.len(),
        "{task} task: {} scores do not form rows of {k} columns",
        scores.len()
    );
    ensure!(n > 0, "{task} task: no samples");
    if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
        bail!(
            "{task} task: score at row {}, column {} is {}; scores must be finite",
            i / k,
            i % k,
            scores[i]
        );
    }
    let label_cols = if task == MedMnistTask::MultiLabel {
        k
    } else {
        1
    };
    ensure!(
        labels.len() == n * label_cols,
        "{task} task: {} labels for {n} samples with {k} score columns; expected the n × \
         {label_cols} label matrix ({} labels)",
        labels.len(),
        n * label_cols
    );
    match task {
        MedMnistTask::MultiClass | MedMnistTask::Ordinal => multi_class(task, labels, scores, k),
        MedMnistTask::Binary => binary(labels, scores, k),
        MedMnistTask::MultiLabel => multi_label(labels, scores, k),
    }
}

/// Column `j` of a row-major matrix with `k` columns.
fn column<T: Copy>(matrix: &[T], k: usize, j: usize) -> Vec<T> {
    matrix.iter().skip(j).step_by(k).copied().collect()
}

/// Fraction of samples whose `score > MEDMNIST_THRESHOLD` agrees with the 0/1 label.
fn threshold_accuracy(y: &[bool], score: &[f64]) -> f64 {
    let correct = y
        .iter()
        .zip(score)
        .filter(|&(&y, &s)| y == (s > MEDMNIST_THRESHOLD))
        .count();
    correct as f64 / y.len() as f64
}

/// Checks that every label is 0 or 1 (`k` columns, for the error message) and converts them.
fn binary_labels(task: MedMnistTask, labels: &[u32], k: usize) -> Result<Vec<bool>> {
    if let Some(i) = labels.iter().position(|&v| v > 1) {
        bail!(
            "{task} task: label at row {}, column {} is {}; labels must be 0 or 1",
            i / k,
            i % k,
            labels[i]
        );
    }
    Ok(labels.iter().map(|&v| v == 1).collect())
}

fn multi_class(
    task: MedMnistTask,
    labels: &[u32],
    scores: &[f64],
    k: usize,
) -> Result<(f64, Result<f64>)> {
    ensure!(
        k >= 2,
        "{task} task: scores have {k} column; expected one column per class (at least 2)"
    );
    if let Some(i) = labels.iter().position(|&v| v as usize >= k) {
        bail!(
            "{task} task: label of sample {i} is {}, but scores have only {k} classes",
            labels[i]
        );
    }
    // numpy's argmax: the first maximum.
    let correct = scores
        .chunks_exact(k)
        .zip(labels)
        .filter(|&(row, &label)| {
            let argmax = (1..k).fold(0, |best, j| if row[j] > row[best] { j } else { best });
            argmax == label as usize
        })
        .count();
    let auc = (0..k)
        .map(|class| {
            let y: Vec<bool> = labels.iter().map(|&v| v as usize == class).collect();
            roc_auc(&y, &column(scores, k, class))
                .map_err(|e| anyhow!("{task} task, class {class} (one-vs-rest): {e}"))
        })
        .sum::<Result<f64>>()
        .map(|sum| sum / k as f64);
    Ok((correct as f64 / labels.len() as f64, auc))
}

fn binary(labels: &[u32], scores: &[f64], k: usize) -> Result<(f64, Result<f64>)> {
    let task = MedMnistTask::Binary;
    ensure!(
        k <= 2,
        "{task} task: scores have {k} columns; expected 2 (softmax over {{0, 1}}) or 1 (P(1))"
    );
    let y = binary_labels(task, labels, 1)?;
    let p = column(scores, k, k - 1);
    Ok((
        threshold_accuracy(&y, &p),
        roc_auc(&y, &p).map_err(|e| anyhow!("{task} task: {e}")),
    ))
}

fn multi_label(labels: &[u32], scores: &[f64], k: usize) -> Result<(f64, Result<f64>)> {
    let task = MedMnistTask::MultiLabel;
    let y = binary_labels(task, labels, k)?;
    let columns = |label| (column(&y, k, label), column(scores, k, label));
    let acc: f64 = (0..k)
        .map(|label| {
            let (y, p) = columns(label);
            threshold_accuracy(&y, &p)
        })
        .sum();
    let auc = (0..k)
        .map(|label| {
            let (y, p) = columns(label);
            roc_auc(&y, &p).map_err(|e| anyhow!("{task} task, label {label}: {e}"))
        })
        .sum::<Result<f64>>()
        .map(|sum| sum / k as f64);
    Ok((acc / k as f64, auc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{close_or_small, Rng};

    fn flat<const K: usize>(rows: &[[f64; K]]) -> Vec<f64> {
        rows.iter().flatten().copied().collect()
    }

    /// Checks `medmnist_metrics` against the `eval/golden/medmnist_metrics.py` values.
    fn check_golden(task: &str, labels: &[u32], scores: &[f64], k: usize, acc: f64, auc: f64) {
        let task = MedMnistTask::from_official(task).unwrap();
        let got = medmnist_metrics(task, labels, scores, k).unwrap();
        assert!(
            close_or_small(got.acc, acc, 1e-12),
            "{task} ACC {} vs {acc}",
            got.acc
        );
        assert!(
            close_or_small(got.auc, auc, 1e-12),
            "{task} AUC {} vs {auc}",
            got.auc
        );
    }

    /// `O(n²)` reference: pairs won plus half the ties, over all (positive, negative) pairs.
    fn auc_by_pairs(y: &[bool], s: &[f64]) -> f64 {
        let (mut won, mut pairs) = (0.0, 0.0);
        for (_, &pi) in s.iter().enumerate().filter(|&(i, _)| y[i]) {
            for (_, &nj) in s.iter().enumerate().filter(|&(j, _)| !y[j]) {
                pairs += 1.0;
                won += if pi > nj {
                    1.0
                } else if pi == nj {
                    0.5
                } else {
                    0.0
                };
            }
        }
        won / pairs
    }

    #[test]
    fn roc_auc_identities() {
        let y = [false, false, true, false, true, true];
        let ranked = [0.1, 0.2, 0.7, 0.3, 0.8, 0.9];
        assert_eq!(roc_auc(&y, &ranked).unwrap(), 1.0);
        let reversed: Vec<f64> = ranked.iter().map(|s| 1.0 - s).collect();
        assert_eq!(roc_auc(&y, &reversed).unwrap(), 0.0);
        assert_eq!(roc_auc(&y, &[0.4; 6]).unwrap(), 0.5);
    }

    #[test]
    fn roc_auc_ties_count_half() {
        // Pairs (p, n): (0.5, 0.5) tie, (0.5, 0.1), (0.9, 0.5), (0.9, 0.1) won → 3.5 / 4.
        let y = [true, false, true, false];
        assert_eq!(roc_auc(&y, &[0.5, 0.5, 0.9, 0.1]).unwrap(), 0.875);
        // −0 and +0 are the same score.
        assert_eq!(roc_auc(&[true, false], &[-0.0, 0.0]).unwrap(), 0.5);
        assert_eq!(roc_auc(&[true, false], &[0.0, -0.0]).unwrap(), 0.5);
    }

    #[test]
    fn roc_auc_matches_pair_count_and_monotone_invariant() {
        let mut rng = Rng::new(7);
        for n in [2, 3, 10, 57, 200] {
            let mut y: Vec<bool> = (0..n).map(|_| rng.uniform() < 0.4).collect();
            y[0] = true;
            y[1] = false;
            // Scores on a grid of 21 values in (0, 1), so that many tie.
            let s: Vec<f64> = (0..n)
                .map(|_| (1.0 + (rng.uniform() * 21.0).floor()) / 23.0)
                .collect();
            let auc = roc_auc(&y, &s).unwrap();
            assert!(close_or_small(auc, auc_by_pairs(&y, &s), 1e-12), "n = {n}");
            for f in [
                |v: f64| 3.0 * v - 7.0,
                |v: f64| v.exp(),
                |v: f64| (v / (1.0 - v)).ln(),
                |v: f64| v.powi(3),
            ] {
                let t: Vec<f64> = s.iter().map(|&v| f(v)).collect();
                assert_eq!(roc_auc(&y, &t).unwrap(), auc, "n = {n}");
            }
        }
    }

    #[test]
    fn roc_auc_errors() {
        let one_class = roc_auc(&[true, true, true], &[0.1, 0.2, 0.3]).unwrap_err();
        assert!(
            one_class.to_string().contains("only one class"),
            "{one_class}"
        );
        let one_class = roc_auc(&[false, false], &[0.1, 0.2]).unwrap_err();
        assert!(
            one_class.to_string().contains("only one class"),
            "{one_class}"
        );
        let lengths = roc_auc(&[true, false], &[0.1]).unwrap_err();
        assert!(
            lengths.to_string().contains("2 labels but 1 scores"),
            "{lengths}"
        );
        let nan = roc_auc(&[true, false], &[0.1, f64::NAN]).unwrap_err();
        assert!(nan.to_string().contains("score 1 is NaN"), "{nan}");
        let inf = roc_auc(&[true, false], &[f64::INFINITY, 0.1]).unwrap_err();
        assert!(inf.to_string().contains("score 0 is inf"), "{inf}");
        assert!(roc_auc(&[], &[])
            .unwrap_err()
            .to_string()
            .contains("no samples"));
    }

    #[test]
    fn medmnist_binary_two_columns_golden() {
        let scores = flat(&[
            [0.8, 0.2],
            [0.3, 0.7],
            [0.5, 0.5],
            [0.5, 0.5],
            [0.1, 0.9],
            [0.3, 0.7],
            [0.6, 0.4],
            [0.9, 0.1],
        ]);
        let labels = [0, 1, 1, 0, 1, 0, 0, 1];
        check_golden("binary-class", &labels, &scores, 2, 0.625, 0.625);
    }

    #[test]
    fn medmnist_binary_one_column_golden() {
        let scores = [0.5, 0.5, 0.2, 0.8, 0.2, 0.65, 0.99];
        let labels = [1, 0, 0, 1, 1, 0, 1];
        check_golden(
            "binary-class",
            &labels,
            &scores,
            1,
            0.5714285714285714,
            0.6666666666666666,
        );
    }

    #[test]
    fn medmnist_multi_class_golden() {
        // Rows 1, 3, 4 and 7 have argmax ties; the lowest index wins (rows 1, 3, 7 wrong).
        let scores = flat(&[
            [0.7, 0.1, 0.1, 0.1],
            [0.4, 0.4, 0.1, 0.1],
            [0.1, 0.2, 0.6, 0.1],
            [0.25, 0.25, 0.25, 0.25],
            [0.3, 0.3, 0.2, 0.2],
            [0.1, 0.6, 0.2, 0.1],
            [0.2, 0.2, 0.2, 0.4],
            [0.1, 0.1, 0.4, 0.4],
            [0.1, 0.7, 0.1, 0.1],
            [0.1, 0.1, 0.7, 0.1],
        ]);
        let labels = [0, 1, 2, 3, 0, 1, 2, 3, 1, 2];
        check_golden("multi-class", &labels, &scores, 4, 0.6, 0.9252232142857143);
    }

    #[test]
    fn medmnist_ordinal_golden() {
        let scores = flat(&[
            [0.6, 0.3, 0.1],
            [0.2, 0.5, 0.3],
            [0.1, 0.3, 0.6],
            [0.3, 0.3, 0.4],
            [0.5, 0.5, 0.0],
            [0.2, 0.3, 0.5],
        ]);
        let labels = [0, 1, 2, 1, 0, 2];
        check_golden(
            "ordinal-regression",
            &labels,
            &scores,
            3,
            0.8333333333333334,
            0.875,
        );
    }

    #[test]
    fn medmnist_multi_label_golden() {
        let scores = flat(&[
            [0.9, 0.2, 0.5],
            [0.4, 0.2, 0.8],
            [0.5, 0.7, 0.3],
            [0.2, 0.5, 0.3],
            [0.6, 0.1, 0.5],
            [0.4, 0.9, 0.7],
        ]);
        let labels = [1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 1];
        check_golden(
            "multi-label, binary-class",
            &labels,
            &scores,
            3,
            0.8333333333333334,
            0.9814814814814815,
        );
    }

    #[test]
    fn medmnist_shape_errors() {
        use MedMnistTask::*;
        let err = |task, labels: &[u32], scores: &[f64], k| {
            medmnist_metrics(task, labels, scores, k)
                .unwrap_err()
                .to_string()
        };
        let s3 = [0.2, 0.3, 0.5, 0.6, 0.3, 0.1];
        let e = err(Binary, &[0, 1], &s3, 3);
        assert!(
            e.contains("binary-class task: scores have 3 columns"),
            "{e}"
        );
        let e = err(MultiClass, &[0, 3], &s3, 3);
        assert!(
            e.contains("label of sample 1 is 3, but scores have only 3 classes"),
            "{e}"
        );
        let e = err(MultiClass, &[0, 1], &[0.4, 0.6], 1);
        assert!(e.contains("expected one column per class"), "{e}");
        let e = err(Binary, &[0, 2], &[0.4, 0.6], 1);
        assert!(e.contains("label at row 1, column 0 is 2"), "{e}");
        let e = err(MultiLabel, &[0, 1, 1, 0, 2, 0], &s3, 3);
        assert!(e.contains("label at row 1, column 1 is 2"), "{e}");
        // Multi-label labels must be n × k, single-label ones n × 1.
        let e = err(MultiLabel, &[0, 1], &s3, 3);
        assert!(
            e.contains("2 labels for 2 samples") && e.contains("(6 labels)"),
            "{e}"
        );
        let e = err(Ordinal, &[0, 1, 2, 0, 1, 2], &s3, 3);
        assert!(e.contains("6 labels for 2 samples"), "{e}");
        let e = err(MultiClass, &[0, 1], &s3[..5], 3);
        assert!(e.contains("5 scores do not form rows of 3 columns"), "{e}");
        let e = err(MultiClass, &[], &[], 3);
        assert!(e.contains("no samples"), "{e}");
        let e = err(MultiClass, &[0, 1], &[0.5, f64::NAN, 0.5, 0.5], 2);
        assert!(e.contains("score at row 0, column 1 is NaN"), "{e}");
        // Every AUC term needs both classes: class 2 absent, a constant label column.
        let e = err(MultiClass, &[0, 1], &s3, 3);
        assert!(
            e.contains("class 2 (one-vs-rest): roc_auc: only one class"),
            "{e}"
        );
        let e = err(MultiLabel, &[1, 0, 1, 1, 0, 0], &s3, 3);
        assert!(e.contains("label 0: roc_auc: only one class"), "{e}");
        let e = err(Binary, &[1, 1], &[0.4, 0.6], 1);
        assert!(e.contains("only one class"), "{e}");
        // ACC stays defined there, and equals medmnist_metrics' wherever both are.
        assert!(medmnist_metrics(MultiClass, &[2, 1], &s3, 3).is_err());
        assert_eq!(medmnist_acc(MultiClass, &[2, 1], &s3, 3).unwrap(), 0.5);
        assert_eq!(medmnist_acc(Binary, &[1, 1], &[0.4, 0.6], 1).unwrap(), 0.5);
        let s3_full = [&s3[..], &[0.1, 0.8, 0.1]].concat();
        let full = medmnist_metrics(MultiClass, &[2, 1, 0], &s3_full, 3).unwrap();
        assert_eq!(
            medmnist_acc(MultiClass, &[2, 1, 0], &s3_full, 3).unwrap(),
            full.acc
        );
        // The shape rules still hold.
        assert!(medmnist_acc(MultiClass, &[0, 1], &s3[..5], 3).is_err());
    }
}
