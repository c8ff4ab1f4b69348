"""The agent loop: run a batch of episodes in lockstep, one batched sampler call per round.

    trajectories = run_episodes(sampler, tokenizer, envs_G_N, seeds, limits)   # [group][sample]

Each round samples the next action of every live episode in one `Sampler.sample` call (grouped
only by stop strings), steps their environments (in worker threads, each step under a time
limit), appends what the environments answer, and drops finished episodes. Token bookkeeping:
- the policy's sampled ids are appended verbatim, with their logprobs (never re-tokenized);
- an `inline` answer is tokenized on its own and appended inside the same assistant turn;
- `messages` end the assistant turn: the conversation is re-rendered with the chat template (with
  the env's `tools`, JSON schemas, when it has them: chat tool calls, `envs/tool_env.py`) and
  the tokens it adds after what the episode already holds are appended (the template's end of
  turn when sampling stopped at a stop string, the new turns, the next assistant header). When
  the re-rendered conversation does not start with the episode's tokens (a template that rewrites
  earlier turns, or a sampled tokenization the template would not produce) the episode ends with
  stop reason "not_prefix" instead of training on misaligned logprobs; when the reason is the
  policy's own turn (a stray special token or broken bytes, which no template renders back) it
  ends with "bad_tokens", a failure graded and trained on like any wrong answer;
- a `history` (the env's whole conversation from now on: an agent that rewrote or dropped
  earlier turns) is rendered likewise; when it does not extend the episode's tokens it starts a
  new row of the trajectory (`Trajectory.rows`), its rendering that row's prompt, and the
  episode goes on there. The token budget counts every row's tokens after its prompt.

Round 0 samples all N episodes of a group that share a prompt with ONE call of n = N and the
group's seed, exactly as single-turn RL sampled its groups, so a task run as one-step `TaskEnv`s
gives the samples it gave before environments existed. Later rounds sample each episode with
n = 1 and a seed derived from (group seed, sample, round).

Environments are user code (`temper.guard`): every `reset` (with the factory of a user's env,
which runs then), `step`, `cut` and `close` runs in a daemon thread of its own, at most `workers`
at once, `reset`, `cut` and `close` under the user-code time limit (`guard.timeout_s()`) and
`step` under `step_timeout`. One that raises ends its episode with stop reason "env_error", one
that runs past its limit with "timeout", and either way the last step's `signals["error"]` is one
line naming the env, the method and what went wrong; the batch goes on without waiting (a hung
call's thread is abandoned; the sandbox's own wall-clock limit kills the code it runs). A step
that returns something other than a `StepResult`, or a non-finite reward, is an env_error too.
Batched envs (`step_batch`: TaskEnv grading a group in one call) are stepped in this thread; the
user code they call (a data task's reward functions) is guarded where it is called.

Why threads, not processes: the slow environments are the sandboxed ones, whose time is spent
waiting on a subprocess (the GIL is released), and a thread needs no pickling of the env. Envs
that compute in Python, or live on other machines, are played in worker processes or Ray actors
by handing this loop proxies of them (`temper.rollout.env_workers`, `train.workers`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from temper import guard
from temper.data.chat import check_tool_template, prompt_ids
from temper.envs.base import (
    Closable,
    Cuttable,
    DescribesCalls,
    Env,
    GradesSummaries,
    Labelled,
    StepResult,
    StepsInBatch,
    TaskEnv,
    context_of,
    tools_of,
)
from temper.rollout.context import ContextPolicy, summarised, summary_request, truncated
from temper.rollout.sampler import Sample, Sampler, derive_seed
from temper.rollout.trajectory import Segment, StopReason, Trajectory
from temper.tasks.base import Score

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class EpisodeLimits:
    """max_turns: actions per episode (each `Env.step` is one). max_tokens: policy + environment
    tokens after the prompt (0: max_turns x max_new_tokens). max_new_tokens: per sampler call.
    step_timeout: seconds one `Env.step` may take."""

    max_turns: int = 8
    max_tokens: int = 0
    max_new_tokens: int = 48
    step_timeout: float = 60.0

    @property
    def token_budget(self) -> int:
        return self.max_tokens or self.max_turns * self.max_new_tokens


@dataclass
class _Episode:
    env: Env
    group: int
    index: int
    trajectory: Trajectory
    ids: list[int]  # everything the policy has read and written so far
    messages: list[dict[str, Any]]  # the conversation as text
    turn_text: str = ""  # the current assistant turn's text so far (policy + inline answers)
    actions: int = 0
    live: bool = True
    last: Sample | None = field(default=None, repr=False)
    context: ContextPolicy | None = None  # the env's context budget (`rollout/context.py`)
    summarising: bool = False  # the next sample is a summary the harness asked for, not an action

    @property
    def used(self) -> int:
        """Policy and environment tokens after the prompts, over every row: what the budget counts."""
        return sum(len(s.token_ids) for s in self.trajectory.segments[1:] if not s.starts_row)


def action_text(sample: Sample, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str]) -> str:
    """The text an environment acts on: the sample's text and, when a stop string ended it, that
    string (the sampler cuts it off, but `</code>` is part of the action)."""
    if sample.stop_reason != "stop":
        return sample.text
    full = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
    tail = full[len(sample.text) :]
    return sample.text + next((s for s in stop if tail.startswith(s)), "")


def run_episodes(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    envs_G_N: Sequence[Sequence[Env]],
    seeds: Sequence[int],
    limits: EpisodeLimits,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    workers: int = 16,
) -> list[list[Trajectory]]:
    """Play one episode in every env; -> trajectories[g][n]. `seeds[g]` is group g's seed."""
    if len(seeds) != len(envs_G_N):
        raise ValueError(f"got {len(seeds)} seeds for {len(envs_G_N)} groups")
    flat = [(g, n, env) for g, envs in enumerate(envs_G_N) for n, env in enumerate(envs)]
    resets = _resets([env for _, _, env in flat], workers)
    if any(tools_of(env) for (_, _, env), r in zip(flat, resets, strict=True) if r.ok):
        check_tool_template(tokenizer)  # a template without tool support fails here, not mid-batch
    episodes: list[_Episode] = []
    failed: list[_Episode] = []
    for (g, n, env), done in zip(flat, resets, strict=True):
        error = _failure(env, "reset", done, guard.timeout_s())
        messages = [] if error else _messages(done.value)
        ids: list[int] = []
        if messages is None:
            error = guard.returned(
                _what(env, "reset"), f"{type(done.value).__name__}, not a list of messages"
            ).line
        elif not error:
            try:
                ids = prompt_ids(tokenizer, messages, tools_of(env))
            except Exception as err:  # messages of the env's making that the chat template cannot render
                error = guard.raised(
                    err, f"the chat template, on the messages {_what(env, 'reset')} returned"
                ).line
        if error:  # the episode ends before it starts: no prompt, nothing sampled
            e = _Episode(env, g, n, Trajectory([Segment([], None, False)]), [], [], live=False)
            e.trajectory.seconds_in_env = done.seconds
            _end(e, "timeout" if done.timed_out else "env_error", "", error)
            failed.append(e)
        else:
            e = _Episode(env, g, n, Trajectory([Segment(ids, None, False)]), list(ids), messages)
            e.trajectory.seconds_in_env = done.seconds
            e.context = context_of(env)
        episodes.append(e)
    _close(failed, workers)
    rnd = 0
    while live := [e for e in episodes if e.live]:
        _sample_round(sampler, tokenizer, live, seeds, limits, rnd, temperature, top_p)
        _step_round(tokenizer, live, limits, workers)
        rnd += 1
    out: list[list[Trajectory]] = [[] for _ in envs_G_N]
    for e in episodes:
        out[e.group].append(e.trajectory)
    return out


def _resets(envs: list[Env], workers: int) -> list[guard.Done]:
    """Every env's `reset`: as user code (guarded, in parallel), but temper's own one-step
    `TaskEnv`, whose reset only renders its problem, here (a thread per sample would cost more
    than the reset)."""
    own = [isinstance(env, TaskEnv) for env in envs]
    guarded = iter(
        guard.run_all([e.reset for e, mine in zip(envs, own) if not mine], workers=workers, name="reset")
    )
    return [guard.Done(value=e.reset()) if mine else next(guarded) for e, mine in zip(envs, own)]


def _label(env: Any) -> str:
    """What a failure's line calls an env: its own `label` (a user's env names its factory), else its class."""
    return (env.label if isinstance(env, Labelled) else None) or type(env).__name__


def _what(env: Any, method: str) -> str:
    """What a failure's line calls a call of `env.<method>`."""
    if isinstance(env, DescribesCalls) and callable(env.describe):  # a `describe` string is no method
        return env.describe(method)
    return f"env {_label(env)}.{method}"


def _failure(env: Any, method: str, done: guard.Done, limit: float) -> str:
    """The line of a call of `env.<method>` that failed ('' when it did not); an env that says
    what its calls are (`describe(method)`: a user's env names its factory and problem) says so."""
    what = _what(env, method)
    if done.timed_out:
        return guard.timed_out(what, limit).line
    if done.error is not None:
        return guard.raised(done.error, what).line
    return ""


def _messages(value: Any) -> list[dict[str, Any]] | None:
    """A reset's chat prompt as a list of message dicts (None: it is not one)."""
    try:
        messages = [dict(m) for m in value]
    except (TypeError, ValueError):
        return None
    return messages if all(isinstance(m.get("role"), str) for m in messages) else None


def _sample_round(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    live: list[_Episode],
    seeds: Sequence[int],
    limits: EpisodeLimits,
    rnd: int,
    temperature: float,
    top_p: float,
) -> None:
    """Sample the next piece of every live episode: one sampler call per distinct (stop strings,
    token allowance), a group sharing its prompt sampled with n = N in round 0."""
    calls: dict[tuple, list[tuple[list[_Episode], int]]] = {}  # key -> (unit, seed) pairs
    for g in sorted({e.group for e in live}):
        members = [e for e in live if e.group == g]
        first = members[0]
        shared = all(e.ids == first.ids and tuple(e.env.stop) == tuple(first.env.stop) for e in members)
        if rnd == 0 and shared:  # one prompt, N samples: the group's seed, as single-turn RL had it
            units = [(members, seeds[g])]
        else:
            units = [([e], derive_seed(seeds[g], e.index, rnd)) for e in members]
        for unit, seed in units:
            left = limits.token_budget - unit[0].used
            if unit[0].summarising:  # a summary: it ends at the end of turn, not at the env's stop strings
                summary_max = unit[0].context.summary_max_tokens  # type: ignore[union-attr]
                key = ((), min(summary_max, left), len(unit))
            else:
                key = (tuple(unit[0].env.stop), min(limits.max_new_tokens, left), len(unit))
            calls.setdefault(key, []).append((unit, seed))
    for (stop, max_new, n), units in calls.items():
        samples = sampler.sample(
            [u[0].ids for u, _ in units],
            n,
            max_new_tokens=max_new,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop),
            seed=[seed for _, seed in units],
        )
        for (unit, _), unit_samples in zip(units, samples, strict=True):
            for e, s in zip(unit, unit_samples, strict=True):
                e.last = s
                e.trajectory.segments.append(
                    Segment(
                        list(s.token_ids),
                        list(s.logprobs),
                        True,
                        e.actions,
                        policy_version=s.policy_version,
                        why="summary" if e.summarising else "",
                    )
                )
                e.ids += s.token_ids


def _step_round(
    tokenizer: PreTrainedTokenizerBase, live: list[_Episode], limits: EpisodeLimits, workers: int
) -> None:
    """Step every live episode's env with its new action and apply the answers (an episode whose
    new sample is a summary the harness asked for goes on from it instead, `_apply_summaries`)."""
    if summaries := [e for e in live if e.summarising]:
        _apply_summaries(tokenizer, summaries, limits, workers)
        asked = {id(e) for e in summaries}
        live = [e for e in live if id(e) not in asked]
        if not live:
            return
    actions = {id(e): action_text(e.last, tokenizer, e.env.stop) for e in live}
    results: dict[int, StepResult | StopReason] = {}
    seconds: dict[int, float] = {}  # each episode's own step time (a batch's time is split evenly)
    errors: dict[int, str] = {}
    # envs that step as a batch (TaskEnv: one grade_batch call per group, as TRL calls reward functions)
    batched: dict[tuple, list[_Episode]] = {}
    threaded: list[_Episode] = []
    for e in live:
        if isinstance(e.env, StepsInBatch):
            # an env class may batch across groups (a simulator LM: one call for the whole round)
            across = getattr(type(e.env), "batch_across_groups", False)
            batched.setdefault((type(e.env), -1 if across else e.group), []).append(e)
        else:
            threaded.append(e)
    for (cls, _), members in batched.items():
        t0 = time.perf_counter()
        try:
            answers = cls.step_batch(
                [e.env for e in members],
                [actions[id(e)] for e in members],
                [e.last.token_ids for e in members],
            )
            results.update({id(e): r for e, r in zip(members, answers, strict=True)})
        except Exception as err:  # an infrastructure error: counted, never a reward
            for e in members:
                results[id(e)] = "env_error"
                errors[id(e)] = guard.raised(err, f"env {cls.__name__}.step_batch").line
        seconds.update({id(e): (time.perf_counter() - t0) / len(members) for e in members})
    steps = guard.run_all(
        [lambda e=e: e.env.step(actions[id(e)]) for e in threaded], limits.step_timeout, workers, "step"
    )
    for e, done in zip(threaded, steps, strict=True):
        seconds[id(e)] = done.seconds
        if done.ok:
            results[id(e)] = done.value
        else:
            results[id(e)] = "timeout" if done.timed_out else "env_error"
            errors[id(e)] = _failure(e.env, "step", done, limits.step_timeout)
            if done.timed_out:
                errors[id(e)] += " (step_timeout)"
    for e in live:
        result = results[id(e)]
        if isinstance(result, str):
            continue
        if (bad := _bad_result(result)) is not None:
            errors[id(e)] = guard.returned(_what(e.env, "step"), bad).line
            results[id(e)] = "env_error"
    ended = []
    for e in live:
        e.trajectory.seconds_in_env += seconds.get(id(e), 0.0)
        _apply(e, results[id(e)], actions[id(e)], tokenizer, limits, errors.get(id(e), ""))
        if not e.live:
            ended.append(e)
    _close(ended, workers)


def _bad_result(result: Any) -> str | None:
    """What is wrong with what a step returned, in words (None: it is a sound `StepResult`)."""
    if not isinstance(result, StepResult):
        return f"{type(result).__name__}, not a StepResult"
    try:
        finite = math.isfinite(float(result.reward))
    except (TypeError, ValueError):
        finite = False
    if not finite:
        return f"a non-finite reward ({result.reward!r})"
    if not isinstance(result.signals, dict):
        return f"signals of type {type(result.signals).__name__}, not a dict"
    if result.score is not None and not isinstance(result.score, Score):
        return f"a score of type {type(result.score).__name__}, not a Score"
    if result.inline is not None and not isinstance(result.inline, str):
        return f"inline text of type {type(result.inline).__name__}, not a str"
    if not isinstance(result.messages, list) or not all(isinstance(m, dict) for m in result.messages):
        return "messages that are not a list of {role, content} dicts"
    history = result.history
    if history is not None and not (isinstance(history, list) and all(isinstance(m, dict) for m in history)):
        return "a history that is not a list of {role, content} dicts"
    return None


def _round_trips(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> bool:
    """Whether the sampled turn is text: its tokens (its final stop id aside) hold no special token
    and are what encoding their decoded text gives. A turn with a stray special token or broken
    bytes cannot be rendered back as the same tokens by any template: the policy's doing."""
    ids = list(sample.token_ids[:-1] if sample.stop_reason == "eos" else sample.token_ids)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if text != tokenizer.decode(ids, skip_special_tokens=True):
        return False
    return tokenizer.encode(text, add_special_tokens=False) == ids


def _apply(
    e: _Episode,
    result: StepResult | StopReason,
    action: str,
    tokenizer: PreTrainedTokenizerBase,
    limits: EpisodeLimits,
    error: str = "",
) -> None:
    e.actions += 1
    e.trajectory.last_stop = e.last.stop_reason
    if isinstance(result, str):  # the env failed or hung: `error` says how
        return _end(e, result, action, error)
    e.trajectory.step_rewards.append(float(result.reward))
    e.trajectory.signals.append(dict(result.signals))
    if result.done:
        e.trajectory.score = result.score
        return _end(e, "done", action)
    if e.used >= limits.token_budget:
        return _end(e, "max_tokens", action)
    if e.last.stop_reason == "length":  # an unfinished turn: nothing sensible can follow it
        return _end(e, "length", action)
    if e.actions >= limits.max_turns:
        return _end(e, "max_turns", action)
    if result.history is not None:  # the env's conversation from now on (a rewritten history)
        e.messages, e.turn_text = [dict(m) for m in result.history], ""
        try:
            full = prompt_ids(tokenizer, e.messages, tools_of(e.env))
        except Exception as err:  # messages of the env's making that the chat template cannot render
            line = guard.raised(
                err, f"the chat template, on the history {_what(e.env, 'step')} returned"
            ).line
            return _end(e, "env_error", "", line)
        if full[: len(e.ids)] != e.ids:  # a new row: its prompt is the rendering, nothing re-tokenised
            e.trajectory.segments.append(Segment(list(full), None, False, starts_row=True))
            e.ids = list(full)
            return
        delta = full[len(e.ids) :]
    elif result.inline is not None:
        delta = tokenizer.encode(result.inline, add_special_tokens=False)
        e.turn_text += action + result.inline
    else:
        e.messages += [{"role": "assistant", "content": e.turn_text + action}, *result.messages]
        e.turn_text = ""
        try:
            full = prompt_ids(tokenizer, e.messages, tools_of(e.env))
            if e.context is not None and _overflows(full, e.context, limits):
                if e.context.on_overflow == "truncate":
                    return _truncate(e, e.context, tokenizer, limits)
                if e.context.on_overflow == "end":  # a hard budget: the policy had to keep within it
                    e.trajectory.signals[-1]["context_overflow"] = 1
                    return _end(e, "max_tokens", "")
                e.messages.append(summary_request(e.context))  # the request ends the env's segment
                e.summarising = True
                full = prompt_ids(tokenizer, e.messages, tools_of(e.env))
        except Exception as err:  # messages of the env's making that the chat template cannot render
            line = guard.raised(
                err, f"the chat template, on the messages {_what(e.env, 'step')} returned"
            ).line
            return _end(e, "env_error", "", line)
        if full[: len(e.ids)] != e.ids:
            if not _round_trips(tokenizer, e.last):  # the policy wrote what text cannot hold
                e.trajectory.signals[-1]["error"] = (
                    "the turn's tokens do not survive a round trip through text"
                )
                return _end(e, "bad_tokens", "")
            e.trajectory.signals[-1]["error"] = (
                "the chat template re-renders the history differently from the sampled tokens"
            )
            return _end(e, "not_prefix", "")
        delta = full[len(e.ids) :]
    e.trajectory.segments.append(Segment(delta, None, False))
    e.ids += delta
    if e.used >= limits.token_budget:
        _end(e, "max_tokens", "")


def _overflows(full: list[int], policy: ContextPolicy, limits: EpisodeLimits) -> bool:
    """Whether the row, at `full` tokens, could not hold the next sampler call: time to compact
    (a summary the harness then asks for is sampled past the budget, `rollout/context.py`)."""
    return len(full) + limits.max_new_tokens > policy.max_tokens


def _new_row(
    e: _Episode, history: list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase, why: str
) -> None:
    """Go on from a compacted conversation: its rendering is the prompt of a new row."""
    e.messages, e.turn_text = history, ""
    e.ids = prompt_ids(tokenizer, history, tools_of(e.env))
    e.trajectory.segments.append(Segment(list(e.ids), None, False, starts_row=True, why=why))
    _count(e, "compactions", 1.0)


def _count(e: _Episode, signal: str, value: float) -> None:
    """Add `value` to the last step's numeric `signal` (the eval summary and the RL metrics sum them)."""
    last = e.trajectory.signals[-1]
    last[signal] = last.get(signal, 0) + value


def _truncate(
    e: _Episode, policy: ContextPolicy, tokenizer: PreTrainedTokenizerBase, limits: EpisodeLimits
) -> None:
    """Compact by dropping the oldest turns (`context.truncated`): a new row of what fits."""
    tools = tools_of(e.env)

    def fits(history: list[dict[str, Any]]) -> bool:
        return len(prompt_ids(tokenizer, history, tools)) + limits.max_new_tokens <= policy.max_tokens

    _new_row(e, truncated(e.messages, fits), tokenizer, "truncate")


def _apply_summaries(
    tokenizer: PreTrainedTokenizerBase, summaries: list[_Episode], limits: EpisodeLimits, workers: int
) -> None:
    """Each episode's new sample is the summary its harness asked for: graded when its env grades
    summaries (user code, guarded, in parallel; a failure or hang ends the episode like a failed
    step), then the episode goes on in a new row from the head, the summary and the latest
    observation (`context.summarised`). The summary is never sent to the env's `step`."""
    texts = {id(e): e.last.text for e in summaries}  # type: ignore[union-attr]
    graded = [e for e in summaries if isinstance(e.env, GradesSummaries)]
    limit = guard.timeout_s()
    calls = [lambda e=e: e.env.summary_reward(texts[id(e)]) for e in graded]
    rewards = dict(zip(map(id, graded), guard.run_all(calls, limit, workers, "summary_reward"), strict=True))
    ended = []
    for e in summaries:
        e.summarising = False
        e.trajectory.summaries.append(texts[id(e)])
        e.messages.pop()  # the request: the new row starts from the conversation before it
        if (done := rewards.get(id(e))) is not None:
            error = _failure(e.env, "summary_reward", done, limit)
            value = done.value if done.ok else None
            if not error and not (isinstance(value, int | float) and math.isfinite(value)):
                error = guard.returned(_what(e.env, "summary_reward"), f"{value!r}, not a finite number").line
            if error:
                _end(e, "timeout" if done.timed_out else "env_error", "", error)
                ended.append(e)
                continue
            e.trajectory.summary_rewards.append(float(value))
            _count(e, "summary_reward", float(value))
        _count(e, "summaries", 1.0)
        try:
            _new_row(e, summarised(e.messages, texts[id(e)]), tokenizer, "summary")
        except Exception as err:  # a summary the chat template cannot render
            _end(
                e,
                "env_error",
                "",
                guard.raised(err, "the chat template, on the summarised conversation").line,
            )
            ended.append(e)
            continue
        if e.used >= limits.token_budget:
            _end(e, "max_tokens", "")
            ended.append(e)
    _close(ended, workers)


CUT = ("max_tokens", "max_turns", "length", "not_prefix", "bad_tokens")
"""Stop reasons for which the loop, not the env, ended a sound episode: the env's `cut` is asked
for its end-of-episode signals (envs/base.py)."""


def _end(e: _Episode, reason: StopReason, action: str, error: str = "") -> None:
    """End the episode; its env's `cut` and `close` run afterwards, for all the round's ended
    episodes at once (`_close`). A failed or hung env's `error` goes into the last step's signals
    (a step of its own when the env never answered one)."""
    e.live = False
    e.trajectory.stop_reason = reason
    if error:
        e.trajectory.signals.append({"error": error})
    if e.turn_text or action:
        e.messages.append({"role": "assistant", "content": e.turn_text + action})
    e.trajectory.messages = e.messages


def _close(ended: list[_Episode], workers: int) -> None:
    """The ended episodes' envs' `cut` (when the loop, not the env, ended a sound episode) and
    `close` (whatever ended it: a sandbox workspace is freed), run as user code, all at once. The
    cut's signals are added to the last step's (its rewards stay aligned); a cut or close that
    fails or hangs makes the episode an env_error (or timeout) naming it."""

    def finish(e: _Episode) -> dict[str, Any]:
        signals: dict[str, Any] = {}
        if isinstance(e.env, Cuttable) and e.trajectory.stop_reason in CUT:
            signals = dict(e.env.cut(e.trajectory.stop_reason) or {})
        if isinstance(e.env, Closable):
            e.env.close()
        return signals

    calls = [e for e in ended if isinstance(e.env, Closable | Cuttable)]
    limit = guard.timeout_s()
    for e, done in zip(
        calls, guard.run_all([lambda e=e: finish(e) for e in calls], limit, workers, "close"), strict=True
    ):
        t = e.trajectory
        if not done.ok:
            t.stop_reason = "timeout" if done.timed_out else "env_error"
            t.signals.append({"error": _failure(e.env, "cut/close", done, limit)})
            continue
        if done.value:
            last = t.signals[-1] if t.signals else {}
            for k, v in done.value.items():
                last[k] = last[k] + v if isinstance(last.get(k), int | float) else v
            if not t.signals:
                t.signals.append(last)
