"""candle-ssl from Python: self-supervised pretraining of image encoders on Candle.

    import candle_ssl as cs

    run = cs.train(objective="vicreg", data="digits")
    print(run.table)
    features = cs.load(run.dir).embed(images)

* `train` trains as `ssl run` does (any objective, encoder, data set, NumPy images of your own)
  and returns a `Run`; `load` gives a trained `Encoder` to embed NumPy arrays with;
* `candle_ssl.eval`: the evaluation metrics (linear probe, k-NN, RankMe, LiDAR, CKA, …) on
  features from anywhere;
* `candle_ssl.losses`: objectives' losses and their gradients on embeddings of your own;
* `objectives()`, `encoders()`, `describe(name)`: what there is.

The work runs in Rust with the GIL released. Documentation: docs/python.md in the repository.
"""

from __future__ import annotations

from typing import List

from . import _native, eval, losses
from ._encoder import Encoder, load
from ._native import EpochEvent, StepEvent
from ._run import Run, train

__version__: str = _native.__version__

__all__ = [
    "Encoder",
    "EpochEvent",
    "Run",
    "StepEvent",
    "__version__",
    "describe",
    "encoders",
    "eval",
    "load",
    "losses",
    "objectives",
    "train",
]


def objectives() -> List[str]:
    """The registered objectives' names, sorted (`ssl list`); `describe(name)` tells more."""
    return list(_native.objectives())


def encoders() -> List[str]:
    """The encoders' names (`model.encoder`): the built-in ones, then any registered from
    Rust."""
    return list(_native.encoders())


def describe(name: str) -> str:
    """An objective's description, as `ssl describe NAME` gives it: its summary, paper,
    aliases, and its keys (`objective.params.KEY`) with their defaults. `name` may be an alias.
    Raises `ValueError` for an unknown name, suggesting the closest known one."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    return str(_native.describe(name))
