"""`candle_ssl.eval` against values the Rust side computed (`goldens/eval.json`, written by a
Rust test from the same `ssl-eval` functions): they must agree to 1e-9 relative.

The file's schema (JSON):

* inputs: `train_x`, `test_x`, `z`, `a`, `b`, `x`, `y` (matrices as lists of rows),
  `train_y`, `test_y` (class numbers), `views` (a list of V matrices of the same shape),
  `scores` (an `[N, K]` matrix) and `medmnist_labels` (`[N]`, or `[N, K]` for a multi-label
  task); optionally `z_labels` (class numbers of the rows of `z`);
* `args`: the arguments the values were computed with, each optional (the Python defaults
  otherwise), either flat or under the metric's name: `{"knn": {"k": 20, "temperature": 0.07},
  "linear_probe": {"c": 1.0}, "rankme": {"eps": 1e-7}, "lidar": {"delta": 1e-4, "eps": 1e-8},
  "alignment_uniformity": {"alpha": 2.0, "t": 2.0}, "kmeans_scores": {"k": null, "seed": 0},
  "medmnist_metrics": {"task": "multi-class"}}`; flat keys are `knn_k`, `temperature`, `c`,
  `rankme_eps`, `delta`, `lidar_eps`, `alpha`, `t`, `kmeans_k`, `seed`, `task`;
* `results`: `linear_probe` (a dict), `knn`, `rankme`, `lidar`, `effective_rank`, `cka` (floats),
  `alignment_uniformity` (`[alignment, uniformity]`), `kmeans_scores` and `medmnist_metrics`
  (dicts). Dict results are compared key by key on the keys the golden file holds.

Metric by metric, the inputs are: `linear_probe` and `knn` on (`train_x`, `train_y`, `test_x`,
`test_y`); `rankme` and `effective_rank` on `z`; `lidar` on `views`;
`alignment_uniformity` on (`a`, `b`); `cka` on (`x`, `y`); `kmeans_scores` on (`z`,
`z_labels`) when the file has `z_labels`, else on (`train_x`, `train_y`); `medmnist_metrics` on
(`medmnist_labels`, `scores`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Mapping

import numpy as np
import pytest

from candle_ssl import eval as ev

GOLDEN = Path(__file__).parent / "goldens" / "eval.json"
REL = 1e-9
ABS = 1e-12

_MISSING = object()


@pytest.fixture(scope="module")
def golden() -> Dict[str, Any]:
    if not GOLDEN.is_file():
        pytest.skip(
            f"{GOLDEN} is missing: the Rust test that writes the eval goldens has not been run "
            "(or its file not committed)"
        )
    with open(GOLDEN, encoding="utf-8") as f:
        data: Dict[str, Any] = json.load(f)
    return data


def _arg(golden: Mapping[str, Any], metric: str, name: str, flat: str, default: Any) -> Any:
    args: Mapping[str, Any] = golden.get("args", {})
    nested = args.get(metric)
    if isinstance(nested, Mapping) and name in nested:
        return nested[name]
    value = args.get(flat, _MISSING)
    return default if value is _MISSING else value


def _close(got: Any, want: Any, what: str) -> None:
    if isinstance(want, Mapping):
        assert isinstance(got, Mapping), what
        for key, value in want.items():
            assert key in got, f"{what}: no {key!r} in {sorted(got)}"
            _close(got[key], value, f"{what}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{what}[{i}]")
    elif want is None:
        assert got is None, what
    else:
        assert math.isclose(float(got), float(want), rel_tol=REL, abs_tol=ABS), (
            f"{what}: Python {got!r}, Rust {want!r}"
        )


def _matrix(golden: Mapping[str, Any], key: str) -> np.ndarray:
    return np.asarray(golden[key], dtype=np.float32)


def test_linear_probe(golden: Dict[str, Any]) -> None:
    got = ev.linear_probe(
        _matrix(golden, "train_x"), golden["train_y"], _matrix(golden, "test_x"),
        golden["test_y"], c=_arg(golden, "linear_probe", "c", "c", None),
    )
    _close(got, golden["results"]["linear_probe"], "linear_probe")


def test_knn(golden: Dict[str, Any]) -> None:
    got = ev.knn(
        _matrix(golden, "train_x"), golden["train_y"], _matrix(golden, "test_x"),
        golden["test_y"],
        k=_arg(golden, "knn", "k", "knn_k", 20),
        temperature=_arg(golden, "knn", "temperature", "temperature", 0.07),
    )
    _close(got, golden["results"]["knn"], "knn")


def test_rankme(golden: Dict[str, Any]) -> None:
    got = ev.rankme(_matrix(golden, "z"), eps=_arg(golden, "rankme", "eps", "rankme_eps", 1e-7))
    _close(got, golden["results"]["rankme"], "rankme")


def test_effective_rank(golden: Dict[str, Any]) -> None:
    _close(ev.effective_rank(_matrix(golden, "z")), golden["results"]["effective_rank"],
           "effective_rank")


def test_lidar(golden: Dict[str, Any]) -> None:
    views = [np.asarray(v, dtype=np.float32) for v in golden["views"]]
    got = ev.lidar(
        views,
        delta=_arg(golden, "lidar", "delta", "delta", 1e-4),
        eps=_arg(golden, "lidar", "eps", "lidar_eps", 1e-8),
    )
    _close(got, golden["results"]["lidar"], "lidar")


def test_alignment_uniformity(golden: Dict[str, Any]) -> None:
    got = ev.alignment_uniformity(
        _matrix(golden, "a"), _matrix(golden, "b"),
        alpha=_arg(golden, "alignment_uniformity", "alpha", "alpha", 2.0),
        t=_arg(golden, "alignment_uniformity", "t", "t", 2.0),
    )
    _close(list(got), golden["results"]["alignment_uniformity"], "alignment_uniformity")


def test_cka(golden: Dict[str, Any]) -> None:
    _close(ev.cka(_matrix(golden, "x"), _matrix(golden, "y")), golden["results"]["cka"], "cka")


def test_kmeans_scores(golden: Dict[str, Any]) -> None:
    if "z_labels" in golden:
        z, labels = _matrix(golden, "z"), golden["z_labels"]
    else:
        z, labels = _matrix(golden, "train_x"), golden["train_y"]
    got = ev.kmeans_scores(
        z, labels,
        k=_arg(golden, "kmeans_scores", "k", "kmeans_k", None),
        seed=_arg(golden, "kmeans_scores", "seed", "seed", 0),
    )
    _close(got, golden["results"]["kmeans_scores"], "kmeans_scores")


def test_medmnist_metrics(golden: Dict[str, Any]) -> None:
    got = ev.medmnist_metrics(
        _arg(golden, "medmnist_metrics", "task", "task", "multi-class"),
        golden["medmnist_labels"],
        np.asarray(golden["scores"], dtype=np.float64),
    )
    _close(got, golden["results"]["medmnist_metrics"], "medmnist_metrics")
