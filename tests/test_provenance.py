"""Per-sample provenance (`temper.train.provenance`) in rollouts.jsonl and the report, and the
mismatch diagnostics of a real run: a 2-step train_rl logs policy versions 0 and 1, the
sampler's settings, the chat template's sha and the graders' identities, and mismatch/...
every step; the report shows both."""

from __future__ import annotations

import hashlib
import json

import torch

from fakes import FirstByteTask
from temper.models import build_preset
from temper.report.rl import provenance_line, rl_figure
from temper.tasks.dataset_task import DataTask, DataTaskConfig
from temper.train.provenance import RunProvenance, chat_template_hash, graders, sampler_kind
from temper.train.rl import train_rl
from test_rl import _config


def test_a_reward_functions_identity_is_its_name_and_its_files_sha(tmp_path):
    code = "def short(completions, **kw):\n    return [1.0 for _ in completions]\n"
    (tmp_path / "my_rewards.py").write_text(code)
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "one", "answer": "1"}) + "\n")
    task = DataTask(DataTaskConfig(data="d.jsonl", rewards=("my_rewards:short",)), "t", tmp_path)
    assert graders(task) == [
        {"name": "my_rewards:short", "sha": hashlib.sha256(code.encode()).hexdigest()[:12]}
    ]
    (tmp_path / "my_rewards.py").write_text(code + "# edited\n")  # an edited file is another grader
    again = DataTask(DataTaskConfig(data="d.jsonl", rewards=("my_rewards:short",)), "t", tmp_path)
    assert graders(again)[0]["sha"] != graders(task)[0]["sha"]


def test_a_built_in_verifier_is_named_by_its_class():
    (entry,) = graders(FirstByteTask())
    assert entry["name"] == "fakes:FirstByteTask" and len(entry["sha"]) == 12


def test_the_run_part_is_computed_once_and_the_row_adds_the_version(tokenizer):
    class Config:
        temperature, top_p, max_new_tokens, seed = 0.7, 1.0, 9, 3

    class Wrapper:
        pass

    base = object()
    origin = RunProvenance.of_run(Wrapper(), tokenizer, [FirstByteTask()], Config, base=base)
    row = origin.row("first_byte", 5)
    assert row["policy_version"] == 5 and row["sampler"]["kind"] == "Wrapper(object)"
    assert row["sampler"]["temperature"] == 0.7 and row["sampler"]["max_new_tokens"] == 9
    assert row["chat_template"] == chat_template_hash(tokenizer) is not None
    assert row["graders"][0]["name"] == "fakes:FirstByteTask"
    assert sampler_kind(base, base) == "object"


def test_a_run_logs_provenance_and_mismatch_and_the_report_shows_them(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    result = train_rl(
        model, tokenizer, [FirstByteTask()], _config(steps=2, prompts_per_step=2, group_size=4), tmp_path
    )
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert {r["step"]: r["policy_version"] for r in rows} == {1: 0, 2: 1}
    assert rows[0]["sampler"] == {
        "kind": "HFSampler", "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 2, "seed": 0,
    }  # fmt: skip
    assert rows[0]["chat_template"] == chat_template_hash(tokenizer)
    assert rows[0]["graders"][0]["name"] == "fakes:FirstByteTask"
    for row in result.history:  # the HF sampler in fp32 agrees with the trainer to rounding
        assert row["mismatch/tokens"] > 0 and row["mismatch/max_abs"] < 1e-4
        assert row["mismatch/share_past"] == 0.0 and "mismatch/dropped" not in row
    line = provenance_line(rows[-1])
    assert "policy version 1" in line and "HFSampler" in line and "fakes:FirstByteTask" in line
    fig = rl_figure(result.history, "run")
    legends = [ax.get_legend() for ax in fig.axes] if fig else []
    labels = {t.get_text() for legend in legends if legend is not None for t in legend.get_texts()}
    assert {"max |log-ratio|", "KL (k3)", "share past threshold"} <= labels


def test_rows_before_provenance_show_no_line():
    assert provenance_line({"step": 1, "reward": 0.0}) == ""
