"""Atomic training checkpoints through Accelerate's state saving: what the accelerator prepared
(model, optimizer) plus the RNG state of EVERY process (`random_states_<rank>.pkl`: python,
numpy, torch, cuda), enough to resume exactly under the same number of processes.

A checkpoint is the folder `step-<step>`; it appears in one rename once every process has
written its part, so a crash never leaves a checkpoint that looks complete but is not.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from accelerate import Accelerator

from temper.distributed import shared_atomic_dir

_STEP_DIR = re.compile(r"^step-(\d+)$")


def save_checkpoint(root: Path, step: int, accelerator: Accelerator, keep: int = 2) -> Path:
    """Write `root/step-<step>` (every process calls this); keep the newest `keep` checkpoints."""
    target = root / f"step-{step:07d}"
    with shared_atomic_dir(target) as tmp:
        # safetensors would refuse tied weights (embeddings shared with the LM head) in a raw
        # state dict; torch.save keeps the sharing.
        accelerator.save_state(str(tmp), safe_serialization=False)
        if accelerator.is_main_process:
            (tmp / "state.json").write_text(json.dumps({"step": step}))
    if accelerator.is_main_process:
        for old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return target


def list_checkpoints(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").exists()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def step_of(checkpoint: Path) -> int:
    """The step a checkpoint folder of `list_checkpoints` was saved at (read off its name)."""
    return int(_STEP_DIR.match(checkpoint.name).group(1))


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read back (damaged on disk, or edited): named, with what to do."""


def load_checkpoint(path: Path, accelerator: Accelerator) -> int:
    """Restore what `accelerator` prepared and this process's RNG in place; return the step.

    Prepare the same objects in the same order as the run that saved it. A checkpoint is written
    whole or not at all, so one that fails to load was damaged afterwards; whatever torch,
    pickle or Accelerate raise for it, the error names the folder rather than a traceback."""
    try:
        step = json.loads((path / "state.json").read_text())["step"]
        accelerator.load_state(str(path))
    except Exception as err:
        why = " ".join(str(err).split())[:200] or type(err).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {why}); remove that folder to "
            f"resume from the checkpoint before it, or remove {path.parent.parent} to start the stage over"
        ) from err
    return step
