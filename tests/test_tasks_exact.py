"""Exact edges of the task layer the mutation run (TESTING.md) found untested: the split hash, the
config errors users see, and the expression grader's limits and messages."""

import pytest

from temper.tasks.arithmetic import ArithmeticConfig
from temper.tasks.base import split_of
from temper.tasks.expression import MAX_LENGTH, ExpressionError, evaluate


def test_split_is_the_big_endian_first_8_bytes_of_sha256_below_the_fraction():
    # sha256(b"c") starts 2e7d2c03a9507ae2: big-endian that is 0.1816 of 2**64 (little-endian 0.885)
    point = int("2e7d2c03a9507ae2", 16) / 2**64
    assert split_of("c", 0.2) == "test" and split_of("c", 0.18) == "train"
    assert split_of("c", point) == "train"  # strictly below the fraction is "test"
    assert split_of("c", point + 1e-12) == "test"


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


def test_expression_limits_and_messages():
    assert evaluate("1+" * ((MAX_LENGTH - 1) // 2) + "1").value == (MAX_LENGTH - 1) // 2 + 1  # 99 chars
    assert evaluate("1" * 5 + " " * (MAX_LENGTH - 5)).value == 11111  # exactly MAX_LENGTH is allowed
    cases = {
        "1" * (MAX_LENGTH + 1): ("too_large", f"expression longer than {MAX_LENGTH} characters"),
        "1234567": ("too_large", "literal longer than 6 digits"),
        "2 $ 3": ("syntax_error", "unexpected character '$'"),
        "  \t ": ("syntax_error", "empty expression"),
        "(1+2": ("syntax_error", "unexpected end of expression"),
        "1 2": ("syntax_error", "unexpected '2'"),
    }
    for text, (reason, message) in cases.items():
        with pytest.raises(ExpressionError) as err:
            evaluate(text)
        assert (err.value.reason, str(err.value)) == (reason, message), text
    assert evaluate("\t7 *\t(1 + 2) ").value == 21  # tabs and spaces are blanks
