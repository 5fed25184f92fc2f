"""`train` and `Run`: a training run from Python, with the settings of `ssl run`."""

from __future__ import annotations

import difflib
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _arrays, _native

__all__ = ["Run", "SHORT_NAMES", "settings_list", "train"]

#: Keyword arguments of `train` that stand for a configuration key (the flags of `ssl run`).
SHORT_NAMES: Dict[str, str] = {
    "batch_size": "train.batch_size",
    "views": "train.views",
    "size": "data.size",
    "encoder": "model.encoder",
    "init": "model.init",
    "local_views": "train.local_views",
    "seed": "train.seed",
    "device": "train.device",
    "threads": "train.threads",
    "root": "data.root",
}

#: Suffixes of the paths `data=` reads as an image folder's manifest.
_MANIFESTS = (".csv", ".tsv")

#: Keys whose string values are paths, where a leading `~` is expanded as a shell would.
_PATH_KEYS = ("data.root", "out")

#: The top level of the configuration: a keyword argument without a dot names one of these.
_SECTIONS = ("data", "model", "objective", "train", "eval", "out")


class Run:
    """A finished training run: its directory, the result table, and what it wrote.

    `train` returns one; `Run(path)` opens a run directory written earlier (by `train` or by
    `ssl run`), with an empty `table`.
    """

    __slots__ = ("dir", "table")

    dir: Path
    table: str

    def __init__(self, dir: Union[str, "os.PathLike[str]"], table: str = "") -> None:
        self.dir = Path(dir)
        self.table = table

    @property
    def results(self) -> Dict[str, Any]:
        """`results.json`: the end-of-run evaluation, `{"seconds": …, "phases": {…}, "rows":
        [{"encoder": …, "metrics": {…}}, …]}` with one row per encoder of the table (raw inputs,
        random init, the trained one) and the run's seconds by phase (forward, backward, …)."""
        with open(self.dir / "results.json", encoding="utf-8") as f:
            results: Dict[str, Any] = json.load(f)
        return results

    @property
    def history(self) -> Dict[str, List[float]]:
        """`metrics.jsonl` by key: each key of its records (`loss`, each loss term, `lr`,
        `images_per_s`, `data_wait_ms`, `knn_accuracy`, `online_probe_accuracy`, …, and `step`,
        `epoch`, `epoch_end`) maps to the list of its values in file order.

        Step records and epoch records are mixed in the file, so lists differ in length:
        `history["loss"]` has one value per optimiser step, `history["knn_accuracy"]` one per
        monitored epoch, and `history["step"]` the `step` of every record of both kinds. A
        `null` (an online probe that is off) reads as NaN.
        """
        history: Dict[str, List[float]] = {}
        path = self.dir / "metrics.jsonl"
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break  # a line cut off by a kill; a resume rewrites it
                raise ValueError(f"{path}:{number} is not a JSON record") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number} is not a JSON object")
            for key, value in record.items():
                if value is None:
                    number_value = math.nan
                elif isinstance(value, (bool, int, float)):
                    number_value = float(value)
                else:
                    continue
                history.setdefault(key, []).append(number_value)
        return history

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r})"

    def __fspath__(self) -> str:
        return str(self.dir)


def _dotted(key: str) -> str:
    """The configuration key a keyword argument names."""
    if key in SHORT_NAMES:
        return SHORT_NAMES[key]
    dotted = key.replace("__", ".")
    if "." not in dotted and dotted not in _SECTIONS:
        close = difflib.get_close_matches(key, list(SHORT_NAMES), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(
            f"{key} is not a setting{hint}: give a configuration key with its section, e.g. "
            f"train__{key}=… or **{{\"train.{key}\": …}} (sections: "
            f"{', '.join(_SECTIONS[:-1])}), or one of the short names "
            f"{', '.join(SHORT_NAMES)}"
        )
    return dotted


def _path_value(key: str, value: Any) -> Any:
    if key in _PATH_KEYS and isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    return value


def settings_list(named: List[Tuple[str, str, Any]]) -> List[Tuple[str, Any]]:
    """`(argument name, dotted key, value)` triples as the native module's `(key, value)`
    pairs, in order, values made plain; a key given twice must have one value."""
    pairs: Dict[str, Any] = {}
    given_as: Dict[str, str] = {}
    for argument, key, raw in named:
        if not isinstance(key, str) or not key:
            raise ValueError(f"setting {argument!r}: the key must be a non-empty string")
        value = _path_value(key, _arrays.plain(raw))
        if key in pairs:
            if pairs[key] != value or type(pairs[key]) is not type(value):
                raise ValueError(
                    f"{key} is given twice with different values: {given_as[key]}="
                    f"{pairs[key]!r} and {argument}={value!r}; keep one"
                )
            continue
        pairs[key] = value
        given_as[key] = argument
    return list(pairs.items())


def _is_path_string(data: str) -> bool:
    """Whether the string `data` names a file or folder rather than a data set."""
    lower = data.lower()
    return (
        lower.endswith(".npz")
        or lower.endswith(_MANIFESTS)
        or os.sep in data
        or (os.altsep is not None and os.altsep in data)
        or data.startswith("~")
    )


def _data_arguments(
    data: object,
    labels: Any,
) -> Tuple[
    Optional[str],
    Optional[np.ndarray[Any, Any]],
    Optional[np.ndarray[Any, Any]],
    List[Tuple[str, str, Any]],
]:
    """`data=` and `labels=` as the native `data` string, the images and labels arrays, and
    the settings they imply."""
    if isinstance(data, np.ndarray):
        images = _arrays.samples(data, "data")
        _arrays.check_sample_rank(images, "data")
        label_array = None
        if labels is not None:
            label_array = _arrays.labels(labels, "labels")
            if label_array.shape[0] != images.shape[0]:
                raise ValueError(
                    f"labels has {label_array.shape[0]} entries for {images.shape[0]} samples "
                    "in data; give one class number per sample (-1 for unlabelled)"
                )
        return None, images, label_array, []
    if labels is not None:
        raise ValueError(
            "labels= goes with images given as a NumPy array (data=array); a data set or a "
            "folder brings its own labels"
        )
    if data is None:
        return None, None, None, []
    if isinstance(data, os.PathLike):
        path = os.path.expanduser(os.fsdecode(os.fspath(data)))
    elif isinstance(data, str):
        if not _is_path_string(data):
            return data, None, None, []
        path = os.path.expanduser(data)
    else:
        raise TypeError(
            "data must be a data set name (str), a path (str or os.PathLike) or a NumPy array "
            f"of images, got {type(data).__name__}"
        )
    if path.lower().endswith(".npz"):
        return path, None, None, []
    if os.path.isdir(path) or path.lower().endswith(_MANIFESTS):
        return None, None, None, [("data", "data.name", "folder"), ("data", "data.root", path)]
    raise FileNotFoundError(
        f"data={path!r}: no such folder; give a data set name (digits, gmm, bloodmnist, "
        "cifar10, …), a .npz file in MedMNIST's layout, an image or scan folder, a .csv/.tsv "
        "manifest, or a NumPy array of images"
    )


def _callback(f: object, what: str) -> Any:
    if f is not None and not callable(f):
        raise TypeError(f"{what} must be callable or None, got {type(f).__name__}")
    return f


def train(
    objective: Optional[str] = None,
    data: Union[str, "os.PathLike[str]", np.ndarray[Any, Any], None] = None,
    epochs: Optional[int] = None,
    out: Union[str, "os.PathLike[str]", None] = None,
    *,
    labels: Any = None,
    resume: bool = False,
    overwrite: bool = False,
    on_step: Optional[Callable[[_native.StepEvent], object]] = None,
    on_epoch: Optional[Callable[[_native.EpochEvent], object]] = None,
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
    `KeyboardInterrupt` on Ctrl-C (after the epoch in progress and its checkpoint: resume it
    with `out=` and `resume=True`), and a callback's own exception.
    """
    named: List[Tuple[str, str, Any]] = []
    if objective is not None:
        if not isinstance(objective, str):
            raise TypeError(f"objective must be a str, got {type(objective).__name__}")
        named.append(("objective", "objective.name", objective))
    native_data, images, label_array, data_settings = _data_arguments(data, labels)
    named.extend(data_settings)
    if epochs is not None:
        named.append(("epochs", "train.epochs", epochs))
    if out is not None:
        named.append(("out", "out", out))
    for argument, value in settings.items():
        named.append((argument, _dotted(argument), value))
    if native_data is not None and any(key == "data.root" for _, key, _ in named):
        if native_data.lower().endswith(".npz"):
            raise ValueError(
                f"data={native_data!r} is a file, which names its directory; drop root="
            )
    if data_settings and sum(key == "data.root" for _, key, _ in named) > 1:
        raise ValueError(
            f"data={data_settings[1][2]!r} is the folder to read (data.root); drop root="
        )
    pairs = settings_list(named)
    step_callback = _callback(on_step, "on_step")
    epoch_callback = _callback(on_epoch, "on_epoch")
    try:
        directory, table = _native.train(
            pairs,
            native_data,
            images,
            label_array,
            bool(resume),
            bool(overwrite),
            step_callback,
            epoch_callback,
            bool(progress),
        )
    except ValueError as e:
        if isinstance(data, str) and native_data == data and os.path.isdir(data):
            raise ValueError(
                f"{e} (data={data!r} was read as a data set's name; for the folder of that "
                f"name give data='./{data}' or Path({data!r}))"
            ) from e
        raise
    return Run(directory, table)
