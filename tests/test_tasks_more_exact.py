"""Exact cases for survivors of the earlier mutation run in modules this run did not re-mutate
(their code is unchanged): expression errors word for word, the magnitude limit at its edge, the
arithmetic no-answer Score, and the dtype of the PPO token rewards (TESTING.md)."""

from fractions import Fraction

import pytest
import torch

from temper.algorithms.policy import kl_penalized_rewards
from temper.tasks.arithmetic import Arithmetic
from temper.tasks.base import Score
from temper.tasks.expression import ExpressionError, evaluate


@pytest.mark.parametrize(
    "text, reason, message",
    [
        ("(1 2)", "syntax_error", "expected ')'"),
        ("1+*2", "syntax_error", "expected a number or '(', got '*'"),
        ("1+", "syntax_error", "unexpected end of expression"),
        ("3/(1-1)", "division_by_zero", "division by zero"),
        ("1/1000/1000/1000/10", "too_large", "intermediate numerator or denominator beyond 1000000000"),
    ],
)
def test_expression_errors_word_for_word(text, reason, message):
    with pytest.raises(ExpressionError) as err:
        evaluate(text)
    assert (err.value.reason, str(err.value)) == (reason, message)


def test_a_denominator_of_exactly_the_limit_is_allowed():
    assert evaluate("1/1000/1000/1000").value == Fraction(1, 10**9)


def test_arithmetic_no_answer_keeps_what_was_read():
    task = Arithmetic()
    (p,) = task.sample("test", 1, 0)
    assert task.score(p, "Answer: many") == Score(
        0.0, False, False, {"reason": "no_answer", "answer": "many"}
    )


def test_token_rewards_keep_the_dtype_of_the_kl():
    rewards = kl_penalized_rewards(
        torch.tensor([1.0], dtype=torch.float64), torch.zeros(1, 2), torch.tensor([[True, True]]), 0.1
    )
    assert rewards.dtype == torch.float32 and rewards.tolist() == [[0.0, 1.0]]
