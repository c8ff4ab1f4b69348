"""Metrics go to metrics.jsonl always and, when named, to experiment trackers through Accelerate's
tracker interface: checked with a recording tracker registered like any Accelerate tracker, and
with TensorBoard itself when it is installed."""

import random

import pytest
from accelerate.tracking import GeneralTracker, register_tracker_class

from temper.data import build_sequences, parse_row
from temper.jsonl import iter_jsonl
from temper.models import build_preset
from temper.train import NextToken, TrainConfig, train_supervised
from temper.train.metrics import MetricsLog, flat_config
from temper.train.rl import RLConfig, train_rl
from test_rl import FirstByteTask  # tests/ is on the path (pytest rootdir mode)


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
