"""`candle_ssl.eval` on the known-answer tests of docs/spec/metrics.md, the arguments it takes,
and the errors it raises."""

from __future__ import annotations

import math

import numpy as np
import pytest

import candle_ssl as cs
from candle_ssl import eval as ev

#: The KATs were computed in float64; inputs pass through float32 here.
REL = 1e-6


def _normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# --- Known answers (spec §N) ---------------------------------------------------------------


def test_linear_probe_kat() -> None:
    """Spec §1: three classes, C = 1."""
    train_x = [[0, 1, 2], [1, 0, 1], [2, 2, 0], [0, 2, 1], [3, 1, 1], [1, 3, 0], [2, 0, 2],
               [0, 0, 3], [3, 3, 1]]
    train_y = [0, 0, 1, 2, 1, 2, 0, 0, 1]
    test_x = [[1, 1, 1], [2, 3, 0], [0, 1, 3], [3, 2, 0]]
    test_y = [0, 2, 0, 1]
    result = ev.linear_probe(train_x, train_y, test_x, test_y, c=1.0)
    assert result["balanced_accuracy"] == pytest.approx(0.6666666667, rel=REL)
    assert result["accuracy"] == pytest.approx(0.75)
    assert result["c"] == 1.0
    assert set(result) >= {"balanced_accuracy", "accuracy", "c"}


def test_linear_probe_chooses_c_when_not_given() -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((3, 8)) * 4
    y = np.repeat(np.arange(3), 30)
    x = centres[y] + rng.standard_normal((90, 8))
    result = ev.linear_probe(x[::2], y[::2], x[1::2], y[1::2])
    assert result["c"] in (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
    assert result["balanced_accuracy"] > 0.9


def test_knn_kat() -> None:
    """Spec §3: predictions [0, 1] at every k, at T = 0.5 and at T = 0.07."""
    train_x = [[1, 0], [0.8, 0.6], [0, 1], [-1, 0], [0.6, -0.8]]
    train_y = [0, 0, 1, 1, 2]
    test_x = [[1, 0.2], [-0.2, 1]]
    test_y = [0, 1]
    for k in (1, 2, 3):
        for t in (0.5, 0.07):
            assert ev.knn(train_x, train_y, test_x, test_y, k=k, temperature=t) == 1.0
    assert ev.knn(train_x, train_y, test_x, [1, 0], k=1) == 0.0


def test_rankme_kat() -> None:
    """Spec §4."""
    z = [[1, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 1]]
    assert ev.rankme(z) == pytest.approx(2.8140041245, rel=REL)
    assert ev.rankme(z, eps=0.0) == pytest.approx(2.8140039836, rel=REL)
    collapsed = [[1, 1, 1], [2, 2, 2], [3, 3, 3]]
    assert ev.rankme(collapsed, eps=0.0) == pytest.approx(1.0, rel=1e-6)


def test_effective_rank_kat() -> None:
    """Spec §5."""
    z = [[1, 0, 0], [0, 2, 0], [0, 0, 3], [1, 1, 1]]
    assert ev.effective_rank(z) == pytest.approx(2.6007928129, rel=REL)


def test_lidar_kat() -> None:
    """Spec §6: n = 3 samples, q = 3 views, d = 2; views as a list or a [V, N, D] array."""
    samples = [
        [[1, 0], [1.2, 0.1], [0.8, -0.1]],
        [[0, 1], [0.1, 1.3], [-0.1, 0.9]],
        [[-1, -1], [-0.9, -1.2], [-1.1, -0.8]],
    ]
    views = np.asarray(samples, dtype=np.float64).transpose(1, 0, 2)  # [V, N, D]
    assert ev.lidar(views) == pytest.approx(1.9017427702, rel=REL)
    assert ev.lidar(list(views)) == pytest.approx(1.9017427702, rel=REL)
    assert ev.lidar([v.tolist() for v in views]) == pytest.approx(1.9017427702, rel=REL)


def test_alignment_uniformity_kat() -> None:
    """Spec §7."""
    a = _normalize([[1, 0], [0, 1], [-1, 0]])
    b = _normalize([[1, 1], [0, 1], [-1, -1]])
    alignment, uniformity = ev.alignment_uniformity(a, b)
    assert alignment == pytest.approx(0.3905242918, rel=REL)
    assert uniformity == pytest.approx(-4.3963489672, rel=REL)
    # Rows are normalised inside: scaling a view changes nothing.
    assert ev.alignment_uniformity(3 * a, b) == pytest.approx((alignment, uniformity), rel=REL)


def test_cka_kat() -> None:
    """Spec §8."""
    x = np.array([[1, 0], [2, 1], [0, 3], [1, 1]], dtype=np.float64)
    y = [[1, 2, 0], [0, 1, 1], [3, 0, 1], [1, 1, 1]]
    assert ev.cka(x, y) == pytest.approx(0.9649927916, rel=REL)
    rotation = np.array([[0, 1], [-1, 0]])
    assert ev.cka(x, 3 * x @ rotation + 1) == pytest.approx(1.0, rel=1e-6)


def test_kmeans_scores_of_separated_clusters() -> None:
    rng = np.random.default_rng(0)
    centres = np.eye(4, 16) * 10
    labels = np.repeat(np.arange(4), 25)
    z = centres[labels] + 0.1 * rng.standard_normal((100, 16))
    scores = ev.kmeans_scores(z, labels)
    for key in ("nmi", "ami", "ari"):
        assert scores[key] == pytest.approx(1.0), key
    again = ev.kmeans_scores(z, labels, k=4, seed=0)
    assert again == scores


def test_medmnist_multi_class() -> None:
    scores = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    labels = np.array([0, 1, 2, 1])
    result = ev.medmnist_metrics("multi-class", labels, scores)
    assert result["acc"] == pytest.approx(0.75)
    # One-vs-rest AUCs: class 0 1.0; class 1 3.5/4 (positives 0.8, 0.3 against negatives
    # 0.2, 0.3: one tie counts half); class 2 1.0; their mean.
    assert result["auc"] == pytest.approx((1.0 + 0.875 + 1.0) / 3)
    # MedMNIST's [N, 1] label column is read as [N].
    assert ev.medmnist_metrics("multi-class", labels[:, None], scores) == result
    assert ev.medmnist_metrics("ordinal-regression", labels, scores) == result


def test_medmnist_binary_and_multi_label() -> None:
    p = np.array([0.9, 0.2, 0.6, 0.4])
    labels = np.array([1, 0, 0, 1])
    binary = ev.medmnist_metrics("binary-class", labels, np.stack([1 - p, p], axis=1))
    assert binary["acc"] == pytest.approx(0.5)
    assert binary["auc"] == pytest.approx(0.75)
    assert ev.medmnist_metrics("binary-class", labels, p) == binary  # [N] is one column
    multi = ev.medmnist_metrics(
        "multi-label, binary-class",
        np.array([[1, 0], [0, 1], [0, 0], [1, 1]]),
        np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.3], [0.4, 0.7]]),
    )
    assert multi["acc"] == pytest.approx((0.5 + 1.0) / 2)
    assert multi["auc"] == pytest.approx((0.75 + 1.0) / 2)


# --- Arguments -------------------------------------------------------------------------------


def test_any_real_dtype_and_layout_is_taken() -> None:
    rng = np.random.default_rng(0)
    z = rng.standard_normal((40, 10))
    value = ev.rankme(z.astype(np.float32))
    assert ev.rankme(z) == pytest.approx(value, rel=1e-12)  # float64 → float32
    fortran = np.asfortranarray(z.astype(np.float32))
    assert ev.rankme(fortran) == value
    assert ev.rankme(z.T.copy().T) == pytest.approx(value, rel=1e-12)
    assert ev.rankme(z.tolist()) == pytest.approx(value, rel=1e-12)
    labels = np.repeat(np.arange(4), 10)
    for dtype in (np.int8, np.uint16, np.int32, np.int64):
        assert ev.knn(z, labels.astype(dtype), z, labels.astype(dtype), k=1) == 1.0
    assert ev.knn(z, labels.astype(np.float64), z, labels, k=1) == 1.0
    assert ev.knn(z, labels[:, None], z, labels, k=1) == 1.0  # an [N, 1] column


def test_results_are_plain_python_values() -> None:
    z = np.random.default_rng(0).standard_normal((30, 5))
    y = np.arange(30) % 3
    assert type(ev.rankme(z)) is float
    assert type(ev.effective_rank(z)) is float
    assert type(ev.cka(z, z)) is float
    assert type(ev.knn(z, y, z, y)) is float
    pair = ev.alignment_uniformity(z, z)
    assert type(pair) is tuple and all(type(v) is float for v in pair)
    assert pair[0] == pytest.approx(0.0, abs=1e-12)
    probe = ev.linear_probe(z, y, z, y, c=1.0)
    assert type(probe) is dict and all(type(v) is float for v in probe.values())


def test_wrong_shapes_and_values_are_value_errors() -> None:
    z = np.zeros((10, 4), np.float32)
    with pytest.raises(ValueError, match="2-D"):
        ev.rankme(np.zeros(10))
    with pytest.raises(ValueError, match="2-D"):
        ev.rankme(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="labels"):
        ev.knn(z, np.full(10, 0.5), z, np.zeros(10, int))
    with pytest.raises(ValueError):
        ev.knn(z, np.zeros(9, int), z, np.zeros(10, int))  # 9 labels for 10 samples
    with pytest.raises(ValueError):
        ev.knn(z, np.full(10, -1), z, np.zeros(10, int))  # not a class number
    with pytest.raises(ValueError):
        ev.rankme(np.full((3, 3), np.nan))
    with pytest.raises(ValueError):
        ev.cka(np.ones((5, 2)), np.random.default_rng(0).standard_normal((5, 2)))  # constant x
    with pytest.raises(ValueError, match="views"):
        ev.lidar(np.zeros((4, 5)))
    with pytest.raises(ValueError):
        ev.medmnist_metrics("multi-class-please", np.zeros(4, int), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="numbers"):
        ev.rankme(np.array([["a", "b"], ["c", "d"]]))


def test_features_of_a_trained_encoder_evaluate() -> None:
    """The module is importable as `cs.eval` and works on any features, e.g. random ones."""
    z = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    assert 1.0 <= cs.eval.rankme(z) <= 16.0
    assert 1.0 <= cs.eval.effective_rank(z) <= 16.0
    assert math.isfinite(cs.eval.lidar([z, z + 0.01]))
