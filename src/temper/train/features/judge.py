"""A generative judge as an RL reward, the feature `judge: {model | url, rubric, scale, ...}`: the
`judge` batch component (`temper.rewards.judge.judge_scorer`), every episode of a sampling round
judged in one call; unparseable verdicts are counted (`judge/unparseable`) and left out or given
the block's fallback. With `model: policy` the judge is the policy itself (a self-rewarding loop).
"""

from __future__ import annotations

from typing import Any

from temper.rewards.judge import JUDGE, JudgeSpec, judge_scorer, spec_errors
from temper.train.features.base import Error, Hooks, RLFeature, Step, Use, at


def rules(config: Any, stage: Any) -> list[Error]:
    """A `judge` reward needs a `train.judge` block, and a judge block a `judge` weight."""
    return judge_errors(config.judge, config.rewards)


def judge_errors(spec: JudgeSpec | None, rewards: dict[str, float]) -> list[Error]:
    """The errors of a judge block (`spec_errors`) and of its pairing with the `judge` reward
    component, located below the stage."""
    if spec is None:
        if JUDGE in rewards:
            return [
                (
                    ("train", "rewards", JUDGE),
                    "the judge component needs a judge: add train.judge, e.g. {model: policy} "
                    "or {url: http://host:8000/v1, model: NAME, api_key_env: VAR}",
                )
            ]
        return []
    out = at(("train", "judge"), spec_errors(spec))
    if JUDGE not in rewards:
        out.append(
            (("train", "judge"), "is set but `rewards` does not weigh it: add `judge: <weight>` to rewards")
        )
    return out


def uses(config: Any) -> list[Use]:
    """A judge named by stage or folder (not `policy`, not an endpoint's model name): retraining
    it reruns the stage."""
    judge = config.judge
    if judge is not None and judge.url is None and judge.model != "policy":
        return [(("train", "judge", "model"), judge.model)]
    return []


class Unparseable(Hooks):
    """The verdicts of the step that could not be read."""

    def after_grading(self, step: Step) -> dict[str, Any]:
        rollouts = [r for g in step.groups for r in g.rollouts]
        if not rollouts or "judge_parsed" not in rollouts[0].parts:
            return {}
        return {"judge/unparseable": sum(r.parts["judge_parsed"] == 0 for r in rollouts)}


FEATURE = RLFeature(
    name=JUDGE,
    block=JudgeSpec | None,
    doc="The generative judge of the `judge` reward component (`temper.rewards.judge`): {model: "
    "policy | stage | folder} or {url, model, api_key_env}, with rubric, scale, fallback.",
    order=32,
    rules=rules,
    uses=uses,
    scorers=lambda config, setup: {JUDGE: judge_scorer(setup.judge(config.judge))} if config.judge else {},
    start=lambda config, run: Unparseable() if JUDGE in config.rewards else None,
)
