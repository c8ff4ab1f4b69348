"""The constitutional stage: AI feedback data by critique and revision against written principles.

Constitutional AI's supervised phase (Bai et al. 2022, §3): the model answers a prompt, is asked
to critique its answer against a principle drawn from the constitution, then to revise the
answer in the light of the critique; the revisions are SFT data. Its RL phase learns from AI
preference labels; here (original, revision) becomes a preference pair with the revision chosen,
for DPO (RLAIF without a reward model, as Lee et al. 2023 also compare). The critic and reviser
is the stage's own model by default (`judge: {model: policy}`), or another model or an
OpenAI-compatible endpoint.

On built-in tasks a verifier exists, so the stage also measures what AI feedback is worth: the
judge grades every original and revision against its rubric, and `constitutional.json` reports
how often its verdict (>= 0.5) agrees with the verifier (95% interval, Cohen's kappa), the
verifier's accuracy of originals vs revisions, and the share of pairs whose chosen answer is
correct and rejected one wrong. Outputs, read by later stages as `data: {files: [...]}`:
`sft.jsonl` (TRL `messages`) and `pairs.jsonl` (TRL conversational `prompt`/`chosen`/`rejected`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from rich.console import Console

from temper.atomic import atomic_write_json, atomic_write_text
from temper.data.chat import prompt_ids
from temper.rewards.judge import JudgeSpec, agreement, spec_errors
from temper.rollout import HFSampler
from temper.stages.base import StageKind, Strict, raise_located
from temper.stages.judging import load_judge
from temper.stages.loading import load_chat_model
from temper.tasks.base import grade_batch

console = Console(stderr=True)

CRITIQUE = (
    "Critique the answer below against this principle: {principle}\n"
    "Say specifically what in the answer breaks the principle, if anything.\n\n"
    "[Question]\n{question}\n\n[Answer]\n{answer}\n\n[Critique]"
)
REVISE = (
    "Rewrite the answer so that it follows this principle: {principle}\n"
    "Use the critique. Reply with the revised answer only, in the same format as the original.\n\n"
    "[Question]\n{question}\n\n[Answer]\n{answer}\n\n[Critique]\n{critique}\n\n[Revised answer]"
)


class ConstitutionalStage(Strict):
    kind: Literal["constitutional"]
    name: str = "constitutional"
    tasks: list[str]
    """Tasks whose train-split prompts are answered, critiqued and revised."""
    principles: list[str]
    """The constitution: each response is critiqued and revised against one principle, drawn in turn."""
    prompts_per_task: int = Field(64, gt=0)
    judge: JudgeSpec = JudgeSpec()
    """Who critiques, revises and grades: the stage's model (policy, default), an earlier stage's
    model, a folder, or an endpoint ({url, model, api_key_env})."""
    critique_prompt: str = CRITIQUE
    """The critique request; {principle}, {question} and {answer} are filled in."""
    revision_prompt: str = REVISE
    """The revision request; {principle}, {question}, {answer} and {critique} are filled in."""
    keep: Literal["changed", "judged_better"] = "changed"
    """changed: every non-empty revision that differs from the original; judged_better: only those
    the judge grades above the original (both verdicts parsed)."""
    temperature: float = Field(1.0, ge=0)
    """Of the original responses (the critiques and revisions use the judge's)."""
    max_new_tokens: int = Field(64, gt=0)
    """Of the original responses and the revisions (the critiques use judge.max_new_tokens)."""
    seed: int = 0
    source: str | None = None
    """Stage whose model answers (and, with model: policy, judges); default: the latest model."""

    @model_validator(mode="after")
    def _check(self) -> ConstitutionalStage:
        errors = [(("judge", *loc), msg) for loc, msg in spec_errors(self.judge)]
        if not self.principles or not all(p.strip() for p in self.principles):
            errors.append((("principles",), "give at least one principle, none empty"))
        if not self.tasks:
            errors.append((("tasks",), "give at least one task"))
        for field, text, keys in (
            ("critique_prompt", self.critique_prompt, ("principle", "question", "answer")),
            ("revision_prompt", self.revision_prompt, ("principle", "question", "answer", "critique")),
        ):
            missing = [k for k in keys if "{" + k + "}" not in text]
            if missing:
                errors.append(((field,), f"must contain {', '.join('{' + k + '}' for k in missing)}"))
        raise_located(errors)
        return self


def run(stage: ConstitutionalStage, job: Any) -> Path:
    ctx, out = job.ctx, job.out
    tokenizer, model = load_chat_model(job.source, ctx)
    model.eval()
    sampler = HFSampler(model, tokenizer)
    judge = load_judge(stage.judge, ctx, sampler, tokenizer, stage.seed)
    sft, pairs, examples = [], [], []
    counts: Counter[str] = Counter()
    verdicts: list[float | None] = []
    correct: list[bool] = []
    originals_at: list[int] = []  # where the originals are among the judged responses
    per_task: dict[str, dict[str, Any]] = {}
    for name in stage.tasks:
        task = ctx.tasks[name]
        problems = task.sample("train", stage.prompts_per_task, stage.seed)
        originals = [
            g[0]
            for g in sampler.sample(
                [prompt_ids(tokenizer, p.messages()) for p in problems],
                1,
                max_new_tokens=stage.max_new_tokens,
                temperature=stage.temperature,
                seed=stage.seed,
            )
        ]
        answers = [s.text for s in originals]
        principles = [stage.principles[i % len(stage.principles)] for i in range(len(problems))]
        critiques = judge.complete(
            [
                _user(stage.critique_prompt.format(principle=c, question=p.prompt, answer=a))
                for p, a, c in zip(problems, answers, principles, strict=True)
            ]
        )
        revisions = [
            r.strip()
            for r in judge.complete(
                [
                    _user(stage.revision_prompt.format(principle=c, question=p.prompt, answer=a, critique=k))
                    for p, a, c, k in zip(problems, answers, principles, critiques, strict=True)
                ]
            )
        ]
        # the judge grades originals and revisions against its rubric; the verifier grades both
        judged = judge.grade([p.prompt for p in problems * 2], answers + revisions)
        values = [v.value for v in judged]
        scores = grade_batch(task, problems * 2, answers + revisions)
        n = len(problems)
        originals_at += range(len(verdicts), len(verdicts) + n)
        verdicts += values
        correct += [s.correct for s in scores]
        kept = 0
        for i, problem in enumerate(problems):
            original, revision = answers[i].strip(), revisions[i]
            why = _drop_reason(original, revision, values[i], values[n + i], stage.keep)
            counts[why] += 1
            if len(examples) < 8:
                examples.append(
                    {
                        "task": name,
                        "prompt": problem.prompt,
                        "principle": principles[i],
                        "original": original,
                        "critique": critiques[i],
                        "revision": revision,
                        "verdicts": [values[i], values[n + i]],
                        "judge_said": [judged[i].text, judged[n + i].text],
                        "correct": [scores[i].correct, scores[n + i].correct],
                        "kept": why == "kept",
                    }
                )
            if why != "kept":
                continue
            kept += 1
            sft.append({"messages": problem.messages() + [{"role": "assistant", "content": revision}]})
            pairs.append(
                {
                    "prompt": problem.messages(),
                    "chosen": [{"role": "assistant", "content": revision}],
                    "rejected": [{"role": "assistant", "content": original}],
                    "_verifier": [scores[n + i].correct, scores[i].correct],
                }
            )
        per_task[name] = {
            "prompts": n,
            "kept": kept,
            "original_accuracy": sum(s.correct for s in scores[:n]) / n,
            "revision_accuracy": sum(s.correct for s in scores[n:]) / n,
            "agreement": agreement(values, [s.correct for s in scores]),
            "agreement_originals": agreement(values[:n], [s.correct for s in scores[:n]]),
        }
    gold = [p.pop("_verifier") for p in pairs]
    atomic_write_text(out / "sft.jsonl", "".join(json.dumps(r) + "\n" for r in sft))
    atomic_write_text(out / "pairs.jsonl", "".join(json.dumps(r) + "\n" for r in pairs))
    summary = {
        "prompts": sum(t["prompts"] for t in per_task.values()),
        "pairs": len(pairs),
        "dropped": {k: v for k, v in counts.items() if k != "kept"},
        "agreement": agreement(verdicts, correct),  # originals and revisions
        "agreement_originals": agreement(
            [verdicts[i] for i in originals_at], [correct[i] for i in originals_at]
        ),
        "pair_quality": {  # the verifier's view of the AI-labelled pairs
            "chosen_correct_rejected_wrong": sum(c and not r for c, r in gold) / max(len(gold), 1),
            "chosen_wrong_rejected_correct": sum(r and not c for c, r in gold) / max(len(gold), 1),
        },
        "tasks": per_task,
        "judge": {"model": stage.judge.model, "url": stage.judge.url},
        "examples": examples,
    }
    atomic_write_json(out / "constitutional.json", summary)
    a = summary["agreement"]
    said = (
        f"{100 * a['agreement']:.0f}% [{100 * a['lo']:.0f}, {100 * a['hi']:.0f}] of {a['parsed']} parsed verdicts"
        + (f", kappa {a['kappa']:.2f}" if a["kappa"] is not None else "")
        if a["agreement"] is not None
        else "no parsed verdict"
    )
    console.print(
        f"constitutional: {len(pairs)} pairs / SFT rows from {summary['prompts']} prompts "
        f"(dropped: {', '.join(f'{k} {v}' for k, v in summary['dropped'].items()) or 'none'}); "
        f"judge vs verifier: {said}; {a['unparseable']} of {a['n']} verdicts unparseable"
    )
    return out


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _drop_reason(original: str, revision: str, before: float | None, after: float | None, keep: str) -> str:
    """Why a revision makes no pair ("kept" when it does)."""
    if not revision:
        return "empty_revision"
    if not original:
        return "empty_original"
    if revision == original:
        return "unchanged"
    if keep == "judged_better":
        if before is None or after is None:
            return "unparseable_verdict"
        if after <= before:
            return "not_judged_better"
    return "kept"


def describe(stage: ConstitutionalStage, recipe: Any) -> str:
    who = stage.judge.url or stage.judge.model
    return (
        f"constitutional: {stage.prompts_per_task} prompts x {stage.tasks}, critique + revision by {who} "
        f"against {len(stage.principles)} principles -> sft.jsonl, pairs.jsonl"
    )


KIND = StageKind(
    name="constitutional",
    spec=ConstitutionalStage,
    run=run,
    describe=describe,
    reads="model",
    produces_model=False,
    help="Constitutional AI data: critique and revise answers against principles -> SFT rows and DPO pairs",
    outputs=("constitutional.json", "pairs.jsonl", "sft.jsonl"),  # later stages' data: {files: ...} name them
    main_only=True,
    order=24,
)
