"""The environment interface of agent RL: a single-use episode that the policy acts in, turn by turn.

    env = task.make_env(problem)          # or TaskEnv(task, problem) for any single-turn Task
    messages = env.reset()                # the chat prompt the policy sees first
    result = env.step(action_text)        # -> StepResult(messages | inline, done, reward, signals, score)

Two ways an environment answers (the two tool protocols of agent RL):
- `messages`: new chat turns (a `user` observation, `tool` results) rendered with the chat template
  after the policy's assistant turn; the policy then writes a new assistant turn.
- `inline`: text appended verbatim inside the SAME assistant turn (ReTool's `<interpreter>...`
  after a `<code>` block, Feng et al. 2025); the policy continues that turn. `stop` lists the
  strings at which sampling pauses so the environment can answer (e.g. "</code>").

Rewards: `StepResult.reward` is a per-step process reward (e.g. for getting closer); the outcome is
the `score` (the verifier's grade: reward, correct, parsed) of the last step. The trainer combines
them with the recipe's weights (`process` and `outcome` reward components), and logs each apart.
`signals` are named, verifiable facts about the step (a tool error, a bump into a wall), logged.

An env is used for one episode: `reset` once, then `step` until `done`. It never raises on model
output (a bad action is an observation or a penalty); an exception from `reset` or `step` (or
either running past its time limit) is an infrastructure error that ends the episode with stop
reason "env_error" (or "timeout") and one line saying what failed in the last step's
`signals["error"]`, never a silent zero. The agent loop calls every env method as user code
(`temper.guard`): under a time limit, in a thread of its own.

Optional, `cut(reason) -> signals` (the `Cuttable` protocol below, with the env's other optional
capabilities: `close`, `tools`, `step_batch`, `label`, `describe`): the agent loop ended the
episode before the env did (its token budget, turn limit, an unfinished turn, a turn it could not
render: stop reasons max_tokens, max_turns, length, not_prefix, bad_tokens; never after env_error
or timeout, when the env's state is unknown or its step still running). The env returns the
end-of-episode signals that are still verifiable (a workspace rule kept or broken over the
episode), which the loop adds to the last step's signals; the score stays None (the episode was
not finished). Called once, before `close`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from temper import guard
from temper.guard import UserCodeFailure
from temper.rollout.context import ContextPolicy
from temper.tasks.base import Problem, Score, Task, grade, grade_batch


@dataclass
class StepResult:
    """What the environment returns after one action.

    messages: chat turns to append after the assistant's turn (observations, tool results).
    inline: text to append inside the assistant's turn instead (the policy continues it); at most
        one of `messages` and `inline` is given, and neither when `done`.
    done: the episode is over.
    reward: this step's process reward (0 when the env gives none).
    signals: named facts about the step (numbers, booleans, short strings) for logs and rewards.
    score: the outcome grade, on the last step (None before, and for envs that only give rewards).
    history: the whole conversation from now on, instead of `messages` (an agent that rewrote,
        dropped or summarised earlier turns, `envs/gateway_env.py`): the agent loop renders it
        and, when its tokens do not extend the episode's, starts a new training row with it as
        that row's prompt (`Trajectory.rows`), never re-tokenising what was sampled.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    inline: str | None = None
    done: bool = False
    reward: float = 0.0
    signals: dict[str, Any] = field(default_factory=dict)
    score: Score | None = None
    history: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.messages and self.inline is not None:
            raise ValueError("a StepResult has either messages or inline text, not both")
        if self.history is not None and (self.messages or self.inline is not None or self.done):
            raise ValueError("a StepResult with a history has no messages, inline text or done")


@runtime_checkable
class Env(Protocol):
    """One episode. `stop`: strings at which sampling pauses for `step` (besides the end of turn)."""

    stop: Sequence[str]

    def reset(self) -> list[dict[str, Any]]:
        """The chat prompt of the episode (system and user turns, no assistant turn)."""
        ...

    def step(self, action: str) -> StepResult:
        """Act on the policy's text since the last step (its assistant turn, or the part of it
        since the last inline answer). Never raises on model output."""
        ...


# What an env, or an environment task, may do besides the members of `Env` / `Task`: one protocol
# per optional capability, checked with `isinstance` where it is used. Runtime-checkable protocols
# look at the members only, so a user's class that has them is one without subclassing anything; a
# method set to None counts as absent. The task capabilities that need no env are in
# `temper.tasks.base` (`BatchScored`, `SamplesAtStep`, `DeclaresPathSignals`, ...).


@runtime_checkable
class EnvTask(Protocol):
    """An environment task: each problem is played as an episode of the env `make_env` returns,
    not graded as one answer. Implemented by `calculator_arithmetic`, `treasure_hunt`,
    `multi_tool`, `orchestrator`, `code_repair`, `simulated_search` and `EnvDataTask` (a data task with `env:`),
    or any class with the method; `make_env` below calls it (a `TaskEnv` for other tasks), and
    evaluation, the sft / rft / prompt_distill / eval stages and the RL features that need
    single-turn answers tell environment tasks apart with it."""

    def make_env(self, problem: Problem) -> Env: ...


@runtime_checkable
class TurnLimited(Protocol):
    """An environment task's own limit on an episode's assistant turns. Implemented by the
    environment tasks (a data task's `max_turns:` option); read by `evaluate` (default 8)."""

    max_turns: int


@runtime_checkable
class EpisodeTokenLimited(Protocol):
    """An environment task's own budget of tokens per episode (policy and environment tokens after
    the prompts, every row's), for episodes longer than max_turns x max_new_tokens: a context
    budget compacts them, so they hold many observations. Implemented by `memory_corridor`; read by
    `evaluate` (default: max_turns x max_new_tokens)."""

    max_episode_tokens: int


@runtime_checkable
class OffersTools(Protocol):
    """An env (or an environment task, for its demonstrations) whose prompts show tool schemas:
    `tools` (JSON schemas, HF's `apply_chat_template(tools=)`; None for none) is rendered into the
    prompt by the chat template. Implemented by `ToolEnv`, `MultiToolEnv`, `MultiToolTask` and
    the wrapper of a user's env (`envs/user_env.py`: its env's); read through `tools_of` by the
    agent loop (which first checks the template can render tools) and the sft stage."""

    tools: list[dict[str, Any]] | None


def tools_of(obj: Any) -> list[dict[str, Any]] | None:
    """The tool schemas an env or task offers; None for one that offers none."""
    return obj.tools if isinstance(obj, OffersTools) else None


@runtime_checkable
class ManagesContext(Protocol):
    """An env whose episodes run under a context budget (`temper.rollout.context.ContextPolicy`:
    truncate or ask the policy for a summary when a row would overflow). Implemented by
    `MemoryCorridorEnv` (its task's `context:` option); read by the agent loop through
    `context_of`, so training and evaluation play the env under the same budget."""

    context_budget: ContextPolicy | None


def context_of(env: Any) -> ContextPolicy | None:
    """The context budget an env's episodes run under; None when it has none (or it is off)."""
    policy = env.context_budget if isinstance(env, ManagesContext) else None
    # the protocol checks only that the member exists: a value of another kind is no budget
    return policy if isinstance(policy, ContextPolicy) and policy.on else None


@runtime_checkable
class GradesSummaries(Protocol):
    """An env that grades the policy's self-summaries (`summary_reward(text)` in [0, 1], e.g. the
    facts needed later are kept): the agent loop calls it, as user code, on every summary it
    samples, and the `summary` reward component is the episode's mean. Implemented by
    `MemoryCorridorEnv`."""

    def summary_reward(self, text: str) -> float: ...


@runtime_checkable
class Cuttable(Protocol):
    """An env with end-of-episode signals that stay verifiable when the agent loop ends the episode
    first (see the module docstring). Implemented by `CodeRepairEnv`, `OrchestratorEnv` and the wrapper of a user's
    env (passing it on to the user's env); called once by the agent loop, before `close`."""

    def cut(self, reason: str) -> dict[str, Any]: ...


@runtime_checkable
class Closable(Protocol):
    """An env that holds something to release after its episode (a sandbox, a tool server).
    Implemented by `CalculatorEnv`, `CodeRepairEnv`, the OpenEnv adapter and the wrapper of a
    user's env; called once by the agent loop when the episode ends, as user code."""

    def close(self) -> None: ...


@runtime_checkable
class StepsInBatch(Protocol):
    """An env class that steps many of its envs in one call (`type(env).step_batch(envs, actions,
    ids)`). Implemented by `TaskEnv` (one `grade_batch` per group) and `SimulatedSearchEnv` (one
    simulator call); called by the agent loop instead of each env's `step`. An optional class
    attribute `batch_across_groups = True` lets the loop put a whole round's envs of the class in
    one call instead of one per group (a flag with a default, read with getattr)."""

    @staticmethod
    def step_batch(
        envs: Sequence[Any], actions: Sequence[str], ids: Sequence[Sequence[int]]
    ) -> list[StepResult]: ...


@runtime_checkable
class Labelled(Protocol):
    """An env with its own name for failure lines (None or empty: its class name). Implemented by
    the wrapper of a user's env (the user's factory and class); read by the agent loop."""

    label: str


@runtime_checkable
class DescribesCalls(Protocol):
    """An env that says what a failure line calls one of its method calls (`describe("step")`).
    Implemented by the wrapper of a user's env (the factory while its env is not made yet, and
    the problem); read by the agent loop, which otherwise says `env <label>.<method>`."""

    def describe(self, method: str) -> str: ...


class TaskEnv:
    """Any single-turn `Task` as a one-step env: the prompt is the problem's, the one action is
    graded by the task's verifier, and the episode ends. Single-turn RL runs through the agent loop
    as this env, with the same samples and rewards as before environments existed."""

    stop: Sequence[str] = ()

    def __init__(self, task: Task, problem: Problem):
        self.task, self.problem = task, problem

    def reset(self) -> list[dict[str, Any]]:
        return self.problem.messages()

    def step(self, action: str) -> StepResult:
        return StepResult(done=True, score=grade(self.task, self.problem, action))

    @staticmethod
    def step_batch(
        envs: Sequence[TaskEnv], actions: Sequence[str], ids: Sequence[Sequence[int]]
    ) -> list[StepResult]:
        """Step many TaskEnvs of one task at once: one `grade_batch` call, so reward functions that
        take a batch (a data task's, as TRL calls them) get the whole group."""
        scores = grade_batch(envs[0].task, [e.problem for e in envs], list(actions), list(ids))
        return [StepResult(done=True, score=s) for s in scores]


def make_env(task: Task, problem: Problem) -> Env:
    """The env of one problem: the task's own (`task.make_env`) for an environment task, else a
    one-step `TaskEnv`. Never raises: a factory that fails gives a `FailedEnv`, which the agent
    loop ends at `reset` as an env_error with the failure's line (an episode, counted, never a
    crash of the batch)."""
    if not isinstance(task, EnvTask):
        return TaskEnv(task, problem)
    try:
        return task.make_env(problem)
    except Exception as err:  # the task's or the user's factory; KeyboardInterrupt still stops
        return FailedEnv(guard.raised(err, f"task {task.name!r} make_env", f"problem {problem.id}"))


def play_plan(env: Env, completion: str) -> Score | None:
    """A whole plan at once, as an environment task's `score` grades one completion: each non-empty
    line is one action, played from a fresh `reset`; the score of the step that ended the episode,
    None when the plan ran out first (the task grades that)."""
    env.reset()
    for action in (line for line in completion.splitlines() if line.strip()):
        result = env.step(action)
        if result.done:
            return result.score
    return None


class FailedEnv:
    """The env of a problem whose factory failed: `reset` raises the failure (`UserCodeFailure`),
    so the episode ends before it starts, as an env_error naming what failed."""

    stop: Sequence[str] = ()

    def __init__(self, failure: UserCodeFailure):
        self.failure = failure

    def reset(self) -> list[dict[str, Any]]:
        raise self.failure

    def step(self, action: str) -> StepResult:
        raise self.failure
