"""The extension module under `candle_ssl` (Rust, PyO3): what the package's Python files call.

Its functions take arrays exactly as the Python layer prepares them (C-contiguous float32
`[N, D]` features, int64 labels, uint8 or float32 samples) and release the GIL while they
compute. Errors: `ValueError` for a refused argument or configuration, `FileNotFoundError` for
a missing file, `RuntimeError` for a failure while working; the message is the Rust one. Use
the public API (`candle_ssl`, `candle_ssl.eval`, `candle_ssl.losses`) rather than this module.
"""

from collections.abc import Callable
from typing import Any, final

import numpy as np
import numpy.typing as npt

__version__: str
"""The crate's version."""

@final
class StepEvent:
    """One optimiser step, as an `on_step` callback receives it."""

    @property
    def step(self) -> int:
        """The step, counted from 0 over the whole run (a resumed run goes on counting)."""
    @property
    def epoch(self) -> int:
        """The epoch the step belongs to, counted from 0."""
    @property
    def loss(self) -> float:
        """The step's loss (averaged over the ranks of a data-parallel run)."""
    @property
    def terms(self) -> dict[str, float]:
        """The objective's named loss terms (VICReg: `invariance`, `variance`, `covariance`)."""
    @property
    def lr(self) -> float:
        """The learning rate the step used."""
    @property
    def probe_ce(self) -> float | None:
        """The online probe's cross-entropy, or None without a probe."""
    @property
    def images_per_s(self) -> float:
        """Throughput over the logging interval the step belongs to (`train.log_every`)."""
    @property
    def data_wait_ms(self) -> float:
        """Milliseconds the step waited for its views."""

@final
class EpochEvent:
    """The end of an epoch, as an `on_epoch` callback receives it."""

    @property
    def epoch(self) -> int:
        """The epoch that ended, counted from 0."""
    @property
    def steps(self) -> int:
        """Optimiser steps taken so far."""
    @property
    def knn_accuracy(self) -> float | None:
        """The monitor's weighted k-NN accuracy on the test split, in [0, 1], where it ran this
        epoch (every `eval.monitor_every` epochs and after the last); `None` otherwise."""
    @property
    def probe_accuracy(self) -> float | None:
        """The online linear probe's test accuracy, in [0, 1], where the monitor ran and the run
        has a probe (`train.probe_lr` > 0); `None` otherwise."""

@final
class Encoder:
    """A trained encoder, read from a run directory, its checkpoint or the Hub."""

    @staticmethod
    def load(source: str) -> Encoder:
        """The encoder of `source`: a run directory (its last checkpoint), its `checkpoint/`
        directory, a directory holding `config.yaml` and an exported `model.safetensors`, or
        `hf://user/repo[@revision]` (downloaded into the Hugging Face cache first)."""
    @property
    def dir(self) -> str:
        """The directory the weights are read from (the run, or the pulled repository)."""
    def embed(
        self,
        x: npt.NDArray[np.uint8] | npt.NDArray[np.float32],
        batch_size: int = 256,
    ) -> npt.NDArray[np.float32]:
        """Features `[N, F]` of the samples `x`, in evaluation mode, `batch_size` at a time."""
    def export(self, path: str) -> str:
        """Writes the encoder's weights, PyTorch state-dict keys, as safetensors to `path`;
        returns the path."""

def train(
    settings: list[tuple[str, object]],
    data: str | None,
    images: npt.NDArray[np.uint8] | npt.NDArray[np.float32] | None,
    labels: npt.NDArray[np.int64] | None,
    resume: bool,
    overwrite: bool,
    on_step: Callable[[StepEvent], object] | None,
    on_epoch: Callable[[EpochEvent], object] | None,
    progress: bool,
) -> tuple[str, str]:
    """Trains as `ssl run` does: `settings` are `(dotted key, value)` assignments in order
    (`--set`), `data` the `--data` argument (a data set's name or a `.npz` path), or `images`
    with `labels` (-1: unlabelled) in its place. Returns the run directory and the result
    table."""

def objectives() -> list[str]:
    """Every linked objective's name, sorted."""

def encoders() -> list[str]:
    """The built-in encoders, then the registered ones."""

def describe(name: str) -> str:
    """An objective's summary, paper, aliases and keys with their defaults."""

def loss(
    name: str,
    z: npt.NDArray[np.float32],
    params: dict[str, Any] | None = None,
) -> tuple[float, npt.NDArray[np.float32]]:
    """The loss of objective `name` on `z` `[V, B, D]` and its gradient with respect to `z`."""

def loss_objectives() -> list[str]:
    """The objectives `loss` takes: those with no network or parameters of their own."""

def eval_linear_probe(
    train_x: npt.NDArray[np.float32],
    train_y: npt.NDArray[np.int64],
    test_x: npt.NDArray[np.float32],
    test_y: npt.NDArray[np.int64],
    c: float | None = None,
) -> dict[str, float]:
    """The linear probe (spec §1); `c=None` chooses C as `ssl eval` does (the default grid, a
    stratified 20 % validation split, seed 0). Returns `balanced_accuracy`, `accuracy`, `c`."""

def eval_knn(
    train_x: npt.NDArray[np.float32],
    train_y: npt.NDArray[np.int64],
    test_x: npt.NDArray[np.float32],
    test_y: npt.NDArray[np.int64],
    k: int = 20,
    temperature: float = 0.07,
) -> float:
    """Weighted k-NN accuracy (spec §3)."""

def eval_rankme(z: npt.NDArray[np.float32], eps: float = 1e-7) -> float:
    """RankMe (spec §4)."""

def eval_lidar(
    views: list[npt.NDArray[np.float32]], delta: float = 1e-4, eps: float = 1e-8
) -> float:
    """LiDAR (spec §6) of `V` views `[N, D]` of the same samples."""

def eval_effective_rank(z: npt.NDArray[np.float32]) -> float:
    """Effective rank (spec §5)."""

def eval_alignment_uniformity(
    a: npt.NDArray[np.float32],
    b: npt.NDArray[np.float32],
    alpha: float = 2.0,
    t: float = 2.0,
) -> tuple[float, float]:
    """Alignment of the pairs of rows of `a` and `b`, uniformity of `a` (spec §7)."""

def eval_cka(x: npt.NDArray[np.float32], y: npt.NDArray[np.float32]) -> float:
    """Linear CKA (spec §8)."""

def eval_kmeans_scores(
    z: npt.NDArray[np.float32],
    labels: npt.NDArray[np.int64],
    k: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Spherical k-means (spec §9) fitted on `z` and scored against `labels`: `nmi`, `ami`,
    `ari` and the k-means `objective`."""

def eval_medmnist_metrics(
    task: str,
    labels: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
) -> dict[str, float]:
    """MedMNIST's official ACC and AUC."""

def forked() -> bool:
    """Whether this process is a fork of the one that imported the module."""
