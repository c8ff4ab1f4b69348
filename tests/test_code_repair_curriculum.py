"""The code_repair curriculum (issue 10 item 4, WebRL-style): the exact seeded variants of a
failure, the fail-to-pass gate on every variant (planted bad and duplicate ones rejected), growth
from all-fail groups only, the bounded share of the draws, and a resumed RL run drawing exactly
what the uninterrupted one drew."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fakes import Script  # tests/ is on the path (pytest rootdir mode)
from temper.catalog import make_task
from temper.envs.code_repair.curriculum import CURRICULUM_REASONS, CurriculumConfig, variant
from temper.envs.code_repair.generator import RepairTask, task_of
from temper.models import build_preset
from temper.report.rl import curriculum_table
from temper.train.features.curriculum import grow_curricula
from temper.train.rl import RLConfig, train_rl
from test_code_repair import TASK

CURRICULUM = {"every": 1, "variants_per_failure": 2, "max_share": 0.5}


def small(**kw):
    options = {"train_tasks": 4, "test_tasks": 4, "ood_tasks": 2, "curriculum": CURRICULUM}
    return make_task("code_repair", **(options | kw))


def test_the_variants_of_a_failure_are_exact_and_seeded():
    v = variant(TASK, "x:0")
    assert v == RepairTask(
        shape="expr",
        family="op_swap",
        buggy="def f(a, b):\n    # a * 3 + b\n    return a - 3 + b\n",
        fixed=TASK.fixed,
        line=3,
        fix_text="    return a * 3 + b",
        visible=(-3, 8),
        visible_want=-1,
        hidden=(((2, 2), 8), ((9, 9), 36), ((2, -1), 5), ((3, -3), 6), ((9, -3), 24), ((-2, -2), -8)),
    )
    assert variant(TASK, "x:0") == v and variant(TASK, "x:1").buggy.endswith("return a * 3 * b\n")
    # the same function and family, never the parent's own bug
    bugs = {variant(TASK, f"x:{j}").buggy for j in range(40)}
    spec = "def f(a, b):\n    # a * 3 + b\n    return "
    assert bugs == {spec + e + "\n" for e in ("a + 3 + b", "a - 3 + b", "a * 3 * b")}  # not a * 3 - b
    assert variant(replace(TASK, family="wrong_comparison"), "x:0") is None  # no site in expr


def test_every_variant_passes_the_gate_and_planted_bad_ones_are_rejected(monkeypatch):
    task = small()
    c = task.failure_curriculum
    parent = c.originals()[0]
    test_task = task_of(task.problems("test")[0])
    real = type(c).make_variant

    def planted(self, p, key):
        j = int(key.rsplit(":", 1)[1])
        if j == 0:  # an equivalent "bug": the hidden tests cannot catch it
            return replace(p, buggy=p.fixed)
        if j == 1:  # a task of the test split: never trained on
            return test_task
        return real(self, p, key)

    monkeypatch.setattr(type(c), "make_variant", planted)
    c.config = CurriculumConfig(variants_per_failure=3)
    row = c.grow(1, [parent.id])
    assert row["rejected"]["passes_on_bug"] == 1 and row["rejected"]["duplicate"] == 1
    [admitted] = row["admitted"]
    assert admitted["id"] == "gen1_0" and admitted["parent"] == parent.id
    good = real(c, task_of(parent), f"{task.config.seed}:{parent.id}:1:2")
    assert admitted["task"]["buggy"] == good.buggy
    assert set(row["rejected"]) == set(CURRICULUM_REASONS)


def test_the_pool_grows_only_from_all_fail_groups_and_stays_a_bounded_share():
    task = small()
    c = task.failure_curriculum
    c.resume("/nonexistent", 0, main=False)
    ids = [p.id for p in c.originals()]

    def group(pid, correct):
        p = next(q for q in c.originals() + c.generated() if q.id == pid)
        return SimpleNamespace(
            rollouts=[SimpleNamespace(problem=p, score=SimpleNamespace(correct=x)) for x in correct]
        )

    assert c.draw(8, 3, 1) == task.sample("train", 8, 3)  # nothing generated yet: the plain draw
    groups = [group(ids[0], [False, False]), group(ids[1], [False, True]), group(ids[0], [False, False])]
    row = grow_curricula({"code_repair": c}, groups, 1)
    assert {p.data["parent"] for p in c.generated()} == {ids[0]}  # ids[1] had a success
    n = row["curriculum/admitted"]
    assert n == len(c.generated()) == 2 - sum(row[f"curriculum/rejected/{r}"] for r in CURRICULUM_REASONS)
    assert row["curriculum/pool_size"] == 4 + n and row["curriculum/generated_share"] == n / (4 + n)
    assert row["curriculum/failed_problems"] == 1 and row["curriculum/drawn_generated_share"] == 0
    # step 1 (0-based) draws the variants born after step 1, at most max_share of the draws
    assert c.draw(50, 3, 0) == task.sample("train", 50, 3)
    drawn = c.draw(400, 3, 1)
    share = sum(p.id.startswith("gen") for p in drawn) / len(drawn)
    assert 0.2 < share <= min(0.5, n / (4 + n)) + 0.06 and {p.id for p in drawn} >= set(ids)
    c.config = CurriculumConfig(max_share=0.1)  # the cap binds: the originals keep 90% of the draws
    assert 0.05 < sum(p.id.startswith("gen") for p in c.draw(400, 3, 1)) / 400 <= 0.13
    c.config = CurriculumConfig(max_share=0.9, weighting="fixed")  # max_share, not the pool's share
    assert 0.85 < sum(p.id.startswith("gen") for p in c.draw(400, 3, 1)) / 400 < 0.95
    assert c.draw(50, 3, 0) == task.sample("train", 50, 3)  # still nothing before the first birth
    c.config = CurriculumConfig(**CURRICULUM)
    # a failed variant spawns variants of its own; a step where all groups succeed adds nothing
    gen = c.generated()[0].id
    row = grow_curricula({"code_repair": c}, [group(gen, [False]), group(ids[2], [True])], 2)
    assert {p.data["parent"] for p in c.generated(2)} - {ids[0]} <= {gen}
    assert row["curriculum/drawn_generated_share"] == 0.5 and row["curriculum/failed_problems"] == 1
    before = len(c.generated())
    grow_curricula({"code_repair": c}, [group(ids[3], [True, False])], 3)
    assert len(c.generated()) == before


def test_growth_every_k_steps_uses_the_failures_of_those_steps():
    c = small(curriculum=CURRICULUM | {"every": 2}).failure_curriculum
    c.resume("/nonexistent", 0, main=False)
    ids = [p.id for p in c.originals()]
    assert c.after_step(1, [(ids[0], True)])["curriculum/admitted"] == 0 and c.pending == [ids[0]]
    c.after_step(2, [(ids[1], True), (ids[2], False)])
    assert {p.data["parent"] for p in c.generated()} <= {ids[0], ids[1]} and c.pending == []
    assert {p.data["parent"] for p in c.generated()} & {ids[0]}


def rl_config(**kw):
    base = dict(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=8, max_turns=8, save_every=2)
    return RLConfig(**(base | dict(lr=1e-3, seed=0, progress=False, log_rollouts=100) | kw))


def drawn_ids(out_dir, steps):
    rows = [json.loads(ln) for ln in (out_dir / "rollouts.jsonl").read_text().splitlines()]
    return [[r["problem"] for r in rows if r["step"] == s] for s in steps]


def test_an_rl_run_logs_the_curriculum_and_a_resumed_run_draws_the_same(tokenizer, tmp_path):
    """A scripted policy that submits at once fails every task: the pool grows every step."""
    submit = Script(tokenizer, lambda text, j: "submit")
    full = train_rl(
        build_preset("nano", tokenizer, seed=1),
        tokenizer,
        [small()],
        rl_config(),
        tmp_path / "a",
        sampler=submit,
    )
    keys = {
        "curriculum/pool_size",
        "curriculum/generated_share",
        "curriculum/admitted",
        "curriculum/drawn_generated_share",
    }
    for row in full.history:
        assert keys | {f"curriculum/rejected/{r}" for r in CURRICULUM_REASONS} <= set(row)
        assert row["curriculum/failed_problems"] >= 1
    sizes = [r["curriculum/pool_size"] for r in full.history]
    assert sizes == sorted(sizes) and sizes[-1] > 4 and full.history[-1]["curriculum/generated_share"] > 0
    a = drawn_ids(tmp_path / "a", [1, 2, 3, 4])
    # the report's table: the pool at the end, its generated share, admitted and rejected totals
    table = curriculum_table(full.history)
    last = full.history[-1]
    assert f"<td>pool at the end</td><td>{last['curriculum/pool_size']}</td>" in table
    assert f"<td>{round(100 * last['curriculum/generated_share'])}%</td>" in table
    assert f"<td>{sum(r['curriculum/admitted'] for r in full.history)}</td>" in table
    assert curriculum_table([{"step": 1, "reward": 0.0}]) == ""
    assert not any(i.startswith("gen") for i in a[0]) and any(i.startswith("gen") for s in a[2:] for i in s)

    class Stop(Exception):
        pass

    def crash(step, row):
        if step == 3:  # after step 3's curriculum row, before a checkpoint: resume from step 2
            raise Stop

    with pytest.raises(Stop):
        train_rl(build_preset("nano", tokenizer, seed=1), tokenizer, [small()], rl_config(), tmp_path / "b",
                 sampler=submit, callbacks=[crash])  # fmt: skip
    resumed = train_rl(
        build_preset("nano", tokenizer, seed=1),
        tokenizer,
        [small()],
        rl_config(),
        tmp_path / "b",
        sampler=submit,
    )
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]  # 1-2 read back from metrics.jsonl
    assert drawn_ids(tmp_path / "b", [1, 2, 3, 4]) == a
    log = "curriculum_code_repair.jsonl"
    assert (tmp_path / "b" / log).read_text() == (tmp_path / "a" / log).read_text()
    for x, y in zip(full.history[2:], resumed.history[2:], strict=True):
        assert {k: v for k, v in x.items() if k.startswith("curriculum/")} == {
            k: v for k, v in y.items() if k.startswith("curriculum/")
        }


STAGE_RECIPE = """\
name: t
model: {preset: nano}
tasks:
  code_repair: {train_tasks: 4, test_tasks: 4, ood_tasks: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [code_repair], problems_per_task: 10}
    train: {max_steps: 1, batch_size: 2, warmup_steps: 0}
  - kind: rl
    name: rl_plain
    tasks: [code_repair]
  - kind: rl
    name: rl_grown
    tasks: [code_repair]
    task_options:
      code_repair:
        curriculum: {every: 2, variants_per_failure: 1, max_share: 0.25}
"""


def test_a_stage_turns_the_curriculum_on_for_its_arm_only_with_the_same_pools():
    from temper.catalog import make_recipe_task
    from temper.recipe import parse_recipe
    from temper.stages.rl import stage_tasks

    recipe = parse_recipe(STAGE_RECIPE)
    base = {"code_repair": make_recipe_task("code_repair", recipe.tasks["code_repair"])}
    plain, grown = (stage_tasks(s, base)["code_repair"] for s in recipe.stages[1:])
    assert plain is base["code_repair"] and plain.failure_curriculum is None
    assert grown.failure_curriculum.config == CurriculumConfig(
        every=2, variants_per_failure=1, max_share=0.25
    )
    for split in ("train", "test", "ood"):  # the curriculum changes the draws, not the splits
        assert grown.problems(split) == plain.problems(split)
    from temper.stages.rl import describe

    assert "task options" not in describe(recipe.stages[1], recipe)  # the plan line says which arm has it
    assert describe(recipe.stages[2], recipe).endswith(
        ", this stage's task options {'code_repair': {'curriculum': {'every': 2, 'variants_per_failure': 1, 'max_share': 0.25}}}"
    )


@pytest.mark.parametrize(
    "options, where, says",
    [
        (
            "{curiculum: {every: 1}}",
            "stages[2].task_options.code_repair.curiculum",
            "did you mean 'curriculum'?",
        ),
        (
            "{curriculum: {every: 1, max_share: 2}}",
            "stages[2].task_options.code_repair",
            "max_share must be in (0, 1)",
        ),
        (
            "{curriculum: {weighting: uniform}}",
            "stages[2].task_options.code_repair",
            "weighting must be pool or fixed, got 'uniform'",
        ),
        (
            "{curriculum: {evry: 1}}",
            "stages[2].task_options.code_repair",
            "unknown curriculum options ['evry']",
        ),
    ],
)
def test_bad_stage_task_options_are_recipe_errors_at_their_key(options, where, says):
    from temper.recipe import RecipeError, parse_recipe

    text = STAGE_RECIPE.replace(
        "curriculum: {every: 2, variants_per_failure: 1, max_share: 0.25}", options[1:-1]
    )
    with pytest.raises(RecipeError) as err:
        parse_recipe(text, "r.yaml")
    assert f"{where}: " in str(err.value) and says in str(err.value), str(err.value)


def test_stage_task_options_must_name_a_task_of_the_stage():
    from temper.recipe import RecipeError, parse_recipe

    with pytest.raises(RecipeError) as err:
        parse_recipe(
            STAGE_RECIPE.replace(
                "      code_repair:\n        curriculum", "      arithmetic:\n        curriculum"
            ),
            "r.yaml",
        )
    assert (
        "r.yaml:16: stages[2].task_options.arithmetic: task_options names 'arithmetic', which is not one of this stage's tasks ['code_repair']"
        in str(err.value)
    )


def test_empty_task_options_leave_the_hash_of_runs_recorded_before_them():
    """rl stages recorded before `task_options` existed (recipes/rlvp_code_repair.yaml's, which
    recipes/curriculum_code_repair.yaml reuses) must keep their hash: the empty field is left out."""
    from pathlib import Path

    from temper.recipe import load_recipe, parse_recipe
    from temper.stages.markers import stage_settings

    plain, grown = parse_recipe(STAGE_RECIPE).stages[1:]
    # the train block's late blocks are left out at their defaults too, and the blocks that replaced
    # flat keys hash as those keys did
    want = plain.model_dump(
        exclude={
            "train": {
                "progress",
                "process_reward_model",
                "adaptthink",
                "dynamic_sampling",
                "user_code",
                "rollout_correction",
                "async_rollouts",
                "workers",  # UNHASHED: where envs run changes no output
                "strategy",  # HASHED_WHEN_SET: left out at its default (ddp)
                "parallel",  # HASHED_WHEN_SET: orchestrator RL's block, left out at its default
            },
            "server_url": True,  # UNHASHED: where a server listens changes no output
            "vllm_check_sync": True,  # UNHASHED: a check of the engine changes no output
        }
    )
    want["train"] |= {"dynamic_sampling": False, "max_sampling_rounds": 4}
    assert "task_options" not in stage_settings(plain)
    assert stage_settings(plain) == {k: v for k, v in want.items() if k != "task_options"}
    assert stage_settings(grown)["task_options"] == {
        "code_repair": {"curriculum": {"every": 2, "variants_per_failure": 1, "max_share": 0.25}}
    }
    root = Path(__file__).parents[1] / "recipes"
    rlvp, cur = load_recipe(root / "rlvp_code_repair.yaml"), load_recipe(root / "curriculum_code_repair.yaml")
    assert cur.tasks == rlvp.tasks and cur.model == rlvp.model
    assert [stage_settings(s) for s in cur.stages[:3]] == [stage_settings(s) for s in rlvp.stages[:3]]
    arm = stage_settings(cur.stages[3])
    assert arm.pop("task_options") and arm | {"name": "rl_outcome"} == stage_settings(rlvp.stages[2])
