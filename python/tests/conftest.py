"""Shared fixtures: one short digits run for the whole session (its events recorded), and a
working directory of its own so that nothing lands in the repository."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import candle_ssl as cs

#: Settings of every short training run in the suite: one epoch of batch 64 on the digits
#: takes a few seconds on two cores.
SMALL: Dict[str, Any] = {"batch_size": 64, "progress": False}


@pytest.fixture(scope="session", autouse=True)
def _working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Runs the session in a temporary directory: a run without `out=` writes `runs/` there."""
    before = os.getcwd()
    cwd = tmp_path_factory.mktemp("cwd")
    os.chdir(cwd)
    try:
        yield cwd
    finally:
        os.chdir(before)


class Recorded:
    """A finished digits run with the events its callbacks received."""

    def __init__(self) -> None:
        self.steps: List[cs.StepEvent] = []
        self.epochs: List[cs.EpochEvent] = []
        self.run: cs.Run


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """VICReg on the digits for one epoch, batch 64, with both callbacks recording."""
    recorded = Recorded()
    out = tmp_path_factory.mktemp("runs") / "digits"
    recorded.run = cs.train(
        objective="vicreg",
        data="digits",
        epochs=1,
        out=out,
        on_step=recorded.steps.append,
        on_epoch=recorded.epochs.append,
        **SMALL,
    )
    return recorded
