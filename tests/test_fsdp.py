"""`strategy: fsdp` (torch FSDP2, `temper.train.strategy`): two CPU processes under torchrun give
one process's losses and gradient norms, in SFT (LoRA too) and RL; a run interrupted after a
sharded checkpoint resumes to the uninterrupted run's numbers; the saved `model/` is the trained
weights; one process trains as ddp does. The recipe errors are in tests/test_bad_recipes.py."""

import json
from pathlib import Path

import pytest

from test_distributed import TESTS, launch, worlds

SFT_SETTINGS = {"strategy": "fsdp", "save_every": 2}
RL_SETTINGS = {"steps": 4, "save_every": 2, "strategy": "fsdp"}


def _history(out: Path) -> list[dict]:
    return json.loads((out / "history.json").read_text())


def _sft(out: Path, processes: int, settings: dict, stop_after: int = 0, ok: bool = True) -> None:
    launch([str(TESTS / "dist_train.py"), str(out), json.dumps(settings), str(stop_after)], processes, ok=ok)


def _same_rows(one: list[dict], two: list[dict], keys: tuple[str, ...], rel: float) -> None:
    assert [r["step"] for r in two] == [r["step"] for r in one] and one
    for a, b in zip(one, two, strict=True):
        for key in keys:
            if key in a or key in b:
                assert b[key] == pytest.approx(a[key], rel=rel, abs=rel / 10), (a["step"], key)


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory) -> Path:
    """4 SFT steps of the nano model alone (p1, the plain path) and in 2 fsdp processes (p2)."""
    root = tmp_path_factory.mktemp("fsdp_sft")
    _sft(root / "p1", 1, {"save_every": 2})
    _sft(root / "p2", 2, SFT_SETTINGS)
    return root


@pytest.mark.slow
def test_sft_under_fsdp_in_two_processes_matches_one(sft_runs):
    """The loss, the gradient norm (over the shards) and the held-out loss (each process scores
    an unequal share with the published full weights) equal one process's, step after step."""
    assert worlds(sft_runs / "p2") == [(0, 2), (1, 2)]
    one, two = _history(sft_runs / "p1"), _history(sft_runs / "p2")
    assert len(one) == 4 and sum("eval_loss" in r for r in one) == 2
    _same_rows(one, two, ("loss", "grad_norm", "eval_loss"), rel=1e-5)
    # the parameters really were sharded: each process wrote its own part of the checkpoint
    sharded = sft_runs / "p2" / "checkpoints" / "step-0000004" / "sharded"
    assert sorted(p.name for p in sharded.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (sft_runs / "p1" / "checkpoints" / "step-0000004" / "sharded").exists()


@pytest.mark.slow
def test_sft_under_fsdp_resumes_from_its_sharded_checkpoint_exactly(sft_runs, tmp_path):
    """Interrupted after step 3, the run resumes from the step-2 checkpoint (the shards of the
    weights and of AdamW's moments, each process's RNG) and replays steps 3-4 as the
    uninterrupted run did."""
    out = tmp_path / "cut"
    _sft(out, 2, SFT_SETTINGS, stop_after=3, ok=False)
    assert (out / "checkpoints" / "step-0000002" / "sharded" / ".metadata").exists()
    _sft(out, 2, SFT_SETTINGS)
    _same_rows(_history(sft_runs / "p2")[2:], _history(out)[2:], ("loss", "grad_norm", "eval_loss"), rel=1e-6)


@pytest.mark.slow
def test_the_saved_model_is_the_trained_weights(sft_runs, tmp_path):
    """model/ loads with AutoModelForCausalLM and holds exactly the weights of the last step's
    sharded checkpoint (gathered offline), which are one process's trained weights, not the start."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    from temper.models import build_preset, build_tokenizer

    saved = AutoModelForCausalLM.from_pretrained(sft_runs / "p2" / "model").state_dict()
    dcp_to_torch_save(sft_runs / "p2" / "checkpoints" / "step-0000004" / "sharded", tmp_path / "full.pt")
    trained = torch.load(tmp_path / "full.pt", weights_only=False)["model"]
    assert set(trained) <= set(saved) and len(trained) > 10
    for name, weight in trained.items():
        assert torch.equal(saved[name], weight), name
    alone = AutoModelForCausalLM.from_pretrained(sft_runs / "p1" / "model").state_dict()
    start = build_preset("nano", build_tokenizer(), seed=0).state_dict()
    for name, weight in trained.items():
        assert torch.allclose(weight, alone[name], atol=1e-5), name
    assert any(not torch.allclose(w, start[n], atol=1e-4) for n, w in trained.items())  # it trained


@pytest.mark.slow
def test_lora_under_fsdp_in_two_processes_matches_one(tmp_path):
    """A LoRA adapter (frozen base, trainable A/B in the same sharded layers) trains under fsdp
    with one process's losses and gradient norms."""
    lora = {"r": 4, "alpha": 8}
    _sft(tmp_path / "p1", 1, {"lora": lora})
    _sft(tmp_path / "p2", 2, {"lora": lora, "strategy": "fsdp"})
    _same_rows(_history(tmp_path / "p1"), _history(tmp_path / "p2"), ("loss", "grad_norm", "eval_loss"), 1e-5)


@pytest.fixture(scope="module")
def rl_runs(tmp_path_factory) -> Path:
    """4 GRPO steps alone (p1) and in 2 fsdp processes (p2), checkpoints every 2."""
    root = tmp_path_factory.mktemp("fsdp_rl")
    launch([str(TESTS / "dist_rl.py"), str(root / "p1"), json.dumps({"steps": 4})], 1)
    launch([str(TESTS / "dist_rl.py"), str(root / "p2"), json.dumps(RL_SETTINGS)], 2)
    return root


@pytest.mark.slow
def test_rl_under_fsdp_in_two_processes_matches_one(rl_runs):
    """Rewards and rollouts equal one process's (the sampler reads the full weights published
    after each update: a missed gather would sample steps 2-4 from stale weights), and so do the
    losses and gradient norms."""
    assert worlds(rl_runs / "p2") == [(0, 2), (1, 2)]
    one, two = _history(rl_runs / "p1"), _history(rl_runs / "p2")
    assert [r["reward"] for r in two] == [r["reward"] for r in one]
    assert len({r["reward"] for r in one}) > 1  # the policy moved: later steps test the update
    _same_rows(one, two, ("loss/policy", "loss"), rel=1e-5)
    # the policy gradient is a sum of advantage-weighted terms of both signs that mostly cancel, so
    # the float32 rounding of another reduction order (the shards' reduce-scatter) shows more in
    # its norm: 3.1e-5 relative at step 2 on an AVX-512 Xeon (a missed reduction is off by ~2x)
    _same_rows(one, two, ("grad_norm",), rel=1e-4)
    assert (rl_runs / "p2" / "rollouts.jsonl").read_text() == (rl_runs / "p1" / "rollouts.jsonl").read_text()


@pytest.mark.slow
def test_rl_under_fsdp_resumes_exactly(rl_runs, tmp_path):
    out = tmp_path / "cut"
    launch([str(TESTS / "dist_rl.py"), str(out), json.dumps(RL_SETTINGS), "3"], 2, ok=False)
    assert (out / "checkpoints" / "step-0000002" / "sharded" / ".metadata").exists()
    launch([str(TESTS / "dist_rl.py"), str(out), json.dumps(RL_SETTINGS)], 2)
    full, resumed = _history(rl_runs / "p2"), _history(out)
    assert [r["reward"] for r in resumed] == [r["reward"] for r in full]
    _same_rows(full[2:], resumed[2:], ("loss/policy", "loss", "grad_norm"), rel=1e-6)


def test_one_process_under_fsdp_trains_as_ddp(tokenizer, tmp_path):
    """Without a second process there is nothing to shard over: fsdp trains the model itself, with
    ddp's losses bit for bit and Accelerate's checkpoints (no sharded/)."""
    import dataclasses

    import torch

    from temper.data import build_sequences, parse_row
    from temper.models import build_preset
    from temper.train import NextToken, TrainConfig, train_supervised

    rows = [parse_row({"text": f"{a}+{a}={2 * a}"}, "x", i) for i, a in enumerate(range(16))]
    data, _ = build_sequences(tokenizer, rows, max_len=16)
    config = TrainConfig(max_steps=2, batch_size=4, lr=3e-3, warmup_steps=0, save_every=2, progress=False)
    results, models = [], []
    for strategy in ("ddp", "fsdp"):
        model = build_preset("nano", tokenizer, seed=0)
        out = tmp_path / strategy
        run = dataclasses.replace(config, strategy=strategy)
        results.append(train_supervised(model, data, run, out, objective=NextToken(tokenizer.pad_token_id)))
        models.append(model)
        assert not (out / "checkpoints" / "step-0000002" / "sharded").exists()
    assert results[0].losses == results[1].losses
    assert all(torch.equal(a, b) for a, b in zip(models[0].parameters(), models[1].parameters()))


DPO = """\
name: dpo_fsdp
model: {{preset: nano, seed: 0}}
tasks: {{arithmetic: {{}}}}
stages:
  - kind: pretrain
    corpus: {{tasks: [arithmetic], problems_per_task: 64}}
    max_len: 64
    train: {{max_steps: 2, batch_size: 8, lr: 0.003, warmup_steps: 0, progress: false}}
  - kind: dpo
    data: {{files: ["{pairs}"]}}
    max_len: 64
    train: {{max_steps: 4, batch_size: 8, lr: 0.003, warmup_steps: 0, log_every: 1, save_every: 2, progress: false{strategy}}}
"""


@pytest.mark.slow
def test_dpo_under_fsdp_in_two_processes_matches_one(tmp_path):
    """Preference training takes the strategy too: DPO's loss, reward accuracy and gradient norm
    over 2 fsdp processes (each its half of a batch of pairs, the reference's logprobs included)
    equal one plain process's, step after step."""
    import random

    from test_distributed import launch

    rng = random.Random(0)
    pairs = tmp_path / "pairs.jsonl"
    with pairs.open("w") as f:
        for _ in range(32):
            a, b = rng.randint(0, 50), rng.randint(0, 50)
            row = {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + rng.randint(1, 9))}
            f.write(json.dumps(row) + "\n")
    rows = {}
    for processes, strategy in ((1, ""), (2, ", strategy: fsdp")):
        recipe = tmp_path / f"dpo{processes}.yaml"
        recipe.write_text(DPO.format(pairs=pairs, strategy=strategy))
        run = tmp_path / f"p{processes}"
        launch(["-m", "temper.cli", "run", str(recipe), "--output-dir", str(run)], processes)
        log = run / "02-dpo" / "metrics.jsonl"
        rows[processes] = [r for r in map(json.loads, log.read_text().splitlines()) if "loss" in r]
    assert [r["step"] for r in rows[2]] == [1, 2, 3, 4]
    sharded = tmp_path / "p2" / "02-dpo" / "checkpoints" / "step-0000004" / "sharded"
    assert sorted(p.name for p in sharded.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert len({r["loss"] for r in rows[1]}) > 1  # the policy moved: later steps test the update
    _same_rows(rows[1], rows[2], ("loss", "rewards/accuracies"), rel=1e-5)
    _same_rows(rows[1], rows[2], ("grad_norm",), rel=1e-4)  # reduction-order rounding, as in RL
