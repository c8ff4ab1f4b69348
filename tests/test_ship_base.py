"""tools/ship_base.py: a finished pretrain run shipped as a base (bf16 to keep it small) is a cache
hit for the same settings, and every stage loads it back as fp32 with the bf16-rounded values."""

import importlib.util
import json
from pathlib import Path

import torch

from temper.cli import main
from temper.models.loading import load_model

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("ship_base", ROOT / "tools" / "ship_base.py")
ship_base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ship_base)


def pretrain(out: Path, cache: Path | None = None) -> int:
    args = ["pretrain", "--preset", "nano", "--seed", "0", "--out", str(out), "--corpus.tasks", "arithmetic"]
    args += ["--corpus.problems_per_task", "200", "--max_len", "64", "--train.max_steps", "3"]
    args += ["--train.batch_size", "4", "--train.warmup_steps", "1"] + (
        ["--cache", str(cache)] if cache else []
    )
    return main(args)


def test_a_bf16_base_is_a_cache_hit_and_loads_as_fp32(tmp_path, capsys):
    assert pretrain(tmp_path / "run") == 0
    summary = ship_base.ship(tmp_path / "run", tmp_path / "shipped", "bfloat16")
    shipped = json.loads((tmp_path / "shipped" / "pretrain.json").read_text())
    assert shipped == {**summary, "shipped_dtype": "bfloat16"}
    fp32 = load_model(str(tmp_path / "run" / "model"), torch.device("cpu"))
    size = (tmp_path / "shipped" / "model" / "model.safetensors").stat().st_size
    assert size < 0.6 * (tmp_path / "run" / "model" / "model.safetensors").stat().st_size

    capsys.readouterr()
    assert pretrain(tmp_path / "again", cache=tmp_path / "shipped") == 0
    assert f"using the base in {tmp_path / 'shipped'}" in " ".join(capsys.readouterr().err.split())
    reloaded = load_model(str(tmp_path / "again" / "model"), torch.device("cpu"))
    assert reloaded.dtype == torch.float32
    for (name, a), (_, b) in zip(fp32.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a.to(torch.bfloat16).float(), b), name


def test_an_unfinished_run_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    try:
        ship_base.ship(tmp_path / "run", tmp_path / "shipped")
    except SystemExit as stop:
        assert "not a finished pretrain run" in str(stop)
    else:
        raise AssertionError("shipped an unfinished run")
    assert not (tmp_path / "shipped").exists()
