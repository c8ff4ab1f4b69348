"""The RL feature protocol: everything a variation of the RL loop needs, in one module.

A feature (AdaptThink, OPSD's teacher context, a learned reward model, path rewards, the
reward-hacking monitors...) is one module of `temper.train.features` that defines
`FEATURE = RLFeature(...)`: its settings block (one key of the rl stage's `train:`), its rules
(checked once, when the recipe is validated, at the line that breaks them), the batch reward
scorers it adds, and the hooks it runs at fixed points of `temper.train.rl.train_rl`:

    draw problems -> `envs` -> run episodes (the `sampler` hook) -> grade (`shape`: a group's rewards)
      -> `after_grading` -> batch -> `extras` (estimator inputs, reference prompts) -> advantages
      -> update -> sync -> eval -> `after_step` (metrics from the whole row) -> log -> checkpoint

The recipe-time parts are functions of the config (`rules`, `task_rules`, `uses`, `describe`,
`hashed`, `scorers`, `shape`); the run-time part is a `Hooks` object that `start` builds for one
run (None: the feature is off), holding what the feature keeps across steps. Every hook of
`Hooks` does nothing, so a feature overrides only the ones it uses. The registry
(`temper.train.features`) finds the modules, adds their blocks to `RLConfig` and runs the hooks
in `order`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temper.rewards.judge import GroupScorer
    from temper.rollout import Sampler
    from temper.tasks.base import Problem, Task
    from temper.train.rollouts import Group, RolloutBatch, Shaper
    from temper.train.user_code import GroupFailure

Loc = tuple[str | int, ...]
Error = tuple[Loc, str]
"""A rule broken: (key path below the rl stage, e.g. ("train", "adaptthink", "delta") or
("teacher",), message). The recipe puts the message at that key's line."""
Use = tuple[Loc, str] | tuple[Loc, str, str]
"""What the stage reads besides its model (`temper.stages.base.StageKind.uses`): (key path, model
name or path) or (key path, stage name or folder, the kind that exports it)."""


class SetupError(RuntimeError):
    """A feature that cannot start for a reason the user can act on (the stage reports it as a
    stage error, in one line)."""


@dataclass(frozen=True)
class StageView:
    """What a feature's rules may read of the rl stage besides its `train:` block."""

    teacher: str | None = None
    """The stage's `teacher` (a model name, a folder, `self`), or None."""


@dataclass(frozen=True)
class ScorerSetup:
    """What building a batch reward scorer may use; the stage fills it."""

    tokenizer: Any
    """The policy's (a scorer that reads the policy's token ids must share it)."""
    device: Any
    folder: Callable[[str, str], Path]
    """(a stage name or a folder, the folder that stage exports) -> the folder it names: the
    stage's `<out>/<export>`, else a folder relative to the recipe."""
    judge: Callable[[Any], Any]
    """A `judge:` block -> its judge (`temper.rewards.judge.Judge`), built as every stage's are."""


@dataclass
class RunStart:
    """What a feature's run-time part starts from: `train_rl` fills it before the first step of
    the run (before a resumed run's checkpoint is loaded: `model` still holds the starting weights)."""

    model: Any
    tokenizer: Any
    tasks: list[Task]
    sampler: Sampler
    out_dir: Path
    main: bool
    """This is the main process (the one that writes files and prints)."""
    start: int
    """The step the run resumes from (0: a fresh run)."""
    past: list[dict[str, Any]]
    """The metrics rows logged before `start` (a resumed run's)."""
    problems: Callable[[int], list[tuple[Task, Problem]]]
    """step -> the step's drawn problems (round 0, every process's), known before training."""
    limits: Any
    """The episode limits of the run (`temper.rollout.loop.EpisodeLimits`)."""


@dataclass
class Step:
    """One step as the hooks see it."""

    step: int
    """1-based."""
    groups: list[Group]
    """The step's trained groups, every process's (gathered)."""
    local: list[Group]
    """This process's share of `groups`: the rows of its batch."""
    graded: list[Group]
    """Every group this process graded this step, all sampling rounds, the dropped ones too."""
    causes: list[str | None] = field(default_factory=list)
    """The zero-variance cause of every first-round group of the step (None: its rewards differ),
    every process's."""
    failed: list[GroupFailure] = field(default_factory=list)
    """The groups left out of the step because user code failed or hung (or the chat template
    re-rendered the history), every process's."""


@dataclass
class BatchExtras:
    """What the features give `prepare` beside a step's batch (the batch itself is never written)."""

    inputs: dict[str, Any] = field(default_factory=dict)
    """Named estimator inputs (`temper.algorithms.estimators.Estimator.inputs`)."""
    reference_prompts: list[list[int]] | None = None
    """Per row, the prompt the reference reads instead of the row's own (OPSD's teacher context)."""
    correction: Any = None
    """The sampler/trainer mismatch correction (`temper.algorithms.mismatch.Correction`): with it,
    `prepare` computes the trainer's logprobs at sampling time, logs the mismatch and, unless its
    mode is off, weights the policy loss (the `rollout_correction` feature)."""

    def merge(self, other: BatchExtras) -> BatchExtras:
        if self.reference_prompts is not None and other.reference_prompts is not None:
            raise ValueError("two features give the reference its prompts")
        if self.correction is not None and other.correction is not None:
            raise ValueError("two features correct the sampler/trainer mismatch")
        return BatchExtras(
            self.inputs | other.inputs,
            self.reference_prompts if other.reference_prompts is None else other.reference_prompts,
            self.correction if other.correction is None else other.correction,
        )


class Hooks:
    """A feature's part in one run; every hook here does nothing."""

    rounds: int = 1
    """Sampling rounds a step may take (dynamic sampling refills the groups `keep` drops)."""

    def sampler(self, sampler: Sampler) -> Sampler:
        """The sampler training draws from (e.g. one that forces the first token)."""
        return sampler

    def envs(self, envs_G_N: list[list[Any]]) -> list[list[Any]]:
        """The envs a sampling round plays, [group][sample] (e.g. proxies of envs held by worker
        processes, `workers`); called by `collect.sample_share` just before the episodes run."""
        return envs_G_N

    def close(self) -> None:
        """At the end of the run, whatever ended it: release what the hooks hold (worker processes)."""

    def keep(self, group: Group) -> bool:
        """Whether a graded group is trained on (False: dropped, and refilled while rounds last)."""
        return True

    def after_grading(self, step: Step) -> dict[str, Any]:
        """Once the step's groups are graded and gathered: its metrics (empty step too)."""
        return {}

    def extras(self, step: Step, batch: RolloutBatch) -> BatchExtras:
        """On this process's batch before advantages: what the estimator or the reference reads."""
        return BatchExtras()

    def after_step(self, step: Step, row: dict[str, Any]) -> dict[str, Any]:
        """At the end of the step, from its whole row (eval included): more metrics."""
        return {}


def _no_errors(*args: Any) -> list[Error]:
    return []


def _nothing(*args: Any) -> list[Any]:
    return []


def _unnamed(config: Any) -> str:
    return ""


def _no_summary(config: Any, folder: Callable[[str, str], Path]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class RLFeature:
    """One RL feature, as the recipe, the stage and the loop see it (see the module docstring)."""

    name: str
    """Its name, and its block's key in the rl stage's `train:`."""
    block: Any = None
    """The block's type (a dataclass validated like the rest of the recipe; `X | None` for an
    optional block), a plain type for a one-value block, or None: the feature has no settings
    (it turns itself on, e.g. for a task that asks for it)."""
    doc: str = ""
    """The block's description (`temper rl --help`)."""
    default: Any = None
    """The block's default (a callable: a factory, for a mutable default)."""
    order: int = 100
    """Position among the features: hooks run in this order."""
    rules: Callable[[Any, StageView], list[Error]] = _no_errors
    """(train config, the stage) -> the rules it breaks, located below the stage."""
    task_rules: Callable[[Any, dict[str, Task]], list[Error]] = _no_errors
    """(train config, the stage's built tasks by name) -> the rules that need the tasks."""
    uses: Callable[[Any], list[Use]] = _nothing
    """What the block reads (a reward model, a judge's model): the stage hash covers them."""
    describe: Callable[[Any], str] = _unnamed
    """Its part of the stage's plan line (", reward model 'rm'"), or ''."""
    summary: Callable[[Any, Callable[[str, str], Path]], dict[str, Any]] = _no_summary
    """(train config, the stage's folder resolver) -> entries of the stage's rl.json."""
    hashed: Callable[[Any], dict[str, Any]] | None = None
    """The block as the stage hash covers it, as keys of `train:` (None: `{name: the block}`):
    how a block that replaced older flat keys hashes like them, so recorded runs stay complete."""
    moved: Callable[[dict[str, Any]], list[Error]] = _no_errors
    """(the raw `train:` mapping) -> its keys still written in the form `hashed` replaced, each
    with the form to write instead (checked before the block is validated)."""
    scorers: Callable[[Any, ScorerSetup], dict[str, GroupScorer]] | None = None
    """(train config, setup) -> the batch reward components it scores, by name (`rewards:` key)."""
    shape: Callable[[Any, int], Shaper | None] | None = None
    """(train config, the 1-based step) -> the term it adds to each group's rewards before the group's
    zero-variance cause is read, or None (off)."""
    start: Callable[[Any, RunStart], Hooks | None] | None = None
    """(train config, the run) -> its hooks for this run, or None (off)."""
    hashed_when_set: bool = False
    """Left out of the stage hash while at its default (a block added after runs were recorded)."""


def at(loc: Loc, errors: Sequence[Error]) -> list[Error]:
    """`errors` located below `loc` (e.g. a `train:` block's rules below ("train",))."""
    return [((*loc, *where), message) for where, message in errors]
