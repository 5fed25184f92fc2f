"""Objectives' losses and their gradients on embeddings of your own, as NumPy arrays.

The loss is the objective's own Rust code, the one training runs (forward and backward on the
CPU, in float32): use it to check a PyTorch or JAX port against, or to study a loss on
synthetic embeddings. Only objectives whose loss is a function of the views' embeddings alone
are here (`names()`); those that need networks of their own (a predictor, a teacher, a decoder:
BYOL, MAE, …) train only inside `candle_ssl.train`.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np
import numpy.typing as npt

from . import _arrays, _native

__all__ = ["loss", "names"]


def loss(name: str, z: npt.ArrayLike, **params: Any) -> Tuple[float, npt.NDArray[np.float32]]:
    """The loss of objective `name` on the embeddings `z` and its gradient with respect to `z`.

    `z`: `[V, B, D]`, V views of the same B instances in the same order, D dimensions (any real
    dtype; computed in float32). `params`: the objective's parameters, as `objective.params.*`
    in a run's configuration (`candle_ssl.describe(name)` lists them with their defaults); a
    parameter named like a Python keyword goes through a dict, `**{"lambda": 25.0}`.

    Returns `(value, gradient)`: the scalar loss and `∂loss/∂z`, a float32 array of `z`'s shape.
    Raises `ValueError` for an unknown objective (naming the nearest one), one that needs
    networks, an unknown parameter, or views or a batch size it cannot take.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    a = _arrays.float32(z, "z", 3, "[V, B, D] (views, instances, dimensions)")
    value, grad = _native.loss(
        name,
        a,
        {key: _arrays.plain(v) for key, v in params.items()},
    )
    return float(value), grad


def names() -> List[str]:
    """The objectives `loss` can compute, sorted: those whose loss depends on the embeddings
    alone."""
    return list(_native.loss_objectives())
