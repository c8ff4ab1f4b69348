"""Write docs/reference/recipe.md, the recipe reference, from the typed configs themselves.

Every key a recipe accepts is a field of a pydantic model or a (pydantic-validated) dataclass,
and its attribute docstring is the description `temper <kind> --help` shows. This walks those
types, so the reference cannot drift from what the recipe validates: `tests/test_docs.py` fails
when the committed page differs from what this prints.

    python tools/recipe_reference.py            # rewrite docs/reference/recipe.md
    python tools/recipe_reference.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from temper.catalog import TASKS
from temper.recipe import ModelSpec, Recipe
from temper.stages import registry

OUT = Path(__file__).resolve().parents[1] / "docs" / "reference" / "recipe.md"
REQUIRED = object()


def _dataclass_docs(cls: type) -> dict[str, str]:
    """A dataclass's attribute docstrings, as pydantic reads them (`use_attribute_docstrings`)."""
    try:
        properties = TypeAdapter(cls).json_schema().get("properties", {})
    except Exception:  # a task config whose field types have no JSON schema: no descriptions
        return {}
    return {name: p.get("description", "") for name, p in properties.items()}


def fields(cls: type) -> list[tuple[str, Any, str, Any]]:
    """(name, annotation, description, default or REQUIRED) of a pydantic model or dataclass,
    in declaration order."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return [
            (
                name,
                f.annotation,
                f.description or "",
                REQUIRED if f.is_required() else f.get_default(call_default_factory=True),
            )
            for name, f in cls.model_fields.items()
        ]
    docs = _dataclass_docs(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        out.append((f.name, hints[f.name], docs.get(f.name, ""), default))
    return out


def nested(annotation: Any) -> type | None:
    """The block type a key holds (a model or dataclass, also inside `X | None` or `list[X]`)."""
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return annotation
    return next((inner for arg in typing.get_args(annotation) if (inner := nested(arg)) is not None), None)


def type_name(annotation: Any) -> str:
    """A recipe writer's spelling of a type: `int`, `"hf" | "vllm"`, `list[str]`, `block`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a!r}`" if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_name(a) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args if a is not Ellipsis)}]"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or dataclasses.is_dataclass(annotation)
    ):
        return "block"
    return getattr(annotation, "__name__", str(annotation))


def shown(value: Any) -> str:
    """A default as a recipe would write it."""
    if value is REQUIRED:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "see below"
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"' if value else '""'
    return str(value).replace("|", "\\|")


def one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def block(cls: type, key: str, depth: int, seen: set[type], lines: list[str]) -> None:
    """The table of `cls`'s keys under the heading `key`, then each nested block's (once)."""
    rows = [(n, a, d, v) for n, a, d, v in fields(cls) if n != "kind"]
    lines += [f"{'#' * depth} `{key}`", ""]
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(cls.__name__ + "("):  # a dataclass's generated signature is no doc
        lines += [one_line(doc), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {type_name(a)} | {shown(v)} | {one_line(d)} |" for n, a, d, v in rows]
    lines.append("")
    for n, a, _, _ in rows:
        inner = nested(a)
        if inner is not None and inner not in seen:
            seen.add(inner)
            block(inner, f"{key}.{n}", min(depth + 1, 6), seen, lines)


def reference() -> str:
    lines = [
        "# Recipe reference",
        "",
        "<!-- generated by tools/recipe_reference.py from the typed configs: do not edit by hand -->",
        "",
        "Every key a recipe accepts, with its type, default and description, read from the configs the",
        "recipe is validated against (so this page is what `temper run` checks). `temper <kind> --help`",
        "shows the same descriptions as command-line flags.",
        "",
        "## The recipe",
        "",
    ]
    seen: set[type] = {Recipe, ModelSpec}
    top = [(n, a, d, v) for n, a, d, v in fields(Recipe)]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    lines += [f"| `{n}` | {type_name(a)} | {shown(v)} | {one_line(d)} |" for n, a, d, v in top]
    lines.append("")
    block(ModelSpec, "model", 3, seen, lines)
    for n, a, _, _ in top:
        inner = nested(a)
        if inner is not None and inner not in seen:
            seen.add(inner)
            block(inner, n, 3, seen, lines)
    lines += ["## Stage kinds", "", "Each entry of `stages:` is one of these, chosen by its `kind:`.", ""]
    for kind in registry.kinds().values():
        lines += [f"### `kind: {kind.name}`", "", one_line(kind.help), ""]
        block(kind.spec, kind.name, 4, set(seen), lines)
    lines += [
        "## Task options",
        "",
        "`tasks:` maps a name to options; the name (or its `task:` option) picks one of these kinds.",
        "",
    ]
    for name, cls in sorted(TASKS.items()):
        config = getattr(cls, "config_type", None)
        if config is None:
            continue
        lines += [f"### `{name}`", ""]
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        if doc:
            lines += [one_line(doc), ""]
        rows = fields(config)
        if rows:
            lines += ["| option | type | default | description |", "|---|---|---|---|"]
            lines += [f"| `{n}` | {type_name(a)} | {shown(v)} | {one_line(d)} |" for n, a, d, v in rows]
        else:
            lines.append("No options.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed page is out of date")
    args = parser.parse_args(argv)
    text = reference()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT}: out of date; run python tools/recipe_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
