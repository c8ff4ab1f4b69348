"""What a stage needs from the run: where to write, the recipe's tasks, earlier stages' models."""

from __future__ import annotations

import hashlib
import json
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

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.base_dir / p).resolve()


def settings_hash(*parts: Any) -> str:
    """A stable digest of JSON-serializable settings: equal settings, equal outputs."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
