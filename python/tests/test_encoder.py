"""`load`, `Encoder.embed` and `Encoder.export`."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import candle_ssl as cs

from conftest import Recorded


def _safetensors_keys(path: Path) -> list:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sorted(k for k in header if k != "__metadata__")


def test_load_and_embed(digits: Recorded) -> None:
    encoder = cs.load(digits.run.dir)
    assert isinstance(encoder, cs.Encoder)
    assert encoder.dir.resolve() == digits.run.dir.resolve()
    assert repr(encoder) == f"Encoder({str(encoder.dir)!r})"
    x = np.random.default_rng(0).random((37, 1, 16, 16), dtype=np.float32)
    features = encoder.embed(x)
    assert features.shape == (37, 128)  # the digits CNN's width
    assert features.dtype == np.float32 and features.flags.c_contiguous
    assert np.all(np.isfinite(features))
    # Batch size changes nothing but the chunking (evaluation mode: no batch statistics).
    np.testing.assert_allclose(encoder.embed(x, batch_size=5), features, rtol=1e-5, atol=1e-6)
    # float64 is read as float32; uint8 as v/255.
    np.testing.assert_allclose(encoder.embed(x.astype(np.float64)), features, rtol=1e-6)
    u8 = (x * 255).round().astype(np.uint8)
    np.testing.assert_allclose(
        encoder.embed(u8), encoder.embed(u8.astype(np.float32) / 255), rtol=1e-5, atol=1e-6
    )


def test_load_takes_paths_strings_runs_and_checkpoints(digits: Recorded) -> None:
    x = np.random.default_rng(1).random((4, 1, 16, 16), dtype=np.float32)
    want = cs.load(digits.run.dir).embed(x)
    for source in (str(digits.run.dir), digits.run, digits.run.dir / "checkpoint"):
        encoder = cs.load(source)
        assert encoder.dir.resolve() == digits.run.dir.resolve()
        np.testing.assert_array_equal(encoder.embed(x), want)


def test_embed_refuses_integer_samples(digits: Recorded) -> None:
    encoder = cs.load(digits.run.dir)
    with pytest.raises(ValueError, match="int64"):
        encoder.embed(np.zeros((2, 1, 16, 16), dtype=np.int64))


def test_export_writes_safetensors(digits: Recorded, tmp_path: Path) -> None:
    path = cs.load(digits.run.dir).export(tmp_path / "encoder.safetensors")
    assert isinstance(path, str)
    written = Path(path)
    assert written.suffix == ".safetensors" and written.is_file()
    keys = _safetensors_keys(written)
    assert keys and not any(k.startswith("encoder.") for k in keys)  # PyTorch module keys


def test_load_a_missing_run() -> None:
    with pytest.raises(FileNotFoundError):
        cs.load("no/such/run")


def test_load_a_directory_that_is_no_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.yaml"):
        cs.load(tmp_path)
