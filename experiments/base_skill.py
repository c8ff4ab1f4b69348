"""What a pre-trained base can do in its own notation, before any SFT: greedy completion of the
corpus prefix of held-out problems (`37+45=` -> `82`; `3 8 10 1 to 24:` -> steps and `; EXPR=24`),
graded by the task. The numbers checkpoints/*-base/README.md quote.

    python experiments/base_skill.py checkpoints/small-base/model --n 300

Each prompt is the corpus line up to its answer, with nothing before it (a packed row's first
document; with an end-of-sequence token before it the tiny base drops from 76% to 42% on
arithmetic); the completion runs to the first newline or eos.
Arithmetic: the digits that follow `=` must be the answer. GeneralPoints: the expression after
the last `;` is graded by the task (`Answer: EXPR`), so wrong cards or a wrong value fail.
"""

from __future__ import annotations

import argparse

import torch

from temper.models.loading import load_model, load_tokenizer
from temper.rollout.hf_sampler import HFSampler
from temper.tasks import Arithmetic, ArithmeticConfig, GeneralPoints, GeneralPointsConfig


def prefixes(task, split: str, n: int, seed: int) -> list[tuple[object, str]]:
    out = []
    for problem in task.sample(split, n, seed):
        text = task.corpus_text(problem)
        cut = text.index("=") + 1 if task.name == "arithmetic" else text.index(":") + 1
        out.append((problem, text[:cut]))
    return out


def graded(task, problem, prefix: str, completion: str) -> bool:
    if task.name == "arithmetic":
        digits = ""
        for ch in completion.lstrip("-"):
            if not ch.isdigit():
                break
            digits += ch
        sign = "-" if completion.startswith("-") else ""
        return bool(digits) and int(sign + digits) == problem.data["answer"]
    expression = completion.rsplit(";", 1)[-1].strip()
    return task.score(problem, f"Answer: {expression}").correct


def complete(model, tokenizer, texts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy completions through temper's own sampler (what eval and RL decode with), up to the
    first newline."""
    sampler = HFSampler(model, tokenizer)
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    samples = sampler.sample(prompts, 1, max_new_tokens=max_new_tokens, temperature=0.0)
    return [s[0].text.split("\n")[0] for s in samples]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    device = torch.device("cpu")
    model, tokenizer = load_model(args.model, device).eval(), load_tokenizer(args.model)
    tasks = [
        (Arithmetic(ArithmeticConfig(max_digits=2, ood_digits=3)), ("test", "ood"), 12),
        (GeneralPoints(GeneralPointsConfig(n_cards=4, target=24)), ("test",), 96),
    ]
    for task, splits, max_new in tasks:
        for split in splits:
            items = prefixes(task, split, args.n, args.seed)
            texts = complete(model, tokenizer, [p for _, p in items], max_new)
            right = sum(graded(task, prob, p, c) for (prob, p), c in zip(items, texts, strict=True))
            print(f"{task.name} {split}: {100 * right / len(items):.1f}% of {len(items)}")


if __name__ == "__main__":
    main()
