from fractions import Fraction

import pytest

from temper.tasks.expression import MAX_LENGTH, ExpressionError, evaluate, extract_answer


@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("(10-1)*8/3", 24, (10, 1, 8, 3)),
        ("8/(3-8/3)", 24, (8, 3, 8, 3)),
        ("2+3*4", 14, (2, 3, 4)),
        ("(2+3)*4", 20, (2, 3, 4)),
        ("10-4-3", 3, (10, 4, 3)),
        ("16/4/2", 2, (16, 4, 2)),
        ("1/3", Fraction(1, 3), (1, 3)),
        (" ( ( 7 ) ) ", 7, (7,)),
        ("\t3 *\t8", 24, (3, 8)),
        ("007+1", 8, (7, 1)),
        ("999999", 999999, (999999,)),
    ],
)
def test_evaluates_exactly(text, value, literals):
    result = evaluate(text)
    assert result.value == value
    assert result.literals == literals


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "syntax_error"),
        ("   ", "syntax_error"),
        ("-3+27", "syntax_error"),
        ("+3", "syntax_error"),
        ("3+", "syntax_error"),
        ("3 4", "syntax_error"),
        ("(3+4", "syntax_error"),
        ("3+4)", "syntax_error"),
        ("()", "syntax_error"),
        ("3**4", "syntax_error"),
        ("3x8", "syntax_error"),
        ("2.5*4", "syntax_error"),
        ("__import__('os')", "syntax_error"),
        ("٣+٤", "syntax_error"),
        ("1/0", "division_by_zero"),
        ("8/(3-3)", "division_by_zero"),
        ("1/(2-2)*0", "division_by_zero"),
        ("1234567", "too_large"),
        ("999999*999999*999999*999999", "too_large"),
        ("1000*1000*1001", "too_large"),
        ("1/1000/1000/1001", "too_large"),
        ("+".join(["1"] * 51), "too_large"),
    ],
)
def test_rejects_with_reason(text, reason):
    with pytest.raises(ExpressionError) as info:
        evaluate(text)
    assert info.value.reason == reason


def test_magnitude_bound_is_inclusive():
    assert evaluate("1000*1000*1000").value == 10**9


def test_deep_nesting_within_length_is_fine():
    assert evaluate("(" * 49 + "1" + ")" * 49).value == 1


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("Answer: 82", "82"),
        ("Answer:82", "82"),
        ("  Answer:   82  \n", "82"),
        ("work\nAnswer: 1\nAnswer: 2", "2"),
        ("Answer: 82<|end|>", "82"),
        ("Answer: 82 <|endoftext|>\n", "82"),
        ("Answer: 82\nthanks", "82\nthanks"),
        ("Answer:", None),
        ("Answer:   <|end|>", None),
        ("answer: 82", None),
        ("82", None),
        ("", None),
        (None, None),
        (b"Answer: 82", None),
    ],
)
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


# ---- exact cases, folded in from test_tasks_exact.py -------------------------------------------
# Exact edges of the task layer the mutation run (TESTING.md) found untested: the split hash, the
# config errors users see, and the expression grader's limits and messages.


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


# ---- exact cases, folded in from test_tasks_more_exact.py --------------------------------------
# Exact cases for survivors of the earlier mutation run in modules this run did not re-mutate
# (their code is unchanged): expression errors word for word, the magnitude limit at its edge, the
# arithmetic no-answer Score, and the dtype of the PPO token rewards (TESTING.md).


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
