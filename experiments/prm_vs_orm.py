"""Best-of-N on GeneralPoints picked by a process reward model, by outcome reward models, and by
the verifier (the ceiling): accuracy against N (recipes/prm_vs_orm.yaml).

Runs the recipe (finished stages are skipped), with, for each extra seed s, copies of the reward
model stages (`--rm-stages`) named `<name>_s<s>` that train with seed s (their data sampled with
seed s too); the SFT model is shared. Then samples `--n` answers for each of `--problems`
held-out (test split) problems from the SFT model once, grades them with the verifier and scores
them with every ranker:

- verifier: the task's grade (an oracle: a correct answer is picked whenever one is among the N);
- PRM (min / product): the process reward model's step scores aggregated (`aggregate`);
- ORM (outcome head): the same architecture, data and loss trained on the outcome label only,
  read at the last token (Lightman et al. 2023's ORM baseline: the comparison is the labels);
- any `reward_model` stage of the recipe (a Bradley-Terry ORM, helper h11rm's stage), if present.

Best-of-N accuracy is the exact expectation over all N-subsets of the sampled answers (not one
draw per N): with the answers sorted by score, the one at rank r (0 = best) is the top of a
uniformly random N-subset with probability C(M-1-r, N-1) / C(M, N), and tied answers share their
mean correctness (ties broken uniformly). N = 1 is every ranker's mean accuracy. Per-problem values
give the paired PRM - ORM difference with a 95% normal interval over problems.

    python experiments/prm_vs_orm.py recipes/prm_vs_orm.yaml --seeds 0 1 2 --out results/prm_vs_orm.md
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
from pathlib import Path

import yaml

from temper.atomic import atomic_write_text
from temper.catalog import make_recipe_task
from temper.data.chat import prompt_ids
from temper.models import load_model, load_tokenizer
from temper.recipe import parse_recipe
from temper.rewards.process_reward_model import ProcessRewardModel, step_token_ends
from temper.rollout import HFSampler
from temper.runner import run_recipe, stage_dir
from temper.tasks.steps import segment

NS = (1, 2, 4, 8, 16)


def best_of_n(scores: list[float], correct: list[bool], n: int) -> float:
    """Expected correctness of the top-scored answer of a uniformly random n-subset of the M
    answers (ties broken uniformly): sum_r c_r C(M-1-r, n-1) / C(M, n) over ranks r, with each
    answer's c the mean correctness of the answers tied with it."""
    m = len(scores)
    if not 1 <= n <= m:
        raise ValueError(f"n must be in 1..{m}, got {n}")
    order = sorted(range(m), key=lambda i: -scores[i])
    tied = {}
    for i in order:
        tied.setdefault(scores[i], []).append(correct[i])
    total = math.comb(m, n)
    return sum(
        statistics.mean(tied[scores[i]]) * math.comb(m - 1 - r, n - 1) / total for r, i in enumerate(order)
    )


def seeded(data: dict, seeds: list[int], rm_stages: list[str]) -> dict:
    """The recipe with, for each seed but 0, a copy of each reward-model stage training with it."""
    data = copy.deepcopy(data)
    extra = []
    for seed in seeds:
        if seed == 0:
            continue
        for stage in data["stages"]:
            if stage.get("name", stage["kind"]) in rm_stages:
                twin = copy.deepcopy(stage)
                twin["name"] = f"{stage.get('name', stage['kind'])}_s{seed}"
                twin.setdefault("train", {})["seed"] = seed
                twin.setdefault("data", {})["seed"] = seed
                extra.append(twin)
    data["stages"] += extra
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--prm", default="prm", help="the process reward model stage (labels: steps)")
    parser.add_argument("--orm", default="orm", help="the outcome-head stage (labels: outcome)")
    parser.add_argument("--policy", default="sft", help="the stage whose model answers")
    parser.add_argument("--task", default="general_points")
    parser.add_argument("--problems", type=int, default=128)
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sample-seed", type=int, default=7)
    parser.add_argument(
        "--split",
        default="test",
        choices=["test", "train"],
        help="problems to rank answers of; train: train-split hands the reward models never saw "
        "(the prompts of every seed's data are left out), where the SFT policy is far more accurate",
    )
    parser.add_argument("--out", help="markdown file for the table (a .png with the same stem beside it)")
    args = parser.parse_args()

    recipe_path = Path(args.recipe).resolve()
    data = seeded(yaml.safe_load(recipe_path.read_text()), args.seeds, [args.prm, args.orm])
    text = yaml.safe_dump(data, sort_keys=False)
    recipe = parse_recipe(text, str(recipe_path), recipe_path.parent)
    run_dir = recipe.run_dir(Path.cwd(), recipe_path.parent)
    run_recipe(recipe, recipe_path.parent, run_dir, text)
    dirs = {s.name: stage_dir(run_dir, i, s.name) for i, s in enumerate(recipe.stages)}
    bt_stages = [s.name for s in recipe.stages if s.kind == "reward_model"]

    # one set of answers from the policy, graded once
    task = make_recipe_task(args.task, recipe.tasks[args.task], recipe_path.parent)
    policy_dir = dirs[args.policy] / "model"
    tokenizer = load_tokenizer(policy_dir)
    sampler = HFSampler(load_model(policy_dir).eval(), tokenizer)
    if args.split == "test":
        problems = task.sample("test", args.problems, args.sample_seed)
    else:
        stage = next(s for s in recipe.stages if s.name == args.prm)
        seen = {p.id for sd in args.seeds for p in task.sample("train", stage.data.prompts_per_task, sd)}
        fresh = [p for p in task.sample("train", 4 * args.problems, args.sample_seed) if p.id not in seen]
        problems = list({p.id: p for p in fresh}.values())[: args.problems]
    prompts = [prompt_ids(tokenizer, p.messages()) for p in problems]
    groups = sampler.sample(
        prompts,
        args.n,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.sample_seed,
    )
    flat_p = [prompts[i] for i, g in enumerate(groups) for _ in g]
    flat_s = [s for g in groups for s in g]
    flat_c = [s.token_ids for s in flat_s]
    correct = [task.score(problems[i], s.text).correct for i, g in enumerate(groups) for s in g]
    steps = [step_token_ends(tokenizer, s.token_ids, segment(s.text)) for s in flat_s]
    last = [[len(c) - 1] for c in flat_c]

    scores: dict[str, dict[int, list[float]]] = {"verifier (oracle)": {0: [float(c) for c in correct]}}
    for seed in args.seeds:
        suffix = "" if seed == 0 else f"_s{seed}"
        prm = ProcessRewardModel.load(dirs[args.prm + suffix] / "process_reward_model")
        step_scores = prm.step_scores(flat_p, flat_c, steps)
        scores.setdefault("PRM, min over steps", {})[seed] = [min(s) if s else 0.0 for s in step_scores]
        scores.setdefault("PRM, product over steps", {})[seed] = [
            math.prod(s) if s else 0.0 for s in step_scores
        ]
        scores.setdefault("PRM, outcome step only", {})[seed] = [s[-1] if s else 0.0 for s in step_scores]
        orm = ProcessRewardModel.load(dirs[args.orm + suffix] / "process_reward_model")
        scores.setdefault("ORM (outcome head, same data)", {})[seed] = [
            s[0] for s in orm.step_scores(flat_p, flat_c, last)
        ]
    for name in bt_stages:
        from temper.rewards.reward_model import RewardModel  # helper h11rm's scorer

        rm = RewardModel.load(dirs[name] / "reward_model")
        scores[f"ORM (Bradley-Terry, stage {name})"] = {0: rm.score(flat_p, flat_c)}

    k = args.n
    ns = [n for n in NS if n <= k]
    per_problem: dict[str, dict[int, dict[int, list[float]]]] = {}  # ranker -> seed -> N -> per problem
    for ranker, by_seed in scores.items():
        for seed, flat in by_seed.items():
            per_problem.setdefault(ranker, {})[seed] = {
                n: [
                    best_of_n(flat[j * k : (j + 1) * k], correct[j * k : (j + 1) * k], n)
                    for j in range(len(problems))
                ]
                for n in ns
            }
    with open(run_dir / f"prm_vs_orm_samples_{args.split}.jsonl", "w") as f:
        for i, s in enumerate(flat_s):
            row = {"problem": problems[i // k].id, "text": s.text, "correct": correct[i]}
            row |= {f"{r} seed {sd}": v[i] for r, by in scores.items() for sd, v in by.items()}
            f.write(json.dumps(row) + "\n")

    def cell(ranker: str, n: int) -> str:
        means = [statistics.mean(per_problem[ranker][sd][n]) for sd in per_problem[ranker]]
        if len(means) == 1:
            return f"{100 * means[0]:.1f}"
        return f"{100 * statistics.mean(means):.1f} ± {100 * statistics.stdev(means):.1f}"

    prm_json = json.loads((dirs[args.prm] / "process_reward_model.json").read_text())
    orm_json = json.loads((dirs[args.orm] / "process_reward_model.json").read_text())
    lines = [
        f"# Best-of-N on {args.task}: PRM vs ORM vs verifier ({len(problems)} {args.split} problems, "
        f"{k} answers each at temperature {args.temperature}, reward-model seeds {args.seeds})",
        "",
        f"Sample accuracy of the policy (`{args.policy}`): {100 * statistics.mean(correct):.1f}% "
        f"({sum(correct)} of {len(correct)} answers correct).",
        "",
        "| ranker | " + " | ".join(f"N={n}" for n in ns) + " |",
        "|---|" + "---|" * len(ns),
    ]
    for ranker in per_problem:
        lines.append(f"| {ranker} | " + " | ".join(cell(ranker, n) for n in ns) + " |")
    lines += [
        "",
        "Best-of-N accuracy %, exact expectation over all N-subsets of the answers; ± is the std over seeds.",
        "",
    ]
    n_max = ns[-1]
    for a, b in (
        ("PRM, min over steps", "ORM (outcome head, same data)"),
        ("PRM, product over steps", "ORM (outcome head, same data)"),
    ):
        diffs = [
            statistics.mean(
                [per_problem[a][sd][n_max][j] - per_problem[b][sd][n_max][j] for sd in per_problem[a]]
            )
            for j in range(len(problems))
        ]
        mean, half = statistics.mean(diffs), 1.96 * statistics.stdev(diffs) / math.sqrt(len(diffs))
        lines.append(
            f"- {a} minus {b} at N={n_max}: {100 * mean:+.1f} points, 95% interval over problems "
            f"[{100 * (mean - half):+.1f}, {100 * (mean + half):+.1f}]"
        )
    for name, js in (("PRM", prm_json), ("ORM (outcome head)", orm_json)):
        ev = js.get("held_out_evals") or []
        if ev:
            lines.append(
                f"- {name} (seed 0) held-out label accuracy {ev[0]['step_accuracy']:.3f} -> {ev[-1]['step_accuracy']:.3f}, "
                f"balanced {ev[0]['balanced_accuracy']:.3f} -> {ev[-1]['balanced_accuracy']:.3f} "
                f"(good share {ev[-1]['good_share']:.3f}, {ev[-1]['steps']} labels), {js['steps']} steps in {js['seconds']:.0f} s"
            )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        atomic_write_text(args.out, table)
        _plot(per_problem, ns, Path(args.out).with_suffix(".png"), args.task)


def _plot(per_problem, ns: list[int], path: Path, task: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for ranker, by_seed in per_problem.items():
        means = [statistics.mean(statistics.mean(by_seed[sd][n]) for sd in by_seed) * 100 for n in ns]
        ax.plot(ns, means, marker="o", label=ranker, linestyle="--" if "oracle" in ranker else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("N (answers sampled per problem)")
    ax.set_ylabel("best-of-N accuracy %")
    ax.set_title(f"{task}: best-of-N picked by PRM / ORM / verifier")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
