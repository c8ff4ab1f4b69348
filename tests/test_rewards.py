import pytest

from temper.rewards import RewardInput, combine
from temper.rewards.components import overlong
from temper.tasks.base import Score

GOOD = Score(1.0, True, True, {"reason": "correct"})
UNPARSED = Score(0.0, False, False, {"reason": "no_answer"})


def _x(score=GOOD, length=10, truncated=False, buffer=0):
    return RewardInput(score, length, max_new_tokens=20, truncated=truncated, overlong_buffer=buffer)


@pytest.mark.parametrize(
    ("length", "truncated", "buffer", "expected"),
    [
        (10, False, 0, 0.0),
        (20, True, 0, -1.0),
        (12, False, 8, 0.0),
        (16, False, 8, -0.5),
        (18, False, 8, -0.75),
        (20, True, 8, -1.0),
    ],
)
def test_overlong_is_dapos_soft_punishment(length, truncated, buffer, expected):
    # DAPO eq. 13 with L_max = 20, L_buffer = 8: free up to 12 tokens, then linear, -1 when cut off
    assert overlong(_x(length=length, truncated=truncated, buffer=buffer)) == pytest.approx(expected)


def test_combine_weights_components_and_reports_each_unweighted():
    total, parts = combine(
        _x(UNPARSED, length=20, truncated=True), {"outcome": 1.0, "format": 0.5, "overlong": 0.2}
    )
    assert parts == {"outcome": 0.0, "format": 0.0, "overlong": -1.0}
    assert total == pytest.approx(-0.2)
    total, parts = combine(_x(GOOD), {"outcome": 1.0, "format": 0.5})
    assert (total, parts) == (1.5, {"outcome": 1.0, "format": 1.0})
