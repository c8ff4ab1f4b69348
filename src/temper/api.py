"""temper in Python: the recipe, one function per stage kind, and what `temper run` runs.

    import temper

    def correct(completions, answer, **kwargs):            # a TRL reward function, unchanged
        return [1.0 if c.endswith(f"Answer: {a}") else 0.0 for c, a in zip(completions, answer)]

    sft = temper.sft("my-model", rows, max_steps=100)                   # rows: prompt, completion, answer
    rl = temper.grpo(sft.model, rows, reward_funcs=[correct], steps=50)
    ev = temper.eval(rl.model, rows, reward_funcs=[correct])
    ev.metrics["eval"]["data"]                                          # {model: {split: metrics}}

Each function builds the recipe the YAML would hold and runs it through the same path as
`temper run` (`temper.cli.run_checked`): the same validation, the same plan-time checks, the same
messages (at the key path, with the call in place of file:line), the same run folder with its
skipping and resuming. `run(dict_or_path)` takes a whole recipe.

Keyword arguments mirror the stage's recipe block one to one: a key of the stage (`lora=`,
`gate=`, `probe_groups=`, `splits=`) goes to the stage, any other to its `train:` block
(`steps=`, `lr=`, `max_steps=`), so `prompt_per_step=2` is refused as the recipe refuses
`train: {prompt_per_step: 2}`. `name=` and `output_dir=` are the recipe's own keys; without a
`name` a call's run is `runs/<kind>-<digest of its settings and inputs>`, so calling it again with
the same arguments skips (or resumes) it, and changing one makes a new run.

Python objects, and how the recipe names them (what keeps the stage hash and a resume honest):
- data (`data=`, `train_dataset=`, a task's `data` / `test_data` / `ood_data`, sft `data.files`):
  a `datasets.Dataset` or a list of dicts is written once to `<run>/inputs/<label>-<sha>.jsonl`
  (the digest of its rows) and named by that path; a string is a file, folder or hub id as in a
  recipe.
- reward functions (`reward_funcs=`, a task's `rewards`), `env` factories and
  `environment_factory` classes: named `module:name` when the object is what that name imports
  (a function or class at the top level of a module, or of your script: `__main__:correct`), so
  the hash covers its module's source. A lambda, a function defined inside another one or a
  method cannot be found again by name and is refused, saying so.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from temper.atomic import atomic_write_text
from temper.catalog import TASKS
from temper.cli import run_checked
from temper.recipe import RecipeError, load_recipe, validate_recipe
from temper.runner import stage_dir
from temper.stages import registry
from temper.stages.context import settings_hash

DATA_KEYS = ("data", "test_data", "ood_data")
"""A task entry's keys that name a data source: a Dataset or rows there are written to a file."""
CODE_KEYS = ("env", "environment_factory")
"""A task entry's keys that name user code (besides `rewards`)."""


@dataclass(frozen=True)
class Result:
    """What a run left: its folder, the last model it trained (None when no stage trains one),
    each stage's summary by stage name (its `<kind>.json`: sft.json's tokens and final loss,
    rl.json's final row, eval.json's {task: {model: {split: metrics}}}), and for a dry run the plan."""

    run_dir: Path
    model: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    plan: list[str] = field(default_factory=list)


def run(
    recipe: Mapping[str, Any] | str | Path,
    *,
    output_dir: str | Path | None = None,
    dry_run: bool = False,
    base_dir: str | Path | None = None,
) -> Result:
    """Run a recipe: a YAML file (as `temper run FILE`) or the dict it would hold, whose relative
    paths resolve against `base_dir` (default: the working directory) and which may hold Python
    objects where the module docstring says. `output_dir` is `--output-dir`; `dry_run` validates,
    checks the inputs and returns the plan without running.

    >>> plan = temper.run({"name": "demo", "model": {"path": "tests/pinned/start"},
    ...                    "tasks": {"arithmetic": {"max_digits": 2}},
    ...                    "stages": [{"kind": "eval", "n_problems": 4, "splits": ["test"]}]},
    ...                   dry_run=True).plan
    >>> plan[1].startswith("1. eval: ")
    True
    """
    if isinstance(recipe, str | Path):
        path = Path(recipe)
        validated = load_recipe(path)
        base, source = path.resolve().parent, str(path)
        text = path.read_text(encoding="utf-8-sig")
    elif isinstance(recipe, Mapping):
        base = Path(base_dir).expanduser().resolve() if base_dir is not None else Path.cwd()
        source = "temper.run"
        data = registered(dict(recipe), base, source, run_dir=Path(output_dir) if output_dir else None)
        text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        validated = validate_recipe(data, source, base)
    else:
        raise TypeError(
            f"temper.run takes a recipe dict or a recipe file's path, not {type(recipe).__name__}"
        )
    run_dir = Path(output_dir).expanduser().resolve() if output_dir else validated.run_dir(Path.cwd(), base)
    said = run_checked(validated, text, source, base, run_dir, dry_run)
    if dry_run:
        return Result(run_dir, plan=said)
    return _result(validated, run_dir)


def sft(
    model: Any,
    data: Any,
    *,
    name: str | None = None,
    output_dir: str | None = None,
    dry_run: bool = False,
    **options: Any,
) -> Result:
    """Supervised fine-tuning of `model` (a folder, a hub id, an earlier `Result`, or the recipe's
    `model:` block) on `data`: rows in TRL's formats (`messages`, or `prompt`/`completion`) as a
    `datasets.Dataset`, a list of dicts or a file, or the recipe's `data:` block as a dict
    (`{"tasks": [...], "files": [...]}`). Options: the sft stage's keys, the others its `train:`.

    >>> rows = [{"prompt": "2+2=", "completion": "Answer: 4"}] * 8
    >>> temper.sft("tests/pinned/start", rows, max_steps=2, dry_run=True).plan[1][:8]
    '1. sft: '
    """
    block = dict(data) if isinstance(data, Mapping) else {"files": [data]}
    return _one_stage("sft", model, {}, {"data": block, **options}, name, output_dir, dry_run)


def grpo(
    model: Any,
    train_dataset: Any,
    reward_funcs: Any = None,
    *,
    reward_weights: list[float] | None = None,
    environment_factory: Any = None,
    task: Mapping[str, Any] | None = None,
    name: str | None = None,
    output_dir: str | None = None,
    dry_run: bool = False,
    **options: Any,
) -> Result:
    """GRPO (an rl stage; `advantage=` picks another estimator) of `model` on the prompts of
    `train_dataset` graded by `reward_funcs`, as TRL's `GRPOTrainer(model, reward_funcs,
    train_dataset=...)`: rows with a `prompt` column (a `datasets.Dataset`, a list of dicts or a
    file), reward functions with TRL's signature (callables, `module:function` or built-in graders),
    and `environment_factory`, a TRL environment class whose public methods are the tools. The
    rows become a `dataset` task (named `data`, or after its file); `task=` adds its other options
    (`{"prompt": "question", "format": ...}`). `train_dataset` may instead name built-in tasks
    (`"arithmetic"`, a list of names, or the recipe's `tasks:` block), graded by their own verifiers.

    >>> rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(20)]
    >>> temper.grpo("tests/pinned/start", rows, ["exact_match"], steps=2, dry_run=True).plan[1][:7]
    '1. rl: '
    """
    tasks = _tasks(train_dataset, reward_funcs, reward_weights, environment_factory, task, "temper.grpo")
    return _one_stage("rl", model, tasks, {"tasks": list(tasks), **options}, name, output_dir, dry_run)


def eval(  # noqa: A001  # `kind: eval`, the `temper eval` command (temper.evaluate is a module)
    model: Any,
    tasks: Any,
    reward_funcs: Any = None,
    *,
    reward_weights: list[float] | None = None,
    environment_factory: Any = None,
    task: Mapping[str, Any] | None = None,
    name: str | None = None,
    output_dir: str | None = None,
    dry_run: bool = False,
    **options: Any,
) -> Result:
    """Evaluate `model` (an eval stage; `temper.evaluate` is the module that evaluates) on `tasks`
    (rows and reward functions as `grpo` takes them, or built-in task names): greedy accuracy,
    pass@k, mean@k, parse rate... per split, in
    `result.metrics["eval"]` as {task: {model: {split: metrics}}}. Options: the eval stage's keys
    (`splits`, `n_problems`, `k`, `max_new_tokens`...); rows without `ood_data` are evaluated on
    their held-out `test` split only, unless `splits=` says otherwise.

    >>> temper.eval("tests/pinned/start", "arithmetic", n_problems=4, dry_run=True).plan[1][:9]
    '1. eval: '
    """
    entries = _tasks(tasks, reward_funcs, reward_weights, environment_factory, task, "temper.eval")
    rows_only = all(e.get("task") == "dataset" and not e.get("ood_data") for e in entries.values())
    if rows_only and "splits" not in options:
        options["splits"] = ["test"]
    return _one_stage("eval", model, entries, {"tasks": list(entries), **options}, name, output_dir, dry_run)


# ---------------------------------------------------------------- building the recipe


def _one_stage(
    kind: str,
    model: Any,
    tasks: dict[str, Any],
    options: dict[str, Any],
    name: str | None,
    output_dir: str | None,
    dry_run: bool,
) -> Result:
    """The one-stage recipe of a call, run by `run`; its errors are the recipe's at the call (in
    place of file:line), their key paths without the `stages[0].` (the call is the stage)."""
    source = f"temper.{ {'rl': 'grpo'}.get(kind, kind) }"
    data: dict[str, Any] = {"name": name, "model": _model(model, source), "tasks": tasks}
    if output_dir is not None:
        data["output_dir"] = str(output_dir)
    data["stages"] = [{"kind": kind, **_routed(kind, options)}]
    base = Path.cwd()
    try:
        if name is None:  # a digest of what the call trains and on what: same call, same run
            digest = settings_hash(registered(data | {"name": kind}, base, source, dry=True))[:8]
            data["name"] = f"{kind}-{digest}"
        return run(registered(data, base, source), dry_run=dry_run, base_dir=base)
    except RecipeError as err:
        said = (
            str(err).replace("temper.run: stages[0].", f"{source}: ").replace("temper.run: ", f"{source}: ")
        )
        raise RecipeError(said) from None


def _routed(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments as the stage block: a key of the stage stays there, any other goes to its
    `train:` block (merged over a `train=` dict given too); a kind without one keeps them all."""
    fields = registry.get(kind).spec.model_fields
    stage = {k: v for k, v in options.items() if k in fields or "train" not in fields}
    flat = {k: v for k, v in options.items() if k not in stage}
    if flat:
        stage["train"] = {**dict(stage.get("train") or {}), **flat}
    return stage


def _model(model: Any, source: str) -> dict[str, Any]:
    """The recipe's `model:` block of a call's `model`."""
    if isinstance(model, Result):
        if model.model is None:
            raise RecipeError(f"{source}: model: the run {model.run_dir} trained no model to start from")
        return {"path": str(model.model)}
    if isinstance(model, Mapping):
        return dict(model)
    if isinstance(model, str | os.PathLike):
        return {"path": os.fspath(model)}
    raise RecipeError(
        f"{source}: model: a folder, a hub id, a Result or a model block, not {type(model).__name__}"
    )


def _tasks(
    given: Any,
    reward_funcs: Any,
    reward_weights: Any,
    environment_factory: Any,
    options: Mapping[str, Any] | None,
    source: str,
) -> dict[str, Any]:
    """The recipe's `tasks:` block of a call: built-in task names (or the block itself) as they
    are, anything else the rows of one `dataset` task graded by `reward_funcs`."""
    names = [given] if isinstance(given, str) else given if isinstance(given, list | tuple) else None
    block = isinstance(given, Mapping) and all(v is None or isinstance(v, Mapping) for v in given.values())
    if block or (names and all(isinstance(n, str) and n in TASKS for n in names)):  # (a DatasetDict: rows)
        if reward_funcs is not None or environment_factory is not None:
            raise RecipeError(
                f"{source}: reward_funcs: built-in tasks grade themselves; give your rows to grade them "
                "with reward functions"
            )
        return {n: {} for n in names} if names else {n: dict(v or {}) for n, v in given.items()}
    entry: dict[str, Any] = {"task": "dataset", "data": given}
    if reward_funcs is not None:
        entry["rewards"] = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if reward_weights is not None:
        entry["reward_weights"] = list(reward_weights)
    if environment_factory is not None:
        entry["environment_factory"] = environment_factory
    entry |= dict(options or {})
    label = Path(given.rstrip("/")).name.split(".")[0] if isinstance(given, str) else "data"
    return {label or "data": entry}


def registered(
    data: dict[str, Any], base: Path, source: str, dry: bool = False, run_dir: Path | None = None
) -> dict[str, Any]:
    """The recipe `data` with its Python objects replaced by what a YAML recipe would write (see
    the module docstring): rows by the file they are written to under the run folder (`run_dir`,
    default the recipe's), code by its `module:name`. `dry`: the rows by their digest only,
    written nowhere (for the run's name)."""
    out = dict(data)
    run_dir = base / run_dir if run_dir is not None else None

    def place(rows: Any, label: str, where: str) -> str:
        nonlocal run_dir
        if isinstance(rows, str | os.PathLike):
            return os.fspath(rows)
        text = _jsonl(rows, f"{source}: {where}")
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        if dry:
            return f"<rows {digest}>"
        if run_dir is None:
            named = out.get("name")
            if not isinstance(named, str):
                validate_recipe(out, source, base)  # says what is wrong with the name
            run_dir = base / out["output_dir"] if out.get("output_dir") else base / "runs" / str(named)
        path = run_dir / "inputs" / f"{label}-{digest}.jsonl"
        if not path.exists():
            atomic_write_text(path, text)
        try:
            return str(path.resolve().relative_to(base))
        except ValueError:
            return str(path.resolve())

    if isinstance(out.get("model"), Result | os.PathLike):
        out["model"] = _model(out["model"], source)
    tasks = out.get("tasks")
    if isinstance(tasks, Mapping):
        out["tasks"] = {}
        for name, entry in tasks.items():
            if isinstance(entry, Mapping):
                entry = dict(entry)
                for key in DATA_KEYS:
                    if entry.get(key) is not None:
                        entry[key] = place(entry[key], f"{name}-{key}", f"tasks.{name}.{key}")
                rewards = entry.get("rewards")
                if rewards is not None and not isinstance(rewards, str | Mapping):
                    entry["rewards"] = [
                        code_name(f, f"{source}: tasks.{name}.rewards[{i}]") for i, f in enumerate(rewards)
                    ]
                elif callable(rewards):
                    entry["rewards"] = [code_name(rewards, f"{source}: tasks.{name}.rewards")]
                for key in CODE_KEYS:
                    if entry.get(key) is not None:
                        entry[key] = code_name(entry[key], f"{source}: tasks.{name}.{key}")
            out["tasks"][name] = entry
    stages = out.get("stages")
    if isinstance(stages, list):
        out["stages"] = []
        for i, stage in enumerate(stages):
            block = stage.get("data") if isinstance(stage, Mapping) else None
            if isinstance(block, Mapping):
                block = dict(block)
                for key in ("files", "eval_files"):
                    if isinstance(block.get(key), list):
                        block[key] = [
                            place(f, f"{key}-{i}-{j}", f"stages[{i}].data.{key}[{j}]")
                            for j, f in enumerate(block[key])
                        ]
                stage = {**stage, "data": block}
            out["stages"].append(stage)
    return out


def _jsonl(rows: Any, where: str) -> str:
    """A Dataset's or a list's rows as JSONL text (one object a line, keys in their order)."""
    if isinstance(rows, Mapping):
        raise RecipeError(
            f"{where}: a mapping (a DatasetDict of splits?) is not rows: pass one split, e.g. ds['train']"
        )
    listed = rows.to_list() if callable(getattr(rows, "to_list", None)) else None
    if listed is None:
        try:
            listed = list(rows)
        except TypeError:
            raise RecipeError(
                f"{where}: expected rows (a datasets.Dataset or a list of dicts) or a path, not "
                f"{type(rows).__name__}"
            ) from None
    lines = []
    for i, row in enumerate(listed):
        if not isinstance(row, Mapping):
            raise RecipeError(f"{where}: row {i} is a {type(row).__name__}, not a dict of columns")
        try:
            lines.append(json.dumps(dict(row), ensure_ascii=False) + "\n")
        except (TypeError, ValueError) as err:
            raise RecipeError(f"{where}: row {i} cannot be written as JSON: {err}") from None
    if not lines:
        raise RecipeError(f"{where}: no rows")
    return "".join(lines)


def code_name(obj: Any, where: str) -> Any:
    """`module:name` of a function or class that importing that name gives back; a string (or a
    built-in grader's mapping) as it is. Anything else is refused: the recipe must be able to find
    the code again (a resumed run, every process of a launch) and hash its source."""
    if isinstance(obj, str | Mapping) or not callable(obj):
        return obj
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    label = getattr(obj, "__name__", None) or repr(obj)
    found: Any = None
    if module and qualname and "." not in qualname and "<" not in qualname:
        try:
            found = getattr(importlib.import_module(module), qualname, None)
        except ImportError:
            found = None
    if found is not obj:
        raise RecipeError(
            f"{where}: {label!r} cannot be named in the recipe (a lambda, a function defined inside "
            "another, a method or an object its module's name does not give back): define it at the "
            "top level of a module or of your script, or write 'module:function'"
        )
    return f"{module}:{qualname}"


def _result(recipe: Any, run_dir: Path) -> Result:
    model, metrics = None, {}
    for i, stage in enumerate(recipe.stages):
        out = stage_dir(run_dir, i, stage.name)
        summary = out / f"{stage.kind}.json"
        if summary.is_file():
            metrics[stage.name] = json.loads(summary.read_text())
        if registry.get(stage.kind).produces_model and (out / "model").exists():
            model = out / "model"
    return Result(run_dir, model, metrics)
