"""The process_reward_model stage: a PRM trained on step labels a program gives, no human labels.

The starting model (the policy, `source`) answers train-split prompts k times; every completion is
cut into steps and each step labelled by the task's step verifier (`temper.tasks.steps`: first
error style, the steps after it unlabelled). A label sits on the last token of its step, IGNORE
elsewhere. The PRM, the policy's backbone with a new one-output token head, is trained with the
per-step binary cross-entropy (`temper.algorithms.process_reward.step_bce_loss`) through the
supervised trainer (micro-batching, data parallelism, resume). Step accuracy on held-out (test
split) completions is measured before training and every `eval_every` steps. The PRM is saved with
`save_pretrained` to `<out>/process_reward_model` (an `AutoModelForTokenClassification`, num_labels=1,
with the tokenizer); later stages keep starting from the policy (produces_model=False).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.algorithms.process_reward import IGNORE, step_bce_loss
from temper.atomic import atomic_write_json, atomic_write_text
from temper.data.chat import prompt_ids
from temper.data.dataset import Sequence, collate
from temper.lazy import no_grad
from temper.models import save_model
from temper.rewards.process_reward_model import (
    PROCESS_REWARD_MODEL_DIR,
    process_model_from,
    step_token_ends,
    token_labels,
)
from temper.rollout import HFSampler, Sampler
from temper.stages.base import (
    Loc,
    StageError,
    StageKind,
    Strict,
    epoch_steps,
    epochs_rule,
    length,
    raise_located,
    train_rules,
)
from temper.tasks.base import Task
from temper.tasks.steps import STEP_LABELLERS, label_steps
from temper.train.objective import NextToken
from temper.train.supervised import TrainConfig, train_supervised

if TYPE_CHECKING:  # imported where used: importing this module stays cheap
    import torch

    pass


console = Console(stderr=True)


class StepDataSpec(Strict):
    """Step-labelled completions sampled from the starting model on built-in tasks."""

    tasks: list[str]
    """Tasks with a step verifier (general_points)."""
    prompts_per_task: int = Field(256, gt=0)
    """Train-split prompts per task."""
    eval_prompts: int = Field(64, ge=0)
    """Test-split prompts per task for the held-out step accuracy; 0: none."""
    k: int = Field(8, ge=1)
    """Completions sampled per prompt."""
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    seed: int = 0


class ProcessRewardModelStage(Strict):
    kind: Literal["process_reward_model"]
    name: str = "process_reward_model"
    data: StepDataSpec
    labels: Literal["steps", "outcome"] = "steps"
    """steps: a label at every step's last token (the PRM); outcome: only the final token, labelled
    with the verifier's grade of the whole completion (an outcome reward model trained on the same
    samples, the same head and the same loss: the ORM baseline of Lightman et al. 2023 section 3)."""
    max_len: int = Field(256, gt=1)
    """Prompt + completion tokens; a longer completion is dropped (counted), never cut: its last steps would lose their labels."""
    train: TrainConfig = TrainConfig(max_steps=200, batch_size=32, lr=3e-4, warmup_steps=10)
    source: str | None = None
    """Stage whose model to start from; default: the latest that produced a model."""

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        return epochs_rule(data)

    @model_validator(mode="after")
    def _check(self) -> ProcessRewardModelStage:
        errors: list[tuple[Loc, str]] = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        for i, task in enumerate(self.data.tasks):
            if task not in STEP_LABELLERS:
                errors.append(
                    (
                        ("data", "tasks", i),
                        f"{task!r} has no step verifier; one of: {', '.join(STEP_LABELLERS)}",
                    )
                )
        raise_located(errors)
        return self


def step_items(
    sampler: Sampler,
    tokenizer,
    task: Task,
    split: str,
    n: int,
    *,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    max_len: int,
    labels: Literal["steps", "outcome"] = "steps",
) -> tuple[list[Sequence], list[dict[str, Any]], dict[str, Any]]:
    """(sequences with a label at each step's last token, one readable row per completion, counts)
    from `n` prompts of `task`'s `split`, k completions each. With `labels="outcome"` only the last
    token is labelled: 1 when the task grades the completion correct, else 0."""
    problems = task.sample(split, n, seed)
    prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
    groups = sampler.sample(prompts, k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    items, rows = [], []
    reasons, counted, dropped, correct, right = Counter(), Counter(), 0, 0, 0
    for problem, prompt, group in zip(problems, prompts, groups, strict=True):
        for s in group:
            spans, steps = label_steps(task, problem, s.text)
            ends = step_token_ends(tokenizer, s.token_ids, spans)
            correct += all(st.label == 1 for st in steps)
            outcome = task.score(problem, s.text).correct
            right += outcome
            if len(prompt) + len(s.token_ids) > max_len:
                dropped += 1
                continue
            reasons.update(st.reason for st in steps)
            if labels == "steps":
                per_token = token_labels(ends, [st.label for st in steps], len(s.token_ids))
            else:
                per_token = token_labels(ends[-1:], [int(outcome)], len(s.token_ids))
            counted.update("good" if x else "bad" for x in per_token if x != IGNORE)
            ids = prompt + s.token_ids
            items.append(Sequence(ids, [IGNORE] * len(prompt) + per_token, list(range(len(ids)))))
            rows.append(
                {
                    "problem": problem.id,
                    "completion": s.text,
                    "steps": [
                        [s.text[sp.start : sp.end], st.label, st.reason] for sp, st in zip(spans, steps)
                    ],
                }
            )
    counts = {
        "prompts": len(problems),
        "completions": len(problems) * k,
        "dropped_too_long": dropped,
        "good_steps": counted["good"],
        "bad_steps": counted["bad"],
        "reasons": dict(reasons),
        "all_steps_good_share": correct / max(len(problems) * k, 1),
        "accuracy": right / max(len(problems) * k, 1),
    }
    return items, rows, counts


@no_grad
def step_metrics(model, items: list[Sequence], pad_id: int, batch_size: int = 32) -> dict[str, float]:
    """Held-out per-step accuracy (sigma(z) > 1/2 vs the label), balanced accuracy (the mean of
    the good steps' and the bad steps' accuracies: 1/2 for any constant guess, however skewed the
    labels), mean BCE, and the good share (what always guessing "good" scores)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hits, bce, n, good, good_hits = 0, 0.0, 0, 0, 0
    for i in range(0, len(items), batch_size):
        batch = {k: v.to(device) for k, v in collate(items[i : i + batch_size], pad_id).items()}
        labels = batch.pop("labels")
        z = model(**batch, use_cache=False).logits[..., 0]
        mask = labels != IGNORE
        zs, ys = z[mask].float(), labels[mask].float()
        hits += int(((zs > 0).float() == ys).sum())
        good_hits += int(((zs > 0) & (ys == 1)).sum())
        bce += float(step_bce_loss(z, labels) * mask.sum())
        n += int(mask.sum())
        good += int(ys.sum())
    model.train(was_training)
    bad, bad_hits = n - good, hits - good_hits
    nan = float("nan")  # no labelled step, or no step of one class: no such accuracy
    return {
        "step_accuracy": hits / n if n else nan,
        "balanced_accuracy": (good_hits / good + bad_hits / bad) / 2 if good and bad else nan,
        "step_bce": bce / n if n else nan,
        "steps": n,
        "good_share": good / n if n else nan,
    }


def _loss(logits_B_T_1: torch.Tensor, labels_B_T: torch.Tensor, n: int) -> torch.Tensor:
    return step_bce_loss(logits_B_T_1[..., 0], labels_B_T, n)


def run(stage: ProcessRewardModelStage, job) -> Path:
    from temper.stages.loading import load_chat_model, whole_model

    ctx, out = job.ctx, job.out
    source = whole_model(job.source, "a process reward model (its backbone is the policy's)")
    tokenizer, policy = load_chat_model(source, ctx)
    spec = stage.data
    policy.eval()
    sampler = HFSampler(policy, tokenizer)

    def generate() -> tuple[list[Sequence], list[Sequence], dict[str, Any]]:
        train, held_out, counts, shown = [], [], {}, []
        for name in spec.tasks:
            for split, n, into in (
                ("train", spec.prompts_per_task, train),
                ("test", spec.eval_prompts, held_out),
            ):
                if not n:
                    continue
                items, rows, c = step_items(
                    sampler,
                    tokenizer,
                    ctx.tasks[name],
                    split,
                    n,
                    k=spec.k,
                    temperature=spec.temperature,
                    max_new_tokens=spec.max_new_tokens,
                    seed=spec.seed,
                    max_len=stage.max_len,
                    labels=stage.labels,
                )
                into += items
                counts[f"{name}/{split}"] = c
                shown += rows[: 4 * spec.k] if split == "train" else []
                console.print(
                    f"process_reward_model ({split}): {name}: {len(items)} completions, {c['good_steps']} good / "
                    f"{c['bad_steps']} bad steps labelled, {c['dropped_too_long']} too long; "
                    f"{100 * c['all_steps_good_share']:.0f}% with every step good, {100 * c['accuracy']:.1f}% correct"
                )
        atomic_write_text(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in shown))
        return train, held_out, counts

    train, held_out, counts = distributed.on_main(generate)
    if not any(label != IGNORE for s in train for label in s.labels):
        raise StageError(f"process_reward_model: no labelled step from {spec.tasks} (see the counts above)")
    model = process_model_from(source, tokenizer.pad_token_id)
    config = epoch_steps(stage.train, len(train), "process_reward_model")
    evals: list[dict[str, Any]] = []
    if held_out:
        evals.append({"step": 0, **step_metrics(model, held_out, tokenizer.pad_token_id)})
        console.print(
            f"process_reward_model: before training, held-out step accuracy {evals[0]['step_accuracy']:.3f}"
        )

    def on_step(step: int, row: dict[str, Any]) -> None:
        if held_out and (step == config.max_steps or (config.eval_every and step % config.eval_every == 0)):
            evals.append({"step": step, **step_metrics(model, held_out, tokenizer.pad_token_id)})

    objective = NextToken(tokenizer.pad_token_id, loss_fn=_loss)
    result = train_supervised(model, train, config, out, objective=objective, callbacks=[on_step])
    saved = save_model(model, tokenizer, out / PROCESS_REWARD_MODEL_DIR)
    if distributed.is_main():
        final = evals[-1] if evals else {}
        atomic_write_json(
            out / "process_reward_model.json",
            {
                "data": {
                    "sequences": len(train),
                    "held_out": len(held_out),
                    "labelled_steps": sum(label != IGNORE for s in train for label in s.labels),
                },
                "generated": counts,
                "steps": result.steps,
                "final_loss": result.final_loss,
                "eval_loss": final.get("step_bce"),
                "step_accuracy": final.get("step_accuracy"),
                "held_out_evals": evals,
                "seconds": result.seconds,
                "tokens": result.tokens,
                "precision": result.precision,
            },
        )
        if evals:
            console.print(
                f"process_reward_model: held-out step accuracy {evals[0]['step_accuracy']:.3f} -> "
                f"{final['step_accuracy']:.3f} (good share {final['good_share']:.3f}, BCE {final['step_bce']:.3f})"
            )
    return saved


def describe(stage: ProcessRewardModelStage, recipe: Any) -> str:
    d = stage.data
    what = "steps labelled by the verifier" if stage.labels == "steps" else "outcome labels only (an ORM)"
    return f"process reward model on {d.tasks}: {d.prompts_per_task} prompts x {d.k} samples, {what}, {length(stage.train)}"


def summary(out: Path) -> str:
    path = out / "process_reward_model.json"
    if not path.is_file():
        return ""
    s = json.loads(path.read_text())
    ev = s.get("held_out_evals") or []
    if len(ev) < 1 or not math.isfinite(ev[-1].get("step_accuracy", math.nan)):
        return f"process reward model: {s.get('steps')} steps, no held-out steps"
    return (
        f"process reward model: held-out step accuracy {ev[0]['step_accuracy']:.3f} -> {ev[-1]['step_accuracy']:.3f} "
        f"(good share {ev[-1]['good_share']:.3f})"
    )


KIND = StageKind(
    name="process_reward_model",
    spec=ProcessRewardModelStage,
    run=run,
    describe=describe,
    reads="model",
    produces_model=False,
    help="process reward model: a per-step scorer trained on step labels from the task's verifier",
    outputs=("process_reward_model.json", "steps.jsonl"),
    tasks=lambda spec: list(spec.data.tasks),
    summary=summary,
    order=22,
    exports=PROCESS_REWARD_MODEL_DIR,  # what rl's `train.process_reward_model: <this stage>` reads
)
