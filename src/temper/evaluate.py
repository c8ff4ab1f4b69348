"""Evaluate a policy on a Task: greedy accuracy, pass@k, mean@k, parse rate, length, truncation,
each with a 95% confidence interval; in-distribution (test) vs out-of-distribution (ood).

The one evaluation path. Completions come from any `Sampler` (the in-process `HFSampler` or
vLLM) and grading goes through `temper.tasks.base.grade_batch`, the task's scorer with a verifier
exception caught, exactly as RL grades. The eval stage, `temper eval` and the RL stage's format
gate and periodic evals all call `evaluate`, and the CLI table and the HTML report both render
`table_rows`, so they cannot disagree on a number or on how it is written.

This module imports neither torch nor transformers at import time (the prompt renderer is
imported where it is used): the report renders `table_rows` without paying for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temper.atomic import atomic_write_json
from temper.rewards.best_of_n import Ranker, bon_kl, expected_best_of_n
from temper.stats import mean_ci, pass_at_k, wilson_interval
from temper.tasks.base import VERIFIER_ERROR, Problem, Score, Task, grade_batch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from temper.rollout.sampler import Sample, Sampler
    from temper.rollout.trajectory import Trajectory

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


def _example(
    problem: Problem, completion: Sample, score: Score, tokenizer: PreTrainedTokenizerBase
) -> dict[str, Any]:
    """One shown completion. `completion` is what the model generated, special tokens kept and
    marked (⟨<|im_end|>⟩; the stop token it ended on is left out, `stop_reason` says it), so an
    end-of-turn token generation ran past is seen; `graded` is the text the task graded (special
    tokens removed, cut at a stop string) when it differs."""
    from temper.models.chat import shown_completion

    shown = shown_completion(tokenizer, completion.token_ids, completion.stop_reason)
    return {
        "id": problem.id,
        "prompt": problem.prompt,
        "completion": shown,
        **({"graded": completion.text} if completion.text != shown else {}),
        "stop_reason": completion.stop_reason,
        "score": {
            "reward": float(score.reward),
            "correct": bool(score.correct),
            "parsed": bool(score.parsed),
            "reason": _jsonable(score.details.get("reason")),
            "answer": _jsonable(score.details.get("answer")),
        }
        | ({"error": str(score.details["error"])} if "error" in score.details else {}),
    }


def evaluate(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    split: str,
    *,
    n_problems: int = 100,
    seed: int = 1234,
    k: int = 4,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    max_episode_tokens: int = 0,
    n_examples: int = 5,
    best_of_n: Sequence[int] = (),
    ranker: Ranker | None = None,
    judge: Any = None,
) -> dict[str, Any]:
    """One greedy and k sampled completions per problem of `task.sample(split, n_problems, seed)`,
    drawn from `sampler` (k = 0: greedy only, for the RL stage's gate and periodic evals).

    Metrics are {"value", "lo", "hi"} with 95% intervals over problems:
      greedy_accuracy, parse_rate, truncation_rate (greedy; Wilson interval),
      greedy_reward, mean_length (greedy completion tokens incl. the stop id; normal interval),
      and when k >= 1: mean@k = mean_i c_i / k and pass@1, pass@k = mean_i pass_at_k(k, c_i, .)
      (normal interval clipped to [0, 1], or Wilson when every per-problem value is 0 or 1),
    where c_i counts the correct samples of problem i. With n = k samples, pass@1 equals mean@k
    and pass@k is the share of problems with at least one correct sample.

    A completion whose verifier raised is graded wrong and unparsed with reason "verifier_error"
    (it counts against accuracy and parse rate, as RL gives it no reward); `verifier_errors`
    counts them among the `graded` completions (greedy and sampled), `reasons` among the greedy
    ones, and the tables show them in a column of their own. `greedy_correct` is one character per
    problem, in order ("1" correct): models evaluated on the same problems pair up problem by problem.
    `failures` gives, per kind of failure that is not the model's (verifier_error, env_error,
    timeout: user code that raised, hung or returned what it must not), its count and the line
    of the first one (`failures`), so a console or a report can say which function failed and how.

    `special_tokens` counts, per special token, the completions (greedy and sampled) holding it
    where generation went on past it, and `stop_warning` turns that into one line naming the fix
    (`temper.models.chat.stop_warning`: a template's end of turn that is not a stop id), so 100%
    truncation is not read as "SFT is not done" or "raise max_new_tokens". Shown completions keep
    their special tokens, marked (`_example`); grading sees the cleaned text.

    `best_of_n` (sizes N, e.g. [1, 2, 4, 8, 16]) adds `result["best_of_n"]`, accuracy vs N
    (`best_of_n_metrics`) from ONE draw of n = max(k, max N) samples per problem at `temperature`,
    ranked by `ranker` (prompt ids, completion ids -> scores; a reward model) or, when None, by
    the verifier. The pass@k metrics use the first k of those n samples, which are the k samples
    a draw of k alone gives (sample j of a prompt depends only on its seed and j).

    An environment task plays whole episodes of at most its `max_turns` turns of `max_new_tokens`
    each, within `max_episode_tokens` after the prompt (0: max_turns x max_new_tokens; a task with
    a context budget of its own, `EpisodeTokenLimited`, keeps it).

    `judge` (a `temper.rewards.judge.Judge`, single-turn tasks only) grades every graded completion
    (greedy and sampled) against its problem's prompt in one call, as a metric beside the verifier:
    `result["judge"]` holds `judge_metrics` (the mean verdict, its agreement with the verifier and
    Cohen's kappa, the unparseable verdicts counted, never read as 0).
    """
    from temper.data.chat import prompt_ids  # imports transformers; see the module docstring
    from temper.envs.base import EnvTask, EpisodeTokenLimited, TurnLimited, make_env
    from temper.models.chat import stop_warning, unstopped_specials
    from temper.rollout.loop import EpisodeLimits, run_episodes
    from temper.rollout.sampler import sampler_stop_ids

    if k < 0 or n_problems < 1:
        raise ValueError("evaluate needs k >= 0 and n_problems >= 1")
    if judge is not None and isinstance(task, EnvTask):
        raise ValueError(f"a judge grades single-turn answers; {task.name!r} is an environment task")
    if ranker is not None and isinstance(task, EnvTask):
        # a reward model scores (prompt, completion) ids; an episode is more than its last piece
        raise ValueError(
            f"best-of-N ranked by a reward model needs a single-turn task; {task.name!r} is an environment"
        )
    problems = task.sample(split, n_problems, seed)
    if not problems:
        raise ValueError(f"task {task.name!r} returned no problems for split {split!r}")
    episodes: dict[str, list] = {}
    if isinstance(task, EnvTask):  # an environment task: whole episodes
        limits = EpisodeLimits(
            max_turns=task.max_turns if isinstance(task, TurnLimited) else 8,
            max_tokens=task.max_episode_tokens
            if isinstance(task, EpisodeTokenLimited)
            else max_episode_tokens,
            max_new_tokens=max_new_tokens,
        )

        def draw(n: int, temp: float) -> list[list[Sample]]:
            groups = run_episodes(
                sampler, tokenizer, [[make_env(task, p) for _ in range(n)] for p in problems],
                [seed] * len(problems), limits, temperature=temp,
            )  # fmt: skip
            episodes.setdefault("all", []).extend(t for g in groups for t in g)
            return [[as_sample(t) for t in g] for g in groups]

        greedy = [c[0] for c in draw(1, 0.0)]
        scores = [graded_episode(t) for t in episodes["all"]]
    else:
        prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
        gen = dict(max_new_tokens=max_new_tokens, seed=seed)

        def draw(n: int, temp: float) -> list[list[Sample]]:
            return sampler.sample(prompts, n, temperature=temp, **gen)

        greedy = [c[0] for c in draw(1, 0.0)]
        scores = grade_batch(task, problems, [c.text for c in greedy], [c.token_ids for c in greedy])
    graded = list(scores)

    metrics = {
        "greedy_accuracy": _rate([s.correct for s in scores]),
        "parse_rate": _rate([s.parsed for s in scores]),
        "truncation_rate": _rate([c.stop_reason == "length" for c in greedy]),
        "greedy_reward": _mean([float(s.reward) for s in scores]),
        "mean_length": _mean(
            *_lengths(
                greedy,
                episodes.get("all", [])[: len(problems)],
                max_new_tokens,
                task.max_turns if isinstance(task, TurnLimited) else 1,
            )
        ),
    }
    n_drawn = max(k, max(best_of_n, default=0))
    drawn: list[list[Sample]] = draw(n_drawn, temperature) if n_drawn else []
    drawn_episodes = episodes.get("all", [])[len(problems) :]
    scores_P = []  # the n_drawn Scores of each problem
    for i, (p, cs) in enumerate(zip(problems, drawn, strict=bool(drawn))):  # none drawn when k = 0
        if drawn_episodes:
            scores_P.append([graded_episode(t) for t in drawn_episodes[i * n_drawn : (i + 1) * n_drawn]])
        else:
            scores_P.append(grade_batch(task, [p] * len(cs), [c.text for c in cs], [c.token_ids for c in cs]))
        graded += scores_P[-1]
    if k:
        correct_P = [sum(s.correct for s in ss[:k]) for ss in scores_P]
        metrics |= {
            f"mean@{k}": _unit_mean([c / k for c in correct_P]),
            "pass@1": _unit_mean([pass_at_k(k, c, 1) for c in correct_P]),
            f"pass@{k}": _unit_mean([pass_at_k(k, c, k) for c in correct_P]),
        }
    reasons = Counter(str(s.details.get("reason", "unknown")) for s in scores)
    completions = greedy + [c for cs in drawn for c in cs]
    specials = unstopped_specials(tokenizer, [(c.token_ids, c.stop_reason) for c in completions])
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
        # per problem, in order: two models evaluated on the same problems compare pair by pair
        "greedy_correct": "".join("1" if s.correct else "0" for s in scores),
        "graded": len(graded),
        "verifier_errors": sum(_is_verifier_error(s) for s in graded),
        "failures": failures(graded, episodes.get("all", [])),
        "examples": _with_episodes(
            _examples(problems, greedy, scores, n_examples, tokenizer),
            problems,
            episodes.get("all"),
            tokenizer,
        ),
        **({"episodes": episode_summary(episodes["all"])} if episodes else {}),
        "special_tokens": dict(specials.most_common()),
        "stop_warning": stop_warning(
            tokenizer, specials, len(completions), sampler_stop_ids(sampler, tokenizer)
        ),
        **({"best_of_n": best_of_n_metrics(drawn, scores_P, best_of_n, ranker)} if best_of_n else {}),
        **({"judge": judge_metrics(judge, problems, greedy, drawn, scores, scores_P)} if judge else {}),
    }


def judge_metrics(
    judge: Any,
    problems: Sequence[Problem],
    greedy: Sequence[Sample],
    drawn: Sequence[Sequence[Sample]],
    greedy_scores: Sequence[Score],
    scores_P: Sequence[Sequence[Score]],
) -> dict[str, Any]:
    """The judge's verdicts on every graded completion (greedy first, then each problem's samples),
    one `judge.grade` call: `score` (the mean verdict in [0, 1] over the parsed ones, 95% interval
    over them), `greedy_score` (the same over the greedy answers, beside greedy accuracy), and
    `temper.rewards.judge.agreement` with the verifier's grades (agreement, its interval, kappa,
    n / parsed / unparseable). `examples`: the first few verdicts as the judge wrote them."""
    from temper.rewards.judge import agreement

    pairs = [(p, c, s) for p, c, s in zip(problems, greedy, greedy_scores, strict=True)]
    pairs += [(p, c, s) for p, cs, ss in zip(problems, drawn, scores_P) for c, s in zip(cs, ss, strict=True)]
    verdicts = judge.grade([p.prompt for p, _, _ in pairs], [c.text for _, c, _ in pairs])
    values = [v.value for v in verdicts]
    parsed = [v for v in values if v is not None]
    on_greedy = [v for v in values[: len(greedy)] if v is not None]
    return {
        "score": _unit_mean(parsed) if parsed else None,
        "greedy_score": _unit_mean(on_greedy) if on_greedy else None,
        **agreement(values, [s.correct for _, _, s in pairs]),
        "examples": [
            {"problem": p.id, "answer": c.text, "correct": s.correct, "verdict": v.text, "value": v.value}
            for (p, c, s), v in list(zip(pairs, verdicts, strict=True))[:3]
        ],
    }


def best_of_n_metrics(
    samples_P: Sequence[Sequence[Sample]],
    scores_P: Sequence[Sequence[Score]],
    sizes: Sequence[int],
    ranker: Ranker | None = None,
) -> dict[str, Any]:
    """Accuracy of best-of-N for each N in `sizes`, from the n graded samples of each problem.

    Per problem, the exact mean over every N-subset of its n samples of the correctness of the
    subset's top-ranked sample (`temper.rewards.best_of_n.expected_best_of_n`; ties go to the
    earlier sample), then {"value", "lo", "hi"} over problems as pass@k. Ranked by the verifier
    (ranker None: score 1 if correct else 0) this is the unbiased pass@N. Ranked by a reward
    model, `verifier_ranked` adds that pass@N (the ceiling any ranker can reach) and `score` the
    ranker's expected score of the pick (the proxy reward, next to its gold: accuracy).
    `kl` is the analytic KL of best-of-N from the sampling policy, log N - (N - 1)/N, in nats."""
    n = len(samples_P[0]) if samples_P else 0
    if not sizes or max(sizes) > n or min(sizes) < 1:
        raise ValueError(f"best-of-N sizes {list(sizes)} need 1 <= N <= {n} samples per problem")
    correct_P = [[float(s.correct) for s in ss] for ss in scores_P]
    if ranker is None:
        rank_P = correct_P
    else:
        flat = [c for cs in samples_P for c in cs]
        flat_scores = [float(x) for x in ranker([c.prompt_ids for c in flat], [c.token_ids for c in flat])]
        if len(flat_scores) != len(flat):
            raise ValueError(f"the ranker gave {len(flat_scores)} scores for {len(flat)} completions")
        rank_P = [flat_scores[i * n : (i + 1) * n] for i in range(len(samples_P))]
    out: dict[str, Any] = {
        "rank": "verifier" if ranker is None else "reward_model",
        "samples": n,
        "n": list(sizes),
        "kl": [bon_kl(size) for size in sizes],
        "accuracy": [
            _unit_mean([expected_best_of_n(r, c, size) for r, c in zip(rank_P, correct_P, strict=True)])
            for size in sizes
        ],
    }
    if ranker is not None:
        out["verifier_ranked"] = [
            _unit_mean([pass_at_k(n, int(sum(c)), size) for c in correct_P]) for size in sizes
        ]
        out["score"] = [_mean([expected_best_of_n(r, r, size) for r in rank_P]) for size in sizes]
    return out


def as_sample(t: Trajectory) -> Sample:
    """An episode seen as one completion, for the columns every task shares: the policy's last
    sampled piece (what the end-of-turn check reads: earlier pieces ended where the environment
    answered), the last assistant turn's text, the last stop."""
    from temper.rollout.sampler import Sample

    text = t.messages[-1]["content"] if t.messages and t.messages[-1]["role"] == "assistant" else ""
    last = next((s for s in reversed(t.segments) if s.trainable), None)  # None: its env never started
    if last is None:
        return Sample(t.prompt_ids, [], [], text, t.last_stop)
    return Sample(t.prompt_ids, last.token_ids, last.logprobs or [], text, t.last_stop)


FAILURE_KINDS = ("verifier_error", "env_error", "timeout")
"""How a graded completion or an episode fails for a reason that is not the model's: its grader
failed, its environment failed, or one of them ran past its time limit."""


def failures(scores: Sequence[Score], trajectories: Sequence[Trajectory] = ()) -> dict[str, dict[str, Any]]:
    """Per failure kind that occurred: {"count", "first": the first one's line}. The graded
    completions' verifier errors and, for an environment task, its episodes' env errors and
    timeouts (their line from the last step's signals)."""
    out: dict[str, dict[str, Any]] = {}

    def add(kind: str, line: str) -> None:
        entry = out.setdefault(kind, {"count": 0, "first": line})
        entry["count"] += 1

    for s in scores:
        if _is_verifier_error(s):
            add("verifier_error", str(s.details.get("error", "")))
    for t in trajectories:
        if t.stop_reason in ("env_error", "timeout"):
            add(t.stop_reason, t.error or t.stop_reason)
    return out


def _lengths(
    greedy: Sequence[Sample], trajectories: Sequence[Trajectory], max_new_tokens: int, max_turns: int
) -> tuple[list[int], tuple[float, float]]:
    """Greedy completion lengths and their bounds: an episode's are its policy tokens over all its
    turns (at most max_turns x max_new_tokens)."""
    if trajectories:
        return [t.policy_tokens for t in trajectories], (0.0, float(max_turns * max_new_tokens))
    return [len(c.token_ids) for c in greedy], (0.0, float(max_new_tokens))


def _with_episodes(
    examples: list[dict[str, Any]],
    problems: Sequence[Problem],
    trajectories: Sequence[Trajectory] | None,
    tokenizer: PreTrainedTokenizerBase,
) -> list[dict[str, Any]]:
    """Greedy examples of an environment task get their whole episode: the segments in order, each
    {"by": "policy" | "env", "text"} (special tokens kept), so the report can tell the two apart."""
    from temper.rollout.trajectory import segment_records

    if not trajectories:
        return examples
    by_id = {}
    for p, t in zip(problems, trajectories):  # the first len(problems) episodes are the greedy ones
        by_id.setdefault(p.id, t)
    for ex in examples:
        t = by_id.get(ex["id"])
        if t is not None:
            ex["episode"] = segment_records(t, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
            ex["turns"] = t.turns
    return examples


def graded_episode(t: Trajectory) -> Score:
    """An episode's outcome; one that ended without one (a limit, a timeout) is wrong and unparsed."""
    return t.score or Score(0.0, False, False, {"reason": t.stop_reason})


def episode_summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Means per episode (greedy and sampled together): turns, policy tokens, environment seconds,
    every numeric step signal summed over the episode (tool calls, tool errors...), and the stop reasons."""
    from temper.rollout.trajectory import mean_signals

    n = len(trajectories)
    return {
        "episodes": n,
        "turns": sum(t.turns for t in trajectories) / n,
        "policy_tokens": sum(t.policy_tokens for t in trajectories) / n,
        "env_seconds": sum(t.seconds_in_env for t in trajectories) / n,
        "signals": mean_signals(list(trajectories)),
        "stop_reasons": dict(Counter(t.stop_reason for t in trajectories).most_common()),
    }


def stop_warnings(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> list[str]:
    """Each distinct end-of-turn warning of a results table, with the rows it came from."""
    rows: dict[str, list[str]] = {}
    for label, by_split in results.items():
        for split, r in by_split.items():
            if r.get("stop_warning"):
                rows.setdefault(r["stop_warning"], []).append(f"{label} {split}")
    return [f"{', '.join(where)}: {warning}" for warning, where in rows.items()]


def _is_verifier_error(score: Score) -> bool:
    return score.details.get("reason") == VERIFIER_ERROR


def _examples(
    problems: Sequence[Problem],
    greedy: Sequence[Sample],
    scores: Sequence[Score],
    n: int,
    tokenizer: PreTrainedTokenizerBase,
) -> list[dict[str, Any]]:
    """The first `n` greedy completions, then (so a broken verifier is seen, not only counted) the
    first greedy completion whose verifier raised, if none of the first `n` did."""
    rows = list(zip(problems, greedy, scores, strict=True))
    shown = rows[:n]
    if n and not any(_is_verifier_error(s) for _, _, s in shown):
        shown += [r for r in rows[n:] if _is_verifier_error(r[2])][:1]
    return [_example(*r, tokenizer) for r in shown]


def judge_rows(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> tuple[list[str], list[list[str]]]:
    """The judge table as (header, rows of cells): one row per (label, split) of the results that
    have `judge`; ([], []) when none has. Columns: the mean verdict over every judged answer and
    over the greedy ones, the agreement with the verifier (95% interval) and Cohen's kappa, and
    the unparseable verdicts of all judged."""
    judged = [
        (label, split, r["judge"]) for label, by in results.items() for split, r in by.items() if "judge" in r
    ]
    if not judged:
        return [], []
    header = [
        "model",
        "split",
        "judge score",
        "judge score (greedy)",
        "agreement with verifier",
        "kappa",
        "unparseable",
    ]
    rows = []
    for label, split, j in judged:
        agree = None if j["agreement"] is None else {"value": j["agreement"], "lo": j["lo"], "hi": j["hi"]}
        kappa = "–" if j["kappa"] is None else f"{j['kappa']:.2f}"
        rows.append(
            [label, split, _cell(j["score"], True), _cell(j["greedy_score"], True), _cell(agree, True), kappa,
             f"{j['unparseable']} of {j['n']}"]
        )  # fmt: skip
    return header, rows


def evaluate_splits(
    sampler: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    splits: Sequence[str] = ("test", "ood"),
    **kw: Any,
) -> dict[str, dict[str, Any]]:
    """`evaluate` on each split (in-distribution "test" vs shifted "ood" by default)."""
    return {split: evaluate(sampler, tokenizer, task, split, **kw) for split in splits}


RATES = {  # table columns: metric key ("@k" filled from each result) -> header; rates in percent
    "greedy_accuracy": "greedy acc",
    "pass@k": "pass@k",
    "mean@k": "mean@k",
    "parse_rate": "parse rate",
    "truncation_rate": "trunc rate",
}


def _cell(m: Mapping[str, float] | None, percent: bool) -> str:
    """A "value [lo, hi]" cell: rates in percent, lengths in tokens; "–" for a metric the result lacks."""
    if m is None:
        return "–"
    s = 100.0 if percent else 1.0
    return f"{s * m['value']:.1f}{'%' if percent else ''} [{s * m['lo']:.1f}, {s * m['hi']:.1f}]"


def table_rows(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> tuple[list[str], list[list[str]]]:
    """The eval table as (header, rows of cells): one row per (label, split), in the order given.

    The one place that decides which metrics are shown, in what order and how they are written:
    the CLI (`format_table`) aligns these cells in text and the HTML report (`temper.report`) puts
    them in a <table>. Rates are "value% [lo, hi]" with the 95% interval, the greedy length in
    tokens likewise; "pass@k"/"mean@k" take the results' k (or stay "@k" when rows differ) and are
    left out when no row sampled (k = 0). A "verifier errors" column ("errors of graded") appears
    when any row has one, so a broken verifier is never read as a run of wrong answers."""
    rs = [r for by_split in results.values() for r in by_split.values()]
    ks = {r["k"] for r in rs if r["k"]}
    k_name = f"@{next(iter(ks))}" if len(ks) == 1 else "@k"
    rates = [key for key in RATES if ks or "@k" not in key]
    errors = any(r.get("verifier_errors") for r in rs)
    header = ["model", "split", "n", *(RATES[key].replace("@k", k_name) for key in rates), "mean length"]
    if errors:
        header.append("verifier errors")
    rows = []
    for label, by_split in results.items():
        for split, r in by_split.items():
            m = r["metrics"]
            row = [label, split, str(r["n_problems"])]
            row += [_cell(m.get(key.replace("@k", f"@{r['k']}")), True) for key in rates]
            row.append(_cell(m.get("mean_length"), False))
            if errors:
                row.append(f"{r.get('verifier_errors', 0)} of {r.get('graded', '?')}")
            rows.append(row)
    return header, rows


def best_of_n_rows(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> tuple[list[str], list[list[str]]]:
    """The best-of-N table as (header, rows of cells): one row per (label, split, N) of the results
    that have `best_of_n`; ([], []) when none has. Columns: how the pick was ranked, N, the
    analytic KL of best-of-N (nats), the accuracy with its 95% interval, and for a reward-model
    ranking the verifier-ranked pass@N beside it and the reward model's mean score of the pick."""
    bons = [
        (label, split, r["best_of_n"])
        for label, by in results.items()
        for split, r in by.items()
        if "best_of_n" in r
    ]
    if not bons:
        return [], []
    learned = any("score" in b for _, _, b in bons)
    header = ["model", "split", "rank", "N", "KL (nats)", "accuracy"]
    header += ["verifier-ranked (pass@N)", "RM score of pick"] if learned else []
    rows = []
    for label, split, b in bons:
        for j, size in enumerate(b["n"]):
            row = [label, split, b["rank"], str(size), f"{b['kl'][j]:.3f}", _cell(b["accuracy"][j], True)]
            if learned:
                row += (
                    [_cell(b["verifier_ranked"][j], True), _cell(b["score"][j], False)]
                    if "score" in b
                    else ["–", "–"]
                )
            rows.append(row)
    return header, rows


def _aligned(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_table(results: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """`table_rows` as plain text, columns aligned; then the best-of-N and the judge tables when
    there are any."""
    text = _aligned(*table_rows(results))
    bon_header, bon_rows = best_of_n_rows(results)
    text += f"\n\nbest-of-N\n{_aligned(bon_header, bon_rows)}" if bon_rows else ""
    judge_header, judged = judge_rows(results)
    return text + (f"\n\njudge\n{_aligned(judge_header, judged)}" if judged else "")


def write_eval(path: str | Path, results: Mapping[str, Any]) -> None:
    """Write eval results as JSON; readers never see a half-written file."""
    atomic_write_json(path, results)
