"""The shipped training recipes, shrunk, reproduce their pinned metrics (tests/pinned_recipes.py).

The comparison allows other CPUs' rounding (rel 1e-4); a redesign checks exactly on one machine
with `python tests/pinned_recipes.py --check`. CI runs the recipes below, one per RL feature and
supervised objective (the others take minutes each on two cores); `TEMPER_PINS=all` runs every
pinned recipe.
"""

from __future__ import annotations

import json
import os

import pytest

from pinned_recipes import PINS, differences, pinned_recipes, run_pinned

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
    assert not differences(pinned, got, rel=1e-4, abs_=1e-6), "\n".join(
        differences(pinned, got, 1e-4, 1e-6)[:30]
    )
