"""RLVP path rewards: Phi and its separate within-group normalization on exact numbers, the four
principles refused at config time (each naming itself and the recipe line), a toy environment
task declaring path signals through grade_episodes and a 2-step RL run, the path metrics, and
the gradient: on a group whose outcomes are all equal, beta > 0 moves the policy, beta = 0 not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from temper.catalog import TASKS
from temper.envs.base import StepResult
from temper.models import build_preset
from temper.recipe import RecipeError, parse_recipe
from temper.rewards.path import (
    PathRule,
    PathSpec,
    declared_signals,
    episode_totals,
    normalize_in_group,
    path_metrics,
    phi,
)
from temper.rollout.loop import EpisodeLimits, run_episodes
from temper.rollout.sampler import Sample
from temper.rollout.trajectory import Segment, Trajectory
from temper.tasks.base import Problem, Score
from temper.train.features.path import path_shaper
from temper.train.rl import RLConfig, train_rl
from temper.train.rl_config import rl_rules, rl_task_rules
from temper.train.rollouts import grade_episodes, to_batch

RULE = PathRule(violation="test_edited", penalty=1.0, compliance="tests_run", reward=0.5)
SPEC = PathSpec(beta=0.5, rules=[RULE], milestones={"reproduced": 0.5}, eps=0.0)


def _episode(steps: list[dict], correct: bool) -> Trajectory:
    """A two-token episode whose steps gave `steps` signals and whose outcome is `correct`."""
    return Trajectory(
        [Segment([1, 2], None, False), Segment([3, 4], [-0.1, -0.2], True, 0)],
        step_rewards=[0.0] * len(steps),
        signals=steps,
        score=Score(float(correct), correct, True),
    )


# four episodes, signals split over steps (a bool, a string left out); their Phi by hand:
#   e0: tests_run 2+3 -> +2.5, reproduced 2 -> +1.0                     Phi = 3.5
#   e1: test_edited 1 -> -1, tests_run 1 -> +0.5                        Phi = -0.5
#   e2: test_edited 1+1 -> -2, tests_run 2 -> +1.0, reproduced 1 -> 0.5 Phi = -0.5
#   e3: test_edited True -> -1, reproduced 1 -> +0.5                    Phi = -0.5
# mean 0.5, deviations (3, -1, -1, -1), unbiased std sqrt(12 / 3) = 2 -> z = (1.5, -0.5, -0.5, -0.5)
GROUP = [
    ([{"tests_run": 2, "reproduced": 1}, {"tests_run": 3, "reproduced": 1, "tier": "bwrap"}], False),
    ([{"test_edited": 1, "tests_run": 1}], True),
    ([{"test_edited": 1, "tests_run": 2}, {"test_edited": 1, "reproduced": 1}], True),
    ([{"test_edited": True}, {"reproduced": 1}], False),
]


def test_phi_and_the_separate_normalization_by_hand():
    totals = [episode_totals(steps) for steps, _ in GROUP]
    assert totals[0] == {"tests_run": 5.0, "reproduced": 2.0}  # the string signal left out
    assert totals[3] == {"test_edited": 1.0, "reproduced": 1.0}  # a bool counts 1
    assert [phi(t, SPEC) for t in totals] == [3.5, -0.5, -0.5, -0.5]
    assert normalize_in_group([3.5, -0.5, -0.5, -0.5], eps=0.0) == [1.5, -0.5, -0.5, -0.5]
    assert normalize_in_group([3.5, -0.5, -0.5, -0.5], eps=2.0) == [0.75, -0.25, -0.25, -0.25]
    assert normalize_in_group([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]  # no path signal: exactly no term
    assert normalize_in_group([2.0]) == [0.0]


def test_grade_episodes_adds_beta_times_the_group_z_score_to_the_weighted_outcome():
    problem = Problem("toy", "train", "p", "fix it")
    group = grade_episodes(
        problem, [_episode(s, c) for s, c in GROUP], {"outcome": 1.0}, 48, 0, shapers=[path_shaper(SPEC)]
    )
    # R = outcome + 0.5 z: the path term can outweigh the outcome (e0, wrong, equals e1, right)
    assert group.rewards == [0.75, 0.75, 0.75, -0.25]
    assert [r.parts for r in group.rollouts] == [
        {"outcome": 0.0, "path": 3.5, "path_norm": 1.5},
        {"outcome": 1.0, "path": -0.5, "path_norm": -0.5},
        {"outcome": 1.0, "path": -0.5, "path_norm": -0.5},
        {"outcome": 0.0, "path": -0.5, "path_norm": -0.5},
    ]
    # normalized apart from the outcome: a heavier outcome weight leaves the path term as it was
    heavy = grade_episodes(
        problem, [_episode(s, c) for s, c in GROUP], {"outcome": 3.0}, 48, 0, shapers=[path_shaper(SPEC)]
    )
    assert heavy.rewards == [0.75, 2.75, 2.75, -0.25]
    # the path term is part of the episode's final reward (credited like the outcome), never a step reward
    batch = to_batch([group])
    assert batch.rewards_G_N.tolist() == [[0.75, 0.75, 0.75, -0.25]]
    assert batch.step_rewards_R_K.abs().sum() == 0
    # without a spec the rewards are the components alone and no path part is written
    plain = grade_episodes(problem, [_episode(s, c) for s, c in GROUP], {"outcome": 1.0}, 48, 0)
    assert plain.rewards == [0.0, 1.0, 1.0, 0.0] and "path" not in plain.rollouts[0].parts


def test_an_all_fail_group_with_different_paths_has_a_signal_and_is_still_counted_all_fail():
    problem = Problem("toy", "train", "p", "fix it")
    wrong = [_episode(s, False) for s, _ in GROUP]
    group = grade_episodes(problem, wrong, {"outcome": 1.0}, 48, 0, shapers=[path_shaper(SPEC)])
    assert group.cause is None and group.outcome_all_fail  # zero variance no more; all-fail still
    assert group.rewards == [0.75, -0.25, -0.25, -0.25]
    same = grade_episodes(
        problem, [_episode(GROUP[1][0], False)] * 3, {"outcome": 1.0}, 48, 0, shapers=[path_shaper(SPEC)]
    )
    assert same.cause == "all_wrong" and same.outcome_all_fail and same.rewards == [0.0] * 3
    outcome_only = grade_episodes(problem, wrong, {"outcome": 1.0}, 48, 0)
    assert outcome_only.cause == "all_wrong"
    mixed = grade_episodes(
        problem, [_episode(s, c) for s, c in GROUP], {"outcome": 1.0}, 48, 0, shapers=[path_shaper(SPEC)]
    )
    assert not mixed.outcome_all_fail
    right = grade_episodes(
        problem, [_episode(s, True) for s, _ in GROUP], {"outcome": 1.0}, 48, 0, shapers=[path_shaper(SPEC)]
    )
    assert right.cause is None and not right.outcome_all_fail  # all solved is not all-fail


def test_path_metrics_by_hand():
    kinds = {
        "test_edited": "violation",
        "skipped_run": "violation",
        "tests_run": "compliance",
        "reproduced": "progress",
    }
    totals = [episode_totals(s) for s, _ in GROUP]
    # violations 0 + 1 + 2 + 1 = 4 over 4 episodes; compliance 5 + 1 + 2 + 0 = 8 -> 8 / 12
    assert path_metrics(totals, kinds, [3.5, -0.5, -0.5, -0.5]) == {
        "path/violations": 1.0,
        "path/violations/skipped_run": 0.0,
        "path/violations/test_edited": 1.0,
        "path/compliance_rate": 8 / 12,
        "path/phi": 0.5,
    }
    assert path_metrics([{}, {}], kinds) == {
        "path/violations": 0.0,
        "path/violations/skipped_run": 0.0,
        "path/violations/test_edited": 0.0,
    }  # no event of either kind: no compliance rate rather than a made-up one


# ---- a toy environment task declaring path signals ----------------------------------------------


@dataclass
class ToyConfig:
    pass


class RuleEnv:
    """Two steps, never solved (every outcome wrong: an all-fail task). At each step an action
    holding a character below 'P' (a capital, a digit, a control byte) "edits the test"
    (violation), any other leaves it alone (compliance); an 'e' "reproduces the failure" (progress)."""

    stop = ()

    def __init__(self):
        self.actions: list[str] = []

    def reset(self):
        return [{"role": "user", "content": "fix it"}]

    def step(self, action):
        self.actions.append(action)
        signals = signals_of(action) | {"note": "string signals are left out"}
        if len(self.actions) == 2:
            return StepResult(done=True, signals=signals, score=Score(0.0, False, True))
        return StepResult(messages=[{"role": "user", "content": "tests: 1 failed"}], signals=signals)


def signals_of(action: str) -> dict[str, int]:
    edited = any(c < "P" for c in action)
    return {"test_edited": int(edited), "tests_untouched": int(not edited), "reproduced": int("e" in action)}


class RuleTask:
    name = "rule_toy"
    config_type: ClassVar[type] = ToyConfig
    path_signals: ClassVar[dict[str, str]] = {
        "test_edited": "violation",
        "tests_untouched": "compliance",
        "reproduced": "progress",
    }

    def __init__(self, config: ToyConfig | None = None):
        self.envs: list[RuleEnv] = []

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", "fix it") for i in range(n)]

    def make_env(self, problem):
        self.envs.append(RuleEnv())
        return self.envs[-1]

    def score(self, problem, completion):
        return Score(0.0, False, True)

    def demonstration(self, problem):
        return "ok"

    def corpus_text(self, problem):
        return problem.prompt


TOY_SPEC = PathSpec(
    beta=0.5,
    rules=[PathRule(violation="test_edited", penalty=1.0, compliance="tests_untouched", reward=0.5)],
    milestones={"reproduced": 0.2},
)


class Script:
    """A `Sampler` with no model (as tests/test_agent_loop.py's): episode j's first action is
    SCRIPT[j][0], its second the SCRIPT[k][1] whose first action the prompt holds (each first
    action in no other's text), each ended with the eos token: every episode takes its two steps."""

    SCRIPT = (("rerun", "ok"), ("Edit", "rerun"), ("EDIT", "Edit"), ("zz", "Edit"))

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def sample(self, prompts, n, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, stop=(), seed=0):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            said = [k for k, (first, _) in enumerate(self.SCRIPT) if first in text]
            actions = [self.SCRIPT[k][1] for k in said] if said else [a for a, _ in self.SCRIPT[:n]]
            row = []
            for action in actions:
                ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.tokenizer.eos_token_id]
                row.append(Sample(list(prompt), ids, [-0.1] * len(ids), action, "eos"))
            out.append(row)
        return out

    def sync(self, model):
        pass


def test_toy_env_episodes_through_grade_episodes(tokenizer):
    task = RuleTask()
    problem = task.sample("train", 1, 0)[0]
    envs = [task.make_env(problem) for _ in range(4)]
    [episodes] = run_episodes(Script(tokenizer), tokenizer, [envs], [3], EpisodeLimits(max_new_tokens=8))
    assert [e.actions for e in envs] == [list(a) for a in Script.SCRIPT]  # two steps each
    group = grade_episodes(problem, episodes, {"outcome": 1.0}, 8, 0, shapers=[path_shaper(TOY_SPEC)])
    # by hand, 0.5 per untouched step, -1 per edit, 0.2 per 'e':
    #   rerun, ok: 0.5 + 0.2 + 0.5 = 1.2;  Edit, rerun: -1 + 0.5 + 0.2 = -0.3
    #   EDIT, Edit: -2;                    zz, Edit: 0.5 - 1 = -0.5
    assert [r.parts["path"] for r in group.rollouts] == pytest.approx([1.2, -0.3, -2.0, -0.5])
    z = normalize_in_group([1.2, -0.3, -2.0, -0.5], TOY_SPEC.eps)
    assert group.rewards == pytest.approx([0.5 * v for v in z])  # every outcome 0: the reward is the path
    assert group.cause is None and group.outcome_all_fail
    kinds = declared_signals([task])[0]
    totals = [episode_totals(t.signals) for t in episodes]
    # violations 0 + 1 + 2 + 1 = 4 of 8 events
    assert path_metrics(totals, kinds) == {
        "path/violations": 1.0,
        "path/violations/test_edited": 1.0,
        "path/compliance_rate": 0.5,
    }


def _rl_config(**kw):
    base = dict(
        steps=2, prompts_per_step=2, group_size=8, max_new_tokens=3, max_turns=2, lr=1e-2, seed=0,
        progress=False, path=TOY_SPEC,
    )  # fmt: skip
    return RLConfig(**(base | kw))


def test_a_two_step_rl_run_logs_the_path_metrics(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    result = train_rl(model, tokenizer, [RuleTask()], _rl_config(), tmp_path / "rlvp")
    for row in result.history:
        # the random policy's turns all end at max_new_tokens, so each episode is one step holding
        # exactly one of the two events: compliance rate = 1 - violations per episode
        assert row["path/compliance_rate"] == pytest.approx(1 - row["path/violations"])
        assert 0 < row["path/violations"] < 1
        assert row["path/violations"] == row["path/violations/test_edited"]
        assert row["path/all_fail_groups"] == 1.0  # never solved
        assert row["zero_variance"] < 1.0  # ... yet the path term gives the groups a signal
        assert row["accuracy"] == 0.0 and "path/phi" in row
    # an outcome-only run on the same task logs the same path metrics (the comparison RLVP needs),
    # has no Phi, and nothing to learn from
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    plain = train_rl(model, tokenizer, [RuleTask()], _rl_config(path=None), tmp_path / "outcome")
    assert plain.history[0]["path/violations"] == result.history[0]["path/violations"]
    assert "path/phi" not in plain.history[0] and plain.history[0]["zero_variance"] == 1.0


def test_beta_moves_the_policy_on_a_group_whose_outcomes_are_all_equal(tokenizer, tmp_path):
    """The gradient check: one RL step on the same samples (same seed, same model); every outcome
    is 0, so with beta = 0 the advantage and the update are 0, with beta > 0 they are not."""

    def step(beta: float) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = build_preset("nano", tokenizer, seed=1)
        spec = PathSpec(beta=beta, rules=TOY_SPEC.rules, milestones=TOY_SPEC.milestones)
        before = [p.detach().clone() for p in model.parameters()]
        config = _rl_config(steps=1, path=spec if beta > 0 else None)
        train_rl(model, tokenizer, [RuleTask()], config, tmp_path / f"beta{beta}")
        return [(p.detach() - b).abs().max() for p, b in zip(model.parameters(), before, strict=True)]

    assert max(step(0.0)) == 0.0
    assert max(step(0.5)) > 0.0


# ---- the four principles, refused at config time ----------------------------------------------------


RECIPE = """name: rlvp
model: {{path: sft-model}}
tasks: {{toy: {{task: rule_toy}}}}
stages:
  - kind: rl
    tasks: [toy]
    train:
      rewards: {rewards}
      path:
        beta: 0.5
        rules:
          - {rule}
        milestones: {milestones}
"""
GOOD_RULE = "{violation: test_edited, penalty: 1.0, compliance: tests_untouched, reward: 0.5}"


def _recipe(rewards="{outcome: 1.0}", rule=GOOD_RULE, milestones="{reproduced: 0.2}") -> str:
    return RECIPE.format(rewards=rewards, rule=rule, milestones=milestones)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(TASKS, "rule_toy", RuleTask)


def _error(text: str) -> str:
    with pytest.raises(RecipeError) as err:
        parse_recipe(text)
    return str(err.value)


def test_a_recipe_keeping_the_principles_parses(toy_registered):
    stage = parse_recipe(_recipe()).stages[0]
    assert stage.train.path == PathSpec(
        beta=0.5,
        rules=[PathRule("test_edited", 1.0, "tests_untouched", 0.5)],
        milestones={"reproduced": 0.2},
    )
    assert stage.train.rewards == {"outcome": 1.0}


def test_principle_1_unknown_or_progress_signals_are_no_penalty(toy_registered):
    unknown = _error(_recipe(rule="{violation: nope, compliance: tests_untouched, reward: 0.5}"))
    assert (
        "<recipe>:12: stages[0].train.path.rules[0].violation: unknown path signal 'nope': the stage's "
        "tasks declare reproduced (progress), test_edited (violation), tests_untouched (compliance)"
    ) in unknown
    progress = _error(_recipe(rule="{violation: reproduced, compliance: tests_untouched, reward: 0.5}"))
    assert (
        "<recipe>:12: stages[0].train.path.rules[0].violation: RLVP principle 1: penalize only verifiable "
        "actions, never lack of progress: the penalized signal 'reproduced' is a 'progress' signal, not "
        "'violation': penalizing it would penalize lack of progress"
    ) in progress
    for weight in ("-0.2", "0"):
        negative = _error(_recipe(milestones=f"{{reproduced: {weight}}}"))
        assert "<recipe>:13: stages[0].train.path.milestones.reproduced: RLVP principle 1:" in negative
        assert (
            f"its weight must be > 0 (got {float(weight):g}); a weight below 0 would penalize progress"
            in negative
        )
    not_progress = _error(_recipe(milestones="{test_edited: 0.2}"))
    assert (
        "<recipe>:13: stages[0].train.path.milestones.test_edited: a milestone must be a 'progress' signal; "
        "'test_edited' is 'violation' (penalties and compliance go in `rules`)"
    ) in not_progress
    unknown = _error(_recipe(milestones="{fixed: 0.2}"))
    assert (
        "stages[0].train.path.milestones.fixed: unknown path signal 'fixed': the stage's tasks declare"
        in unknown
    )
    penalty = _error(
        _recipe(rule="{violation: test_edited, penalty: 0, compliance: tests_untouched, reward: 1}")
    )
    assert "stages[0].train.path.rules[0].penalty: RLVP principle 1:" in penalty


def test_principle_2_the_outcome_term_stays(toy_registered):
    for rewards in ("{format: 1.0}", "{outcome: 0.0, format: 1.0}"):
        message = _error(_recipe(rewards=rewards))
        assert (
            "<recipe>:8: stages[0].train.rewards: RLVP principle 2: always keep the outcome term" in message
        )


def test_principle_3_every_penalty_has_a_paired_compliance_reward(toy_registered):
    unpaired = _error(_recipe(rule="{violation: test_edited, penalty: 1.0}"))
    assert (
        "<recipe>:12: stages[0].train.path.rules[0]: RLVP principle 3: pair every penalty with a compliance "
        "reward: the penalty for 'test_edited' has no `compliance` signal"
    ) in unpaired
    no_reward = _error(_recipe(rule="{violation: test_edited, compliance: tests_untouched}"))
    assert "stages[0].train.path.rules[0].reward: RLVP principle 3:" in no_reward
    assert "the compliance reward for 'tests_untouched' must be > 0 (got 0)" in no_reward
    wrong_kind = _error(_recipe(rule="{violation: test_edited, compliance: reproduced, reward: 0.5}"))
    assert (
        "stages[0].train.path.rules[0].compliance: RLVP principle 3: pair every penalty with a compliance "
        "reward: the paired compliance 'reproduced' is a 'progress' signal, not 'compliance'"
    ) in wrong_kind


def test_principle_4_path_signals_are_not_plain_reward_components(toy_registered):
    message = _error(_recipe(rewards="{outcome: 1.0, test_edited: -1.0}"))
    assert (
        "<recipe>:8: stages[0].train.rewards.test_edited: RLVP principle 4: normalize path signals "
        "separately from the outcome: 'test_edited' is a path signal, not a reward component"
    ) in message
    path = _error(_recipe(rewards="{outcome: 1.0, path: 0.5}"))
    assert "stages[0].train.rewards.path: RLVP principle 4:" in path
    # a name no task declares is an ordinary unknown component
    other = _error(_recipe(rewards="{outcome: 1.0, speed: 1.0}"))
    assert "unknown reward component 'speed'" in other and "principle 4" not in other


def test_a_task_without_path_signals_cannot_take_a_path_spec(toy_registered):
    text = _recipe().replace(
        "tasks: {toy: {task: rule_toy}}", "tasks: {toy: {task: rule_toy}, arithmetic: {}}"
    )
    text = text.replace("tasks: [toy]\n    train", "tasks: [arithmetic]\n    train")
    message = _error(text)
    assert (
        "stages[0].train.path.rules[0].violation: unknown path signal 'test_edited': the stage's tasks declare none"
        in message
    )


def test_the_rules_refuse_a_spec_that_breaks_a_principle():
    """The RLVP principles are rules of the `train:` block (checked once, when the recipe is
    validated; `train_rl` trusts them): each at its key below the stage."""

    def said(config):
        errors = rl_rules(config) + rl_task_rules(config, {"toy": RuleTask()})
        return "; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors)

    bad = PathSpec(rules=[PathRule("reproduced", 1.0, "tests_untouched", 0.5)])
    assert "train.path.rules.0.violation: RLVP principle 1" in said(_rl_config(path=bad))
    assert "train.rewards: RLVP principle 2" in said(_rl_config(rewards={"format": 1.0}))
    assert "train.rewards.test_edited: RLVP principle 4: normalize path signals" in said(
        _rl_config(rewards={"outcome": 1.0, "test_edited": -1.0})
    )
    assert said(_rl_config()) == ""


def test_declared_signals_refuse_one_name_with_two_kinds_and_unknown_kinds():
    class Other:
        path_signals: ClassVar[dict[str, str]] = {"test_edited": "compliance"}

    kinds, conflicts = declared_signals({"a": RuleTask(), "b": Other()})
    assert kinds["test_edited"] == "violation"
    assert conflicts == [
        "path signal 'test_edited' is declared 'violation' by task 'a' and 'compliance' by task 'b'"
    ]

    class Typo:
        path_signals: ClassVar[dict[str, str]] = {"slow": "penalty"}

    kinds, bad = declared_signals({"c": Typo()})
    assert kinds == {}
    assert bad == [
        "task 'c' declares path signal 'slow' of kind 'penalty'; kinds: violation, compliance, progress"
    ]


# ---- the report -----------------------------------------------------------------------------------


def test_the_report_shows_a_path_panel_only_when_path_metrics_were_logged():
    from temper.report.rl import rl_figure

    rows = [
        {"step": s, "reward": 0.1, "accuracy": 0.2 * s, "path/phi": -1.0 + s, "path/violations": 3.0 - s}
        | {"path/violations/test_edited": 2.0 - s, "path/violations/run_skipped": 1.0}
        | {"path/compliance_rate": 0.25 * s}
        for s in (1, 2, 3)
    ]
    fig = rl_figure(rows, "x")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["mean reward", "share of samples", "violations per episode", "share"]
    path = fig.axes[2].get_legend_handles_labels()[1] + fig.axes[3].get_legend_handles_labels()[1]
    assert path == [
        "violations / episode",
        "test_edited",
        "run_skipped",
        "compliance rate",
        "success (accuracy)",
    ]
    one = [{k: v for k, v in r.items() if k != "path/violations/run_skipped"} for r in rows]
    assert len(rl_figure(one, "x").axes[2].lines) == 1  # one violation signal: its line is the total
    shares = [list(line.get_ydata()) for line in fig.axes[3].lines]
    assert shares == [[0.25, 0.5, 0.75], pytest.approx([0.2, 0.4, 0.6])]
    assert "path Phi (raw)" in fig.axes[0].get_legend_handles_labels()[1]
    plain = [{k: v for k, v in r.items() if not k.startswith("path/")} for r in rows]
    assert [ax.get_ylabel() for ax in rl_figure(plain, "x").axes] == ["mean reward", "share of samples"]


def test_the_rl_stage_refuses_a_spec_its_tasks_cannot_honour_before_loading_a_model(tmp_path):
    """`temper rl` builds its tasks without the recipe: run_rl checks them itself, first."""
    from temper.stages.base import StageError
    from temper.stages.context import StageContext
    from temper.stages.rl import RLStage, describe, run_rl

    bad = PathSpec(rules=[PathRule("reproduced", 1.0, "tests_untouched", 0.5)])
    stage = RLStage(kind="rl", tasks=["toy"], train=_rl_config(path=bad))
    ctx = StageContext(run_dir=tmp_path, base_dir=tmp_path, tasks={"toy": RuleTask()}, task_options={})
    with pytest.raises(StageError, match="train.path.rules.0.violation: RLVP principle 1"):
        run_rl(stage, ctx, tmp_path / "no-model", tmp_path / "out")
    assert describe(stage, None).endswith(", path reward beta 0.5 (1 rules, 0 milestones)")
