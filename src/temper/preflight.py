"""Plan-time checks of a recipe's external inputs, run before any stage (and by `--dry-run`).

What a schema cannot see is checked here, so that a mistake surfaces in a second instead of after
earlier stages have trained for hours: local model directories and data files exist and can be
read, every task configuration yields problems for each split a stage will draw from, and a hub
id that cannot be fetched (HF_HUB_OFFLINE=1 and not cached, or no network) is refused at once
instead of after a minute of retries. Every problem is reported together, each at its recipe
line and key path, in the form recipe validation uses.
"""

from __future__ import annotations

import json
import math
import os
import types
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from temper.catalog import make_recipe_task
from temper.data.formats import DataError
from temper.data.sources import check_source, count_rows, hub_endpoint, hub_reachable, locate
from temper.models.chat import TEMPLATES, ChatTemplateError, template_text
from temper.models.loading import ModelNotFoundError, check_local_model
from temper.recipe import Recipe, RecipeError, format_error
from temper.stages import registry
from temper.stages.base import Loc
from temper.stages.context import local_model, recipe_path

SAMPLE = 3  # problems drawn per (task, split): enough to find an empty split, cheap for any task


def check_inputs(recipe: Recipe, text: str, source: str, base_dir: Path) -> list[str]:
    """Raise `RecipeError` listing every input problem at its line; else return notes for the
    plan (e.g. which model will be fetched from the hub)."""
    errors: list[tuple[Loc, str]] = []
    notes: list[str] = []
    if recipe.model.path:
        note = _check_model(recipe.model.path, errors, base_dir)
        if note:
            notes.append(note)
        chats = [
            stage.name for stage in recipe.stages if registry.get(stage.kind).renders_chats(stage, base_dir)
        ]
        if chats and not errors and not recipe.model.chat_template:
            local = local_model(recipe.model.path, base_dir)
            if local is not None and _no_chat_template(str(local)):
                errors.append((("model", "path"), _no_template_message(recipe.model.path, chats)))
    if recipe.model.chat_template:  # a built-in name or a readable file, before any stage trains
        problem = _template_problem(recipe.model.chat_template, base_dir)
        errors += [(("model", "chat_template"), problem)] if problem else []
    for i, stage in enumerate(recipe.stages):
        for loc, spec in _files(stage):
            if earlier_output(spec, recipe, i, base_dir):
                continue  # an earlier stage of this recipe writes it (a constitutional stage's pairs.jsonl)
            problem = check_source(spec, base_dir)
            errors += [(("stages", i, *loc), problem)] if problem else []
        errors += [(("stages", i, *loc), msg) for loc, msg in _world_rules(stage) + _tracker_rules(stage)]
        notes += _epoch_notes(stage, base_dir)
        for loc, cache in registry.get(stage.kind).caches(stage):
            errors += [(("stages", i, *loc), msg) for msg in _check_cache(recipe_path(base_dir, cache))]
    errors += _check_splits(recipe, base_dir)
    if errors:
        lines = [
            format_error({"type": "located", "loc": loc, "msg": msg}, text, None, source)
            for loc, msg in errors
        ]
        raise RecipeError("inputs that cannot be used:\n  " + "\n  ".join(lines))
    return notes


def _check_model(name: str, errors: list[tuple[Loc, str]], base_dir: Path) -> str | None:
    """A local model directory (relative to the recipe's folder) must hold readable files; a hub
    id must be fetchable now. A folder found only relative to the working directory is refused,
    naming both places, rather than sent to the hub as an id."""
    local = local_model(name, base_dir)
    if local is not None:
        if not local.exists():
            what = (
                "is a broken symbolic link (or a loop of links)" if local.is_symlink() else "does not exist"
            )
            errors.append((("model", "path"), f"model directory {name!r} {what} (tried {local})"))
            return None
        try:
            check_local_model(str(local))  # exists, JSON files parse; weights are checked as they load
        except ModelNotFoundError as err:
            errors.append((("model", "path"), str(err)))
        return None
    here = Path(name).expanduser().resolve()
    if here.is_dir():
        errors.append(
            (
                ("model", "path"),
                f"{name!r} is not a folder relative to the recipe (tried {base_dir / name}), but {here} "
                "exists relative to the current directory: paths in a recipe are relative to the "
                "recipe's folder; write it relative to the recipe, or absolute",
            )
        )
        return None
    if _hub_cached(name):
        return f"model {name!r}: from the hub cache"
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        errors.append(
            (
                ("model", "path"),
                f"{name!r} is not a local directory and is not in the hub cache, and HF_HUB_OFFLINE is set",
            )
        )
    elif not hub_reachable():
        errors.append(
            (
                ("model", "path"),
                f"{name!r} is not a local directory and the hub ({hub_endpoint()}) cannot be reached",
            )
        )
    else:
        return f"model {name!r}: will be fetched from the hub"
    return None


def _hub_cached(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the hub library refuses (bad characters) is not cached
        return False


def earlier_output(spec: str, recipe: Recipe, index: int, base_dir: Path) -> Path | None:
    """The file `spec` names when it is an output of a stage before `index` in its run folder
    (`.../NN-<stage name>/<one of its kind's outputs>`), not yet written at plan time; else None."""
    path = recipe_path(base_dir, spec)
    for j, stage in enumerate(recipe.stages[:index]):
        if path.parent.name == f"{j + 1:02d}-{stage.name}" and path.name in registry.get(stage.kind).outputs:
            return path
    return None


def produced_files(recipe: Recipe, index: int, base_dir: Path) -> list[Path]:
    """The data files of stage `index` that earlier stages of the recipe wrote: their contents go
    into its settings hash, so it reruns when they change (a data file is otherwise read, not hashed)."""
    found = (earlier_output(spec, recipe, index, base_dir) for _, spec in _files(recipe.stages[index]))
    return [p for p in found if p is not None]


def _files(node: Any, loc: Loc = ()) -> list[tuple[Loc, str]]:
    """Every entry of a `files` or `*_files` list at any depth of a stage spec (`data.files`,
    `data.eval_files`, `corpus.files`): data sources, checked by `temper.data.sources`."""
    if not isinstance(node, BaseModel):
        return []
    out: list[tuple[Loc, str]] = []
    for key in type(node).model_fields:
        child = getattr(node, key)
        if (key == "files" or key.endswith("_files")) and isinstance(child, list):
            out += [((*loc, key, j), path) for j, path in enumerate(child) if isinstance(path, str)]
        elif isinstance(child, dict):  # named sub-specs (a corpus's mix sources)
            for name, sub in child.items():
                out += _files(sub, (*loc, key, name))
        else:
            out += _files(child, (*loc, key))
    return out


def _epoch_notes(stage: Any, base_dir: Path) -> list[str]:
    """The plan's bound on the steps `train.epochs` gives, from the rows its kind names
    (`StageKind.epoch_rows`): the stage counts them exactly once tokenized (packing, rows too long
    or skipped make fewer)."""
    train = getattr(stage, "train", None)
    rows_of = registry.get(stage.kind).epoch_rows
    if getattr(train, "epochs", None) is None or rows_of is None or (of := rows_of(stage)) is None:
        return []
    if of.pending:  # how many rows there are is known only then
        return [f"{stage.name}: {train.epochs:g} epochs; steps counted once {of.pending}"]
    rows = of.problems
    for spec in of.files:
        try:
            n = count_rows(locate(spec, base_dir))
        except DataError:  # reported by the source check above, or when the stage reads it
            return []
        if n is None:
            return [f"{stage.name}: {train.epochs:g} epochs; steps counted once {spec!r} is loaded"]
        rows += n
    steps = max(1, math.ceil(train.epochs * rows / train.batch_size))
    packed = "; packing makes fewer" if of.packed else ""
    return [
        f"{stage.name}: {train.epochs:g} epochs of {rows} rows at batch_size {train.batch_size} "
        f"= at most {steps} steps (exact once tokenized{packed})"
    ]


def _check_cache(path: Path) -> list[str]:
    """The cache is read if present, else filled: it must be a directory, under one that can be
    created and written."""
    if path.exists() and not path.is_dir():
        return [f"cache {str(path)!r} is a file, not a directory"]
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is None or not parent.is_dir():
        return [f"cache {str(path)!r} cannot be created: {parent} is not a directory"]
    if not path.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return [f"cache {str(path)!r} cannot be created: {parent} is not writable"]
    return []


def stage_splits(stage: Any, recipe: Recipe) -> list[tuple[str, str]]:
    """(task, split) pairs a stage draws problems from (`StageKind.splits`; by default the train
    split of each of its tasks)."""
    kind = registry.get(stage.kind)
    if kind.splits is not None:
        return kind.splits(stage, list(recipe.tasks))
    return [(t, "train") for t in kind.tasks(stage)]


def _check_splits(recipe: Recipe, base_dir: Path | None = None) -> list[tuple[Loc, str]]:
    """Each task configuration must yield problems for every split a stage uses: sample a few."""
    errors: list[tuple[Loc, str]] = []
    users: dict[tuple[str, str], list[str]] = {}
    for stage in recipe.stages:
        for pair in stage_splits(stage, recipe):
            users.setdefault(pair, []).append(stage.name)
    for (name, split), stages in users.items():
        if name not in recipe.tasks:
            continue  # already refused by the recipe's reference rules
        task = make_recipe_task(name, recipe.tasks[name] or {}, base_dir)
        try:
            found = task.sample(split, SAMPLE, 0)
        except Exception as err:  # a configuration whose split is empty raises in its sampler
            found, why = [], f" ({err})"
        else:
            why = ""
        if not found:
            errors.append(
                (
                    ("tasks", name),
                    f"task {name!r} yields no {split} problems{why}, which stage {', '.join(map(repr, stages))} uses",
                )
            )
    return errors


def check_stage_inputs(
    stage: Any,
    tasks_flag: str,
    task_options: dict[str, Any],
    models: list[str],
    chat_template: str | None = None,
) -> None:
    """`check_inputs` for a stand-alone stage command, before its --out is created: each input
    that cannot be used (a --model, a data file, a task split with no problems) at its flag.
    `chat_template`: the one given (--model.chat_template), so a model need not have its own."""
    cwd = Path.cwd()
    found: list[tuple[Loc, str]] = []
    if chat_template and (problem := _template_problem(chat_template, cwd)):
        found.append((("model", "chat_template"), problem))
    for name in models:
        _check_model(name, found, cwd)
        local = local_model(name, cwd)
        chats = not chat_template and registry.get(stage.kind).renders_chats(stage, cwd)
        if not found and chats and local is not None and _no_chat_template(str(local)):
            found.append((("model",), _no_template_message(name, [stage.kind])))
    errors = [f"--{'.'.join(map(str, loc))}: {msg}" for loc, msg in found]
    for loc, spec in _files(stage):
        problem = check_source(spec, cwd)
        errors += [f"{_flag(loc)}: {problem}"] if problem else []
    errors += [f"{_flag(loc)}: {msg}" for loc, msg in _world_rules(stage) + _tracker_rules(stage)]
    only = types.SimpleNamespace(stages=[stage], tasks=task_options)  # what _check_splits reads of a recipe
    errors += [f"{tasks_flag}: {msg}" for _, msg in _check_splits(only)]  # type: ignore[arg-type]
    if errors:
        raise RecipeError("inputs that cannot be used:\n  " + "\n  ".join(errors))


def _world_rules(stage: Any) -> list[tuple[Loc, str]]:
    """A launch of N processes (torchrun sets WORLD_SIZE) splits each batch evenly among them:
    the trainers refuse a batch that does not split, but only once the stage has started."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    train = getattr(stage, "train", None)
    if world <= 1 or train is None:
        return []
    out: list[tuple[Loc, str]] = []
    for name in ("batch_size", "prompts_per_step"):  # supervised, RL
        size = getattr(train, name, None)
        if isinstance(size, int) and size % world:
            out.append((("train", name), f"{size} is not divisible by the {world} processes of this launch"))
    micro = getattr(train, "micro_batch_size", 0)
    per_process = getattr(train, "batch_size", 0) // world
    if micro and per_process and not getattr(train, "batch_size", 0) % world and per_process % micro:
        out.append(
            (
                ("train", "micro_batch_size"),
                f"{micro} does not divide the per-process batch {per_process} (batch_size over {world} processes)",
            )
        )
    return out


def _flag(loc: Loc) -> str:
    """The stage command flag of a key path: ("data", "files", 0) -> --data.files."""
    return "--" + ".".join(str(k) for k in loc if not isinstance(k, int))


def _template_problem(value: str, base_dir: Path) -> str | None:
    """Why a `chat_template` option cannot be used (no such name or file, or Jinja that does not
    parse, which would otherwise surface as a traceback at the first rendered prompt), or None."""
    import jinja2
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        text = template_text(value, base_dir)
        # compiled as transformers compiles it: plain Jinja lacks its `{% generation %}` tag, which
        # the built-in `temper` template uses, and its loop controls
        _compile_jinja_template(text)
    except (ChatTemplateError, OSError, UnicodeDecodeError) as err:
        return str(err)
    except jinja2.TemplateSyntaxError as err:
        return (
            f"model.chat_template {value!r} is not a valid Jinja template: {err.message} (line {err.lineno})"
        )
    return None


def _no_chat_template(name: str) -> bool:
    """A local model folder whose tokenizer has no chat template (a hub id is not looked at)."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return False
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return False
    try:
        return "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError, TypeError):
        return False  # no readable tokenizer_config.json: loading it says what is wrong


def _no_template_message(name: str, stages: list[str]) -> str:
    """`require_chat_template`'s refusal, said at plan time, naming the stages that need one."""
    return (
        f"the tokenizer of {name!r} has no chat template; set model.chat_template (a Jinja file, or "
        f"one of {', '.join(TEMPLATES)}; on a stage command --model.chat_template) to say how "
        f"conversations are rendered, which stage {', '.join(map(repr, stages))} needs"
    )


def _tracker_rules(stage: Any) -> list[tuple[Loc, str]]:
    """A tracker that is not installed is refused now, not when its stage starts training."""
    names = getattr(getattr(stage, "train", None), "trackers", None) or []
    if not names:
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    return [
        (("train", "trackers", i), f"tracker {name!r} is not installed: pip install {name}")
        for i, name in enumerate(names)
        if name in LOGGER_TYPE_TO_CLASS
        and getattr(LOGGER_TYPE_TO_CLASS[name], "__module__", "").startswith("accelerate.")
        and name not in available
    ]
