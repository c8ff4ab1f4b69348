"""The agent loop's episodes as the trainer reads them, on a fixture where the plausible one-line
bugs differ: two multi-turn episodes of different lengths and turn counts, environment answers
between the policy's turns (of different lengths), process rewards on every action including the
last, padding after the shorter row. Every tensor of `to_batch` is written out by hand: the mask
False at environment tokens, the sampler's logprobs at policy tokens and 0 elsewhere, the turn
index of each policy token, -1 at environment tokens and padding."""

from __future__ import annotations

import torch

from temper.rollout.trajectory import Segment, Trajectory
from temper.tasks.base import Problem, Score
from temper.train.rollouts import grade_episodes, to_batch


def _episode(
    turns: list[tuple[list[int], list[float]]], env: list[list[int]], steps: list[float]
) -> Trajectory:
    """Prompt [1, 2], then policy turn k (ids, logprobs) and, between turns, env answer k."""
    segments = [Segment([1, 2], None, False)]
    for k, (ids, logprobs) in enumerate(turns):
        segments.append(Segment(ids, logprobs, True, k))
        if k < len(env):
            segments.append(Segment(env[k], None, False))
    return Trajectory(segments, step_rewards=steps, score=Score(1.0, True, True), stop_reason="done")


A = _episode([([10, 11], [-0.1, -0.2]), ([12], [-0.3]), ([13, 14, 15], [-0.4, -0.5, -0.6])],
             [[90, 91, 92], [93]], [0.5, 0.25, 2.0])  # fmt: skip
B = _episode([([20], [-0.7]), ([21, 22], [-0.8, -0.9])], [[94]], [0.0, 4.0])


def test_a_batch_of_multi_turn_episodes_by_hand():
    group = grade_episodes(Problem("t", "train", "p", "q"), [A, B], {"outcome": 1.0, "process": 0.5}, 8, 0)
    batch = to_batch([group])
    assert batch.prompts == [[1, 2], [1, 2]]
    assert batch.completions_R_T.tolist() == [
        [10, 11, 90, 91, 92, 12, 93, 13, 14, 15],
        [20, 94, 21, 22, 0, 0, 0, 0, 0, 0],
    ]
    T, F = True, False
    assert batch.mask_R_T.tolist() == [[T, T, F, F, F, T, F, T, T, T], [T, F, T, T, F, F, F, F, F, F]]
    expected_old = torch.tensor(
        [[-0.1, -0.2, 0, 0, 0, -0.3, 0, -0.4, -0.5, -0.6], [-0.7, 0, -0.8, -0.9, 0, 0, 0, 0, 0, 0]]
    )
    torch.testing.assert_close(batch.old_logprobs_R_T, expected_old, rtol=0, atol=0)
    assert batch.turn_R_T.tolist() == [
        [0, 0, -1, -1, -1, 1, -1, 2, 2, 2],
        [0, -1, 1, 1, -1, -1, -1, -1, -1, -1],
    ]
    assert batch.turns_R.tolist() == [3, 2]
    # every action's process reward x its weight 0.5, the last action's included; 0 past a row's actions
    assert batch.step_rewards_R_K.tolist() == [[0.25, 0.125, 1.0], [0.0, 2.0, 0.0]]
    assert batch.rewards_G_N.tolist() == [[1.0, 1.0]]
    assert [r.reward for r in group.rollouts] == [1.0 + 1.375, 1.0 + 2.0]


def test_the_trajectory_counts_every_action_and_policy_token():
    assert (A.turns, B.turns) == (3, 2)
    assert (A.policy_tokens, B.policy_tokens) == (6, 3)
    assert A.completion_logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5, -0.6]
    assert Trajectory([Segment([1], None, False)]).turns == 0
