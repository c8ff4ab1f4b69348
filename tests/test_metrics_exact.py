"""MetricsLog and the trackers it opens, on exact values: how each kind of tracker is built (logging
folder, hosted project and run names, plain run name, a ready instance), the install hint for a
built-in tracker that is missing, the rows a resume keeps, and the progress bar's columns.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import json

import accelerate.tracking
import pytest
from accelerate.tracking import GeneralTracker
from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

from temper.train.metrics import MetricsLog, progress_bar


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
