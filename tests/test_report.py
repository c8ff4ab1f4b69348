"""The run report, built from a hand-made run folder shaped like the runner's and evaluate()'s output."""

import json
import shutil
from pathlib import Path

import pytest

from temper.report import find_stages, highlights, read_metrics, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _m(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "lo": lo, "hi": hi}


def _result(split: str, acc: dict, completion: str = "Answer: 4") -> dict:
    """The dict `temper.evaluate.evaluate` returns (same keys, k = 4), with made-up numbers."""
    return {
        "task": "arithmetic",
        "split": split,
        "n_problems": 100,
        "k": 4,
        "temperature": 1.0,
        "max_new_tokens": 64,
        "seed": 1234,
        "metrics": {
            "greedy_accuracy": acc,
            "parse_rate": _m(0.9, 0.83, 0.95),
            "truncation_rate": _m(0.02, 0.005, 0.07),
            "greedy_reward": _m(0.45, 0.35, 0.55),
            "mean_length": _m(12.34, 11.0, 13.68),
            "mean@4": _m(0.4, 0.33, 0.47),
            "pass@1": _m(0.4, 0.33, 0.47),
            "pass@4": _m(0.61, 0.51, 0.70),
        },
        "reasons": {"right": 45, "wrong": 55},
        "examples": [
            {
                "id": f"{split}-0",
                "prompt": "What is 2 + 2?",
                "completion": completion,
                "stop_reason": "eos",
                "score": {"reward": 1.0, "correct": True, "parsed": True, "reason": "right", "answer": "4"},
            }
        ],
    }


def _stage(run: Path, folder: str, kind: str, seconds: float, files: dict[str, object]) -> None:
    """A completed stage folder as the runner leaves it; dict/list contents are written as JSON."""
    d = run / folder
    d.mkdir(parents=True)
    (d / "stage.json").write_text(json.dumps({"hash": "abc", "kind": kind, "seconds": seconds}))
    for name, content in files.items():
        (d / name).write_text(content if isinstance(content, str) else json.dumps(content))


def _metrics(n: int, eval_every: int = 0) -> str:
    rows = []
    for step in range(1, n + 1):
        row = {
            "step": step,
            "loss": 5.0 / step,
            "lr": 1e-3 * step / n,
            "grad_norm": 1.0,
            "tokens_per_s": 1000.0,
        }
        if eval_every and step % eval_every == 0:
            row["eval_loss"] = 6.0 / step
        rows.append(json.dumps(row))
    return "\n".join(rows) + "\n"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "demo-run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {preset: nano}\n")
    data = {
        "examples": 50,
        "truncated": 2,
        "dropped": 1,
        "sequences": 40,
        "tokens": 900,
        "supervised_tokens": 300,
    }
    pretrain = {"steps": 6, "final_loss": 0.83, "seconds": 60.0, "tokens": 5000, "data": data}
    sft = {
        "steps": 4,
        "final_loss": 1.25,
        "eval_loss": 1.5,
        "data": data,
        "skipped_rows": {"data/bad.jsonl": 3},
    }
    _stage(run, "01-pretrain", "pretrain", 65.0, {"metrics.jsonl": _metrics(6), "pretrain.json": pretrain})
    _stage(run, "02-sft", "sft", 30.0, {"metrics.jsonl": _metrics(4, eval_every=2), "sft.json": sft})
    results = {
        "arithmetic": {
            "pretrain": {
                "test": _result("test", _m(0.0, 0.0, 0.037)),
                "ood": _result("ood", _m(0.0, 0.0, 0.037)),
            },
            "sft": {
                "test": _result("test", _m(0.45, 0.353, 0.550), "<script>alert(1)</script> & 4"),
                "ood": _result("ood", _m(0.03, 0.01, 0.085)),
            },
        }
    }
    _stage(run, "03-eval", "eval", 12.0, {"eval.json": results})
    _stage(run, "04-rl", "rl", 7.0, {"rl.json": {}})
    return run


def test_report_has_header_eval_numbers_and_escaped_samples(run: Path):
    page = write_report(run).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h1>demo-run</h1>" in page
    assert "total stage time 1m 54s" in page  # 65 + 30 + 12 + 7 seconds
    for folder in ("01-pretrain", "02-sft", "03-eval", "04-rl"):
        assert f"<td>{folder}</td>" in page
    assert "model: {preset: nano}" in page
    # eval table: value [lo, hi], rates in percent, length in tokens, k filled into the headers
    assert "45.0% [35.3, 55.0]" in page and "0.0% [0.0, 3.7]" in page
    assert "61.0% [51.0, 70.0]" in page and "12.3 [11.0, 13.7]" in page
    assert "<th>pass@4</th>" in page and "<th>mean@4</th>" in page
    assert "sft &gt; pretrain on test: 45.0% vs 0.0%" in page
    assert "sft &gt; pretrain on ood" not in page  # 3.0% [1, 8.5] overlaps 0.0% [0, 3.7]
    # the completion is shown, escaped, never as live markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; 4" in page
    assert "<script>" not in page
    assert "Grading reasons over all 100 problems: right: 45, wrong: 55" in page
    assert "No report section for stage kind 'rl'" in page and "rl.json" in page


def test_training_sections_show_data_counts_and_throughput(run: Path):
    page = write_report(run).read_text()
    assert "<tr class='warn'><td>data: truncated</td><td>2</td></tr>" in page
    assert "<tr class='warn'><td>data: dropped</td><td>1</td></tr>" in page
    assert "<tr><td>data: examples</td><td>50</td></tr>" in page  # counts always shown, flagged only when > 0
    assert "<tr class='warn'><td>skipped rows: data/bad.jsonl</td><td>3</td></tr>" in page
    assert "1,000 tokens/s on average" in page
    assert (
        "<td>final_loss</td><td>0.83</td>" in page
        and "<td>tokens</td><td>5,000</td>" in page
        and "<td>eval_loss</td><td>1.5</td>" in page
    )


def test_plots_are_png_files_and_inlined(run: Path):
    page = write_report(run).read_text()
    pngs = sorted(p.name for p in (run / "plots").iterdir())
    assert pngs == ["01-pretrain-loss.png", "02-sft-loss.png", "03-eval-arithmetic.png"]
    for name in pngs:
        assert (run / "plots" / name).read_bytes().startswith(PNG_MAGIC)
    assert page.count('src="data:image/png;base64,iVBORw0KGgo') == 3  # base64 of the PNG magic


def test_run_without_eval_stage_and_with_an_unfinished_stage(run: Path):
    shutil.rmtree(run / "03-eval")
    (run / "02-sft" / "stage.json").unlink()  # interrupted mid-training: only metrics so far
    (run / "02-sft" / "sft.json").unlink()
    page = write_report(run).read_text()
    assert "greedy acc" not in page
    assert "<td>02-sft</td><td>training</td>" in page and "incomplete" in page
    assert (run / "plots" / "02-sft-loss.png").exists()  # the curve up to the interruption
    assert [s.kind for s in find_stages(run)] == ["pretrain", "training", "rl"]


def test_malformed_metrics_line_is_named_in_the_page(run: Path):
    path = run / "01-pretrain" / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"step": 7, "loss": 0.\n')  # a torn last line, as a killed writer leaves
    rows, bad = read_metrics(path)
    assert len(rows) == 6 and len(bad) == 1 and f"{path}:7:" in bad[0]
    page = write_report(run).read_text()
    assert f"{path}:7: not a metrics row, skipped" in page
    assert (run / "plots" / "01-pretrain-loss.png").exists()


def test_unreadable_eval_json_is_a_note_not_a_crash(run: Path):
    (run / "03-eval" / "eval.json").write_text("{")
    page = write_report(run).read_text()
    assert "could not read this stage&#x27;s outputs" in page and "eval.json: not valid JSON" in page


def test_highlights_need_non_overlapping_intervals_and_report_regressions():
    by_model = {
        "sft": {"test": _result("test", _m(0.6, 0.5, 0.7))},
        "rl": {"test": _result("test", _m(0.3, 0.2, 0.4))},
        "rl2": {"test": _result("test", _m(0.65, 0.45, 0.8))},
    }
    assert highlights(by_model) == [
        ("rl < sft on test: 30.0% vs 60.0%", False),
        ("rl2 > rl on test: 65.0% vs 30.0%", True),
    ]
