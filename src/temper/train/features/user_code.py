"""The run's policy on user code as an RL feature, `user_code: {timeout, first_step, ...}` (the
policy itself is `temper.train.user_code.Policy`, which the stage's format gate and probe use too):
after each step's groups are graded, the groups left out because user code failed are counted and
printed, a failure in the first step or too large a share of failed samples stops the run, and
so do `zero_variance_steps` steps in a row without a learning signal, all before the step trains.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from temper.train.features.base import Hooks, RLFeature, RunStart, Step
from temper.train.user_code import Policy, UserCodeConfig, console_line, equal_rewards_teach_nothing

console = Console(stderr=True)


class UserCodePolicy(Hooks):
    def __init__(self, config: Any, run: RunStart):
        self.group_size = config.group_size
        self.policy = Policy(
            config.user_code, config.steps, console_line(console) if run.main else None, run.start,
            equal_rewards_teach_nothing(config),
        )  # fmt: skip

    def after_grading(self, step: Step) -> dict[str, Any]:
        return self.policy.after_sampling(step.step, step.causes, step.failed, self.group_size)


FEATURE = RLFeature(
    name="user_code",
    block=UserCodeConfig,
    default=UserCodeConfig,
    doc="What the run does when user code (reward functions, env factories and envs, MCP servers, "
    "judge endpoints) fails or hangs, and when it learns nothing (`temper.train.user_code`): {timeout, "
    "first_step: stop | count, max_failed_share, zero_variance_steps, on_zero_variance: stop | warn}.",
    order=1,
    start=lambda config, run: UserCodePolicy(config, run),
    hashed_when_set=True,
)
