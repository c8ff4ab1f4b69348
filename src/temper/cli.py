"""The `temper` command: run a recipe, or one stage on its own.

Stage subcommands take their flags from the same typed configs a recipe uses (one config per
entry point, as in cleanrl): `temper sft --train.lr 3e-4 --data.tasks arithmetic` sets the
fields `train.lr` and `data.tasks` of the SFT stage config.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from temper.recipe import EvalStage, ModelSpec, PretrainStage, RecipeError, RLStage, SFTStage, load_recipe


def _fields(cls: type) -> dict[str, tuple[Any, str]]:
    """name -> (annotation, help) for a pydantic model or a dataclass."""
    if issubclass(cls, BaseModel):
        return {n: (f.annotation, f.description or "") for n, f in cls.model_fields.items()}
    docs = {n: f.metadata.get("doc", "") for n, f in ((f.name, f) for f in dataclasses.fields(cls))}
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], docs[f.name]) for f in dataclasses.fields(cls)}


def _nested(annotation: Any) -> type | None:
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and (issubclass(arg, BaseModel) or dataclasses.is_dataclass(arg)):
            return arg
    return None


def _is_list(annotation: Any) -> bool:
    return any(
        typing.get_origin(a) in (list, tuple) for a in (typing.get_args(annotation) or ()) + (annotation,)
    )


def add_config_flags(
    parser: argparse.ArgumentParser, cls: type, prefix: str = "", skip: tuple[str, ...] = ()
) -> None:
    """One `--a.b` flag per leaf field of `cls`; lists take comma-separated values."""
    for name, (annotation, help_text) in _fields(cls).items():
        if name in skip:
            continue
        nested = _nested(annotation)
        if nested is not None and typing.get_origin(annotation) is not list:
            add_config_flags(parser, nested, f"{prefix}{name}.")
            continue
        parser.add_argument(
            f"--{prefix}{name}",
            dest=f"cfg:{prefix}{name}",
            default=argparse.SUPPRESS,
            metavar="LIST" if _is_list(annotation) else "VALUE",
            help=help_text.replace("%", "%%"),
        )


def config_from_args(args: argparse.Namespace, cls: type, fixed: dict[str, Any]) -> dict[str, Any]:
    """The nested dict of flags given (strings; the config's validation converts them)."""
    data: dict[str, Any] = dict(fixed)
    for key, value in vars(args).items():
        if not key.startswith("cfg:"):
            continue
        path = key[4:].split(".")
        node, owner = data, cls
        for part in path[:-1]:
            owner = _nested(_fields(owner)[part][0])
            node = node.setdefault(part, {})
        annotation = _fields(owner)[path[-1]][0]
        if _is_list(annotation):
            value = [v for v in value.split(",") if v]
        elif typing.get_origin(annotation) is dict:
            value = yaml.safe_load(value)  # e.g. --train.rewards '{outcome: 1, format: 0.1}'
        node[path[-1]] = value
    return data


def _validate(cls: type, data: dict[str, Any]) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        lines = [f"--{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors()]
        raise RecipeError("invalid options:\n  " + "\n  ".join(lines)) from None


def _task_options(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`--task-option arithmetic.max_digits=3` -> {"arithmetic": {"max_digits": 3}} (YAML-typed values)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        task, dot, option = key.partition(".")
        if not sep or not dot:
            raise RecipeError(f"--task-option {pair!r}: expected TASK.OPTION=VALUE")
        out.setdefault(task, {})[option] = yaml.safe_load(value)
    return out


def _context(out: Path, tasks: list[str], options: dict[str, dict[str, Any]]):
    from temper.stages.context import StageContext
    from temper.tasks import make_recipe_task

    names = list(dict.fromkeys(tasks + list(options)))
    task_options = {n: options.get(n, {}) for n in names}
    made = {n: make_recipe_task(n, task_options[n]) for n in names}
    return StageContext(run_dir=out, base_dir=Path.cwd(), tasks=made, task_options=task_options)


def cmd_run(args: argparse.Namespace) -> None:
    from temper.runner import plan, run_recipe

    recipe = load_recipe(args.recipe)
    base = Path(args.recipe).resolve().parent
    run_dir = Path(args.output_dir).resolve() if args.output_dir else recipe.run_dir(Path.cwd())
    if args.dry_run:
        print(f"recipe {recipe.name}: {len(recipe.stages)} stages into {run_dir}")
        print("\n".join(plan(recipe, run_dir)))
        return
    run_recipe(recipe, base, run_dir, Path(args.recipe).read_text())


def cmd_pretrain(args: argparse.Namespace) -> None:
    from temper.stages.pretrain import run_pretrain

    stage = _validate(PretrainStage, config_from_args(args, PretrainStage, {"kind": "pretrain"}))
    spec = _validate(
        ModelSpec,
        {
            k: v
            for k, v in {"preset": args.preset, "path": args.path, "seed": args.seed}.items()
            if v is not None
        },
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(run_pretrain(stage, spec, _context(out, stage.corpus.tasks, _task_options(args.task_option)), out))


def cmd_sft(args: argparse.Namespace) -> None:
    from temper.stages.sft import run_sft

    stage = _validate(SFTStage, config_from_args(args, SFTStage, {"kind": "sft"}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(run_sft(stage, _context(out, stage.data.tasks, _task_options(args.task_option)), args.model, out))


def cmd_rl(args: argparse.Namespace) -> None:
    from temper.stages.rl import run_rl

    stage = _validate(RLStage, config_from_args(args, RLStage, {"kind": "rl"}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(run_rl(stage, _context(out, stage.tasks, _task_options(args.task_option)), args.model, out))


def cmd_eval(args: argparse.Namespace) -> None:
    from temper.stages.evaluation import eval_table, run_eval

    stage = _validate(EvalStage, config_from_args(args, EvalStage, {"kind": "eval"}))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = _context(out, stage.tasks, _task_options(args.task_option))
    for path in args.model:
        ctx.models[model_label(path, ctx.models)] = path
    print(eval_table(run_eval(stage, ctx, out)))


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

    print(write_report(Path(args.run_dir)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temper", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a recipe's stages in order (skipping complete ones)")
    p.add_argument("recipe")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--output-dir", help="run folder (default: the recipe's output_dir or runs/<name>)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("pretrain", help="pre-train a preset (or continue a model) on a corpus")
    p.add_argument("--preset", help="built-in preset: nano, tiny, small")
    p.add_argument("--path", help="a model directory or hub id to continue pre-training")
    p.add_argument("--seed", type=int, help="initialization seed of a preset")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--task-option", action="append", default=[], metavar="TASK.OPTION=VALUE")
    add_config_flags(p, PretrainStage, skip=("kind", "name"))
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser("sft", help="supervised fine-tuning on task demonstrations and/or JSONL files")
    p.add_argument("--model", required=True, help="model directory or hub id to fine-tune")
    p.add_argument("--out", required=True)
    p.add_argument("--task-option", action="append", default=[], metavar="TASK.OPTION=VALUE")
    add_config_flags(p, SFTStage, skip=("kind", "name", "source"))
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("rl", help="RL with verifiable rewards (GRPO family, PPO) on task prompts")
    p.add_argument("--model", required=True, help="model directory or hub id to train")
    p.add_argument("--out", required=True)
    p.add_argument("--task-option", action="append", default=[], metavar="TASK.OPTION=VALUE")
    add_config_flags(p, RLStage, skip=("kind", "name", "source"))
    p.set_defaults(func=cmd_rl)

    p = sub.add_parser("eval", help="evaluate models on task splits (accuracy, pass@k, parse rate, CIs)")
    p.add_argument(
        "--model", required=True, action="append", help="model directory or hub id (repeat to compare)"
    )
    p.add_argument("--out", required=True)
    p.add_argument("--task-option", action="append", default=[], metavar="TASK.OPTION=VALUE")
    add_config_flags(p, EvalStage, skip=("kind", "name", "models"))
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("report", help="(re)write report.html for a run folder")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from temper.data import DataError
    from temper.models import ModelNotFoundError
    from temper.stages.rl import GateError

    try:
        args.func(args)
    except (RecipeError, ModelNotFoundError, DataError, FileNotFoundError, GateError, ImportError) as err:
        print(f"temper: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
