"""A task made from the user's data: splits, sampling, demonstrations, located recipe errors, and
the whole path from a JSONL (CLI, no recipe) and a parquet file (recipe) through RL and eval."""

import datetime
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from temper.catalog import make_recipe_task, task_fingerprints
from temper.cli import main
from temper.data import DataError
from temper.models import build_preset, save_model
from temper.recipe import RecipeError, load_recipe
from temper.tasks.base import Problem, Score, TaskOptionError
from temper.tasks.dataset_task import SPLIT_VALUES, TEST_LABELS, DataTask, DataTaskConfig, _Row

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


# ---- exact cases, folded in from test_dataset_task_exact.py ------------------------------------
# Exact tests of `temper.tasks.dataset_task`: every refusal's whole message and the option or row
# it points at, the split rules, each Score field of a hand-graded batch, demonstrations, corpus
# text, the fingerprint and the reward names. Written against the mutants mutmut left alive
# (TESTING.md).


ROWS = [
    {"prompt": "one", "answer": "1", "completion": "Answer: 1"},
    {"prompt": "two", "answer": "2", "completion": "Answer: 2"},
]


def write(tmp_path, rows, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return name


def task(tmp_path, rows=ROWS, name="t", **options):
    options.setdefault("data", write(tmp_path, rows))
    return DataTask(DataTaskConfig(**options), name, tmp_path)


def refusal(tmp_path, rows=ROWS, **options):
    with pytest.raises(TaskOptionError) as err:
        task(tmp_path, rows, **options)
    return err.value.option, str(err.value)


def test_split_labels():
    assert TEST_LABELS == {
        "test": "test",
        "validation": "test",
        "valid": "test",
        "dev": "test",
        "eval": "test",
    }
    assert SPLIT_VALUES == {"train": "train", "ood": "ood", **TEST_LABELS}


def test_config_normalizes_rewards_and_weights_and_bounds_test_fraction():
    assert DataTaskConfig(rewards="exact_match").rewards == ("exact_match",)
    assert DataTaskConfig(rewards={"grader": "regex"}).rewards == ({"grader": "regex"},)
    assert DataTaskConfig(rewards=["a:b", "c:d"]).rewards == ("a:b", "c:d")
    assert DataTaskConfig(reward_weights=[1, "2"]).reward_weights == (1.0, 2.0)
    assert DataTaskConfig().reward_weights is None
    for fraction in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(TaskOptionError) as err:
            DataTaskConfig(test_fraction=fraction)
        assert (err.value.option, str(err.value)) == (("test_fraction",), "test_fraction must be in (0, 1)")
    assert DataTaskConfig(test_fraction=0.999).test_fraction == 0.999


def test_option_refusals_name_the_option(tmp_path):
    with pytest.raises(TaskOptionError) as err:
        DataTask(DataTaskConfig(), "t", tmp_path)
    assert (err.value.option, str(err.value)) == (
        ("data",),
        "task 't': a dataset task needs `data` (a file, folder or hub id)",
    )
    assert refusal(tmp_path, reward_weights=(1.0, 2.0)) == (
        ("reward_weights",),
        "2 reward_weights for 1 rewards: give one weight per reward",
    )
    assert refusal(tmp_path, rewards=()) == (("rewards",), "task 't': give at least one reward")
    assert refusal(tmp_path, rewards=("exact", "numeric_match")) == (
        ("rewards", 0),
        "task 't': unknown grader 'exact'; built-in graders: exact_match, numeric_match, math_verify, regex "
        "(built-in graders: exact_match, numeric_match, math_verify, regex; yours: module:function)",
    )
    option, message = refusal(tmp_path, rewards=("exact_match", "nomod_xyz:f"))
    assert option == ("rewards", 1)
    assert message == (
        f"task 't': reward 'nomod_xyz:f': cannot import module 'nomod_xyz': no nomod_xyz.py in {tmp_path} "
        "and no installed module (No module named 'nomod_xyz')"
    )
    assert refusal(tmp_path, rewards=(3,)) == (
        ("rewards", 0),
        "task 't': a reward is a string or a mapping, not 3 "
        "(built-in graders: exact_match, numeric_match, math_verify, regex; yours: module:function)",
    )
    assert refusal(tmp_path, rewards=("regex",), format=None)[0] == ("rewards", 0)
    assert refusal(tmp_path, format="(bad")[0] == ("rewards", 0)  # the grader compiles the task's format


def test_columns_the_task_reads_must_be_in_the_data(tmp_path):
    path = str(tmp_path / "d.jsonl")
    assert refusal(tmp_path, prompt="question") == (
        ("prompt",),
        f"task 't': column 'question' (prompt) is not in {path}; its columns: prompt, answer, completion",
    )
    assert refusal(tmp_path, split_column="split")[0] == ("split_column",)
    assert refusal(tmp_path, id="key")[0] == ("id",)
    assert refusal(tmp_path, completion="solution")[0] == ("completion",)
    assert refusal(tmp_path, answer="gold") == (
        ("answer",),
        f"task 't': column 'gold' (answer) is not in {path}; its columns: prompt, answer, completion",
    )
    assert refusal(tmp_path, rewards=("exact_match", {"grader": "numeric_match", "column": "gold"})) == (
        ("rewards", 1),
        f"task 't': column 'gold' (rewards.1) is not in {path}; its columns: prompt, answer, completion",
    )
    # a regex grader reads no column; a user function has none either
    assert (
        task(tmp_path, rewards=({"grader": "regex", "column": "gold", "pattern": "x"},)).rewards[0].name
        == "regex"
    )
    write(tmp_path, [], "empty.jsonl")
    assert refusal(tmp_path, data="empty.jsonl") == (("data",), "task 't': 'empty.jsonl' has no rows")
    assert refusal(tmp_path, data="missing.jsonl") == (
        ("data",),
        f"{str(tmp_path / 'missing.jsonl')!r} does not exist (tried {tmp_path / 'missing.jsonl'})",
    )
    assert refusal(tmp_path, test_data="missing.jsonl")[0] == ("test_data",)
    assert refusal(tmp_path, ood_data="missing.jsonl")[0] == ("ood_data",)
    assert refusal(tmp_path, test_split="test")[0] == ("test_split",)  # a file has no splits
    assert refusal(tmp_path, data_split="test")[0] == ("data_split",)


def test_a_row_without_a_column_the_task_reads_is_a_data_error(tmp_path):
    rows = ROWS + [{"answer": "3"}]
    with pytest.raises(DataError) as err:
        task(tmp_path, rows)
    assert str(err.value) == f"{tmp_path / 'd.jsonl'}:3: field 'prompt': missing (the task's prompt)"
    rows = ROWS + [{"prompt": "x"}]
    with pytest.raises(DataError) as err:
        task(tmp_path, rows, rewards=("exact_match", {"grader": "exact_match", "column": "completion"}))
    assert str(err.value) == f"{tmp_path / 'd.jsonl'}:3: field 'answer': missing (the task's answer)"
    with pytest.raises(DataError) as err:
        task(tmp_path, ROWS + ["a string"])
    assert (
        str(err.value)
        == f"{tmp_path / 'd.jsonl'}:3: field '<row>': must be an object (a mapping of column to value)"
    )
    # only the first 100 rows are searched for the column: a later one alone is a row error
    many = [{"answer": str(i)} for i in range(100)] + [{"prompt": "p", "answer": "x"}]
    assert refusal(tmp_path, many)[0] == ("prompt",)
    many = [{"answer": str(i), "prompt": "p"} for i in range(99)] + [{"answer": "a"}, {"prompt": "p"}]
    with pytest.raises(DataError, match=":100: field 'prompt'"):
        task(tmp_path, many, rewards=("regex",), format="x")


def test_split_column_values(tmp_path):
    rows = [
        {"prompt": f"p{i}", "answer": "a", "split": s}
        for i, s in enumerate(["train", "TEST", "Validation", "valid", "dev", "eval", "ood", "train"])
    ]
    t = task(tmp_path, rows, split_column="split")
    assert [p.prompt for p in t._splits["train"]] == ["p0", "p7"]
    assert [p.prompt for p in t._splits["test"]] == ["p1", "p2", "p3", "p4", "p5"]
    assert [p.prompt for p in t._splits["ood"]] == ["p6"]
    rows.append({"prompt": "p", "answer": "a", "split": "holdout"})
    with pytest.raises(DataError) as err:
        task(tmp_path, rows, split_column="split")
    assert str(err.value) == (
        f"{tmp_path / 'd.jsonl'}:9: field 'split': split 'holdout' is not one of "
        "train, ood, test, validation, valid, dev, eval"
    )


def test_test_data_test_split_and_ood_data(tmp_path):
    write(tmp_path, [{"prompt": "t1", "answer": "a"}], "test.jsonl")
    write(tmp_path, [{"prompt": "o1", "answer": "a"}, {"prompt": "o2", "answer": "a"}], "ood.jsonl")
    t = task(tmp_path, test_data="test.jsonl", ood_data="ood.jsonl")
    assert [p.prompt for p in t._splits["train"]] == ["one", "two"]
    assert [p.prompt for p in t._splits["test"]] == ["t1"]
    assert [p.prompt for p in t._splits["ood"]] == ["o1", "o2"]
    assert [p.split for p in t._splits["ood"]] == ["ood", "ood"]
    write(tmp_path, [{"question": "t1"}], "bad.jsonl")
    assert refusal(tmp_path, test_data="bad.jsonl")[0] == ("prompt",)
    assert refusal(tmp_path, ood_data="bad.jsonl")[0] == ("prompt",)


def test_test_split_of_a_saved_data_set(tmp_path):
    import datasets

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS),
            "test": datasets.Dataset.from_list([{"prompt": "t", "answer": "a", "completion": "c"}]),
        }
    ).save_to_disk(str(tmp_path / "dd"))
    t = task(tmp_path, data="dd", test_split="test")
    assert [p.prompt for p in t._splits["train"]] == ["one", "two"]
    assert [(p.prompt, p.id) for p in t._splits["test"]] == [("t", "dd[test]:1")]
    t = task(tmp_path, data="dd", data_split="test")
    assert [p.prompt for p in t._splits["train"] + t._splits["test"]] == ["t"]


def test_the_split_key_and_problem_ids(tmp_path):
    t = task(tmp_path)
    chat = [{"role": "user", "content": "x"}]
    assert t._key(_Row("s", 1, {"prompt": chat})) == '[{"content": "x", "role": "user"}]'
    assert t._key(_Row("s", 1, {"prompt": "é"})) == '"\\u00e9"'
    rows = [{"prompt": "p", "answer": "a", "key": 7}]
    t = task(tmp_path, rows, id="key", test_fraction=0.5)
    assert t._key(_Row("s", 1, rows[0])) == "id:7"
    (problem,) = t._splits["train"] + t._splits["test"]
    assert problem.id == "7"
    t = task(tmp_path, rows)
    (problem,) = t._splits["train"] + t._splits["test"]
    assert problem.id == "d.jsonl:1"
    assert problem.data == {"prompt": "p", "row": rows[0], "source": str(tmp_path / "d.jsonl"), "line": 1}
    assert (problem.task, problem.prompt, problem.chat) == ("t", "p", None)


def test_chat_prompts(tmp_path):
    system = {"role": "system", "content": "sys"}
    rows = [
        {
            "prompt": [
                system,
                {"role": "user", "content": "u1"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "u2"},
            ]
        },
        {"prompt": [system]},
    ]
    t = task(tmp_path, rows, rewards=("regex",), format="x", test_fraction=0.01)
    problems = t._splits["train"] + t._splits["test"]
    assert [p.prompt for p in problems] == ["u2", "sys"]
    assert problems[0].chat == rows[0]["prompt"] and problems[0].chat is not rows[0]["prompt"]
    for bad in ([{"role": "user"}], 3, [], ["text"]):
        with pytest.raises(DataError) as err:
            task(tmp_path, [{"prompt": bad}], rewards=("regex",), format="x")
        assert str(err.value) == (
            f"{tmp_path / 'd.jsonl'}:1: field 'prompt': a prompt is a string or a list of {{role, content}} messages"
        )


def test_sample_without_rows_says_what_to_give(tmp_path):
    t = task(tmp_path, [{"prompt": "p", "answer": "a", "s": "train"}], split_column="s")
    for split, how in [
        ("ood", "give ood_data, or evaluate with splits: [test]"),
        ("test", "give test_data, test_split, a split_column, or a larger data set"),
    ]:
        with pytest.raises(ValueError) as err:
            t.sample(split, 1, 0)
        assert str(err.value) == f"task 't' has no {split} rows: {how}"
    t = task(tmp_path, [{"prompt": "p", "answer": "a", "s": "test"}], split_column="s")
    with pytest.raises(ValueError) as err:
        t.sample("train", 1, 0)
    assert str(err.value) == "task 't' has no train rows: check split_column / test_fraction"
    assert [p.prompt for p in t.sample("test", 5, 0)] == ["p"]  # held out: no repeats
    with pytest.raises(ValueError, match="unknown split"):
        t.sample("dev", 1, 0)


def test_sample_is_seeded_and_train_repeats(tmp_path):
    rows = [{"prompt": f"p{i}", "answer": "a", "s": "train"} for i in range(3)]
    t = task(tmp_path, rows, split_column="s")
    got = t.sample("train", 7, 3)
    assert len(got) == 7 and sorted(p.prompt for p in got[:3]) == ["p0", "p1", "p2"]
    assert [p.prompt for p in got] == [p.prompt for p in t.sample("train", 7, 3)]


def test_a_graded_batch_field_by_field(tmp_path):
    rows = [{"prompt": "p", "answer": "12", "s": "train"}]
    (tmp_path / "r.py").write_text(
        "def half(completions, **kw):\n    return [0.5 if 'Answer' in c else None for c in completions]\n"
    )
    t = task(
        tmp_path,
        rows,
        split_column="s",
        rewards=("numeric_match", "r:half", "r.py:half"),
        reward_weights=(2.0, 3.0, 1.0),
    )
    (p,) = t.sample("train", 1, 0)
    scores = t.score_batch([p, p, p], ["Answer: 12", "Answer: 13", "no number"])
    assert scores == [
        Score(
            4.0,
            True,
            True,
            {
                "reason": "correct",
                "answer": "12",
                "rewards": {"numeric_match": 1.0, "half": 0.5, "half#2": 0.5},
            },
        ),
        Score(
            2.0,
            False,
            True,
            {
                "reason": "wrong",
                "answer": "13",
                "rewards": {"numeric_match": 0.0, "half": 0.5, "half#2": 0.5},
            },
        ),
        Score(
            0.0,
            False,
            False,
            {
                "reason": "no_answer",
                "answer": None,
                "rewards": {"numeric_match": 0.0, "half": None, "half#2": None},
            },
        ),
    ]
    assert t.score(p, "Answer: 13") == scores[1]
    assert isinstance(scores[0].reward, float)


def test_parsed_by_format_by_the_first_grader_or_always(tmp_path):
    rows = [{"prompt": "p", "answer": "7", "s": "train"}]
    (tmp_path / "r.py").write_text("def one(completions, **kw):\n    return [1.0] * len(completions)\n")
    t = task(tmp_path, rows, split_column="s", rewards=("r:one", "exact_match"), correct_threshold=0.5)
    (p,) = t.sample("train", 1, 0)
    (s,) = t.score_batch([p], ["anything"])
    assert (s.correct, s.parsed, s.details["answer"], s.details["reason"]) == (True, True, None, "correct")
    t = task(tmp_path, rows, split_column="s", rewards=("r:one",), correct_threshold=1.5)
    (s,) = t.score_batch([p], ["anything"])
    assert (s.correct, s.parsed, s.details["reason"]) == (False, True, "wrong")
    t = task(tmp_path, rows, split_column="s", format=r"ANS=(\d+)<?")
    (s,) = t.score_batch([p], ["ANS=7 <|end|>"])
    assert (s.correct, s.parsed, s.details["answer"]) == (True, True, "7")
    (s,) = t.score_batch([p], ["Answer: 7"])
    assert (s.correct, s.parsed, s.details["reason"]) == (False, False, "no_answer")


def test_a_raising_reward_is_a_verifier_error_of_its_completion(tmp_path):
    rows = [{"prompt": "p", "answer": "7", "s": "train"}]
    (tmp_path / "r.py").write_text(
        "def picky(completions, **kw):\n    return [1.0 / (len(c) - 1) for c in completions]\n"
    )
    t = task(tmp_path, rows, split_column="s", rewards=("r:picky",))
    (p,) = t.sample("train", 1, 0)
    ok, broken = t.score_batch([p, p], ["ab", "a"])
    assert ok == Score(1.0, True, True, {"reason": "correct", "answer": None, "rewards": {"picky": 1.0}})
    assert broken == Score(
        0.0,
        False,
        False,
        {
            "reason": "verifier_error",
            "error": "reward function r:picky raised on problem d.jsonl:1: ZeroDivisionError: float "
            "division by zero (at r.py:2)",
        },
    )


def test_demonstrations(tmp_path):
    rows = [
        {"prompt": "p1", "answer": "a", "completion": "plain", "s": "train"},
        {
            "prompt": "p2",
            "answer": "a",
            "completion": [
                {"role": "assistant", "content": "x"},
                {"role": "assistant"},
                "junk",
                {"content": "y"},
            ],
            "s": "train",
        },
        {"prompt": "p3", "answer": "a", "completion": None, "s": "train"},
    ]
    t = task(tmp_path, rows, split_column="s")
    assert t.completion == "completion"
    p1, p2, p3 = sorted(t._splits["train"], key=lambda p: p.prompt)
    assert t.demonstration(p1) == "plain"
    assert t.demonstration(p2) == "xy"
    with pytest.raises(DataError) as err:
        t.demonstration(p3)
    assert str(err.value) == (
        f"{tmp_path / 'd.jsonl'}:3: field 'completion': task 't' has no demonstration to train on: set the "
        "task's `completion:` to a column holding one (columns: prompt, answer, completion, s), or leave "
        "this task out of SFT"
    )
    assert t.corpus_text(p1) == "p1\nplain"
    assert t.corpus_text(p3) == "p3"
    bare = task(tmp_path, [{"prompt": "q", "answer": "a", "s": "train"}], split_column="s")
    assert bare.completion is None
    (q,) = bare._splits["train"]
    with pytest.raises(DataError) as err:
        bare.demonstration(q)
    assert str(err.value).startswith(
        f"{tmp_path / 'd.jsonl'}:1: field 'completion': task 't' has no demonstration"
    )
    named = task(
        tmp_path,
        [{"prompt": "q", "answer": "a", "sol": "s1", "completion": "c"}],
        completion="sol",
        test_fraction=0.01,
    )
    assert named.completion == "sol" and named.demonstration(named.sample("train", 1, 0)[0]) == "s1"


def test_corpus_text_of_a_chat_prompt(tmp_path):
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    t = task(tmp_path, [{"prompt": chat, "answer": "a", "completion": "c"}], test_fraction=0.01)
    (p,) = t.sample("train", 1, 0)
    assert t.corpus_text(p) == "s\nu\nc"


def test_the_fingerprint(tmp_path):
    a = task(tmp_path, [{"prompt": "p", "answer": "1"}])
    fp = a.fingerprint()
    assert len(fp) == 16 and int(fp, 16) >= 0
    # the same rows with the keys in another order: the same fingerprint
    assert task(tmp_path, [{"answer": "1", "prompt": "p"}]).fingerprint() == fp
    assert task(tmp_path, [{"prompt": "p", "answer": "2"}]).fingerprint() != fp
    assert task(tmp_path, [{"prompt": "p", "answer": "1"}], rewards=("numeric_match",)).fingerprint() != fp
    # a value JSON has no form for (a parquet timestamp) is hashed by its text
    table = pa.Table.from_pylist([{"prompt": "p", "answer": "1", "when": datetime.datetime(2020, 1, 2)}])
    pq.write_table(table, tmp_path / "t.parquet")
    assert len(task(tmp_path, data="t.parquet").fingerprint()) == 16


def test_reward_names_are_python_names_numbered_on_repeats(tmp_path):
    (tmp_path / "r.py").write_text("def f(completions, **kw):\n    return [1.0] * len(completions)\n")
    t = task(tmp_path, rewards=("r:f", "r.py:f", "exact_match", "r:f", {"grader": "exact_match"}))
    assert t._names() == ["f", "f#2", "exact_match", "f#3", "exact_match#2"]


def test_build_and_base_dir(tmp_path, monkeypatch):
    write(tmp_path, ROWS)
    t = DataTask.build(DataTaskConfig(data="d.jsonl"), "b", tmp_path)
    assert (t.name, t.base_dir, t.weights) == ("b", tmp_path, (1.0,))
    monkeypatch.chdir(tmp_path)
    t = DataTask(DataTaskConfig(data="d.jsonl"))
    assert (t.name, t.base_dir) == ("dataset", tmp_path)
    assert isinstance(t.sample("train", 1, 0)[0], Problem)


def test_a_chat_prompt_is_named_by_its_last_user_turn(tmp_path):
    chat = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    t = task(tmp_path, [{"prompt": chat, "answer": "x"}], test_fraction=0.01)
    (p,) = t.sample("train", 1, 0)
    assert p.prompt == "u" and p.messages() == chat


def test_the_format_decides_parsed_even_for_a_user_function(tmp_path):
    rows = [{"prompt": "p", "answer": "7", "s": "train"}]
    (tmp_path / "r.py").write_text("def one(completions, **kw):\n    return [0.0] * len(completions)\n")
    t = task(tmp_path, rows, split_column="s", rewards=("r:one",), format=r"ANS=\d")
    (p,) = t.sample("train", 1, 0)
    assert [(s.parsed, s.details["reason"]) for s in t.score_batch([p, p], ["ANS=3", "nothing"])] == [
        (True, "wrong"),
        (False, "no_answer"),
    ]


def test_test_data_wins_over_test_split(tmp_path):
    write(tmp_path, [{"prompt": "t1", "answer": "a"}], "test.jsonl")
    t = task(tmp_path, test_data="test.jsonl", test_split="test")  # a file has no splits: not read as one
    assert [p.prompt for p in t._splits["test"]] == ["t1"]
