"""The contract every stage kind fulfils, and the pieces stage specs share.

A stage kind is one module under `temper.stages` that defines its recipe spec (a pydantic model
with `kind: Literal["<name>"]`), the function that runs it, and a module-level `KIND = StageKind(...)`
tying them together. The runner, the recipe schema, the CLI and the report look kinds up in
`temper.stages.registry` instead of testing `stage.kind`, so a new kind is one new file:

1. `temper/stages/<kind>.py` with a `Strict` spec (`kind: Literal["<kind>"]`, `name`, and `source`
   or `models` when it reads models), a `run(spec, StageRun)` writing into `StageRun.out` (a model
   stage leaves `out/model`, and a `<kind>.json` summary the report reads), and `KIND`;
2. its report section in `temper.report` (one module, entered in `temper.report.sections`; the
   stages never import the report, which sits above them and looks kinds up here);
3. its tests. The recipe schema, `--dry-run`, `temper <kind> --help` and the report pick it up.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from temper.stages.context import StageContext
from temper.train.rl_config import RLConfig
from temper.train.strategy import MUON_UNDER_FSDP
from temper.train.supervised import TrainConfig

if TYPE_CHECKING:
    from temper.recipe import ModelSpec, Recipe

# the trainers' dataclasses are validated like the rest of the recipe (unknown keys are errors) and
# their attribute docstrings become the descriptions the CLI's --help shows
# (and no value may be inf or nan: `lr: .inf` or `temperature: .inf` would run and train nothing)
TrainConfig.__pydantic_config__ = ConfigDict(
    extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False
)
RLConfig.__pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


class Strict(BaseModel):
    """A recipe block: unknown keys are errors, attribute docstrings are field descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


class LoraSpec(Strict):
    """A PEFT LoRA adapter; the field names are `temper.models.apply_lora`'s arguments."""

    r: int = Field(16, gt=0)
    alpha: int = Field(32, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: str | list[str] = "all-linear"
    save: Literal["merged", "adapter"] = "merged"
    """merged: the adapter folded into the saved model (a plain model any Auto class loads);
    adapter: a PEFT adapter folder (adapter_config.json + weights, tokenizer beside it) for
    `PeftModel.from_pretrained`, which later stages also accept as their model."""

    def adapter_args(self) -> dict[str, Any]:
        """The keyword arguments of `temper.models.apply_lora`."""
        return self.model_dump(exclude={"save"})


Loc = tuple[str | int, ...]


class Located(ValueError):
    """Errors of a validator, each at a key path below the validated model: the recipe formats
    them at that key's line (`temper.recipe.expand_errors`) instead of at the whole block."""

    def __init__(self, errors: list[tuple[Loc, str]]):
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in errors))
        self.errors = errors


def raise_located(errors: list[tuple[Loc, str]]) -> None:
    if errors:
        raise Located(errors)


def train_rules(config: TrainConfig) -> list[tuple[Loc, str]]:
    """Cross-field rules of a supervised `train:` block (the ranges are on the fields). With
    `epochs` the steps are known only once the data is read: `epoch_steps` checks them then."""
    out: list[tuple[Loc, str]] = []
    warmup = config.warmup_steps  # unset resolves below the steps (`TrainConfig.resolved_warmup`)
    if config.epochs is None and warmup is not None and warmup >= config.max_steps:
        out.append(
            (
                ("warmup_steps",),
                f"{warmup} must be below max_steps ({config.max_steps}): the lr would never reach its peak "
                "(leave it unset for a tenth of the steps)",
            )
        )
    if config.strategy == "fsdp" and config.optimizer == "muon":
        out.append((("strategy",), MUON_UNDER_FSDP))
    if config.micro_batch_size and config.batch_size % config.micro_batch_size:
        out.append(
            (
                ("micro_batch_size",),
                f"must divide batch_size ({config.batch_size}): the trainer splits each batch into equal micro-batches",
            )
        )
    return out


def epochs_rule(data: Any) -> Any:
    """Refuse a `train:` block giving both `epochs` and `max_steps`. Run on the raw input (a
    "before" validator): once validated, `max_steps` always has a value (its default)."""
    train = data.get("train") if isinstance(data, dict) else None
    if isinstance(train, dict) and train.get("epochs") is not None and train.get("max_steps") is not None:
        raise Located([(("train", "epochs"), "give epochs or max_steps, not both")])
    return data


def length(config: TrainConfig) -> str:
    """How long a supervised stage trains, for its plan line: "500 steps" or "2 epochs"."""
    return f"{config.max_steps} steps" if config.epochs is None else f"{config.epochs:g} epochs"


def epoch_steps(config: TrainConfig, sequences: int, stage: str) -> TrainConfig:
    """`config` with `max_steps` = ceil(epochs x sequences / batch_size) when `epochs` is given
    (at least 1), said on the console; unchanged otherwise."""
    if config.epochs is None:
        return config
    steps = max(1, math.ceil(config.epochs * sequences / config.batch_size))
    if config.warmup_steps is not None and config.warmup_steps >= steps:
        raise StageError(
            f"{stage}: {config.epochs:g} epochs of {sequences} sequences at batch_size {config.batch_size} "
            f"are {steps} steps, not more than warmup_steps ({config.warmup_steps}): lower "
            "train.warmup_steps (or leave it unset) or raise train.epochs"
        )
    config = dataclasses.replace(config, max_steps=steps)
    Console(stderr=True).print(
        f"{stage}: {config.epochs:g} epochs of {sequences} sequences at batch_size {config.batch_size} = {steps} steps "
        f"(warm-up {config.resolved_warmup()})"
    )
    return config


class StageError(RuntimeError):
    """A stage refusing to go on for a reason the user can act on (the CLI prints it, no traceback)."""


@dataclass(frozen=True)
class StageRun:
    """What the runner (or the CLI) hands a stage's `run`: where to write and what to start from."""

    ctx: StageContext
    out: Path
    model: ModelSpec | None  # the recipe's model (what a `reads="base"` stage trains)
    source: Path | str | None = None  # the model a `reads="model"` stage starts from


def _no_tasks(spec: Any) -> list[str]:
    return list(getattr(spec, "tasks", []))


Use = tuple[Loc, str] | tuple[Loc, str, str]
"""A reference to another stage's output (`StageKind.uses`): (key path, name or path) for a
model, (key path, name or folder, kind) for the folder a stage of that kind exports."""


def _no_uses(spec: Any) -> list[Use]:
    return []


def _no_chats(spec: Any, base_dir: Path) -> bool:
    return False


def _nothing(spec: Any) -> list[Any]:
    return []


@dataclass(frozen=True)
class EpochRows:
    """What a stage's `train.epochs` runs over, for the plan's bound on its steps (`--dry-run`):
    `problems` drawn from tasks plus the rows of the data `files`; `packed` when packing makes
    fewer steps; `pending`, when the rows are known only once the stage runs, says what they wait
    for (the plan then says so instead of a bound)."""

    problems: int = 0
    files: tuple[str, ...] = ()
    packed: bool = False
    pending: str | None = None


EvalSet = tuple[list[str], list[str], int, int]
"""(tasks, splits, n_problems, seed) of an eval set: what training data is checked against."""


@dataclass(frozen=True)
class StageKind:
    """One stage kind, as the runner, the recipe schema, the CLI and the report see it.

    `reads` says which models the stage consumes, and so what its settings hash covers:
    - "base": the recipe's `model` (a preset or a path), as pretraining does;
    - "model": one model, the spec's `source` stage or else the latest model stage (or, with no
      model stage before it, the recipe's `model.path`);
    - "models": several, the spec's `models` list or else every model stage so far.
    """

    name: str
    """The recipe's `kind:` value and the CLI subcommand."""
    spec: type[BaseModel]
    """The recipe block, a `Strict` model whose `kind` field is `Literal[name]`."""
    run: Callable[[Any, StageRun], Any]
    """Run the stage into `StageRun.out`; what it returns the CLI prints when there is no `summary`."""
    describe: Callable[[Any, Recipe], str]
    """The `--dry-run` plan line: what this stage will do."""
    reads: Literal["base", "model", "models"]
    produces_model: bool
    """Whether the stage leaves `out/model` for later stages to start from or evaluate."""
    help: str
    """One line for `temper --help`."""
    outputs: tuple[str, ...] = ()
    """Files whose presence identifies an unfinished stage of this kind (it has no stage.json yet)."""
    tasks: Callable[[Any], list[str]] = _no_tasks
    """The recipe tasks the stage uses (checked to exist; they are the CLI command's tasks)."""
    task_rules: Callable[[Any, dict[str, Any]], list[tuple[Loc, str]]] | None = None
    """Rules of the spec that need the recipe's built tasks (name -> Task), errors located below
    the stage (the recipe checks them with the task options; e.g. rl's declared path signals)."""
    uses: Callable[[Any], list[Use]] = _no_uses
    """What the stage reads besides the model it starts from: (key path in the spec, an earlier
    stage's name or a path / hub id), e.g. rl's `teacher`: the recipe checks that a name is an
    earlier stage's, and the stage hash covers that stage's hash, so retraining it reruns this one.
    Or (key path, name or folder, kind), e.g. rl's `train.reward_model`: what a stage of `kind`
    exports (its `exports` folder), named by the stage or given as a folder (relative to the
    recipe's folder); the recipe checks that a name is an earlier stage of that kind or else that
    the folder exists, and the stage hash covers the folder's files."""
    splits: Callable[[Any, list[str]], list[tuple[str, str]]] | None = None
    """(task, split) pairs the stage draws problems from, given the recipe's task names (the
    plan-time check samples each); None: the train split of each of its `tasks`."""
    renders_chats: Callable[[Any, Path], bool] = _no_chats
    """Whether the stage renders conversations through the model's chat template, given the
    recipe's folder (the plan refuses a model without one unless `model.chat_template` is set)."""
    epoch_rows: Callable[[Any], EpochRows | None] | None = None
    """What `train.epochs` counts, for the plan's bound on the steps; None: no bound is given."""
    caches: Callable[[Any], list[tuple[Loc, str]]] = _nothing
    """(key path, folder) of each cache the stage reads if present and else fills: checked at plan
    time to be a directory that can be created and written."""
    files: Callable[[Any], list[tuple[Loc, str]]] = _nothing
    """(key path, file) of each file of the user's the stage reads (relative to the recipe's
    folder), e.g. harness_search's `harness`: the recipe checks that it exists, and its bytes go
    into the stage hash, so editing it reruns the stage."""
    eval_sets: Callable[[Any], list[EvalSet]] = _nothing
    """The eval sets the stage contributes (the recipe's training data is checked against them)."""
    exports: str | None = None
    """The folder under the stage's output that later stages read by naming the stage (a typed
    `uses` reference), e.g. reward_model's `reward_model` (the stage produces no policy)."""
    main_only: bool = False
    """Run on the main process only (under a multi-process launch the others wait)."""
    summary: Callable[[Path], str] | None = None
    """Text printed after the stage (run or skipped) from its output folder, e.g. a results table."""
    order: int = 100
    """Position in listings (CLI help): pipeline order."""


def folder_digest(path: Path) -> str:
    """A digest of a folder's files (relative names and bytes), or "missing": the stage hash of a
    stage that reads a folder no model stage records (a reward model) covers what is in it."""
    import hashlib

    if not path.is_dir():
        return "missing"
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        with f.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()[:16]
