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
  ends with "bad_tokens", a failure graded and trained on like any wrong answer.

Round 0 samples all N episodes of a group that share a prompt with ONE call of n = N and the
group's seed, exactly as single-turn RL sampled its groups, so a task run as one-step `TaskEnv`s
gives the samples it gave before environments existed. Later rounds sample each episode with
n = 1 and a seed derived from (group seed, sample, round).

Why threads for environment steps, not processes: the slow environments are the sandboxed ones,
whose time is spent waiting on a subprocess (the GIL is released), and a thread needs no pickling
of the env. A step that runs past `step_timeout` ends its episode ("timeout") and the batch goes
on without waiting for it (its thread is abandoned; the sandbox's own wall-clock limit kills the
code it runs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from temper.data.chat import check_tool_template, prompt_ids
from temper.envs.base import Env, StepResult
from temper.rollout.sampler import Sample, Sampler, derive_seed
from temper.rollout.trajectory import Segment, StopReason, Trajectory


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

    @property
    def prompt_len(self) -> int:
        return len(self.trajectory.segments[0].token_ids)


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
    episodes: list[_Episode] = []
    if any(getattr(env, "tools", None) for envs in envs_G_N for env in envs):
        check_tool_template(tokenizer)  # a template without tool support fails here, not mid-batch
    for g, envs in enumerate(envs_G_N):
        for n, env in enumerate(envs):
            messages = [dict(m) for m in env.reset()]
            ids = prompt_ids(tokenizer, messages, getattr(env, "tools", None))
            episodes.append(_Episode(env, g, n, Trajectory([Segment(ids, None, False)]), list(ids), messages))
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="temper-env")
    try:
        rnd = 0
        while live := [e for e in episodes if e.live]:
            _sample_round(sampler, tokenizer, live, seeds, limits, rnd, temperature, top_p)
            _step_round(pool, tokenizer, live, limits)
            rnd += 1
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    out: list[list[Trajectory]] = [[] for _ in envs_G_N]
    for e in episodes:
        out[e.group].append(e.trajectory)
    return out


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
            left = limits.token_budget - (len(unit[0].ids) - unit[0].prompt_len)
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
                e.trajectory.segments.append(Segment(list(s.token_ids), list(s.logprobs), True, e.actions))
                e.ids += s.token_ids


def _step_round(
    pool: ThreadPoolExecutor, tokenizer: PreTrainedTokenizerBase, live: list[_Episode], limits: EpisodeLimits
) -> None:
    """Step every live episode's env with its new action and apply the answers."""
    actions = {id(e): action_text(e.last, tokenizer, e.env.stop) for e in live}
    results: dict[int, StepResult | StopReason] = {}
    seconds: dict[int, float] = {}  # each episode's own step time (a batch's time is split evenly)
    # envs that step as a batch (TaskEnv: one grade_batch call per group, as TRL calls reward functions)
    batched: dict[tuple, list[_Episode]] = {}
    threaded: list[_Episode] = []
    for e in live:
        if hasattr(type(e.env), "step_batch"):
            # an env class may batch across groups (a simulator LM: one call for the whole round)
            across = getattr(type(e.env), "batch_across_groups", False)
            batched.setdefault((type(e.env), -1 if across else e.group), []).append(e)
        else:
            threaded.append(e)
    futures = {pool.submit(_timed, e.env.step, actions[id(e)]): e for e in threaded}
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
                e.trajectory.signals.append({"error": repr(err)})
        seconds.update({id(e): (time.perf_counter() - t0) / len(members) for e in members})
    done, not_done = wait_futures(futures, timeout=limits.step_timeout)
    for f in done:
        e = futures[f]
        try:
            results[id(e)], seconds[id(e)] = f.result()
        except Exception as err:
            results[id(e)] = "env_error"
            e.trajectory.signals.append({"error": repr(err)})
    for f in not_done:
        results[id(futures[f])] = "timeout"
        seconds[id(futures[f])] = limits.step_timeout
    for e in live:
        e.trajectory.seconds_in_env += seconds.get(id(e), 0.0)
        _apply(e, results[id(e)], actions[id(e)], tokenizer, limits)


def _round_trips(tokenizer: PreTrainedTokenizerBase, sample: Sample) -> bool:
    """Whether the sampled turn is text: its tokens (its final stop id aside) hold no special token
    and are what encoding their decoded text gives. A turn with a stray special token or broken
    bytes cannot be rendered back as the same tokens by any template: the policy's doing."""
    ids = list(sample.token_ids[:-1] if sample.stop_reason == "eos" else sample.token_ids)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if text != tokenizer.decode(ids, skip_special_tokens=True):
        return False
    return tokenizer.encode(text, add_special_tokens=False) == ids


def _timed(step, action: str) -> tuple[StepResult, float]:
    t0 = time.perf_counter()
    result = step(action)
    return result, time.perf_counter() - t0


def _apply(
    e: _Episode,
    result: StepResult | StopReason,
    action: str,
    tokenizer: PreTrainedTokenizerBase,
    limits: EpisodeLimits,
) -> None:
    e.actions += 1
    e.trajectory.last_stop = e.last.stop_reason
    if isinstance(result, str):  # the env failed or hung
        return _end(e, result, action)
    e.trajectory.step_rewards.append(float(result.reward))
    e.trajectory.signals.append(dict(result.signals))
    if result.done:
        e.trajectory.score = result.score
        return _end(e, "done", action)
    if len(e.ids) - e.prompt_len >= limits.token_budget:
        return _end(e, "max_tokens", action)
    if e.last.stop_reason == "length":  # an unfinished turn: nothing sensible can follow it
        return _end(e, "length", action)
    if e.actions >= limits.max_turns:
        return _end(e, "max_turns", action)
    if result.inline is not None:
        delta = tokenizer.encode(result.inline, add_special_tokens=False)
        e.turn_text += action + result.inline
    else:
        e.messages += [{"role": "assistant", "content": e.turn_text + action}, *result.messages]
        e.turn_text = ""
        full = prompt_ids(tokenizer, e.messages, getattr(e.env, "tools", None))
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
    if len(e.ids) - e.prompt_len >= limits.token_budget:
        _end(e, "max_tokens", "")


CUT = ("max_tokens", "max_turns", "length", "not_prefix", "bad_tokens")
"""Stop reasons for which the loop, not the env, ended a sound episode: the env's `cut` is asked
for its end-of-episode signals (envs/base.py)."""


def _end(e: _Episode, reason: StopReason, action: str) -> None:
    e.live = False
    cut = getattr(e.env, "cut", None)
    if cut is not None and reason in CUT:
        last = e.trajectory.signals[-1] if e.trajectory.signals else {}
        for k, v in cut(reason).items():  # added to the last step's (its rewards stay aligned)
            last[k] = last[k] + v if isinstance(last.get(k), int | float) else v
        if not e.trajectory.signals:
            e.trajectory.signals.append(last)
    close = getattr(e.env, "close", None)
    if close is not None:  # the env's resources (a sandbox workspace), whatever ended the episode
        close()
    e.trajectory.stop_reason = reason
    if e.turn_text or action:
        e.messages.append({"role": "assistant", "content": e.turn_text + action})
    e.trajectory.messages = e.messages
