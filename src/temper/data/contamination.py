"""Contamination check: does a training set contain the recipe's evaluation problems?

Every stage that loads a training set (SFT rows, rft samples, preference pairs, RL prompts)
checks it here against every eval set of the recipe (the eval stages' tasks, splits, problem
counts and seeds, and the held-out test/ood problems of every task that RL and rft grade), and
records the counts in its stage json under `contamination`; with `action: drop` the flagged rows
are removed before training.

Two checks, on text normalized to lower case with runs of whitespace made one space:

- exact: a user turn (or prompt, or text row) of the training row equals an eval problem's prompt;
- n-gram: the row covers at least `coverage` of the eval prompt's informative characters with
  character n-grams it shares with it (Touvron et al. 2023, Llama 2 §A.6: a sample is "dirty"
  when over 80% of its tokens lie in n-grams that also occur in the training data).

Why characters, and why n = 20. temper's built-in tokenizer is byte-level, so a character is a
token, and the built-in problems are short: `23*9=?` is 6 characters, a GeneralPoints hand is
7-11 characters inside ~80 characters of fixed instructions. A word 13-gram (GPT-3's rule) never
occurs in a 6-character problem, nor does any character n-gram longer than the problem. So each
eval prompt is padded with a space at both ends (a match must begin and end at a word boundary:
`5*6=?` is not inside `15*6=?`), and one shorter than n is matched whole (every arithmetic
prompt). In a longer prompt, what distinguishes it is short, so n is chosen long enough that
every window holding part of it also holds context: with n = 20 a window over a GeneralPoints
hand reaches the prompt's start or its face values, so a train hand shown with other face values
(the OOD split repeats train hands with J=11 Q=12 K=13, by design) is not a leak, while an eval
prompt copied whole, anywhere in a row, is. Measured on 1,500 train-split demonstrations per
task against 700 test and 700 OOD prompts per task: n = 13 or 16 flag 36 honest rows (all of
them such hands), n = 20 and 24 none (tests/test_contamination.py keeps that true). N-grams found
in more than max(2, 1%) of the eval prompts (the instructions every problem repeats) are no
evidence of a leak and are ignored, and so are the characters only they cover; at least
`coverage` of the rest must be covered.

Tasks whose prompt does not identify a problem. An environment task's prompt is its first
observation, which other problems share: a treasure-hunt prompt is the agent's 3x3 local view, and
hundreds of the 500 seen maps open with the same views as the unseen test maps, though no map is
in both. Such a task names what identifies a problem (`problem_key`, the map), and its eval
problems are matched by that key, never by text: a demonstration made from a task problem carries
the problem's key (`Example.key`), an RL prompt is the problem itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ContaminationSpec(BaseModel):
    """The recipe's `contamination:` block."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    n: int = Field(20, ge=2)
    """Characters per n-gram (a shorter eval prompt is matched whole, at word boundaries)."""
    coverage: float = Field(0.8, gt=0, le=1)
    """Share of an eval prompt's informative characters a training row must cover to be flagged."""
    action: Literal["warn", "drop"] = "warn"
    """warn: count and report; drop: also remove the flagged rows before training."""
    eval_problems: int = Field(500, ge=0)
    """Held-out problems per task and split (test, ood) checked besides the eval stages' own."""


def normalize(text: str) -> str:
    """Lower case, whitespace runs made one space, one space at both ends (a word boundary)."""
    return " " + " ".join(text.lower().split()) + " "


@dataclass
class Index:
    """The eval prompts of a recipe, by eval set name (e.g. `arithmetic:test`), ready to be matched."""

    eval_sets: dict[str, list[str]]
    n: int = 20
    coverage: float = 0.8
    keys: dict[str, list[str]] = field(default_factory=dict)
    """The eval problems of tasks whose prompt does not identify a problem, by eval set name, as
    their tasks' `problem_key`s: matched by key, never by text (module docstring)."""
    items: list[tuple[str, str]] = field(init=False)  # (set name, normalized prompt or problem key)
    by_key: dict[str, list[int]] = field(init=False)
    exact: dict[str, list[int]] = field(init=False)
    grams: dict[int, dict[str, list[tuple[int, int]]]] = field(init=False)  # width -> gram -> (item, start)
    informative: list[frozenset[int]] = field(init=False)

    def __post_init__(self) -> None:
        self.items = []
        for name, texts in self.eval_sets.items():
            self.items += [(name, t) for t in dict.fromkeys(normalize(t) for t in texts) if t.strip()]
        self.exact = defaultdict(list)
        for i, (_, text) in enumerate(self.items):
            self.exact[text.strip()].append(i)
        windows: list[dict[str, list[int]]] = []
        spread: dict[str, int] = defaultdict(int)  # gram -> eval prompts holding it
        for _, text in self.items:
            m = min(self.n, len(text))
            starts: dict[str, list[int]] = defaultdict(list)
            for s in range(len(text) - m + 1):
                starts[text[s : s + m]].append(s)
            windows.append(starts)
            for gram in starts:
                spread[gram] += 1
        common = max(2, 0.01 * len(self.items))
        self.grams = defaultdict(lambda: defaultdict(list))
        self.informative = []
        for i, starts in enumerate(windows):
            covered: set[int] = set()
            for gram, at in starts.items():
                if spread[gram] > common:  # instructions every problem repeats
                    continue
                for s in at:
                    self.grams[len(gram)][gram].append((i, s))
                    covered.update(range(s, s + len(gram)))
            self.informative.append(frozenset(covered))
        self.by_key = defaultdict(list)
        for name, keys in self.keys.items():
            for key in dict.fromkeys(keys):
                self.by_key[key].append(len(self.items))
                self.items.append((name, key))
                self.informative.append(frozenset())  # never matched by text

    def match(
        self, prompts: Iterable[str], full_text: str, key: str | None = None
    ) -> tuple[set[int], set[int]]:
        """(eval items a prompt of the row equals, or whose problem key is the row's `key`; eval
        items the row's whole text covers)."""
        exact = {i for p in prompts for i in self.exact.get(normalize(p).strip(), ())}
        if key is not None:
            exact |= set(self.by_key.get(key, ()))
        text = normalize(full_text)
        covered: dict[int, set[int]] = defaultdict(set)
        for width, table in self.grams.items():
            for s in range(len(text) - width + 1):
                for item, start in table.get(text[s : s + width], ()):
                    covered[item].update(range(start, start + width))
        ngram = {
            item
            for item, pos in covered.items()
            if self.informative[item] and len(pos) >= self.coverage * len(self.informative[item])
        }
        return exact, ngram


def _content(value: Any) -> str:
    """A text field's text: a string as is, a message list's contents joined."""
    if isinstance(value, str):
        return value
    return "\n".join(m["content"] for m in value or [] if isinstance(m.get("content"), str))


def row_texts(row: Any) -> tuple[list[str], str]:
    """(the prompts of a training row, its whole text), for every kind of row a stage trains on:
    a chat / prompt-completion / text `Example`, a preference `Pair` or a KTO `Labelled`, or an RL
    prompt (a task `Problem`). The prompts are the user and system turns (or the prompt field)."""
    messages = getattr(row, "messages", None)
    if callable(messages):  # a task Problem: messages() is its chat prompt
        turns = messages()
        return [_content([m]) for m in turns if m.get("role") in ("user", "system")], _content(turns)
    if messages is not None:
        return [_content([m]) for m in messages if m.get("role") in ("user", "system")], _content(messages)
    if getattr(row, "text", None) is not None:
        return [row.text], row.text
    prompt = row.prompt
    prompts = (
        [_content([m]) for m in prompt if m.get("role") in ("user", "system")]
        if isinstance(prompt, list)
        else [prompt]
    )
    answers = [
        _content(getattr(row, f))
        for f in ("completion", "chosen", "rejected")
        if getattr(row, f, None) is not None
    ]
    return prompts, "\n".join([_content(prompt), *answers])


def row_key(row: Any, tasks: dict[str, Any]) -> str | None:
    """What identifies the problem a training row was made from, where its task names one
    (`problem_key`): an RL prompt's (a task `Problem`), or the key a demonstration carries."""
    if callable(getattr(row, "messages", None)):  # a task Problem
        task = tasks.get(row.task)
        return task.problem_key(row) if _keys(task) else None
    return getattr(row, "key", None)


def _keys(task: Any) -> bool:
    """Whether `task` names its problems' keys (`temper.tasks.base.KeysProblems`; the data layer is
    below the tasks, so the protocol is checked by its one method)."""
    return callable(getattr(task, "problem_key", None))


HELD_OUT_SEED = 4242  # = temper.stages.rl.HELD_OUT_SEED, the problems rl and rft grade (a test checks)


def eval_sets(
    tasks: dict[str, Any], evals: Iterable[tuple[list[str], list[str], int, int]], held_out: int
) -> dict[str, list[str]]:
    """The eval prompts of a recipe by `task:split`: each eval stage's (tasks, splits, n_problems,
    seed), and `held_out` test and ood problems of every task at HELD_OUT_SEED (what rl's periodic
    evals and rft's accuracy grade). A task without an ood split gives none, and a task with a
    `problem_key` none either: its problems are in `eval_keys`. An eval of the train split is no
    held-out set (it measures how well the seen problems were learned, e.g. the treasure hunt's
    seen maps), so overlapping it is no leak and it is left out."""
    return _drawn(tasks, evals, held_out, keyed=False)


def eval_keys(
    tasks: dict[str, Any], evals: Iterable[tuple[list[str], list[str], int, int]], held_out: int
) -> dict[str, list[str]]:
    """The same eval problems as `eval_sets`, of the tasks with a `problem_key` only, as keys."""
    return _drawn(tasks, evals, held_out, keyed=True)


def _drawn(
    tasks: dict[str, Any], evals: Iterable[tuple[list[str], list[str], int, int]], held_out: int, keyed: bool
) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    wanted = [(list(tasks), ["test", "ood"], held_out, HELD_OUT_SEED)] if held_out else []
    for names, splits, n, seed in [*wanted, *evals]:
        for name in names or list(tasks):
            if name not in tasks or _keys(tasks[name]) != keyed:
                continue
            for split in (s for s in splits if s != "train"):  # a train-split eval grades seen problems
                try:
                    drawn = tasks[name].sample(split, n, seed)
                except ValueError:  # a data task without that split (no ood_data): nothing to check
                    continue
                out[f"{name}:{split}"] += [tasks[name].problem_key(p) if keyed else p.prompt for p in drawn]
    return {k: list(dict.fromkeys(v)) for k, v in out.items()}


def screen(rows: list[Any], ctx: Any, what: str, can_drop: bool = True) -> tuple[list[Any], dict[str, Any]]:
    """Check a stage's training rows against the eval sets of `ctx` (a `StageContext`: its tasks,
    `eval_specs` and `contamination` settings) -> (the rows to train on, the `contamination` block).
    Says on the console how many rows were flagged, and whether they were dropped. `can_drop`
    False (RL, whose prompts are drawn step by step): counted, never dropped, and the block says so."""
    from rich.console import Console

    spec = getattr(ctx, "contamination", None) or ContaminationSpec()
    if not can_drop and spec.action == "drop":
        spec = spec.model_copy(update={"action": "warn"})
    evals = list(getattr(ctx, "eval_specs", ()))
    index = Index(
        eval_sets(ctx.tasks, evals, spec.eval_problems),
        spec.n,
        spec.coverage,
        keys=eval_keys(ctx.tasks, evals, spec.eval_problems),
    )
    described = []
    for i, row in enumerate(rows):
        prompts, text = row_texts(row)
        where = f"{getattr(row, 'source', getattr(row, 'task', what))}:{getattr(row, 'line', getattr(row, 'id', i + 1))}"
        described.append((where, prompts, text, row_key(row, ctx.tasks)))
    keep, block = check(described, index, spec.action)
    if not can_drop:
        block["note"] = f"{what} draws its prompts as it trains: they are counted here, never dropped"
    if block["contaminated"]:
        Console(stderr=True).print(
            f"[yellow]warning[/]: {what}: {block['contaminated']} of {len(rows)} training rows overlap the eval sets "
            f"({block['exact']} exact, {block['ngram']} n-gram; {block['by_eval_set']})"
            + (
                ", dropped (contamination.action: drop)"
                if spec.action == "drop"
                else "; set contamination.action: drop to leave them out"
            )
        )
    return [rows[i] for i in keep], block


def check(
    rows: list[tuple[Any, ...]], index: Index, action: str = "warn", max_examples: int = 5
) -> tuple[list[int], dict[str, Any]]:
    """Check rows given as (where, prompts, whole text[, problem key]) -> (indices of the rows to
    keep, the `contamination` block of the stage json). With action "drop" the flagged rows are
    left out. A problem key is matched against `Index.keys` (a same-problem hit counts as exact)."""
    exact_rows = ngram_rows = contaminated = 0
    by_set: dict[str, int] = defaultdict(int)
    keep: list[int] = []
    examples: list[dict[str, Any]] = []
    for r, (where, prompts, text, *key) in enumerate(rows):
        exact, ngram = index.match(prompts, text, key[0] if key else None)
        exact_rows += bool(exact)
        ngram_rows += bool(ngram)
        hit = exact | ngram
        contaminated += bool(hit)
        for name in {index.items[i][0] for i in hit}:
            by_set[name] += 1
        if hit and len(examples) < max_examples:
            i = min(hit)
            examples.append(
                {"row": where, "eval_set": index.items[i][0], "eval_prompt": index.items[i][1].strip(),
                 "how": ("same problem" if index.items[i][0] in index.keys else "exact") if i in exact else "n-gram"}
            )  # fmt: skip
        if not (hit and action == "drop"):
            keep.append(r)
    block = {
        "n": index.n,
        "coverage": index.coverage,
        "action": action,
        "eval_sets": {name: len(texts) for name, texts in (index.eval_sets | index.keys).items()},
        "rows": len(rows),
        "exact": exact_rows,
        "ngram": ngram_rows,
        "contaminated": contaminated,
        "by_eval_set": dict(by_set),
        "dropped": len(rows) - len(keep),
        "examples": examples,
    }
    return keep, block
