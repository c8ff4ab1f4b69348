"""A learned reward model as an RL reward, the feature `reward_model: <stage or folder>`: the
`reward_model` batch component, an earlier `reward_model` stage's model (or a folder saved by
one) scoring each sampling round's episodes at once (`temper.rewards.reward_model`). The run then
also logs `reward/gold`, the verifier's reward of every sample, as the gold the proxy is judged by
(Gao et al. 2023)."""

from __future__ import annotations

from typing import Any

from temper.rewards.reward_model import REWARD_MODEL_DIR, RewardModel
from temper.train.features.base import Error, RLFeature, ScorerSetup, Use
from temper.train.rollouts import model_scorer

RM = "reward_model"
"""The component's name in `rewards:`, the block's key and the stage kind that exports the model."""


def rules(config: Any, stage: Any) -> list[Error]:
    """A `reward_model` component needs `train.reward_model`, and a reward model is named only to
    be used: each error at the key that is wrong (or missing)."""
    if RM in config.rewards and config.reward_model is None:
        return [
            (
                ("train", "rewards", RM),
                "the reward_model component needs a reward model: set train.reward_model to an earlier "
                "reward_model stage's name or to a folder saved by one",
            )
        ]
    if config.reward_model is not None and RM not in config.rewards:
        return [
            (
                ("train", RM),
                f"{config.reward_model!r} is never used: no reward_model component in train.rewards "
                "(e.g. rewards: {reward_model: 1.0, outcome: 0.0})",
            )
        ]
    return []


def uses(config: Any) -> list[Use]:
    """An earlier reward_model stage (its `<out>/reward_model`) or a folder saved by one: the stage
    hash covers its files, so a retrained reward model reruns the stage."""
    return [] if config.reward_model is None else [(("train", RM), config.reward_model, RM)]


def scorers(config: Any, setup: ScorerSetup) -> dict[str, Any]:
    if config.reward_model is None:
        return {}
    learned = RewardModel.load(setup.folder(config.reward_model, REWARD_MODEL_DIR), device=setup.device)
    return {RM: model_scorer(RM, learned)}


FEATURE = RLFeature(
    name=RM,
    block=str | None,
    doc="The learned reward model the `reward_model` component scores with: the name of an earlier "
    "`reward_model` stage (its `<out>/reward_model` folder) or a folder saved by one (relative to the "
    "recipe), an `AutoModelForSequenceClassification` with one label. The run then also logs "
    "`reward/gold`, the verifier's reward of every sample, as the gold the proxy is judged by.",
    order=30,
    rules=rules,
    uses=uses,
    describe=lambda config: f", reward model {config.reward_model!r}" if config.reward_model else "",
    summary=lambda config, folder: (
        {RM: str(folder(config.reward_model, REWARD_MODEL_DIR))} if config.reward_model else {}
    ),
    scorers=scorers,
)
