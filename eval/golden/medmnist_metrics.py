"""Golden values for `ssl_eval::medmnist` (the Rust tests in `eval/src/medmnist.rs`).

Computes ACC and AUC with the formulas of the official `medmnist` package's `evaluator.py`
(`getACC` / `getAUC`, MedMNIST v2/v3; Yang et al., Scientific Data 2023) on small fixed inputs,
one case per task type, with scikit-learn's `roc_auc_score` / `accuracy_score`. The inputs cover
tied scores, scores exactly at the 0.5 threshold and argmax ties (numpy picks the lowest index).

Labels are shaped as in the MedMNIST `.npz` files: `n × 1` for single-label tasks, `n × L` (0/1)
for multi-label; scores are `n × K` probabilities. Regenerate with

    python3 eval/golden/medmnist_metrics.py > eval/golden/medmnist_metrics.json

and copy the printed `acc` / `auc` into the tests' literals.
"""
import json

import numpy as np
import sklearn
from sklearn.metrics import accuracy_score, roc_auc_score


def get_auc(y_true, y_score, task):
    y_true = y_true.squeeze()
    y_score = y_score.squeeze()
    if task == "multi-label, binary-class":
        return sum(roc_auc_score(y_true[:, i], y_score[:, i]) for i in range(y_score.shape[1])) / y_score.shape[1]
    if task == "binary-class":
        if y_score.ndim == 2:
            y_score = y_score[:, -1]
        return roc_auc_score(y_true, y_score)
    # multi-class and ordinal-regression: one-vs-rest, averaged over all score columns
    return sum(
        roc_auc_score((y_true == i).astype(float), y_score[:, i]) for i in range(y_score.shape[1])
    ) / y_score.shape[1]


def get_acc(y_true, y_score, task, threshold=0.5):
    y_true = y_true.squeeze()
    y_score = y_score.squeeze()
    if task == "multi-label, binary-class":
        y_pre = y_score > threshold
        return sum(accuracy_score(y_true[:, l], y_pre[:, l]) for l in range(y_true.shape[1])) / y_true.shape[1]
    if task == "binary-class":
        if y_score.ndim == 2:
            y_score = y_score[:, -1]
        return accuracy_score(y_true, y_score > threshold)
    return accuracy_score(y_true, np.argmax(y_score, axis=-1))


CASES = {
    # Last column has ties (0.7: one positive, one negative; 0.5: one of each) and 0.5 itself.
    "binary_two_columns": (
        "binary-class",
        [[0], [1], [1], [0], [1], [0], [0], [1]],
        [[0.8, 0.2], [0.3, 0.7], [0.5, 0.5], [0.5, 0.5], [0.1, 0.9], [0.3, 0.7], [0.6, 0.4], [0.9, 0.1]],
    ),
    "binary_one_column": (
        "binary-class",
        [[1], [0], [0], [1], [1], [0], [1]],
        [[0.5], [0.5], [0.2], [0.8], [0.2], [0.65], [0.99]],
    ),
    # Rows 1, 3, 4 and 7 have argmax ties (lowest index wins).
    "multi_class_four": (
        "multi-class",
        [[0], [1], [2], [3], [0], [1], [2], [3], [1], [2]],
        [
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
        ],
    ),
    "ordinal_three": (
        "ordinal-regression",
        [[0], [1], [2], [1], [0], [2]],
        [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.3, 0.3, 0.4], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
    ),
    "multi_label_three": (
        "multi-label, binary-class",
        [[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 0, 0], [0, 1, 1]],
        [[0.9, 0.2, 0.5], [0.4, 0.2, 0.8], [0.5, 0.7, 0.3], [0.2, 0.5, 0.3], [0.6, 0.1, 0.5], [0.4, 0.9, 0.7]],
    ),
}

out = {"sklearn": sklearn.__version__, "numpy": np.__version__, "cases": {}}
for name, (task, labels, scores) in CASES.items():
    y_true = np.array(labels, dtype=np.int64)
    y_score = np.array(scores, dtype=np.float64)
    out["cases"][name] = {
        "task": task,
        "labels": y_true.tolist(),
        "scores": y_score.tolist(),
        "acc": float(get_acc(y_true, y_score, task)),
        "auc": float(get_auc(y_true, y_score, task)),
    }
print(json.dumps(out, indent=1))
