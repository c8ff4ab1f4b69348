"""The contamination check: planted copies of eval problems are counted (exact and n-gram) and
dropped on request; honest training data of the built-in tasks is not flagged."""

import json
from pathlib import Path

import pytest

from temper.catalog import make_recipe_task
from temper.data.contamination import HELD_OUT_SEED, ContaminationSpec, Index, check, row_texts, screen
from temper.data.formats import Example
from temper.models import build_preset, save_model
from temper.stages import rl
from temper.stages.context import StageContext
from temper.stages.sft import SFTStage, run_sft


@pytest.fixture(scope="module")
def tasks():
    return {
        "arithmetic": make_recipe_task("arithmetic", {"max_digits": 2, "ood_digits": 3}, Path(".")),
        "general_points": make_recipe_task("general_points", {"n_cards": 4, "target": 24}, Path(".")),
    }


def _chat(prompt, answer="Answer: 1", source="train.jsonl", line=1):
    return Example(
        source, line, messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    )


def _rows(examples):
    return [(f"{e.source}:{e.line}", *row_texts(e)) for e in examples]


def test_planted_overlaps_are_counted_and_dropped(tasks):
    gp_test = [p.prompt for p in tasks["general_points"].sample("test", 60, 7)]
    index = Index({"arithmetic:test": ["23*9=?", "5*6=?"], "general_points:test": gp_test})
    hand = gp_test[3]
    other = tasks["general_points"].sample("train", 1, 3)[0].prompt
    planted = [
        _chat("23*9=?", "23*9=207\nAnswer: 207", line=1),  # an eval problem verbatim: exact
        _chat("  " + hand.upper().replace(" ", "   ") + " ", line=2),  # case and spaces differ: still exact
        _chat(
            "Please solve this. " + hand + " Think step by step.", line=3
        ),  # inside a longer prompt: n-gram
        Example("train.jsonl", 4, prompt="Q", completion="as seen in the test set: " + hand),  # in an answer
    ]
    clean = [
        _chat("15*6=?", line=5),  # holds "5*6=?" but not at a word boundary
        _chat("23*8=?", line=6),
        _chat(other, line=7),  # a train-split hand: the same instructions, another hand
        _chat(
            hand.replace(hand.split()[2], "7" if hand.split()[2] != "7" else "8"), line=8
        ),  # one card changed
    ]
    keep, block = check(_rows(planted + clean), index, "warn")
    assert keep == list(range(8))  # warn keeps everything
    assert block["contaminated"] == 4 and block["exact"] == 2 and block["ngram"] == 4
    assert block["by_eval_set"] == {"arithmetic:test": 1, "general_points:test": 3}
    assert [e["row"] for e in block["examples"]] == [
        "train.jsonl:1",
        "train.jsonl:2",
        "train.jsonl:3",
        "train.jsonl:4",
    ]
    assert [e["how"] for e in block["examples"]] == ["exact", "exact", "n-gram", "n-gram"]
    keep, block = check(_rows(planted + clean), index, "drop")
    assert keep == [4, 5, 6, 7] and block["dropped"] == 4


def test_honest_training_data_of_the_builtin_tasks_is_not_flagged(tasks):
    """Train-split demonstrations share the instructions of every eval prompt (GeneralPoints) or
    are as short as they are (arithmetic): neither may read as a leak."""
    from temper.data.contamination import eval_sets

    sets = eval_sets(tasks, [(["arithmetic", "general_points"], ["test", "ood"], 200, 1234)], 500)
    assert set(sets) == {f"{t}:{s}" for t in tasks for s in ("test", "ood")}
    index = Index(sets)
    examples = [
        _chat(p.prompt, tasks[name].demonstration(p), name, i)
        for name in tasks
        for i, p in enumerate(tasks[name].sample("train", 1500, 11))
    ]
    _, block = check(_rows(examples), index)
    assert block["rows"] == 3000 and block["contaminated"] == 0, block["examples"]


def test_screen_reads_the_recipe_settings_and_rl_cannot_drop(tasks, tmp_path):
    ctx = StageContext(tmp_path, tmp_path, tasks, {})
    ctx.eval_specs = [(["arithmetic"], ["test"], 50, 1234)]
    ctx.contamination = ContaminationSpec(action="drop", eval_problems=0)
    leaked = tasks["arithmetic"].sample("test", 50, 1234)[:3]
    rows = [_chat(p.prompt, line=i) for i, p in enumerate(leaked)] + [_chat("1+1=?", line=9)]
    kept, block = screen(rows, ctx, "sft")
    assert (
        [r.line for r in kept] == [9]
        and block["dropped"] == 3
        and block["eval_sets"]
        == {"arithmetic:test": len({p.prompt for p in tasks["arithmetic"].sample("test", 50, 1234)})}
    )
    kept, block = screen(leaked, ctx, "rl", can_drop=False)  # RL prompts (task Problems): counted only
    assert (
        len(kept) == 3
        and block["contaminated"] == 3
        and block["dropped"] == 0
        and "never dropped" in block["note"]
    )
    assert HELD_OUT_SEED == rl.HELD_OUT_SEED  # the problems rl and rft grade are the ones checked


def test_the_sft_stage_records_and_drops_planted_rows(tasks, tokenizer, tmp_path):
    start = save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "start")
    leaked = tasks["arithmetic"].sample("test", 4, HELD_OUT_SEED)  # the held-out problems rl/rft grade
    rows = [
        {"messages": [{"role": "user", "content": p.prompt}, {"role": "assistant", "content": "x"}]}
        for p in leaked
    ]
    rows += [
        {"messages": [{"role": "user", "content": f"{i}+{i}=?"}, {"role": "assistant", "content": "y"}]}
        for i in range(100, 106)
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ctx = StageContext(tmp_path, tmp_path, tasks, {})
    ctx.contamination = ContaminationSpec(action="drop", eval_problems=50)
    stage = SFTStage(
        kind="sft", data={"files": ["d.jsonl"], "eval_problems": 0},
        train={"max_steps": 1, "batch_size": 2, "warmup_steps": 0, "progress": False},
    )  # fmt: skip
    out = tmp_path / "sft"
    out.mkdir()
    run_sft(stage, ctx, start, out)
    summary = json.loads((out / "sft.json").read_text())
    assert summary["contamination"]["exact"] == 4 and summary["contamination"]["dropped"] == 4
    assert summary["data"]["examples"] == 6


def test_the_report_shows_the_counts_and_the_flagged_rows(tasks):
    from temper.report.contamination import contamination_html

    index = Index({"arithmetic:test": ["23*9=?"]})
    _, block = check(_rows([_chat("23*9=?", line=3), _chat("2+2=?", line=4)]), index, "drop")
    page = contamination_html(block)
    assert (
        "<td>training rows checked</td><td>2</td>" in page
        and "<td>dropped (action: drop)</td><td>1</td>" in page
    )
    assert "1 of 2 training rows overlap an eval set and were dropped before training" in page
    assert "<td>train.jsonl:3</td><td>arithmetic:test</td><td>exact</td>" in page
    assert contamination_html(None) == ""


def test_the_recipe_option_and_the_stage_hash(tmp_path):
    """The default (warn) leaves every stage hash as it was (the shipped base and finished runs stay
    valid); drop changes what trains, so it reruns the stages that read a model."""
    from temper.recipe import parse_recipe
    from temper.runner import _stage_hash, eval_specs

    text = """\
name: c
model: {path: m}
tasks: {arithmetic: {max_digits: 2}}
stages:
  - {kind: sft, data: {tasks: [arithmetic]}}
  - {kind: eval, tasks: [arithmetic], splits: [test], n_problems: 50, seed: 7}
"""
    (tmp_path / "m").mkdir()
    plain = parse_recipe(text, base_dir=tmp_path)
    warn = parse_recipe(text + "contamination: {action: warn}\n", base_dir=tmp_path)
    drop = parse_recipe(text + "contamination: {action: drop, n: 16}\n", base_dir=tmp_path)
    assert drop.contamination == ContaminationSpec(action="drop", n=16)
    assert eval_specs(drop) == [(["arithmetic"], ["test"], 50, 7)]
    ctx = StageContext(tmp_path, tmp_path, {}, plain.tasks)
    hashes = [_stage_hash(r, 0, ctx) for r in (plain, warn, drop)]
    assert hashes[0] == hashes[1] != hashes[2]


def test_preference_rows_and_rl_prompts_are_read_too(tasks):
    from temper.data.preferences import Labelled, Pair

    pair = Pair("p.jsonl", 1, [{"role": "user", "content": "23*9=?"}], "207", "206")
    assert row_texts(pair) == (["23*9=?"], "23*9=?\n207\n206")
    kto = Labelled("k.jsonl", 2, "5*6=?", "30", True)
    assert row_texts(kto) == (["5*6=?"], "5*6=?\n30")
    problem = tasks["arithmetic"].sample("test", 1, 0)[0]
    assert row_texts(problem) == ([problem.prompt], problem.prompt)
    _, block = check(
        [("p.jsonl:1", *row_texts(pair)), ("k.jsonl:2", *row_texts(kto))], Index({"a:test": ["5*6=?"]})
    )
    assert block["exact"] == 1 and block["examples"][0]["row"] == "k.jsonl:2"


def test_a_task_without_an_ood_split_gives_no_ood_set(tasks):
    from temper.data.contamination import eval_sets

    class NoOod:
        def sample(self, split, n, seed):
            if split == "ood":
                raise ValueError("task 'rows' has no ood rows")
            return tasks["arithmetic"].sample(split, n, seed)

    assert list(eval_sets({"rows": NoOod()}, [], 10)) == ["rows:test"]


def test_an_env_task_is_matched_by_its_map_not_its_first_view(tmp_path):
    """The treasure hunt's prompt is the first 3x3 view, which seen and unseen maps share; the
    check compares maps (`problem_key`), so the shipped recipe's disjoint splits are clean, and a
    demonstration or an RL prompt of an unseen map is still caught."""
    from temper.stages.sft import demonstrations

    hunt = make_recipe_task(
        "treasure_hunt", {"size": 4, "train_maps": 500, "progress": 0.1, "instructions": False}, Path(".")
    )
    ctx = StageContext(tmp_path, tmp_path, {"treasure_hunt": hunt}, {})
    ctx.eval_specs = [(["treasure_hunt"], ["test"], 30, 1234)]
    ctx.contamination = ContaminationSpec(eval_problems=200)
    seen = demonstrations(ctx, ["treasure_hunt"], "train", 300, 1)
    unseen = hunt.sample("test", 200, HELD_OUT_SEED)
    # the premise: by their first views alone, most seen maps look like unseen ones
    shared = {r.messages[0]["content"] for r in seen} & {p.prompt for p in unseen}
    assert len(shared) > 10
    _, block = screen(seen, ctx, "sft")
    assert block["contaminated"] == 0 and set(block["eval_sets"]) == {
        "treasure_hunt:test",
        "treasure_hunt:ood",
    }
    leaked = demonstrations(ctx, ["treasure_hunt"], "test", 2, HELD_OUT_SEED)  # the first held-out maps
    _, block = screen(seen[:5] + leaked, ctx, "sft")
    assert block["contaminated"] == 2 and block["examples"][0]["how"] == "same problem"
    assert [e["row"] for e in block["examples"]] == ["task:treasure_hunt:test:1", "task:treasure_hunt:test:2"]
    _, block = screen(unseen[:3], ctx, "rl", can_drop=False)  # RL prompts: the Problems themselves
    assert block["contaminated"] == 3


def test_an_eval_of_the_train_split_is_no_held_out_set(tasks):
    from temper.data.contamination import eval_sets

    sets = eval_sets(tasks, [(["arithmetic"], ["train", "test"], 20, 1)], 0)
    assert list(sets) == ["arithmetic:test"]
