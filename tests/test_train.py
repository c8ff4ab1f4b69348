import random

import pytest

from temper.data import build_sequences, parse_row
from temper.models import build_preset
from temper.train import NextToken, TrainConfig, train_supervised
from temper.train.supervised import batch_indices


class Interrupt(Exception):
    pass


def _data(tokenizer, n=64):
    rng = random.Random(0)
    rows = [
        parse_row({"text": f"{a}+{b}={a + b}"}, "x", i)
        for i, (a, b) in enumerate((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n))
    ]
    return build_sequences(tokenizer, rows, max_len=32)[0]


def _config(**kw):
    base = dict(max_steps=6, batch_size=8, lr=3e-3, warmup_steps=2, log_every=1, progress=False, seed=0)
    return TrainConfig(**(base | kw))


def _losses(history):
    return [row["loss"] for row in history]


def test_loss_goes_down(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=0)
    result = train_supervised(
        model, _data(tokenizer), _config(max_steps=20), tmp_path, objective=NextToken(tokenizer.pad_token_id)
    )
    losses = _losses(result.history)
    assert losses[-1] < 0.7 * losses[0]


def test_batches_are_a_function_of_seed_and_step():
    assert batch_indices(3, 10, 4, seed=1) == batch_indices(3, 10, 4, seed=1)
    epoch = batch_indices(0, 10, 5, 1) + batch_indices(1, 10, 5, 1)
    assert sorted(epoch) == list(range(10))  # one epoch covers every example once


def test_gradient_accumulation_does_not_change_the_losses(tokenizer, tmp_path):
    data = _data(tokenizer)
    whole = train_supervised(
        build_preset("nano", tokenizer),
        data,
        _config(),
        tmp_path / "a",
        objective=NextToken(tokenizer.pad_token_id),
    )
    split = train_supervised(
        build_preset("nano", tokenizer),
        data,
        _config(micro_batch_size=2),
        tmp_path / "b",
        objective=NextToken(tokenizer.pad_token_id),
    )
    assert _losses(split.history) == pytest.approx(_losses(whole.history), rel=1e-4)


def test_resume_after_interrupt_reproduces_the_uninterrupted_run(tokenizer, tmp_path):
    data = _data(tokenizer)
    config = _config(save_every=2)
    full = train_supervised(
        build_preset("nano", tokenizer),
        data,
        config,
        tmp_path / "full",
        objective=NextToken(tokenizer.pad_token_id),
    )

    def crash_at_step_5(step, row):
        if step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_supervised(
            build_preset("nano", tokenizer),
            data,
            config,
            tmp_path / "cut",
            objective=NextToken(tokenizer.pad_token_id),
            callbacks=[crash_at_step_5],
        )
    # a fresh model: everything must come from the checkpoint at step 4
    resumed = train_supervised(
        build_preset("nano", tokenizer, seed=99),
        data,
        config,
        tmp_path / "cut",
        objective=NextToken(tokenizer.pad_token_id),
    )
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]  # steps 1-4 read back from the log
    assert _losses(resumed.history) == pytest.approx(_losses(full.history), rel=1e-5)
    assert resumed.losses == pytest.approx(_losses(full.history), rel=1e-5)
    logged = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == 6  # rows past the checkpoint were dropped, then rewritten once


def test_empty_training_set_is_an_error(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no training sequences"):
        train_supervised(build_preset("nano", tokenizer), [], _config(), tmp_path, objective=NextToken(0))
