"""`objectives()`, `encoders()`, `describe()` and the package's version."""

from __future__ import annotations

import re

import pytest

import candle_ssl as cs


def test_objectives() -> None:
    names = cs.objectives()
    assert isinstance(names, list) and all(isinstance(n, str) for n in names)
    assert names == sorted(names)
    for name in ("vicreg", "frossl", "simclr", "byol", "mae"):
        assert name in names


def test_encoders() -> None:
    names = cs.encoders()
    for name in ("digits_cnn", "resnet18", "mlp", "vit_t16"):
        assert name in names


def test_describe() -> None:
    text = cs.describe("vicreg")
    assert isinstance(text, str) and text.strip()
    assert text.startswith("vicreg")
    for key in ("lambda", "mu", "nu"):
        assert key in text


def test_describe_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="nope"):
        cs.describe("nope")
    with pytest.raises(ValueError, match="did you mean `frossl`"):
        cs.describe("frosl")


def test_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", cs.__version__)


def test_public_names() -> None:
    for name in cs.__all__:
        assert hasattr(cs, name), name
    assert cs.eval.__name__ == "candle_ssl.eval"
    assert cs.losses.__name__ == "candle_ssl.losses"
