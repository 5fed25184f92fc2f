"""Ctrl-C: a run interrupted by SIGINT finishes its epoch, writes a checkpoint there and raises
`KeyboardInterrupt`, and `resume=True` finishes it with the weights an uninterrupted run
reaches, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

import candle_ssl as cs

#: The run interrupted, resumed and compared: three short epochs, checkpointed only at the
#: end (`train.checkpoint_every` is 10), so the checkpoint resumed from is the interrupt's.
SETTINGS: Dict[str, Any] = {
    "objective": "vicreg",
    "data": "digits",
    "epochs": 3,
    "batch_size": 64,
    "seed": 0,
    "progress": False,
}

#: Exit status of the child when `train` raised `KeyboardInterrupt`.
INTERRUPTED = 42

CHILD = textwrap.dedent(
    """
    import signal
    import sys

    import candle_ssl as cs

    # A process started in the background (nohup, some CI runners) inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: install it, as a terminal has.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    settings = {settings!r}
    said = False

    def on_step(event):
        # Mid-way through the second epoch (22 steps an epoch): the run ends that epoch.
        global said
        if event.epoch >= 1 and event.step >= 30 and not said:
            said = True
            print("started", flush=True)

    try:
        cs.train(out=sys.argv[1], on_step=on_step, **settings)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit({interrupted})
    print("finished", flush=True)
    sys.exit(0)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="POSIX signals")
def test_ctrl_c_then_resume_is_bit_exact(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(settings=SETTINGS, interrupted=INTERRUPTED))
    interrupted = tmp_path / "interrupted"
    child = subprocess.Popen(
        [sys.executable, str(script), str(interrupted)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines: List[str] = []
    started = threading.Event()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line.strip())
            if line.strip() == "started":
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert started.wait(timeout=180), f"the child never started: {lines}"
        child.send_signal(signal.SIGINT)
        code = child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reader.join(timeout=10)
    stderr = child.stderr.read() if child.stderr else ""
    assert code == INTERRUPTED, f"exit {code}, stdout {lines}, stderr:\n{stderr}"
    assert "finished" not in lines
    assert "stopping at the end of this epoch" in stderr, stderr
    assert (interrupted / "checkpoint" / "model.safetensors").is_file()
    state = json.loads((interrupted / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 44, state

    resumed = cs.train(out=interrupted, resume=True, **SETTINGS)
    assert resumed.dir.resolve() == interrupted.resolve()
    assert "linear probe" in resumed.table

    straight = cs.train(out=tmp_path / "straight", **SETTINGS)
    a = (interrupted / "checkpoint" / "model.safetensors").read_bytes()
    b = (straight.dir / "checkpoint" / "model.safetensors").read_bytes()
    assert a == b, "the resumed run's weights differ from the uninterrupted run's"
    # Every step is logged once, however the run was cut: the logs agree too.
    assert resumed.history["loss"] == straight.history["loss"]
    assert resumed.history["step"] == straight.history["step"]
