"""Lazy package exports (PEP 562): a package's `__init__` names what it re-exports and from which
module, and a name's module is imported on first use.

Why: `temper --help`, `temper run --dry-run` and every refusal of a bad recipe read only configs,
and a package that imported its members eagerly (`temper.models` -> transformers, peft, torch)
made each of them pay seconds for libraries they never call. With lazy exports `from temper.models
import build_preset` still works, and costs torch only where it is called from.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any


def exports(
    namespace: dict[str, Any], table: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for the package whose `globals()` are `namespace`, exporting each
    name of `table` from the module it maps to (relative to the package, e.g. `"chat"`). Assign
    both in the package's `__init__`: `__getattr__, __dir__ = exports(globals(), {...})`."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # later lookups are ordinary attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


def no_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`@torch.no_grad()` for a module that imports torch only when its functions run: the same
    gradient-free call, with torch imported at the first call rather than at the decoration."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return call
