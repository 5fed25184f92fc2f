"""`os.fork()` after the module's thread pools have started (a DataLoader worker's situation):
the child must compute, not wait forever for pool threads that the fork did not copy."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from typing import Tuple

import numpy as np
import pytest

import candle_ssl as cs
from candle_ssl import _native

from conftest import Recorded

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform"),
    # Python 3.12+ warns that forking a process with threads may deadlock: that is the point.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

#: Seconds a child gets before it counts as hung.
TIMEOUT = 120


def _matrix(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((200, 32)).astype(np.float32)


def _images() -> np.ndarray:
    return np.random.default_rng(1).random((8, 1, 16, 16), dtype=np.float32)


def _work(args: Tuple[str, int]) -> Tuple[bool, float, Tuple[int, ...]]:
    """In a forked worker: RankMe of a random matrix and the trained encoder's features."""
    run_dir, seed = args
    rank = cs.eval.rankme(_matrix(seed))
    features = cs.load(run_dir).embed(_images())
    return _native.forked(), rank, tuple(features.shape)


def _wait(pid: int) -> int:
    """The exit status of child `pid`, killing it after `TIMEOUT` seconds."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {TIMEOUT} s (its thread pools did not survive fork)")


def test_os_fork_after_training(digits: Recorded) -> None:
    # The parent has trained (the session's run) and computes once more, so every pool is up.
    expected = cs.eval.rankme(_matrix(0))
    assert not _native.forked()
    run_dir = str(digits.run.dir)
    expected_features = cs.load(run_dir).embed(_images())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            forked, rank, shape = _work((run_dir, 0))
            features = cs.load(run_dir).embed(_images())
            ok = (
                forked
                and abs(rank - expected) <= 1e-9 * expected
                and shape == expected_features.shape
                and np.allclose(features, expected_features, rtol=1e-5, atol=1e-6)
            )
            code = 0 if ok else 3
        except BaseException:
            traceback.print_exc()
            code = 2
        finally:
            sys.stderr.flush()
            os._exit(code)
    assert _wait(pid) == 0, "the forked child failed (see its traceback above)"


def test_multiprocessing_fork_pool(digits: Recorded) -> None:
    expected = [cs.eval.rankme(_matrix(seed)) for seed in range(4)]
    run_dir = str(digits.run.dir)
    width = cs.load(run_dir).embed(_images()).shape[1]
    context = multiprocessing.get_context("fork")
    pool = context.Pool(2)
    try:
        results = pool.map_async(_work, [(run_dir, seed) for seed in range(4)]).get(TIMEOUT)
    except multiprocessing.TimeoutError:
        pool.terminate()
        pytest.fail(f"a fork-context pool worker hung for {TIMEOUT} s")
    else:
        pool.close()
    finally:
        pool.join()
    assert [r[0] for r in results] == [True] * 4
    assert [r[1] for r in results] == pytest.approx(expected, rel=1e-9)
    assert [r[2] for r in results] == [(8, width)] * 4
