"""Recipe schema and validation: a YAML file of model, tasks and stages, checked before anything runs.

An unknown key or a bad value is a `RecipeError` naming the file, the line and the key path, and
suggesting the nearest valid key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from temper.rewards import COMPONENTS
from temper.tasks import TASKS, make_recipe_task
from temper.train.rl import RLConfig
from temper.train.supervised import TrainConfig

# the trainers' dataclasses are validated like the rest of the recipe: unknown keys are errors
TrainConfig.__pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)
RLConfig.__pydantic_config__ = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class RecipeError(ValueError):
    """An invalid recipe, located by file, line and key path."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ModelSpec(Strict):
    preset: str | None = None
    """A built-in from-scratch preset (nano, tiny, small); needs a pretrain stage."""
    path: str | None = None
    """A local model directory or a hub id (loaded with the transformers Auto classes)."""
    seed: int = 0
    """Initialization seed of a preset."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        return self


class CorpusSpec(Strict):
    tasks: list[str] = []
    """Tasks whose problems and solutions, in plain notation, make the synthetic corpus."""
    problems_per_task: int = Field(20_000, gt=0)
    files: list[str] = []
    """Extra text: .txt (one document per line) or .jsonl with a `text` field."""
    seed: int = 0


class PretrainStage(Strict):
    kind: Literal["pretrain"]
    name: str = "pretrain"
    corpus: CorpusSpec = CorpusSpec()
    max_len: int = Field(128, gt=1)
    """Packed row length in tokens."""
    train: TrainConfig = TrainConfig()
    cache: str | None = None
    """Directory of a previously produced base (e.g. the one shipped in checkpoints/); used
    instead of training when its recorded settings equal this stage's, filled otherwise."""


class SFTData(Strict):
    tasks: list[str] = []
    """Tasks whose train-split demonstrations become chat examples."""
    problems_per_task: int | dict[str, int] = 2_000
    """Train-split demonstrations per task: one number for all, or {task: number}."""
    files: list[str] = []
    """JSONL files in TRL formats (messages, or prompt/completion)."""
    skip_bad_rows: bool = False
    eval_problems: int = Field(64, ge=0)
    """Test-split demonstrations per task for the eval loss."""
    seed: int = 1


class LoraSpec(Strict):
    r: int = Field(16, gt=0)
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"


class SFTStage(Strict):
    kind: Literal["sft"]
    name: str = "sft"
    data: SFTData = SFTData()
    max_len: int = Field(256, gt=1)
    pack: bool = False
    train: TrainConfig = TrainConfig()
    lora: LoraSpec | None = None
    """Train a PEFT LoRA adapter and merge it into the saved model."""
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""


class EvalStage(Strict):
    kind: Literal["eval"]
    name: str = "eval"
    models: list[str] = []
    """Stages whose models to evaluate side by side; default: every model stage so far."""
    tasks: list[str] = []
    """Default: every task of the recipe."""
    splits: list[Literal["train", "test", "ood"]] = ["test", "ood"]
    n_problems: int = Field(200, gt=0)
    k: int = Field(4, gt=0)
    """Samples per problem for pass@k and mean@k."""
    temperature: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(64, gt=0)
    seed: int = 1234
    sampler: Literal["hf", "vllm"] = "hf"
    """Generation backend: hf (in-process transformers, CPU or GPU) or vllm (GPU)."""


class GateSpec(Strict):
    """The format-stability gate: RL starts only once the policy answers in the parseable format."""

    min_parse_rate: float = Field(0.8, ge=0, le=1)
    """Greedy parse rate required on held-out (test split) prompts of every task."""
    n_problems: int = Field(64, gt=0)
    on_fail: Literal["stop", "warn"] = "stop"


class RLStage(Strict):
    kind: Literal["rl"]
    name: str = "rl"
    tasks: list[str]
    """Tasks whose train-split problems are the RL prompts (mixed evenly)."""
    train: RLConfig = RLConfig()
    lora: LoraSpec | None = None
    """Train a LoRA adapter; the reference model is then the adapter-disabled base."""
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""
    gate: GateSpec | None = None
    sampler: Literal["hf", "vllm"] = "hf"
    """Rollout backend: hf (in-process transformers, CPU or GPU) or vllm (GPU; weights synced after
    every update)."""
    probe_groups: int = Field(8, ge=0)
    """Groups sampled from the starting policy for the reachability probe (0: skip)."""

    @model_validator(mode="after")
    def _check(self) -> RLStage:
        unknown = [name for name in self.train.rewards if name not in COMPONENTS]
        if unknown:
            raise ValueError(f"unknown reward components {unknown}; valid: {', '.join(COMPONENTS)}")
        if self.train.advantage not in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae"):
            raise ValueError(
                f"unknown advantage {self.train.advantage!r}; valid: grpo, dr_grpo, rloo, reinforce_pp, gae"
            )
        if not self.tasks:
            raise ValueError("an rl stage needs at least one task")
        return self


Stage = Annotated[PretrainStage | SFTStage | RLStage | EvalStage, Field(discriminator="kind")]
MODEL_STAGES = ("pretrain", "sft", "rl")


class Recipe(Strict):
    name: str
    output_dir: str | None = None
    """Default: runs/<name>."""
    model: ModelSpec
    tasks: dict[str, dict[str, Any]] = {}
    """Task name -> options (see `temper.tasks`); stages refer to tasks by name."""
    stages: list[Stage]

    @model_validator(mode="after")
    def _check_references(self) -> Recipe:
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique, got {names}")
        for name, options in self.tasks.items():
            make_recipe_task(name, options)
        seen: list[str] = []
        for stage in self.stages:
            used = getattr(stage, "tasks", None) or getattr(
                getattr(stage, "corpus", None) or getattr(stage, "data", None), "tasks", []
            )
            for task in used:
                if task not in self.tasks:
                    raise ValueError(
                        f"stage {stage.name!r} uses task {task!r}, which is not in the recipe's tasks {sorted(self.tasks)}"
                    )
            refs = (
                stage.models
                if stage.kind == "eval"
                else [stage.source]
                if getattr(stage, "source", None)
                else []
            )
            for ref in refs:
                if ref not in seen:
                    raise ValueError(
                        f"stage {stage.name!r} refers to {ref!r}, which is not an earlier model stage {seen}"
                    )
            if stage.kind in MODEL_STAGES:
                seen.append(stage.name)
        if self.model.preset and self.stages and self.stages[0].kind != "pretrain":
            raise ValueError("a preset model starts untrained: the first stage must be 'pretrain'")
        return self

    def run_dir(self, base: Path) -> Path:
        return (base / (self.output_dir or f"runs/{self.name}")).resolve()


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
            kind = data.get("kind") if isinstance(data, dict) else None
            owner = {"pretrain": PretrainStage, "sft": SFTStage, "rl": RLStage, "eval": EvalStage}.get(kind)
            continue
        fields = getattr(owner, "model_fields", None) or getattr(owner, "__dataclass_fields__", {})
        field = fields.get(key) if isinstance(key, str) else None
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


def _format_error(err: dict[str, Any], text: str, data: Any, source: str) -> str:
    loc = tuple(err["loc"])
    if len(loc) > 2 and loc[0] == "stages" and loc[2] in ("pretrain", "sft", "rl", "eval"):
        loc = loc[:2] + loc[3:]  # pydantic puts the union tag in the location of a stage
    path = ".".join(f"[{x}]" if isinstance(x, int) else str(x) for x in loc).replace(".[", "[")
    line = _yaml_line(text, loc)
    where = f"{source}:{line}" if line else source
    message = err["msg"]
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        owner = _model_at(loc, data)
        valid = list(getattr(owner, "model_fields", None) or getattr(owner, "__dataclass_fields__", {}))
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        message = (
            f"unknown key {loc[-1]!r}"
            + (f"; did you mean {near[0]!r}?" if near else "")
            + (f" Valid keys: {', '.join(valid)}" if valid else "")
        )
    return f"{where}: {path or '<recipe>'}: {message}"


def parse_recipe(text: str, source: str = "<recipe>") -> Recipe:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise RecipeError(f"{source}{line}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping with name, model and stages")
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        lines = [_format_error(e, text, data, source) for e in err.errors()]
        raise RecipeError("invalid recipe:\n  " + "\n  ".join(lines)) from None


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist")
    return parse_recipe(path.read_text(), str(path))


__all__ = [
    "TASKS",
    "EvalStage",
    "PretrainStage",
    "RLStage",
    "Recipe",
    "RecipeError",
    "SFTStage",
    "load_recipe",
    "parse_recipe",
]
