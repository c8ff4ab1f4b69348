"""Exact bounds of `GeneralPointsConfig`: each limit accepted at its edge and refused one past it,
with the whole message. Written against the mutants mutmut left alive (TESTING.md)."""

import pytest

from temper.tasks.general_points import GeneralPointsConfig


@pytest.mark.parametrize(
    "options, message",
    [
        ({"n_cards": 1}, "n_cards must be 2, 3 or 4"),
        ({"n_cards": 5}, "n_cards must be 2, 3 or 4"),
        ({"target": 0}, "target must be a positive integer"),
        ({"max_rank": 0}, "max_rank must be in 1..13"),
        ({"max_rank": 14}, "max_rank must be in 1..13"),
        ({"face_values_id": (10, 10)}, "face_values_id must be three positive values for J, Q, K"),
        ({"face_values_ood": (1, 0, 1)}, "face_values_ood must be three positive values for J, Q, K"),
        ({"test_fraction": 0.0}, "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.0}, "test_fraction must be in (0, 1)"),
        ({"test_fraction": 1.5}, "test_fraction must be in (0, 1)"),
    ],
)
def test_refused_past_each_limit(options, message):
    with pytest.raises(ValueError) as err:
        GeneralPointsConfig(**options)
    assert str(err.value) == message


def test_accepted_at_each_edge():
    c = GeneralPointsConfig(
        n_cards=2,
        target=1,
        max_rank=1,
        face_values_id=[1, 1, 1],
        face_values_ood=(1, 2, 3),
        test_fraction=0.99,
    )
    assert (c.n_cards, c.target, c.max_rank) == (2, 1, 1)
    assert c.face_values_id == (1, 1, 1) and isinstance(c.face_values_id, tuple)
    assert c.face_values_ood == (1, 2, 3)
    assert GeneralPointsConfig(n_cards=4, max_rank=13, face_values_ood=[2, 2, 2]).face_values_ood == (2, 2, 2)


def test_each_failure_score_keeps_the_answer_read():
    from temper.tasks.base import Score
    from temper.tasks.general_points import GeneralPoints

    task = GeneralPoints()
    (p,) = task.sample("test", 1, 0)
    values, target = p.data["values"], p.data["target"]
    assert task.score(p, "Answer: 1+2=x") == Score(
        0.0, False, False, {"reason": "syntax_error", "answer": "1+2=x"}
    )
    assert task.score(p, "Answer: (1") == Score(0.0, False, False, {"reason": "syntax_error", "answer": "(1"})
    assert task.score(p, "Answer: 1/0") == Score(
        0.0, False, True, {"reason": "division_by_zero", "answer": "1/0"}
    )
    wrong = "+".join(["1"] * (len(values) + 1))
    assert task.score(p, f"Answer: {wrong}") == Score(
        0.0, False, True, {"answer": wrong, "value": str(len(values) + 1), "reason": "wrong_cards"}
    )
    summed = "+".join(map(str, values))
    assert sum(values) != target  # (the hand of seed 0: 10 9 3 5, target 24)
    assert task.score(p, f"Answer: {summed}") == Score(
        0.0, False, True, {"answer": summed, "value": str(sum(values)), "reason": "wrong_value"}
    )
