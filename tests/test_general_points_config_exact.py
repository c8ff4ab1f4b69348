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
