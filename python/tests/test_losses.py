"""`candle_ssl.losses`: an objective's loss and its gradient, checked by finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from candle_ssl import losses


def _z(seed: int = 0) -> np.ndarray:
    # Small values: every dimension's std stays well below VICReg's hinge at 1, away from its kink.
    return 0.3 * np.random.default_rng(seed).standard_normal((2, 8, 4))


def test_names_are_the_objectives_without_networks() -> None:
    names = losses.names()
    assert names == sorted(names)
    assert "vicreg" in names
    for needs_networks in ("byol", "mae"):
        assert needs_networks not in names


def test_vicreg_value_and_gradient() -> None:
    z = _z()
    value, grad = losses.loss("vicreg", z)
    assert isinstance(value, float) and math.isfinite(value)
    assert grad.shape == z.shape and grad.dtype == np.float32
    assert np.all(np.isfinite(grad))

    # Central differences in float64: the loss is computed from float32 inputs, so each
    # difference is taken over the perturbation that float32 actually holds.
    h = 1e-3
    numeric = np.zeros_like(z)
    for index in np.ndindex(*z.shape):
        plus, minus = z.copy(), z.copy()
        plus[index] += h
        minus[index] -= h
        step = float(np.float32(plus[index])) - float(np.float32(minus[index]))
        numeric[index] = (losses.loss("vicreg", plus)[0] - losses.loss("vicreg", minus)[0]) / step
    error = np.linalg.norm(numeric - grad.astype(np.float64)) / np.linalg.norm(numeric)
    assert error < 2e-2, f"relative gradient error {error:.3e}"
    np.testing.assert_allclose(grad, numeric, rtol=2e-2, atol=2e-2 * np.abs(numeric).max())


def test_parameters_change_the_loss() -> None:
    z = _z(1)
    base, _ = losses.loss("vicreg", z)
    heavier, _ = losses.loss("vicreg", z, **{"lambda": 50.0})
    same, _ = losses.loss("vicreg", z.astype(np.float32), mu=np.float64(25.0), nu=1)
    assert heavier != base
    assert same == pytest.approx(base, rel=1e-12)


def test_unknown_objective_parameter_and_shape_are_refused() -> None:
    z = _z()
    with pytest.raises(ValueError, match="did you mean `vicreg`"):
        losses.loss("vicregg", z)
    with pytest.raises(ValueError, match="muu"):
        losses.loss("vicreg", z, muu=1.0)
    with pytest.raises(ValueError, match=r"\[V, B, D\]"):
        losses.loss("vicreg", z[0])
    with pytest.raises(ValueError):
        losses.loss("byol", z)
