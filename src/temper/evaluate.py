"""Evaluate a model on a Task: greedy accuracy, pass@k, mean@k, parse rate, length, truncation,
each with a 95% confidence interval; in-distribution (test) vs out-of-distribution (ood).

Completions come from `HFSampler` and grading goes through `Task.score`: the sampler and the
scoring function RL uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from temper.atomic import atomic_write_json
from temper.data.chat import prompt_ids
from temper.rollout import HFSampler, Sample
from temper.stats import mean_ci, pass_at_k, wilson_interval
from temper.tasks.base import Problem, Score, Task

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def _metric(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": float(value), "lo": float(lo), "hi": float(hi)}


def _rate(flags: Sequence[bool]) -> dict[str, float]:
    """A proportion over problems with its Wilson interval."""
    s, n = sum(flags), len(flags)
    return _metric(s / n, *wilson_interval(s, n, Z95))


def _mean(values: Sequence[float], bounds: tuple[float, float] | None = None) -> dict[str, float]:
    """A mean over problems with its normal interval, clipped to `bounds` when given."""
    m, lo, hi = mean_ci(values, Z95)
    if bounds is not None:
        lo, hi = max(bounds[0], lo), min(bounds[1], hi)
    return _metric(m, lo, hi)


def _unit_mean(values: Sequence[float]) -> dict[str, float]:
    """A mean of per-problem values in [0, 1]. When every value is 0 or 1 (pass@k with n = k,
    or mean@k when each problem is all right or all wrong) it is a proportion and gets the Wilson
    interval, which stays honest at 0% and 100% where the normal interval collapses to a point."""
    if all(v in (0.0, 1.0) for v in values):
        return _rate([v == 1.0 for v in values])
    return _mean(values, (0.0, 1.0))


def _jsonable(x: Any) -> Any:
    return x if x is None or isinstance(x, (bool, int, float, str)) else str(x)


def _example(problem: Problem, completion: Sample, score: Score) -> dict[str, Any]:
    return {
        "id": problem.id,
        "prompt": problem.prompt,
        "completion": completion.text,
        "stop_reason": completion.stop_reason,
        "score": {
            "reward": float(score.reward),
            "correct": bool(score.correct),
            "parsed": bool(score.parsed),
            "reason": _jsonable(score.details.get("reason")),
            "answer": _jsonable(score.details.get("answer")),
        },
    }


def evaluate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    split: str,
    *,
    n_problems: int = 100,
    seed: int = 1234,
    k: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    batch_size: int = 64,
    n_examples: int = 5,
) -> dict[str, Any]:
    """One greedy and k sampled completions per problem of `task.sample(split, n_problems, seed)`.

    Metrics are {"value", "lo", "hi"} with 95% intervals over problems:
      greedy_accuracy, parse_rate, truncation_rate (greedy; Wilson interval),
      greedy_reward, mean_length (greedy completion tokens incl. the stop id; normal interval),
      mean@k = mean_i c_i / k and pass@1, pass@k = mean_i pass_at_k(k, c_i, .) (normal interval
      clipped to [0, 1], or Wilson when every per-problem value is 0 or 1),
    where c_i counts the correct samples of problem i. With n = k samples, pass@1 equals mean@k
    and pass@k is the share of problems with at least one correct sample.
    `batch_size` is the sampler's `max_batch_rows` (sequences, prompt x sample, decoded together).
    """
    if k < 1 or n_problems < 1:
        raise ValueError("evaluate needs k >= 1 and n_problems >= 1")
    problems = task.sample(split, n_problems, seed)
    if not problems:
        raise ValueError(f"task {task.name!r} returned no problems for split {split!r}")
    prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
    sampler = HFSampler(model, tokenizer, max_batch_rows=batch_size)
    gen = dict(max_new_tokens=max_new_tokens, seed=seed)
    greedy = [c[0] for c in sampler.sample(prompts, 1, temperature=0.0, **gen)]
    sampled = sampler.sample(prompts, k, temperature=temperature, **gen)

    scores = [task.score(p, c.text) for p, c in zip(problems, greedy, strict=True)]
    correct_P = [
        sum(task.score(p, c.text).correct for c in cs) for p, cs in zip(problems, sampled, strict=True)
    ]
    reasons = Counter(str(s.details.get("reason", "unknown")) for s in scores)

    metrics = {
        "greedy_accuracy": _rate([s.correct for s in scores]),
        "parse_rate": _rate([s.parsed for s in scores]),
        "truncation_rate": _rate([c.stop_reason == "length" for c in greedy]),
        "greedy_reward": _mean([float(s.reward) for s in scores]),
        "mean_length": _mean([len(c.token_ids) for c in greedy], (0.0, float(max_new_tokens))),
        f"mean@{k}": _unit_mean([c / k for c in correct_P]),
        "pass@1": _unit_mean([pass_at_k(k, c, 1) for c in correct_P]),
        f"pass@{k}": _unit_mean([pass_at_k(k, c, k) for c in correct_P]),
    }
    return {
        "task": task.name,
        "split": split,
        "n_problems": len(problems),
        "k": k,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "metrics": metrics,
        "reasons": dict(reasons.most_common()),
        "examples": [
            _example(p, c, s) for p, c, s in list(zip(problems, greedy, scores, strict=True))[:n_examples]
        ],
    }


def evaluate_splits(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    splits: Sequence[str] = ("test", "ood"),
    **kw: Any,
) -> dict[str, dict[str, Any]]:
    """`evaluate` on each split (in-distribution "test" vs shifted "ood" by default)."""
    return {split: evaluate(model, tokenizer, task, split, **kw) for split in splits}


def _pct(m: Mapping[str, float]) -> str:
    return f"{100 * m['value']:.1f} [{100 * m['lo']:.1f}, {100 * m['hi']:.1f}]"


def _plus_minus(m: Mapping[str, float]) -> str:
    return f"{m['value']:.1f} ± {(m['hi'] - m['lo']) / 2:.1f}"


def format_table(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """A plain-text table, one row per (label, split): rates in % with their 95% interval
    [lo, hi], the greedy length in tokens with ± the interval's half-width."""
    ks = {r["k"] for by_split in results.values() for r in by_split.values()}
    k_name = f"@{ks.pop()}" if len(ks) == 1 else "@k"
    header = ["model", "split", "n", "greedy acc %", f"pass{k_name} %", f"mean{k_name} %"]
    header += ["parse %", "trunc %", "length"]
    rows = [header]
    for label, by_split in results.items():
        for split, r in by_split.items():
            m, k = r["metrics"], r["k"]
            rows.append(
                [
                    label,
                    split,
                    str(r["n_problems"]),
                    _pct(m["greedy_accuracy"]),
                    _pct(m[f"pass@{k}"]),
                    _pct(m[f"mean@{k}"]),
                    _pct(m["parse_rate"]),
                    _pct(m["truncation_rate"]),
                    _plus_minus(m["mean_length"]),
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_eval(path: str | Path, results: Mapping[str, Any]) -> None:
    """Write eval results as JSON; readers never see a half-written file."""
    atomic_write_json(path, results)
