"""The one registry of stage kinds: every module of `temper.stages` that defines `KIND`.

Found by listing the package, so adding a kind is adding its module; `register` adds one from
elsewhere (a plugin, or a test's toy kind).
"""

from __future__ import annotations

import importlib
import pkgutil

import temper.stages
from temper.stages.base import StageKind

_KINDS: dict[str, StageKind] = {}


def _discover() -> None:
    for info in pkgutil.iter_modules(temper.stages.__path__):
        kind = getattr(importlib.import_module(f"temper.stages.{info.name}"), "KIND", None)
        if isinstance(kind, StageKind):
            _KINDS.setdefault(kind.name, kind)


def kinds() -> dict[str, StageKind]:
    """Every stage kind by name, in pipeline order."""
    if not _KINDS:
        _discover()
    return dict(sorted(_KINDS.items(), key=lambda kv: (kv[1].order, kv[0])))


def get(name: str) -> StageKind | None:
    return kinds().get(name)


def register(kind: StageKind) -> None:
    kinds()  # the built-in kinds first, so a registered one cannot shadow them by arriving early
    if kind.name in _KINDS and _KINDS[kind.name] is not kind:
        raise ValueError(f"stage kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind


def unregister(name: str) -> None:
    _KINDS.pop(name, None)
