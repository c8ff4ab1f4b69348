import pytest

from temper.catalog import TASKS, make_task
from temper.tasks import Arithmetic, ArithmeticConfig, GeneralPoints, Task
from temper.tasks.arithmetic import REASONS
from temper.tasks.base import Problem, Score

TASK = Arithmetic()


def problem(a: int, op: str, b: int, answer: int) -> Problem:
    data = {"a": a, "op": op, "b": b, "answer": answer}
    return Problem("arithmetic", "test", f"{a}{op}{b}", f"{a}{op}{b}=?", data)


ADD = problem(37, "+", 45, 82)
SUB = problem(12, "-", 45, -33)


def test_is_a_task():
    assert isinstance(TASK, Task)
    assert TASK.name == "arithmetic"


@pytest.mark.parametrize(
    "completion",
    [
        "Answer: 82",
        "Answer:82",
        "Answer: +82",
        "Answer: 082",
        "Answer: 82  \n",
        "Answer: 82<|end|>",
        "37+45 is 80+2.\nAnswer: 82",
        "Answer: 81\nAnswer: 82",
    ],
)
def test_equivalent_correct_forms(completion):
    s = TASK.score(ADD, completion)
    assert (s.reward, s.correct, s.parsed, s.details["reason"]) == (1.0, True, True, "correct")


def test_negative_result():
    assert TASK.score(SUB, "Answer: -33").correct
    assert TASK.score(SUB, "Answer: -033").correct
    s = TASK.score(SUB, "Answer: 33")
    assert (s.reward, s.parsed, s.details["reason"], s.details["answer"]) == (
        0.0,
        True,
        "wrong",
        "33",
    )


def test_minus_zero_is_zero():
    assert TASK.score(problem(5, "-", 5, 0), "Answer: -0").correct


@pytest.mark.parametrize("completion", ["Answer: 83", "Answer: -82", "Answer: 8200", "Answer: 8"])
def test_wrong(completion):
    s = TASK.score(ADD, completion)
    assert (s.reward, s.correct, s.parsed, s.details["reason"]) == (0.0, False, True, "wrong")


@pytest.mark.parametrize(
    "completion",
    [
        "82",
        "",
        "Answer:",
        "answer: 82",
        "Answer: 82.",
        "Answer: 8 2",
        "Answer: eighty-two",
        "Answer: 82\nbecause",
        "Answer: 80+2",
        "Answer: 82.0",
        "Answer: --82",
        "Answer: ٨٢",
        "\x00\xff" * 50,
        None,
    ],
)
def test_no_answer_never_raises(completion):
    s = TASK.score(ADD, completion)
    assert (s.reward, s.correct, s.parsed, s.details["reason"]) == (0.0, False, False, "no_answer")
    assert s.details["reason"] in REASONS


def test_huge_integer_is_wrong_not_a_crash():
    s = TASK.score(ADD, "Answer: " + "9" * 100_000)
    assert (s.correct, s.parsed, s.details["reason"]) == (False, True, "wrong")


def test_formats():
    assert ADD.prompt == "37+45=?"
    assert TASK.demonstration(ADD) == "37+45=82\nAnswer: 82"
    assert TASK.corpus_text(ADD) == "37+45=82"
    assert TASK.corpus_text(SUB) == "12-45=-33"


@pytest.mark.parametrize("split", ["train", "test", "ood"])
def test_demonstrations_score_correct(split):
    for p in TASK.sample(split, 300, seed=1):
        assert TASK.score(p, TASK.demonstration(p)).correct
        assert "Answer:" not in TASK.corpus_text(p)
        assert p.split == split and p.task == "arithmetic"
        a, op, b = p.data["a"], p.data["op"], p.data["b"]
        assert p.data["answer"] == {"+": a + b, "-": a - b, "*": a * b}[op]


def test_seeded_sampling_is_reproducible():
    assert TASK.sample("train", 50, seed=3) == TASK.sample("train", 50, seed=3)
    assert TASK.sample("train", 50, seed=3) != TASK.sample("train", 50, seed=4)


def test_train_and_test_disjoint_even_up_to_commutation():
    def key(p):
        a, op, b = p.data["a"], p.data["op"], p.data["b"]
        return (op, *sorted((a, b))) if op in "+*" else (op, a, b)

    train = {key(p) for p in TASK.sample("train", 3000, seed=0)}
    test = {key(p) for p in TASK.sample("test", 1000, seed=0)}
    assert len(test) > 300 and not train & test


def test_in_distribution_operand_lengths():
    for p in TASK.sample("train", 500, seed=0) + TASK.sample("test", 500, seed=0):
        a, op, b = p.data["a"], p.data["op"], p.data["b"]
        assert 0 <= a <= 99 and 0 <= b <= 99
        if op == "*":
            assert b <= 9


def test_ood_operands_are_longer():
    problems = TASK.sample("ood", 500, seed=0)
    assert {p.data["op"] for p in problems} == {"+", "-", "*"}
    for p in problems:
        a, op, b = p.data["a"], p.data["op"], p.data["b"]
        assert 100 <= a <= 999
        assert b <= 9 if op == "*" else 100 <= b <= 999


def test_config_shapes_the_problems():
    task = Arithmetic(ArithmeticConfig(ops=("*",), min_digits=2, max_digits=2, mul_max_digits=2))
    for p in task.sample("train", 200, seed=0):
        assert p.data["op"] == "*" and 10 <= p.data["a"] <= 99 and 10 <= p.data["b"] <= 99


def test_tiny_space_samples_with_replacement():
    task = Arithmetic(ArithmeticConfig(ops=("+",), min_digits=1, max_digits=1, ood_digits=2))
    test = task.sample("test", 500, seed=0)
    train = task.sample("train", 2000, seed=0)
    assert len(test) == 500
    test_ids, train_ids = {p.id for p in test}, {p.id for p in train}
    assert len(test_ids) < 40 and not test_ids & train_ids
    assert len(test_ids | train_ids) == 100  # every a+b with one-digit a, b


def test_unknown_split():
    with pytest.raises(ValueError, match="valid splits: train, test, ood"):
        TASK.sample("validation", 1, seed=0)


@pytest.mark.parametrize(
    "options",
    [
        {"ops": ("/",)},
        {"min_digits": 0},
        {"min_digits": 3},
        {"ood_digits": 2},
        {"test_fraction": 1.0},
    ],
)
def test_invalid_config(options):
    with pytest.raises(ValueError):
        ArithmeticConfig(**options)


# --- registry (temper.tasks) ---------------------------------------------------------------


def test_registry():
    assert {"arithmetic": Arithmetic, "general_points": GeneralPoints}.items() <= TASKS.items()
    assert set(TASKS) >= {"arithmetic", "general_points", "dataset", "reasoning_gym"}
    assert set(TASKS) == {
        "arithmetic", "general_points", "dataset", "reasoning_gym", "calculator_arithmetic", "treasure_hunt",
        "code_repair",
        "multi_tool",
        "simulated_search", "search_documents",
        "two_mode", "translated", "thinking_language",
        "instructed_arithmetic",
        "gateway",
        "memory_corridor", "prune_lookup", "orchestrator",
        "shell_repo", "web_shop",
    }  # fmt: skip
    task = make_task("arithmetic", max_digits=3, ood_digits=5, ops=["+", "-"])
    assert isinstance(task, Arithmetic)
    assert task.config.ops == ("+", "-") and task.config.max_digits == 3
    assert isinstance(make_task("general_points", n_cards=3), GeneralPoints)


def test_unknown_task_suggests_nearest():
    with pytest.raises(ValueError, match=r"'general_point'.*did you mean 'general_points'"):
        make_task("general_point")
    with pytest.raises(ValueError, match="valid tasks: arithmetic, general_points"):
        make_task("chess")


def test_unknown_option_suggests_nearest():
    with pytest.raises(ValueError, match=r"'max_digit'.*did you mean 'max_digits'.*valid options:"):
        make_task("arithmetic", max_digit=3)
    with pytest.raises(ValueError, match=r"did you mean 'n_cards'"):
        make_task("general_points", ncards=3)


# ---- exact cases, folded in from test_tasks_exact.py -------------------------------------------
# Exact edges of the task layer the mutation run (TESTING.md) found untested: the split hash, the
# config errors users see, and the expression grader's limits and messages.


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"ops": ("+", "/")}, "ops must be a non-empty subset of ('+', '-', '*'), got ('+', '/')"),
        ({"min_digits": 3, "max_digits": 2}, "need 1 <= min_digits <= max_digits"),
        ({"ood_digits": 2}, "ood_digits must exceed max_digits (OOD operands are longer)"),
        ({"mul_max_digits": 0}, "mul_max_digits must be >= 1"),
        ({"test_fraction": 0.0}, "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.0}, "test_fraction must be in (0, 1)"),
    ],
)
def test_arithmetic_config_errors_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError) as err:
        ArithmeticConfig(**kwargs)
    assert str(err.value) == message


# ---- exact cases, folded in from test_tasks_more_exact.py --------------------------------------
# Exact cases for survivors of the earlier mutation run in modules this run did not re-mutate
# (their code is unchanged): expression errors word for word, the magnitude limit at its edge, the
# arithmetic no-answer Score, and the dtype of the PPO token rewards (TESTING.md).


def test_arithmetic_no_answer_keeps_what_was_read():
    task = Arithmetic()
    (p,) = task.sample("test", 1, 0)
    assert task.score(p, "Answer: many") == Score(
        0.0, False, False, {"reason": "no_answer", "answer": "many"}
    )
