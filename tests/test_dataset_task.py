"""A task made from the user's data: splits, sampling, demonstrations, located recipe errors, and
the whole path from a JSONL (CLI, no recipe) and a parquet file (recipe) through RL and eval."""

import json
import shutil
from pathlib import Path

import pytest

from temper.catalog import make_recipe_task, task_fingerprints
from temper.cli import main
from temper.data import DataError
from temper.models import build_preset, save_model
from temper.recipe import RecipeError, load_recipe

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "word_problems"


def _rows(n):
    return [
        {"q": f"what is {i} plus {i % 7}?", "answer": str(i + i % 7), "sol": f"Answer: {i + i % 7}"}
        for i in range(n)
    ]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _task(tmp_path, rows, **options):
    _jsonl(tmp_path / "d.jsonl", rows)
    return make_recipe_task("mine", {"task": "dataset", "data": "d.jsonl", "prompt": "q"} | options, tmp_path)


def test_hash_split_is_deterministic_disjoint_and_keeps_equal_prompts_together(tmp_path):
    repeated = [
        {"q": f"twice {j}?", "answer": str(2 * j), "sol": "x"} for j in range(20)
    ] * 5  # equal prompts
    rows = _rows(300) + repeated
    task = _task(tmp_path, rows, test_fraction=0.25)
    train, test = task.sample("train", 1000, 0), task.sample("test", 1000, 0)
    assert len(test) == len({p.id for p in test}) < 1000  # held out: every row once, never repeated
    assert 0.18 < len(test) / len(rows) < 0.32
    assert len(train) == 1000  # train cycles through shuffles until it has what RL asks for
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert len({p.id for p in train}) + len(test) == len(rows)
    again = _task(tmp_path, rows, test_fraction=0.25)
    assert [p.id for p in again.sample("train", 50, 7)] == [p.id for p in task.sample("train", 50, 7)]
    assert [p.id for p in task.sample("train", 50, 7)] != [p.id for p in task.sample("train", 50, 8)]
    assert [p.id for p in task.sample("test", 20, 3)] == [p.id for p in again.sample("test", 20, 3)]


def test_splits_from_a_column_or_from_separate_sources(tmp_path):
    rows = [r | {"split": ["train", "validation", "ood"][i % 3]} for i, r in enumerate(_rows(30))]
    task = _task(tmp_path, rows, split_column="split")
    assert {len(task.sample(s, 100, 0)) for s in ("test", "ood")} == {10}
    assert all(p.data["row"]["split"] == "ood" for p in task.sample("ood", 100, 0))
    _jsonl(tmp_path / "t.jsonl", _rows(4))
    task = _task(tmp_path, _rows(12), test_data="t.jsonl")
    assert sorted(p.id for p in task.sample("test", 100, 0)) == [f"t.jsonl:{i}" for i in range(1, 5)]
    with pytest.raises(ValueError, match="no ood rows"):
        task.sample("ood", 1, 0)
    bad = [r | {"split": "holdout"} for r in _rows(2)]
    with pytest.raises(DataError, match="d.jsonl:1: field 'split'"):
        _task(tmp_path, bad, split_column="split")


def test_demonstrations_come_from_the_completion_column_or_say_why_not(tmp_path):
    task = _task(tmp_path, _rows(20), completion="sol")
    p = task.sample("train", 1, 0)[0]
    assert task.demonstration(p) == p.data["row"]["sol"] and task.corpus_text(p).endswith(
        p.data["row"]["sol"]
    )
    bare = _task(tmp_path, _rows(20))
    with pytest.raises(DataError, match="no demonstration to train on.*completion:.*columns: q, answer, sol"):
        bare.demonstration(bare.sample("train", 1, 0)[0])


def test_unknown_column_is_refused_at_the_task_entry_naming_the_columns(tmp_path):
    _jsonl(tmp_path / "d.jsonl", _rows(5))
    recipe = tmp_path / "r.yaml"
    text = """name: r
model: {preset: nano}
tasks:
  mine:
    task: dataset
    data: d.jsonl
    prompt: question
stages:
  - {kind: pretrain, corpus: {tasks: [mine]}}
"""
    recipe.write_text(text)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert f"{recipe}:7: tasks.mine.prompt:" in str(err.value)
    assert "column 'question'" in str(err.value) and "its columns: q, answer, sol" in str(err.value)
    recipe.write_text(
        text.replace("prompt: question", "prompt: q\n    rewards: [{grader: numeric_match, column: ans}]")
    )
    with pytest.raises(RecipeError, match=r"r.yaml:8: tasks.mine.rewards\[0\]: .*column 'ans'"):
        load_recipe(recipe)
    recipe.write_text(text.replace("d.jsonl", "missing.jsonl"))
    with pytest.raises(RecipeError, match="r.yaml:6: tasks.mine.data: .*missing.jsonl"):
        load_recipe(recipe)


def test_a_changed_data_row_or_reward_function_changes_the_fingerprint(tmp_path):
    (tmp_path / "rw.py").write_text("def r(completions, **kw):\n    return [1.0 for _ in completions]\n")
    before = task_fingerprints({"t": _task(tmp_path, _rows(10), rewards=["rw:r"])})
    assert before == task_fingerprints({"t": _task(tmp_path, _rows(10), rewards=["rw:r"])})
    assert before != task_fingerprints({"t": _task(tmp_path, _rows(11), rewards=["rw:r"])})
    (tmp_path / "rw.py").write_text("def r(completions, **kw):\n    return [0.0 for _ in completions]\n")
    assert before != task_fingerprints({"t": _task(tmp_path, _rows(10), rewards=["rw:r"])})
    assert task_fingerprints({"t": make_recipe_task("arithmetic", {})}) == {}


@pytest.fixture
def nano_dir(tokenizer, tmp_path):
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "nano")
    return tmp_path / "nano"


RL_FLAGS = [
    "--train.steps", "2", "--train.prompts_per_step", "2", "--train.group_size", "4",
    "--train.max_new_tokens", "6", "--train.progress", "false", "--probe_groups", "2",
]  # fmt: skip


@pytest.mark.slow
def test_a_jsonl_task_goes_through_rl_and_eval_from_the_command_line(nano_dir, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(EXAMPLES / "rewards.py", work / "rewards.py")
    shutil.copy(EXAMPLES / "problems.jsonl", work / "problems.jsonl")
    monkeypatch.chdir(work)  # the reward module is importable from the working directory
    data = ["--task-data", "problems.jsonl", "--prompt-column", "question", "--reward", "rewards:correct"]
    data += ["--reward", "rewards:formatted", "--task-option", "problems.test_fraction=0.2"]
    gate = [
        "--task-option",
        r"problems.format=Answer: (-?\d+)$",
        "--gate.min_parse_rate",
        "0",
        "--gate.n_problems",
        "4",
    ]
    assert main(["rl", "--model", str(nano_dir), "--out", "rl", *data, *gate, *RL_FLAGS]) == 0
    assert json.loads((work / "rl" / "rl.json").read_text())["gate"]["parse_rates"] == {
        "problems/parse_rate": 0.0
    }
    rollouts = [json.loads(line) for line in (work / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 4 and rollouts[0]["prompt"].startswith(
        ("Tom", "Ann", "Bo", "Eve", "Max", "Ida", "Sam", "Lu")
    )
    metrics = [json.loads(line) for line in (work / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert {"reward_fn/correct", "reward_fn/formatted"} <= set(metrics[0])  # each function logged on its own
    probe = json.loads((work / "rl" / "probe.json").read_text())["probe"]
    assert probe["groups"] == 2 and "zero_variance/all_wrong" in probe
    args = ["eval", "--model", str(work / "rl" / "model"), "--out", "ev", *data]
    assert (
        main([*args, "--n_problems", "8", "--k", "2", "--max_new_tokens", "6"]) == 0
    )  # splits: test (no ood)
    result = json.loads((work / "ev" / "eval.json").read_text())["problems"]["rl"]["test"]
    assert result["n_problems"] == 8 and result["verifier_errors"] == 0 and "pass@2" in result["metrics"]
    assert "problems / rl" in capsys.readouterr().out


@pytest.mark.slow
def test_a_parquet_task_goes_through_a_recipe_with_gate_probe_rl_and_eval(nano_dir, tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(line) for line in (EXAMPLES / "problems.jsonl").read_text().splitlines()]
    folder = tmp_path / "proj"
    folder.mkdir()
    datasets.Dataset.from_list(rows[:200]).to_parquet(str(folder / "problems.parquet"))
    (folder / "my_rewards.py").write_text(
        "import asyncio\n\n\nasync def right(completions, answer, **kw):\n    await asyncio.sleep(0)\n"
        "    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answer)]\n"
    )
    recipe = folder / "r.yaml"
    recipe.write_text(f"""name: r
model: {{path: {nano_dir}}}
tasks:
  words:
    task: dataset
    data: problems.parquet
    prompt: question
    rewards: [my_rewards:right, numeric_match]
    reward_weights: [1.0, 0.5]
    format: 'Answer: (-?\\d+)$'
    test_fraction: 0.2
stages:
  - kind: rl
    tasks: [words]
    gate: {{min_parse_rate: 0.0, n_problems: 4}}
    probe_groups: 2
    train: {{steps: 2, prompts_per_step: 2, group_size: 4, max_new_tokens: 6, progress: false}}
  - kind: eval
    splits: [test]
    n_problems: 6
    k: 2
    max_new_tokens: 6
""")
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    rl = json.loads((run / "01-rl" / "rl.json").read_text())
    assert rl["steps"] == 2 and rl["gate"]["passed"] and rl["probe"]["groups"] == 2
    assert rl["gate"]["parse_rates"]["words/parse_rate"] == 0.0  # an untrained model never writes the format
    results = json.loads((run / "02-eval" / "eval.json").read_text())["words"]
    assert "rl" in results  # (and the starting model, where the eval stage adds it)
    assert all(r["test"]["n_problems"] == 6 and r["test"]["verifier_errors"] == 0 for r in results.values())
    assert (run / "report.html").exists()


def test_a_reasoning_gym_data_set_is_a_task_graded_by_its_own_verifier(tmp_path):
    pytest.importorskip("reasoning_gym")
    task = make_recipe_task(
        "legs", {"task": "reasoning_gym", "dataset": "leg_counting", "size": 60, "seed": 1}
    )
    train, test = task.sample("train", 100, 0), task.sample("test", 100, 0)
    assert len(train) == 100 and 0 < len(test) < 60 and not {p.id for p in train} & {p.id for p in test}
    p = test[0]
    right = task.score(p, f"Count them.\nAnswer: {p.data['entry']['answer']}")
    assert (right.reward, right.correct, right.parsed) == (1.0, True, True)
    wrong = task.score(p, "<answer>-1</answer>")
    assert (wrong.correct, wrong.parsed) == (False, True)
    assert not task.score(p, "many legs").parsed
    assert task.score(p, task.demonstration(p)).correct
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: r\nmodel: {preset: nano}\ntasks:\n  legs:\n    task: reasoning_gym\n    dataset: leg_countin\n"
        "stages:\n  - {kind: pretrain, corpus: {tasks: [legs]}}\n"
    )
    with pytest.raises(RecipeError, match="r.yaml:6: tasks.legs.dataset: .*did you mean 'leg_counting'"):
        load_recipe(recipe)
