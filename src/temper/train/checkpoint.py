"""Atomic training checkpoints through Accelerate's state saving: what the accelerator prepared
(model, optimizer) plus the RNG state of EVERY process (`random_states_<rank>.pkl`: python,
numpy, torch, cuda), enough to resume exactly under the same number of processes. Under strategy
fsdp nothing is prepared: the sharded module and optimizer are in `sharded/`, written by every
process through torch.distributed.checkpoint (`temper.train.strategy.Trained.save`).

A checkpoint is the folder `step-<step>`; it appears in one rename once every process has
written its part, so a crash never leaves a checkpoint that looks complete but is not. Its
`state.json` also keeps the run's totals so far (tokens, seconds, each step's loss), so that a
resumed run's summary covers the steps before the resume as well.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from temper.distributed import shared_atomic_dir

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    from accelerate import Accelerator

    from temper.train.strategy import Trained

_STEP_DIR = re.compile(r"^step-(\d+)$")
console = Console(stderr=True)


def save_checkpoint(
    root: Path,
    step: int,
    accelerator: Accelerator,
    keep: int = 2,
    totals: dict[str, Any] | None = None,
    files: dict[str, Any] | None = None,
    trained: Trained | None = None,
) -> Path:
    """Write `root/step-<step>` (every process calls this); keep the newest `keep` checkpoints.
    `totals`: what the run's summary adds up over its steps so far (the main process's), which
    `resume` hands back. `files`: more of the run's state, name -> object (torch.save, main
    process), written inside the same atomic folder. `trained`: its sharded state too (fsdp)."""
    target = root / f"step-{step:07d}"
    with shared_atomic_dir(target) as tmp:
        # safetensors would refuse tied weights (embeddings shared with the LM head) in a raw
        # state dict; torch.save keeps the sharing.
        accelerator.save_state(str(tmp), safe_serialization=False)
        if trained is not None:
            trained.save(tmp)
        if accelerator.is_main_process:
            if files:
                import torch  # here: importing this module stays cheap

                for name, obj in files.items():
                    torch.save(obj, tmp / name)
            (tmp / "state.json").write_text(json.dumps({"step": step, "totals": totals or {}}))
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


def load_checkpoint(path: Path, accelerator: Accelerator, trained: Trained | None = None) -> int:
    """Restore what `accelerator` prepared (and `trained`'s shards) and this process's RNG in
    place; return the step.

    Prepare the same objects in the same order as the run that saved it. A checkpoint is written
    whole or not at all, so one that fails to load was damaged afterwards; whatever torch,
    pickle or Accelerate raise for it, the error names the folder rather than a traceback."""
    try:
        step = json.loads((path / "state.json").read_text())["step"]
        accelerator.load_state(str(path))
        if trained is not None:
            trained.load(path)
    except Exception as err:
        why = " ".join(str(err).split())[:200] or type(err).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {why}); remove that folder to "
            f"resume from the checkpoint before it, or remove {path.parent.parent} to start the stage over"
        ) from err
    return step


def resume(
    root: Path, accelerator: Accelerator, trained: Trained | None = None
) -> tuple[int, dict[str, Any]]:
    """Load the newest checkpoint under `root` into what `accelerator` prepared and say so on the
    console -> (its step, the run's totals up to it); (0, {}) when there is none. A checkpoint
    written before totals were kept gives {}."""
    checkpoints = list_checkpoints(root)
    if not checkpoints:
        return 0, {}
    step = load_checkpoint(checkpoints[-1], accelerator, trained)
    if accelerator.is_main_process:
        message = f"{root.parent.name}: resuming from step {step} ({checkpoints[-1]})"
        console.print(message, markup=False, highlight=False, soft_wrap=True)  # a path, whole
    return step, json.loads((checkpoints[-1] / "state.json").read_text()).get("totals", {})
