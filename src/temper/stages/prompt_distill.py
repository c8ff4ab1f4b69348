"""The prompt distillation stage: internalize a long instruction so it no longer needs to be in the prompt.

The teacher reads each train prompt with the instruction as a system turn and samples a
completion; the student, starting from the stage's source model, reads the same prompt without the
instruction and is trained on those completions to match the teacher's whole next-token
distribution at every completion token (`algorithms.distill.forward_kl_loss`, the forward KL on the
teacher's samples). Context distillation: Askell et al. 2021, "A General Language Assistant as a
Laboratory for Alignment" §3.3 (a prompt distilled into the weights); Snell et al. 2022, "Learning
by Distilling Context" (the same model with and without the context as teacher and student).

The teacher is by default the starting model itself, frozen (self-distillation of the context), or
any model sharing the student's tokenizer (`teacher: <stage or folder>`): the KL compares the two
models' distributions over the same token ids.

Before and after training the stage measures the greedy accuracy on `eval_problems` held-out
problems of each task, with and without the instruction (`prompt_distill.json`, the summary table):
for a task whose grade is obeying the instruction (`instructed_arithmetic`) that is the
instruction-following rate. Training is the supervised loop's (`temper.train.supervised`) with the
`temper.train.prompt_distill.PromptDistill` objective: an interrupted stage resumes from its newest
checkpoint (`train.save_every`), the teacher's samples drawn again (seeded: the same ones).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text
from temper.data.chat import prompt_ids
from temper.envs.base import EnvTask
from temper.models import load_model, save_trained
from temper.rollout import HFSampler
from temper.rollout.sampler import derive_seed
from temper.stages.base import StageError, StageKind, Strict, length, raise_located, train_rules
from temper.stages.context import StageContext
from temper.stages.loading import load_chat_model
from temper.stages.rl import greedy_eval
from temper.stages.teachers import load_frozen_teacher
from temper.tasks.base import Problem, Score, Task, grade_batch
from temper.train.prompt_distill import Pair, PromptDistill
from temper.train.supervised import TrainConfig, train_supervised

console = Console(stderr=True)


class PromptDistillStage(Strict):
    kind: Literal["prompt_distill"]
    name: str = "prompt_distill"
    tasks: list[str]
    """Tasks whose train-split prompts (as the student sees them, without the instruction) are used."""
    system: str
    """The instruction: the teacher reads it as a system turn before each prompt, the student never."""
    teacher: str | None = None
    """The model that reads the instruction (an earlier stage, a folder or a hub id; its tokenizer
    must be the student's). Unset: the starting model itself, frozen."""
    prompts: int = Field(512, ge=1)
    """Train-split problems, split evenly over the tasks."""
    k: int = Field(1, ge=1)
    """Teacher samples per prompt."""
    temperature: float = Field(1.0, gt=0)
    """The teacher's sampling temperature (the KL itself is at temperature 1)."""
    max_new_tokens: int = Field(32, gt=0)
    eval_problems: int = Field(200, gt=0)
    """Held-out test problems per task for the greedy accuracy before and after, with and without the instruction."""
    train: TrainConfig = TrainConfig(max_steps=100)
    seed: int = 0
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""

    @model_validator(mode="after")
    def _check(self) -> PromptDistillStage:
        errors = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        if self.train.epochs is not None:
            errors.append(
                (("train", "epochs"), "prompt_distill counts optimizer steps: give train.max_steps")
            )
        if not self.tasks:
            errors.append((("tasks",), "a prompt_distill stage needs at least one task"))
        if not self.system.strip():
            errors.append((("system",), "the instruction to distill is empty"))
        raise_located(errors)
        return self


def with_system(messages: list[dict[str, Any]], system: str) -> list[dict[str, Any]]:
    """`messages` with `system` as the first turn (before a system turn the task already has)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{system}\n\n{messages[0]['content']}"}] + messages[1:]
    return [{"role": "system", "content": system}] + messages


@dataclass(frozen=True)
class Instructed:
    """A task whose prompts carry the instruction (for the accuracy with it); graded as the task."""

    task: Task
    system: str

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [
            replace(p, chat=with_system(p.messages(), self.system)) for p in self.task.sample(split, n, seed)
        ]

    def score_batch(
        self,
        problems: Sequence[Problem],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Score]:
        """Graded as the task grades: a batch at once when it can (`BatchScored`), else one by one.
        Declared here, not left to `__getattr__`: `isinstance` against a protocol does not look
        through `__getattr__` on Python 3.12+, so `grade_batch` would grade a batch task's
        completions one by one."""
        return grade_batch(self.task, problems, completions, completion_ids)

    def __getattr__(self, name: str) -> Any:  # score, name, ...: the task's own
        return getattr(self.task, name)


def _problems(tasks: dict[str, Task], n: int, seed: int) -> list[tuple[str, Problem]]:
    out = []
    for i, (name, task) in enumerate(tasks.items()):
        count = n // len(tasks) + (i < n % len(tasks))
        out += [(name, p) for p in task.sample("train", count, derive_seed(seed, i))]
    return out


def accuracy(
    model, tokenizer, tasks: dict[str, Task], stage: PromptDistillStage
) -> dict[str, dict[str, float]]:
    """Greedy accuracy per task on the held-out problems, without and with the instruction."""
    sampler = HFSampler(model, tokenizer)
    out = {}
    for mode, view in (
        ("without", tasks),
        ("with", {n: Instructed(t, stage.system) for n, t in tasks.items()}),
    ):
        evals = greedy_eval(sampler, tokenizer, view, stage.eval_problems, stage.max_new_tokens)
        out[mode] = {name: evals[f"{name}/accuracy"] for name in tasks}
    return out


def teacher_samples(
    teacher, tokenizer, tasks: dict[str, Task], stage: PromptDistillStage, out: Path
) -> tuple[list[Pair], float, dict[str, float]]:
    """The teacher's samples on the train prompts (with the instruction) as student `Pair`s, its
    graded accuracy on them and the mean prompt lengths with and without it; `samples.jsonl`."""
    drawn = _problems(tasks, stage.prompts, stage.seed)
    students = [prompt_ids(tokenizer, p.messages()) for _, p in drawn]
    teachers = [prompt_ids(tokenizer, with_system(p.messages(), stage.system)) for _, p in drawn]
    groups = HFSampler(teacher, tokenizer).sample(
        teachers,
        stage.k,
        max_new_tokens=stage.max_new_tokens,
        temperature=stage.temperature,
        seed=derive_seed(stage.seed, 7919),
    )
    pairs, lines, obeyed = [], [], 0
    for (name, problem), t_prompt, s_prompt, samples in zip(drawn, teachers, students, groups, strict=True):
        scores = grade_batch(
            tasks[name], [problem] * len(samples), [s.text for s in samples], [s.token_ids for s in samples]
        )
        for s, score in zip(samples, scores, strict=True):
            obeyed += score.correct
            if s.token_ids:
                pairs.append(Pair(t_prompt, s_prompt, list(s.token_ids)))
                lines.append(
                    json.dumps(
                        {"task": name, "problem": problem.id, "text": s.text, "correct": score.correct}
                    )
                )
    atomic_write_text(out / "samples.jsonl", "".join(line + "\n" for line in lines))
    lengths = {
        "with": sum(map(len, teachers)) / len(teachers),
        "without": sum(map(len, students)) / len(students),
    }
    return pairs, obeyed / (len(drawn) * stage.k), lengths


def run_prompt_distill(stage: PromptDistillStage, ctx: StageContext, source: Path | str, out: Path) -> Path:
    began = time.perf_counter()
    tasks = {name: ctx.tasks[name] for name in stage.tasks}
    if envs := [n for n, t in tasks.items() if isinstance(t, EnvTask)]:
        raise StageError(f"prompt_distill: {envs} are environment tasks; it distills single-turn prompts")
    tokenizer, student = load_chat_model(source, ctx)
    if stage.teacher:
        teacher = load_frozen_teacher(
            ctx,
            stage.teacher,
            tokenizer,
            source,
            "prompt_distill",
            "The student matches the teacher's next-token distribution over the same ids at every token",
        )
    else:  # the starting model reading the instruction: a frozen copy
        teacher = load_model(source).eval().requires_grad_(False)
    student.eval()
    # sampling and greedy evaluation on the main process; every process trains its share
    before = distributed.on_main(accuracy, student, tokenizer, tasks, stage)
    teacher_acc = distributed.on_main(accuracy, teacher, tokenizer, tasks, stage) if stage.teacher else before
    if distributed.is_main():
        console.print(
            f"prompt_distill: before, greedy accuracy without the instruction {before['without']}, with it {before['with']}"
        )
    pairs, sample_accuracy, prompt_tokens = distributed.on_main(
        teacher_samples, teacher, tokenizer, tasks, stage, out
    )
    if not pairs:
        raise StageError("prompt_distill: every teacher sample was empty: nothing to distill")

    objective = PromptDistill(teacher, tokenizer.pad_token_id)
    result = train_supervised(student, pairs, stage.train, out, objective=objective)
    student.eval()
    after = distributed.on_main(accuracy, student, tokenizer, tasks, stage)
    window = min(10, len(result.losses))
    summary = {
        "teacher": stage.teacher or "start (frozen)",
        "system_chars": len(stage.system),
        "prompt_tokens": prompt_tokens,
        "samples": len(pairs),
        "teacher_sample_accuracy": sample_accuracy,
        "steps": result.steps,
        "kl_first": sum(result.losses[:window]) / window,
        "kl_last": sum(result.losses[-window:]) / window,
        "teacher_accuracy": teacher_acc,
        "before": before,
        "after": after,
        # the whole stage's, with the training seconds before a resume
        "seconds": time.perf_counter() - began + result.earlier_seconds,
    }
    if distributed.is_main():
        atomic_write_json(out / "prompt_distill.json", summary)
        console.print(
            f"prompt_distill: after, greedy accuracy without the instruction {after['without']}, with it {after['with']}"
        )
    return save_trained(student, tokenizer, out / "model")


def prompt_distill_table(out: Path) -> str:
    """Greedy accuracy per task, with and without the instruction, before and after (printed after the stage)."""
    s = json.loads((out / "prompt_distill.json").read_text())
    lines = [f"{'task':<24} {'instruction':>11} {'teacher':>8} {'before':>7} {'after':>7}"]
    for mode in ("without", "with"):
        for task, acc in s["before"][mode].items():
            lines.append(
                f"{task:<24} {mode:>11} {100 * s['teacher_accuracy'][mode][task]:>7.1f}% "
                f"{100 * acc:>6.1f}% {100 * s['after'][mode][task]:>6.1f}%"
            )
    lines.append(
        f"KL to the teacher (nats/token): {s['kl_first']:.3f} (first steps) -> {s['kl_last']:.3f} (last)"
    )
    return "\n".join(lines)


def describe(stage: PromptDistillStage, recipe: Any) -> str:
    teacher = stage.teacher or "the starting model (frozen)"
    return (
        f"prompt_distill on {stage.tasks}: {stage.prompts} prompts x {stage.k} samples from {teacher} with a "
        f"{len(stage.system)}-character instruction, student without it, {length(stage.train)} of forward KL"
    )


KIND = StageKind(
    name="prompt_distill",
    spec=PromptDistillStage,
    run=lambda stage, job: run_prompt_distill(stage, job.ctx, job.source, job.out),
    describe=describe,
    reads="model",
    produces_model=True,
    help="prompt distillation: match the teacher-with-instruction's token distributions without the instruction",
    outputs=("prompt_distill.json", "samples.jsonl"),
    tasks=lambda stage: stage.tasks,
    uses=lambda stage: [(("teacher",), stage.teacher)] if stage.teacher else [],
    summary=prompt_distill_table,
    order=36,
)
