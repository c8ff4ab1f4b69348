"""A step's groups: draw problems -> run episodes -> grade, in this process's share.

Problems are a pure function of (seed, step, stream), and sample j of prompt i depends only on
its prompt's seed, so a resume replays a step exactly and N processes reproduce one. The
features decide how many sampling rounds a step may take and which graded groups are kept
(dynamic sampling), and shape a group's rewards as it is graded (path rewards).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from temper import distributed
from temper.envs.base import make_env
from temper.rewards.diagnostics import breakdown
from temper.rewards.judge import GroupScorer
from temper.rollout import Sampler
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import derive_seed
from temper.tasks.base import Problem, SamplesAtStep, Task
from temper.train.features import Features, Step, shapers
from temper.train.rollouts import Group, grade_episodes
from temper.train.user_code import GroupFailure, group_failure

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from transformers import PreTrainedTokenizerBase

    from temper.train.rl_config import RLConfig


def problems_for_step(
    tasks: list[Task], n: int, seed: int, step: int, stream: int = 0
) -> list[tuple[Task, Problem]]:
    """n training problems, a pure function of (seed, step, stream): resume replays them exactly.
    Stream 0 is the step's batch; refill rounds of dynamic sampling draw from other streams.
    A task with `sample_at_step` is told the step (a curriculum over training: the noise of
    `simulated_search`, the pool `code_repair` grows from failures): what changes with the step is
    part of the drawn problems."""
    out = []
    for i, task in enumerate(tasks):
        k = n // len(tasks) + (i < n % len(tasks))
        key = derive_seed(seed, step, stream, i)
        if isinstance(task, SamplesAtStep):
            drawn = task.sample_at_step("train", k, seed=key, step=step)
        else:
            drawn = task.sample("train", k, seed=key)
        out += [(task, p) for p in drawn]
    return out


def episode_limits(config: RLConfig) -> EpisodeLimits:
    return EpisodeLimits(
        config.max_turns, config.max_episode_tokens, config.max_new_tokens, config.step_timeout
    )


def sample_share(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    step: int,
    rank: int = 0,
    world: int = 1,
    graded: list[Group] | None = None,
    scorers: dict[str, GroupScorer] | None = None,
    features: Features | None = None,
) -> tuple[list[Group], list[str | None], int, list[GroupFailure]]:
    """This process's share of the step's groups, sampled and graded -> (groups, the zero-variance
    cause of every first-round group, sampling rounds, each group left out because user code (an
    environment, the grader) failed or hung, or the template rewrote the history).

    Round 0 is the step's global batch of `prompts_per_step` problems; process `rank` takes its
    contiguous share, and prompt i of the global batch is sampled with the seed of its global
    index, so a group is the same whichever process draws it (and the run equals one process at
    the same global batch). A group the features do not `keep` (dynamic sampling, DAPO, Yu et al.
    2025 §3.2: constant rewards) is dropped, and while the features allow more `rounds` EACH
    PROCESS REFILLS ITS OWN SHARE from its own problem stream, so no process waits for another
    while sampling; like DAPO, a refill round over-samples by the share of groups the previous
    round kept (at most 4x). `graded`, when given, receives every graded group of every round, the
    dropped ones included (a curriculum grows from the all-fail ones). `scorers` score the batch
    reward components (a reward model) once per round, over all its episodes."""
    features = features or Features([])
    share = distributed.share(config.prompts_per_step, rank, world)
    want = share.stop - share.start
    shape = shapers(config, step + 1)  # `step` is 0-based here, the hooks (and shapers) see it 1-based
    kept: list[Group] = []
    causes: list[str | None] = []
    failed: list[GroupFailure] = []
    rounds, keep_rate = 0, 1.0
    while len(kept) < want and rounds < features.rounds:
        need = want - len(kept)
        before = len(kept)
        if rounds == 0:
            stream, index = 0, range(config.prompts_per_step)[share]
            drawn = problems_for_step(tasks, config.prompts_per_step, config.seed, step)[share]
        else:
            stream = rounds * world + rank  # a stream per (round, process): refills never overlap
            draw = min(4 * need, math.ceil(need / max(keep_rate, 0.25)))
            index, drawn = range(draw), problems_for_step(tasks, draw, config.seed, step, stream)
        envs = [[make_env(task, problem) for _ in range(config.group_size)] for task, problem in drawn]
        envs = features.envs(envs)  # e.g. played by worker processes (train.workers)
        episodes = run_episodes(
            sampler,
            tokenizer,
            envs,
            [derive_seed(config.seed, step, stream, i) for i in index],
            episode_limits(config),
            temperature=config.temperature,
            top_p=config.top_p,
        )
        given = given_parts(scorers or {}, [p for _, p in drawn], episodes)
        for (_, problem), trajectories, parts in zip(drawn, episodes, given, strict=True):
            group = grade_episodes(
                problem,
                trajectories,
                config.rewards,
                config.max_new_tokens,
                config.overlong_buffer,
                parts,
                shape,
            )
            if (failure := group_failure(group, rounds == 0)) is not None:
                # user code that failed or hung (an env, the grader) is not the policy's doing: a
                # reward of 0 would teach it something false, so the group is left out (and counted)
                failed.append(failure)
                continue
            if graded is not None:
                graded.append(group)
            if rounds == 0:
                causes.append(group.cause)  # the breakdown describes the policy, before filtering
            if features.keep(group):
                kept.append(group)
        keep_rate = (len(kept) - before) / max(len(drawn), 1)
        rounds += 1
    return kept[:want], causes, rounds, failed


def given_parts(
    scorers: dict[str, GroupScorer], problems: list[Problem], episodes: list[list[Any]]
) -> list[list[dict[str, float]] | None]:
    """Per group, per episode, the values of the batch reward components (None: there are none),
    each scorer called once over the whole sampling round."""
    given: list[list[dict[str, float]] | None] = [None] * len(problems)
    for scorer in scorers.values():
        for g, parts in enumerate(scorer(problems, episodes)):
            given[g] = [a | b for a, b in zip(given[g] or [{}] * len(parts), parts, strict=True)]
    return given


def sampling_stats(causes: list[str | None], rounds: int, failed: list[GroupFailure]) -> dict[str, float]:
    """The zero-variance share of the step's first-round groups by cause, the sampling rounds,
    and `env_failed_groups`, the groups left out because user code failed or hung (an env, the
    grader: `user_code.LEFT_OUT`) or the chat template re-rendered the history differently from
    what was sampled (splitting such an episode into a second training row is not implemented)."""
    stats = breakdown(causes) | {"sampling_rounds": rounds}
    return stats | ({"env_failed_groups": len(failed)} if failed else {})


def collect_groups(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    tasks: list[Task],
    config: RLConfig,
    step: int,
    scorers: dict[str, GroupScorer] | None = None,
    features: Features | None = None,
    failed: list[GroupFailure] | None = None,
) -> tuple[list[Group], dict[str, float]]:
    """All `prompts_per_step` groups of a step in this process, with the step's sampling stats and
    what the features' `after_grading` makes of them (the reachability probe, tests); `failed`,
    when given, receives the groups left out (`user_code.GroupFailure`)."""
    features = features or Features([])
    graded: list[Group] = []
    kept, causes, rounds, left_out = sample_share(
        sampler, tokenizer, tasks, config, step, graded=graded, scorers=scorers, features=features
    )
    if failed is not None:
        failed += left_out
    stats = sampling_stats(causes, rounds, left_out)
    return kept, stats | features.after_grading(Step(step + 1, kept, kept, graded, causes, left_out))
