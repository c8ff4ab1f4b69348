"""examples/minimal_grpo.py is GRPO as `train_rl` runs it: on a fixed seed its first steps give
train_rl's rewards, losses, gradient norms and weights.

Run in float64. Both loops compute the same math, but the example reads its batch padded and
train_rl packed without padding (`rollouts.pack`), which round differently in float32 (the
first step's gradient norms differ by ~5e-7 relative); AdamW's first steps divide each gradient
component by its own magnitude, so that rounding in the near-zero components becomes weight
differences of ~1e-5 relative, and the next steps' samples would drift apart. In float64 the
gradient norms agree exactly on this seed and the weights to ~1e-14. The loss is compared at
float32 precision only: train_rl logs it through a float32 buffer (`backward_minibatch`).

Neither loop draws from the global torch RNG (the sampler seeds its own generators from (seed,
step, prompt), dropout is off), so no RNG order needs matching: the test seeds the global RNG
differently before each run to show it.
"""

import importlib.util
from pathlib import Path

import pytest
import torch

from temper.models import load_model, load_tokenizer
from temper.tasks.arithmetic import Arithmetic, ArithmeticConfig
from temper.train.rl import RLConfig, train_rl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "minimal_grpo.py"


def _example():
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# every setting the example takes, away from its default where that exercises the code: a
# temperature other than 1 (the forward must scale its logits as the sampler did), warmup and a
# cosine schedule (a different lr each step), a grad_clip below every step's gradient norm
SETTINGS = dict(
    steps=3,
    prompts_per_step=4,
    group_size=8,
    max_new_tokens=24,
    temperature=0.9,
    lr=3e-4,
    warmup_steps=2,
    schedule="cosine",
    clip_low=0.2,
    clip_high=0.28,
    dual_clip=3.0,
    grpo_eps=1e-6,
    grad_clip=0.5,
    seed=3,
)


@pytest.mark.parametrize("aggregation", ["token", "sample"])
def test_minimal_grpo_takes_the_steps_train_rl_takes(tmp_path, aggregation):
    example = _example()
    tokenizer = load_tokenizer(example.TINY_MODEL)
    task = Arithmetic(ArithmeticConfig(max_digits=2, ood_digits=3))

    def start():
        return load_model(example.TINY_MODEL, device=torch.device("cpu"), dtype=torch.float64)

    settings = SETTINGS | {"aggregation": aggregation}
    torch.manual_seed(1)
    ours = start()
    rows = example.minimal_grpo(ours, tokenizer, task, log=lambda row: None, **settings)
    torch.manual_seed(2)
    theirs = start()
    config = RLConfig(**settings, progress=False, log_rollouts=0)
    history = train_rl(theirs, tokenizer, [task], config, tmp_path).history

    assert len(rows) == len(history) == SETTINGS["steps"]
    for mine, ref in zip(rows, history):
        for key in ("reward", "accuracy", "response_length", "lr", "clip_frac"):
            assert mine[key] == ref[key], (mine["step"], key, mine[key], ref[key])
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-12, abs=0), mine["step"]
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-12), mine["step"]
    # the comparison is not vacuous: every step learns, and clips its gradient
    assert all(row["grad_norm"] > SETTINGS["grad_clip"] for row in rows), rows
    assert len({row["reward"] for row in rows}) > 1, rows
    weights, reference, before = (m.state_dict() for m in (ours, theirs, start()))
    assert weights.keys() == reference.keys()
    for name, w in weights.items():
        torch.testing.assert_close(w, reference[name], rtol=0, atol=1e-12, msg=name)
    moved = max(float((w - before[name]).abs().max()) for name, w in weights.items())
    assert moved > 1e-4, moved
