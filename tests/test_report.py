"""The run report, built from a hand-made run folder shaped like the runner's and evaluate()'s output."""

import html
import json
import re
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


def _rl_rows(n: int) -> list[dict]:
    """metrics.jsonl rows as train_rl logs them (made-up numbers; evals on even steps, k1 KL only)."""
    rows = []
    for step in range(1, n + 1):
        row = {
            "step": step,
            "reward": 0.1 * step,
            "reward/outcome": 0.1 * step,
            "reward/format": 0.05,
            "accuracy": 0.1 * step,
            "parse_rate": 0.5 + 0.1 * step,
            "truncation_rate": 0.05,
            "response_length": 30.0 - step,
            "zero_variance": 0.5,
            **{
                f"zero_variance/{c}": 0.0
                for c in ("all_correct", "truncated", "verifier_error", "equal_other")
            },
            "zero_variance/all_wrong": 0.375,
            "zero_variance/parse_failure": 0.125,
            "sampling_rounds": 1,
            "policy_loss": 0.01,
            "entropy": 1.5 - 0.1 * step,
            "clip_frac": 0.02,
            "approx_kl": 0.001,
            "ratio_mean": 1.0,
            "grad_norm": 0.5,
            "kl_ref": 0.01 * step,
            "lr": 1e-5,
            "rollout_tokens_per_s": 2000.0,
            "train_tokens_per_s": 8000.0,
            "time/sample": 1.5,
            "time/prepare": 0.5,
            "time/train": 2.0,
        }
        if step % 2 == 0:
            row |= {"eval/arithmetic/accuracy": 0.1 * step, "eval/arithmetic/parse_rate": 0.9}
        rows.append(row)
    return rows


def _rollouts(steps: list[int]) -> str:
    """rollouts.jsonl as rollout_record writes it: two samples of one problem per logged step."""
    rows = [
        {
            "step": step,
            "problem": f"train-{step}",
            "prompt": f"What is {step} + {step}?",
            "completion": f"<b>step {step} sample {i}</b> Answer: {2 * step}",
            "reward": float(i),
            "parts": {"outcome": float(i), "format": 0.0},
            "correct": bool(i),
            "parsed": True,
            "reason": "right" if i else "wrong",
            "stop": "eos",
        }
        for step in steps
        for i in range(2)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


PROBE = {
    "zero_variance": 0.625,
    "zero_variance/all_correct": 0.0,
    "zero_variance/all_wrong": 0.5,
    "zero_variance/parse_failure": 0.125,
    "zero_variance/truncated": 0.0,
    "zero_variance/verifier_error": 0.0,
    "zero_variance/equal_other": 0.0,
    "groups": 8,
    "group_size": 4,
    "accuracy": 0.1,
    "parse_rate": 0.4,
}
GATE = {"threshold": 0.5, "parse_rates": {"arithmetic/parse_rate": 0.9}, "passed": True}


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
            "rl": {  # model stages are just names: an RL stage sits beside pretrain and sft
                "test": _result("test", _m(0.7, 0.6, 0.78)),
                "ood": _result("ood", _m(0.04, 0.01, 0.1)),
            },
        }
    }
    rl_rows = _rl_rows(4)
    rl = {"steps": 4, "seconds": 42.0, "sampled_tokens": 12345, "trained_tokens": 23456, "final": rl_rows[-1]}
    _stage(
        run,
        "03-rl",
        "rl",
        7.0,
        {
            "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in rl_rows),
            "rollouts.jsonl": _rollouts([1, 2, 3]),
            "probe.json": {"gate": GATE, "probe": PROBE},
            "rl.json": rl | {"gate": GATE, "probe": PROBE},
        },
    )
    _stage(run, "04-eval", "eval", 12.0, {"eval.json": results})
    return run


def test_report_has_header_eval_numbers_and_escaped_samples(run: Path):
    page = write_report(run).read_text()
    assert page.startswith("<!DOCTYPE html>") and "<h1>demo-run</h1>" in page
    assert "total stage time 1m 54s" in page  # 65 + 30 + 12 + 7 seconds
    for folder in ("01-pretrain", "02-sft", "03-rl", "04-eval"):
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
    assert "rl &gt; sft on test: 70.0% vs 45.0%" in page and "rl &gt; pretrain on test" in page
    assert "<td>rl</td><td>ood</td><td>100</td><td>4.0% [1.0, 10.0]</td>" in page


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
    assert pngs == ["01-pretrain-loss.png", "02-sft-loss.png", "03-rl-curves.png", "04-eval-arithmetic.png"]
    for name in pngs:
        assert (run / "plots" / name).read_bytes().startswith(PNG_MAGIC)
    assert page.count('src="data:image/png;base64,iVBORw0KGgo') == 4  # base64 of the PNG magic


def test_run_without_eval_stage_and_with_an_unfinished_stage(run: Path):
    shutil.rmtree(run / "04-eval")
    _stage(run, "05-distill", "distill", 1.0, {"notes.txt": "x"})
    (run / "02-sft" / "stage.json").unlink()  # interrupted mid-training: only metrics so far
    (run / "02-sft" / "sft.json").unlink()
    page = write_report(run).read_text()
    assert "greedy acc" not in page
    assert "<td>02-sft</td><td>training</td>" in page and "incomplete" in page
    assert (run / "plots" / "02-sft-loss.png").exists()  # the curve up to the interruption
    assert [s.kind for s in find_stages(run)] == ["pretrain", "training", "rl", "distill"]
    assert "No report section for stage kind 'distill'" in page and "notes.txt" in page


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
    (run / "04-eval" / "eval.json").write_text("{")
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


def test_rl_section_shows_gate_probe_curves_compute_and_escaped_rollouts(run: Path):
    page = write_report(run).read_text()
    assert "Format gate passed" in page and "<td>arithmetic</td><td>90%</td>" in page
    assert "62% of 8 groups had zero reward variance: all_wrong 50%, parse_failure 12%." in page
    assert "4 samples per group, accuracy 10%, parse rate 40%" in page
    # the dominant cause is flagged with its hint; the minor one is listed, not flagged
    assert "<tr class='warn'><td>all_wrong</td><td>50%</td><td>no sample right: too hard" in page
    assert "<tr><td>parse_failure</td><td>12%</td>" in page
    assert (run / "plots" / "03-rl-curves.png").read_bytes().startswith(PNG_MAGIC)
    assert 'alt="03-rl RL curves"' in page
    assert (
        "<td>sampled tokens</td><td>12,345</td>" in page and "<td>trained tokens</td><td>23,456</td>" in page
    )
    assert (
        "<td>wall time</td><td>42.0s</td>" in page
        and "<td>mean time/train per step</td><td>2s (50%)</td>" in page
    )
    assert "<td>mean rollout tokens/s</td><td>2,000</td>" in page
    # first and last logged step only, completions escaped, reward parts and reasons shown
    assert "step 1 (first logged): 2 rollouts, 1 correct, mean reward 0.5" in page
    assert "step 3 (last logged)" in page and "step 2 sample" not in page
    assert "&lt;b&gt;step 3 sample 1&lt;/b&gt; Answer: 6" in page and "<b>step" not in page
    assert "reward 1 · parts: outcome 1, format 0 · parsed: True · reason: right · stop: eos" in page


def test_rl_section_without_optional_files_and_unfinished(run: Path):
    rl = run / "03-rl"
    for name in ("rollouts.jsonl", "stage.json", "rl.json"):
        (rl / name).unlink()  # killed mid-training: metrics so far, and the (empty) probe.json of step 0
    (rl / "probe.json").write_text("{}")  # no gate and no probe configured
    with (rl / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rew')
    page = write_report(run).read_text()
    assert "<td>03-rl</td><td>rl</td><td>–</td><td>incomplete</td>" in page  # kind guessed, not "training"
    assert "Reachability probe" not in page and "Format gate" not in page
    assert "No rollouts logged." in page and "<td>steps</td><td>4</td>" in page
    assert f"{rl / 'metrics.jsonl'}:5: not a metrics row, skipped" in page
    assert (run / "plots" / "03-rl-curves.png").exists()


def test_rl_section_with_a_resumed_rollout_log_and_only_a_probe(tmp_path: Path):
    """Rollouts of replayed steps are logged again on resume: a step shows its latest rows."""
    probe = PROBE | {"zero_variance": 0.0, "zero_variance/all_wrong": 0.0, "zero_variance/parse_failure": 0.0}
    replayed = _rollouts([2, 3]).replace("sample", "replayed")  # resumed from the step-1 checkpoint
    _stage(
        tmp_path,
        "01-rl",
        "rl",
        1.0,
        {"probe.json": {"probe": probe}, "rollouts.jsonl": _rollouts([1, 2, 3]) + replayed},
    )
    page = write_report(tmp_path).read_text()
    assert "0% of 8 groups had zero reward variance." in page and "No metrics logged." in page
    assert "&lt;b&gt;step 3 replayed 1&lt;/b&gt;" in page and "step 3 sample" not in page
    assert not (tmp_path / "plots" / "01-rl-curves.png").exists()


@pytest.fixture(scope="module")
def saved_nano(tmp_path_factory) -> Path:
    from temper.models import build_preset, build_tokenizer, save_trained

    tok = build_tokenizer()
    return save_trained(build_preset("nano", tok, seed=0), tok, tmp_path_factory.mktemp("m") / "model")


@pytest.mark.parametrize(
    ("model", "stage_models", "expected"),
    [
        # a preset: the pretrained base is the "before", even when the stage names only later models
        ({"preset": "nano"}, ["sft"], ["pretrain", "sft"]),
        ({"preset": "nano"}, ["sft", "pretrain"], ["pretrain", "sft"]),  # named too: evaluated once
        ({"preset": "nano"}, [], ["pretrain", "sft"]),
        # a model.path recipe: the user's own model, named by its path as an eval-only recipe names it
        ({"path": "PATH"}, [], ["PATH", "pretrain", "sft"]),
        ({"path": "PATH"}, ["sft"], ["PATH", "sft"]),
        (None, ["sft"], ["sft"]),  # `temper eval --model ...`: only what was named
    ],
)
def test_eval_stage_evaluates_the_starting_model_once_and_first(
    tmp_path, monkeypatch, saved_nano, model, stage_models, expected
):
    from temper.catalog import make_recipe_task
    from temper.recipe import ModelSpec
    from temper.stages import evaluation
    from temper.stages.base import StageRun
    from temper.stages.context import StageContext

    loads = []
    real_load = evaluation.load_model
    monkeypatch.setattr(evaluation, "load_model", lambda p: loads.append(str(p)) or real_load(p))
    models = {"pretrain": saved_nano, "sft": saved_nano}
    task = make_recipe_task("arithmetic", {"max_digits": 1})
    ctx = StageContext(tmp_path, tmp_path, {"arithmetic": task}, {}, models=dict(models))
    spec = model and ModelSpec(**{k: str(saved_nano) if v == "PATH" else v for k, v in model.items()})
    stage = evaluation.EvalStage(
        kind="eval", models=stage_models, splits=["test"], n_problems=2, k=1, max_new_tokens=2
    )
    results = evaluation.KIND.run(stage, StageRun(ctx, tmp_path, spec))
    names = [str(saved_nano) if n == "PATH" else n for n in expected]
    assert list(results["arithmetic"]) == names and len(loads) == len(names)
    assert list(json.loads((tmp_path / "eval.json").read_text())["arithmetic"]) == names


def test_no_difference_is_said_only_when_there_is_a_comparison(run: Path):
    one = {"arithmetic": {"sft": {"test": _result("test", _m(0.45, 0.35, 0.55))}}}
    (run / "04-eval" / "eval.json").write_text(json.dumps(one))
    assert "No difference" not in write_report(run).read_text()
    two = {"arithmetic": {"pretrain": one["arithmetic"]["sft"], **one["arithmetic"]}}
    (run / "04-eval" / "eval.json").write_text(json.dumps(two))
    assert "No difference with non-overlapping 95% intervals" in write_report(run).read_text()


def _labels(fig) -> list[str]:
    return [ax.get_ylabel() for ax in fig.axes]


def test_rl_curves_leave_out_panels_with_nothing_logged():
    from temper.report.rl import rl_figure

    full = _rl_rows(4)
    assert len(rl_figure(full, "x").axes) == 8  # six panels, two with a right-hand axis
    assert "KL" in _labels(rl_figure(full, "x"))
    no_kl = [{k: v for k, v in r.items() if k not in ("kl_ref", "entropy")} for r in full]
    labels = _labels(rl_figure(no_kl, "x"))
    assert len(labels) == 6 and "KL" not in labels and "entropy (nats)" not in labels
    # entropy without a KL term: the panel stays, entropy on its own (left) axis
    entropy_only = [{k: v for k, v in r.items() if k != "kl_ref"} for r in full]
    labels = _labels(rl_figure(entropy_only, "x"))
    assert len(labels) == 7 and "KL" not in labels and "entropy (nats)" in labels
    # NaN everywhere is nothing logged too
    nan_kl = [r | {"kl_ref": float("nan"), "entropy": None} for r in full]
    assert "KL" not in _labels(rl_figure(nan_kl, "x"))
    assert _labels(rl_figure([{"step": 1, "reward": 0.5}], "x")) == ["mean reward"]
    assert rl_figure([{"step": 1, "loss_scale": 1.0}], "x") is None


def test_rl_curves_show_the_async_pipeline_only_for_an_async_run():
    from temper.report.rl import rl_figure

    full = _rl_rows(4)
    lockstep = _labels(rl_figure(full, "x"))
    assert "staleness (updates)" not in lockstep
    async_rows = [r | {"async/staleness": min(i, 1), "async/wait": 0.1} for i, r in enumerate(full)]
    labels = _labels(rl_figure(async_rows, "x"))
    assert sorted(labels) == sorted([*lockstep, "seconds per step", "staleness (updates)"])


def test_rl_section_with_metrics_but_no_curve_draws_no_empty_figure(run: Path):
    (run / "03-rl" / "metrics.jsonl").write_text('{"step": 1, "loss_scale": 1.0}\n')
    page = write_report(run).read_text()
    assert "No metrics logged." in page and not (run / "plots" / "03-rl-curves.png").exists()


def test_gate_advice_never_suggests_the_setting_already_in_force(tokenizer, capsys, tmp_path):
    from temper.catalog import make_task
    from temper.models import build_preset
    from temper.rollout import HFSampler
    from temper.stages.rl import GateError, GateSpec, format_gate

    sampler = HFSampler(build_preset("nano", tokenizer, seed=1), tokenizer)  # untrained: never parses
    tasks = {"arithmetic": make_task("arithmetic")}
    with pytest.raises(GateError, match="set gate.on_fail: warn to start RL anyway"):
        format_gate(GateSpec(min_parse_rate=0.5, n_problems=4), sampler, tokenizer, tasks, 4)
    warned = format_gate(
        GateSpec(min_parse_rate=0.5, n_problems=4, on_fail="warn"), sampler, tokenizer, tasks, 4
    )
    said = " ".join(capsys.readouterr().err.split())  # rich wraps lines
    assert "RL starts anyway (gate.on_fail: warn)" in said and "set gate.on_fail" not in said
    assert "set gate.on_fail" not in warned["message"]
    _stage(tmp_path, "01-rl", "rl", 1.0, {"probe.json": {"gate": warned}})
    page = write_report(tmp_path).read_text()
    assert "(on_fail: warn, RL ran anyway)" in page and "RL starts anyway (gate.on_fail: warn)" in page


def test_header_names_model_tokenizer_template_and_precision(run: Path, saved_nano: Path):
    from temper.models.tokenizer import CHAT_TEMPLATE

    shutil.copytree(saved_nano, run / "02-sft" / "model")
    sft = json.loads((run / "02-sft" / "sft.json").read_text())
    sft["precision"] = {"dtype": "bf16", "requested": "auto", "reason": "measured", "device_type": "cpu"}
    (run / "02-sft" / "sft.json").write_text(json.dumps(sft))
    rl = json.loads((run / "03-rl" / "rl.json").read_text())
    rl["precision"] = {
        "train": {"dtype": "fp32", "requested": "fp32"},
        "sample": {"dtype": "bf16", "requested": "auto", "reason": "cuda"},
    }
    (run / "03-rl" / "rl.json").write_text(json.dumps(rl))
    page = write_report(run).read_text()
    assert "Model: <b>preset nano (seed 0), trained from scratch</b>" in page
    n = sum(
        p.numel()
        for p in __import__("temper.models", fromlist=["load_model"]).load_model(saved_nano).parameters()
    )
    row = re.search(r"<tr><td>02-sft</td>(.*?)</tr>", page).group(1)
    assert f"<td>llama, {n:,} parameters, float32</td>" in row
    assert "<td>263</td><td>&lt;|end|&gt;</td><td>&lt;|pad|&gt;</td><td>temper built-in (sha256" in row
    assert "chat template of 02-sft</summary><pre>" + html.escape(CHAT_TEMPLATE) in page
    assert "<td>02-sft</td><td>sft</td><td>30.0s</td><td>complete</td><td>bf16 (auto: measured)</td>" in page
    assert "<td>train fp32, sample bf16 (auto: cuda)</td>" in page
    assert "<td>01-pretrain</td><td>pretrain</td><td>1m 05s</td><td>complete</td><td>–</td>" in page
    # a model folder that cannot be read is a flagged row, not a lost page
    (run / "02-sft" / "model" / "tokenizer.json").write_text("{")
    page = write_report(run).read_text()
    assert "<tr class='warn'><td>02-sft</td><td>unreadable: " in page


def test_template_names():
    from temper.report.models import template_name

    assert template_name(None) == template_name("") == "none"
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert template_name(chatml).startswith("ChatML (sha256 ") and template_name(chatml).endswith(
        ", 3 lines)"
    )
    assert template_name(chatml) != template_name(chatml + " ")  # the hash tells two apart
    assert template_name("{{ messages }}").startswith("custom (sha256 ")


def test_header_of_a_model_path_recipe_reads_the_users_own_folder(tmp_path: Path, saved_nano: Path):
    (tmp_path / "recipe.yaml").write_text(f"model: {{path: {saved_nano}}}\n")
    page = write_report(tmp_path).read_text()
    assert f"Model: <b>{saved_nano}</b>" in page and f"<tr><td>{saved_nano}</td><td>llama, " in page


def test_loss_figure_leaves_out_what_was_not_logged():
    from temper.report.training import loss_figure

    rows = [json.loads(line) for line in _metrics(4).splitlines()]
    assert [ax.get_ylabel() for ax in loss_figure(rows, "x").axes] == ["loss", "lr"]
    assert [ax.get_ylabel() for ax in loss_figure([r | {"lr": None} for r in rows], "x").axes] == ["loss"]
    assert loss_figure([{"step": 1, "lr": 0.1, "loss": float("nan")}], "x") is None


def test_header_shows_a_peft_adapter_folder_as_an_adapter(tmp_path: Path, tokenizer):
    from temper.models import apply_lora, build_preset

    model = apply_lora(build_preset("nano", tokenizer, seed=0), r=2, alpha=4)
    _stage(tmp_path, "01-sft", "sft", 1.0, {})
    folder = tmp_path / "01-sft" / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    n = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name)
    page = write_report(tmp_path).read_text()
    assert "<tr><td>01-sft</td><td>LORA adapter on " in page and f", {n:,} parameters, ?</td>" in page


def test_the_header_names_the_tools_the_episodes_called(tmp_path):
    """A run whose eval episodes called a tool says so in the header, per task and model, whatever
    its chat template can render (the calculator's inline tool needs no tool syntax)."""
    from temper.report.common import Stage
    from temper.report.page import header

    def result(calls):
        return {"episodes": {"episodes": 4, "signals": {"tool_calls": calls, "tool_errors": 0.0}}}

    ev = tmp_path / "run" / "04-eval"
    ev.mkdir(parents=True)
    (ev / "eval.json").write_text(
        json.dumps(
            {
                "calculator": {
                    "tool": {"test": result(1.0), "ood": result(0.5)},
                    "mental": {"test": result(0.0)},
                },
                "arithmetic": {"tool": {"test": {"metrics": {}}}},  # single-turn: no episodes
                "treasure_hunt": {"rl": {"test": result(0.0)}},  # episodes, no tool calls
            }
        )
    )
    page = header(tmp_path / "run", [Stage(ev, "eval", 1.0)])
    assert "Tools: <b>calculator (tool 0.75, mental 0.00 calls per episode)</b>" in page
    assert "arithmetic (" not in page and "treasure_hunt (" not in page
    assert "Tools:" not in header(tmp_path / "run", [])
