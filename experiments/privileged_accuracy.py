"""How well does a model answer when it reads the privileged context OPSD's teacher reads?

OPSD's teacher is a model reading the prompt with the task's worked solution added
(`temper.train.features.privileged.teacher_messages`). It can only teach if that context makes it better: this
script evaluates each model on the same held-out problems twice, on the student's prompt and on the
teacher's prompt, through the one evaluation path (`temper.evaluate.evaluate`: greedy accuracy and
mean@k), and prints one markdown table.

    python experiments/privileged_accuracy.py start=runs/opsd/seed-0/02-start/model \
        opsd=runs/opsd/seed-0/04-opsd/model --task arithmetic --options '{"max_digits": 2, "ood_digits": 3}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from tables import table

from temper.atomic import atomic_write_text
from temper.catalog import make_recipe_task
from temper.evaluate import evaluate
from temper.models import load_model, load_tokenizer
from temper.rollout import HFSampler
from temper.tasks.base import Problem, Task
from temper.train.features.privileged import teacher_messages


class WithSolution:
    """`task` whose prompts carry the privileged context; grading and everything else are the task's."""

    def __init__(self, task: Task):
        self.task = task

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        return [
            dataclasses.replace(p, chat=teacher_messages(self.task, p))
            for p in self.task.sample(split, n, seed)
        ]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="name=path of a saved model")
    parser.add_argument("--task", default="arithmetic")
    parser.add_argument("--options", default="{}", help="the task's recipe options, as JSON")
    parser.add_argument("--n", type=int, default=300, help="held-out test problems")
    parser.add_argument("--seed", type=int, default=1234, help="which problems (the eval stage's default)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    task = make_recipe_task(args.task, json.loads(args.options))
    rows = []
    for spec in args.models:
        name, path = spec.split("=", 1)
        model, tokenizer = load_model(path), load_tokenizer(path)
        sampler = HFSampler(model, tokenizer, max_batch_rows=64)
        cells = []
        for view in (task, WithSolution(task)):
            r = evaluate(
                sampler, tokenizer, view, "test", n_problems=args.n, seed=args.seed, k=args.k,
                max_new_tokens=args.max_new_tokens, n_examples=0,
            )  # fmt: skip
            m = r["metrics"]
            cells += [
                f"{100 * m['greedy_accuracy']['value']:.1f}",
                f"{100 * m[f'mean@{args.k}']['value']:.1f}",
            ]
        rows.append([name, *cells])
    header = [
        "model",
        "greedy %",
        f"mean@{args.k} %",
        "greedy % with solution",
        f"mean@{args.k} % with solution",
    ]
    text = "\n".join(table(header, rows)) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
