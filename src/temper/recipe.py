"""Recipe schema and validation: a YAML file of model, tasks and stages, checked before anything runs.

An unknown key or a bad value is a `RecipeError` naming the file, the line and the key path, and
suggesting the nearest valid key, or the nearest valid value of a choice (a `Literal` field, a
stage `kind`). The stages are the registered stage kinds' specs (`temper.stages.registry`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, create_model, model_validator

from temper.catalog import TASKS, make_recipe_task
from temper.data.contamination import ContaminationSpec
from temper.models.chat import ChatOptions
from temper.models.presets import PRESETS
from temper.stages import registry
from temper.stages.base import Loc, Located, Strict, Use, raise_located
from temper.stages.context import recipe_path

BASE = "base"
"""The `source:` that names the recipe's model (`Recipe.is_base`): a stage starting again from it."""


class RecipeError(ValueError):
    """An invalid recipe, located by file, line and key path."""


PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]  # "nano" | "tiny" | ...


class ModelSpec(Strict):
    preset: PresetName | None = None
    """A built-in from-scratch preset (nano, tiny, small); needs a pretrain stage."""
    path: str | None = None
    """A local model directory or a hub id (loaded with the transformers Auto classes)."""
    seed: int = 0
    """Initialization seed of a preset."""
    qk_norm: bool = False
    """A preset with QK norm: the Qwen3 architecture at the preset's sizes (the Llama block with an
    RMSNorm over each head's queries and keys before RoPE; loaded through the Auto classes)."""
    chat_template: str | None = None
    """For a tokenizer without one (or to replace it): a built-in template (chatml, llama3, zephyr,
    temper), a Jinja file, or the template text; saved with every trained model."""
    eos_token: str | None = None
    """The token that ends an answer (e.g. '<|im_end|>'): sets the tokenizer's eos, the sampler's
    stop ids and the saved generation_config.eos_token_id (which keeps the base's eos too)."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        if self.qk_norm and self.preset is None:
            raise ValueError("qk_norm builds a preset: a model from a path keeps its own architecture")
        return self

    def weights(self) -> dict[str, Any]:
        """The settings that decide the starting weights, as the stage hashes cover them (the chat
        options are hashed by the stages that chat, so they never retrain a pretrained base)."""
        late = {"qk_norm"} if not self.qk_norm else set()  # added after runs were recorded
        return self.model_dump(exclude={"chat_template", "eos_token"} | late)

    def chat(self) -> ChatOptions:
        return ChatOptions(self.chat_template, self.eos_token)


class Recipe(Strict):
    """A whole recipe. Validate it with `schema()` (as `parse_recipe` does): here `stages` is left
    untyped so that a kind registered after this module is imported (a plugin, a test's toy kind)
    is part of the schema too."""

    name: str
    output_dir: str | None = None
    """Default: runs/<name>."""
    model: ModelSpec
    tasks: dict[str, dict[str, Any]] = {}
    """Task name -> options (see `temper.tasks`); stages refer to tasks by name."""
    contamination: ContaminationSpec = ContaminationSpec()
    """How every training set is checked against the recipe's eval sets (`temper.data.contamination`)."""
    stages: list[Any]
    """Each a registered stage kind's spec, chosen by its `kind` (see `schema()`)."""

    @model_validator(mode="after")
    def _check_references(self, info: ValidationInfo) -> Recipe:
        raise_located(self._reference_errors((info.context or {}).get("base_dir")))
        return self

    def _reference_errors(self, base_dir: Path | None = None) -> list[tuple[Loc, str]]:
        """Rules across blocks, each located at the offending key (the second of two equal stage
        names, the stage's entry naming an unknown task or a later stage, the bad task option)."""
        errors: list[tuple[Loc, str]] = []
        if not self.stages:
            errors.append((("stages",), "a recipe needs at least one stage"))
        # names become folders (runs/<name>/NN-<stage name>): a slash or `..` would put them elsewhere
        if not self.output_dir and _not_a_folder_name(self.name):
            errors.append(
                (("name",), f"{self.name!r} {_not_a_folder_name(self.name)} (it names the run folder)")
            )
        built = {}
        for name, options in self.tasks.items():
            try:
                built[name] = make_recipe_task(name, options or {}, base_dir)
            except (ValueError, TypeError) as err:
                option = getattr(err, "option", None)  # TaskOptionError: the option it concerns
                loc = ("tasks", name, *option) if option else _task_loc(name, options or {})
                errors.append((loc, str(err)))
        names: list[str] = []
        seen: list[str] = []
        for i, stage in enumerate(self.stages):
            if stage.name in names:
                errors.append(
                    (
                        ("stages", i, "name"),
                        f"stage name {stage.name!r} is already used by stages[{names.index(stage.name)}]",
                    )
                )
            names.append(stage.name)
            if _not_a_folder_name(stage.name):
                errors.append(
                    (
                        ("stages", i, "name"),
                        f"{stage.name!r} {_not_a_folder_name(stage.name)} (it names the stage's folder)",
                    )
                )
            kind = registry.get(stage.kind)
            for task in kind.tasks(stage):
                if task not in self.tasks:
                    errors.append(
                        (
                            ("stages", i, *_value_loc(stage, "tasks", task)),
                            f"stage {stage.name!r} uses task {task!r}, which is not in the recipe's tasks {sorted(self.tasks)}",
                        )
                    )
            # rules needing the tasks (rl: declared path signals), once all of them could be built
            if kind.task_rules is not None and all(t in built for t in kind.tasks(stage)):
                errors += [(("stages", i, *loc), msg) for loc, msg in kind.task_rules(stage, built)]
            for loc, ref in _ref_locs(stage):
                if ref in seen or (loc == ("source",) and self.is_base(ref) and (self.model.path or seen)):
                    continue
                if loc != ("source",):
                    hint = " (the model the run started from is always evaluated, first)"
                elif self.model.preset and not seen:
                    hint = f" (`source: {BASE}` is the pretrained base: a pretrain stage must come first)"
                else:
                    hint = f" (write `source: {BASE}` to start from the recipe's model)"
                errors.append(
                    (
                        ("stages", i, *loc),
                        f"stage {stage.name!r} refers to {ref!r}, which is not an earlier model stage {seen}{hint}",
                    )
                )
            earlier = {s.name: s.kind for s in self.stages[:i]}
            errors += [
                (("stages", i, *use[0]), msg)
                for use in kind.uses(stage)
                if (msg := _use_error(stage.name, use, earlier, [s.name for s in self.stages], base_dir))
            ]
            if base_dir is not None:
                errors += [
                    (("stages", i, *loc), f"no such file: {recipe_path(base_dir, name)}")
                    for loc, name in kind.files(stage)
                    if not recipe_path(base_dir, name).is_file()
                ]
            if kind.produces_model:
                seen.append(stage.name)
        if self.model.preset and self.stages and registry.get(self.stages[0].kind).reads != "base":
            first = [k.name for k in registry.kinds().values() if k.reads == "base"]
            errors.append(
                (
                    ("stages", 0, "kind"),
                    f"a preset model starts untrained: the first stage must be {' or '.join(map(repr, first))}",
                )
            )
        return errors

    def is_base(self, ref: str) -> bool:
        """Whether a stage's `source` names the recipe's own model rather than a stage: `base`, or
        the model's `path` as written, or its last part (`qwen3-tiny` for `Qwen/qwen3-tiny`). A
        stage of that name wins (references to stages are looked up first). With a preset it
        means the pretrained base, the first model stage's output (as eval's starting model)."""
        if ref == BASE:
            return True
        path = self.model.path
        return bool(path) and ref in (path, Path(path.rstrip("/")).name)

    def run_dir(self, base: Path, recipe_dir: Path | None = None) -> Path:
        """`output_dir` relative to the recipe's folder (`recipe_dir`), as every path a recipe
        names; the default, runs/<name>, relative to `base` (the working directory)."""
        if self.output_dir:
            return ((recipe_dir or base) / Path(self.output_dir).expanduser()).resolve()
        return (base / "runs" / self.name).resolve()


def model_refs(stage: Any) -> list[str]:
    """The earlier model stages a stage names: its `source` (reads "model") or `models` (reads "models")."""
    reads = registry.get(stage.kind).reads
    if reads == "model":
        return [stage.source] if stage.source else []
    return list(stage.models) if reads == "models" else []


def _use_error(name: str, use: Use, earlier: dict[str, str], stages: list[str], base_dir: Path | None) -> str:
    """Why a stage's reference to another stage's output (`StageKind.uses`) cannot be read, or ''.
    A model: a name with no slash must be an earlier stage or a folder next to the recipe; anything
    else is taken as a path or hub id, which loading checks. A kind's export: an earlier stage of
    that kind, or else a folder that exists (relative to the recipe's folder; unchecked without one)."""
    ref = use[1]
    if len(use) == 3:
        want = use[2]
        if ref in earlier:
            return (
                "" if earlier[ref] == want else f"stage {ref!r} is a {earlier[ref]} stage, not a {want} stage"
            )
        if base_dir is not None and not (base_dir / Path(ref).expanduser()).exists():
            of_kind = [s for s, kind in earlier.items() if kind == want]
            return (
                f"{ref!r} is neither an earlier {want} stage {of_kind} nor a folder "
                f"({(base_dir / ref).resolve()} does not exist)"
            )
        return ""
    if ref in earlier:
        return ""
    if ref in stages:
        return f"stage {name!r} reads {ref!r}, a later stage: stages run in order, so it must come first"
    if "/" not in ref and not ((base_dir or Path.cwd()) / ref).exists():
        return (
            f"stage {name!r} reads {ref!r}, which is neither an earlier stage {list(earlier)} nor a folder next "
            "to the recipe (write ./name for a folder, owner/name for a hub model)"
        )
    return ""


def _ref_locs(stage: Any) -> list[tuple[Loc, str]]:
    """`model_refs` with the key path of each reference inside the stage."""
    reads = registry.get(stage.kind).reads
    if reads == "model":
        return [(("source",), stage.source)] if stage.source else []
    return [(("models", j), ref) for j, ref in enumerate(stage.models)] if reads == "models" else []


def _value_loc(node: Any, field: str, value: Any) -> Loc:
    """Key path, inside a spec, of the first `field` list (at any depth) holding `value`: where a
    stage names a task (`tasks`, `data.tasks`, `corpus.tasks`). () if not found."""
    if isinstance(node, BaseModel):
        items: list[tuple[str, Any]] = [(k, getattr(node, k)) for k in type(node).model_fields]
    elif isinstance(node, dict):  # named sub-specs (a corpus's mix sources)
        items = list(node.items())
    else:
        return ()
    for key, child in items:
        if key == field and isinstance(child, list) and value in child:
            return (key, child.index(value))
        sub = _value_loc(child, field, value)
        if sub:
            return (key, *sub)
    return ()


def _not_a_folder_name(name: str) -> str:
    """Why `name` cannot be one folder's name ("" when it can)."""
    if not name.strip():
        return "is empty"
    if "/" in name or "\\" in name or name in (".", ".."):
        return "is not a plain folder name (no '/', '\\', '.' or '..')"
    return ""


def _task_loc(name: str, options: dict[str, Any]) -> Loc:
    """Where a task entry goes wrong: its `task:` (or its name) when the built-in is unknown,
    else the first unknown option, else the entry."""
    base = options.get("task", name)
    if base not in TASKS:
        return ("tasks", name, "task") if "task" in options else ("tasks", name)
    fields = {f.name for f in dataclasses.fields(TASKS[base].config_type)}
    unknown = [o for o in options if o != "task" and o not in fields]
    return ("tasks", name, unknown[0]) if unknown else ("tasks", name)


def schema() -> type[Recipe]:
    """`Recipe` with `stages` typed as the union of the registered kinds' specs, tagged by `kind`."""
    return _schema(tuple(k.spec for k in registry.kinds().values()))


@cache
def _schema(specs: tuple[type[BaseModel], ...]) -> type[Recipe]:
    stage = Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007  # a tuple of types
    return create_model("Recipe", __base__=Recipe, __module__=__name__, stages=(list[stage], ...))


def _yaml_line(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at `loc` (or of its deepest existing parent)."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == key]
            if not match:
                break
            node = match[0][0] if key == loc[-1] else match[0][1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            break
    return node.start_mark.line + 1 if node is not None else None


def _model_at(loc: tuple[Any, ...], data: Any) -> type | None:
    """The pydantic model (or dataclass) owning the key at `loc`, to suggest valid keys."""
    owner: Any = Recipe
    for key in loc[:-1]:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and key < len(data):
            data = data[key]
        if owner is Recipe and key == "stages":
            owner = "stages"
            continue
        if owner == "stages":
            kind = registry.get(data.get("kind")) if isinstance(data, dict) else None
            owner = kind.spec if kind else None
            continue
        field = keys_of(owner).get(key) if isinstance(key, str) else None
        annotation = getattr(field, "annotation", None) or getattr(field, "type", None)
        candidates = [
            a for a in (getattr(annotation, "__args__", None) or (annotation,)) if isinstance(a, type)
        ]
        owner = next(
            (a for a in candidates if hasattr(a, "model_fields") or hasattr(a, "__dataclass_fields__")), None
        )
        if owner is None:
            return None
    return owner if isinstance(owner, type) else None


def keys_of(owner: Any) -> dict[str, Any]:
    """The keys a block takes: a pydantic model's fields, or a dataclass's fields without its
    ClassVars (`__dataclass_fields__` lists those too, e.g. `HASHED_WHEN_SET`, which no recipe sets)."""
    if hasattr(owner, "model_fields"):
        return dict(owner.model_fields)
    if dataclasses.is_dataclass(owner):
        return {f.name: f for f in dataclasses.fields(owner)}
    return {}


def _choices(listed: str) -> list[str]:
    """pydantic's "'a', 'b' or 'c'" as ["a", "b", "c"]."""
    return [v.strip().strip("'") for v in re.split(r",\s|\sor\s", listed) if v.strip()]


def describe_error(err: Mapping[str, Any]) -> str:
    """pydantic's message for one error, with the nearest valid value when a choice is misspelled
    (a `Literal` field, or a stage `kind`)."""
    ctx = err.get("ctx") or {}
    if err["type"] == "literal_error":
        given, valid, what = err.get("input"), _choices(ctx.get("expected", "")), "value"
    elif err["type"] == "union_tag_invalid":
        given, valid, what = ctx.get("tag"), _choices(ctx.get("expected_tags", "")), "stage kind"
    elif err["type"] == "union_tag_not_found":
        return f"missing {ctx.get('discriminator', 'kind')}: one of {', '.join(registry.kinds())}"
    else:
        return err["msg"]
    near = difflib.get_close_matches(str(given), valid, n=1, cutoff=0.5)
    return (
        f"unknown {what} {given!r}"
        + (f"; did you mean {near[0]!r}?" if near else "")
        + f" Valid: {', '.join(valid)}"
    )


def expand_errors(errors: list[Any]) -> list[dict[str, Any]]:
    """pydantic's errors with each `Located` validator error split into one error per key path,
    its `loc` extended by the path below the validated model (so it can be put at its line)."""
    out: list[dict[str, Any]] = []
    for err in errors:
        located = (err.get("ctx") or {}).get("error")
        if isinstance(located, Located):
            out += [
                {**err, "type": "located", "loc": (*err["loc"], *loc), "msg": msg}
                for loc, msg in located.errors
            ]
        else:
            out.append(dict(err))
    return out


def format_error(err: dict[str, Any], text: str, data: Any, source: str) -> str:
    """One validation error as the recipe reports it: `source:line: key.path: message`, the line
    found in the recipe `text` (a `located` error of a plan-time check formats the same way)."""
    loc = tuple(err["loc"])
    if len(loc) > 2 and loc[0] == "stages" and loc[2] in registry.kinds():
        loc = loc[:2] + loc[3:]  # pydantic puts the union tag in the location of a stage
    if err["type"] == "union_tag_invalid":
        loc += ("kind",)  # point at the bad tag, not at the whole stage
    path = ".".join(f"[{x}]" if isinstance(x, int) else str(x) for x in loc).replace(".[", "[")
    line = _yaml_line(text, loc)
    where = f"{source}:{line}" if line else source
    message = describe_error(err)
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        owner = _model_at(loc, data)
        valid = list(keys_of(owner)) if owner is not None else []
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        message = (
            f"unknown key {loc[-1]!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
            + (f" Valid keys: {', '.join(valid)}" if valid else "")
        )
    return f"{where}: {path or '<recipe>'}: {message}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.safe_load`, but a key given twice in one mapping is an error at its second line
    (PyYAML keeps the last value silently, so an edit to the first copy would do nothing)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str | int | float | bool) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice (first at line {seen[key]}); the second would silently win",
                    key_node.start_mark,
                )
            if isinstance(key, str | int | float | bool):
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def parse_recipe(text: str, source: str = "<recipe>", base_dir: Path | None = None) -> Recipe:
    """Validate a recipe's text; `base_dir` (default: the working directory) is where its task
    entries' relative paths resolve (`load_recipe` passes the recipe file's folder)."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506  # a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RecipeError(f"{source}{line}: invalid YAML: {getattr(err, 'problem', err)}") from None
    return validate_recipe(data, source, base_dir, text)


def validate_recipe(data: Any, source: str, base_dir: Path | None = None, text: str = "") -> Recipe:
    """Validate a recipe already read (a YAML file's mapping, or the dict `temper.run` is given):
    the one validation, so both say the same; an error is at its line of `text` when there is one,
    else at `source` and the key path."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping with name, model and stages")
    try:
        return schema().model_validate(data, context={"base_dir": base_dir})
    except ValidationError as err:
        lines = [format_error(e, text, data, source) for e in expand_errors(err.errors())]
        raise RecipeError("invalid recipe:\n  " + "\n  ".join(lines)) from None


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        what = (
            "is a folder, not a recipe file"
            if path.is_dir()
            else "is a broken symbolic link (or a loop of links)"
            if path.is_symlink()
            else "does not exist"
        )
        raise RecipeError(f"recipe file {str(path)!r} {what}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # (a byte-order mark, which some editors write, is fine)
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise RecipeError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); is this a recipe file?"
        ) from None
    return parse_recipe(text, str(path), path.resolve().parent)


__all__ = [
    "BASE",
    "TASKS",
    "ModelSpec",
    "Recipe",
    "RecipeError",
    "expand_errors",
    "load_recipe",
    "parse_recipe",
    "schema",
    "validate_recipe",
]
