"""The constitutional stage end to end on the nano preset: critique and revision by a local fake
OpenAI-compatible endpoint (deterministic replies), the SFT rows and DPO pairs it writes, the
judge's agreement with the verifier, and a DPO stage reading its pairs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from temper.cli import main
from temper.stages.constitutional import _drop_reason


class _Critic(BaseHTTPRequestHandler):
    """Critiques say "too terse"; revisions prefix the answer with "REVISED"; verdicts pass a
    revised answer (9/10), fail the others (1/10), and are unreadable for an empty answer."""

    kinds: list[str] = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        answer = text.split("[Answer]\n")[1].split("\n\n[")[0]
        if text.endswith("[Critique]"):
            kind, reply = "critique", "too terse"
        elif text.endswith("[Revised answer]"):
            assert "[Critique]\ntoo terse" in text
            kind, reply = "revise", f"REVISED {answer}"
        else:
            kind = "verdict"
            reply = (
                "???"
                if not answer.strip()
                else "Score: 9/10"
                if answer.startswith("REVISED")
                else "Score: 1/10"
            )
        type(self).kinds.append(kind)
        data = json.dumps({"choices": [{"message": {"content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def critic():
    _Critic.kinds = []
    httpd = HTTPServer(("127.0.0.1", 0), _Critic)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


RECIPE = """\
name: cai
model: {{preset: nano}}
tasks:
  arithmetic: {{max_digits: 1}}
stages:
  - kind: pretrain
    corpus: {{tasks: [arithmetic], problems_per_task: 20}}
    train: {{max_steps: 2, batch_size: 4, warmup_steps: 1}}
  - kind: constitutional
    tasks: [arithmetic]
    principles: ["Be correct.", "Show the answer clearly."]
    prompts_per_task: 6
    max_new_tokens: 6
    keep: {keep}
    judge: {{url: "{url}", model: critic, retries: 0}}
  - kind: dpo
    data: {{files: ["{run}/02-constitutional/pairs.jsonl"]}}
    max_len: 96
    train: {{max_steps: 2, batch_size: 2, warmup_steps: 1}}
"""


def test_constitutional_stage_writes_sft_rows_pairs_and_agreement(tmp_path, critic, capsys):
    run = tmp_path / "run"
    recipe = tmp_path / "cai.yaml"
    recipe.write_text(RECIPE.format(url=critic, run=run, keep="changed"))
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0, capsys.readouterr().err
    out = run / "02-constitutional"
    summary = json.loads((out / "constitutional.json").read_text())
    pairs = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    sft = [json.loads(line) for line in (out / "sft.jsonl").read_text().splitlines()]
    # one critique and one revision per prompt, then a verdict on each original and each revision
    assert _Critic.kinds == ["critique"] * 6 + ["revise"] * 6 + ["verdict"] * 12
    empty = summary["dropped"].get("empty_original", 0)
    assert len(pairs) == len(sft) == summary["pairs"] == 6 - empty
    for pair, row in zip(pairs, sft, strict=True):
        revision = pair["chosen"][0]["content"]
        assert revision == "REVISED " + pair["rejected"][0]["content"]
        assert pair["prompt"] == row["messages"][:-1] and row["messages"][-1]["content"] == revision
        assert pair["prompt"][0]["role"] == "user"
    a = summary["agreement"]
    assert a["n"] == 12 and a["unparseable"] == empty  # an empty original gets "???"
    # the fake passes every revision ("REVISED ..." never parses as an arithmetic answer: wrong)
    # and fails every original: it agrees with the verifier exactly on the wrong originals
    wrong_originals = round(6 * (1 - summary["tasks"]["arithmetic"]["original_accuracy"])) - empty
    assert a["agreement"] == pytest.approx(wrong_originals / a["parsed"])
    o = summary["agreement_originals"]  # on the originals alone the fake agrees on the wrong ones
    assert (o["n"], o["unparseable"]) == (6, empty)
    assert o["agreement"] == pytest.approx(wrong_originals / o["parsed"])
    assert summary["tasks"]["arithmetic"]["revision_accuracy"] == 0.0
    assert summary["pair_quality"]["chosen_correct_rejected_wrong"] == 0.0
    dpo = json.loads((run / "03-dpo" / "dpo.json").read_text())
    assert dpo["steps"] == 2
    assert "judge agrees with verifier" in (run / "report.html").read_text()
    # the pairs are part of the DPO stage's hash: changed pairs retrain it, the rest is skipped
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs[:-1]))
    before = (run / "03-dpo" / "stage.json").read_text()
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    assert (run / "03-dpo" / "stage.json").read_text() != before
    assert "constitutional: complete, skipped" in capsys.readouterr().err


def test_drop_reasons():
    assert _drop_reason("4", "5", 0.1, 0.9, "changed") == "kept"
    assert _drop_reason("4", "", 0.1, 0.9, "changed") == "empty_revision"
    assert _drop_reason("", "4", 0.1, 0.9, "changed") == "empty_original"
    assert _drop_reason("4", "4", 0.1, 0.9, "changed") == "unchanged"
    assert _drop_reason("4", "5", 0.9, 0.1, "changed") == "kept"
    assert _drop_reason("4", "5", 0.9, 0.1, "judged_better") == "not_judged_better"
    assert _drop_reason("4", "5", 0.5, 0.5, "judged_better") == "not_judged_better"
    assert _drop_reason("4", "5", None, 0.9, "judged_better") == "unparseable_verdict"
    assert _drop_reason("4", "5", 0.2, 0.9, "judged_better") == "kept"


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            'principles: ["Be correct.", "Show the answer clearly."]',
            "principles: []",
            "principles: give at least one",
        ),
        (
            "keep: changed",
            "keep: changed\n    critique_prompt: 'no slots'",
            "critique_prompt: must contain {principle}",
        ),
        ("model: critic, retries: 0", "model: critic, retries: -1", "judge.retries: must be >= 0"),
        # only an earlier stage's declared outputs may be missing at plan time
        ("02-constitutional/pairs.jsonl", "02-constitutional/other.jsonl", "other.jsonl' does not exist"),
        ("02-constitutional/pairs.jsonl", "03-dpo/pairs.jsonl", "pairs.jsonl' does not exist"),
    ],
)
def test_constitutional_spec_errors(tmp_path, capsys, old, new, message):
    recipe = tmp_path / "cai.yaml"
    text = RECIPE.format(url="http://127.0.0.1:1/v1", run=tmp_path, keep="changed")
    assert old in text
    recipe.write_text(text.replace(old, new))
    assert main(["run", str(recipe), "--dry-run", "--output-dir", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err
