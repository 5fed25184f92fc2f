"""Pretrain on images held in a NumPy array, then embed new ones with the trained encoder.

The images are synthetic stand-ins for your own: 16×16 one-channel strokes in four classes (a
horizontal bar, a vertical bar, a diagonal, a ring), drawn at random offsets with noise, as
uint8. A tenth of them are unlabelled: they join the pretraining only, which needs the online
probe off (`train.probe_lr=0`). The labelled ones are split into train and a held-out 20 % for
the result table.

    python examples/python/train_on_numpy.py [--epochs 10]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

import candle_ssl as cs

SIDE = 16
CLASSES = ("horizontal", "vertical", "diagonal", "ring")


def stroke(kind: int, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """One image of class `kind`, values in [0, 1]."""
    image = np.zeros((SIDE, SIDE), dtype=np.float32)
    dy, dx = rng.integers(-3, 4, size=2)
    ys, xs = np.mgrid[0:SIDE, 0:SIDE]
    cy, cx = SIDE / 2 + dy, SIDE / 2 + dx
    if kind == 0:
        image[np.abs(ys - cy) < 1.5] = 1.0
    elif kind == 1:
        image[np.abs(xs - cx) < 1.5] = 1.0
    elif kind == 2:
        image[np.abs((ys - cy) - (xs - cx)) < 1.5] = 1.0
    else:
        radius = np.hypot(ys - cy, xs - cx)
        image[np.abs(radius - 4.5) < 1.2] = 1.0
    image += rng.normal(0.0, 0.5, size=image.shape).astype(np.float32)
    return np.clip(image, 0.0, 1.0)


def dataset(n: int, seed: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """`n` images `[n, 1, 16, 16]` (uint8) and their classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(CLASSES), size=n).astype(np.int64)
    images = np.stack([stroke(int(k), rng) for k in labels])[:, None]
    return (images * 255).round().astype(np.uint8), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: temporary)")
    args = parser.parse_args()

    images, labels = dataset(1200, seed=0)
    labels_given = labels.copy()
    labels_given[::10] = -1  # unlabelled: pretraining only

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out if args.out is not None else Path(tmp) / "strokes"
        steps: list[float] = []

        def on_step(event: cs.StepEvent) -> None:
            steps.append(event.loss)

        def on_epoch(event: cs.EpochEvent) -> None:
            knn = "-" if event.knn_accuracy is None else f"{100 * event.knn_accuracy:.1f} %"
            print(f"epoch {event.epoch + 1}: {event.steps} steps, loss {steps[-1]:.3f}, k-NN {knn}")

        run = cs.train(
            objective="vicreg",
            data=images,
            labels=labels_given,
            epochs=args.epochs,
            out=out,
            batch_size=64,
            progress=False,
            on_step=on_step,
            on_epoch=on_epoch,
            train__probe_lr=0,  # or **{"train.probe_lr": 0}
        )
        print(run.table)

        # New images through the trained encoder, then a probe on their features.
        encoder = cs.load(run.dir)
        new_images, new_labels = dataset(400, seed=1)
        features = encoder.embed(new_images)
        print(f"features: {features.shape[0]} × {features.shape[1]} ({features.dtype})")
        half = len(features) // 2
        probe = cs.eval.linear_probe(
            features[:half], new_labels[:half], features[half:], new_labels[half:], c=1.0
        )
        accuracy = 100 * probe["balanced_accuracy"]
        print(f"linear probe on new images: {accuracy:.1f} % balanced accuracy")


if __name__ == "__main__":
    main()
