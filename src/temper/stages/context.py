"""What a stage needs from the run: where to write, the recipe's tasks, earlier stages' models."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temper.models.chat import ChatOptions
from temper.tasks.base import Task


@dataclass
class StageContext:
    run_dir: Path
    base_dir: Path  # relative paths in a recipe resolve against the recipe file's folder
    tasks: dict[str, Task]
    task_options: dict[str, dict[str, Any]]
    models: dict[str, Path] = field(default_factory=dict)  # stage name -> saved model dir
    model_hashes: dict[str, str] = field(default_factory=dict)  # stage name -> settings hash
    chat: ChatOptions = field(default_factory=ChatOptions)  # model.chat_template / eos_token
    contamination: Any = None  # the recipe's ContaminationSpec (temper.data.contamination); None: defaults
    eval_specs: list[tuple[list[str], list[str], int, int]] = field(default_factory=list)
    """(tasks, splits, n_problems, seed) of each eval stage of the recipe: what training sets are checked against."""
    stage_dirs: dict[str, Path] = field(default_factory=dict)  # stage name -> its folder, every kind
    output_hashes: dict[str, str] = field(default_factory=dict)  # stage name -> settings hash, every kind

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()

    def export_dir(self, ref: str, folder: str) -> Path:
        """The folder a typed reference (`StageKind.uses`) names: an earlier stage's `<out>/<folder>`
        (what its kind exports), else a folder relative to the recipe's folder."""
        return self.stage_dirs[ref] / folder if ref in self.stage_dirs else self.resolve(ref)

    def model_source(self, name: str) -> Path | str:
        """A recipe's `model.path` as it loads: a local folder relative to the recipe's folder, or
        a hub id as written."""
        local = local_model(name, self.base_dir)
        return name if local is None else local

    def model_of(self, ref: str) -> Path | str:
        """The model a stage's reference (`StageKind.uses`) names: an earlier model stage's saved
        model, else a local folder relative to the recipe or a hub id."""
        return self.models[ref] if ref in self.models else self.model_source(ref)


def recipe_path(base_dir: Path, path: str) -> Path:
    """A path of a recipe, relative to the recipe's folder `base_dir` (as `StageContext.resolve`,
    but normalized rather than resolved: `.resolve()` raises on a loop of symbolic links)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(os.path.normpath(base_dir / p))


def local_model(name: str, base_dir: Path) -> Path | None:
    """The local folder a model name means, relative to `base_dir`; None for a hub id. A name is
    local when it exists there, or when only a path can be written that way (`./m`, `~/m`, `a/b/c`)."""
    from temper.models.loading import looks_like_path

    p = Path(name).expanduser()
    path = p if p.is_absolute() else (base_dir / p).resolve()
    return path if path.exists() or looks_like_path(name) else None


def settings_hash(*parts: Any) -> str:
    """A stable digest of JSON-serializable settings: equal settings, equal outputs."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
