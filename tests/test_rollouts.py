"""From samples to training inputs on hand-computed values: a group's rewards with the overlong
component (length, limit, truncation and buffer each reaching it), the token ids a batch grader is
given, the rollouts.jsonl record, first-fit packing of sequences into rows, a rewritten episode's
rows at exact tensors, and the learning-rate schedules at their edges.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import pytest
import torch

from temper.rollout.sampler import Sample
from temper.rollout.trajectory import Segment, Trajectory
from temper.tasks.base import Problem, Score
from temper.train.rollouts import Group, Rollout, grade_group, one_step, pack, rollout_record, to_batch


class _BatchTask:
    """Grades a whole group in one call, as a data task's reward functions do; keeps the ids it got."""

    name = "batch"

    def __init__(self):
        self.ids = []

    def score_batch(self, problems, completions, completion_ids):
        self.ids.append(completion_ids)
        return [Score(float(c == "yes"), c == "yes", True, {"reason": c}) for c in completions]


def test_group_rewards_add_the_overlong_penalty_of_each_sample():
    """max_new_tokens 6, buffer 2: 3 tokens cost nothing, 5 finished tokens cost (4 - 5) / 2, and a
    sample stopped by the length limit costs 1 whatever its length."""
    task, problem = _BatchTask(), Problem("batch", "train", "p1", "q")
    samples = [
        Sample([1], [5, 5, 5], [-1.0] * 3, "yes", "eos"),
        Sample([1], [6] * 5, [-1.0] * 5, "yes", "stop"),
        Sample([1], [7] * 5, [-1.0] * 5, "no", "length"),
    ]
    group = grade_group(task, problem, samples, {"outcome": 1.0, "overlong": 2.0}, 6, 2)
    assert task.ids == [[[5, 5, 5], [6] * 5, [7] * 5]]
    assert group.rewards == [1.0, 0.0, -2.0] and group.cause is None
    assert [r.parts for r in group.rollouts] == [
        {"outcome": 1.0, "overlong": 0.0},
        {"outcome": 1.0, "overlong": -0.5},
        {"outcome": 0.0, "overlong": -1.0},
    ]


def _group():
    problem = Problem("t", "train", "id-7", "what is 5+7?")
    score = Score(1.0, True, True, {"reason": "match"})
    return problem, score


def test_rollout_record_fields():
    problem, score = _group()
    sample = Sample([1], [2, 3], [-0.1, -0.2], "12", "eos")
    group = Group([Rollout(problem, one_step(sample, score), score, 0.75, {"outcome": 1.0})])
    assert rollout_record(4, group) == [
        {
            "step": 4,
            "problem": "id-7",
            "prompt": "what is 5+7?",
            "completion": "12",
            "reward": 0.75,
            "parts": {"outcome": 1.0},
            "correct": True,
            "parsed": True,
            "reason": "match",
            "stop": "eos",
            "tokens": 2,
        }
    ]


def test_rollout_record_shows_a_completion_without_the_stop_token_it_ended_on(tokenizer):
    problem, score = _group()
    ids = tokenizer.encode("12", add_special_tokens=False)
    ended = Sample([1], [*ids, tokenizer.eos_token_id], [-0.1] * (len(ids) + 1), "12", "eos")
    (record,) = rollout_record(
        1, Group([Rollout(problem, one_step(ended, score), score, 1.0, {})]), tokenizer
    )
    assert record["completion"] == "12" and "graded" not in record  # shown as graded: nothing to add
    ran_on = Sample([1], [*ids, tokenizer.eos_token_id], [-0.1] * (len(ids) + 1), "12", "length")
    (record,) = rollout_record(
        1, Group([Rollout(problem, one_step(ran_on, score), score, 1.0, {})]), tokenizer
    )
    assert record["completion"] != "12" and record["graded"] == "12"  # the end token it ran past, marked


def test_pack_first_fit_by_decreasing_length():
    """Sequences (prompt + completion minus its last token): [1, 2, 7, 8] (4), [3] (1), [4, 5, 6] (3);
    width 4. Longest first: row 0 takes the first; the third does not fit there and opens row 1;
    the second fits exactly beside it (3 + 1 = 4)."""
    completions = torch.tensor([[7, 8, 9], [10, 0, 0], [11, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=torch.bool)
    packed = pack([[1, 2], [3], [4, 5, 6]], completions, mask)
    assert packed.input_ids_P_W.tolist() == [[1, 2, 7, 8], [4, 5, 6, 3]]
    assert packed.position_ids_P_W.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    # completion token t of a sequence is predicted at (its row x 4 + its offset + prompt length - 1 + t)
    assert packed.index_N.tolist() == [1, 2, 3, 7, 6]
    assert packed.targets_N.tolist() == [7, 8, 9, 10, 11]


def test_pack_pads_the_tail_of_a_row_continuing_its_positions():
    completions = torch.tensor([[7, 8], [9, 0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    packed = pack([[1, 2, 3], [4]], completions, mask)
    assert packed.input_ids_P_W.tolist() == [[1, 2, 3, 7], [4, 0, 0, 0]]
    assert packed.position_ids_P_W.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert packed.index_N.tolist() == [2, 3, 4] and packed.targets_N.tolist() == [7, 8, 9]


def _two_row_group():
    """Episode A was rewritten after its first turn: row 0 is [10, 11] -> turn 0; row 1's prompt is
    the rendering of the new history, then turn 1, an environment token, turn 2; a process reward
    on its turn 0 and a token reward on turn 2's first token (position 4 of its completions laid
    end to end). Episode B is one row of one turn."""
    problem = Problem("t", "train", "p", "q")
    a = Trajectory(
        [
            Segment([10, 11], None, False),
            Segment([20, 21], [-0.1, -0.2], True, 0),
            Segment([10, 40, 20, 21, 41], None, False, starts_row=True),
            Segment([22], [-0.3], True, 1),
            Segment([31], None, False),
            Segment([23, 24], [-0.4, -0.5], True, 2),
        ]
    )
    b = Trajectory([Segment([10, 11], None, False), Segment([25], [-0.6], True, 0)])
    ok, wrong = Score(1.0, True, True), Score(0.0, False, True)
    return Group(
        [
            Rollout(problem, a, ok, 1.0, {}, step_rewards=[0.25, 0.0, 0.0], token_rewards={4: 0.5}),
            Rollout(problem, b, wrong, 0.0, {}, step_rewards=[0.0]),
        ]
    )


def test_to_batch_makes_a_row_per_segment_with_the_episodes_advantage():
    """Rows: A's two, then B's; each row its own prompt, mask and logprobs; the process reward on
    A's first row only, the token reward on the row holding its token; the episode's total
    (1 + 0.25 + 0.5 = 1.75 vs 0) baselined over the 2 episodes (dr_grpo: +-0.875, never the mean
    of 3 rows) on every row of each; the token normaliser counts 6 policy tokens, `sample` 3 rows."""
    from temper.algorithms.estimators import ESTIMATORS, AdvantageInputs
    from temper.algorithms.policy import aggregation_size

    batch = to_batch([_two_row_group()])
    assert batch.prompts == [[10, 11], [10, 40, 20, 21, 41], [10, 11]]
    assert batch.completions_R_T.tolist() == [[20, 21, 0, 0], [22, 31, 23, 24], [25, 0, 0, 0]]
    T, F = True, False
    assert batch.mask_R_T.tolist() == [[T, T, F, F], [T, F, T, T], [T, F, F, F]]
    assert torch.equal(
        batch.old_logprobs_R_T,
        torch.tensor([[-0.1, -0.2, 0, 0], [-0.3, 0, -0.4, -0.5], [-0.6, 0, 0, 0]], dtype=torch.float32),
    )
    assert batch.turn_R_T.tolist() == [[0, 0, -1, -1], [1, -1, 2, 2], [0, -1, -1, -1]]
    assert batch.rewards_G_N.tolist() == [[1.0, 0.0]] and batch.episode_R.tolist() == [0, 0, 1]
    assert batch.step_rewards_R_K.tolist() == [[0.25, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert batch.token_rewards_R_T.tolist() == [[0, 0, 0, 0], [0, 0, 0.5, 0], [0, 0, 0, 0]]
    inputs = AdvantageInputs(
        batch.rewards_G_N,
        batch.mask_R_T,
        turn_R_T=batch.turn_R_T,
        step_rewards_R_K=batch.step_rewards_R_K,
        turns_R=batch.turns_R,
        token_rewards_R_T=batch.token_rewards_R_T,
        episode_R=batch.episode_R,
    )
    advantages, _ = ESTIMATORS["dr_grpo"](inputs)
    a = 0.875
    assert advantages.tolist() == [[a, a, 0, 0], [a, 0, a, a], [-a, 0, 0, 0]]
    g = ESTIMATORS["grpo"](inputs)[0]
    assert g[0, 0] == g[1, 3] == -g[2, 0] and g[0, 0] == pytest.approx(0.7071, abs=1e-4)
    assert aggregation_size(batch.mask_R_T, "token") == 6 and aggregation_size(batch.mask_R_T, "sample") == 3
    with pytest.raises(ValueError, match="turn_grpo estimator reads each row as a whole episode"):
        ESTIMATORS["turn_grpo"](inputs)


def test_to_batch_of_one_row_episodes_names_no_episodes():
    problem, score = _group()
    sample = Sample([1], [2, 3], [-0.1, -0.2], "12", "eos")
    group = Group([Rollout(problem, one_step(sample, score), score, 0.75, {"outcome": 1.0}, [0.0])] * 2)
    assert to_batch([group]).episode_R is None
