"""The evaluation metrics on features from anywhere: here a synthetic embedding of 10 classes
(a Gaussian mixture) and a second, noisier view of it, as another model's features would be.

    python examples/python/eval_other_features.py
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import candle_ssl as cs


def mixture(
    n: int, d: int, classes: int, rng: np.random.Generator
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """`n` points in `d` dimensions around `classes` random centres, and their classes."""
    centres = rng.normal(0.0, 0.4, size=(classes, d))
    labels = rng.integers(0, classes, size=n).astype(np.int64)
    points = centres[labels] + rng.normal(0.0, 1.0, size=(n, d))
    return points.astype(np.float32), labels


def main() -> None:
    rng = np.random.default_rng(0)
    z, y = mixture(2000, 64, 10, rng)
    view = z + rng.normal(0.0, 0.3, size=z.shape).astype(np.float32)  # an augmented view
    train, test = slice(0, 1500), slice(1500, None)

    probe = cs.eval.linear_probe(z[train], y[train], z[test], y[test])
    print(f"linear probe: {100 * probe['balanced_accuracy']:.1f} % balanced (C = {probe['c']:g})")
    knn = cs.eval.knn(z[train], y[train], z[test], y[test], k=20, temperature=0.07)
    print(f"20-NN: {100 * knn:.1f} %")
    print(f"RankMe: {cs.eval.rankme(z):.2f} of {z.shape[1]} dimensions")
    print(f"effective rank: {cs.eval.effective_rank(z):.2f}")

    third = z[:500] + rng.normal(0.0, 0.3, size=(500, 64)).astype(np.float32)
    views = np.stack([z[:500], view[:500], third])
    print(f"LiDAR (3 views of 500 samples): {cs.eval.lidar(views):.2f}")
    alignment, uniformity = cs.eval.alignment_uniformity(z, view)
    print(f"alignment {alignment:.4f}, uniformity {uniformity:.4f}")
    print(f"linear CKA between the two views: {cs.eval.cka(z, view):.4f}")

    clusters = cs.eval.kmeans_scores(z, y, seed=0)
    print("k-means: " + ", ".join(f"{key} {value:.3f}" for key, value in clusters.items()))

    # MedMNIST's official ACC / AUC of a probe's probabilities (here: softmax of distances).
    centres = np.stack([z[train][y[train] == k].mean(axis=0) for k in range(10)])
    logits = -((z[test][:, None, :] - centres[None]) ** 2).sum(axis=2) / 64.0
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    official = cs.eval.medmnist_metrics("multi-class", y[test], probabilities)
    print(f"MedMNIST metrics: ACC {official['acc']:.3f}, AUC {official['auc']:.3f}")


if __name__ == "__main__":
    main()
