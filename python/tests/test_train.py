"""`candle_ssl.train`: a run on the digits, on NumPy images, its callbacks, and its errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, List

import numpy as np
import pytest

import candle_ssl as cs
from candle_ssl import _run

from conftest import SMALL, Recorded


# --- A run on the digits -------------------------------------------------------------------


def test_digits_run_has_its_directory_and_table(digits: Recorded) -> None:
    run = digits.run
    assert isinstance(run, cs.Run)
    assert isinstance(run.dir, Path) and run.dir.is_dir()
    for name in ("config.yaml", "metrics.jsonl", "results.json"):
        assert (run.dir / name).is_file(), name
    assert (run.dir / "checkpoint" / "model.safetensors").is_file()
    assert "linear probe" in run.table
    assert "vicreg" in run.table
    assert repr(run) == f"Run({str(run.dir)!r})"


def test_results_are_results_json(digits: Recorded) -> None:
    results = digits.run.results
    with open(digits.run.dir / "results.json", encoding="utf-8") as f:
        assert results == json.load(f)
    rows = results["rows"]
    assert len(rows) >= 2
    trained = rows[-1]["metrics"]
    assert 0.0 <= trained["probe_balanced_accuracy"] <= 1.0
    assert 0.0 <= trained["knn_accuracy"] <= 1.0


def test_history_reads_metrics_jsonl_in_order(digits: Recorded) -> None:
    history = digits.run.history
    records = [
        json.loads(line)
        for line in (digits.run.dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    steps = [r for r in records if "loss" in r]
    assert history["loss"] == [float(r["loss"]) for r in steps]
    assert history["step"] == [float(r["step"]) for r in records]
    assert history["lr"] == [float(r["lr"]) for r in steps]
    assert len(history["knn_accuracy"]) == 1  # one epoch, monitored at its end
    assert all(math.isfinite(v) for v in history["loss"])
    # One record per optimiser step, numbered from 0.
    assert [int(s) for s in (r["step"] for r in steps)] == list(range(len(steps)))


def test_history_skips_a_line_cut_off_by_a_kill(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step":0,"epoch":0,"loss":1.0}\n'
        '{"epoch_end":0,"step":1,"knn_accuracy":0.5,"online_probe_accuracy":null}\n'
        '{"step":1,"epoch":1,"lo'
    )
    history = cs.Run(tmp_path).history
    assert history["loss"] == [1.0]
    assert history["step"] == [0.0, 1.0]
    assert history["knn_accuracy"] == [0.5]
    assert math.isnan(history["online_probe_accuracy"][0])


def test_step_callback_sees_every_step(digits: Recorded) -> None:
    steps = digits.steps
    assert steps, "on_step was never called"
    assert [e.step for e in steps] == list(range(len(steps)))
    assert len(steps) == len(digits.run.history["loss"])
    for e in steps:
        assert isinstance(e, cs.StepEvent)
        assert e.epoch == 0
        assert isinstance(e.loss, float) and math.isfinite(e.loss)
        assert isinstance(e.lr, float) and e.lr >= 0.0
        assert isinstance(e.terms, dict) and e.terms
        assert all(isinstance(k, str) and isinstance(v, float) for k, v in e.terms.items())
    assert "StepEvent(" in repr(steps[0])
    # The logged steps are the events: one stream feeds the log and the callbacks.
    history = digits.run.history
    assert history["loss"] == pytest.approx([e.loss for e in steps], rel=1e-6)
    assert history["images_per_s"] == pytest.approx([e.images_per_s for e in steps], rel=1e-6)
    assert all(e.images_per_s > 0.0 and e.data_wait_ms >= 0.0 for e in steps)


def test_epoch_callback_sees_the_epoch(digits: Recorded) -> None:
    (event,) = digits.epochs
    assert isinstance(event, cs.EpochEvent)
    assert event.epoch == 0
    assert event.steps == len(digits.steps)
    assert event.knn_accuracy is not None and 0.0 <= event.knn_accuracy <= 1.0
    assert event.probe_accuracy is None or 0.0 <= event.probe_accuracy <= 1.0
    assert "EpochEvent(" in repr(event)


def test_run_opens_a_directory_written_earlier(digits: Recorded) -> None:
    again = cs.Run(str(digits.run.dir))
    assert again.dir == digits.run.dir
    assert again.table == ""
    assert again.results == digits.run.results


class Stop(Exception):
    """Raised by a callback to stop a run."""


def test_a_callback_exception_stops_the_run(tmp_path: Path) -> None:
    calls: List[int] = []

    def on_step(event: cs.StepEvent) -> None:
        calls.append(event.step)
        if event.step == 2:
            raise Stop("stop at step 2")

    with pytest.raises(Stop, match="stop at step 2"):
        cs.train("vicreg", "digits", 2, tmp_path / "stopped", on_step=on_step, **SMALL)
    assert calls[-1] == 2, "the run went on after its callback raised"


def test_an_epoch_callback_exception_stops_the_run(tmp_path: Path) -> None:
    def on_epoch(event: cs.EpochEvent) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="^stop$"):
        cs.train("vicreg", "digits", 3, tmp_path / "stopped", on_epoch=on_epoch, **SMALL)


# --- NumPy images --------------------------------------------------------------------------


def _images(n: int = 160) -> Any:
    """Random 16×16 one-channel uint8 images in 4 classes, every fifth one unlabelled."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(n, 1, 16, 16), dtype=np.uint8)
    labels = np.repeat(np.arange(4), n // 4)
    labels[::5] = -1
    return images, labels


def test_train_on_numpy_images_with_unlabelled_ones(tmp_path: Path) -> None:
    images, labels = _images()
    run = cs.train(
        "vicreg",
        images,
        1,
        tmp_path / "own",
        labels=labels,
        batch_size=32,
        progress=False,
        **{"train.probe_lr": 0},
    )
    assert "linear probe" in run.table
    assert run.history["loss"]
    features = cs.load(run.dir).embed(images[:10])
    assert features.shape[0] == 10 and features.dtype == np.float32


def test_float_images_train_as_float32(tmp_path: Path) -> None:
    images, labels = _images(80)
    labels = np.abs(labels)  # all labelled
    run = cs.train(
        "vicreg",
        images.astype(np.float64) / 255.0,  # float64 becomes float32
        1,
        tmp_path / "float",
        labels=labels.tolist(),
        batch_size=16,
        progress=False,
    )
    assert run.history["loss"]


def test_unlabelled_images_need_the_online_probe_off(tmp_path: Path) -> None:
    images, labels = _images()
    with pytest.raises(ValueError, match="probe_lr"):
        cs.train("vicreg", images, 1, tmp_path / "probe", labels=labels, **SMALL)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.uint16])
def test_images_of_another_dtype_are_refused(tmp_path: Path, dtype: Any) -> None:
    images = np.zeros((8, 1, 16, 16), dtype=dtype)
    with pytest.raises(ValueError, match=np.dtype(dtype).name):
        cs.train("vicreg", images, 1, tmp_path / "dtype", labels=np.zeros(8, dtype=int), **SMALL)


def test_images_without_a_channel_axis_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="channel"):
        cs.train("vicreg", np.zeros((8, 16, 16), np.float32), 1, tmp_path / "x",
                 labels=np.zeros(8, dtype=int), **SMALL)


def test_labels_must_match_the_images(tmp_path: Path) -> None:
    images, _ = _images(8)
    with pytest.raises(ValueError, match="labels"):
        cs.train("vicreg", images, 1, tmp_path / "x", labels=np.zeros(7, dtype=int), **SMALL)
    with pytest.raises(ValueError, match="labels"):
        cs.train("vicreg", images, 1, tmp_path / "x", labels=np.full(8, 0.5), **SMALL)


def test_labels_go_with_images_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="labels"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", labels=[0, 1], **SMALL)


def test_resume_and_overwrite_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give one"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", resume=True, overwrite=True, **SMALL)


# --- Settings and their errors ---------------------------------------------------------------


def test_an_unknown_key_is_named_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, **{"train.bach_size": 64})
    assert "bach_size" in str(e.value)
    assert "`batch_size`" in str(e.value)


def test_an_unknown_key_with_underscores_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, train__bach_size=64)
    assert "bach_size" in str(e.value)
    assert "`batch_size`" in str(e.value)


def test_an_unknown_section_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="trian"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, trian__lr=0.1)


def test_a_bad_value_names_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, batch_size="many")


def test_an_unknown_objective_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="did you mean `vicreg`"):
        cs.train("vicregg", "digits", 1, tmp_path / "x", **SMALL)


def test_a_value_that_is_no_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.lr"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, train__lr=object())


def test_a_key_given_twice_must_agree(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.batch_size"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False,
                 batch_size=64, train__batch_size=32)


def test_a_missing_data_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cs.train("vicreg", tmp_path / "no-such-folder", 1, tmp_path / "x", **SMALL)


def test_data_of_another_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="data"):
        cs.train("vicreg", 3, 1, tmp_path / "x", **SMALL)  # type: ignore[arg-type]


def test_numpy_values_and_paths_become_plain_values(tmp_path: Path) -> None:
    pairs = _run.settings_list(
        [
            ("batch_size", "train.batch_size", np.int64(64)),
            ("train__lr", "train.lr", np.float32(0.5)),
            ("train__drop_last", "train.drop_last", np.bool_(True)),
            ("root", "data.root", tmp_path),
            ("data__classes", "data.classes", np.array([0, 1, 2])),
            ("objective__params", "objective.params", {"mu": np.float64(2.0), "xs": (1, 2)}),
        ]
    )
    assert pairs == [
        ("train.batch_size", 64),
        ("train.lr", 0.5),
        ("train.drop_last", True),
        ("data.root", str(tmp_path)),
        ("data.classes", [0, 1, 2]),
        ("objective.params", {"mu": 2.0, "xs": [1, 2]}),
    ]
    assert [type(v) for _, v in pairs[:3]] == [int, float, bool]


def test_short_names_and_double_underscores_name_dotted_keys() -> None:
    assert _run._dotted("batch_size") == "train.batch_size"
    assert _run._dotted("views") == "train.views"
    assert _run._dotted("size") == "data.size"
    assert _run._dotted("encoder") == "model.encoder"
    assert _run._dotted("init") == "model.init"
    assert _run._dotted("local_views") == "train.local_views"
    assert _run._dotted("seed") == "train.seed"
    assert _run._dotted("device") == "train.device"
    assert _run._dotted("threads") == "train.threads"
    assert _run._dotted("root") == "data.root"
    assert _run._dotted("train__lr") == "train.lr"
    assert _run._dotted("objective__params__mu") == "objective.params.mu"
    assert _run._dotted("train.lr") == "train.lr"
    assert _run._dotted("train") == "train"  # a whole section, given as a dict


def test_a_key_without_its_section_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="train__lr"):
        cs.train("vicreg", "digits", 1, progress=False, lr=0.1)
    with pytest.raises(ValueError, match=r"did you mean batch_size\?"):
        cs.train("vicreg", "digits", 1, progress=False, batchsize=64)


def test_a_section_takes_a_dict(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bogus"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False,
                 train={"lr": 0.1, "bogus": 1})


def test_views_the_objective_cannot_take_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="views"):
        cs.train("vicreg", "digits", 1, tmp_path / "x", progress=False, views=1)


def test_data_paths_become_folder_settings(tmp_path: Path) -> None:
    folder = tmp_path / "scans"
    folder.mkdir()
    manifest = tmp_path / "labels.csv"
    assert _run._data_arguments("digits", None)[0] == "digits"
    assert _run._data_arguments("bloodmnist", None)[0] == "bloodmnist"
    assert _run._data_arguments(folder, None)[3] == [
        ("data", "data.name", "folder"),
        ("data", "data.root", str(folder)),
    ]
    assert _run._data_arguments(str(folder), None)[3][1][2] == str(folder)
    assert _run._data_arguments(str(manifest), None)[3][1][2] == str(manifest)
    npz = tmp_path / "bloodmnist_64.npz"
    assert _run._data_arguments(npz, None)[:2] == (str(npz), None)
    assert _run._data_arguments(None, None) == (None, None, None, [])
