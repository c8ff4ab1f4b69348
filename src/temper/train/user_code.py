"""What an RL run does when user code fails, and when it learns nothing (`train.user_code`).

User code (reward functions, env factories and their envs, MCP servers, judge endpoints) runs
under a time limit (`temper.guard`); a call that raises, hangs or returns what it must not fails
one sample: its grade is a verifier_error, or its episode ends as env_error or timeout, each with
one line naming the function, the problem and the error. A group holding a failed sample is left
out of training (a reward of 0 would teach the policy something false) and counted here. One
policy, `Policy`, decides for the format gate, the reachability probe and every step:

- a failure before the run trains (the gate, the probe, the first step) stops it, with that line
  (`first_step: stop`, the default; `count` treats them as later failures are treated);
- later, a step in which more than `max_failed_share` of the batch's samples failed stops it;
- each step with failures prints a count, and the first failure of each kind its line, on the
  console (not only in a json);
- `zero_variance_steps` steps in a row in which no group can teach anything (every group's
  rewards are all equal, or it failed, under an estimator for which equal rewards mean zero
  advantage) stop the run naming the cause (`on_zero_variance: warn`: one loud warning
  instead), so a run never ends "complete" having trained on nothing.

A stop is a `RunStopped` (a `UserCodeError`: one line, and a hint the CLI prints below it; exit 2),
raised before the step trains, so no model is saved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field
from rich.markup import escape

from temper.guard import DEFAULT_TIMEOUT_S, UserCodeError
from temper.rewards.diagnostics import advice
from temper.tasks.base import VERIFIER_ERROR

FAILED = ("verifier_error", "env_error", "timeout")
"""How a sample fails in user code: its grader failed, its env failed, or either ran past its limit."""
ZERO_FOR_EQUAL_REWARDS = ("grpo", "dr_grpo", "rloo", "reinforce_pp")
"""The estimators that give a group whose rewards are all equal zero advantage, so that a step
of such groups trains on nothing (gae's values, the turn estimators' per-turn returns,
distillation's teacher and AdaptThink's reference accuracy give them a signal of their own)."""
LEFT_OUT = (*FAILED, "not_prefix")
"""Every reason a group is left out of training: a failure, or a chat template that re-rendered
the history differently from what was sampled (not user code: left out, printed, not counted)."""


@dataclass
class UserCodeConfig:
    """What the run does when user code fails or the run learns nothing (`train: user_code:`)."""

    __pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    timeout: Annotated[float, Field(gt=0)] = DEFAULT_TIMEOUT_S
    """Seconds one call of user code may take (a reward function on a group, an env factory, an
    env's reset, cut or close, a module's import); an env's `step` has `step_timeout`."""
    first_step: Literal["stop", "count"] = "stop"
    """stop: a failure in the format gate, the reachability probe or the first step stops the run
    before it trains, naming the function and its error; count: count them as later ones."""
    max_failed_share: Annotated[float, Field(ge=0, le=1)] = 0.25
    """Stop when more than this share of a step's samples fail in user code (their groups are left
    out of training either way)."""
    zero_variance_steps: Annotated[int, Field(ge=0)] = 5
    """Stop (or warn) after this many steps in a row in which no group carries a learning signal
    (every group's rewards are equal, or it failed); 0: never."""
    on_zero_variance: Literal["stop", "warn"] = "stop"
    """stop the run, or warn loudly once, when `zero_variance_steps` is reached."""


@dataclass(frozen=True)
class GroupFailure:
    """A group left out of training: the `kind` of its first failed sample and that sample's
    `error` line, how many of its `samples` failed in user code, and whether it was drawn in the
    step's first sampling round (the step's batch; dynamic sampling refills after it)."""

    kind: str
    error: str
    failed: int
    samples: int
    first_round: bool = True

    def __str__(self) -> str:
        return self.error


def sample_failure(rollout: Any) -> tuple[str, str] | None:
    """(kind, line) when a graded sample is not the policy's doing (`LEFT_OUT`), else None."""
    t = rollout.trajectory
    if t.stop_reason in LEFT_OUT:
        return t.stop_reason, t.error or t.stop_reason
    if rollout.score.details.get("reason") == VERIFIER_ERROR:
        return VERIFIER_ERROR, str(rollout.score.details.get("error") or VERIFIER_ERROR)
    return None


def equal_rewards_teach_nothing(config: Any) -> bool:
    """Whether a step whose groups' rewards are all equal trains on nothing under `config` (an
    `RLConfig`): an estimator of `ZERO_FOR_EQUAL_REWARDS` without a KL penalty in the reward
    (which differs sample by sample)."""
    return config.advantage in ZERO_FOR_EQUAL_REWARDS and not (
        config.kl_mode == "reward" and config.kl_coef > 0
    )


def group_failure(group: Any, first_round: bool = True) -> GroupFailure | None:
    """The failure of a graded group (`train.rollouts.Group`), or None when every sample is sound."""
    found = [f for f in (sample_failure(r) for r in group.rollouts) if f is not None]
    if not found:
        return None
    kind, error = found[0]
    failed = sum(k in FAILED for k, _ in found)
    return GroupFailure(kind, error, failed, len(group.rollouts), first_round)


def console_line(console: Any) -> Callable[[str], None]:
    """A `say` for `Policy`: each line printed whole on a rich console (never wrapped, so a
    failure's line stays one line to read and to search for)."""
    return lambda line: console.print(line, soft_wrap=True)


class Policy:
    """The run's policy on failures and empty steps (module docstring). `say` prints a console
    line (rich markup; the main process's), `start` is the step a resumed run starts from, and
    `empty_streaks` whether steps of equal-reward groups train on nothing (the zero-variance
    rule applies only then: `equal_rewards_teach_nothing`)."""

    def __init__(
        self,
        config: UserCodeConfig,
        steps: int,
        say: Callable[[str], None] | None = None,
        start: int = 0,
        empty_streaks: bool = True,
    ):
        self.config, self.steps, self.start, self.empty_streaks = config, steps, start, empty_streaks
        self.say = say or (lambda line: None)
        self.shown: set[str] = set()
        self.streak: list[Counter[str]] = []  # the causes of each step of the current empty streak
        self.warned = False

    # ------------------------------------------------------------ before training

    def before_training(self, where: str, failures: Iterable[GroupFailure], samples: int) -> None:
        """The probe's left-out groups (of `samples` sampled): printed, and a stop by the rule of
        the first step."""
        counts: Counter[str] = Counter()
        first: dict[str, str] = {}
        for f in failures:
            if f.failed:
                counts[f.kind] += f.failed
                first.setdefault(f.kind, f.error)
        self._check(where, counts, first, samples, before=True)

    def eval_failures(self, where: str, found: Mapping[str, Mapping[str, Mapping[str, Any]]], graded: int,
                      before: bool) -> None:  # fmt: skip
        """Failures `evaluate` found (its `failures`, per task) among `graded` completions: the
        format gate's (`before`: the rule of the first step) or a periodic eval's (printed only)."""
        counts: Counter[str] = Counter()
        first: dict[str, str] = {}
        for kinds in found.values():
            for kind, entry in kinds.items():
                counts[kind] += int(entry["count"])
                first.setdefault(kind, str(entry["first"]))
        if before:
            self._check(where, counts, first, graded, before=True)
        else:
            self._show(where, counts, first, graded)

    # ------------------------------------------------------------ each step

    def after_sampling(
        self, step: int, causes: Sequence[str | None], failed: Sequence[GroupFailure], group_size: int
    ) -> dict[str, float]:
        """Step `step` (1-based) sampled: its first round's zero-variance `causes` (None: the
        group has a signal) and its left-out groups. Prints, stops by the rules, and returns the
        step's metrics (user_code/failed_samples, user_code/failed_share when any failed)."""
        counts: Counter[str] = Counter()
        first: dict[str, str] = {}
        for f in failed:
            if f.failed:
                counts[f.kind] += f.failed
                first.setdefault(f.kind, f.error)
        if other := [f for f in failed if not f.failed]:  # not user code: say so, as the loop did
            self.say(
                f"[yellow]rl[/]: step {step}: {len(other)} groups left out: the chat template re-renders "
                f"the history differently from the sampled tokens (not a reward): {escape(other[0].error)}"
            )
        batch = (len(causes) + sum(f.first_round for f in failed)) * group_size  # the step's batch
        in_batch = sum(f.failed for f in failed if f.first_round)
        before = step == 1 and self.start == 0
        self._check(f"rl step {step}", counts, first, max(batch, 1), before, in_batch)
        row: dict[str, float] = {}
        if counts:
            row["user_code/failed_samples"] = float(sum(counts.values()))
            row["user_code/failed_share"] = in_batch / max(batch, 1)
        self._empty_streak(step, causes, sum(f.first_round for f in failed))
        return row

    def _empty_streak(self, step: int, causes: Sequence[str | None], failed_groups: int) -> None:
        n = self.config.zero_variance_steps if self.empty_streaks else 0
        if causes and any(c is None for c in causes):
            self.streak, self.warned = [], False
            return
        self.streak.append(
            Counter([c for c in causes if c is not None]) + Counter({"user_code_failed": failed_groups})
        )
        if not n or len(self.streak) < n or self.warned:
            return
        total = sum(self.streak, Counter())
        shares = ", ".join(
            f"{cause} {100 * k / sum(total.values()):.0f}%" for cause, k in total.most_common()
        )
        top = total.most_common(1)[0][0]
        why = "user code failed in every group" if top == "user_code_failed" else advice(top)
        message = (
            f"rl step {step}: {n} steps in a row without a learning signal: every group's rewards are "
            f"equal or it failed ({shares}); {top}: {why}"
        )
        hint = (
            "nothing was learned in those steps; fix the cause, or set train.user_code.on_zero_variance: "
            "warn (or zero_variance_steps: 0) to go on anyway"
        )
        if self.config.on_zero_variance == "stop":
            raise RunStopped(message, hint)
        self.warned = True
        self.say(f"[bold red]warning[/]: {escape(message)} (train.user_code.on_zero_variance: warn)")

    # ------------------------------------------------------------ the rules

    def _check(
        self,
        where: str,
        counts: Counter[str],
        first: dict[str, str],
        samples: int,
        before: bool,
        in_batch: int | None = None,
    ) -> None:
        """Stop on a failure before training (`first_step: stop`) or on more than
        `max_failed_share` of `samples` (`in_batch` of them failed in the step's batch; default
        all); else print the failures. A stop's line says it all: nothing else is printed."""
        failed = sum(counts.values())
        if not failed:
            return
        kind = next(iter(first))
        if before and self.config.first_step == "stop":
            raise RunStopped(
                f"{where}: {first[kind]}",
                "the run stopped before training on it: fix that code, or set "
                "train.user_code.first_step: count to count such failures instead",
            )
        share = (failed if in_batch is None else in_batch) / max(samples, 1)
        if share > self.config.max_failed_share:
            raise RunStopped(
                f"{where}: {failed} of {samples} samples failed in user code ({100 * share:.0f}%, more than "
                f"train.user_code.max_failed_share {self.config.max_failed_share:g}); the first: {first[kind]}",
                "fix that code, or raise train.user_code.max_failed_share (their groups are left out either way)",
            )
        self._show(where, counts, first, samples)

    def _show(self, where: str, counts: Counter[str], first: dict[str, str], samples: int) -> None:
        """A count line for the step, with the first failure of each kind not shown before."""
        if not counts:
            return
        said = ", ".join(f"{kind} {k}" for kind, k in counts.items())
        self.say(f"[yellow]{escape(where)}[/]: {sum(counts.values())} of {samples} samples failed in user code ({said}); their groups are left out")  # fmt: skip
        for kind, line in first.items():
            if kind not in self.shown:
                self.shown.add(kind)
                self.say(f"  first {kind}: {escape(line)}")


class RunStopped(UserCodeError):
    """The policy stopped the run (a `UserCodeError`: one line and a hint), before the step trained."""
