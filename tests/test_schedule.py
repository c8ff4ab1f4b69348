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


# ---- exact cases, folded in from test_rollouts_exact.py ----------------------------------------
# From samples to training inputs on hand-computed values: a group's rewards with the overlong
# component (length, limit, truncation and buffer each reaching it), the token ids a batch grader is
# given, the rollouts.jsonl record, first-fit packing of sequences into rows, and the learning-rate
# schedules at their edges.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


def test_schedules_at_their_edges_with_the_default_floor_and_decay():
    kw = dict(lr=1.0, warmup_steps=1)
    # cosine over steps 1..2 after one warm-up step: p = (step - 1) / max(1, 3 - 1 - 1); floor 0.1
    assert lr_at(2, max_steps=3, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(5, max_steps=3, schedule="cosine", **kw) == pytest.approx(0.1)  # held after the end
    # wsd: the last max(1, int(5 x 0.2)) = 1 step decays to the floor
    assert lr_at(3, max_steps=5, schedule="wsd", **kw) == 1.0
    assert lr_at(4, max_steps=5, schedule="wsd", **kw) == pytest.approx(0.1)
    assert lr_at(7, max_steps=5, schedule="wsd", **kw) == pytest.approx(0.1)  # held after the end
    # 10 steps: decay over the last 2, halfway at step 8
    assert lr_at(8, max_steps=10, schedule="wsd", **kw) == pytest.approx(0.55)
