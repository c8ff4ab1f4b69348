"""Reward functions named in a recipe are called as TRL calls them, and the built-in graders grade
the forms users write: checked against TRL's own `_calculate_rewards`, with functions copied from
TRL's documentation."""

import json
import re
import types

import pytest

from temper.catalog import make_recipe_task
from temper.recipe import RecipeError, load_recipe
from temper.tasks.base import VERIFIER_ERROR, grade_batch
from temper.tasks.reward_functions import Grader, load_reward_function, make_grader, parse_number

# --- TRL's documentation examples, verbatim (docs/source/grpo_trainer.md, "Using a custom reward function")


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


MODULE = f"""
import re

{__import__("inspect").getsource(reward_func)}

{__import__("inspect").getsource(format_reward_func)}

CALLS = []


def recording(prompts, completions, completion_ids, **kwargs):
    CALLS.append({{"prompts": prompts, "completions": completions, "completion_ids": completion_ids,
                  "kwargs": sorted(kwargs)}})
    return [float(len(c if isinstance(c, str) else c[0]["content"])) for c in completions]


async def slow_length(completions, **kwargs):
    import asyncio

    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def picky(completions, **kwargs):
    return [1.0 / (len(c) - 3) for c in completions]  # ZeroDivisionError on a 3-character completion


def abstains(completions, **kwargs):
    return [None if c.startswith("skip") else 2.0 for c in completions]
"""


def _write(tmp_path, rows, name="data.jsonl"):
    (tmp_path / "my_rewards.py").write_text(MODULE)
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


STANDARD = [
    {"prompt": "Solve 1+1.", "ground_truth": "2", "split": "train"},
    {"prompt": "Solve 2+2.", "ground_truth": "4", "split": "test"},
]
CONVERSATIONAL = [
    {
        "prompt": [{"role": "system", "content": "Think."}, {"role": "user", "content": "Solve 1+1."}],
        "split": "train",
    },
    {"prompt": [{"role": "user", "content": "Solve 2+2."}], "split": "test"},
]


def _task(tmp_path, rows, rewards, **options):
    _write(tmp_path, rows)
    entry = {"task": "dataset", "data": "data.jsonl", "rewards": rewards}
    entry |= {"split_column": "split"} if "split" in rows[0] else {}
    entry |= options
    return make_recipe_task("mine", entry, tmp_path)


def _trl_rewards(functions, rows, completions, completion_ids):
    """TRL 1.16's GRPOTrainer._calculate_rewards on a stand-in trainer (one process)."""
    from accelerate import PartialState
    from trl.trainer.grpo_trainer import GRPOTrainer

    PartialState(cpu=True)
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device="cpu", is_main_process=True),
        reward_funcs=functions,
        reward_processing_classes=[None] * len(functions),
        reward_func_names=[f.__name__ for f in functions],
        state=types.SimpleNamespace(global_step=0),
        args=types.SimpleNamespace(report_to=[]),
        _log_completion_extra=None,
        _log_metric=None,
        environments=None,
    )
    prompts = [r["prompt"] for r in rows]
    return GRPOTrainer._calculate_rewards(trainer, rows, prompts, completions, completion_ids).tolist()


def test_trl_documented_reward_functions_work_unchanged_and_match_trl(tmp_path):
    pytest.importorskip("trl")
    texts = ["so \\boxed{2}", "\\boxed{5}", "<think>a</think><answer>4</answer>", "no"]
    ids = [[1, 2], [3], [4, 5, 6], [7]]

    task = _task(tmp_path, STANDARD, ["my_rewards:reward_func"])
    problems = task.sample("train", 1, 0) + task.sample("test", 1, 0)
    batch = [problems[i % 2] for i in range(4)]
    scores = grade_batch(task, batch, texts, ids)
    rows = [p.data["row"] for p in batch]
    want = _trl_rewards([reward_func], rows, texts, ids)
    assert [s.reward for s in scores] == [w[0] for w in want]
    assert any(s.reward == 1.0 for s in scores) and any(s.reward == 0.0 for s in scores)

    task = _task(tmp_path, CONVERSATIONAL, ["my_rewards:format_reward_func", "my_rewards:recording"])
    problems = task.sample("train", 1, 0) + task.sample("test", 1, 0)
    batch = [problems[i % 2] for i in range(4)]
    scores = grade_batch(task, batch, texts, ids)
    rows = [p.data["row"] for p in batch]
    conversational = [[{"role": "assistant", "content": t}] for t in texts]  # as TRL passes them
    module = load_reward_function("my_rewards:recording", tmp_path).fn.__globals__
    want = _trl_rewards([format_reward_func, module["recording"]], rows, conversational, ids)
    got = [[s.details["rewards"]["format_reward_func"], s.details["rewards"]["recording"]] for s in scores]
    assert got == want
    assert got[2][0] == 1.0 and got[0][0] == 0.0
    # what the function saw from temper is what it saw from TRL (less TRL's trainer hooks)
    ours, trls = module["CALLS"][0], module["CALLS"][1]
    assert ours["prompts"] == trls["prompts"] == [r["prompt"] for r in rows]
    assert ours["completions"] == trls["completions"] == conversational
    assert ours["completion_ids"] == trls["completion_ids"] == ids
    assert ours["kwargs"] == [
        k for k in trls["kwargs"] if k not in ("trainer_state", "log_extra", "log_metric")
    ]


def test_a_messages_prompt_reaches_the_policy_whole(tmp_path, tokenizer):
    from temper.data.chat import prompt_ids

    task = _task(tmp_path, CONVERSATIONAL, ["my_rewards:format_reward_func"])
    problem = next(p for s in ("train", "test") for p in task.sample(s, 1, 0) if len(p.data["prompt"]) == 2)
    assert problem.messages() == CONVERSATIONAL[0]["prompt"] and problem.prompt == "Solve 1+1."
    text = tokenizer.decode(prompt_ids(tokenizer, problem.messages()))
    assert "Think." in text and "Solve 1+1." in text


def test_async_rewards_are_awaited_and_weights_and_none_apply(tmp_path):
    task = _task(
        tmp_path,
        STANDARD,
        ["my_rewards:slow_length", "my_rewards:abstains"],
        reward_weights=[0.5, 3.0],
        correct_threshold=4,
    )
    p = task.sample("train", 1, 0)[0]
    scores = task.score_batch([p, p], ["abcd", "skip"])
    # TRL: nansum of weight x reward, None counting as nan
    assert [s.reward for s in scores] == [0.5 * 4 + 3.0 * 2, 0.5 * 4]
    assert scores[1].details["rewards"]["abstains"] is None
    assert [s.correct for s in scores] == [True, True]  # the first reward (4) reaches the threshold


def test_a_raising_reward_marks_only_its_completion_as_a_verifier_error(tmp_path):
    task = _task(tmp_path, STANDARD, ["my_rewards:picky"])
    p = task.sample("train", 1, 0)[0]
    scores = grade_batch(task, [p] * 3, ["abcde", "abc", "ab"])
    assert [s.details["reason"] for s in scores] == ["wrong", VERIFIER_ERROR, "wrong"]
    assert "ZeroDivisionError" in scores[1].details["error"] and scores[1].reward == 0.0
    assert scores[0].reward == pytest.approx(0.5) and scores[2].reward == -1.0


@pytest.mark.parametrize(
    "answer, reference, ok",
    [
        ("1/2", "\\frac{1}{2}", True),
        ("0.5", "\\frac{1}{2}", True),
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{\\dfrac{3}{6}}", "1/2", True),
        ("$\\sqrt{4}$", "2", True),
        ("Answer: 0.25", "1/2", False),
        ("\\boxed{2x+2}", "2(x+1)", True),
    ],
)
def test_math_verify_grader_accepts_equivalent_forms(answer, reference, ok):
    grader = make_grader("math_verify", "answer", None)
    assert grader(completions=[answer], answer=[reference]) == [float(ok)]
    assert grader.extract(answer) is not None


def test_numeric_and_exact_match_read_the_final_answer():
    numeric = make_grader({"grader": "numeric_match", "tolerance": 0.01}, "answer", None)
    texts = ["so 3+4=7", "Answer: 7.001", "\\boxed{1,000}", "Answer: 8", "no number"]
    assert numeric(completions=texts, answer=["7", "7", "1000", "7", "7"]) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert numeric.extract("no number") is None and numeric.extract("x 3 then 12<|end|>") == "12"
    exact = make_grader("exact_match", "label", None)
    assert exact(completions=["Answer: Paris.", "paris", "Answer: Rome"], label=["paris"] * 3) == [
        1.0,
        0.0,
        0.0,
    ]
    assert parse_number("\\frac{3}{4}") == parse_number("0.75") and parse_number("50%") == 50


def test_format_regex_decides_parsed_and_is_what_graders_read(tmp_path):
    rows = [{"prompt": "q", "answer": "7", "split": "train"}]
    task = _task(tmp_path, rows, ["numeric_match", {"grader": "regex"}], format=r"#### (\S+)$")
    p = task.sample("train", 1, 0)[0]
    scores = task.score_batch([p] * 3, ["x #### 7", "Answer: 7", "#### 8"])
    assert [(s.correct, s.parsed) for s in scores] == [(True, True), (False, False), (False, True)]
    assert [s.reward for s in scores] == [2.0, 0.0, 1.0]
    assert Grader("regex", pattern="^a").extract("ba") is None


def test_reward_function_errors_are_located_in_the_recipe(tmp_path):
    _write(tmp_path, STANDARD)
    recipe = tmp_path / "r.yaml"
    base = """name: r
model: {preset: nano}
tasks:
  mine:
    task: dataset
    data: data.jsonl
    rewards:
      - exact_match
      - %s
stages:
  - kind: pretrain
    corpus: {tasks: [mine]}
"""
    cases = {
        "nowhere:fn": ["cannot import module 'nowhere'"],
        "my_rewards:missing": ["no function 'missing'", "reward_func", "format_reward_func"],
        "exact_mach": ["unknown grader 'exact_mach'", "exact_match"],
        "lib/x.py:fn": ["no file"],
    }
    for spec, words in cases.items():
        recipe.write_text(base % spec)
        with pytest.raises(RecipeError) as err:
            load_recipe(recipe)
        message = str(err.value)
        assert f"{recipe}:9: tasks.mine.rewards[1]:" in message, message
        assert all(w in message for w in words), message
