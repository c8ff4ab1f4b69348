"""Resume is exact where the global RNG is in use: a run whose steps draw from torch's global RNG
(dropout in the supervised loop; dropout in the RL update, on top of temperature sampling), stopped
after a checkpoint and resumed into a fresh model, ends with weights byte-identical to the
uninterrupted run's.

The other resume tests (test_train.py, test_rl.py, test_preference_train.py) compare metrics of
runs that never draw from the global RNG (no dropout, seeded sampler), so a checkpoint that did
not restore the RNG would pass them. Each test here also checks that it can fail: the same resume
with the RNG left as the fresh process has it ends elsewhere.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import temper.train.checkpoint as checkpoint
from fakes import FirstByteTask
from temper.data import build_sequences, parse_row
from temper.models.presets import preset_config
from temper.train import NextToken, TrainConfig, train_supervised
from temper.train.rl import RLConfig, train_rl


class Stop(Exception):
    pass


def _with_dropout(tokenizer, seed: int) -> LlamaForCausalLM:
    config: LlamaConfig = preset_config("nano", tokenizer)
    config.attention_dropout = 0.2
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def _stop_after(step_to_stop: int):
    def stop(step, row):
        if step == step_to_stop:
            raise Stop

    return stop


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def rng_not_restored(monkeypatch):
    """Make a checkpoint load leave the global RNG as it found it (the defect the tests must see)."""

    def apply():
        load = checkpoint.load_checkpoint

        def load_keeping_rng(path, accelerator, trained=None):
            state = torch.get_rng_state(), random.getstate()
            step = load(path, accelerator, trained)
            torch.set_rng_state(state[0])
            random.setstate(state[1])
            return step

        monkeypatch.setattr(checkpoint, "load_checkpoint", load_keeping_rng)

    return apply


# ---- the supervised loop: dropout ------------------------------------------------------------------


def _sft_data(tokenizer, n=24):
    rng = random.Random(0)
    rows = [parse_row({"text": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}"}, "x", i) for i in range(n)]
    return build_sequences(tokenizer, rows, max_len=32)[0]


def _sft(tokenizer, out, seed, callbacks=()):
    model = _with_dropout(tokenizer, seed)
    config = TrainConfig(
        max_steps=5, batch_size=4, lr=3e-3, warmup_steps=1, log_every=1, save_every=2, progress=False, seed=3
    )
    train_supervised(
        model,
        _sft_data(tokenizer),
        config,
        out,
        objective=NextToken(tokenizer.pad_token_id),
        callbacks=list(callbacks),
    )
    return model


def test_a_resumed_sft_run_with_dropout_ends_byte_identical(tokenizer, tmp_path, rng_not_restored):
    full = _sft(tokenizer, tmp_path / "full", seed=0)
    with pytest.raises(Stop):
        _sft(tokenizer, tmp_path / "cut", seed=0, callbacks=[_stop_after(3)])  # checkpoint at step 2
    resumed = _sft(tokenizer, tmp_path / "cut", seed=99)  # everything must come from the checkpoint
    assert _same_weights(resumed, full)

    rng_not_restored()
    with pytest.raises(Stop):
        _sft(tokenizer, tmp_path / "cut2", seed=0, callbacks=[_stop_after(3)])
    assert not _same_weights(_sft(tokenizer, tmp_path / "cut2", seed=99), full)


# ---- RL: temperature sampling and dropout in the update -------------------------------------------


def _rl(tokenizer, out, seed, callbacks=()):
    model = _with_dropout(tokenizer, seed)
    config = RLConfig(
        steps=4, prompts_per_step=2, group_size=4, max_new_tokens=3, temperature=1.0, lr=3e-3,
        epochs=2, minibatches=2, dropout=True, save_every=2, seed=1, progress=False,
    )  # fmt: skip
    torch.manual_seed(config.seed)  # as the rl stage does before train_rl
    train_rl(model, tokenizer, [FirstByteTask()], config, out, callbacks=list(callbacks))
    return model


def test_a_resumed_rl_run_with_dropout_ends_byte_identical(tokenizer, tmp_path, rng_not_restored):
    full = _rl(tokenizer, tmp_path / "full", seed=0)
    with pytest.raises(Stop):
        _rl(tokenizer, tmp_path / "cut", seed=0, callbacks=[_stop_after(3)])
    resumed = _rl(tokenizer, tmp_path / "cut", seed=99)
    assert _same_weights(resumed, full)

    rng_not_restored()
    with pytest.raises(Stop):
        _rl(tokenizer, tmp_path / "cut2", seed=0, callbacks=[_stop_after(3)])
    assert not _same_weights(_rl(tokenizer, tmp_path / "cut2", seed=99), full)


# ---- the run's seed reaches the global RNG (what dropout and the resumed RNG start from) -----------


class _Seen(Exception):
    pass


def test_the_supervised_loop_seeds_the_global_rng_with_the_configs_seed(tokenizer, tmp_path):
    """Two runs of one seed draw the same dropout masks only if the loop seeds torch's global RNG
    with `config.seed` (not a constant, not nothing) before the first step."""
    seen = []

    class Recording(NextToken):
        def start(self, model, train, eval_set, batch_size):
            seen.append(torch.initial_seed())
            raise _Seen

    for seed in (3, 11):
        torch.manual_seed(12345)
        config = TrainConfig(max_steps=2, batch_size=4, warmup_steps=0, progress=False, seed=seed)
        with pytest.raises(_Seen):
            train_supervised(
                _with_dropout(tokenizer, 0),
                _sft_data(tokenizer),
                config,
                tmp_path / str(seed),
                objective=Recording(tokenizer.pad_token_id),
            )
    assert seen == [3, 11]


def test_the_rl_stage_seeds_the_global_rng_with_the_configs_seed(tokenizer, tmp_path, monkeypatch):
    """train_rl leaves the global RNG to its caller; the rl stage seeds it with `train.seed`
    before the model loads (dropout: true draws from it)."""
    import temper.stages.rl as rl_stage
    from temper.stages.context import StageContext

    seen = []

    def load(source, ctx):
        seen.append(torch.initial_seed())
        raise _Seen

    monkeypatch.setattr(rl_stage, "load_chat_model", load)
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    for seed in (3, 11):
        torch.manual_seed(12345)
        stage = rl_stage.RLStage(
            kind="rl", tasks=["first_byte"], train=RLConfig(steps=2, seed=seed, progress=False)
        )
        with pytest.raises(_Seen):
            rl_stage.run_rl(stage, ctx, tmp_path / "base", tmp_path / f"rl{seed}")
    assert seen == [3, 11]
