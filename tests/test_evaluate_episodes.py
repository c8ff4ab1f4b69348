"""`evaluate` on an environment task: whole episodes, graded by their outcome, summarized per episode."""

from __future__ import annotations

from tests.test_agent_loop import WalkEnv

from fakes import Script
from temper.evaluate import evaluate
from temper.tasks.base import Problem


class Walks:
    """Three-step walks; problem "bad" has an environment that breaks."""

    name = "walks"
    max_turns = 5

    def sample(self, split, n, seed):
        return [Problem("walks", split, ["a", "bad", "c"][i % 3], "walk") for i in range(n)]

    def make_env(self, problem):
        return WalkEnv(fail=problem.id == "bad")


def test_evaluate_plays_episodes_and_reports_them(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    r = evaluate(script, tokenizer, Walks(), "test", n_problems=3, k=2, max_new_tokens=8, n_examples=3)
    m = r["metrics"]
    assert m["greedy_accuracy"]["value"] == 2 / 3  # the broken env's episode is not correct
    assert m["mean@2"]["value"] == 2 / 3 and m["pass@2"]["value"] == 2 / 3
    # policy tokens per episode: "left" + end of turn, 3 turns (the broken one: 1 turn)
    assert m["mean_length"]["value"] == (15 + 5 + 15) / 3
    e = r["episodes"]
    assert e["episodes"] == 3 * 3 and e["stop_reasons"] == {"done": 6, "env_error": 3}
    assert e["turns"] == (3 * 6 + 1 * 3) / 9
    assert r["reasons"] == {"unknown": 2, "env_error": 1}  # WalkEnv gives no reason; the broken env is named
    first = r["examples"][0]
    assert first["turns"] == 3 and [s["by"] for s in first["episode"]] == [
        "policy",
        "env",
        "policy",
        "env",
        "policy",
    ]
    assert first["episode"][1]["text"] == "<|user|>at 1<|end|><|assistant|>"
