"""Reward functions as TRL calls them, and the built-in graders a data task can name.

A user's reward function is named `module:function` (a module importable from the recipe's
folder, or an installed one) or `path/to/file.py:function`, and is called exactly as TRL 1.16's
`GRPOTrainer._calculate_rewards` calls `reward_funcs`, so a TRL user's functions work unchanged:

    fn(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float | None]

one call per batch (a group of samples of one prompt in RL), every list as long as the batch.
`prompts` holds each row's prompt as the data set gives it: a string ("standard" format) or a
list of chat messages ("conversational"); the completions follow the prompt's format: strings, or
`[{"role": "assistant", "content": text}]` (TRL `is_conversational` on the prompt). `columns` are
every column of the row except "prompt", "completion" and "completion_ids", one value per
completion (TRL repeats the row's values for each generation). None means "not applicable" and
counts as 0 in the weighted sum (TRL's nan + nansum); a NaN or infinite reward is refused
(TRL would train on it), as is a string. A coroutine function is awaited (TRL runs async reward
functions concurrently; so does `call_all`, each on an event loop of its own). Unlike TRL,
`trainer_state`, `log_extra` and `log_metric` are not passed.

A user's function is user code (`temper.guard`): each call runs under the time limit
`guard.timeout_s()` in a thread of its own, and a function that raises, hangs or returns what it
must not is a `UserCodeFailure` naming it, the problem and what went wrong, in one line. The
built-in graders are called in the caller's thread (math-verify's own time limits need the main
thread).

Built-in graders (`GRADERS`) follow the same signature and also say whether they could extract
an answer (the task's `parsed`): exact_match, numeric_match, math_verify (the `math-verify`
package: LaTeX, fractions, \\boxed{}), regex (a format check).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from temper import guard
from temper.guard import Done, UserCodeFailure
from temper.tasks.expression import ANSWER_PREFIX, END_MARKERS

EXCLUDED_COLUMNS = ("prompt", "completion", "completion_ids")  # as TRL: passed as arguments, not columns


@dataclass
class RewardFunction:
    """A reward function and what it is called in logs and errors."""

    name: str
    fn: Callable[..., Any]
    source: str = ""  # the code it was loaded from (its file's text), for the stage's settings hash
    extract: Callable[[str], str | None] | None = None  # built-in graders: the answer they read
    trusted: bool = False
    """temper's own (a built-in grader): called in the caller's thread, without a time limit."""


def is_conversational(prompt: Any) -> bool:
    """TRL's test: a prompt given as a list of chat messages."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def completions_as_trl(prompts: Sequence[Any], texts: Sequence[str]) -> list[Any]:
    """Completion texts in the format TRL passes them: conversational when the prompt is."""
    return [
        [{"role": "assistant", "content": t}] if is_conversational(p) else t
        for p, t in zip(prompts, texts, strict=True)
    ]


# ---------------------------------------------------------------- loading user functions


def load_reward_function(spec: str, base_dir: Path | None = None, what: str = "reward") -> RewardFunction:
    """`module:function` or `path/file.py:function`, relative to `base_dir` (the recipe's folder).

    A module whose file lies under `base_dir` is loaded from that file under a name of its own
    (so two recipes' `rewards.py` never share sys.modules), with `base_dir` on sys.path while it
    runs so its own imports of neighbouring modules work; any other name is imported normally."""
    module_name, colon, fn_name = spec.rpartition(":")
    if not colon or not module_name or not fn_name:
        raise ValueError(
            f"{what} {spec!r}: expected module:function or path/to/file.py:function, "
            f"or a built-in grader ({', '.join(GRADERS)})"
        )
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    if module_name.endswith(".py") or "/" in module_name:
        file = Path(module_name).expanduser()
        file = file if file.is_absolute() else base / file
        if not file.is_file():
            raise ValueError(f"{what} {spec!r}: no file {str(file)!r}")
        module = _load_file(file, base, what)
    else:
        local = base / (module_name.replace(".", "/") + ".py")
        if local.is_file():
            module = _load_file(local, base, what)
        else:
            try:
                module = importlib.import_module(module_name)
            except ImportError as err:
                raise ValueError(
                    f"{what} {spec!r}: cannot import module {module_name!r}: no {local.name} in {base} "
                    f"and no installed module ({err})"
                ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        functions = sorted(
            n
            for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and not isinstance(v, type)
        )
        raise ValueError(
            f"{what} {spec!r}: module {module_name!r} has no function {fn_name!r}"
            + (f"; its functions: {', '.join(functions)}" if functions else "")
        )
    file = getattr(module, "__file__", None)
    source = Path(file).read_text(errors="replace") if file and Path(file).is_file() else ""
    return RewardFunction(spec, fn, source)


MODULE_PREFIX = "temper_rewards_"
"""The start of the name a module file of the recipe's is loaded under (a worker pool sends its
classes and functions by value: no other process could import it by that name)."""


def _load_file(file: Path, base: Path, what: str = "reward") -> Any:
    """The module of `file`, executed once per content: recipe validation, the plan check and the
    run share it (and its state), and an edited file is loaded afresh. Executing it is user code:
    under the time limit, its failure one line naming the file (as an `env` or `reward` module)."""
    file = file.resolve()
    digest = hashlib.sha256(str(file).encode() + b"\0" + file.read_bytes()).hexdigest()[:12]
    name = f"{MODULE_PREFIX}{digest}_{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None  # a .py file always has a loader
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(base))
    try:
        guard.call(spec.loader.exec_module, module, what=f"{what} module {str(file)!r}", context="import")
    except UserCodeFailure as err:
        raise ValueError(err.line) from None
    finally:
        sys.path.remove(str(base))
    sys.modules[name] = module  # pickling and `inspect` find it again
    return module


# ---------------------------------------------------------------- calling them


@dataclass
class Outcome:
    """What the reward functions said about a batch: values[f][i] (None: not applicable, or the
    function failed on completion i), and errors[i] the first failure on completion i (a
    `UserCodeFailure`: its line names the function, the completion's problem and the error)."""

    values: list[list[float | None]]
    errors: list[UserCodeFailure | None] = field(default_factory=list)


def call_all(
    functions: Sequence[RewardFunction],
    prompts: Sequence[Any],
    texts: Sequence[str],
    completion_ids: Sequence[Sequence[int]] | None,
    columns: Sequence[dict[str, Any]],
    completions: Sequence[Any] | None = None,
    labels: Sequence[str] | None = None,
) -> Outcome:
    """Every function on the whole batch, TRL's way (async ones awaited together). A function
    that raises on the batch is called again one completion at a time, so only the completions it
    cannot grade fail; one whose answer is not one reward per completion, or that runs past its
    time limit, fails the whole batch (a time-out is not retried: each call would wait the limit
    again); a reward that is not a finite float or None fails its own completion. `completions`
    replaces the ones made from `texts` where TRL passes more than one message per completion (a
    tool-calling episode: assistant turns and tool results). `labels` say what each completion is
    (e.g. "problem rows.jsonl:3"), for the failures' lines."""
    n = len(texts)
    labels = list(labels) if labels is not None else [""] * n
    completions = completions_as_trl(prompts, texts) if completions is None else list(completions)
    ids = [list(c) for c in completion_ids] if completion_ids is not None else [[] for _ in texts]
    keys = [k for k in dict.fromkeys(k for row in columns for k in row) if k not in EXCLUDED_COLUMNS]
    kwargs = {k: [row.get(k) for row in columns] for k in keys}
    batch = {"prompts": list(prompts), "completions": completions, "completion_ids": ids, **kwargs}
    results = _run(functions, [batch] * len(functions))
    values: list[list[float | None]] = []
    errors: list[UserCodeFailure | None] = [None] * n
    for f, result in zip(functions, results, strict=True):
        checked = _checked(f, result, n, _batch_label(labels), labels)
        if isinstance(checked, UserCodeFailure) and checked.kind == "raised":  # one at a time, to find
            each = []  # the completions it fails on
            for i in range(n):
                [single] = _run([f], [{k: v[i : i + 1] for k, v in batch.items()}])
                each.append(_checked(f, single, 1, labels[i]))
                if isinstance(each[-1], UserCodeFailure) and each[-1].kind == "timeout":
                    each += [each[-1]] * (n - i - 1)  # the rest would wait the limit each: they fail too
                    break
            if all(isinstance(e, UserCodeFailure) for e in each):  # it fails on each alone too: what
                each = [checked] * n  # it did with the batch (TRL's call) says more
            checked = (
                [None if isinstance(e, UserCodeFailure) else e[0][0] for e in each],
                [e if isinstance(e, UserCodeFailure) else e[1][0] for e in each],
            )
        elif isinstance(checked, UserCodeFailure):
            checked = ([None] * n, [checked] * n)
        rewards, failures = checked
        errors = [e or failure for e, failure in zip(errors, failures, strict=True)]
        values.append(rewards)
    return Outcome(values, errors)


def _batch_label(labels: Sequence[str]) -> str:
    """What a batch is, for a failure of the whole batch: its one problem or its first ones."""
    distinct = list(dict.fromkeys(labels))
    if len(labels) <= 1 or not distinct[0]:
        return distinct[0] if distinct else ""
    if len(distinct) == 1:
        return f"{distinct[0]} ({len(labels)} completions)"
    return f"{len(labels)} completions ({', '.join(distinct[:2])}{', ...' if len(distinct) > 2 else ''})"


def _checked(
    f: RewardFunction, done: Done, n: int, context: str = "", labels: Sequence[str] | None = None
) -> tuple[list[float | None], list[UserCodeFailure | None]] | UserCodeFailure:
    """One call's rewards and the failure of each completion whose reward is not a finite float
    or None (`labels[i]` says which it is), or the failure of the whole call: it raised, ran past
    its time limit, or did not return one reward per completion (TRL's message for a wrong count)."""
    what = f"reward function {f.name}"
    labels = list(labels) if labels is not None else [context] * n
    if done.timed_out:
        return guard.timed_out(what, done.seconds, context)
    if done.error is not None:
        return guard.raised(done.error, what, context)
    result = done.value
    if isinstance(result, str | bytes | dict) or not hasattr(result, "__iter__"):
        return guard.returned(what, f"{type(result).__name__}, not a list of floats or None", context)
    result = list(result)
    if len(result) != n:  # TRL's message
        return guard.returned(
            what, f"{len(result)} rewards, but {n} were expected (one per prompt-completion pair)", context
        )
    out: list[float | None] = []
    failures: list[UserCodeFailure | None] = []
    for i, r in enumerate(result):
        value = None if r is None else _number(r)
        failure = None
        if r is not None and value is None:
            failure = guard.returned(what, f"{type(r).__name__} {r!r:.40} for completion {i + 1}, not a float or None", labels[i])  # fmt: skip
        elif value is not None and not math.isfinite(value):
            failure = guard.returned(
                what, f"a non-finite reward ({value}) for completion {i + 1}: return None where it does not apply",
                labels[i],
            )  # fmt: skip
        out.append(None if failure else value)
        failures.append(failure)
    return out, failures


def _number(r: Any) -> float | None:
    """A reward as a float (an int, a bool, a numpy or 0-d torch number); None for anything else
    (a string, even one that reads as a number, is a bug in the function, not a reward)."""
    if isinstance(r, str | bytes):
        return None
    try:
        return float(r)
    except (TypeError, ValueError):
        return None


def _run(functions: Sequence[RewardFunction], kwargs: Sequence[dict[str, Any]]) -> list[Done]:
    """Call each function with its kwargs -> how each call ended. A user's sync functions run one
    after another, each in a thread of its own under the time limit; async ones all at once, each
    on its own event loop in its own thread (awaited together, as TRL gathers them); temper's
    graders in this thread."""
    out: list[Done | None] = [None] * len(functions)
    waiting = []
    for i, (f, kw) in enumerate(zip(functions, kwargs, strict=True)):
        if f.trusted:
            t0 = time.perf_counter()
            try:
                out[i] = Done(value=f.fn(**kw))
            except Exception as err:
                out[i] = Done(error=err)
            out[i].seconds = time.perf_counter() - t0
        elif _is_async(f.fn):
            waiting.append(i)
        else:
            [out[i]] = guard.run_all([lambda f=f, kw=kw: _invoke(f.fn, kw)], workers=1, name=f.name)
    calls = [lambda i=i: _invoke(functions[i].fn, kwargs[i]) for i in waiting]
    for i, done in zip(waiting, guard.run_all(calls, workers=len(calls) or 1, name="async"), strict=True):
        out[i] = done
    return [d if d is not None else Done() for d in out]


def _is_async(fn: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose `__call__` is one."""
    call = type(fn).__call__ if not inspect.isfunction(fn) and not inspect.ismethod(fn) else None
    return inspect.iscoroutinefunction(fn) or (call is not None and inspect.iscoroutinefunction(call))


def _invoke(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """`fn(**kwargs)`, awaited on an event loop of this thread's own when it is a coroutine."""
    out = fn(**kwargs)
    if inspect.isawaitable(out):

        async def wait() -> Any:
            return await out

        return asyncio.run(wait())
    return out


# ---------------------------------------------------------------- built-in graders

_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, braces balanced; None if there is none."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return None


def strip_end_markers(text: str) -> str:
    """`text` stripped, without the end-of-turn markers it ends in (END_MARKERS)."""
    text = text.strip()
    for marker in END_MARKERS:
        if text.endswith(marker):
            return strip_end_markers(text[: -len(marker)])
    return text


def extract_final(text: str, pattern: re.Pattern[str] | None = None) -> str | None:
    """The final answer of a completion: the first group (or whole match) of `pattern` when one is
    given (the task's `format`), else the last \\boxed{}, else the text after the last `Answer:`,
    else None. Graders that read a bare number fall back further (see `numeric_match`)."""
    text = strip_end_markers(text)
    if pattern is not None:
        m = pattern.search(text)
        if m is None:
            return None
        return (m.group(1) if m.groups() else m.group(0)).strip() or None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed or None
    at = text.rfind(ANSWER_PREFIX)
    if at >= 0:
        return text[at + len(ANSWER_PREFIX) :].strip() or None
    return None


def parse_number(text: str) -> Fraction | None:
    """A number written as an integer, decimal, `a/b`, `\\frac{a}{b}`, with `,` thousands
    separators, a trailing `%` or `$`; None otherwise. Exact (Fraction), so 0.1 + 0.2 is 0.3."""
    t = text.strip().strip("$").replace("\\!", "").replace(",", "").rstrip(".").strip()
    m = re.fullmatch(r"\\d?frac\{\s*([-+]?\d+)\s*\}\{\s*([-+]?\d+)\s*\}", t)
    if m:
        t = f"{m.group(1)}/{m.group(2)}"
    t = t.removesuffix("\\%").removesuffix("%").strip()
    try:
        value = Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None
    return value


@dataclass(frozen=True)
class Grader:
    """A built-in grader: `__call__` has TRL's reward signature and scores the answer it extracts
    against the row's `column`; `extract` says what it read (None: nothing, so not parsed)."""

    name: str
    column: str = "answer"
    tolerance: float = 1e-6
    pattern: str | None = None  # regex: the format to match; others: where the answer is (group 1)

    def extract(self, text: str) -> str | None:
        compiled = re.compile(self.pattern) if self.pattern else None
        if self.name == "regex":
            return text if compiled is not None and compiled.search(text) else None
        if self.name == "math_verify" and compiled is None:  # math-verify finds the answer itself
            parsed = _math_parse(strip_end_markers(text))
            return parsed[-1] if parsed else None
        found = extract_final(text, compiled)
        if found is None and self.name == "numeric_match" and compiled is None:
            numbers = _NUMBER.findall(strip_end_markers(text))  # a bare number: the last one written
            found = numbers[-1] if numbers else None
        return found

    def __call__(self, prompts: Any = None, completions: Sequence[Any] = (), **columns: Any) -> list[float]:
        references = columns.get(self.column, [None] * len(completions))
        return [self.grade(_text(c), r) for c, r in zip(completions, references, strict=True)]

    def grade(self, text: str, reference: Any) -> float:
        answer = self.extract(text)
        if answer is None:
            return 0.0
        if self.name == "regex":
            return 1.0
        if reference is None:
            raise ValueError(f"{self.name}: the row has no {self.column!r} column to compare with")
        if self.name == "exact_match":
            return float(_normalize(answer) == _normalize(str(reference)))
        if self.name == "numeric_match":
            got, want = parse_number(answer), parse_number(str(reference))
            if want is None:
                raise ValueError(f"numeric_match: reference {reference!r} is not a number")
            if got is None:
                return 0.0
            return float(abs(got - want) <= self.tolerance * max(1.0, abs(float(want))))
        return float(_math_equal(answer, str(reference)))


def _text(completion: Any) -> str:
    """A completion's text in either TRL format."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, dict))
    return str(completion)


def _normalize(text: str) -> str:
    return " ".join(text.strip().split()).rstrip(".").lower()


def _main_thread() -> bool:
    """math-verify's timeouts use SIGALRM, which only the main thread may set: elsewhere it runs
    without them."""
    return threading.current_thread() is threading.main_thread()


def _math_parse(text: str) -> list[Any]:
    """math-verify's parse (LaTeX anywhere in the text, \\boxed{} first, or a plain expression);
    bare LaTeX without $ delimiters (a reference column's `\\frac{1}{2}`) is parsed as math."""
    from math_verify import parse  # imported on use: sympy takes a second to load

    timeout = 5 if _main_thread() else None
    found = parse(text, parsing_timeout=timeout)
    if not found and "$" not in text:
        found = parse(f"${text}$", parsing_timeout=timeout)
    return found


def _math_equal(answer: str, reference: str) -> bool:
    """math-verify's verify(gold, answer), both parsed by `_math_parse`."""
    from math_verify import verify

    gold, got = _math_parse(reference), _math_parse(answer)
    if not gold or not got:
        return False
    return bool(verify(gold, got, timeout_seconds=5 if _main_thread() else None))


GRADERS = ("exact_match", "numeric_match", "math_verify", "regex")
GRADER_OPTIONS = ("grader", "column", "tolerance", "pattern")


def make_grader(spec: str | dict[str, Any], answer_column: str, format_pattern: str | None) -> Grader:
    """A built-in grader from its name or a mapping `{grader: NAME, column:, tolerance:, pattern:}`;
    its answer column defaults to the task's `answer`, its pattern to the task's `format`."""
    options = {"grader": spec} if isinstance(spec, str) else dict(spec)
    unknown = [k for k in options if k not in GRADER_OPTIONS]
    if unknown:
        raise ValueError(f"unknown grader option {unknown[0]!r}; valid: {', '.join(GRADER_OPTIONS)}")
    name = options.get("grader")
    if name not in GRADERS:
        raise ValueError(f"unknown grader {name!r}; built-in graders: {', '.join(GRADERS)}")
    pattern = options.get("pattern", format_pattern)
    if name == "regex" and not pattern:
        raise ValueError("the regex grader needs a pattern (its own `pattern:` or the task's `format:`)")
    if pattern:
        re.compile(pattern)  # a bad pattern is a recipe error, not a verifier error later
    return Grader(name, options.get("column", answer_column), float(options.get("tolerance", 1e-6)), pattern)
