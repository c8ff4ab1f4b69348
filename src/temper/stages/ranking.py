"""How a stage ranks samples for best-of-N (the eval stage's `best_of_n`, the sft stage's
`data.best_of_n`): by the task's verifier or by a reward model that an earlier `reward_model`
stage saved (named by that stage) or a folder saved by one (relative to the recipe's folder);
and `generate_best_of_n`, best-of-N as an SFT data generator.

The reward model is a `temper.rewards.reward_model.RewardModel`; it scores the policy's token
ids, so it must share the policy's tokenizer (`load_ranker` checks the vocabularies). A stage
that ranks by one declares it in its kind's `uses` (`reward_model_use`): the recipe checks the
name and the stage hash covers the reward model's files, so a retrained reward model reruns it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from temper.rewards.best_of_n import Ranker, best_index
from temper.stages.base import Loc, StageError, Strict, Use, raise_located
from temper.stages.context import StageContext
from temper.tasks.base import Task, grade_batch

Rank = Literal["verifier", "reward_model"]


class Ranked(Strict):
    """The ranking fields a best-of-N block has."""

    rank: Rank = "verifier"
    """verifier: the task's grade (correct first); reward_model: the scores of `reward_model`."""
    reward_model: str | None = None
    """With rank: reward_model, an earlier reward_model stage's name or a folder saved by one."""

    @model_validator(mode="after")
    def _one_ranker(self) -> Ranked:
        if self.rank == "reward_model" and self.reward_model is None:
            raise_located(
                [
                    (
                        ("reward_model",),
                        "rank: reward_model needs a reward model: an earlier reward_model stage's name or "
                        "a folder saved by one",
                    )
                ]
            )
        if self.rank == "verifier" and self.reward_model is not None:
            raise_located(
                [
                    (
                        ("reward_model",),
                        f"{self.reward_model!r} is never used: rank is verifier (set rank: reward_model to rank by it)",
                    )
                ]
            )
        return self


def reward_model_use(name: str | None, loc: Loc) -> list[Use]:
    """The `StageKind.uses` entry of a reward model named at `loc`: an earlier reward_model stage
    (its `<out>/reward_model`) or a folder saved by one. The recipe checks the name, and the stage
    hash covers the reward model's files, so a retrained reward model reruns the stage."""
    return [] if name is None else [(loc, name, "reward_model")]


def reward_model_dir(name: str, ctx: StageContext) -> Path:
    """The folder a reward-model reference means: an earlier stage's `<out>/reward_model`, else a
    path relative to the recipe's folder."""
    from temper.rewards.reward_model import REWARD_MODEL_DIR

    return ctx.export_dir(name, REWARD_MODEL_DIR)


def load_ranker(spec: Ranked, ctx: StageContext) -> tuple[Ranker | None, Path | None]:
    """(the ranker, the reward model's folder) of `spec`: (None, None) for the verifier."""
    if spec.rank == "verifier" or spec.reward_model is None:
        return None, None
    from temper.rewards.reward_model import RewardModel  # torch + transformers: only when asked for

    folder = reward_model_dir(spec.reward_model, ctx)
    return RewardModel.load(folder).score, folder


def check_same_tokenizer(folder: Path, tokenizer: Any, model_name: str) -> None:
    """A reward model scores token ids: refuse one whose vocabulary does not hold every token of
    `tokenizer` under the same id."""
    from temper.models.loading import load_tokenizer

    rm_vocab = load_tokenizer(folder).get_vocab()
    if any(rm_vocab.get(token) != i for token, i in tokenizer.get_vocab().items()):
        raise StageError(
            f"the reward model {str(folder)!r} has another tokenizer than {model_name!r}: it scores the "
            "policy's token ids, so it must be trained from the same model family (a reward_model stage "
            "starts from the policy's weights and keeps its tokenizer)"
        )


def generate_best_of_n(
    sampler: Any,
    tokenizer: Any,
    task: Task,
    split: str,
    n_prompts: int,
    *,
    n: int,
    ranker: Ranker | None,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    keep_truncated: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(SFT rows in TRL's conversational format, counts) from `n_prompts` prompts of `task`: n
    samples each, and the top-ranked usable one kept (`best_index`: the highest score, the
    earlier sample on a tie). Usable: a non-empty text that stopped on its own (a completion cut
    by max_new_tokens would teach the end of turn mid-answer) unless `keep_truncated`.

    Ranked by the verifier (`ranker` None), only a verified-correct sample is kept (the first
    usable correct one); ranked by a reward model, its top usable sample is kept whatever the
    verifier says, and `kept_correct` says how many of the kept ones the verifier accepts.
    Counts: prompts, rows, `yield` (rows / prompts), the prompts without a row by cause,
    `sample_accuracy` (all samples, verifier), `kept_correct`."""
    from temper.data.chat import prompt_ids  # imports transformers

    problems = task.sample(split, n_prompts, seed)
    groups = sampler.sample(
        [prompt_ids(tokenizer, p.messages()) for p in problems],
        n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
    )
    flat = [s for g in groups for s in g]
    scores = ranker([s.prompt_ids for s in flat], [s.token_ids for s in flat]) if ranker else None
    rows, causes, correct, kept_correct = [], Counter(), 0, 0
    for i, (problem, group) in enumerate(zip(problems, groups, strict=True)):
        grades = grade_batch(
            task, [problem] * len(group), [s.text for s in group], [s.token_ids for s in group]
        )
        correct += sum(g.correct for g in grades)
        usable = [bool(s.text.strip()) and (keep_truncated or s.stop_reason != "length") for s in group]
        candidates = [j for j, u in enumerate(usable) if u]  # in draw order: ties go to the earlier
        if not candidates:
            causes["all_empty_or_cut"] += 1
            continue
        if scores is None:  # the verifier: the first usable correct sample
            rank = [float(grades[j].correct) for j in candidates]
        else:
            rank = [scores[i * n + j] for j in candidates]
        pick = candidates[best_index(rank)]
        if scores is None and not grades[pick].correct:
            causes["no_usable_correct" if any(g.correct for g in grades) else "all_wrong"] += 1
            continue
        kept_correct += grades[pick].correct
        rows.append({"messages": [*problem.messages(), {"role": "assistant", "content": group[pick].text}]})
    counts = {
        "prompts": len(problems),
        "samples_per_prompt": n,
        "rows": len(rows),
        "yield": len(rows) / max(len(problems), 1),
        "no_row": dict(causes),
        "sample_accuracy": correct / max(len(flat), 1),
        "kept_correct": kept_correct / max(len(rows), 1),
    }
    return rows, counts
