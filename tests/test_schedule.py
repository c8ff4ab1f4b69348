import math

import pytest

from temper.train.schedule import lr_at
from temper.train.supervised import TrainConfig, lr_schedule


def test_warmup_then_cosine_to_the_floor():
    kw = dict(lr=1.0, max_steps=12, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in (0, 1)] == [0.5, 1.0]
    assert lr_at(2, **kw) == 1.0
    assert math.isclose(lr_at(11, **kw), 0.1)
    assert math.isclose(lr_at(6, **kw), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 9)))


def test_wsd_is_flat_then_decays_linearly():
    kw = dict(lr=1.0, max_steps=10, warmup_steps=0, schedule="wsd", min_lr_ratio=0.0, decay_fraction=0.2)
    assert [lr_at(s, **kw) for s in range(10)] == [1.0] * 8 + [0.5, 0.0]


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_at(5, lr=1.0, max_steps=10, warmup_steps=0, schedule="linear")


def test_an_unset_warmup_is_a_tenth_of_the_steps_at_most_20():
    assert [TrainConfig(max_steps=n).resolved_warmup() for n in (1, 9, 10, 55, 199, 200, 5000)] == [
        0, 0, 1, 5, 19, 20, 20,
    ]  # fmt: skip
    assert TrainConfig(max_steps=5000, warmup_steps=3).resolved_warmup() == 3  # a given value is kept
    # the trainer's schedule uses it: no warm-up on a 5-step run, 10 steps of it on a 100-step one
    assert lr_schedule(TrainConfig(max_steps=5, lr=1.0, schedule="constant"))(0) == 1.0
    assert lr_schedule(TrainConfig(max_steps=100, lr=1.0, schedule="constant"))(0) == 0.1
