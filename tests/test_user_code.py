"""`temper.train.user_code`: the RL run's policy on failures of user code and on steps that
cannot teach anything, from the groups a step left out and the zero-variance causes it drew."""

from __future__ import annotations

import pytest

from temper.rollout.trajectory import Segment, Trajectory
from temper.tasks.base import Problem, Score
from temper.train.rl_config import RLConfig
from temper.train.rollouts import grade_episodes
from temper.train.user_code import (
    GroupFailure,
    Policy,
    RunStopped,
    UserCodeConfig,
    equal_rewards_teach_nothing,
    group_failure,
)

G = 2  # samples per group


def failure(kind="verifier_error", error="reward function r.py:f raised on problem d:1: ValueError: x", failed=1,
            first_round=True):  # fmt: skip
    return GroupFailure(kind, error, failed, G, first_round)


def policy(**config):
    said: list[str] = []
    return Policy(UserCodeConfig(**config), steps=10, say=said.append), said


def test_a_failure_in_the_first_step_stops_the_run_with_its_line_and_a_hint():
    p, said = policy()
    with pytest.raises(RunStopped) as err:
        p.after_sampling(1, [None] * 7, [failure()], G)  # 1 of 16 samples
    assert str(err.value) == "rl step 1: reward function r.py:f raised on problem d:1: ValueError: x"
    assert "train.user_code.first_step: count" in err.value.hint and said == []
    p, _ = policy()
    p.start = 3  # a resumed run's first step is not the run's first
    assert p.after_sampling(4, [None] * 7, [failure()], G) == {
        "user_code/failed_samples": 1.0,
        "user_code/failed_share": 1 / 16,
    }


def test_later_failures_are_counted_printed_once_per_kind_and_stop_past_the_share():
    p, said = policy(max_failed_share=0.25)
    p.after_sampling(2, [None] * 3, [failure()], G)  # 1 of 8 samples: counted, printed
    assert said == [
        "[yellow]rl step 2[/]: 1 of 8 samples failed in user code (verifier_error 1); their groups are left out",
        "  first verifier_error: reward function r.py:f raised on problem d:1: ValueError: x",
    ]
    row = p.after_sampling(3, [None] * 3, [failure(error="another line")], G)
    assert said[2:] == [  # the kind's first line is not repeated
        "[yellow]rl step 3[/]: 1 of 8 samples failed in user code (verifier_error 1); their groups are left out"
    ]
    assert row == {"user_code/failed_samples": 1.0, "user_code/failed_share": 1 / 8}
    timeout = failure("timeout", "env E.step did not return within 60 s (step_timeout)", failed=2)
    with pytest.raises(RunStopped) as err:  # 3 of 8 > 0.25
        p.after_sampling(4, [None] * 2, [timeout, failure()], G)
    assert str(err.value) == (
        "rl step 4: 3 of 8 samples failed in user code (38%, more than train.user_code.max_failed_share 0.25); "
        "the first: env E.step did not return within 60 s (step_timeout)"
    )
    p, _ = policy(max_failed_share=0.25)  # exactly the share goes on
    assert p.after_sampling(2, [None] * 3, [failure(failed=2)], G)["user_code/failed_share"] == 0.25


def test_refill_rounds_failures_are_counted_but_the_share_is_of_the_steps_batch():
    p, said = policy(max_failed_share=0.25)
    late = [failure(failed=2, first_round=False)] * 3  # dynamic sampling's refills
    row = p.after_sampling(2, [None] * 4, late, G)
    assert row == {"user_code/failed_samples": 6.0, "user_code/failed_share": 0.0}


def test_count_mode_goes_on_through_the_first_step():
    p, said = policy(first_step="count", max_failed_share=0.5)
    p.after_sampling(1, [None], [failure()], G)  # 1 of 4
    assert said[0].startswith("[yellow]rl step 1[/]: 1 of 4 samples failed")
    with pytest.raises(RunStopped):
        p.after_sampling(2, [], [failure(failed=2), failure(failed=2)], G)  # every sample


def test_a_template_that_rewrote_the_history_is_said_not_counted():
    p, said = policy()
    rewritten = GroupFailure("not_prefix", "the chat template re-renders the history", 0, G)
    assert p.after_sampling(1, [None], [rewritten], G) == {}
    assert said == [
        "[yellow]rl[/]: step 1: 1 groups left out: the chat template re-renders the history differently "
        "from the sampled tokens (not a reward): the chat template re-renders the history"
    ]


def test_steps_without_a_learning_signal_stop_the_run_naming_the_cause():
    p, said = policy(zero_variance_steps=3)
    p.after_sampling(1, ["all_wrong", "all_wrong"], [], G)
    p.after_sampling(2, ["all_wrong", None], [], G)  # a signal: the streak starts again
    p.after_sampling(3, ["all_wrong", "all_correct"], [], G)  # mixed causes still teach nothing
    p.after_sampling(4, ["all_wrong", "all_wrong"], [], G)
    with pytest.raises(RunStopped) as err:
        p.after_sampling(5, ["all_wrong", "truncated"], [], G)
    assert str(err.value).startswith(
        "rl step 5: 3 steps in a row without a learning signal: every group's rewards are equal or it "
        "failed (all_wrong 67%, all_correct 17%, truncated 17%); all_wrong: no sample right"
    )
    assert "on_zero_variance: warn" in err.value.hint


def test_steps_whose_every_group_failed_count_as_empty_and_warn_mode_warns_once():
    p, said = policy(first_step="count", max_failed_share=1.0, zero_variance_steps=2, on_zero_variance="warn")
    for step in (1, 2, 3):
        p.after_sampling(step, [], [failure(failed=2)], G)
    warnings = [line for line in said if "warning" in line]
    assert warnings == [
        "[bold red]warning[/]: rl step 2: 2 steps in a row without a learning signal: every group's rewards "
        "are equal or it failed (user_code_failed 100%); user_code_failed: user code failed in every group "
        "(train.user_code.on_zero_variance: warn)"
    ]
    p, _ = policy(zero_variance_steps=0)  # off
    for step in (2, 3, 4):
        p.after_sampling(step, ["all_wrong"], [], G)


def test_the_zero_variance_rule_is_for_estimators_that_learn_nothing_from_equal_rewards():
    assert equal_rewards_teach_nothing(RLConfig(advantage="grpo"))
    assert equal_rewards_teach_nothing(RLConfig(advantage="rloo", kl_coef=0.1))  # a KL loss term
    assert not equal_rewards_teach_nothing(RLConfig(advantage="grpo", kl_coef=0.1, kl_mode="reward"))
    for advantage in ("gae", "adaptthink", "on_policy_distill", "turn_grpo"):
        assert not equal_rewards_teach_nothing(RLConfig(advantage=advantage))
    p = Policy(UserCodeConfig(zero_variance_steps=1), 10, empty_streaks=False)
    p.after_sampling(2, ["all_wrong"], [], G)


def test_the_gate_and_the_probe_are_before_training():
    p, _ = policy()
    found = {"words": {"env_error": {"count": 2, "first": "env factory e.py:f raised on problem d:1: X"}}}
    p.eval_failures("rl step 3 eval", found, 8, before=False)  # a periodic eval: said, never a stop
    with pytest.raises(RunStopped, match="^format gate: env factory e.py:f raised on problem d:1: X$"):
        p.eval_failures("format gate", found, 8, before=True)
    with pytest.raises(RunStopped, match="^reachability probe: reward function"):
        p.before_training("reachability probe", [failure()], 16)
    p.before_training("reachability probe", [GroupFailure("not_prefix", "t", 0, G)], 16)  # not user code


def _episode(stop="done", score=None, error=""):
    t = Trajectory(
        [Segment([1], None, False), Segment([2], [0.0], True, 0)], [0.0], [{"error": error} if error else {}]
    )
    t.stop_reason, t.score = stop, score  # fmt: skip
    return t


def test_a_group_with_a_failed_sample_is_a_failure_naming_its_first_line():
    problem = Problem("t", "train", "1", "q")
    ok = Score(1.0, True, True, {"reason": "correct"})
    bad = Score(0.0, False, False, {"reason": "verifier_error", "error": "reward function f raised: E"})

    def graded(*episodes):
        return grade_episodes(problem, list(episodes), {"outcome": 1.0}, 8, 0)

    assert group_failure(graded(_episode(score=ok), _episode(score=ok))) is None
    assert group_failure(graded(_episode(score=ok), _episode(score=bad)), first_round=False) == GroupFailure(
        "verifier_error", "reward function f raised: E", 1, 2, False
    )
    hung = _episode("timeout", error="env E.step did not return within 1 s (step_timeout)")
    assert group_failure(graded(hung, _episode("env_error", error="env E.step raised: X"))) == GroupFailure(
        "timeout", "env E.step did not return within 1 s (step_timeout)", 2, 2
    )
    assert group_failure(graded(_episode("not_prefix", error="re-rendered"), _episode(score=ok))) == (
        GroupFailure("not_prefix", "re-rendered", 0, 2)
    )
