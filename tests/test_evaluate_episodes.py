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


def test_the_episode_budget_of_an_eval_cuts_episodes_where_the_rl_stage_would(tokenizer):
    script = Script(tokenizer, lambda text, j: "left")
    kw = dict(n_problems=3, k=0, max_new_tokens=8)
    # a turn is "left" + end of turn (5 tokens) and the env's answer (7): a budget of 12 ends each
    # good episode after its first turn, as `train.max_episode_tokens: 12` does in RL
    cut = evaluate(script, tokenizer, Walks(), "test", max_episode_tokens=12, **kw)
    assert cut["episodes"]["stop_reasons"] == {"max_tokens": 2, "env_error": 1}
    assert cut["metrics"]["greedy_accuracy"]["value"] == 0
    whole = evaluate(script, tokenizer, Walks(), "test", max_episode_tokens=1000, **kw)
    assert whole["episodes"]["stop_reasons"] == {"done": 2, "env_error": 1}
    # the default budget, max_turns x max_new_tokens = 40, holds the three turns (36 tokens)
    assert evaluate(script, tokenizer, Walks(), "test", **kw)["episodes"]["stop_reasons"] == {
        "done": 2,
        "env_error": 1,
    }


def test_the_eval_stage_hashes_its_episode_budget_only_when_set():  # runs recorded before it stay complete
    from temper.stages.evaluation import EvalStage
    from temper.stages.markers import stage_settings

    assert "max_episode_tokens" not in stage_settings(EvalStage(kind="eval"))
    assert stage_settings(EvalStage(kind="eval", max_episode_tokens=504))["max_episode_tokens"] == 504
