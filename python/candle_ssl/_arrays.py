"""Arguments as the native module takes them: NumPy arrays of one dtype and layout, and plain
Python values in place of NumPy scalars and paths.

Every conversion here either produces exactly what `candle_ssl._native` expects (C-contiguous
arrays of the one dtype each function takes) or raises `ValueError` naming the argument, so
the native side never sees an array it would have to guess about.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "check_sample_rank",
    "feature_list",
    "features",
    "labels",
    "optional_int",
    "plain",
    "real",
    "samples",
    "scores",
    "whole",
]


def _describe(a: np.ndarray[Any, Any]) -> str:
    return f"dtype {a.dtype}, shape {list(a.shape)}"


def _array(x: object, what: str) -> np.ndarray[Any, Any]:
    try:
        a = np.asarray(x)
    except Exception as e:  # ragged lists and the like
        raise ValueError(f"{what}: cannot be read as a NumPy array ({e})") from None
    if a.dtype == object:
        raise ValueError(
            f"{what}: cannot be read as a NumPy array of numbers (got an object array; "
            "are the rows of different lengths?)"
        )
    return a


def float32(x: npt.ArrayLike, what: str, ndim: int, layout: str) -> npt.NDArray[np.float32]:
    """`x`, real numbers of `ndim` axes (`layout` says which, for the error), as a C-contiguous
    float32 array."""
    a = _array(x, what)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{what}: must be numbers, got {_describe(a)}")
    if a.ndim != ndim:
        raise ValueError(f"{what}: must be a {layout} array, got shape {list(a.shape)}")
    return np.ascontiguousarray(a, dtype=np.float32)


def features(x: npt.ArrayLike, what: str) -> npt.NDArray[np.float32]:
    """`x` as a C-contiguous float32 `[N, D]` feature matrix."""
    return float32(x, what, 2, "2-D [N, D] (one sample per row)")


def labels(y: npt.ArrayLike, what: str, *, allow_matrix: bool = False) -> npt.NDArray[np.int64]:
    """`y` as C-contiguous int64 class numbers: `[N]` (an `[N, 1]` column is flattened, as
    MedMNIST stores its labels), or `[N, K]` when `allow_matrix`.

    Integer and bool arrays are taken as they are; a float array only when every value is a
    whole number (`3.0`), so a score or a probability is never read as a class by mistake.
    """
    a = _array(y, what)
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.all(a == np.round(a)):
            raise ValueError(
                f"{what}: labels must be whole class numbers 0, 1, …, got non-integral "
                f"values ({_describe(a)})"
            )
    elif a.dtype.kind not in "biu":
        raise ValueError(f"{what}: labels must be integers, got {_describe(a)}")
    if a.ndim == 2 and a.shape[1] == 1 and not allow_matrix:
        a = a[:, 0]
    if a.ndim == 2 and not allow_matrix:
        raise ValueError(
            f"{what}: labels must be a 1-D [N] array of class numbers, got shape {list(a.shape)}"
        )
    if a.ndim not in ((1, 2) if allow_matrix else (1,)):
        expected = "[N] or [N, K]" if allow_matrix else "[N]"
        raise ValueError(f"{what}: labels must be a {expected} array, got shape {list(a.shape)}")
    return np.ascontiguousarray(a, dtype=np.int64)


def scores(s: npt.ArrayLike, what: str) -> npt.NDArray[np.float64]:
    """`s` as a C-contiguous float64 `[N, K]` score matrix (`[N]` becomes `[N, 1]`)."""
    a = _array(s, what)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{what}: scores must be numbers, got {_describe(a)}")
    if a.ndim == 1:
        a = a[:, None]
    if a.ndim != 2:
        raise ValueError(f"{what}: scores must be an [N, K] array, got shape {list(a.shape)}")
    return np.ascontiguousarray(a, dtype=np.float64)


def samples(x: object, what: str) -> Union[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """`x` as a C-contiguous uint8 or float32 array of samples `[N, …]`.

    uint8 and float32 arrays keep their dtype (the native side reads uint8 as `v / 255`); other
    float dtypes become float32. Integer and bool arrays are refused: whether `255` means white
    or a count of 255 is not ours to guess.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(
            f"{what} must be a NumPy array (uint8 or float32), got {type(x).__name__}"
        )
    a: np.ndarray[Any, Any] = x
    if a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, dtype=np.float32)
    raise ValueError(
        f"{what} must hold uint8 values (read as v/255) or floats in [0, 1] (read as float32), "
        f"got dtype {a.dtype}; convert it first, e.g. x.astype(np.float32) / x.max() or "
        "x.astype(np.uint8)"
    )


def check_sample_rank(a: np.ndarray[Any, Any], what: str) -> None:
    """Refuses arrays that are not `[N, C, H, W]` images or `[N, C, D, H, W]` volumes."""
    if a.ndim == 3:
        raise ValueError(
            f"{what} has shape {list(a.shape)}: images are [N, C, H, W]; for one channel add "
            f"its axis, x[:, None]"
        )
    if a.ndim not in (4, 5):
        raise ValueError(
            f"{what} must be [N, C, H, W] images or [N, C, D, H, W] volumes, got shape "
            f"{list(a.shape)}"
        )


def plain(value: object) -> Any:
    """`value` with NumPy scalars and arrays, paths and tuples replaced by the plain Python
    values the native module takes (`int`, `float`, `bool`, `str`, `None`, lists, dicts).

    Anything else is passed on as it is: the native side refuses it with a message naming the
    setting.
    """
    if isinstance(value, np.generic):
        return plain(value.item())
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fsdecode(os.fspath(value))
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {(str(k) if isinstance(k, str) else k): plain(v) for k, v in value.items()}
    return value


def feature_list(views: object, what: str) -> List[npt.NDArray[np.float32]]:
    """`views` (`[V, N, D]`, or a sequence of `V` `[N, D]` matrices) as a list of float32
    matrices."""
    if isinstance(views, np.ndarray):
        if views.ndim != 3:
            raise ValueError(
                f"{what}: views must be a [V, N, D] array or a list of V [N, D] arrays, got "
                f"shape {list(views.shape)}"
            )
        return [features(v, f"{what}[{i}]") for i, v in enumerate(views)]
    if isinstance(views, (str, bytes)) or not isinstance(views, Sequence):
        raise ValueError(
            f"{what}: views must be a [V, N, D] array or a list of V [N, D] arrays, got "
            f"{type(views).__name__}"
        )
    return [features(v, f"{what}[{i}]") for i, v in enumerate(views)]


def optional_int(value: Optional[object], what: str) -> Optional[int]:
    """A whole number (Python or NumPy) as `int`, `None` kept."""
    if value is None:
        return None
    return whole(value, what)


def whole(value: object, what: str) -> int:
    """A whole number (Python or NumPy, not bool) as `int`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return int(value)


def real(value: object, what: str) -> float:
    """A real number (Python or NumPy, not bool) as `float`."""
    numbers = (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers):
        raise TypeError(f"{what} must be a number, got {type(value).__name__}")
    return float(value)
