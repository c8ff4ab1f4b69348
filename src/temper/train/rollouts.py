"""From samples to training tensors: grade groups, apply reward components, batch, pack for the model.

Kept apart from the RL loop so the loop reads top to bottom: sample -> grade -> tensors ->
advantages -> update. A graded episode keeps its rewards apart by where they are credited (at
the end, per action, per token) and derives its total; the batch takes each part as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from temper.models.chat import shown_completion
from temper.rewards.components import RewardInput, combine
from temper.rewards.diagnostics import zero_variance_cause
from temper.rewards.process_reward_model import TokenRewards
from temper.rollout.sampler import Sample
from temper.rollout.trajectory import Segment, Trajectory, segment_records
from temper.tasks.base import Problem, Score, Task, grade_batch

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch


@dataclass
class Rollout:
    """One graded episode of a group (a single-turn sample is a one-step episode). Its reward is
    kept in three parts, by where the estimators credit it, and `reward` is their sum."""

    problem: Problem
    trajectory: Trajectory
    score: Score
    final_reward: float
    """The reward at the episode's end: the weighted components (outcome, format, overlong, a
    batch component's score) and the terms the features add to a group (the path term), without
    the per-step and per-token parts below."""
    parts: dict[str, float]  # unweighted reward components (and path: raw Phi, path_norm: its z-score)
    step_rewards: list[float] = field(default_factory=list)
    """The environment's per-step rewards x the `process` weight, one per action (0 for an action
    the environment never answered): what the turn-level estimators credit per turn."""
    token_rewards: dict[int, float] = field(default_factory=dict)
    """Weighted rewards on completion tokens (index into the completion ids -> reward), e.g. a
    process reward model's step scores on the tokens that end the steps (dense mode): what a
    per-token estimator (GAE) credits token by token."""

    @property
    def reward(self) -> float:
        """The episode's total (undiscounted) reward: final + per-step + per-token."""
        return self.final_reward + sum(self.step_rewards) + sum(self.token_rewards.values())

    @property
    def tokens(self) -> int:
        """Policy tokens (what the model wrote, environment tokens excluded)."""
        return self.trajectory.policy_tokens

    @property
    def stop(self) -> str:
        """How the episode ended: eos / stop / length for a finished episode (its last turn's
        stop), else the loop's reason (max_turns, max_tokens, timeout, env_error, not_prefix)."""
        t = self.trajectory
        return t.last_stop if t.stop_reason == "done" else t.stop_reason


@dataclass
class Group:
    rollouts: list[Rollout]
    cause: str | None = None  # why all rewards are equal (None: they differ)
    rewards: list[float] = field(default_factory=list)

    @property
    def outcome_all_fail(self) -> bool:
        """No episode is correct and all outcome rewards are equal, whatever the path term makes of
        the rewards: the RLVP paper's "all-fail group" (path signals can give it a signal)."""
        outcomes = [r.score.reward for r in self.rollouts]
        return not any(r.score.correct for r in self.rollouts) and max(outcomes) - min(outcomes) <= 1e-9


def one_step(sample: Sample, score: Score) -> Trajectory:
    """A single-turn sample as the trajectory the agent loop would have made of it."""
    return Trajectory(
        [
            Segment(list(sample.prompt_ids), None, False),
            Segment(list(sample.token_ids), list(sample.logprobs), True, 0),
        ],
        step_rewards=[0.0],
        signals=[{}],
        score=score,
        messages=[{"role": "assistant", "content": sample.text}],
        last_stop=sample.stop_reason,
    )


def grade_group(
    task: Task,
    problem: Problem,
    samples: list[Sample],
    weights: dict[str, float],
    max_new_tokens: int,
    overlong_buffer: int,
) -> Group:
    """A group of single-turn samples of one problem, graded in one call (a data task's reward
    functions take a batch, as TRL calls them); a verifier exception becomes a "verifier_error" row."""
    scores = grade_batch(
        task, [problem] * len(samples), [s.text for s in samples], [s.token_ids for s in samples]
    )
    trajectories = [one_step(s, score) for s, score in zip(samples, scores, strict=True)]
    return grade_episodes(problem, trajectories, weights, max_new_tokens, overlong_buffer)


class BatchScorer(Protocol):
    """Scores (prompt, completion) token sequences in batches, without gradients: a learned reward
    model (`temper.rewards.reward_model.RewardModel`) or anything with its `score`."""

    def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]], batch_size: int = 32
    ) -> list[float]: ...


def batch_scores(
    scorers: dict[str, BatchScorer], episodes: Sequence[Sequence[Trajectory]]
) -> list[dict[str, list[float]]]:
    """For each group of episodes, {batch component: one score per episode}. Each scorer is called
    once over all the episodes of a sampling round (the model runs in batches of its own size, not
    group by group); it reads the prompt and everything after it (in a multi-turn episode the
    environment's tokens too, as the policy saw them)."""
    out: list[dict[str, list[float]]] = [{} for _ in episodes]
    flat = [t for group in episodes for t in group]
    if not flat:
        return out
    for name, scorer in scorers.items():
        values = scorer.score([list(t.prompt_ids) for t in flat], [list(t.completion_ids) for t in flat])
        if len(values) != len(flat):
            raise ValueError(f"reward component {name!r}: {len(values)} scores for {len(flat)} episodes")
        it = iter(values)
        for i, group in enumerate(episodes):
            out[i][name] = [float(next(it)) for _ in group]
    return out


def model_scorer(name: str, scorer: BatchScorer):
    """A model that scores (prompt, completion) ids (a reward model) as the batch component `name`:
    (the round's problems, each one's episodes) -> per group, per episode, {name: score}, the form
    `grade_episodes` takes (`temper.rewards.judge.GroupScorer`)."""

    def score(problems: list[Problem], episodes: list[list[Trajectory]]) -> list[list[dict[str, float]]]:
        return [[{name: v} for v in group[name]] for group in batch_scores({name: scorer}, episodes)]

    return score


Shaper = Callable[[list[Rollout]], list[tuple[dict[str, float], float]]]
"""A group's graded episodes -> per episode (parts to log, a term added to its final reward): what
an RL feature adds to a group's rewards (the path term, `temper.train.features.path`)."""


def grade_episodes(
    problem: Problem,
    trajectories: list[Trajectory],
    weights: dict[str, float],
    max_new_tokens: int,
    overlong_buffer: int,
    given: list[dict[str, float]] | None = None,
    shapers: Sequence[Shaper] = (),
) -> Group:
    """A group of episodes of one problem -> rewards (the weighted components) and the zero-variance
    cause. An episode that ended without an outcome (a limit, a timeout, an environment error) is
    graded 0, not correct, not parsed, with the stop reason as the reason.

    Each reward is kept in its parts (`Rollout`): the `process` component goes per action
    (`step_rewards`), a dense batch component per token (`token_rewards`), the rest is the final
    reward. `given`: per episode, the values of batch reward components scored for the whole step
    beforehand (a judge's, `temper.rewards.judge.judge_scorer`), used by `combine` as they are. A
    value that is a `TokenRewards` (a process reward model's, dense) is logged as its total, and
    its rewards x the component's weight go on their tokens.

    `shapers` then add their terms to each episode's final reward, in order, e.g. RLVP's path
    term (beta x the path score z-scored within this group alone, `temper.train.features.path`).
    The zero-variance cause is of the total rewards: an all-wrong group whose path scores differ
    has a signal (`Group.outcome_all_fail` still counts it)."""
    rollouts = []
    for i, t in enumerate(trajectories):
        score = t.score or Score(0.0, False, False, {"reason": t.stop_reason})
        graded = t.summary_rewards
        x = RewardInput(
            score,
            t.policy_tokens,
            max_new_tokens,
            t.truncated,
            overlong_buffer,
            sum(t.step_rewards),
            sum(graded) / len(graded) if graded else 0.0,
        )
        values = given[i] if given else {}
        dense = {k: v for k, v in values.items() if isinstance(v, TokenRewards)}
        _, parts = combine(x, weights, {k: v.total if k in dense else v for k, v in values.items()})
        final = sum(w * parts[name] for name, w in weights.items() if name != "process" and name not in dense)
        steps = (t.step_rewards + [0.0] * t.turns)[: t.turns]
        on_tokens: dict[int, float] = {}
        for name, rewards in dense.items():
            for position, value in zip(rewards.positions, rewards.values, strict=True):
                on_tokens[position] = on_tokens.get(position, 0.0) + weights.get(name, 0.0) * value
        rollouts.append(
            Rollout(
                problem, t, score, final, parts, [weights.get("process", 0.0) * r for r in steps], on_tokens
            )
        )
    for shape in shapers:
        for r, (parts, term) in zip(rollouts, shape(rollouts), strict=True):
            r.parts |= parts
            r.final_reward += term
    rewards = [r.reward for r in rollouts]
    cause = zero_variance_cause(
        [r.score for r in rollouts], rewards, [r.trajectory.truncated for r in rollouts]
    )
    return Group(rollouts, cause, rewards)


@dataclass
class RolloutBatch:
    """R = groups x group_size sampled sequences, prompt-major (more when an episode is several
    rows, `episode_R`). The model reads each sequence whole (prompt + completion, see `pack`);
    every per-token tensor is (R, T) over completion tokens only, T = the longest completion:
    position t holds completion token t, whose logprob comes from the logits after prompt +
    completion[:t]. In a multi-turn episode the completion holds the environment's tokens too,
    and `mask_R_T` is False there."""

    prompts: list[list[int]]
    completions_R_T: torch.Tensor  # (R, T) token ids, 0 past each completion's end
    mask_R_T: torch.Tensor  # (R, T) bool: completion token t of row r is a policy token (trained on)
    # (R, T) the sampler's logprobs (the importance-ratio denominator), 0 past the end
    old_logprobs_R_T: torch.Tensor
    rewards_G_N: torch.Tensor  # (G, N) the final rewards (`Rollout.final_reward`)
    # (R, T) the action (turn) index of each completion token, -1 at environment tokens and padding
    turn_R_T: torch.Tensor | None = None
    # (R, K) the weighted process reward after action k (0 past the row's actions): the estimators
    # add it to the final reward
    step_rewards_R_K: torch.Tensor | None = None
    turns_R: torch.Tensor | None = None  # (R,) actions per row
    # (R, T) weighted rewards on completion tokens (`Rollout.token_rewards`; the estimators add them
    # to the final reward); None when no rollout has any
    token_rewards_R_T: torch.Tensor | None = None
    # (R,) long: the episode (index into rewards_G_N.reshape(-1)) of each row, when some episode
    # is several rows (a rewritten history, `Trajectory.rows`); None: row r is episode r
    episode_R: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> RolloutBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return RolloutBatch(
            self.prompts,
            self.completions_R_T.to(device),
            self.mask_R_T.to(device),
            self.old_logprobs_R_T.to(device),
            self.rewards_G_N.to(device),
            move(self.turn_R_T),
            move(self.step_rewards_R_K),
            move(self.turns_R),
            move(self.token_rewards_R_T),
            move(self.episode_R),
        )


def to_batch(groups: list[Group]) -> RolloutBatch:
    """Rows = the groups' episodes; row r holds everything after the prompt (policy and
    environment tokens), `mask_R_T` is True at policy tokens only: environment, tool and prompt
    tokens are never trained on. Old logprobs are the sampler's at policy tokens, 0 elsewhere.

    An episode whose history was rewritten is several rows (`Trajectory.rows`: each a maximal
    run of turns whose tokens extend each other, with its own prompt), consecutive, and
    `episode_R` names each row's episode. The rewards stay per episode (`rewards_G_N`: the group
    statistics and the group size are of episodes, never of rows); its process rewards go on its
    first row, each token reward on the row that holds its token, so each is counted once, and
    the estimators give every row its episode's advantage (`estimators.Estimator.segment_rows`).
    In the loss a row is a sample: "token" aggregation counts each policy token once whatever
    the rows, "sample" and "constant" count every row (segment) as one sequence, as verl's
    seq-mean-token-mean does over Agent Lightning's per-call samples (each with the episode's
    reward): a rewritten episode weighs as many samples as it has rows."""
    import torch

    episodes = [r for g in groups for r in g.rollouts]
    rows: list[Trajectory] = []
    episode_of: list[int] = []  # the episode of each row
    offset: list[int] = []  # where each row's completion starts in its episode's completion_ids
    for e, r in enumerate(episodes):
        at = 0
        for row in r.trajectory.rows:
            rows.append(row)
            episode_of.append(e)
            offset.append(at)
            at += len(row.completion_ids)
    width = max(len(t.completion_ids) for t in rows)
    completions = torch.zeros((len(rows), width), dtype=torch.long)
    old = torch.zeros((len(rows), width))
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    turns = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, t in enumerate(rows):
        n = len(t.completion_ids)
        completions[i, :n] = torch.tensor(t.completion_ids, dtype=torch.long)
        old[i, :n] = torch.tensor(t.completion_logprobs, dtype=torch.float32)
        mask[i, :n] = torch.tensor(t.trainable_mask, dtype=torch.bool)
        turns[i, :n] = torch.tensor(t.token_turns, dtype=torch.long)
    # each part of the reward where it is credited: the final reward per episode, the process
    # rewards per turn (on the episode's first row), the token rewards per token
    rewards = torch.tensor([[r.final_reward for r in g.rollouts] for g in groups], dtype=torch.float32)
    token_rewards = None
    if any(r.token_rewards for r in episodes):
        token_rewards = torch.zeros((len(rows), width))
        for e, r in enumerate(episodes):
            if outside := [p for p in r.token_rewards if not 0 <= p < len(r.trajectory.completion_ids)]:
                raise ValueError(f"episode {e}: a token reward at {outside[0]}, past its completion")
        for i, (e, at) in enumerate(zip(episode_of, offset, strict=True)):
            for position, value in episodes[e].token_rewards.items():
                if not at <= position < at + len(rows[i].completion_ids):
                    continue  # another row's token
                if not mask[i, position - at]:  # a reward no policy token can be credited with is lost
                    raise ValueError(f"row {i}: a token reward at {position}, which is not a policy token")
                token_rewards[i, position - at] = value
    first = [i == 0 or episode_of[i - 1] != e for i, e in enumerate(episode_of)]
    steps = [episodes[e].step_rewards if f else [] for e, f in zip(episode_of, first, strict=True)]
    step_rewards = torch.zeros((len(rows), max(max(len(s) for s in steps), 1)))
    for i, s in enumerate(steps):
        step_rewards[i, : len(s)] = torch.tensor(s, dtype=torch.float32)
    turns_R = torch.tensor([t.turns for t in rows], dtype=torch.long)
    return RolloutBatch(
        [list(t.prompt_ids) for t in rows],
        completions,
        mask,
        old,
        rewards,
        turns,
        step_rewards,
        turns_R,
        token_rewards,
        torch.tensor(episode_of, dtype=torch.long) if len(rows) > len(episodes) else None,
    )


@dataclass
class Packed:
    """Sequences packed into rows without padding between them, as SFT packing does: each sequence's
    position ids restart at 0 and the model gets no attention mask, so transformers detects the packed
    sequences from `position_ids` and keeps each from attending to the others. Only the tail of a row
    is padding (its positions continue the last sequence's numbering; nothing reads them)."""

    input_ids_P_W: torch.Tensor  # (P, W)
    position_ids_P_W: torch.Tensor  # (P, W)
    index_N: torch.Tensor  # (N,) flat index into P x W of the position that predicts each completion token
    targets_N: torch.Tensor  # (N,) the completion tokens, in the row-major order of mask_B_T


def pack(prompts: list[list[int]], completions_B_T: torch.Tensor, mask_B_T: torch.Tensor) -> Packed:
    """Pack B sequences (prompt + completion, minus the last token, which predicts nothing) into rows
    of width W = the longest of them, first-fit by decreasing length. A row never holds more tokens
    than the padded batch's row would, so attention costs no more than the padded batch; the rows
    hold no padding between sequences and the vocabulary projection is applied at `index_N` only.
    `mask_B_T` marks the tokens whose logprobs are wanted (policy tokens); a row's sequence runs
    to its last marked token, environment tokens between marked ones included (read, not scored)."""
    import torch

    marked = [torch.nonzero(m).flatten().tolist() for m in mask_B_T.bool().cpu()]
    lengths = [m[-1] + 1 if m else 0 for m in marked]
    completions = completions_B_T.tolist()
    seqs = [p + c[: max(n - 1, 0)] for p, c, n in zip(prompts, completions, lengths)]
    width = max(len(s) for s in seqs)
    rows: list[list[int]] = []  # sequence indices per row
    used: list[int] = []
    for b in sorted(range(len(seqs)), key=lambda b: -len(seqs[b])):
        row = next((i for i, u in enumerate(used) if u + len(seqs[b]) <= width), None)
        if row is None:
            rows.append([])
            used.append(0)
            row = len(rows) - 1
        rows[row].append(b)
        used[row] += len(seqs[b])
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    first = [0] * len(seqs)  # flat index of the position predicting completion token 0 of sequence b
    for i, members in enumerate(rows):
        offset = 0
        for b in members:
            n = len(seqs[b])
            ids[i, offset : offset + n] = torch.tensor(seqs[b], dtype=torch.long)
            positions[i, offset : offset + n] = torch.arange(n)
            first[b] = i * width + offset + len(prompts[b]) - 1
            offset += n
        last = positions[i, offset - 1] + 1 if offset else 0
        positions[i, offset:] = torch.arange(last, last + width - offset)
    index = torch.cat([torch.tensor(m, dtype=torch.long) + first[b] for b, m in enumerate(marked)])
    device = completions_B_T.device
    return Packed(ids.to(device), positions.to(device), index.to(device), completions_B_T[mask_B_T.bool()])


def rollout_record(
    step: int, group: Group, tokenizer: Any = None, provenance: Callable[[str], dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """JSON rows for rollouts.jsonl (what the report shows as sample rollouts). With the tokenizer,
    `completion` keeps the special tokens generation ran past, marked, as eval examples do
    (`temper.models.chat.shown_completion`), and `graded` is the text graded when it differs.
    A multi-turn episode also gets `episode`: its segments in order, each {"by": "policy" or
    "env", "text"}, so the report can show environment turns apart from the policy's; one of
    several rows (a rewritten history) also `rows`, and each segment its `row` (the prompt of a
    new row marked `row_start`).
    `provenance`: task name -> the row's provenance keys (`temper.train.provenance`)."""
    return [
        {
            "step": step,
            "problem": r.problem.id,
            "prompt": r.problem.prompt,
            **_completion(r.trajectory, tokenizer),
            "reward": r.reward,
            "parts": r.parts,
            "correct": r.score.correct,
            "parsed": r.score.parsed,
            "reason": r.score.details.get("reason"),
            "stop": r.stop,
            "tokens": r.tokens,  # the policy's (what `temper simulate` reads as the episode's length)
        }
        | (provenance(r.problem.task) if provenance is not None else {})
        | _versions(r.trajectory)
        for r in group.rollouts
    ]


def _versions(t: Trajectory) -> dict[str, Any]:
    """Where the sampler tagged the turns (`async_rollouts.in_flight: continue`): `policy_version`,
    the first turn's weights version (over the provenance's, the version the batch's job started
    with: a later sampler call of the batch may have taken newer weights), and `policy_versions`,
    each policy turn's, for an episode whose weights changed between its turns."""
    versions = t.policy_versions
    if not versions or versions[0] is None:
        return {}
    return {"policy_version": versions[0]} | ({"policy_versions": versions} if len(set(versions)) > 1 else {})


def _completion(t: Trajectory, tokenizer: Any) -> dict[str, Any]:
    graded = t.messages[-1]["content"] if t.messages and t.messages[-1]["role"] == "assistant" else ""
    if len(t.segments) > 2:  # an episode with more than one policy turn or environment tokens
        segments = segment_records(t, lambda ids: _decode(tokenizer, ids))
        rows = {"rows": segments[-1]["row"] + 1} if "row" in segments[-1] else {}
        rows |= {"summaries": t.summaries} if t.summaries else {}
        return {
            "completion": "".join(s["text"] for s in segments),
            "episode": segments,
            "turns": t.turns,
            "step_rewards": t.step_rewards,
        } | rows
    if tokenizer is None:
        return {"completion": graded}
    shown = shown_completion(tokenizer, t.completion_ids, t.last_stop)
    return {"completion": shown} | ({"graded": graded} if graded != shown else {})


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False) if tokenizer is not None else str(ids)
