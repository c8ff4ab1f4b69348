"""The eval stage's section: per task, wins and regressions in words, the table, a bar chart, samples."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from temper.evaluate import best_of_n_rows, judge_rows, table_rows
from temper.report.agent import LEGEND, episode_html, eval_episode_table, transcripts
from temper.report.common import Stage, correct_mark, embed_figure, esc, html_table, read_json
from temper.rewards.best_of_n import bon_kl


def eval_table(by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per model stage × split, splits of a model adjacent (ID test beside OOD); columns and
    cells from `temper.evaluate.table_rows`, as in the CLI. Rows with verifier errors are highlighted."""
    head, rows = table_rows(by_model)
    results = [r for by_split in by_model.values() for r in by_split.values()]
    return html_table(rows, head, {i for i, r in enumerate(results) if r.get("verifier_errors")})


def highlights(by_model: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, bool]]:
    """(sentence, is_gain) for each later stage whose greedy accuracy differs from an earlier
    stage's on the same split with non-overlapping 95% intervals; models are in stage order."""
    models, out = list(by_model), []
    for j, later in enumerate(models):
        for earlier in models[:j]:
            for split, r in by_model[later].items():
                if split not in by_model[earlier]:
                    continue
                b = r["metrics"]["greedy_accuracy"]
                a = by_model[earlier][split]["metrics"]["greedy_accuracy"]
                nums = f"{100 * b['value']:.1f}% vs {100 * a['value']:.1f}%"
                if b["lo"] > a["hi"]:
                    out.append((f"{later} > {earlier} on {split}: {nums}", True))
                elif b["hi"] < a["lo"]:
                    out.append((f"{later} < {earlier} on {split}: {nums}", False))
    return out


def accuracy_figure(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> Figure:
    """Greedy accuracy with 95% error bars: a group per model stage, a bar per split."""
    models = list(by_model)
    splits = list(dict.fromkeys(s for by_split in by_model.values() for s in by_split))
    fig = Figure(figsize=(1.6 + 1.4 * len(models) * max(1, len(splits)) / 2, 3.6), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(splits))
    for i, split in enumerate(splits):
        xs = [x for x, m in enumerate(models) if split in by_model[m]]
        ms = [by_model[models[x]][split]["metrics"]["greedy_accuracy"] for x in xs]
        lo = [max(0.0, 100 * (m["value"] - m["lo"])) for m in ms]  # max(): rounding must not flip a bar
        hi = [max(0.0, 100 * (m["hi"] - m["value"])) for m in ms]
        shift = (i - (len(splits) - 1) / 2) * width
        ax.bar(
            [x + shift for x in xs],
            [100 * m["value"] for m in ms],
            width,
            yerr=[lo, hi],
            capsize=4,
            label=split,
        )
    ax.set_xticks(range(len(models)), models)
    ax.set(title=task, ylabel="greedy accuracy %", ylim=(0, 100))
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    return fig


def best_of_n_figure(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> Figure | None:
    """Best-of-N accuracy (with its 95% band) against N on a log axis, a line per model x split;
    a reward-model ranking adds the verifier-ranked pass@N dashed (the ceiling of any ranker). The
    top axis reads the same points as the analytic KL of best-of-N. None without best-of-N results."""
    lines = [
        (f"{m} {split}", r["best_of_n"])
        for m, by in by_model.items()
        for split, r in by.items()
        if "best_of_n" in r
    ]
    if not lines:
        return None
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    sizes: set[int] = set()
    for label, b in lines:
        sizes.update(b["n"])
        acc = b["accuracy"]
        (line,) = ax.plot(b["n"], [100 * m["value"] for m in acc], marker="o", label=f"{label} ({b['rank']})")
        ax.fill_between(
            b["n"],
            [100 * m["lo"] for m in acc],
            [100 * m["hi"] for m in acc],
            alpha=0.15,
            color=line.get_color(),
        )
        if "verifier_ranked" in b:
            ax.plot(
                b["n"],
                [100 * m["value"] for m in b["verifier_ranked"]],
                ls="--",
                marker=".",
                color=line.get_color(),
                label=f"{label} (verifier-ranked: pass@N)",
            )
    ticks = sorted(sizes)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set(title=f"{task}: best-of-N", xlabel="N (samples ranked)", ylabel="accuracy %", ylim=(0, 100))
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    top = ax.twiny()  # the same N positions, labelled with their KL
    top.set_xscale("log", base=2)
    top.set_xlim(ax.get_xlim())
    top.set_xticks(ticks, [f"{bon_kl(t):.2f}" for t in ticks])
    top.minorticks_off()
    top.set_xlabel("KL(best-of-N || policy), nats: log N - (N-1)/N")
    return fig


def best_of_n_block(task: str, by_model: Mapping[str, Mapping[str, Any]], png: Path) -> str:
    """The best-of-N table and chart of a task's eval results ("" when it has none)."""
    head, rows = best_of_n_rows(by_model)
    fig = best_of_n_figure(task, by_model)
    if fig is None:
        return ""
    samples = sorted(
        {r["best_of_n"]["samples"] for by in by_model.values() for r in by.values() if "best_of_n" in r}
    )
    note = (
        f"<p>Best-of-N: accuracy of the top-ranked of N samples, averaged exactly over every N-subset of "
        f"{'/'.join(map(str, samples))} samples per problem; KL is the analytic KL of best-of-N from the "
        "sampling policy.</p>"
    )
    return note + html_table(rows, head) + embed_figure(fig, png, f"{task} best-of-N accuracy vs N")


def _example(e: Mapping[str, Any]) -> str:
    s = e.get("score", {})
    mark = correct_mark(s.get("correct"))
    meta = [f"parsed: {s.get('parsed')}", f"reason: {s.get('reason')}", f"answer: {s.get('answer')}"]
    meta.append(f"stop: {e.get('stop_reason')}")
    meta += [f"error: {s['error']}"] if s.get("error") else []  # the verifier's exception
    body = episode_html(e["episode"]) if e.get("episode") else f"<pre>{esc(e.get('completion', ''))}</pre>"
    return (
        f'<div class="ex">{esc(e.get("id", ""))} {mark} <small>{esc(" · ".join(meta))}</small>'
        f"<pre>{esc(e.get('prompt', ''))}</pre>{body}</div>"
    )


def samples(task: str, by_model: Mapping[str, Mapping[str, Any]]) -> str:
    """A collapsed block of greedy completions per model × split, with the grading reasons."""
    out = []
    for model, by_split in by_model.items():
        for split, r in by_split.items():
            exs = r.get("examples", [])
            reasons = ", ".join(f"{k}: {v}" for k, v in r.get("reasons", {}).items())
            n_ok = sum(bool(e.get("score", {}).get("correct")) for e in exs)
            title = f"{task} / {model} / {split}: {len(exs)} examples, {n_ok} correct"
            out.append(
                f"<details><summary>{esc(title)}</summary>"
                f"<p>Grading reasons over all {r['n_problems']} problems: {esc(reasons)}</p>"
                f"{''.join(_example(e) for e in exs)}</details>"
            )
    return "".join(out)


def eval_section(stage: Stage, plots: Path) -> str:
    """Per task: the wins and regressions in words, the table, the bar chart and sample completions."""
    results = read_json(stage.folder / "eval.json") or {}
    parts = [] if results else ["<p>No eval results.</p>"]
    for task, by_model in results.items():
        parts.append(f"<h3>{esc(task)}</h3>")
        if not by_model:
            parts.append("<p>No models evaluated.</p>")
            continue
        said = "".join(
            f"<li class='{'good' if up else 'bad'}'>{esc(s)}</li>" for s, up in highlights(by_model)
        )
        if said:
            parts.append(f"<ul>{said}</ul>")
        elif len(by_model) > 1:  # with one model there is nothing to compare
            parts.append("<p>No difference with non-overlapping 95% intervals.</p>")
        parts.append(eval_table(by_model))
        parts.append(eval_episode_table(by_model))
        parts.append(transcripts(task, by_model))
        png = plots / f"{stage.folder.name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', task)}.png"
        parts.append(embed_figure(accuracy_figure(task, by_model), png, f"{task} greedy accuracy"))
        parts.append(best_of_n_block(task, by_model, png.with_name(f"{png.stem}-best_of_n.png")))
        judge_head, judged = judge_rows(by_model)
        if judged:
            parts.append(
                "<p>A generative judge graded every answer (greedy and sampled) beside the verifier: "
                "the mean verdict, its agreement with the verifier and Cohen's kappa (agreement beyond "
                "chance), and the verdicts that could not be read (left out, never read as 0).</p>"
                + html_table(judged, judge_head)
            )
        shown = samples(task, by_model)
        parts.append((LEGEND if "class='episode'" in shown else "") + shown)
    return "".join(parts)
