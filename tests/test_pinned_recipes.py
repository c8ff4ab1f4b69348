"""The shipped training recipes, shrunk, reproduce their pinned metrics (tests/pinned_recipes.py).

The recipes run in float64, so another CPU's rounding stays below the comparison's tolerance
(`TOLERANCE`, rel 1e-4: with an AVX2 CPU's kernels CI's 12 differed by ~1.4e-5 at most), and a
redesign checks exactly on one machine with `python tests/pinned_recipes.py --check`. CI runs the
recipes below, one per RL feature and supervised objective (the others take minutes each on two
cores); `TEMPER_PINS=all` runs every pinned recipe.
"""

from __future__ import annotations

import json
import os

import pytest

from pinned_recipes import PINS, TOLERANCE, differences, pinned_recipes, run_pinned

# one recipe per feature the pins guard: the estimator families, each RL feature, each objective
SUITE = {
    "quickstart": "grpo, DAPO dynamic sampling",
    "opsd": "teacher context (OPSD), a named and a self teacher",
    "on_policy_distillation": "on_policy_distill: the teacher's per-token log-ratio",
    "rlhf_ppo": "gae with a value head, the reward-model scorer, Bradley-Terry",
    "prm_vs_orm": "the process reward model's min / product scorer, the PRM objective",
    "rlvp_code_repair": "path rewards (RLVP) in a sandboxed agent env",
    "grpo_custom_reward": "a dataset task graded by the user's reward functions",
    "adaptthink": "AdaptThink's estimator, forced first token and reference accuracy",
    "dpo_vs_kto": "DPO and KTO objectives, the verifier pair generator",
    "rft_star": "rejection-sampling rounds",
    "prompt_distillation": "the forward-KL objective",
    "agent_treasure_hunt": "multi-turn episodes with process rewards",
    "async_agent_treasure_hunt": "bounded-staleness rollouts (k = 1, a forked worker) of multi-turn episodes",
}


def _selected() -> list[str]:
    every = [p.stem for p in pinned_recipes()]
    return every if os.environ.get("TEMPER_PINS") == "all" else [n for n in every if n in SUITE]


def test_the_suite_names_pinned_recipes():
    every = {p.stem for p in pinned_recipes()}
    assert set(SUITE) <= every, set(SUITE) - every
    assert every == {p.stem for p in PINS.glob("*.json")}, (
        "a pinned recipe without its record, or the reverse"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", _selected())
def test_a_shrunk_recipe_reproduces_its_pinned_metrics(name, tmp_path):
    pinned = json.loads((PINS / f"{name}.json").read_text())
    got = run_pinned(next(p for p in pinned_recipes() if p.stem == name), tmp_path)
    diff = differences(pinned, got, rel=TOLERANCE["rel"], abs_=TOLERANCE["abs"])
    assert not diff, "\n".join(diff[:30])


def test_differences_allow_only_rounding_and_only_with_a_tolerance():
    pinned = {
        "02-dpo": [{"loss": 1.0, "mismatch/max_abs": 2e-6, "rewards/accuracies": 0.0, "rewards/margins": 0.0}]
    }
    now = {
        "02-dpo": [
            {"loss": 1.00002, "mismatch/max_abs": 4e-6, "rewards/accuracies": 1.0, "rewards/margins": 5e-16}
        ]
    }
    tolerance = {"rel": TOLERANCE["rel"], "abs_": TOLERANCE["abs"]}
    assert differences(pinned, now, **tolerance) == []
    assert len(differences(pinned, now)) == 4  # --check: exact
    # beyond rounding: a loss off by 1e-3, a mismatch of 1e-4, an accuracy whose margins are real
    now["02-dpo"][0] |= {"loss": 1.001, "mismatch/max_abs": 1e-4, "rewards/margins": 0.1}
    pinned["02-dpo"][0]["rewards/margins"] = 0.1
    assert [d.split(":")[0] for d in differences(pinned, now, **tolerance)] == [
        "02-dpo row 0 loss",
        "02-dpo row 0 mismatch/max_abs",
        "02-dpo row 0 rewards/accuracies",
    ]
