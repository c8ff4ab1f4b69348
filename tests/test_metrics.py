"""Metrics go to metrics.jsonl always and, when named, to experiment trackers through Accelerate's
tracker interface: checked with a recording tracker registered like any Accelerate tracker, and
with TensorBoard itself when it is installed."""

import json
import random

import accelerate.tracking
import pytest
from accelerate.tracking import GeneralTracker, register_tracker_class
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

from fakes import FirstByteTask  # tests/ is on the path (pytest rootdir mode)
from temper.data import build_sequences, parse_row
from temper.jsonl import iter_jsonl
from temper.models import build_preset
from temper.train import NextToken, TrainConfig, train_supervised
from temper.train.metrics import MetricsLog, flat_config, progress_bar
from temper.train.rl import RLConfig, train_rl


def _rows(path):
    return [row for _, _, row in iter_jsonl(path)]


class Recorder(GeneralTracker):
    """Keeps what it is given; every instance is kept in `runs`."""

    name = "temper_recorder"
    requires_logging_directory = True
    runs: list["Recorder"] = []

    def __init__(self, run_name, logging_dir, **kwargs):
        super().__init__()
        self.run_name, self.logging_dir = run_name, logging_dir
        self.started, self.finished, self.config, self.rows = False, False, None, []
        Recorder.runs.append(self)

    @property
    def tracker(self):
        return self

    def start(self):
        self.started = True

    def store_init_configuration(self, values):
        self.config = values

    def log(self, values, step=None, **kwargs):
        self.rows.append((step, values))

    def finish(self):
        self.finished = True


register_tracker_class(Recorder)


@pytest.fixture(autouse=True)
def _fresh_runs():
    Recorder.runs.clear()


def test_rows_go_to_the_file_and_the_tracker(tmp_path):
    log = MetricsLog(tmp_path / "sft" / "metrics.jsonl", trackers=["temper_recorder"], config={"lr": 0.1})
    (run,) = Recorder.runs
    assert run.started and run.config == {"lr": 0.1} and run.logging_dir == tmp_path / "sft"
    log.log({"step": 1, "loss": 2.5, "lr": 0.1, "note": "x", "skip": None})
    log.log({"step": 2, "loss": 2.0})
    assert run.rows == [(1, {"loss": 2.5, "lr": 0.1, "note": "x"}), (2, {"loss": 2.0})]
    assert _rows(log.path) == [
        {"step": 1, "loss": 2.5, "lr": 0.1, "note": "x", "skip": None},
        {"step": 2, "loss": 2.0},
    ]
    log.close()
    log.close()
    assert run.finished


def test_only_the_main_process_opens_trackers(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=False, trackers=["temper_recorder"])
    log.log({"step": 1, "loss": 1.0})
    assert Recorder.runs == [] and not log.path.exists()


def test_no_trackers_by_default_and_unknown_ones_are_errors(tmp_path):
    assert MetricsLog(tmp_path / "metrics.jsonl").trackers == []
    with pytest.raises(ValueError, match="unknown tracker 'tensorbored'; valid: .*tensorboard"):
        MetricsLog(tmp_path / "metrics.jsonl", trackers=["tensorbored"])


def test_flat_config():
    assert flat_config({"a": {"b": 1, "c": {"d": "x"}}, "e": [1, 2], "f": True}) == {
        "a/b": 1,
        "a/c/d": "x",
        "e": "[1, 2]",
        "f": True,
    }


def _sequences(tokenizer):
    rows = [parse_row({"text": f"{i}+{i}={2 * i}"}, "x", i) for i in random.Random(0).sample(range(99), 16)]
    return build_sequences(tokenizer, rows, max_len=16)[0]


def test_supervised_trainer_logs_to_named_trackers(tokenizer, tmp_path):
    config = TrainConfig(max_steps=3, batch_size=4, log_every=1, progress=False, trackers=["temper_recorder"])
    model = build_preset("nano", tokenizer)
    train_supervised(
        model, _sequences(tokenizer), config, tmp_path, objective=NextToken(tokenizer.pad_token_id)
    )
    (run,) = Recorder.runs
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [step for step, _ in run.rows] == [r["step"] for r in rows] == [1, 2, 3]
    assert [values["loss"] for _, values in run.rows] == [r["loss"] for r in rows]
    assert run.config["max_steps"] == 3 and run.config["trackers"] == "['temper_recorder']"
    assert run.finished


def test_rl_trainer_logs_to_named_trackers(tokenizer, tmp_path):
    config = RLConfig(
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=2,
        progress=False,
        trackers=["temper_recorder"],
    )
    train_rl(build_preset("nano", tokenizer), tokenizer, [FirstByteTask()], config, tmp_path)
    (run,) = Recorder.runs
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [step for step, _ in run.rows] == [r["step"] for r in rows] == [1, 2]
    assert [values["reward"] for _, values in run.rows] == [r["reward"] for r in rows]
    assert run.config["group_size"] == 2 and run.finished


def test_tensorboard_receives_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(
        tmp_path / "sft" / "metrics.jsonl", trackers=["tensorboard"], config={"train": {"lr": 0.1}}
    )
    log.log({"step": 1, "loss": 2.5})
    log.log({"step": 2, "loss": 2.0})
    log.close()
    events = EventAccumulator(str(tmp_path / "sft" / "tensorboard")).Reload()
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("loss")] == [(1, 2.5), (2, 2.0)]


# ---- exact cases, folded in from test_metrics_exact.py -----------------------------------------
# MetricsLog and the trackers it opens, on exact values: how each kind of tracker is built (logging
# folder, hosted project and run names, plain run name, a ready instance), the install hint for a
# built-in tracker that is missing, the rows a resume keeps, and the progress bar's columns.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


class _Fake(GeneralTracker):
    """A tracker registered under a built-in name; keeps how it was built and what it was given."""

    name = "fake"
    requires_logging_directory = False
    built: list = []

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.args, self.kwargs, self.events = args, kwargs, []
        _Fake.built.append(self)

    @property
    def tracker(self):
        return self

    def start(self):
        self.events.append("start")

    def store_init_configuration(self, values):
        self.events.append(("config", values))

    def log(self, values, step=None, **kwargs):
        self.events.append(("log", step, values))

    def finish(self):
        self.events.append("finish")


class _Hosted(_Fake):
    name = "hosted"


class _Plain(_Fake):
    name = "plain"


@pytest.fixture
def fakes(monkeypatch):
    _Fake.built = []
    for name in ("trackio", "wandb"):
        monkeypatch.setitem(accelerate.tracking.LOGGER_TYPE_TO_CLASS, name, _Hosted)
    monkeypatch.setitem(accelerate.tracking.LOGGER_TYPE_TO_CLASS, "mlflow", _Plain)
    return _Fake.built


def test_hosted_trackers_get_the_run_folder_as_project_and_the_stage_as_run_name(tmp_path, fakes):
    log = MetricsLog(tmp_path / "myrun" / "sft" / "metrics.jsonl", trackers=["trackio", "wandb", "mlflow"],
                     config={"a": {"b": 1}})  # fmt: skip
    assert [(type(t).__name__, t.args, t.kwargs) for t in fakes] == [
        ("_Hosted", ("myrun",), {"name": "sft"}),
        ("_Hosted", ("myrun",), {"name": "sft"}),
        ("_Plain", ("sft",), {}),
    ]
    assert all(t.events == ["start", ("config", {"a/b": 1})] for t in fakes)
    log.log({"step": 3, "loss": 0.5, "note": "x", "skip": [1]})
    assert all(t.events[-1] == ("log", 3, {"loss": 0.5, "note": "x"}) for t in fakes)


def test_unnamed_folders_fall_back_to_temper(tmp_path, monkeypatch, fakes):
    monkeypatch.chdir(tmp_path)
    MetricsLog("stage/metrics.jsonl", trackers=["wandb"])  # the run folder "." has no name
    MetricsLog("metrics.jsonl", trackers=["mlflow"])  # nor has the stage folder
    assert [(t.args, t.kwargs) for t in fakes] == [(("temper",), {"name": "stage"}), (("temper",), {})]


def test_a_tracker_instance_is_started_and_given_the_flat_config(tmp_path):
    ready = _Fake()
    log = MetricsLog(tmp_path / "m.jsonl", trackers=[ready], config={"x": [1, 2]})
    assert log.trackers == [ready] and ready.events == ["start", ("config", {"x": "[1, 2]"})]
    log.close()
    assert ready.events[-1] == "finish"


def test_a_missing_builtin_tracker_names_the_package_to_install(tmp_path):
    with pytest.raises(ValueError, match=r"^tracker 'comet_ml' is not installed: pip install comet_ml$"):
        MetricsLog(tmp_path / "m.jsonl", trackers=["comet_ml"])
    valid = ", ".join(accelerate.tracking.LOGGER_TYPE_TO_CLASS)
    with pytest.raises(ValueError) as err:
        MetricsLog(tmp_path / "m.jsonl", trackers=["nope"])
    assert str(err.value) == f"unknown tracker 'nope'; valid: {valid}"


def test_truncate_keeps_rows_up_to_the_step_and_rows_without_one(tmp_path):
    path = tmp_path / "deep" / "er" / "metrics.jsonl"
    log = MetricsLog(path)
    for row in ({"note": "start"}, {"step": 0, "x": 1}, {"step": 1, "x": 2}, {"step": 2, "x": 3}):
        log.log(row)  # the folders are made on the first row
    log.truncate_after(0)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"note": "start"},
        {"step": 0, "x": 1},
    ]


def test_progress_bar_columns_and_switch():
    bar = progress_bar(True)
    assert not bar.disable and progress_bar(False).disable
    assert [type(c) for c in bar.columns] == [
        TextColumn,
        BarColumn,
        TextColumn,
        TextColumn,
        TimeRemainingColumn,
    ]
    assert [c.text_format for c in bar.columns if isinstance(c, TextColumn)] == [
        "[bold]{task.description}",
        "{task.completed}/{task.total}",
        "{task.fields[info]}",
    ]
