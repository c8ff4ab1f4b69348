"""A task made from the user's data set and graded by the user's reward functions (or built-in graders).

Recipe entry (every key but `data` optional; the key `word_problems` names the task):

    word_problems:
      task: dataset
      data: examples/word_problems/problems.jsonl   # JSONL, JSON, parquet, save_to_disk folder or hub id
      prompt: question                 # column: a string (the user turn) or a list of chat messages
      completion: solution             # column holding a demonstration, for SFT (default "completion")
      answer: answer                   # the reference column the built-in graders read
      rewards: [rewards:correct, rewards:formatted]  # module:function (TRL signature) or built-in grader
      reward_weights: [1.0, 0.2]       # TRL's reward_weights; default 1 each
      correct_threshold: 1.0           # correct = the FIRST reward >= this
      format: 'Answer: (\\S+)$'        # parsed = this regex matches (group 1 = what graders read)

Splits, in order of precedence: a `split_column` (values train / test / ood; validation, valid,
dev and eval count as test); else `test_data` (another source) or `test_split` (another split of
the same hub / save_to_disk source) for test, `data` for train; else a stable `test_fraction` of
the rows by a hash of their prompt (or `id` column), so equal prompts share a split. `ood_data`
adds an out-of-distribution split. `sample(split, n, seed)` is deterministic: test and ood give a
seeded subset without repeats (at most the split's size, so held-out rows are never counted
twice); train cycles through seeded shuffles, so RL always gets the `n` prompts it asks for.

Grading: every reward function is called once per batch (an RL group, an eval's completions) with
TRL's signature (see `temper.tasks.reward_functions`). reward = sum_f w_f r_f over the functions
that returned a number (None: not applicable, as in TRL). correct = the first function's reward
>= `correct_threshold`. parsed = the `format` regex matches when given; else the first function,
if it is a built-in grader, could extract an answer; else every completion counts as parsed (so
give `format` when the gate and the probe should tell a format failure from a wrong answer). A
reward function that raises, hangs past its time limit or returns anything but one finite float
(or None) per completion makes that completion a verifier_error row whose `error` is one line
naming the function, the problem and the failure, never a crash (`temper.guard`); RL leaves such
a group out and counts it (`temper.train.user_code`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from temper.data.formats import DataError
from temper.data.sources import SourceError, read_rows  # (`datasets` only for tables and hub ids)
from temper.tasks.base import Problem, Score, TaskOptionError, check_split, draw, split_of, verifier_error
from temper.tasks.reward_functions import (
    GRADERS,
    RewardFunction,
    call_all,
    is_conversational,
    load_reward_function,
    make_grader,
    strip_end_markers,
)

TEST_LABELS = {"test": "test", "validation": "test", "valid": "test", "dev": "test", "eval": "test"}
SPLIT_VALUES = {"train": "train", "ood": "ood", **TEST_LABELS}


@dataclass(frozen=True)
class DataTaskConfig:
    data: str | None = None
    """The problems: a JSONL, JSON or parquet file, a save_to_disk folder or a hub id (a relative
    path resolves against the recipe's folder)."""
    test_data: str | None = None
    """Held-out problems from another source (then every `data` row is train)."""
    ood_data: str | None = None
    """Out-of-distribution problems (the ood split)."""
    data_split: str | None = None
    """The split of a hub / save_to_disk source to read as `data` (default: its train split)."""
    test_split: str | None = None
    """The split of `data`'s source to use as test (e.g. test), instead of `test_data`."""
    split_column: str | None = None
    """A column naming each row's split: train, test (or validation, valid, dev, eval) or ood."""
    test_fraction: float = 0.1
    """Share of the rows held out for test by a hash of the prompt, when no split is given."""
    prompt: str = "prompt"
    """Column of the prompt: a string (one user turn) or a list of chat messages."""
    completion: str | None = None
    """Column of a demonstration (a string or assistant messages), for SFT; default "completion"
    when the data has it."""
    answer: str = "answer"
    """Reference column the built-in graders compare with."""
    id: str | None = None
    """Column of a stable problem id (default: source:row)."""
    rewards: tuple[Any, ...] | None = None
    """Reward functions: module:function, path/file.py:function, or a built-in grader (exact_match,
    numeric_match, math_verify, regex; options as {grader: numeric_match, tolerance: 0.01}).
    Default: exact_match; none with an `environment_factory` (its get_reward() may be the grade)."""
    reward_weights: tuple[float, ...] | None = None
    """One weight per reward function (TRL's reward_weights); default 1 each."""
    correct_threshold: float = 1.0
    """A completion is correct when the first reward function gives at least this."""
    format: str | None = None
    """Regex the completion must match to count as parsed (re.search); its group 1 is the answer
    the built-in graders read."""
    env: str | None = None
    """An environment factory, module:function or path/file.py:function, called with each row (a
    dict) and returning a temper Env (`temper.envs.base`): the task becomes multi-turn. The
    episode's outcome is the env's final score; when the env gives none, the reward functions
    grade the last assistant turn."""
    environment_factory: str | None = None
    """A TRL environment class (`GRPOTrainer(environment_factory=...)`), module:Class or
    path/file.py:Class: each episode makes an instance and calls its reset(**row); its public
    methods are the tools (their schemas rendered into the prompt), and the final answer is graded
    by `rewards` (TRL's signature, with `environments=`) plus the class's get_reward(), if any."""
    max_turns: int = 8
    """Actions per episode of an `env` or `environment_factory` task."""

    def __post_init__(self) -> None:
        rewards = self.rewards
        if rewards is None:
            rewards = () if self.environment_factory else ("exact_match",)
        object.__setattr__(self, "rewards", tuple([rewards] if isinstance(rewards, (str, dict)) else rewards))
        if self.reward_weights is not None:
            object.__setattr__(self, "reward_weights", tuple(float(w) for w in self.reward_weights))
        if not 0.0 < self.test_fraction < 1.0:
            raise TaskOptionError(("test_fraction",), "test_fraction must be in (0, 1)")


@dataclass(frozen=True)
class _Row:
    source: str
    line: int
    values: dict[str, Any]


class DataTask:
    """Problems from rows of a data set; see the module docstring."""

    config_type: ClassVar[type] = DataTaskConfig

    def __init__(self, config: DataTaskConfig, name: str = "dataset", base_dir: Path | None = None):
        self.config, self.name = config, name
        self.base_dir = Path(base_dir) if base_dir is not None else Path.cwd()
        c = config
        if not c.data:
            raise TaskOptionError(
                ("data",), f"task {name!r}: a dataset task needs `data` (a file, folder or hub id)"
            )
        self.rewards = self._load_rewards()
        weights = c.reward_weights or (1.0,) * len(self.rewards)
        if len(weights) != len(self.rewards):
            raise TaskOptionError(
                ("reward_weights",),
                f"{len(weights)} reward_weights for {len(self.rewards)} rewards: give one weight per reward",
            )
        self.weights = weights
        self.format = re.compile(c.format) if c.format else None
        main = _rows(c.data, self.base_dir, c.data_split, "data_split" if c.data_split else "data")
        columns = list(main[0].values) if main else []
        self._check_column("prompt", c.prompt, main)
        for key in ("split_column", "id"):
            if getattr(c, key):
                self._check_column(key, getattr(c, key), main)
        self.completion = c.completion or ("completion" if "completion" in columns else None)
        if c.completion:
            self._check_column("completion", c.completion, main)
        for i, f in enumerate(self.rewards):
            column = getattr(f.fn, "column", None)
            if column is not None and f.extract is not None and getattr(f.fn, "name", "") != "regex":
                key: tuple[str | int, ...] = ("answer",) if column == c.answer else ("rewards", i)
                self._check_column(key, column, main)
        self._splits: dict[str, list[Problem]] = {"train": [], "test": [], "ood": []}
        if c.split_column:
            for row in main:
                value = row.values.get(c.split_column)
                if str(value).lower() not in SPLIT_VALUES:
                    raise DataError(
                        row.source,
                        row.line,
                        c.split_column,
                        f"split {value!r} is not one of {', '.join(SPLIT_VALUES)}",
                    )
                self._add(SPLIT_VALUES[str(value).lower()], row)
        elif c.test_data or c.test_split:
            for row in main:
                self._add("train", row)
            test = _rows(
                c.test_data or c.data,
                self.base_dir,
                c.test_split if not c.test_data else None,
                "test_data" if c.test_data else "test_split",
            )
            self._check_column("prompt", c.prompt, test)
            for row in test:
                self._add("test", row)
        else:
            for row in main:
                self._add(split_of(self._key(row), c.test_fraction), row)
        if c.ood_data:
            ood = _rows(c.ood_data, self.base_dir, None, "ood_data")
            self._check_column("prompt", c.prompt, ood)
            for row in ood:
                self._add("ood", row)

    @classmethod
    def build(cls, config: DataTaskConfig, name: str, base_dir: Path | None) -> DataTask:
        return cls(config, name, base_dir)

    # ------------------------------------------------------------ building

    def _load_rewards(self) -> list[RewardFunction]:
        out = []
        for i, spec in enumerate(self.config.rewards):
            try:
                if isinstance(spec, dict) or (isinstance(spec, str) and ":" not in spec):
                    grader = make_grader(spec, self.config.answer, self.config.format)
                    out.append(RewardFunction(grader.name, grader, extract=grader.extract, trusted=True))
                elif isinstance(spec, str):
                    out.append(load_reward_function(spec, self.base_dir))
                else:
                    raise ValueError(f"a reward is a string or a mapping, not {spec!r}")
            except (ValueError, re.error) as err:
                hint = (
                    ""
                    if ":" in str(spec)
                    else f" (built-in graders: {', '.join(GRADERS)}; yours: module:function)"
                )
                raise TaskOptionError(("rewards", i), f"task {self.name!r}: {err}{hint}") from None
        if not out and not self.config.environment_factory:  # (a TRL class may grade by get_reward)
            raise TaskOptionError(("rewards",), f"task {self.name!r}: give at least one reward")
        return out

    def _check_column(self, key: Any, column: str, rows: list[_Row]) -> None:
        """A column the task reads must be in the data: an option naming another is a recipe error
        at that option; a row without it is a data error at that row."""
        option = key if isinstance(key, tuple) else (key,)
        if not rows:
            raise TaskOptionError(("data",), f"task {self.name!r}: {self.config.data!r} has no rows")
        if not any(column in r.values for r in rows[:100]):
            present = ", ".join(rows[0].values)
            raise TaskOptionError(
                option,
                f"task {self.name!r}: column {column!r} ({'.'.join(map(str, option))}) is not in "
                f"{rows[0].source}; its columns: {present}",
            )
        for r in rows:
            if column not in r.values:
                raise DataError(
                    r.source, r.line, column, f"missing (the task's {'.'.join(map(str, option))})"
                )

    def _key(self, row: _Row) -> str:
        """What decides a row's split: its id, else its prompt (equal prompts, equal split)."""
        if self.config.id:
            return f"id:{row.values[self.config.id]}"
        return json.dumps(row.values[self.config.prompt], sort_keys=True)

    def _add(self, split: str, row: _Row) -> None:
        value = row.values[self.config.prompt]
        if isinstance(value, str):
            text, chat = value, None
        elif is_conversational(value) and all(isinstance(m, dict) and "content" in m for m in value):
            chat = [dict(m) for m in value]
            users = [m for m in chat if m.get("role") == "user"]
            text = str((users or chat)[-1]["content"])
        else:
            raise DataError(
                row.source,
                row.line,
                self.config.prompt,
                "a prompt is a string or a list of {role, content} messages",
            )
        pid = str(row.values[self.config.id]) if self.config.id else f"{Path(row.source).name}:{row.line}"
        data = {"prompt": value, "row": row.values, "source": row.source, "line": row.line}
        self._splits[split].append(Problem(self.name, split, pid, text, data, chat))

    # ------------------------------------------------------------ the Task protocol

    def sample(self, split: str, n: int, seed: int) -> list[Problem]:
        check_split(split)
        rows = self._splits[split]
        if not rows:
            how = {
                "ood": "give ood_data, or evaluate with splits: [test]",
                "test": "give test_data, test_split, a split_column, or a larger data set",
                "train": "check split_column / test_fraction",
            }[split]
            raise ValueError(f"task {self.name!r} has no {split} rows: {how}")
        return draw(rows, f"{self.name}/{split}/{seed}", n, repeat=split == "train")

    def score(self, problem: Problem, completion: str) -> Score:
        return self.score_batch([problem], [completion])[0]

    def score_batch(
        self,
        problems: Sequence[Problem],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Score]:
        outcome = call_all(
            self.rewards,
            [p.data["prompt"] for p in problems],
            completions,
            completion_ids,
            [p.data["row"] for p in problems],
            labels=[f"problem {p.id}" for p in problems],
        )
        if not self.rewards:  # an environment_factory task graded by get_reward alone: no grade outside it
            return [Score(0.0, False, False, {"reason": "no_reward_functions"}) for _ in completions]
        first = self.rewards[0]
        scores = []
        for i, text in enumerate(completions):
            if outcome.errors[i] is not None:
                scores.append(verifier_error(outcome.errors[i]))
                continue
            values = [v[i] for v in outcome.values]
            total = sum(w * v for w, v in zip(self.weights, values, strict=True) if v is not None)
            answer = first.extract(text) if first.extract is not None else None
            if self.format is not None:
                parsed = self.format.search(strip_end_markers(text)) is not None
            else:
                parsed = answer is not None if first.extract is not None else True
            correct = values[0] is not None and values[0] >= self.config.correct_threshold
            reason = "correct" if correct else "wrong" if parsed else "no_answer"
            details = {
                "reason": reason,
                "answer": answer,
                "rewards": dict(zip(self._names(), values, strict=True)),
            }
            scores.append(Score(float(total), correct, parsed, details))
        return scores

    def demonstration(self, problem: Problem) -> str:
        value = problem.data["row"].get(self.completion) if self.completion else None
        if isinstance(value, list):  # conversational: the assistant turns' text
            value = "".join(str(m.get("content", "")) for m in value if isinstance(m, dict))
        if not isinstance(value, str):
            columns = ", ".join(problem.data["row"])
            raise DataError(
                problem.data["source"],
                problem.data["line"],
                self.completion or "completion",
                f"task {self.name!r} has no demonstration to train on: set the task's `completion:` to a "
                f"column holding one (columns: {columns}), or leave this task out of SFT",
            )
        return value

    def corpus_text(self, problem: Problem) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in problem.messages())
        try:
            return f"{prompt}\n{self.demonstration(problem)}"
        except DataError:
            return prompt

    def fingerprint(self) -> str:
        """A digest of what the task grades with beyond its options: the rows and the reward
        functions' code, so a stage reruns when either changes."""
        h = hashlib.sha256()
        for split in ("train", "test", "ood"):
            for p in self._splits[split]:
                h.update(json.dumps([split, p.id, p.data["row"]], sort_keys=True, default=str).encode())
        for f in self.rewards:
            h.update(f.name.encode() + f.source.encode())
        return h.hexdigest()[:16]

    def _names(self) -> list[str]:
        """Each reward function's name in `details["rewards"]` and the RL metrics: its Python name,
        as TRL logs it (`rewards/<name>/mean`), or the grader's; repeats numbered."""
        names: list[str] = []
        for f in self.rewards:
            base = f.name.rpartition(":")[2]
            name, k = base, 2
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.append(name)
        return names


def _rows(spec: str, base_dir: Path, split: str | None, option: str = "data") -> list[_Row]:
    """The rows of a data source as (source label, 1-based row, values). A source that cannot be
    read at all is an error of the task option naming it; a bad row stays a DataError at its row."""
    try:
        return [_Row(source, line, values) for source, line, values in _read_rows(spec, base_dir, split)]
    except SourceError as err:
        raise TaskOptionError((option,), str(err)) from None


def _read_rows(spec: str, base_dir: Path, split: str | None):
    for source, line, values in read_rows(spec, base_dir, split):
        if not isinstance(values, dict):
            raise DataError(source, line, "<row>", "must be an object (a mapping of column to value)")
        yield source, line, values
