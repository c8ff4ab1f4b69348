"""Reward functions named in a recipe are called as TRL calls them, and the built-in graders grade
the forms users write: checked against TRL's own `_calculate_rewards`, with functions copied from
TRL's documentation."""

import asyncio
import json
import re
import sys
import threading
import types
from fractions import Fraction

import pytest

from temper import guard
from temper.catalog import make_recipe_task
from temper.guard import Done, UserCodeFailure
from temper.recipe import RecipeError, load_recipe
from temper.tasks import reward_functions as rf
from temper.tasks.base import VERIFIER_ERROR, grade_batch
from temper.tasks.reward_functions import (
    EXCLUDED_COLUMNS,
    GRADER_OPTIONS,
    GRADERS,
    Grader,
    RewardFunction,
    call_all,
    completions_as_trl,
    extract_final,
    is_conversational,
    last_boxed,
    load_reward_function,
    make_grader,
    parse_number,
)

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


# ---- exact cases, folded in from test_reward_functions_exact.py --------------------------------
# Exact tests of `temper.tasks.reward_functions`: the loading errors a recipe author reads (whole
# messages), TRL's batch call (columns, ids, retries one completion at a time, NaN and inf refused,
# the time limit, every failure's one line), and
# every built-in grader's extraction and comparison on hand-picked texts. Written against the
# mutants mutmut left alive (TESTING.md).


USER = [{"role": "user", "content": "q"}]


def test_constants():
    assert EXCLUDED_COLUMNS == ("prompt", "completion", "completion_ids")
    assert GRADERS == ("exact_match", "numeric_match", "math_verify", "regex")
    assert GRADER_OPTIONS == ("grader", "column", "tolerance", "pattern")


def test_is_conversational_and_trl_completions():
    assert is_conversational(USER)
    for prompt in ("q", [], [{"content": "q"}], ["q"], None):
        assert not is_conversational(prompt)
    assert completions_as_trl([USER, "q"], ["a", "b"]) == [[{"role": "assistant", "content": "a"}], "b"]
    with pytest.raises(ValueError):
        completions_as_trl(["q"], ["a", "b"])


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("spec", ["nocolon", ":fn", "mod:"])
def test_a_spec_that_is_not_module_colon_function(spec):
    with pytest.raises(ValueError) as err:
        load_reward_function(spec)
    assert str(err.value) == (
        f"reward {spec!r}: expected module:function or path/to/file.py:function, "
        "or a built-in grader (exact_match, numeric_match, math_verify, regex)"
    )


def test_a_missing_file_module_or_function(tmp_path):
    with pytest.raises(ValueError) as err:
        load_reward_function("sub/r.py:f", tmp_path)
    assert str(err.value) == f"reward 'sub/r.py:f': no file {str(tmp_path / 'sub/r.py')!r}"
    with pytest.raises(ValueError) as err:
        load_reward_function("no_such_mod_xyz:f", tmp_path)
    assert str(err.value) == (
        f"reward 'no_such_mod_xyz:f': cannot import module 'no_such_mod_xyz': no no_such_mod_xyz.py in "
        f"{tmp_path} and no installed module (No module named 'no_such_mod_xyz')"
    )
    (tmp_path / "mine.py").write_text(
        "import os\nclass K: pass\ndef b(): pass\ndef a(): pass\ndef _p(): pass\nX = 1\n"
    )
    with pytest.raises(ValueError) as err:
        load_reward_function("mine:c", tmp_path)
    assert str(err.value) == "reward 'mine:c': module 'mine' has no function 'c'; its functions: a, b"
    (tmp_path / "empty.py").write_text("X = 1\n")
    with pytest.raises(ValueError) as err:
        load_reward_function("empty:X", tmp_path)
    assert str(err.value) == "reward 'empty:X': module 'empty' has no function 'X'"


def test_a_module_that_raises_on_import(tmp_path):
    (tmp_path / "bad.py").write_text("raise RuntimeError('boom')\n")
    path_before = list(sys.path)
    with pytest.raises(ValueError) as err:
        load_reward_function("bad:f", tmp_path)
    file = str((tmp_path / "bad.py").resolve())
    assert str(err.value) == f"reward module {file!r} raised on import: RuntimeError: boom (at bad.py:1)"
    assert sys.path == path_before
    (tmp_path / "envs.py").write_text("import nosuchmodule\n")
    with pytest.raises(ValueError) as err:  # an env module is named as one
        load_reward_function("envs:make", tmp_path, what="env")
    file = str((tmp_path / "envs.py").resolve())
    assert str(err.value) == (
        f"env module {file!r} raised on import: ModuleNotFoundError: No module named 'nosuchmodule' (at envs.py:1)"
    )


def test_local_modules_files_and_installed_modules_load_with_their_source(tmp_path):
    code = "from helper import K\ndef f(completions, **kw):\n    return [K] * len(completions)\n"
    (tmp_path / "helper.py").write_text("K = 3.0\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(code)
    (tmp_path / "r.py").write_text(code)
    for spec in ("pkg.mod:f", "r.py:f", str(tmp_path / "r.py") + ":f"):
        loaded = load_reward_function(spec, tmp_path)
        assert loaded.name == spec and loaded.source == code and loaded.extract is None
        assert loaded.fn(completions=["a", "b"]) == [3.0, 3.0]
        assert str(tmp_path) not in sys.path  # only while the module ran
    installed = load_reward_function("builtins:len", tmp_path)
    assert installed.fn is len and installed.source == ""  # a built-in module has no file
    stdlib = load_reward_function("json:dumps", tmp_path)
    assert stdlib.source == open(json.__file__).read()  # its file's text


def test_a_file_is_executed_once_per_content(tmp_path):
    (tmp_path / "r.py").write_text("RUNS = []\nRUNS.append(1)\ndef f(**kw):\n    return []\n")
    first = load_reward_function("r.py:f", tmp_path)
    again = load_reward_function("r:f", tmp_path)
    assert first.fn is again.fn
    module = sys.modules[first.fn.__module__]
    assert module.__name__.startswith("temper_rewards_") and module.__name__.endswith("_r")
    assert len(module.__name__) == len("temper_rewards_") + 12 + len("_r")
    (tmp_path / "r.py").write_text("RUNS = []\nRUNS.append(2)\ndef f(**kw):\n    return []\n")
    edited = load_reward_function("r.py:f", tmp_path)
    assert edited.fn is not first.fn and sys.modules[edited.fn.__module__].RUNS == [2]


# ---------------------------------------------------------------- calling


def test_call_all_passes_trl_arguments_and_columns():
    seen = []

    def f(prompts, completions, completion_ids, **columns):
        seen.append((prompts, completions, completion_ids, columns))
        return [1, None]

    out = call_all(
        [RewardFunction("f", f)],
        [USER, "p"],
        ["x", "y"],
        None,
        [{"prompt": "p", "answer": 1, "completion": "c"}, {"extra": 2, "answer": 3, "completion_ids": [9]}],
    )
    assert out.values == [[1.0, None]] and out.errors == [None, None]
    assert seen == [
        (
            [USER, "p"],
            [[{"role": "assistant", "content": "x"}], "y"],
            [[], []],
            {"answer": [1, 3], "extra": [None, 2]},
        )
    ]
    assert list(seen[0][3]) == ["answer", "extra"]  # the columns in the order the rows name them
    seen.clear()
    call_all([RewardFunction("f", f)], ["a", "b"], ["x", "y"], [(1, 2), (3,)], [{}, {}])
    assert seen[0][2] == [[1, 2], [3]]


def test_a_raising_batch_is_retried_one_completion_at_a_time_a_miscounted_one_is_not():
    calls = []

    def picky(completions, **kw):
        calls.append(list(completions))
        if "bad" in completions:
            raise ZeroDivisionError("bad one")
        return [float(len(c)) for c in completions]

    def short(completions, **kw):
        return [1.0] * (len(completions) - 1) if len(completions) > 1 else ["x"]

    out = call_all(
        [RewardFunction("picky", picky), RewardFunction("short", short)],
        ["p", "p", "p"],
        ["ab", "bad", "c"],
        None,
        [{}, {}, {}],
    )
    assert calls == [["ab", "bad", "c"], ["ab"], ["bad"], ["c"]]
    assert out.values[0] == [2.0, None, 1.0]
    assert out.values[1] == [None, None, None]
    assert isinstance(out.errors[1].error, ZeroDivisionError)  # the first function's failure is kept
    at = f"test_reward_functions.py:{picky.__code__.co_firstlineno + 3}"
    assert out.errors[1].line == f"reward function picky raised: ZeroDivisionError: bad one (at {at})"
    assert [e.line for e in out.errors[::2]] == [  # short's answer to the batch fails every completion
        "reward function short returned 2 rewards, but 3 were expected (one per prompt-completion pair)"
    ] * 2

    def always(completions, **kw):
        raise ValueError("never")

    [every] = call_all([RewardFunction("always", always)], ["p"] * 2, ["a", "b"], None, [{}] * 2,
                       labels=["problem q"] * 2).errors[:1]  # fmt: skip
    # it fails on each completion alone too: the line of its failure on the batch is kept
    assert every.line.startswith(
        "reward function always raised on problem q (2 completions): ValueError: never"
    )
    labelled = call_all(
        [RewardFunction("rw.py:picky", picky)], ["p"], ["bad"], None, [{}], labels=["problem d:3"]
    )
    assert (
        labelled.errors[0].line
        == f"reward function rw.py:picky raised on problem d:3: ZeroDivisionError: bad one (at {at})"
    )


def _done(value):
    return Done(value=value)


def test_checked_messages_nan_and_inf():
    f = RewardFunction("m.py:f", None)
    assert rf._checked(f, _done([1.0]), 2).line == (
        "reward function m.py:f returned 1 rewards, but 2 were expected (one per prompt-completion pair)"
    )
    assert rf._checked(f, _done([1.0]), 2, "problem a:1").kind == "returned"
    assert (
        rf._checked(f, _done(3), 1).line
        == "reward function m.py:f returned int, not a list of floats or None"
    )
    assert (
        rf._checked(f, _done("1.0"), 1).line
        == "reward function m.py:f returned str, not a list of floats or None"
    )
    for bad in (float("nan"), float("inf"), float("-inf")):  # only that completion fails
        rewards, failures = rf._checked(
            f, _done([2, bad, None]), 3, "", ["problem a:1", "problem a:2", "problem a:3"]
        )
        assert rewards == [2.0, None, None] and failures[0] is None is failures[2]
        assert failures[1].line == (
            f"reward function m.py:f returned a non-finite reward ({bad}) for completion 2: return None where "
            "it does not apply on problem a:2"
        )
    assert rf._checked(f, _done(["0.5"]), 1)[1][0].line == (
        "reward function m.py:f returned str '0.5' for completion 1, not a float or None"
    )
    assert rf._checked(f, _done([True, 2, None]), 3) == ([1.0, 2.0, None], [None] * 3)
    boom = KeyError("k")
    failed = rf._checked(f, Done(error=boom), 1, "problem a:1")
    assert isinstance(failed, UserCodeFailure) and failed.error is boom and failed.kind == "raised"
    assert failed.line == "reward function m.py:f raised on problem a:1: KeyError: 'k'"
    hung = rf._checked(f, Done(timed_out=True, seconds=2.5), 1, "problem a:1")
    assert (hung.kind, hung.line) == (
        "timeout",
        "reward function m.py:f did not return within 2.5 s on problem a:1",
    )


def test_async_functions_are_awaited_also_inside_a_running_loop():
    async def twice(completions, **kw):
        await asyncio.sleep(0)
        return [2.0 * len(c) for c in completions]

    async def fails(completions, **kw):
        raise KeyError("nope")

    def call():
        return call_all([RewardFunction("t", twice), RewardFunction("f", fails)], ["p"], ["abc"], None, [{}])

    out = call()
    assert out.values[0] == [6.0] and out.values[1] == [None]
    assert isinstance(out.errors[0].error, KeyError) and out.errors[0].line.startswith(
        "reward function f raised: KeyError: 'nope'"
    )

    async def inside():
        return call()

    again = asyncio.run(inside())
    assert again.values == out.values


# ---------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "text, boxed",
    [
        ("no box", None),
        (r"\boxed{1} then \boxed{ {2}+{3} }", "{2}+{3}"),
        (r"\boxed {x}", "x"),
        (r"\boxed{unclosed {", None),
        (r"\boxed{}", ""),
        (r"a\boxed{\frac{1}{2}}b", r"\frac{1}{2}"),
    ],
)
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize(
    "text, found",
    [
        ("so Answer: 42 <|end|>", "42"),
        ("Answer: 1\nAnswer: 7</s><|im_end|>", "7"),
        ("Answer:   ", None),
        (r"Answer: 3 \boxed{5}", "5"),
        (r"\boxed{ } Answer: 3", None),
        ("nothing", None),
    ],
)
def test_extract_final_without_a_pattern(text, found):
    assert extract_final(text) == found


def test_extract_final_with_a_pattern():
    assert extract_final("x = 12 done", re.compile(r"x = (\d+)")) == "12"
    assert extract_final("x = 12 done", re.compile(r"x = \d+")) == "x = 12"
    assert extract_final("x = ", re.compile(r"x = (\d*)")) is None
    assert extract_final(r"\boxed{3}", re.compile(r"y = (\d+)")) is None
    assert extract_final("v 5<|eot_id|>", re.compile(r"(\d)$")) == "5"


@pytest.mark.parametrize(
    "text, value",
    [
        ("42", Fraction(42)),
        (" -3.5 ", Fraction(-7, 2)),
        ("1,234", Fraction(1234)),
        ("$12$", Fraction(12)),
        ("7.", Fraction(7)),
        ("1\\!000", Fraction(1000)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"\dfrac{ -1 }{ 2 }", Fraction(-1, 2)),
        ("3/6", Fraction(1, 2)),
        ("50%", Fraction(50)),
        (r"25\%", Fraction(25)),
        ("1e3", Fraction(1000)),
        ("1/0", None),
        ("abc", None),
        (r"\frac{a}{2}", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


def test_grader_extraction_per_grader():
    assert Grader("regex", pattern=r"^\d+$").extract("12") == "12"
    assert Grader("regex", pattern=r"^\d+$").extract("x12") is None
    assert Grader("regex").extract("12") is None  # no pattern: nothing matches
    numeric = Grader("numeric_match")
    assert numeric.extract("I think 3 apples, then 1,200 more.<|end|>") == "1,200"
    assert numeric.extract("no digits") is None
    assert numeric.extract("Answer: 5 of 6") == "5 of 6"  # an Answer: wins over bare numbers
    assert Grader("numeric_match", pattern=r"n=(\d+)").extract("7 8") is None  # a pattern: no fallback
    assert Grader("exact_match").extract("7 8") is None
    assert Grader("exact_match", pattern=r"is (\w+)").extract("it is Paris") == "Paris"
    assert Grader("math_verify", pattern=r"is (\S+)").extract("it is 1/2") == "1/2"


def test_grade_per_grader():
    exact = Grader("exact_match")
    assert exact.grade("Answer:  New   York.", "new york") == 1.0
    assert exact.grade("Answer: York", "new york") == 0.0
    assert exact.grade("nothing", "x") == 0.0
    assert Grader("regex", pattern="ok").grade("ok", None) == 1.0
    with pytest.raises(ValueError) as err:
        exact.grade("Answer: x", None)
    assert str(err.value) == "exact_match: the row has no 'answer' column to compare with"
    numeric = Grader("numeric_match", column="gold", tolerance=0.01)
    assert numeric.grade("Answer: 101", "100") == 1.0  # within 1% of 100
    assert numeric.grade("Answer: 102", "100") == 0.0
    assert numeric.grade("Answer: 0.005", "0") == 1.0  # absolute below 1
    assert numeric.grade("Answer: 0.02", "0") == 0.0
    assert numeric.grade("Answer: 0.5", "0.5") == 1.0
    assert numeric.grade("Answer: -100.5", "-100") == 1.0
    assert numeric.grade("Answer: many", "3") == 0.0
    assert Grader("numeric_match").grade("Answer: 1", 1.0000005) == 1.0  # 1e-6 by default
    assert Grader("numeric_match").grade("Answer: 1", 1.000002) == 0.0
    with pytest.raises(ValueError) as err:
        numeric.grade("Answer: 1", "three")
    assert str(err.value) == "numeric_match: reference 'three' is not a number"
    with pytest.raises(ValueError) as err:
        numeric.grade("Answer: 1", None)
    assert str(err.value) == "numeric_match: the row has no 'gold' column to compare with"


def test_grader_call_reads_its_column_and_both_completion_forms():
    g = Grader("exact_match", column="gold")
    completions = ["Answer: a", [{"role": "assistant", "content": "Answer: "}, {"content": "b"}, "junk"]]
    assert g(prompts=None, completions=completions, gold=["a", "b"], answer=["x", "x"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="no 'gold' column"):
        g(completions=["Answer: a"], answer=["a"])
    assert rf._text([{"role": "assistant"}]) == ""
    assert rf._text(7) == "7"


def test_normalize():
    assert rf._normalize("  The\tAnswer \n IS.  ") == "the answer is"
    assert rf._normalize("3.14") == "3.14"


def test_math_verify_reads_bare_latex_and_plain_text():
    g = Grader("math_verify")
    assert g.grade(r"so $\frac{1}{2}$", r"\frac{1}{2}") == 1.0
    assert g.grade(r"so $\frac{1}{3}$", r"\frac{1}{2}") == 0.0
    assert g.grade("the answer is 0.5", "1/2") == 1.0
    assert g.grade("no math here", "1/2") == 0.0
    assert rf._math_equal("1/2", "") is False
    # a text with a "$" of its own is not wrapped in $...$ again (wrapped, "x$" would parse as x)
    assert rf._math_parse("a $ b") == []
    assert g.grade("x$", "x") == 0.0


# ---------------------------------------------------------------- make_grader


def test_make_grader_defaults_and_options():
    assert make_grader("exact_match", "ans", None) == Grader("exact_match", "ans", 1e-6, None)
    assert make_grader("numeric_match", "ans", r"n=(\d+)") == Grader("numeric_match", "ans", 1e-6, r"n=(\d+)")
    assert make_grader(
        {"grader": "numeric_match", "column": "c", "tolerance": "0.5", "pattern": "p"}, "a", "f"
    ) == (Grader("numeric_match", "c", 0.5, "p"))
    assert make_grader({"grader": "regex"}, "a", "fmt") == Grader("regex", "a", 1e-6, "fmt")


def test_make_grader_refusals():
    with pytest.raises(ValueError) as err:
        make_grader({"grader": "regex", "colum": "x", "tol": 1}, "a", None)
    assert str(err.value) == "unknown grader option 'colum'; valid: grader, column, tolerance, pattern"
    with pytest.raises(ValueError) as err:
        make_grader("exact", "a", None)
    assert (
        str(err.value)
        == "unknown grader 'exact'; built-in graders: exact_match, numeric_match, math_verify, regex"
    )
    with pytest.raises(ValueError) as err:
        make_grader({"column": "a"}, "a", None)
    assert (
        str(err.value)
        == "unknown grader None; built-in graders: exact_match, numeric_match, math_verify, regex"
    )
    with pytest.raises(ValueError) as err:
        make_grader("regex", "a", None)
    assert str(err.value) == "the regex grader needs a pattern (its own `pattern:` or the task's `format:`)"
    with pytest.raises(ValueError) as err:
        make_grader({"grader": "regex", "pattern": ""}, "a", "fmt")
    assert "needs a pattern" in str(err.value)
    with pytest.raises(re.error):
        make_grader("exact_match", "a", "(unclosed")


def test_checked_keeps_none_without_nan():
    assert rf._checked(RewardFunction("f", None), Done(value=[None, 1.0]), 2) == ([None, 1.0], [None, None])


@pytest.fixture
def release():
    """An event the hung functions of a test wait on, set when the test ends; then no thread of
    user code may be left (a hung call's thread ends once released)."""
    event = threading.Event()
    yield event
    event.set()
    for t in guard.user_threads():
        t.join(10)
    assert guard.user_threads() == []


def test_a_hung_function_times_out_once_for_the_whole_batch_and_is_not_retried(release):
    calls = []

    def stuck(completions, **kw):
        calls.append(list(completions))
        release.wait()

    async def stuck_async(completions, **kw):
        await asyncio.get_running_loop().run_in_executor(None, release.wait)

    def fine(completions, **kw):
        return [1.0] * len(completions)

    functions = [RewardFunction("r.py:stuck", stuck), RewardFunction("r.py:fine", fine)]
    with guard.time_limit(0.2):
        out = call_all(functions, ["p", "p"], ["a", "b"], None, [{}, {}], labels=["problem d:1"] * 2)
        assert calls == [["a", "b"]]  # one call: retrying each completion would wait the limit each
        assert out.values == [[None, None], [1.0, 1.0]]
        said = "reward function r.py:stuck did not return within 0.2 s on problem d:1 (2 completions)"
        assert [e.line for e in out.errors] == [said, said] and out.errors[0].kind == "timeout"
        late = call_all([RewardFunction("r.py:stuck_async", stuck_async)], ["p"], ["a"], None, [{}])
        assert late.errors[0].line == "reward function r.py:stuck_async did not return within 0.2 s"


def test_a_function_that_hangs_on_one_completion_of_a_retry_fails_the_rest(release):
    def odd(completions, **kw):
        if len(completions) > 1:
            raise ValueError("not in a batch")
        if completions[0] == "hang":
            release.wait()
        return [1.0]

    with guard.time_limit(0.2):
        out = call_all([RewardFunction("odd", odd)], ["p"] * 3, ["ok", "hang", "ok"], None, [{}] * 3,
                       labels=["problem a", "problem b", "problem c"])  # fmt: skip
    assert out.values == [[1.0, None, None]]
    assert [e and e.line for e in out.errors] == [
        None,
        "reward function odd did not return within 0.2 s on problem b",
        "reward function odd did not return within 0.2 s on problem b",
    ]


def test_parse_number_strips_only_dollars_and_a_final_dot():
    assert parse_number("1/2.") == Fraction(1, 2)
    assert parse_number(".5") == Fraction(1, 2)
    assert parse_number("5X") is None
    assert rf._normalize("TAX") == "tax"


def test_the_function_is_after_the_last_colon_and_a_slash_means_a_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mod.py").write_text("def f(**kw):\n    return []\n")
    with pytest.raises(ValueError) as err:
        load_reward_function("sub/mod.py:f:g", tmp_path)
    assert str(err.value) == f"reward 'sub/mod.py:f:g': no file {str(tmp_path / 'sub/mod.py:f')!r}"
    with pytest.raises(ValueError) as err:
        load_reward_function("sub/mod:f", tmp_path)  # a path names the file, .py included
    assert str(err.value) == f"reward 'sub/mod:f': no file {str(tmp_path / 'sub/mod')!r}"
    assert load_reward_function("sub.mod:f", tmp_path).fn(completions=[]) == []


def test_without_base_dir_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "r.py").write_text("def f(**kw):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)
    assert load_reward_function("r.py:f").fn() == [1.0]
    assert load_reward_function("r:f").fn() == [1.0]


def test_the_recipe_folder_comes_first_on_the_path_while_the_module_runs(tmp_path, monkeypatch):
    helper = f"helper_{abs(hash(str(tmp_path)))}"
    other = tmp_path / "other"
    other.mkdir()
    (other / f"{helper}.py").write_text("K = 1.0\n")
    (tmp_path / f"{helper}.py").write_text("K = 3.0\n")
    (tmp_path / "pkg").mkdir()
    code = f"from {helper} import K\ndef f(**kw):\n    return [K]\n"
    (tmp_path / "pkg" / "mod.py").write_text(code)
    (tmp_path / "r.py").write_text(code)
    monkeypatch.syspath_prepend(str(other))  # a module of the same name earlier on the path
    for spec in ("pkg.mod:f", "r.py:f"):
        monkeypatch.delitem(sys.modules, helper, raising=False)
        assert load_reward_function(spec, tmp_path).fn() == [3.0], spec


def test_equal_files_in_two_folders_are_two_modules(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "r.py").write_text(
            "STATE = []\ndef f(**kw):\n    STATE.append(1)\n    return STATE\n"
        )
    first = load_reward_function("r:f", tmp_path / "a")
    second = load_reward_function("r:f", tmp_path / "b")
    assert first.fn is not second.fn
    assert first.fn() == [1] and second.fn() == [1]
