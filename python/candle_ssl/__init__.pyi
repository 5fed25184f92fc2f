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

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from . import eval as eval
from . import losses as losses
from ._native import EpochEvent as EpochEvent
from ._native import StepEvent as StepEvent

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

__version__: str
"""The package's version (the Rust workspace's)."""

class Run:
    """A finished training run: its directory, the result table, and what it wrote.

    `train` returns one; `Run(path)` opens a run directory written earlier (by `train` or by
    `ssl run`), with an empty `table`.
    """

    dir: Path
    """The run directory: `config.yaml`, `metrics.jsonl`, `results.json`, `checkpoint/`, …"""
    table: str
    """The Markdown result table `ssl run` prints at the end (empty for `Run(path)`)."""

    def __init__(self, dir: str | os.PathLike[str], table: str = "") -> None: ...
    @property
    def results(self) -> dict[str, Any]:
        """`results.json`: the end-of-run evaluation, `{"seconds": …, "rows": [{"encoder": …,
        "metrics": {…}}, …]}` with one row per encoder of the table (raw inputs, random init,
        the trained one).
        """
    @property
    def history(self) -> dict[str, list[float]]:
        """`metrics.jsonl` by key: each key of its records (`loss`, each loss term, `lr`,
        `images_per_s`, `data_wait_ms`, `knn_accuracy`, `online_probe_accuracy`, …, and `step`,
        `epoch`, `epoch_end`) maps to the list of its values in file order.

        Step records and epoch records are mixed in the file, so lists differ in length:
        `history["loss"]` has one value per optimiser step, `history["knn_accuracy"]` one per
        monitored epoch, and `history["step"]` the `step` of every record of both kinds. A
        `null` (an online probe that is off) reads as NaN.
        """
    def __fspath__(self) -> str: ...

class Encoder:
    """A trained encoder (backbone, without its projector), in evaluation mode: batch norm uses
    its running statistics, as in the run's evaluation table.

    Made by `candle_ssl.load`; it reads the weights once, builds the network for the sample
    shape of the first `embed` call, and runs on the CPU.
    """

    @property
    def dir(self) -> Path:
        """The directory the weights are read from: the run directory (for a checkpoint
        directory, its run), or the pulled repository in the Hugging Face cache.
        """
    def embed(self, x: npt.ArrayLike, batch_size: int = 256) -> npt.NDArray[np.float32]:
        """Features `[N, F]` (float32, F the encoder's output width) of the samples `x`:
        `[N, C, H, W]` images or `[N, C, D, H, W]` volumes of the shape the run trained on.

        `x` holds the samples as the run's data set stored them: uint8 (read as v/255) or
        floats in [0, 1] (read as float32); the run's normalisation is applied inside, and the
        network runs in evaluation mode, `batch_size` samples at a time, with the GIL released.
        """
    def export(self, path: str | os.PathLike[str]) -> str:
        """Writes the encoder's weights with PyTorch state-dict keys to the safetensors file
        `path` (as `ssl export`) and returns the path written.
        """

def train(
    objective: str | None = None,
    data: str | os.PathLike[str] | npt.NDArray[Any] | None = None,
    epochs: int | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    labels: npt.ArrayLike | None = None,
    resume: bool = False,
    overwrite: bool = False,
    on_step: Callable[[StepEvent], object] | None = None,
    on_epoch: Callable[[EpochEvent], object] | None = None,
    progress: bool = True,
    **settings: Any,
) -> Run:
    """Trains an encoder as `ssl run` does, evaluates it, and returns the finished `Run`.

    `objective`: an objective's name or alias (`objectives()`); `None` is `"vicreg"` for a new
    run and the run's own when resuming.

    `data`: what to train on; `None` is the embedded digits for a new run and the run's own
    when resuming.

    * a data set's name: `"digits"`, `"gmm"`, a MedMNIST flag (`"bloodmnist"`, …, its files
      from `root=` or `~/.medmnist`), `"cifar10"`, `"cifar100"`, `"stl10"`, … (fetched by
      `ssl data download`);
    * a path (`str` or `os.PathLike`): a `.npz` file in MedMNIST's layout, an image or scan
      folder, or a `.csv`/`.tsv` manifest (`data.name: folder` with that `data.root`). A string
      is a path when it ends in `.npz`, `.csv` or `.tsv`, holds a path separator or starts with
      `~`; write a folder in the working directory as `"./scans"` or `Path("scans")`;
    * a NumPy array: `[N, C, H, W]` images or `[N, C, D, H, W]` volumes, uint8 (read as
      v/255) or float (read as float32, values in [0, 1] for the image augmentations), with
      `labels=`: each sample's class number, or `-1` for a sample that only pretrains (which
      needs the online probe off, `**{"train.probe_lr": 0}`). The labelled samples are split
      into train and a held-out `data.test_fraction` for the result table.

    `epochs`: `train.epochs`. `out`: the run directory (default: a new
    `runs/<objective>-<time>` under the working directory, linked from `runs/latest`).
    `resume`: continue the run in `out` (default `runs/latest`) from its last checkpoint, to
    the weights an uninterrupted run would have reached; its recorded configuration is the
    base, and a setting that would change its result is refused. `overwrite`: replace the run
    already in `out`.

    `on_step(event)`: called after every optimiser step with a `StepEvent` (`step`, `epoch`,
    `loss`, `terms`, `lr`); `on_epoch(event)`: after every epoch's monitor with an `EpochEvent`
    (`epoch`, `steps`, `knn_accuracy`, `probe_accuracy`). Step events come in bursts of
    `train.log_every` steps. Callbacks are called with the GIL held, while training waits; an
    exception raised in one stops the run and is raised again from `train`. `progress`: draw
    the progress bar on stderr.

    `settings`: any configuration key, as `ssl run --set` takes it: dotted through a dict
    (`**{"train.lr": 1e-3}`), with `__` for the dot (`train__lr=1e-3`), or one of the short
    names `batch_size`, `views`, `size`, `encoder`, `init`, `local_views`, `seed`, `device`,
    `threads`, `root` (the flags of `ssl run`); a whole section takes a dict
    (`train={"lr": 1e-3}`). Values are numbers, strings, bools, `None`, lists and dicts of
    them (NumPy scalars and paths are converted).

    Returns the `Run`: its directory, the Markdown result table (`print(run.table)`),
    `results` and `history`. Raises `ValueError` for an unknown key (with the known keys of its
    section) or a refused value or data, `FileNotFoundError` for missing data or a missing run to resume,
    `RuntimeError` when training fails (a non-finite loss names its step),
    `KeyboardInterrupt` on Ctrl-C (the run directory keeps its last checkpoint: resume it with
    `out=` and `resume=True`), and a callback's own exception.
    """

def load(path_or_hf: str | os.PathLike[str]) -> Encoder:
    """The trained encoder of a run directory, a checkpoint directory (which finds its run), or
    a Hub repository `"hf://user/repo"` (downloaded into the cache as `ssl pull` does).

    Raises `FileNotFoundError` when there is no such run or checkpoint, `ValueError` when the
    directory is not one.
    """

def objectives() -> list[str]:
    """The registered objectives' names, sorted (`ssl list`); `describe(name)` tells more."""

def encoders() -> list[str]:
    """The encoders' names (`model.encoder`): the built-in ones, then any registered from
    Rust.
    """

def describe(name: str) -> str:
    """An objective's description, as `ssl describe NAME` gives it: its summary, paper,
    aliases, and its keys (`objective.params.KEY`) with their defaults. `name` may be an alias.
    Raises `ValueError` for an unknown name, suggesting the closest known one.
    """
