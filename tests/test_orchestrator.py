"""Orchestrator RL (PARL, issue 28 item 3): the env's critical path and total steps, the
orchestrator-only mask, the parallel reward's schedule, measure and completion constraint, and
the feature's term reaching the graded rewards."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fakes import Script  # tests/ is on the path (pytest rootdir mode)
from temper.catalog import make_task
from temper.data.chat import IGNORE, tokenize_example
from temper.envs.orchestrator import OrchestratorConfig, OrchestratorTask
from temper.report.agent import rl_episode_table
from temper.rewards.parallel import ParallelSpec, parallel_errors, parallel_measure, parallel_term, weight_at
from temper.rewards.path import episode_totals
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.stages.sft import demonstrations
from temper.tasks.base import Problem
from temper.train import features
from temper.train.rl import RLConfig
from temper.train.rollouts import grade_episodes

TASK = OrchestratorTask(OrchestratorConfig(budget=7))
# three sub-tasks: values 7, 4, 8; workers take 1, 3 and 2 steps
PROBLEM = Problem("orchestrator", "test", "h", "lookup 1 2 3", {"keys": ["1", "2", "3"],
                  "values": [7, 4, 8], "worker_steps": [1, 3, 2]})  # fmt: skip


def play(actions: list[str], problem: Problem = PROBLEM):
    env = TASK.make_env(problem)
    env.reset()
    return [env.step(a) for a in actions]


def test_one_batch_runs_its_workers_in_parallel_on_the_critical_path():
    spawn, answer = play(["spawn 1 2 3", "answer 7 4 8"])
    # critical path: 1 turn + max(1, 3, 2); total: 1 turn + 1 + 3 + 2
    assert spawn.signals == {"steps": 7, "critical_steps": 4, "subagents": 3, "spawns": 1, "invalid": 0}
    assert spawn.messages == [{"role": "user", "content": "1=7 (1) 2=4 (3) 3=8 (2) | path 4/7"}]
    assert answer.done and answer.score.correct and answer.score.reward == 1.0
    assert answer.signals == {"steps": 1, "critical_steps": 1, "subagents": 0, "spawns": 0, "invalid": 0,
                              "answered": 1, "unused": 0, "budget_exceeded": 0}  # fmt: skip
    totals = episode_totals([spawn.signals, answer.signals])
    assert (totals["steps"], totals["critical_steps"]) == (8, 5)
    assert answer.score.details["critical_path"] == 5


def test_one_sub_task_at_a_time_runs_out_of_the_budget():
    a, b, c = play(["spawn 1", "spawn 2", "spawn 3"])
    assert a.signals["critical_steps"] == 2 and b.signals["critical_steps"] == 4  # path 2, then 6
    assert b.messages[0]["content"] == "2=4 (3) | path 6/7"
    assert c.done and not c.score.correct and c.score.details == {"reason": "budget", "critical_path": 9}
    assert c.signals["budget_exceeded"] == 1 and c.signals["answered"] == 0
    assert c.signals["unused"] == 0  # never answered: only results no answer could use count
    *_, junk = play(["spawn 1", "spawn 1 9", "spawn 2 3"])
    assert junk.signals["unused"] == 2 and junk.score.details["reason"] == "budget"
    # the same sub-tasks in two batches fit: 1 + 1, then 1 + 3, then the answer = 7
    *_, last = play(["spawn 1", "spawn 2 3", "answer 7 4 8"])
    assert last.score.correct and last.score.details["critical_path"] == 7


def test_unused_results_junk_repeats_and_a_wrong_answer():
    *_, answer = play(["spawn 1 9", "spawn 1 2 3", "answer 7 4 9"])
    # 9 is no sub-task (a "?" after 1 step), 1's second result is not needed, 3's value is wrong
    assert answer.signals["unused"] == 3 and not answer.score.correct
    junk = play(["spawn 9"])[0]
    assert junk.messages[0]["content"] == "9=? (1) | path 2/7" and junk.signals["steps"] == 2
    bad = play(["hello"])[0]
    assert bad.signals["invalid"] == 1 and not bad.done and bad.messages[0]["content"].endswith("path 1/7")
    env = TASK.make_env(PROBLEM)
    env.step("spawn 1 2")
    assert env.cut("max_turns") == {"answered": 0, "unused": 0, "budget_exceeded": 0}
    env.step("spawn 9")
    assert env.cut("max_turns")["unused"] == 1


def test_the_anneal_schedule_at_given_steps():
    linear = ParallelSpec(weight=0.5, anneal_steps=4)
    assert [weight_at(linear, t) for t in (1, 2, 3, 4, 5, 9)] == [0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    assert weight_at(ParallelSpec(weight=0.5, anneal_steps=4, schedule="constant"), 9) == 0.5
    assert weight_at(ParallelSpec(weight=0.5, anneal_steps=0), 9) == 0.5  # N = 0: never annealed
    assert weight_at(ParallelSpec(weight=0.2, anneal_steps=2), 2) == pytest.approx(0.1)


def totals(actions: list[str]) -> dict[str, float]:
    return episode_totals([r.signals for r in play(actions)])


def test_the_parallel_term_and_the_completion_constraint_on_hand_built_episodes():
    spec = ParallelSpec(weight=0.5, anneal_steps=4, unused_penalty=0.5)
    parallel = totals(["spawn 1 2 3", "answer 7 4 8"])  # total 8, critical 5
    serial = totals(["spawn 1", "spawn 2 3", "answer 7 4 8"])  # total 9, critical 7
    assert parallel_measure(8, 5) == pytest.approx(3 / 8) and parallel_measure(0, 0) == 0.0
    parts, term = parallel_term(parallel, spec, 1)
    assert term == pytest.approx(0.5 * 3 / 8)
    assert parts == {"parallel": pytest.approx(3 / 8), "parallel_weight": 0.5, "unused_share": 0.0}
    assert parallel_term(serial, spec, 1)[1] == pytest.approx(0.5 * (1 - 7 / 9))
    assert parallel_term(parallel, spec, 3)[1] == pytest.approx(0.25 * 3 / 8)  # annealed
    assert parallel_term(parallel, spec, 5)[1] == 0.0
    # a junk worker inflates m (total 9, critical 5: m = 4/9) but leaves one result unused of
    # four: no bonus, and the penalty 0.5 x 1/4
    junk = totals(["spawn 1 2 3 9", "answer 7 4 8"])
    assert parallel_measure(junk["steps"], junk["critical_steps"]) == pytest.approx(4 / 9)
    assert parallel_term(junk, spec, 1)[1] == pytest.approx(-0.125)
    # an episode that never answers earns no bonus, however parallel
    assert parallel_term(totals(["spawn 1 2 3"]) | {"answered": 0.0, "unused": 0.0}, spec, 1)[1] == 0.0
    # every argument reaches the result
    for changed in (ParallelSpec(weight=0.25, anneal_steps=4), ParallelSpec(weight=0.5, anneal_steps=8),
                    ParallelSpec(weight=0.5, anneal_steps=4, schedule="constant")):  # fmt: skip
        assert parallel_term(parallel, changed, 3)[1] != parallel_term(parallel, spec, 3)[1]
    assert parallel_term(junk, ParallelSpec(unused_penalty=1.0), 1)[1] == pytest.approx(-0.25)


def test_the_rules_of_the_block():
    assert parallel_errors(None, {}) == []
    errors = parallel_errors(ParallelSpec(weight=-1, anneal_steps=-1, unused_penalty=-1), {"outcome": 0.0})
    assert [loc for loc, _ in errors] == [("parallel", "weight"), ("parallel", "unused_penalty"),
                                          ("parallel", "anneal_steps"), ("rewards",)]  # fmt: skip


def reply_for(actions: list[str]):
    return lambda text, j: actions[text.count("<|assistant|>") - 1]


def episode(tokenizer, actions: list[str]):
    [[traj]] = run_episodes(
        Script(tokenizer, reply_for(actions)), tokenizer, [[TASK.make_env(PROBLEM)]], [0],
        EpisodeLimits(max_turns=TASK.max_turns, max_new_tokens=32),
    )  # fmt: skip
    return traj


def test_only_the_orchestrators_tokens_are_trained_and_the_workers_results_are_environment_tokens(tokenizer):
    actions = ["spawn 1 2 3", "answer 7 4 8"]
    traj = episode(tokenizer, actions)
    assert traj.stop_reason == "done" and traj.score.correct
    ids, mask = traj.completion_ids, traj.trainable_mask
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
    environment = tokenizer.decode(
        [t for t, m in zip(ids, mask, strict=True) if not m], skip_special_tokens=False
    )
    eos = tokenizer.decode([tokenizer.eos_token_id], skip_special_tokens=False)
    assert trained == f"spawn 1 2 3{eos}answer 7 4 8{eos}"
    assert "1=7 (1) 2=4 (3) 3=8 (2) | path 4/7" in environment and "spawn" not in environment
    # token by token: each policy segment is exactly an action, each environment one holds no action
    policy = [tokenizer.decode(s.token_ids, skip_special_tokens=False) for s in traj.segments if s.trainable]
    assert policy == [f"{a}{eos}" for a in actions]
    assert [s.turn for s in traj.segments if s.trainable] == [0, 1]


def test_the_features_term_reaches_the_graded_rewards_at_the_step(tokenizer):
    plays = [["spawn 1 2 3", "answer 7 4 8"], ["spawn 1", "spawn 2 3", "answer 7 4 8"]]
    trajectories = [episode(tokenizer, a) for a in plays]
    spec = ParallelSpec(weight=0.5, anneal_steps=4)
    config = RLConfig(parallel=spec, rewards={"outcome": 1.0})
    assert features.shapers(RLConfig(), 1) == []

    def rewards(step):
        group = grade_episodes(
            PROBLEM, trajectories, config.rewards, 32, 0, None, features.shapers(config, step)
        )
        return [r.final_reward for r in group.rollouts], group

    got, group = rewards(1)
    assert got == pytest.approx([1 + 0.5 * 3 / 8, 1 + 0.5 * 2 / 9])  # parallel beats lazy
    assert group.rollouts[0].parts["parallel"] == pytest.approx(3 / 8)
    assert rewards(5)[0] == [1.0, 1.0]  # annealed: success only
    feature = next(f for f in features.FEATURES if f.name == "parallel")
    hooks = feature.start(config, None)
    row = hooks.after_grading(SimpleNamespace(step=3, groups=[group]))
    assert row["parallel/weight"] == 0.25 and row["parallel/critical_path"] == 6.0
    assert row["parallel/total_steps"] == 8.5 and row["parallel/subagents"] == 3.0
    assert row["parallel/spawns"] == 1.5
    html = rl_episode_table([row])
    assert "orchestrator: critical path (turns + slowest worker per batch)" in html
    assert "annealed over 4 steps" in feature.describe(config)


def test_demonstrations_succeed_and_train_only_the_actions(tokenizer):
    task = make_task("orchestrator", serial_share=1.0)
    problems = task.sample("train", 60, 0)
    plans = [task.plan(p) for p in problems]
    assert any(len(p) > 1 for p in plans) and any(len(p) == 1 for p in plans)  # lazy where it fits
    assert all(len(make_task("orchestrator", serial_share=0.0).plan(p)) == 1 for p in problems)
    for p in problems:
        task.demonstration_messages(p)  # raises unless the plan succeeds
    ctx = SimpleNamespace(tasks={"orchestrator": task})
    [example] = demonstrations(ctx, ["orchestrator"], "train", 1, 0)
    problem = task.sample("train", 1, 0)[0]
    tok = tokenize_example(tokenizer, example, 512)
    trained = "".join(
        tokenizer.decode([t], skip_special_tokens=False)
        for t, lab in zip(tok.input_ids, tok.labels)
        if lab != IGNORE
    )
    actions = [f"spawn {' '.join(b)}" for b in task.plan(problem)] + [task.demonstration(problem)]
    assert trained == "".join(f"{a}<|end|>" for a in actions)
    assert task.score(problem, "\n".join(actions)).correct  # the single-turn view agrees


def test_splits_are_disjoint_and_ood_has_more_subtasks():
    train = {TASK.problem_key(p) for p in TASK.sample("train", 400, 0)}
    test = {TASK.problem_key(p) for p in TASK.sample("test", 200, 0)}
    assert train and test and not train & test  # by content, not only by seed
    assert {len(p.data["keys"]) for p in TASK.sample("train", 100, 0)} == {2, 3, 4}
    assert {len(p.data["keys"]) for p in TASK.sample("ood", 10, 0)} == {5}
    assert [p.data for p in TASK.sample("test", 5, 3)] == [p.data for p in TASK.sample("test", 5, 3)]
    with pytest.raises(ValueError, match="budget"):
        OrchestratorConfig(budget=4)


def test_a_steps_episodes_are_shaped_with_that_steps_weight(tokenizer):
    """Through the RL loop's collection (`sample_share`, whose step is 0-based): loop step 0 is
    the 1-based step 1, so its episodes get w0, and step 2 (the third) w0 * (1 - 2/4)."""
    from temper.train.collect import sample_share

    config = RLConfig(parallel=ParallelSpec(weight=0.5, anneal_steps=4), rewards={"outcome": 1.0},
                      prompts_per_step=2, group_size=2, max_turns=7, max_new_tokens=32)  # fmt: skip
    sampler = Script(
        tokenizer, lambda text, j: "spawn 1 2" if text.count("<|assistant|>") == 1 else "answer 1 1"
    )
    for step, weight in ((0, 0.5), (2, 0.25)):
        groups, *_ = sample_share(sampler, tokenizer, [TASK], config, step)
        assert {r.parts["parallel_weight"] for g in groups for r in g.rollouts} == {weight}
