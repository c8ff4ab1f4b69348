"""The rejection-sampling fine-tuning stage (STaR / RFT): sample, keep the verified, fine-tune, repeat.

Each round samples `k` completions of `prompts` train-split problems from the current model,
keeps the completions the task's verifier grades correct (`tasks.base.grade_batch`, the grader
of eval and RL), removes duplicates (optionally keeping only the shortest correct per prompt),
and fine-tunes on them as chat demonstrations with the SFT trainer (`train.supervised`); the
next round samples from the model that round produced.

- STaR: Zelikman et al. 2022, "STaR: Bootstrapping Reasoning With Reasoning" (rationales kept
  only when they reach the right answer; rounds restart from the base on the union of the data:
  `accumulate: true` trains on every round's samples so far, here from the previous model).
- RFT: Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning with Large
  Language Models" §3 (k samples per question, distinct correct reasoning paths kept).

CoT distillation (`teacher: <stage or folder>`): the samples come from a frozen teacher instead of
the current model, every round, and the student is fine-tuned on the teacher's verified solutions
(with their reasoning, whatever the teacher writes before the answer line): Hinton et al. 2015's
distillation on sequences (Kim & Rush 2016, "Sequence-Level Knowledge Distillation"), filtered by
the verifier as in Ho et al. 2023, "Large Language Models Are Reasoning Teachers" (only the
teacher's correct rationales are kept). The teacher must share the student's tokenizer: prompts
are rendered, and `max_new_tokens` and `keep: shortest` are counted, with the student's tokens.

Per round the stage records the yield (share of prompts with at least one correct sample), the
data size and the greedy accuracy on held-out test problems (`rl.greedy_eval`, the numbers the RL
stage logs), in `rft.json` and the report's per-round table. Each round lives in `round-NN/`
(its `data.jsonl`, metrics, checkpoints and `model/`); `round.json` marks it complete, so an
interrupted stage restarts at the round it was in (and that round's trainer at its newest
checkpoint, when `train.save_every` wrote one).
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper import distributed
from temper.atomic import atomic_write_json, atomic_write_text
from temper.data import contamination
from temper.data.chat import prompt_ids
from temper.data.dataset import build_sequences
from temper.data.formats import Example
from temper.envs.base import EnvTask
from temper.models import load_model, save_trained
from temper.models.chat import eos_ids
from temper.rollout import Sampler
from temper.rollout.sampler import derive_seed
from temper.stages.base import (
    StageError,
    StageKind,
    Strict,
    epoch_steps,
    epochs_rule,
    length,
    raise_located,
    train_rules,
)
from temper.stages.context import StageContext
from temper.stages.loading import load_chat_model
from temper.stages.rl import greedy_eval
from temper.stages.sampling import SamplerKind, sampler_rules, stage_sampler
from temper.stages.teachers import checked_teacher
from temper.tasks.base import Problem, Task, grade_batch
from temper.train.objective import NextToken
from temper.train.supervised import TrainConfig, train_supervised

console = Console(stderr=True)


class RFTStage(Strict):
    kind: Literal["rft"]
    name: str = "rft"
    tasks: list[str]
    """Tasks whose train-split problems are sampled (split evenly among them)."""
    rounds: int = Field(3, ge=1)
    """Sample -> filter -> fine-tune rounds; each samples from the previous round's model."""
    prompts: int = Field(256, ge=1)
    """Train-split problems sampled per round (new problems each round)."""
    k: int = Field(8, ge=1)
    """Samples per prompt."""
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(64, gt=0)
    keep: Literal["all", "shortest"] = "all"
    """all: every distinct correct completion of a prompt; shortest: only its shortest correct one
    (fewest tokens), a pressure towards short answers."""
    max_per_prompt: int = Field(0, ge=0)
    """With keep: all, at most this many distinct correct completions per prompt (the shortest
    first); 0 = no cap."""
    accumulate: bool = False
    """Train each round on the kept samples of every round so far (STaR's union), not only its own."""
    eval_problems: int = Field(200, gt=0)
    """Held-out test problems per task for the greedy accuracy of each round."""
    max_len: int = Field(192, gt=1)
    train: TrainConfig = TrainConfig(max_steps=100)
    """The SFT settings of every round (`epochs` counts passes over that round's data)."""
    seed: int = 0
    source: str | None = None
    """Stage whose model to start from; default: the latest stage that produced a model."""
    teacher: str | None = None
    """CoT distillation: a frozen model (an earlier stage's name, a folder or a hub id) that writes
    the samples of every round instead of the student; its tokenizer must be the student's.
    Unset: the student samples itself (STaR/RFT)."""

    # the sampler's settings are left out of the hash at their defaults: rft stages recorded
    # before they existed stay complete (and where a server listens changes no output)
    sampler: SamplerKind = Field("hf", exclude_if=lambda v: v == "hf")
    """Generation backend of the rounds' samples and greedy accuracies: hf (transformers in this
    process), vllm (a vLLM engine in this process) or vllm_server (an OpenAI-compatible vLLM
    server on 127.0.0.1, or `server_url`'s); docs/vllm.md. The engine serves the student and is
    synced after every round's training; with a `teacher` it serves the teacher (frozen, never
    synced) and the student's accuracies are measured with hf."""
    server_url: str | None = None
    """With sampler: vllm_server, a running vLLM server to use instead of starting one (rl's)."""
    vllm_check_sync: float | None = Field(None, gt=0)
    """With a vLLM sampler: after each sync, compare the engine's logprobs with the model's and
    stop past this absolute difference (rl's `vllm_check_sync`)."""

    HASHED_WHEN_SET: ClassVar[tuple[str, ...]] = ("teacher",)
    UNHASHED: ClassVar[tuple[str, ...]] = ("server_url", "vllm_check_sync")

    @model_validator(mode="before")
    @classmethod
    def _one_length(cls, data: Any) -> Any:
        return epochs_rule(data)

    @model_validator(mode="after")
    def _check(self) -> RFTStage:
        errors = [(("train", *loc), msg) for loc, msg in train_rules(self.train)]
        if not self.tasks:
            errors.append((("tasks",), "an rft stage needs at least one task"))
        if self.max_per_prompt and self.keep == "shortest":
            errors.append((("max_per_prompt",), "keep: shortest keeps one per prompt already"))
        errors += sampler_rules(self.sampler, self.server_url, self.vllm_check_sync)
        raise_located(errors)
        return self


@dataclass(frozen=True)
class Candidate:
    """One graded sample of a prompt."""

    text: str
    tokens: int
    correct: bool


def keep_correct(candidates: list[Candidate], keep: str = "all", max_per_prompt: int = 0) -> list[Candidate]:
    """The verified-correct candidates of one prompt, duplicates (equal text) removed, shortest
    first (fewest tokens, then text, so ties are broken the same way every run); with
    keep="shortest" only the first, with `max_per_prompt` at most that many."""
    distinct: dict[str, Candidate] = {}
    for c in candidates:
        if c.correct and c.text.strip() and c.text not in distinct:
            distinct[c.text] = c
    ordered = sorted(distinct.values(), key=lambda c: (c.tokens, c.text))
    if keep == "shortest":
        return ordered[:1]
    return ordered[:max_per_prompt] if max_per_prompt else ordered


def round_problems(tasks: dict[str, Task], n: int, seed: int, round_index: int) -> list[tuple[str, Problem]]:
    """`n` train-split problems for a round, split evenly over the tasks: a pure function of (seed,
    round), so a restarted round samples the same problems."""
    out = []
    for i, (name, task) in enumerate(tasks.items()):
        count = n // len(tasks) + (i < n % len(tasks))
        out += [(name, p) for p in task.sample("train", count, derive_seed(seed, round_index, i))]
    return out


def sample_round(
    sampler: Sampler, tokenizer, tasks: dict[str, Task], stage: RFTStage, round_index: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Sample and grade one round -> (kept rows {task, problem, messages}, counts)."""
    drawn = round_problems(tasks, stage.prompts, stage.seed, round_index)
    prompts = [prompt_ids(tokenizer, p.messages()) for _, p in drawn]
    groups = sampler.sample(
        prompts,
        stage.k,
        max_new_tokens=stage.max_new_tokens,
        temperature=stage.temperature,
        seed=derive_seed(stage.seed, round_index, 7919),
    )
    rows: list[dict[str, Any]] = []
    solved = correct = 0
    for (name, problem), samples in zip(drawn, groups, strict=True):
        scores = grade_batch(
            tasks[name], [problem] * len(samples), [s.text for s in samples], [s.token_ids for s in samples]
        )
        graded = [
            Candidate(s.text, len(s.token_ids), sc.correct) for s, sc in zip(samples, scores, strict=True)
        ]
        correct += sum(c.correct for c in graded)
        solved += any(c.correct for c in graded)
        for c in keep_correct(graded, stage.keep, stage.max_per_prompt):
            messages = problem.messages() + [{"role": "assistant", "content": c.text}]
            rows.append({"task": name, "problem": problem.id, "messages": messages})
    counts = {
        "prompts": len(drawn),
        "samples": len(drawn) * stage.k,
        "correct_samples": correct,
        "yield": solved / len(drawn),
        "kept": len(rows),
    }
    return rows, counts


def _examples(rows: list[dict[str, Any]], source: str) -> list[Example]:
    return [Example(source=source, line=i + 1, messages=r["messages"]) for i, r in enumerate(rows)]


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _accuracy(sampler: Sampler, tokenizer, tasks: dict[str, Task], stage: RFTStage) -> dict[str, float]:
    evals = greedy_eval(sampler, tokenizer, tasks, stage.eval_problems, stage.max_new_tokens)
    accs = [v for k, v in evals.items() if k.endswith("/accuracy")]
    parses = [v for k, v in evals.items() if k.endswith("/parse_rate")]
    return {"accuracy": sum(accs) / len(accs), "parse_rate": sum(parses) / len(parses), "by_task": evals}


def round_dir(out: Path, r: int) -> Path:
    return out / f"round-{r:02d}"


def run_rft(stage: RFTStage, ctx: StageContext, source: Path | str, out: Path) -> Path:
    """Rounds 1..R (round 0 is the starting model's accuracy); resumes after the last complete round."""
    with ExitStack() as owned:  # an engine or a server the stage starts is closed when it ends
        return _run_rft(stage, ctx, source, out, owned)


def _run_rft(stage: RFTStage, ctx: StageContext, source: Path | str, out: Path, owned: ExitStack) -> Path:
    tasks = {name: ctx.tasks[name] for name in stage.tasks}
    if envs := [n for n, t in tasks.items() if isinstance(t, EnvTask)]:
        raise StageError(
            f"rft: {envs} are environment tasks (multi-turn episodes); rft samples single-turn tasks"
        )
    summary_path = out / "rft.json"
    previous = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    done = previous.get("rounds", [])[:1]  # round 0, then the rounds marked complete, in order
    for r in previous.get("rounds", [])[1:]:
        if not (round_dir(out, r["round"]) / "round.json").exists():
            break
        done.append(r)
    start_round = len(done) if done else 1
    model_source = round_dir(out, start_round - 1) / "model" if start_round > 1 else source
    tokenizer, model = load_chat_model(model_source, ctx)
    model.eval()
    teacher_source = None
    if stage.teacher:
        teacher_source = checked_teacher(
            ctx,
            stage.teacher,
            tokenizer,
            source,
            "rft",
            "Its samples are prompted, cut at max_new_tokens and kept by length in the student's tokens",
        )
    opened: dict[str, Sampler] = {}

    def sampler_of(who: str) -> Sampler:
        """The student's or the teacher's sampler, started on first use (a stage whose rounds are
        all complete starts none). With a teacher, the stage's backend serves the teacher."""
        if who not in opened:
            kind = stage.sampler if who == "teacher" or teacher_source is None else "hf"
            path = teacher_source if who == "teacher" else model_source
            loaded = model if who == "student" else None
            if who == "teacher" and kind == "hf":
                loaded = load_model(path).eval().requires_grad_(False)
            opened[who] = stage_sampler(
                kind,
                path,
                loaded,
                tokenizer,
                eos_ids(model, tokenizer),
                owned,
                server_url=stage.server_url,
                log_dir=out,
                check_sync=stage.vllm_check_sync,
            )
        return opened[who]

    rounds: list[dict[str, Any]] = done or [
        {"round": 0, **_accuracy(sampler_of("student"), tokenizer, tasks, stage)}
    ]
    summary = {"keep": stage.keep, "k": stage.k, "prompts": stage.prompts, "accumulate": stage.accumulate}
    if teacher_source is not None:  # CoT distillation: the teacher's own greedy accuracy, once
        summary["teacher"] = previous.get("teacher") or {
            "name": stage.teacher,
            **_accuracy(sampler_of("teacher"), tokenizer, tasks, stage),
        }
        console.print(f"rft: teacher {stage.teacher!r} greedy accuracy {summary['teacher']['accuracy']:.3f}")

    def write() -> None:
        if distributed.is_main():
            atomic_write_json(summary_path, summary | {"rounds": rounds})

    write()
    console.print(f"rft: round 0 (start) greedy accuracy {rounds[0]['accuracy']:.3f}")
    for r in range(start_round, stage.rounds + 1):
        folder = round_dir(out, r)
        folder.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        model.eval()
        data_path = folder / "data.jsonl"
        counts_path = folder / "sampled.json"
        if data_path.exists() and counts_path.exists():  # sampled before an interruption: same rows
            rows, counts = _read_rows(data_path), json.loads(counts_path.read_text())
        else:
            writer = "teacher" if teacher_source is not None else "student"  # CoT distillation
            rows, counts = sample_round(sampler_of(writer), tokenizer, tasks, stage, r)
            if distributed.is_main():
                atomic_write_text(data_path, "".join(json.dumps(row) + "\n" for row in rows))
                atomic_write_json(counts_path, counts)
        train_rows = rows
        if stage.accumulate:
            train_rows = [
                row for q in range(1, r) for row in _read_rows(round_dir(out, q) / "data.jsonl")
            ] + rows
        console.print(
            f"rft round {r}: yield {100 * counts['yield']:.0f}% of {counts['prompts']} prompts, "
            f"{counts['kept']} samples kept, training on {len(train_rows)}"
        )
        if not train_rows:
            raise StageError(
                f"rft round {r}: no prompt of {counts['prompts']} had a correct sample among {stage.k}: nothing to "
                "fine-tune on; raise k or temperature, or start from a model that solves some (more SFT)"
            )
        examples, counts["contamination"] = contamination.screen(
            _examples(train_rows, f"rft:round{r}"), ctx, f"rft round {r}"
        )
        if not examples:
            raise StageError(
                f"rft round {r}: every kept sample overlaps an eval set and was dropped (contamination)"
            )
        sequences, stats = build_sequences(tokenizer, examples, stage.max_len)
        config = epoch_steps(
            dataclasses.replace(stage.train, seed=stage.train.seed + r), len(sequences), f"rft round {r}"
        )
        result = train_supervised(
            model, sequences, config, folder, objective=NextToken(tokenizer.pad_token_id)
        )
        model.eval()
        save_trained(model, tokenizer, folder / "model")
        sampler_of("student").sync(model)  # a vLLM engine gets the round's weights (hf reads the model)
        rounds.append(
            {"round": r}
            | counts
            | {
                "data_size": len(examples),
                "supervised_tokens": stats.supervised_tokens,
                "truncated": stats.truncated,
                "steps": result.steps,
                "final_loss": result.final_loss,
            }
            | _accuracy(sampler_of("student"), tokenizer, tasks, stage)
            | {"seconds": time.perf_counter() - began + result.earlier_seconds}  # a resumed round: all of it
        )
        if distributed.is_main():
            atomic_write_json(folder / "round.json", rounds[-1])
        write()
        console.print(f"rft round {r}: greedy accuracy {rounds[-1]['accuracy']:.3f}")
    if start_round > stage.rounds:  # every round was complete: the last one's model is the stage's
        model = load_model(round_dir(out, stage.rounds) / "model")
    return save_trained(model, tokenizer, out / "model")


def rft_table(out: Path) -> str:
    """The per-round table (printed after the stage)."""
    summary = json.loads((out / "rft.json").read_text())
    rounds = summary["rounds"]
    lines = [f"{'round':>5}  {'yield':>6}  {'kept':>5}  {'data':>5}  {'accuracy':>8}  {'parse':>6}"]
    for r in rounds:
        y = f"{100 * r['yield']:.1f}%" if "yield" in r else "-"
        lines.append(
            f"{r['round']:>5}  {y:>6}  {r.get('kept', '-'):>5}  {r.get('data_size', '-'):>5}  "
            f"{100 * r['accuracy']:>7.1f}%  {100 * r['parse_rate']:>5.1f}%"
        )
    if teacher := summary.get("teacher"):
        lines.append(f"teacher {teacher['name']!r}: greedy accuracy {100 * teacher['accuracy']:.1f}%")
    return "\n".join(lines)


def describe(stage: RFTStage, recipe: Any) -> str:
    teacher = f", samples written by teacher {stage.teacher!r} (CoT distillation)" if stage.teacher else ""
    return (
        f"rft on {stage.tasks}: {stage.rounds} rounds x {stage.prompts} prompts x {stage.k} samples, "
        f"keep {stage.keep}, {length(stage.train)} per round{teacher}"
    )


def _uses(stage: RFTStage) -> list[tuple[tuple[str | int, ...], str]]:
    """The teacher, when there is one: retraining it reruns this stage."""
    return [(("teacher",), stage.teacher)] if stage.teacher else []


KIND = StageKind(
    name="rft",
    spec=RFTStage,
    run=lambda stage, job: run_rft(stage, job.ctx, job.source, job.out),
    describe=describe,
    reads="model",
    produces_model=True,
    help="rejection-sampling fine-tuning (STaR/RFT): sample k, keep the verified, SFT, repeat",
    outputs=("rft.json",),
    tasks=lambda stage: stage.tasks,
    uses=_uses,
    summary=rft_table,
    order=35,  # after rl: the R1 pipeline's rejection-sampling SFT follows reasoning RL
)
