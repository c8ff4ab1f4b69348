"""The markers a stage folder holds, shared by `temper run` and the stand-alone stage commands.

`stage.started.json` is written when a stage starts: the hash of its settings and inputs (and, from
the stage commands, those settings themselves, so a refused rerun can name what changed);
`stage.json` when it completes, with the same hash. A folder whose `stage.json` hash matches is
complete; one whose started hash differs was trained with other settings and must not be resumed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STARTED, COMPLETE = "stage.started.json", "stage.json"


def stage_settings(stage: Any) -> dict[str, Any]:
    """A stage spec's settings as its hash covers them: `train.progress` (how the bar is drawn)
    changes no output, so it is left out, and so are the fields a spec lists in `UNHASHED` (where
    a server listens: `server_url`); so are the fields a spec lists in `HASHED_WHEN_SET`
    while they are empty (fields added after runs were recorded: those runs stay complete). An rl
    `train:` block's feature blocks hash as `RLConfig.hashed_blocks` says (a block that replaced
    flat keys as those keys did), so a run recorded before the block stays complete too."""
    exclude: dict[str, Any] = {"train": {"progress"}} if hasattr(stage, "train") else {}
    replaced: dict[str, Any] = {}
    if exclude:  # the train block's own late fields, left out while at their defaults
        train = stage.train
        exclude["train"] |= {
            name
            for name in getattr(type(train), "HASHED_WHEN_SET", ())
            if getattr(train, name) == _default(train, name)
        }
        if hasattr(train, "hashed_blocks"):
            dropped, replaced = train.hashed_blocks()
            exclude["train"] |= dropped
    exclude |= {
        name: True for name in getattr(type(stage), "HASHED_WHEN_SET", ()) if not getattr(stage, name)
    }
    exclude |= {name: True for name in getattr(type(stage), "UNHASHED", ())}  # where, not what
    settings = stage.model_dump(exclude=exclude or None)
    if replaced:
        settings["train"] |= replaced
    train = getattr(stage, "train", None)
    if _unset_warmup_known(train):
        # an unset warm-up is hashed as the steps it resolves to: runs recorded when the default
        # was a flat 20 keep their hash wherever it still resolves to 20 (max_steps >= 200), and
        # an explicit value equal to the resolved one is the same run; with `epochs` the steps
        # (and so the warm-up) are known only once the data is read, and it is hashed unset
        settings["train"]["warmup_steps"] = train.resolved_warmup()
    return settings


def _unset_warmup_known(train: Any) -> bool:
    """A supervised `train:` block (`TrainConfig`) whose warm-up is unset and its steps known."""
    return (
        hasattr(train, "resolved_warmup")
        and train.warmup_steps is None
        and getattr(train, "epochs", None) is None
    )


def _default(obj: Any, name: str) -> Any:
    """The default of field `name` of a dataclass or pydantic instance."""
    import dataclasses

    if dataclasses.is_dataclass(obj):
        f = next(f for f in dataclasses.fields(obj) if f.name == name)
        return (
            f.default_factory() if f.default is dataclasses.MISSING else f.default
        )  # (a block: its factory)
    return type(obj).model_fields[name].default


def read_marker(path: Path) -> dict[str, Any] | None:
    """A marker's contents; None when it is missing or unreadable (a half-written one counts as absent)."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def read_hash(path: Path) -> str | None:
    return (read_marker(path) or {}).get("hash")


def as_json(value: Any) -> Any:
    """`value` as it reads back from a marker (tuples become lists, paths strings), to compare."""
    return json.loads(json.dumps(value, default=str))


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


_MISSING = object()


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key.path: old -> new` for each setting that differs (keys present on one side only too)."""
    before, after = _flat(as_json(old)), _flat(as_json(new))
    lines = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key, _MISSING), after.get(key, _MISSING)
        if a != b:
            shown = [
                "(unset)" if v is _MISSING else json.dumps(v) if isinstance(v, str) else str(v)
                for v in (a, b)
            ]
            lines.append(f"{key}: {shown[0]} -> {shown[1]}")
    return lines
