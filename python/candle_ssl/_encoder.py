"""`load` and `Encoder`: a trained encoder from a run, a checkpoint or the Hub."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import numpy as np
import numpy.typing as npt

from . import _arrays, _native

__all__ = ["Encoder", "load"]


def _path(path: Union[str, "os.PathLike[str]"], what: str) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a str or os.PathLike, got {type(path).__name__}")
    return path if path.startswith("hf://") else os.path.expanduser(path)


class Encoder:
    """A trained encoder (backbone, without its projector), in evaluation mode: batch norm uses
    its running statistics, as in the run's evaluation table.

    Made by `candle_ssl.load`; it reads the weights once, builds the network for the sample
    shape of the first `embed` call, and runs on the CPU.
    """

    __slots__ = ("_native",)

    def __init__(self, native: _native.Encoder) -> None:
        self._native = native

    @property
    def dir(self) -> Path:
        """The directory the weights are read from: the run directory (for a checkpoint
        directory, its run), or the pulled repository in the Hugging Face cache."""
        return Path(self._native.dir)

    def embed(self, x: npt.ArrayLike, batch_size: int = 256) -> npt.NDArray[np.float32]:
        """Features `[N, F]` (float32, F the encoder's output width) of the samples `x`:
        `[N, C, H, W]` images or `[N, C, D, H, W]` volumes of the shape the run trained on.

        `x` holds the samples as the run's data set stored them: uint8 (read as v/255) or
        floats in [0, 1] (read as float32); the run's normalisation is applied inside, and the
        network runs in evaluation mode, `batch_size` samples at a time, with the GIL released.
        """
        samples = _arrays.samples(x if isinstance(x, np.ndarray) else np.asarray(x), "x")
        return self._native.embed(samples, _arrays.whole(batch_size, "batch_size"))

    def export(self, path: Union[str, "os.PathLike[str]"]) -> str:
        """Writes the encoder's weights with PyTorch state-dict keys to the safetensors file
        `path` (as `ssl export`) and returns the path written."""
        return str(self._native.export(_path(path, "path")))

    def __repr__(self) -> str:
        return f"Encoder({str(self.dir)!r})"


def load(path_or_hf: Union[str, "os.PathLike[str]"]) -> Encoder:
    """The trained encoder of a run directory, a checkpoint directory (which finds its run), or
    a Hub repository `"hf://user/repo"` (downloaded into the cache as `ssl pull` does).

    Raises `FileNotFoundError` when there is no such run or checkpoint, `ValueError` when the
    directory is not one.
    """
    source = _path(path_or_hf, "path_or_hf")
    if not source.startswith("hf://") and not os.path.exists(source):
        raise FileNotFoundError(
            f"{source} does not exist; give a run directory (e.g. runs/latest), its checkpoint "
            "directory, or hf://user/repo"
        )
    return Encoder(_native.Encoder.load(source))
