"""Summarize a curriculum experiment (recipes/curriculum_code_repair.yaml, recipes/agent_web_shop.yaml
with `--task web_shop --splits test,ood`) over seeds: outcome-only GRPO on the fixed pool vs the
same with the WebRL-style curriculum grown from the policy's failures, from the same SFT model at
equal compute.

Per arm and seed, from the RL stage's metrics.jsonl (sampled training episodes, temperature 1):
success at the start (mean of the first `--window` steps) and the end (the last `--window`), the
share of all-fail groups and the turns (actions) per episode. The curriculum arm's draws include the variants it generated (born from
failures, so harder than the average original), so its training success is not the same measure
as the other arm's; the eval stage's greedy success on the fixed train and test splits is. From
the curriculum arm's `curriculum/*` metrics: the pool at the end, the share of it the curriculum
generated, the share of the drawn problems that were generated, the variants admitted and the
candidates rejected by the task's gate, by reason (the `curriculum/rejected/*` metrics), summed
over the run. Cells: mean ± sample
std [min, max] over seeds; the paired curriculum - outcome difference per seed with its 95%
t-interval (tables.py).

    python experiments/curriculum.py runs/curriculum_code_repair --seeds 0 1 2 --out results/curriculum_code_repair.md
    python experiments/curriculum.py runs/agent_web_shop --seeds 0 1 2 --task web_shop --splits test,ood
"""

from __future__ import annotations

from pathlib import Path

from tables import cli, greedy, mean, metrics, paired, spread, table

ARMS = {"outcome only": "rl_outcome", "outcome + curriculum": "rl_curriculum"}


def train_figures(rows: list[dict], window: int) -> dict[str, float]:
    out = {}
    for when, part in (("start", rows[:window]), ("end", rows[-window:])):
        out[f"success/{when}"] = mean([r["accuracy"] for r in part])
        out[f"all_fail/{when}"] = mean([all_fail(r) for r in part])
        out[f"turns/{when}"] = mean([r.get("episode/turns", 0.0) for r in part])
    return out


def all_fail(row: dict) -> float:
    """The share of groups with no correct rollout: `path/all_fail_groups` where the task has path
    signals, else the zero-variance groups that were not all correct (with an outcome-only reward
    of 0 or 1, a group with no success is a group of zeros)."""
    if "path/all_fail_groups" in row:
        return row["path/all_fail_groups"]
    return row["zero_variance"] - row["zero_variance/all_correct"]


def reasons_of(rows: list[dict]) -> list[str]:
    """The gate's rejection reasons a run logged (`curriculum/rejected/<reason>`), in log order."""
    prefix = "curriculum/rejected/"
    return list(dict.fromkeys(k.removeprefix(prefix) for r in rows for k in r if k.startswith(prefix)))


def curriculum_figures(rows: list[dict], reasons: list[str]) -> dict[str, float]:
    """The curriculum's pool and gate figures over a run (its `curriculum/*` metrics)."""
    rows = [r for r in rows if "curriculum/pool_size" in r]
    if not rows:
        raise SystemExit("the curriculum arm logged no curriculum/* metrics: was the curriculum on?")
    return {
        "pool": rows[-1]["curriculum/pool_size"],
        "generated_share": rows[-1]["curriculum/generated_share"],
        "drawn_share": mean([r["curriculum/drawn_generated_share"] for r in rows]),
        "drawn_share/end": rows[-1]["curriculum/drawn_generated_share"],
        "admitted": sum(r["curriculum/admitted"] for r in rows),
        "failed": sum(r["curriculum/failed_problems"] for r in rows),
        **{f"rejected/{k}": sum(r.get(f"curriculum/rejected/{k}", 0) for r in rows) for k in reasons},
    }


def summarize(root: Path, seeds: list[int], window: int, task: str, splits: str) -> str:
    runs = {s: root / f"seed-{s}" for s in seeds}
    rows = {arm: [metrics(run, name) for run in runs.values()] for arm, name in ARMS.items()}
    train = {arm: [train_figures(r, window) for r in per] for arm, per in rows.items()}
    all_reasons = reasons_of([r for per in rows["outcome + curriculum"] for r in per])
    cur = [curriculum_figures(r, all_reasons) for r in rows["outcome + curriculum"]]
    lines = [
        f"# A curriculum grown from failures on {task}: outcome-only GRPO with and without it, "
        f"{len(seeds)} seeds ({', '.join(map(str, seeds))})",
        "",
        f"RL training episodes (sampled, temperature 1; start = mean of the first {window} steps, end = "
        f"the last {window}). Mean ± std [min, max] over seeds. The curriculum arm's draws include its "
        "variants, so its training success is on a harder mix; the eval below is the like-for-like figure.",
        "",
    ]
    lines += table(
        ["arm", "success start %", "success end %", "all-fail groups start %", "all-fail groups end %",
         "turns per episode (end)"],
        [
            [arm]
            + [
                spread([f[k] for f in figs], 100, 1)
                for k in ("success/start", "success/end", "all_fail/start", "all_fail/end")
            ]
            + [spread([f["turns/end"] for f in figs], 1, 2)]
            for arm, figs in train.items()
        ],
    )  # fmt: skip
    lines += [
        "",
        "The curriculum, per seed (summed over the run; the pool and its generated share at the end):",
        "",
    ]
    reasons = [k for k in all_reasons if any(c[f"rejected/{k}"] for c in cur)]
    lines += table(
        [
            "seed",
            "all-fail problems",
            "variants admitted",
            *(f"rejected: {k}" for k in reasons),
            "pool at the end",
            "generated share of the pool %",
            "generated share of the draws % (mean; last step)",
        ],
        [
            [
                str(s),
                f"{c['failed']:.0f}",
                f"{c['admitted']:.0f}",
                *(f"{c[f'rejected/{k}']:.0f}" for k in reasons),
                f"{c['pool']:.0f}",
                f"{100 * c['generated_share']:.1f}",
                f"{100 * c['drawn_share']:.1f}; {100 * c['drawn_share/end']:.1f}",
            ]
            for s, c in zip(seeds, cur, strict=True)
        ],
    )
    splits = tuple(splits.split(","))
    ev = {
        (label, split): [greedy(run, task, model, split) for run in runs.values()]
        for label, model in ({"sft (shared start)": "sft"} | ARMS).items()
        for split in splits
    }
    lines += [
        "",
        "Greedy success on the fixed splits (the eval stage: the recipe's pools, never the variants):",
        "",
    ]
    lines += table(
        ["model", *(f"{split} %" for split in splits)],
        [
            [label, *(spread(ev[(label, split)], 100, 1) for split in splits)]
            for label in dict.fromkeys(k[0] for k in ev)
        ],
    )
    a, b = train["outcome only"], train["outcome + curriculum"]
    lines += [
        "",
        "Paired curriculum - outcome-only (per seed, and a 95% t-interval over seeds): "
        + "; ".join(
            f"greedy {split} success {paired(ev[('outcome only', split)], ev[('outcome + curriculum', split)], 100, 1)} pp"
            for split in splits
        )
        + f"; training success at the end {paired([f['success/end'] for f in a], [f['success/end'] for f in b], 100, 1)} pp"
        + f"; all-fail groups at the end {paired([f['all_fail/end'] for f in a], [f['all_fail/end'] for f in b], 100, 1)} pp.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    cli(__doc__, summarize, {
        "window": (int, 3, "steps averaged at the start and the end"),
        "task": (str, "code_repair", "the task whose curriculum grew (a catalog name)"),
        "splits": (str, "train,test", "the eval splits to report, comma-separated"),
    })  # fmt: skip
