"""The prompt_distill stage's section: greedy accuracy with and without the instruction, before
and after, and the KL to the teacher over the steps."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from temper.report.common import Stage, embed_figure, html_table, read_json, read_metrics


def prompt_distill_section(stage: Stage, plots: Path) -> str:
    s = read_json(stage.folder / "prompt_distill.json")
    if not s:
        return "<p>The stage has not finished.</p>"
    rows = [
        [
            task,
            mode,
            *(f"{100 * acc[mode][task]:.1f}%" for acc in (s["teacher_accuracy"], s["before"], s["after"])),
        ]
        for mode in ("without", "with")
        for task in s["before"][mode]
    ]
    said = (
        f"<p>The teacher ({s['teacher']}) read each of {s['samples']:,} train prompts with the "
        f"{s['system_chars']}-character instruction as a system turn ({s['prompt_tokens']['with']:.0f} prompt tokens "
        f"on average, {s['prompt_tokens']['without']:.0f} without) and sampled a completion; "
        f"{100 * s['teacher_sample_accuracy']:.1f}% of them were graded correct. The student read the prompts "
        f"without it and matched the teacher's next-token distributions (forward KL) for {s['steps']} steps: "
        f"{s['kl_first']:.3f} -> {s['kl_last']:.3f} nats/token. Accuracy: greedy, held-out test problems.</p>"
    )
    html = said + html_table(
        rows, ["task", "instruction", "teacher", "before", "after"], caption="greedy accuracy"
    )
    history = [r for r in read_metrics(stage.folder / "metrics.jsonl")[0] if "kl" in r]
    if history:
        fig = Figure(figsize=(6.5, 3.0), layout="constrained")
        ax = fig.subplots()
        ax.plot([r["step"] for r in history], [r["kl"] for r in history], "o-")
        ax.set(title=stage.folder.name, xlabel="step", ylabel="KL(teacher || student), nats/token")
        ax.grid(alpha=0.3)
        html += embed_figure(fig, plots / f"{stage.folder.name}-kl.png", "KL to the teacher")
    return html
