"""Atomic training checkpoints: model + optimizer state + step, enough to resume exactly."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from temper.atomic import atomic_dir

_STEP_DIR = re.compile(r"^step-(\d+)$")


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: Any, keep: int = 2) -> Path:
    """Write `root/step-<step>` in one rename; keep the newest `keep` checkpoints."""
    target = root / f"step-{step:07d}"
    with atomic_dir(target) as tmp:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        rng = {"torch": torch.get_rng_state()}
        torch.save(rng, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step}))
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").exists()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: Any) -> int:
    """Restore model and optimizer in place; return the number of completed steps."""
    model.load_state_dict(torch.load(path / "model.pt", map_location="cpu", weights_only=True))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True))
    torch.set_rng_state(torch.load(path / "rng.pt", weights_only=True)["torch"])
    return json.loads((path / "state.json").read_text())["step"]
