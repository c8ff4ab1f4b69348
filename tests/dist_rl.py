"""Trained by tests/test_distributed.py, alone or under torchrun: a few GRPO steps of the nano
model on a task it can learn. Every process writes `world-<rank>.json`; the main process writes
the logged rows to `history.json`. argv: out_dir [JSON of RLConfig overrides] [step after which
every process raises, as an interruption would]."""

import json
import sys
from pathlib import Path

import torch

from temper import distributed
from temper.models import build_preset, build_tokenizer
from temper.tasks.base import Problem, Score
from temper.train.features.async_rollouts import AsyncRollouts
from temper.train.rl import RLConfig, train_rl


class FirstByteTask:
    """Reward 1 when the completion starts with an ASCII character below 'P' (tests/test_rl.py)."""

    name = "first_byte"

    def sample(self, split, n, seed):
        return [Problem(self.name, split, f"{seed}-{i}", f"q{(seed + i) % 7}") for i in range(n)]

    def score(self, problem, completion):
        ok = bool(completion) and completion[0] < "P"
        return Score(float(ok), ok, bool(completion), {"reason": "correct" if ok else "wrong"})


class Interrupted(Exception):
    pass


def main(out: str, overrides: str = "{}", stop_after: str = "0") -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    state = distributed.state()
    Path(out, f"world-{state.process_index}.json").write_text(
        json.dumps({"rank": state.process_index, "world": state.num_processes})
    )
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    settings = dict(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=4, lr=1e-2, log_rollouts=4)
    given = json.loads(overrides)
    if "async_rollouts" in given:
        given["async_rollouts"] = AsyncRollouts(**given["async_rollouts"])
    config = RLConfig(**settings | given, minibatches=1, seed=0, progress=False)
    reference = build_preset("nano", tokenizer, seed=1).requires_grad_(False) if config.kl_coef else None

    def interrupt(step, row):
        if step == int(stop_after):
            raise Interrupted(f"stopped after step {step}")

    result = train_rl(
        build_preset("nano", tokenizer, seed=1),
        tokenizer,
        [FirstByteTask()],
        config,
        out,
        reference=reference,
        callbacks=[interrupt],
    )
    if state.is_main_process:
        Path(out, "history.json").write_text(json.dumps(result.history))


if __name__ == "__main__":
    try:
        main(*sys.argv[1:])
    finally:
        distributed.shutdown()
