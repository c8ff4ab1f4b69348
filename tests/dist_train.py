"""Trained by tests/test_distributed.py and tests/test_fsdp.py, alone or under torchrun: a few
steps of the nano model. Every process writes `world-<rank>.json` (the rank and world size it
sees); the main process writes the per-step losses to `losses.json`, the held-out losses to
`eval_losses.json`, the logged rows to `history.json` and the trained model to `model/`.
argv: out_dir [JSON of TrainConfig overrides, and "lora": apply_lora's arguments] [step after
which every process raises, as an interruption would]."""

import json
import random
import sys
from pathlib import Path

import torch

from temper import distributed
from temper.data import build_sequences, parse_row
from temper.models import build_preset, build_tokenizer, save_trained, with_lora
from temper.train import NextToken, TrainConfig, train_supervised


class Interrupted(Exception):
    pass


def main(out: str, overrides: str = "{}", stop_after: str = "0") -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    state = distributed.state()
    Path(out, f"world-{state.process_index}.json").write_text(
        json.dumps({"rank": state.process_index, "world": state.num_processes})
    )
    tokenizer = build_tokenizer()
    rng = random.Random(0)
    rows = [
        parse_row({"text": f"{a}*{b}={a * b}"}, "x", i)
        for i, (a, b) in enumerate((rng.randint(0, 99), rng.randint(0, 9)) for _ in range(64))
    ]
    data, _ = build_sequences(tokenizer, rows, max_len=32)
    held_out = data[:5]  # an odd count: the processes score unequal shares
    settings = dict(max_steps=4, batch_size=8, lr=3e-3, warmup_steps=1, log_every=1, eval_every=2)
    given = json.loads(overrides)
    lora = given.pop("lora", None)
    config = TrainConfig(**settings | given, progress=False)

    def interrupt(step, row):
        if step == int(stop_after):
            raise Interrupted(f"stopped after step {step}")

    model = build_preset("nano", tokenizer, seed=0)
    torch.manual_seed(0)  # the adapter's initial A: the same draw alone and in every process
    model = with_lora(model, lora)
    result = train_supervised(
        model,
        data,
        config,
        out,
        objective=NextToken(tokenizer.pad_token_id),
        eval_set=held_out,
        callbacks=[interrupt],
    )
    if state.is_main_process:
        Path(out, "losses.json").write_text(json.dumps([row["loss"] for row in result.history]))
        Path(out, "eval_losses.json").write_text(
            json.dumps([row["eval_loss"] for row in result.history if "eval_loss" in row])
        )
        Path(out, "history.json").write_text(json.dumps(result.history))
    save_trained(model, tokenizer, Path(out, "model"))  # every process: the main one writes


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
    finally:
        distributed.shutdown()
