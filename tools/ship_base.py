"""Ship a finished pre-training run as a base in checkpoints/, the way checkpoints/tiny-base is.

    python tools/ship_base.py runs/small_base/pretrain checkpoints/small-base --dtype bfloat16

The folder gets `model/` (loads with the Auto classes; `--dtype bfloat16` halves the weights so
an 8.5M-parameter base stays under 20 MB, and every stage upcasts to fp32 on the CPU when it
loads them), `pretrain.json` (the settings hash a recipe's `pretrain` stage checks with
`cache:`, plus `shipped_dtype`) and `metrics.jsonl`. A recipe whose pretrain stage states the
same settings then uses the shipped base instead of training. The copy is atomic: a failure
leaves the old folder (or none).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from temper.atomic import atomic_dir, atomic_write_json


def ship(run: Path, target: Path, dtype: str = "float32") -> dict:
    summary_path = run / "pretrain.json"
    if not summary_path.exists() or not (run / "model").is_dir():
        raise SystemExit(f"{run}: not a finished pretrain run (no pretrain.json and model/)")
    summary = json.loads(summary_path.read_text())
    with atomic_dir(target) as tmp:
        shutil.copytree(run / "model", tmp / "model")
        model = AutoModelForCausalLM.from_pretrained(run / "model", dtype=torch.float32)
        model.to(getattr(torch, dtype)).save_pretrained(tmp / "model")
        shutil.copy(run / "metrics.jsonl", tmp / "metrics.jsonl")
        atomic_write_json(tmp / "pretrain.json", {**summary, "shipped_dtype": dtype})
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a pretrain stage folder (pretrain.json, model/)")
    parser.add_argument("target", type=Path, help="the folder to ship into, e.g. checkpoints/small-base")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    summary = ship(args.run, args.target, args.dtype)
    size = sum(p.stat().st_size for p in (args.target / "model").iterdir())
    print(f"{args.target}: hash {summary['hash']}, {summary['parameters']:,} parameters, {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
