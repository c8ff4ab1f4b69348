"""The `temper` command: run a recipe, or one stage on its own.

Stage subcommands, one per registered stage kind, take their flags from the same typed configs a
recipe uses (one config per entry point, as in cleanrl): `temper sft --train.lr 3e-4 --data.tasks
arithmetic` sets the fields `train.lr` and `data.tasks` of the SFT stage config, and `--help`
shows each field's docstring and default.

Why our own generator rather than tyro, jsonargparse or pydantic-settings' CLI: the flags keep the
syntax the README and recipes use (comma lists `--splits test,ood`, YAML values
`--train.rewards '{outcome: 1, format: 0.1}'`), which each of those spells differently (tyro:
space-separated lists and key-value pairs, jsonargparse: `[a,b]`, pydantic-settings: JSON), and
every value goes through the same pydantic validation as a recipe, with the same messages.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import functools
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from temper.atomic import atomic_write_json, remove_stale
from temper.recipe import ModelSpec, RecipeError, describe_error, expand_errors, load_recipe
from temper.stages import registry
from temper.stages.base import StageError, StageKind, StageRun
from temper.stages.context import settings_hash
from temper.train import pipeline_fit

REQUIRED = object()


def config_fields(cls: type) -> dict[str, tuple[Any, str, Any]]:
    """name -> (annotation, docstring, default or REQUIRED) for a pydantic model or a dataclass (its
    flags here, and the generated recipe reference, tools/recipe_reference.py)."""
    if issubclass(cls, BaseModel):
        return {
            n: (
                f.annotation,
                f.description or "",
                REQUIRED if f.is_required() else f.get_default(call_default_factory=True),
            )
            for n, f in cls.model_fields.items()
        }
    docs = _dataclass_docs(cls)
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else f.default_factory()
            if f.default_factory is not dataclasses.MISSING
            else REQUIRED
        )
        out[f.name] = (hints[f.name], docs.get(f.name, ""), default)
    return out


@functools.cache
def _dataclass_docs(cls: type) -> dict[str, str]:
    """A dataclass's attribute docstrings, as pydantic reads them (`use_attribute_docstrings`)."""
    properties = TypeAdapter(cls).json_schema().get("properties", {})
    return {name: p.get("description", "") for name, p in properties.items()}


def _nested(annotation: Any) -> type | None:
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and (issubclass(arg, BaseModel) or dataclasses.is_dataclass(arg)):
            return arg
    return None


def _is_list(annotation: Any) -> bool:
    return any(
        typing.get_origin(a) in (list, tuple) for a in (typing.get_args(annotation) or ()) + (annotation,)
    )


def _union_with_str(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and str in typing.get_args(
        annotation
    )


def _is_dict(annotation: Any) -> bool:
    return any(typing.get_origin(a) is dict for a in (annotation, *typing.get_args(annotation)))


def _choices(annotation: Any) -> list[Any]:
    """The values of a `Literal` (also inside `X | None` or `list[...]`)."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [c for a in typing.get_args(annotation) for c in _choices(a)]


def _metavar(annotation: Any) -> str:
    choices = _choices(annotation)
    if choices:
        one = "{" + ",".join(map(str, choices)) + "}"
        return f"{one}[,...]" if _is_list(annotation) else one
    if _is_list(annotation):
        return "LIST"
    if _is_dict(annotation):
        return "YAML"
    names = {getattr(a, "__name__", "") for a in (annotation, *typing.get_args(annotation))}
    return next((n.upper() for n in ("bool", "int", "float") if n in names), "VALUE")


def _shown(value: Any) -> str:
    """A default as it would be typed on the command line."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "empty"
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value).lower() if value is None or isinstance(value, bool) else str(value)


def add_config_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    prefix: str = "",
    skip: tuple[str, ...] = (),
    group: str = "cfg",
) -> None:
    """One `--a.b` flag per leaf field of `cls`, its help the field's docstring and default; lists
    take comma-separated values, dicts a YAML mapping."""
    for name, (annotation, doc, default) in config_fields(cls).items():
        if name in skip:
            continue
        nested = _nested(annotation)
        if nested is not None and typing.get_origin(annotation) is not list:
            add_config_flags(parser, nested, f"{prefix}{name}.", group=group)
            continue
        said = "required" if default is REQUIRED else f"default: {_shown(default)}"
        parser.add_argument(
            f"--{prefix}{name}",
            dest=f"{group}:{prefix}{name}",
            default=argparse.SUPPRESS,
            metavar=_metavar(annotation),
            help=f"{' '.join(doc.split())} ({said})".lstrip().replace("%", "%%"),
        )


def config_from_args(
    args: argparse.Namespace, cls: type, fixed: dict[str, Any], group: str = "cfg"
) -> dict[str, Any]:
    """The nested dict of flags given (strings; the config's validation converts them)."""
    data: dict[str, Any] = dict(fixed)
    for key, value in vars(args).items():
        if not key.startswith(f"{group}:"):
            continue
        path = key[len(group) + 1 :].split(".")
        node, owner = data, cls
        for part in path[:-1]:
            owner = _nested(config_fields(owner)[part][0])
            node = node.setdefault(part, {})
        annotation = config_fields(owner)[path[-1]][0]
        if _is_dict(annotation) and value.lstrip().startswith("{"):
            value = _yaml_value(f"--{key[len(group) + 1 :]}", value)  # --train.rewards '{outcome: 1}'
        elif _is_list(annotation) and value.lstrip().startswith("["):  # --train.path.rules '[{...}]'
            value = _yaml_value(f"--{key[len(group) + 1 :]}", value)
        elif _is_list(annotation) and not (_union_with_str(annotation) and "," not in value):
            value = [v for v in value.split(",") if v]  # (`str | list[str]` keeps a single value a str)
        node[path[-1]] = value
    return data


def _yaml_value(flag: str, value: str) -> Any:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as err:
        raise RecipeError(f"{flag} {value!r}: invalid YAML: {getattr(err, 'problem', err)}") from None


def _validate(cls: type, data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        flags = " / ".join(f"--{name}" for name in cls.model_fields if name != "kind")
        lines = [
            f"{'--' + '.'.join(str(x) for x in e['loc']) if e['loc'] else flags}: {describe_error(e)}"
            for e in expand_errors(err.errors())
        ]
        raise RecipeError("invalid options:\n  " + "\n  ".join(lines)) from None


def _task_options(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`--task-option arithmetic.max_digits=3` -> {"arithmetic": {"max_digits": 3}} (YAML-typed values)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        task, dot, option = key.partition(".")
        if not sep or not dot:
            raise RecipeError(f"--task-option {pair!r}: expected TASK.OPTION=VALUE")
        parsed = _yaml_value(f"--task-option {key}", value)
        if isinstance(parsed, dict) and not value.lstrip().startswith("{"):
            parsed = value  # `format=Answer: (.+)` is text; a mapping is written {a: 1}
        out.setdefault(task, {})[option] = parsed
    return out


def _data_task(args: argparse.Namespace) -> tuple[str, dict[str, Any]] | None:
    """`--task-data FILE [--reward SPEC ...] [--prompt-column COL]` as a recipe's dataset task
    entry, named after the file (or hub id); None without --task-data."""
    source = getattr(args, "task_data", None)
    if not source:
        if getattr(args, "reward", None) or getattr(args, "prompt_column", None):
            raise RecipeError(
                "--reward and --prompt-column describe a --task-data task: give --task-data too"
            )
        return None
    name = Path(source.rstrip("/")).name.split(".")[0] or "data"
    options: dict[str, Any] = {"task": "dataset", "data": source}
    if args.reward:
        options["rewards"] = list(args.reward)
    if args.prompt_column:
        options["prompt"] = args.prompt_column
    return name, options


def _context(out: Path, tasks: list[str], options: dict[str, dict[str, Any]], tasks_flag: str):
    from temper.catalog import make_recipe_task
    from temper.stages.context import StageContext
    from temper.tasks import TaskOptionError

    names = list(dict.fromkeys(tasks + list(options)))
    task_options = {n: options.get(n, {}) for n in names}
    made = {}
    for n in names:
        try:
            made[n] = make_recipe_task(n, task_options[n], Path.cwd())
        except TaskOptionError as err:  # an unknown column or reward function: a usage error, no traceback
            raise RecipeError(f"task {n!r}: {'.'.join(map(str, err.option))}: {err}") from None
        except ValueError as err:  # an unknown task or option, an option out of range
            raise RecipeError(f"{'--task-option' if options.get(n) else tasks_flag} {n}: {err}") from None
    return StageContext(run_dir=out, base_dir=Path.cwd(), tasks=made, task_options=task_options)


def _tasks_flag(stage: Any) -> str:
    """The flag naming a stage's tasks (`--tasks` of rl and eval, `--data.tasks`, `--corpus.tasks`)."""
    return next(
        (f"--{path}" for path in ("tasks", "data.tasks", "corpus.tasks") if _has(stage, path)), "--tasks"
    )


def _has(obj: Any, path: str) -> bool:
    for part in path.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


LOCK = ".temper.lock"


def _lock(folder: Path) -> int | None:
    """Hold `folder/.temper.lock` for as long as this process writes the folder (rank 0 of a
    launch): a second temper process aimed at the same folder would remove the first one's
    scratch files and write its checkpoints over them, so it is refused instead. The lock is
    the kernel's (`flock`), so a killed process never leaves it held. Returns the descriptor
    to close when done."""
    if os.environ.get("RANK", "0") != "0":
        return None
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StageError(
            f"another temper process is writing {folder} (it holds {folder / LOCK}); "
            "wait for it to finish, or choose another output folder"
        ) from None
    return fd


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _unused(folder: Path, created: bool) -> None:
    """Remove a folder this command created when a refusal left nothing in it but
    markers (a stage's `stage.started.json`, a run's copy of its recipe): a refused plan leaves
    no folder behind."""
    if not created or not folder.is_dir() or os.environ.get("RANK", "0") != "0":
        return
    if all(
        p.name in ("stage.started.json", "recipe.yaml", LOCK) for p in folder.rglob("*") if not p.is_dir()
    ):
        shutil.rmtree(folder, ignore_errors=True)


def cmd_run(args: argparse.Namespace) -> None:
    recipe = load_recipe(args.recipe)
    base = Path(args.recipe).resolve().parent
    run_dir = Path(args.output_dir).resolve() if args.output_dir else recipe.run_dir(Path.cwd(), base)
    args.run_folder = run_dir  # where main() looks for the checkpoint to resume from after Ctrl-C
    text = Path(args.recipe).read_text(encoding="utf-8-sig")
    said = run_checked(recipe, text, args.recipe, base, run_dir, args.dry_run)
    if args.dry_run:
        print("\n".join(said))


def run_checked(
    recipe: Any, text: str, source: str, base: Path, run_dir: Path, dry_run: bool = False
) -> list[str]:
    """What `temper run` does with a validated recipe, and `temper.run` with a dict: the plan-time
    checks of its inputs, the refusal of another recipe's run folder, then the plan (`dry_run`)
    or the run, holding the folder's lock. Returns the plan's lines (and notes) for a dry run,
    else nothing. `text` is the recipe as written (error lines; the run folder's recipe.yaml)."""
    from temper.preflight import check_inputs
    from temper.runner import plan, run_recipe

    notes = check_inputs(recipe, text, source, base)  # before any stage: missing inputs, empty splits
    _not_another_run(run_dir, recipe.name)
    if dry_run:
        return [
            f"recipe {recipe.name}: {len(recipe.stages)} stages into {run_dir}",
            *plan(recipe, run_dir),
            *notes,
        ]
    from temper import distributed

    created = not run_dir.exists()

    def take() -> int | None:
        run_dir.mkdir(parents=True, exist_ok=True)
        return _lock(run_dir)

    # on the main process; a refusal there (another process holds the folder) stops every process
    fd = distributed.on_main(take)
    lock = fd if distributed.is_main() else None  # (the others received the main process's number)
    try:
        run_recipe(recipe, base, run_dir, text)
    except Exception:  # a refusal; an interrupted folder stays, to resume
        _unused(run_dir, created)
        raise
    finally:
        _unlock(lock)
    return []


def _not_another_run(run_dir: Path, name: str) -> None:
    """Refuse a run folder that holds another recipe's run: the runner replaces each stage folder
    whose settings differ, so it would delete that run's results one stage at a time."""
    try:
        found = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError, yaml.YAMLError):
        return  # no run there (or not one temper wrote)
    other = found.get("name") if isinstance(found, dict) else None
    if isinstance(other, str) and other != name:
        raise RecipeError(
            f"{run_dir} holds the run of recipe {other!r} (see its recipe.yaml), not of {name!r}; "
            "running here would replace its stage folders: choose another --output-dir (or remove that folder)"
        )


def cmd_stage(kind: StageKind, args: argparse.Namespace) -> None:
    """One stage on its own, into --out: from --model (or, for a "base" stage, --preset/--path).

    Guarded by the markers `temper run` writes (`temper.stages.markers`): the same settings into a
    complete folder do nothing, other settings into a started or complete one are refused (naming
    the changed keys) unless --overwrite, and the same settings into an unfinished one resume."""
    from temper import distributed  # under torchrun: main-only stages run once, output printed once
    from temper.catalog import task_fingerprints
    from temper.preflight import check_stage_inputs
    from temper.stages.markers import COMPLETE, STARTED, as_json, read_marker, stage_settings

    options = _task_options(args.task_option)
    fixed: dict[str, Any] = {"kind": kind.name}
    if data_task := _data_task(args):
        name, entry = data_task
        options[name] = entry | options.get(name, {})
        if "tasks" in kind.spec.model_fields and "cfg:tasks" not in vars(args):
            fixed["tasks"] = [name]  # the stage's tasks default to the data task
        if "splits" in kind.spec.model_fields and "cfg:splits" not in vars(args):
            fixed["splits"] = ["test"] + (["ood"] if "ood_data" in options[name] else [])  # what it has
    stage = _validate(kind.spec, config_from_args(args, kind.spec, fixed))
    model = None
    if kind.reads == "base":
        model = _validate(ModelSpec, config_from_args(args, ModelSpec, {}, group="model"))
    if not args.out.strip():  # Path("") is the current folder: never write a stage into it unasked
        raise RecipeError("--out is empty: name the stage's output folder (e.g. --out runs/sft)")
    out = Path(args.out)
    tasks_flag = _tasks_flag(stage)
    ctx = _context(out, kind.tasks(stage), options, tasks_flag)
    ctx.chat = _chat_options(args)
    if kind.reads == "base":
        sources = [model.path] if model.path else []
    else:
        sources = [args.model] if kind.reads == "model" else args.model
    template = ctx.chat.chat_template if kind.reads != "base" else model.chat_template
    check_stage_inputs(stage, tasks_flag, ctx.task_options, sources, chat_template=template)
    settings = {
        **stage_settings(stage),
        "input": _stage_input(kind, args, model),
        "task_options": ctx.task_options,
    } | ({"chat": ctx.chat.hashed(ctx.base_dir)} if ctx.chat else {})
    if fingerprints := task_fingerprints(ctx.tasks):
        settings["task_fingerprints"] = fingerprints  # data tasks: their rows and reward code
    settings = as_json(settings)
    digest = settings_hash(stage.kind, settings)
    started, complete = read_marker(out / STARTED), read_marker(out / COMPLETE)
    ours = [m for m in (started, complete) if m is not None]
    if ours and not args.overwrite:
        if all(m.get("hash") == digest for m in ours) and complete is not None:
            if distributed.is_main():
                print(f"temper {kind.name}: complete, nothing to do ({out})", file=sys.stderr)
                if kind.summary:
                    print(kind.summary(out))
            return
        if any(m.get("hash") != digest for m in ours):
            raise StageError(_other_settings(kind.name, out, started, settings))
    created = not out.exists()

    def prepare() -> int | None:  # on the main process; a refusal there stops every process
        out.mkdir(parents=True, exist_ok=True)
        fd = _lock(out)
        if ours and args.overwrite:  # its checkpoints were trained with other settings: never resume them
            for p in out.iterdir():
                if p.name != LOCK:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        remove_stale(out)  # what a killed run left half-written (temp model, partial checkpoints)
        atomic_write_json(out / STARTED, {"hash": digest, "settings": settings})
        return fd

    fd = distributed.on_main(prepare)
    lock = fd if distributed.is_main() else None  # (the others received the main process's number)
    try:
        _run_stage(kind, stage, args, ctx, out, model, digest, created)
    finally:
        _unlock(lock)


def _run_stage(
    kind: StageKind,
    stage: Any,
    args: argparse.Namespace,
    ctx: Any,
    out: Path,
    model: Any,
    digest: str,
    created: bool,
) -> None:
    from temper import distributed
    from temper.stages.markers import COMPLETE

    distributed.wait()
    if kind.reads == "models":
        for path in args.model:
            ctx.models[model_label(path, ctx.models)] = path

    start = time.perf_counter()
    source = args.model if kind.reads == "model" else None
    job = StageRun(ctx, out, model, source)
    try:
        result = distributed.on_main(kind.run, stage, job) if kind.main_only else kind.run(stage, job)
    except Exception:  # a refusal; an interrupted folder stays, to resume
        _unused(out, created)
        raise
    if distributed.is_main():
        atomic_write_json(
            out / COMPLETE, {"hash": digest, "kind": kind.name, "seconds": time.perf_counter() - start}
        )
        print(kind.summary(out) if kind.summary else result)


def _stage_input(kind: StageKind, args: argparse.Namespace, model: Any) -> Any:
    """What a stage command starts from, as its settings hash covers it: the recipe model of a
    "base" stage; else each --model as given (a hub id) or, for a local folder, its absolute path
    and the hash of the stage that wrote it (so retraining that stage makes this one stale)."""
    from temper.stages.markers import COMPLETE, read_hash

    if kind.reads == "base":
        return model.weights()

    def one(ref: str) -> Any:
        p = Path(ref).expanduser()
        if not p.exists():
            return ref  # a hub id
        found = [read_hash(d / COMPLETE) for d in (p, p.parent) if (d / COMPLETE).exists()]
        return {"path": str(p.resolve()), "stage_hash": found[0] if found else None}

    return one(args.model) if kind.reads == "model" else [one(m) for m in args.model]


def _chat_options(args: argparse.Namespace) -> Any:
    """--model.chat_template / --model.eos_token of a stage command that reads models."""
    from temper.models.chat import ChatOptions

    return ChatOptions(getattr(args, "chat_template", None), getattr(args, "eos_token", None))


def _other_settings(name: str, out: Path, started: dict[str, Any] | None, settings: dict[str, Any]) -> str:
    from temper.stages.markers import changed_keys

    before = (started or {}).get("settings")
    if started is not None and not isinstance(before, dict):
        # `temper run` records only a hash, over the recipe's inputs (the hashes of the stages
        # before it), which a stage command cannot recompute: say what the folder is instead
        recipe = out.resolve().parent / "recipe.yaml"
        run = (
            f"stage folder of the run {out.resolve().parent}; to resume or redo it, rerun "
            f"`temper run {recipe} --output-dir {out.resolve().parent}`"
            if recipe.exists()
            else "stage folder written by `temper run`; to resume or redo it, rerun that recipe"
        )
        return f"{out} is a {run}. To train this {name} stage on its own, choose another --out (or pass --overwrite to replace the folder)"
    what = "; ".join(changed_keys(before, settings)) if isinstance(before, dict) else ""
    return (
        f"{out} holds a {name} stage started with other settings"
        + (f" ({what})" if what else "")
        + "; pass --overwrite to replace it, or choose another --out"
    )


def model_label(path: str, taken: dict[str, Any]) -> str:
    """A short, unique table label: `runs/x/02-sft/model` -> `02-sft`, a hub id stays as it is."""
    p = Path(path)
    label = (p.parent.name if p.name == "model" else p.name) if p.exists() else path
    unique, i = label, 2
    while unique in taken:
        unique, i = f"{label}#{i}", i + 1
    return unique


def cmd_report(args: argparse.Namespace) -> None:
    from temper.report import write_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        what = "is a file, not a run folder" if run_dir.exists() else "does not exist"
        raise StageError(f"run folder {str(run_dir)!r} {what}")
    if not any(p.is_dir() and re.match(r"\d+-", p.name) for p in run_dir.iterdir()):
        raise StageError(
            f"{run_dir} holds no stage folders (NN-name, as `temper run` writes them): "
            "give the run folder, e.g. runs/<recipe name>"
        )
    print(write_report(run_dir))


def cmd_gateway(args: argparse.Namespace) -> None:
    """Serve a saved model as an OpenAI-compatible endpoint on 127.0.0.1 until Ctrl-C."""
    from temper.gateway.serving import serve

    with serve(args.model, port=args.port, max_new_tokens=args.max_new_tokens, seed=args.seed) as gw:
        print(f"serving {args.model} at {gw.base_url()} (OPENAI_BASE_URL); Ctrl-C stops", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print(f"stopped; {gw.recorder.new_segments} call(s) started a new segment", flush=True)


def add_stage_command(sub: Any, kind: StageKind) -> None:
    p = sub.add_parser(kind.name, help=kind.help, description=kind.help)
    if kind.reads == "base":  # --preset, --path, --seed (pretraining renders no chats)
        add_config_flags(p, ModelSpec, group="model", skip=("chat_template", "eos_token"))
    elif kind.reads == "model":
        p.add_argument("--model", required=True, help="model directory or hub id to start from")
    else:
        p.add_argument(
            "--model", required=True, action="append", help="model directory or hub id (repeat to compare)"
        )
    for name in ("chat_template", "eos_token") if kind.reads != "base" else ():
        doc = " ".join((ModelSpec.model_fields[name].description or "").split())
        p.add_argument(
            f"--model.{name}", dest=name, metavar="VALUE", help=f"{doc} (default: the tokenizer's)"
        )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace what --out holds from a run with other settings (default: refuse)",
    )
    p.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="TASK.OPTION=VALUE",
        help="set an option of a task, as in a recipe's task entry (repeatable)",
    )
    data = p.add_argument_group(
        "a task from your data (a recipe's `task: dataset` entry, named after the file; more options "
        "with --task-option NAME.OPTION=VALUE, e.g. NAME.answer=label, NAME.format='Answer: (.+)$')"
    )
    data.add_argument(
        "--task-data",
        metavar="SOURCE",
        help="JSONL, JSON or parquet file, save_to_disk folder or hub id whose rows are the problems; "
        "the stage's tasks default to it",
    )
    data.add_argument(
        "--reward",
        action="append",
        metavar="SPEC",
        help="reward function, repeatable: module:function or file.py:function (TRL's signature, "
        "importable from the working directory) or a built-in grader: exact_match, numeric_match, "
        "math_verify, regex (default: exact_match against the `answer` column)",
    )
    data.add_argument("--prompt-column", metavar="COL", help="column holding the prompt (default: prompt)")
    chosen_by_flags = {"base": (), "model": ("source",), "models": ("models",)}[kind.reads]
    add_config_flags(p, kind.spec, skip=("kind", "name", *chosen_by_flags))
    p.set_defaults(func=functools.partial(cmd_stage, kind))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temper", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a recipe's stages in order (skipping complete ones)")
    p.add_argument("recipe")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--output-dir", help="run folder (default: the recipe's output_dir or runs/<name>)")
    p.set_defaults(func=cmd_run)

    for kind in registry.kinds().values():
        add_stage_command(sub, kind)

    p = sub.add_parser("report", help="(re)write report.html for a run folder")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "gateway", help="serve a saved model as OpenAI-compatible /v1/chat/completions on 127.0.0.1"
    )
    p.add_argument("--model", required=True, help="a model folder (save_model's, a stage's model/)")
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: a free one)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="default max_tokens of a call")
    p.add_argument("--seed", type=int, default=0, help="seed of the first unseeded call")
    p.set_defaults(func=cmd_gateway)

    p = sub.add_parser("simulate", help=pipeline_fit.HELP, description=pipeline_fit.HELP)
    pipeline_fit.add_arguments(p)
    p.set_defaults(func=pipeline_fit.cmd_simulate)
    return parser


_FILE_ERRORS = {  # errno -> (what happened to the path, the hint)
    errno.ENOSPC: ("the disk is full while writing", "free space on that disk, then rerun the same command"),
    errno.EDQUOT: ("the disk quota is exceeded while writing", "free space, then rerun the same command"),
    errno.EACCES: ("permission denied", "choose a folder you can write (e.g. --out) or fix its permissions"),
    errno.EPERM: (
        "operation not permitted",
        "choose a folder you can write (e.g. --out) or fix its permissions",
    ),
    errno.EROFS: ("read-only file system", "choose a folder on a writable disk"),
    errno.EEXIST: ("is a file where a folder is needed", "--out and the run folder must name folders"),
    errno.ENOTDIR: ("is a file where a folder is needed", "--out and the run folder must name folders"),
    errno.EISDIR: ("is a folder where a file is needed", None),
    errno.ENOENT: ("no such file or directory", None),
}


def _expected(err: BaseException, out: Path | None = None) -> tuple[str, str | None] | None:
    """(one-line message, hint) for an error the user can act on; None for a bug. `out` is the
    output folder, named when a full disk's error does not say what was being written."""
    from temper.data import DataError
    from temper.guard import UserCodeError
    from temper.models import ChatTemplateError, ModelNotFoundError
    from temper.precision import PrecisionRecordError
    from temper.train.checkpoint import CheckpointError

    if isinstance(err, UserCodeError):  # user code failed (a reward function, an env...): one line, a hint
        return str(err), err.hint

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) and err.filename is None:
        what, hint = _FILE_ERRORS[err.errno]
        return f"{what} {'under ' + str(out) if out else 'output'}", hint
    if isinstance(err, OSError) and err.errno in _FILE_ERRORS and err.filename is not None:
        what, hint = _FILE_ERRORS[err.errno]
        path = err.filename
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{what} {path}", hint
        if err.errno in (errno.EEXIST, errno.ENOTDIR):
            file = _the_file_in(path)
            return (f"{file} {what}", hint) if file else (f"{path} already exists", None)
        if err.errno == errno.EISDIR:
            return f"{path} {what}", hint
        return f"{what}: {path}", hint
    if isinstance(
        err,
        RecipeError
        | ModelNotFoundError
        | ChatTemplateError
        | DataError
        | StageError
        | CheckpointError
        | PrecisionRecordError
        | FileNotFoundError
        | ImportError,
    ):
        return str(err), None
    return None


def _the_file_in(path: str) -> str | None:
    """EEXIST/ENOTDIR name the folder being made; this names the file in its way, if one is."""
    for p in [Path(path), *Path(path).parents]:
        if p.exists() and not p.is_dir():
            return str(p)
    return None


def _resume_point(args: argparse.Namespace) -> str:
    """The text ' from step N (its checkpoint)' when the interrupted stage's folder has one."""
    from temper.train.checkpoint import list_checkpoints

    out = getattr(args, "out", None)
    folders = [Path(out)] if out else []
    run_dir = getattr(args, "run_folder", None)
    if run_dir is not None and Path(run_dir).is_dir():  # `temper run`: the stage that was running
        folders = [
            d
            for d in sorted(Path(run_dir).iterdir())
            if (d / "stage.started.json").exists() and not (d / "stage.json").exists()
        ]
    for folder in reversed(folders):
        if found := list_checkpoints(folder / "checkpoints"):
            try:
                step = json.loads((found[-1] / "state.json").read_text())["step"]
            except (OSError, ValueError, KeyError):  # the hint must not turn Ctrl-C into a traceback
                return ""
            return f" from step {step} ({found[-1]})"
    return ""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a scheduler ending a job), handled as Ctrl-C is: scratch removed, one line."""


_GRACE = 5.0  # seconds after a first Ctrl-C or SIGTERM during which another one is ignored
_first_signal: list[float] = []


def _on_signal(signum: int, frame: Any) -> None:
    """Ctrl-C and SIGTERM end the command as an exception, so that half-written folders are
    removed on the way out. A second one soon after the first (an impatient user, or the copy
    torchrun forwards to its workers right after the terminal's) is ignored: it would cut that
    clean-up short, or land in the error handler and print a traceback. Later ones interrupt
    again, so a command that does not stop can still be stopped."""
    now = time.monotonic()
    if _first_signal and now - _first_signal[0] < _GRACE:
        return
    _first_signal[:] = [now]
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """The `temper` command. Errors the user can act on (a bad recipe or input, a model that cannot
    be read, a full disk, a permission, Ctrl-C) end in one line and a hint, exit 2 (130 for
    Ctrl-C, 143 for SIGTERM, as a shell does); anything else is a bug and keeps its traceback.
    TEMPER_DEBUG=1 prints the traceback of every error."""
    args = build_parser().parse_args(argv)
    debug = os.environ.get("TEMPER_DEBUG", "") not in ("", "0")
    # under torchrun every process gets the Ctrl-C and meets the same refusals: rank 0 says so
    first = os.environ.get("RANK", "0") == "0"
    on_term = threading.current_thread() is threading.main_thread()  # (signals go to the main thread)
    before = signal.signal(signal.SIGTERM, _on_signal) if on_term else None
    before_int = signal.getsignal(signal.SIGINT)
    if on_term and before_int is signal.default_int_handler:  # (not if a caller installed its own)
        signal.signal(signal.SIGINT, _on_signal)
    _first_signal.clear()
    try:
        args.func(args)
    except KeyboardInterrupt as err:
        if debug:
            traceback.print_exc()
        if first:
            what = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
            print(f"temper: {what}; rerun the same command to resume{_resume_point(args)}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(err, Terminated) else 130
    except Exception as err:
        out = getattr(args, "out", None) or getattr(args, "run_folder", None)
        said = _expected(err, Path(out) if out else None)
        if said is None:
            raise
        if debug:
            traceback.print_exc()
        message, hint = said
        # a refusal of the recipe, flags, data or model is the same on every process of a
        # launch: rank 0 says it; a file error may be one process's own, so each says its own
        if first or isinstance(err, OSError):
            print(f"temper: error: {message}", file=sys.stderr)
            if hint:
                print(f"temper: hint: {hint}", file=sys.stderr)
        return 2
    finally:
        if on_term:
            signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
            if before_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, before_int)
        if "torch.distributed" in sys.modules:  # under torchrun: leave the process group before exit
            from temper import distributed

            distributed.shutdown()
        # the MCP servers the command's tasks started (cached per config while it runs) end with
        # it, not at interpreter exit: a caller of `main` in-process is not left with their
        # processes and threads (tests/conftest.py fails a module that is)
        from temper.envs.multi_tool import close_connections

        close_connections()
    return 0


if __name__ == "__main__":
    sys.exit(main())
