"""The one JSONL reader and the readers built on it: data rows, the metrics log, the report."""

import json

import pytest

from temper.data import DataError, load_jsonl
from temper.jsonl import iter_jsonl
from temper.train.metrics import MetricsLog


def test_lines_are_numbered_blank_lines_skipped_and_bad_lines_handed_back(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\n  \n[2]\n{"torn": \n')
    rows = list(iter_jsonl(path))
    assert [(n, text) for n, text, _ in rows] == [(1, '{"a": 1}'), (4, "[2]"), (5, '{"torn": ')]
    assert rows[0][2] == {"a": 1} and rows[1][2] == [2]
    assert isinstance(rows[2][2], json.JSONDecodeError)


def test_data_reader_names_the_bad_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": \n')
    with pytest.raises(DataError, match=r"d.jsonl:3: field '<json>': invalid JSON"):
        load_jsonl(path)
    rows, report = load_jsonl(path, skip_bad_rows=True)
    assert [r.line for r in rows] == [1] and report.skipped == 1


def test_resumed_metrics_log_drops_later_rows_and_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    MetricsLog(path).truncate_after(2)  # a killed run resumed from its step-2 checkpoint
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
