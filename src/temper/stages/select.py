"""The checkpoint selection stage: evaluate what an earlier stage saved, pick one by a rule.

The candidates are the checkpoints a training stage kept (`checkpoints/step-N`, Accelerate states
written by `train.checkpoint.save_checkpoint`: the prepared module's state dict in
`pytorch_model.bin`; the two newest are kept unless `train.save_every` left more), an rft stage's
round models (`round-NN/model`), and the stage's final `model`. Each is scored on the same
held-out problems by the one evaluation path (`evaluate.evaluate`, greedy) and by its KL to the
reference model on its own samples:

    id_accuracy, ood_accuracy   greedy accuracy on the test and ood splits (mean over tasks)
    parse_rate                  greedy parse rate on the test split
    length                      mean greedy completion tokens on the test split
    kl                          mean per-token KL(candidate || reference), exact over the vocabulary,
                                at the tokens the candidate samples (temperature 1) on test prompts

The recipe's rule names one criterion to maximize or minimize, subject to bounds on others:

    rule: {maximize: ood_accuracy, subject_to: {id_accuracy: ">= 0.5", kl: "<= 0.2"}}

Ties go to the earliest candidate (fewest steps). The chosen candidate is saved as this stage's
`model`, so later stages start from (or evaluate) it; the report shows every candidate's row and
the choice.
"""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json
from temper.data.chat import prompt_ids
from temper.evaluate import evaluate
from temper.models import load_model, save_trained
from temper.rollout import HFSampler
from temper.stages.base import StageError, StageKind, StageRun, Strict, raise_located
from temper.train.checkpoint import list_checkpoints

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch

console = Console(stderr=True)

CRITERIA = ("id_accuracy", "ood_accuracy", "parse_rate", "length", "kl")
_BOUND = re.compile(r"^\s*(>=|<=|>|<|==)\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|-?\.\d+)\s*$")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
HELD_OUT_SEED = 4242  # the held-out problems rl and rft grade (temper.stages.rl.HELD_OUT_SEED)


class SelectRule(Strict):
    maximize: Literal[CRITERIA] | None = None  # type: ignore[valid-type]
    """The criterion to make largest (one of id_accuracy, ood_accuracy, parse_rate, length, kl)."""
    minimize: Literal[CRITERIA] | None = None  # type: ignore[valid-type]
    """Or the criterion to make smallest."""
    subject_to: dict[Literal[CRITERIA], str] = {}  # type: ignore[valid-type]
    """Bounds a candidate must meet, criterion -> ">= 0.5" (operators >=, <=, >, <, ==)."""

    @model_validator(mode="after")
    def _check(self) -> SelectRule:
        errors = []
        if (self.maximize is None) == (self.minimize is None):
            errors.append(((), "give exactly one of maximize or minimize"))
        errors += [
            (("subject_to", k), f"{v!r} is not a bound like '>= 0.5' (operators >=, <=, >, <, ==)")
            for k, v in self.subject_to.items()
            if not _BOUND.match(v)
        ]
        raise_located(errors)
        return self

    def describe(self) -> str:
        goal = f"maximize {self.maximize}" if self.maximize else f"minimize {self.minimize}"
        bounds = ", ".join(f"{k} {' '.join(v.split())}" for k, v in self.subject_to.items())
        return goal + (f" subject to {bounds}" if bounds else "")


class SelectStage(Strict):
    kind: Literal["select"]
    name: str = "select"
    source: str | None = None
    """The stage whose checkpoints to choose from; default: the latest stage that produced a model."""
    reference: str | None = None
    """The stage whose model the KL is measured to; default: the model stage before `source` (the
    model it started from when it named no source), else the recipe's model."""
    rule: SelectRule
    tasks: list[str] = []
    """Default: every task of the recipe."""
    n_problems: int = Field(200, gt=0)
    """Held-out problems per task and split for the accuracies, parse rate and length."""
    kl_problems: int = Field(32, ge=0)
    """Test prompts per task whose samples measure the KL (0: no KL)."""
    max_new_tokens: int = Field(64, gt=0)


def bound_ok(value: float | None, bound: str) -> bool:
    """`value` meets `bound` (e.g. ">= 0.5"); a missing value (a task without ood) meets none."""
    op, number = _BOUND.match(bound).groups()
    return value is not None and _OPS[op](value, float(number))


def choose(table: dict[str, dict[str, float | None]], rule: SelectRule) -> tuple[str, list[str]]:
    """(the chosen candidate, the feasible ones) of `table` (candidate -> criterion -> value, in
    candidate order) under `rule`; ties go to the earlier candidate. No feasible candidate, or none
    with the criterion, is a StageError naming the bounds each one missed."""
    feasible = [
        name
        for name, row in table.items()
        if all(bound_ok(row.get(k), b) for k, b in rule.subject_to.items())
    ]
    key = rule.maximize or rule.minimize
    scored = [name for name in feasible if table[name].get(key) is not None]
    if not scored:
        missed = {
            name: [f"{k} {row.get(k)}" for k, b in rule.subject_to.items() if not bound_ok(row.get(k), b)]
            for name, row in table.items()
        }
        raise StageError(f"select: no checkpoint meets {rule.describe()} (missed: {missed})")
    sign = 1 if rule.maximize else -1
    best = max(scored, key=lambda name: (sign * table[name][key], -scored.index(name)))
    return best, feasible


def candidates(stage_dir: Path) -> list[tuple[str, Path]]:
    """(name, path) of what a stage folder holds, oldest first: its checkpoints, its rft rounds, its
    final model."""
    found = [(p.name, p) for p in list_checkpoints(stage_dir / "checkpoints")]
    found += [(p.name, p / "model") for p in sorted(stage_dir.glob("round-*")) if (p / "model").is_dir()]
    return found + ([("final", stage_dir / "model")] if (stage_dir / "model").is_dir() else [])


def load_candidate(path: Path, final: Path) -> torch.nn.Module:
    """A model folder as is; a checkpoint as the final model's architecture with the checkpoint's
    weights (the state dict of the module the trainer prepared: the model itself, or RL's
    `PolicyWithValue`, whose keys start with `policy.`; a value head's keys are left out)."""
    import torch

    if not (path / "state.json").exists():
        return load_model(path)
    model = load_model(final)
    weights = path / "pytorch_model.bin"
    if not weights.exists():
        raise StageError(f"select: checkpoint {path} holds no pytorch_model.bin (a LoRA or sharded state?)")
    state = torch.load(weights, map_location="cpu", weights_only=True)
    mine = model.state_dict()
    anchor = next(iter(mine))
    prefix = next((k[: -len(anchor)] for k in state if k.endswith(anchor)), None)
    if prefix is None:
        raise StageError(
            f"select: checkpoint {path} does not hold the weights of {final} (a LoRA adapter's state?)"
        )
    picked = {
        k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix) and k[len(prefix) :] in mine
    }
    missing = set(mine) - set(picked)
    if missing - {"lm_head.weight"}:  # a tied head is saved once, as the embedding
        raise StageError(f"select: checkpoint {path} lacks {sorted(missing)[:3]} of {final}")
    model.load_state_dict(picked, strict=False)
    return model


def mean_kl(model, reference, tokenizer, prompts: list[list[int]], max_new_tokens: int, seed: int) -> float:
    """Mean over sampled tokens of KL(model || reference) = sum_v p(v) (log p(v) - log q(v)), exact
    over the vocabulary at each position of the model's own samples (temperature 1)."""
    import torch

    samples = HFSampler(model, tokenizer).sample(prompts, 1, max_new_tokens=max_new_tokens, seed=seed)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for group in samples:
            s = group[0]
            if not s.token_ids:
                continue
            ids_1_T = torch.tensor([s.prompt_ids + s.token_ids])
            start = len(s.prompt_ids) - 1  # the logits that predict the completion tokens
            logp_T_V = torch.log_softmax(model(ids_1_T).logits[0, start:-1].float(), -1)
            logq_T_V = torch.log_softmax(reference(ids_1_T).logits[0, start:-1].float(), -1)
            total += float((logp_T_V.exp() * (logp_T_V - logq_T_V)).sum())
            tokens += len(s.token_ids)
    return total / max(tokens, 1)


def score(model, tokenizer, reference, tasks: dict[str, Any], stage: SelectStage) -> dict[str, float | None]:
    """The criteria of one candidate (means over tasks; ood_accuracy None when no task has ood)."""
    model.eval()
    sampler = HFSampler(model, tokenizer)
    got: dict[str, list[float]] = {k: [] for k in CRITERIA}
    kl_prompts = []
    for task in tasks.values():
        for split in ("test", "ood"):
            try:
                r = evaluate(
                    sampler, tokenizer, task, split, n_problems=stage.n_problems, seed=HELD_OUT_SEED, k=0,
                    max_new_tokens=stage.max_new_tokens, n_examples=0,
                )  # fmt: skip
            except ValueError:  # no problems in this split (a data task without ood)
                continue
            m = r["metrics"]
            if split == "test":
                got["id_accuracy"].append(m["greedy_accuracy"]["value"])
                got["parse_rate"].append(m["parse_rate"]["value"])
                got["length"].append(m["mean_length"]["value"])
            else:
                got["ood_accuracy"].append(m["greedy_accuracy"]["value"])
        kl_prompts += [
            prompt_ids(tokenizer, p.messages()) for p in task.sample("test", stage.kl_problems, HELD_OUT_SEED)
        ]
    if reference is not None and kl_prompts:
        got["kl"].append(
            mean_kl(model, reference, tokenizer, kl_prompts, stage.max_new_tokens, HELD_OUT_SEED)
        )
    return {k: (sum(v) / len(v) if v else None) for k, v in got.items()}


def _reference(stage: SelectStage, job: StageRun) -> tuple[str, Path | str] | None:
    names = list(job.ctx.models)
    if stage.reference is not None:
        if stage.reference not in job.ctx.models:
            raise StageError(f"select: reference {stage.reference!r} is not an earlier model stage {names}")
        return stage.reference, job.ctx.models[stage.reference]
    at = next((i for i, n in enumerate(names) if Path(job.ctx.models[n]) == Path(job.source)), None)
    if at:
        return names[at - 1], job.ctx.models[names[at - 1]]
    if job.model is not None and job.model.path:
        return job.model.path, job.ctx.model_source(job.model.path)
    return None


def run_select(stage: SelectStage, job: StageRun) -> Path:
    from temper.stages.loading import load_chat_model

    if job.source is None:
        raise StageError("select: no earlier stage produced a model to choose among")
    folder = Path(job.source).parent
    found = candidates(folder)
    if not found:
        raise StageError(f"select: {folder} holds no checkpoints and no model")
    tasks = {n: job.ctx.tasks[n] for n in stage.tasks or list(job.ctx.tasks)}
    ref = _reference(stage, job) if stage.kl_problems else None
    reference = load_chat_model(ref[1], job.ctx)[1].eval() if ref else None
    tokenizer = load_chat_model(job.source, job.ctx)[0]  # the candidates' (a checkpoint folder has none)
    table: dict[str, dict[str, float | None]] = {}
    for name, path in found:
        model = load_candidate(path, Path(job.source))
        table[name] = score(model, tokenizer, reference, tasks, stage)
        console.print(
            f"select: {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in table[name].items() if v is not None)
        )
    chosen, feasible = choose(table, stage.rule)
    console.print(f"select: {chosen} ({stage.rule.describe()})")
    model = load_candidate(dict(found)[chosen], Path(job.source))
    out = save_trained(model, tokenizer, job.out / "model")
    if distributed.is_main():
        atomic_write_json(
            job.out / "select.json",
            {
                "rule": stage.rule.describe(),
                "from": str(folder),
                "reference": ref[0] if ref else None,
                "candidates": [
                    {"name": n, "path": str(p), "metrics": table[n], "feasible": n in feasible}
                    for n, p in found
                ],
                "chosen": chosen,
            },
        )
    return out


def select_table(out: Path) -> str:
    summary = json.loads((out / "select.json").read_text())
    lines = [
        f"select: {summary['rule']} -> {summary['chosen']}",
        f"{'candidate':<14}" + "".join(f"{k:>14}" for k in CRITERIA),
    ]
    for c in summary["candidates"]:
        cells = "".join(
            f"{'-' if c['metrics'][k] is None else format(c['metrics'][k], '.4g'):>14}" for k in CRITERIA
        )
        lines.append(f"{c['name'] + (' *' if c['name'] == summary['chosen'] else ''):<14}{cells}")
    return "\n".join(lines)


KIND = StageKind(
    name="select",
    spec=SelectStage,
    run=run_select,
    describe=lambda stage, recipe: (
        f"select among {stage.source or 'the latest model stage'}'s checkpoints: {stage.rule.describe()}"
    ),
    reads="model",
    produces_model=True,
    help="evaluate a stage's checkpoints (ID/OOD accuracy, parse rate, length, KL) and keep one by a rule",
    outputs=("select.json",),
    tasks=lambda stage: stage.tasks,
    uses=lambda stage: [(("reference",), stage.reference)] if stage.reference else [],  # the KL's reference
    summary=select_table,
    order=85,
)
