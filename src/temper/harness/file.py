"""A harness file: the Python code between a frozen model and an environment, and how it is loaded.

A harness changes what the model sees, never the environment or the model. A harness file is a
plain Python module defining

    KNOBS: dict[str, list]      # the declared knobs: name -> the values it may take
    SETTINGS: dict[str, Any]    # this harness's value of every knob (one literal assignment)

    def bootstrap(env: dict, settings: dict) -> str
        # pre-run, once per episode, before the model's first turn: text put before the first
        # prompt ("" for none). `env` describes the environment as a user would know it before
        # playing: {"task", "split", "options" (the task's options), "max_turns", "observation"
        # (the first observation)}; never the problem's answer.
    def build_prompt(observation: str, memory: dict, first: bool, settings: dict) -> str
        # the user turn the model reads for one observation of the environment
    def update_memory(memory: dict, action: str, observation: str, settings: dict) -> dict
        # the state the harness carries between turns (a summary line, the moves so far...),
        # after the model's `action` brought `observation`; the next build_prompt reads it
    def system(settings: dict) -> str              # optional: a system turn ("" for none)

Each function takes the harness's SETTINGS last.

Every function is user code: called under `temper.guard`'s time limit, and a failure is one line
naming the harness file and the function (`harness h.py:build_prompt raised on problem map3:
KeyError: 'x' (at h.py:21)`). A file that cannot be used (it does not parse, lacks a function,
a setting outside its knob's values) is refused before anything runs, in one line naming the
file and, where there is one, its line (`HarnessError`).

A proposer edits a harness as a file: the knob search (`temper.harness.proposers.KnobSearch`)
rewrites the `SETTINGS` assignment (`with_settings`), an endpoint proposer writes a whole new
file; either way each candidate is a file of its own that `load_harness` checks the same way.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import pprint
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from temper import guard

REQUIRED = ("bootstrap", "build_prompt", "update_memory")
OPTIONAL = ("system",)
_count = itertools.count()


class HarnessError(guard.UserCodeError):
    """A harness file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class Harness:
    """A loaded harness file: its path, its source, its knobs and settings, its functions."""

    path: Path
    source: str
    knobs: dict[str, list[Any]]
    settings: dict[str, Any]
    module: ModuleType

    @property
    def name(self) -> str:
        return self.path.name

    def call(self, fn: str, *args: Any, context: str = "") -> Any:
        """`fn(*args)` of the harness under the user-code time limit; a failure is a
        `UserCodeFailure` naming the file and function."""
        return guard.call(getattr(self.module, fn), *args, what=f"harness {self.name}:{fn}", context=context)

    def has(self, fn: str) -> bool:
        return callable(getattr(self.module, fn, None))


def _settings_node(tree: ast.Module) -> ast.Assign | ast.AnnAssign | None:
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "SETTINGS" for t in targets):
            return node
    return None


def load_harness(path: Path | str) -> Harness:
    """The harness at `path`, checked (module docstring); `HarnessError` naming the file if not."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise HarnessError(f"harness {where}: no such file")
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=where)
    except SyntaxError as err:
        raise HarnessError(f"harness {where}:{err.lineno}: does not parse: {err.msg}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HarnessError(f"harness {where}: cannot be read: {guard.last_line(err)}") from None
    node = _settings_node(tree)
    if node is None:
        raise HarnessError(f"harness {where}: defines no SETTINGS (a dict: knob -> value)")
    spec = importlib.util.spec_from_file_location(f"temper_harness_{next(_count)}", path)
    module = importlib.util.module_from_spec(spec)
    try:  # importing runs the file's top level: user code, under the time limit
        guard.call(spec.loader.exec_module, module, what=f"harness {where}")
    except guard.UserCodeFailure as err:
        raise HarnessError(f"importing {err.line}") from None
    missing = [fn for fn in REQUIRED if not callable(getattr(module, fn, None))]
    if missing:
        raise HarnessError(
            f"harness {where}: defines no {', '.join(missing)} (a harness defines {', '.join(REQUIRED)}; "
            "see temper.harness.file)"
        )
    knobs, settings = getattr(module, "KNOBS", None), module.SETTINGS
    if not isinstance(knobs, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and v for k, v in knobs.items()
    ):
        raise HarnessError(
            f"harness {where}: KNOBS must be a dict of knob name -> a non-empty list of values"
        )
    if not isinstance(settings, dict):
        raise HarnessError(
            f"harness {where}:{node.lineno}: SETTINGS must be a dict, not {type(settings).__name__}"
        )
    for key, value in settings.items():
        if key not in knobs:
            raise HarnessError(
                f"harness {where}:{node.lineno}: SETTINGS[{key!r}] is no knob (KNOBS: {sorted(knobs)})"
            )
        if value not in knobs[key]:
            raise HarnessError(
                f"harness {where}:{node.lineno}: SETTINGS[{key!r}] = {value!r} is not one of KNOBS[{key!r}] {knobs[key]}"
            )
    unset = [k for k in knobs if k not in settings]
    if unset:
        raise HarnessError(f"harness {where}:{node.lineno}: SETTINGS gives no value for {unset}")
    return Harness(path, source, knobs, dict(settings), module)


def with_settings(source: str, settings: dict[str, Any]) -> str:
    """`source` (a harness file's text) with its `SETTINGS` assignment replaced by `settings`:
    the file a knob proposer writes, the rest of the code as it was (so candidates diff by a line)."""
    tree = ast.parse(source)
    node = _settings_node(tree)
    if node is None:
        raise ValueError("the harness defines no SETTINGS")
    lines = source.splitlines(keepends=True)
    text = "SETTINGS = " + pprint.pformat(settings, sort_dicts=False, width=100) + "\n"
    return "".join(lines[: node.lineno - 1]) + text + "".join(lines[node.end_lineno :])
