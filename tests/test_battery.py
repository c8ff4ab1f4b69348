"""The bad-input battery (issue 7): distinct bad inputs and faults across recipes, data files,
model folders, CLI flags and interrupts, each taken through the `temper` command end to end.

Every case asserts the same four things: the exit code (2 for a refusal, 130 for Ctrl-C, 143 for
SIGTERM), one `temper: error:` line (or block) naming the place (file:line, key path, field, path
or flag), no traceback, and nothing half-written: no `.tmp-`/`.old-` scratch anywhere, no output
folder created for a refused plan, and a folder that already held work left byte for byte as it
was. Cases run in-process through `temper.cli.main` where that is faithful (it is the whole
command: argument parsing, checks, the error handler); the three interrupts use a real
subprocess and a real signal.

A case is a function from a `World` (a scratch folder, a saved nano model) to a `Bad`: add one
with `@case("class/name")`.
"""

from __future__ import annotations

import faulthandler
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import temper
from temper import guard
from temper.cli import main
from temper.models import build_preset, build_tokenizer, load_model, save_model
from temper.train.checkpoint import list_checkpoints

GOOD = {"messages": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}


def _row(*messages: tuple[str, str]) -> str:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages]}) + "\n"


ROW = _row(("user", "1+1"), ("assistant", "2"))


@dataclass
class Bad:
    """One bad input: the command and what its refusal must name."""

    argv: list[str] | None
    names: list[str]
    code: int = 2
    fresh: Path | None = None
    """An output folder the refusal must not create (nor leave behind)."""
    keep: Path | None = None
    """A folder holding earlier work, which must be left exactly as it was."""
    run: Callable[[], tuple[int, str]] | None = None
    """Instead of `main(argv)` in-process: (exit code, stderr)."""
    quiet: bool = False
    """No `temper:` line is expected (a kill -9 says nothing; its rerun finishes)."""
    then: Callable[[], None] | None = None
    """Further checks, after the common ones."""
    limit: float = 300.0
    """Seconds the case may take at most (a hang fails it, naming the case, instead of hanging the suite)."""


@dataclass
class World:
    tmp: Path
    saved: Path
    capsys: pytest.CaptureFixture
    monkeypatch: pytest.MonkeyPatch
    resumed: list[int] = field(default_factory=list)
    said: str = ""  # the command's stderr, for the checks that follow

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def file(self, name: str, content: str | bytes) -> str:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return str(path)

    def model(self, damage: Callable[[Path], object] | None = None, name: str = "model") -> str:
        folder = self.tmp / name
        shutil.copytree(self.saved, folder)
        if damage:
            damage(folder)
        return str(folder)

    def loop(self, name: str) -> str:
        """A symbolic link that points, through another, back at itself."""
        a, b = self.tmp / name, self.tmp / f"{name}.other"
        a.symlink_to(b)
        b.symlink_to(a)
        return str(a)

    def sft(self, data: str | None = None, model: str | None = None, *extra: str) -> list[str]:
        data = data if data is not None else self.file("good.jsonl", ROW * 4)
        model = model if model is not None else str(self.saved)
        return [
            "sft", "--model", model, "--out", str(self.out), "--data.files", data,
            "--train.max_steps", "1", "--train.warmup_steps", "0", "--train.batch_size", "2",
            "--data.eval_problems", "0", *extra,
        ]  # fmt: skip

    def refused_sft(
        self, names: list[str], data: str | None = None, model: str | None = None, *extra: str
    ) -> Bad:
        return Bad(self.sft(data, model, *extra), names, fresh=self.out)

    def recipe(self, text: str, *flags: str) -> tuple[str, list[str]]:
        path = self.file("recipe.yaml", text)
        return path, ["run", path, *(flags or ("--dry-run",))]


CASES: dict[str, Callable[[World], Bad]] = {}


def case(name: str) -> Callable[[Callable[[World], Bad]], Callable[[World], Bad]]:
    def register(build: Callable[[World], Bad]) -> Callable[[World], Bad]:
        assert name not in CASES, name
        CASES[name] = build
        return build

    return register


# --- recipes --------------------------------------------------------------------------------

RECIPE = """\
name: battery
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 2, batch_size: 2, warmup_steps: 0}
  - kind: sft
    data: {tasks: [arithmetic], problems_per_task: 10, eval_problems: 0}
    train: {max_steps: 2, batch_size: 2, warmup_steps: 0}
"""


def _edit(line: int, text: str) -> str:
    """RECIPE with its 1-based `line` replaced by `text` (so the other lines keep their numbers)."""
    lines = RECIPE.splitlines()
    lines[line - 1] = text
    return "\n".join(lines) + "\n"


def _recipe_case(text: str | bytes, where: Callable[[str], list[str]], *flags: str) -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        path = w.file("recipe.yaml", text)
        return Bad(["run", path, *(flags or ("--dry-run",))], where(path), fresh=w.tmp / "runs")

    return build


case("recipe/yaml-syntax")(
    _recipe_case(_edit(2, "model: {preset: nano"), lambda p: [f"{p}:3:", "invalid YAML"])
)
case("recipe/tab-indentation")(
    _recipe_case(_edit(4, "\tarithmetic: {max_digits: 2}"), lambda p: [f"{p}:4:", "'\\t'"])
)
case("recipe/top-level-list")(
    _recipe_case("- kind: sft\n- kind: rl\n", lambda p: [p, "must be a YAML mapping"])
)
case("recipe/empty-file")(_recipe_case("", lambda p: [p, "must be a YAML mapping"]))
case("recipe/not-utf8")(
    _recipe_case(
        RECIPE.encode().replace(b"battery", b"b\xe4ttery"), lambda p: [f"{p}:1:", "not UTF-8", "0xe4"]
    )
)
case("recipe/duplicate-key")(
    _recipe_case(
        RECIPE.replace("{preset: nano}\n", "{preset: nano}\nmodel: {preset: micro}\n"),
        lambda p: [f"{p}:3:", "'model' is given twice (first at line 2)"],
    )
)
case("recipe/undefined-alias")(_recipe_case(_edit(2, "model: *base"), lambda p: [f"{p}:2:", "alias"]))
case("recipe/stage-not-a-mapping")(_recipe_case(RECIPE + "  - eval\n", lambda p: [f"{p}:12:", "stages[2]"]))
case("recipe/stage-kind-typo")(
    _recipe_case(_edit(9, "  - kind: sfft"), lambda p: [f"{p}:9:", "stages[1].kind", "did you mean 'sft'"])
)
case("recipe/value-of-wrong-type")(
    _recipe_case(
        _edit(8, "    train: {max_steps: ten, batch_size: 2, warmup_steps: 0}"),
        lambda p: [f"{p}:8:", "stages[0].train.max_steps"],
    )
)
case("recipe/infinite-value")(
    _recipe_case(
        _edit(11, "    train: {max_steps: 2, batch_size: 2, warmup_steps: 0, lr: .inf}"),
        lambda p: [f"{p}:11:", "stages[1].train.lr", "finite number"],
    )
)
case("recipe/pretrain-corpus-empty")(
    _recipe_case(_edit(7, "    corpus: {}"), lambda p: [f"{p}:7:", "stages[0].corpus", "corpus is empty"])
)
case("recipe/unknown-task")(
    _recipe_case(
        _edit(10, "    data: {tasks: [arithmetc], problems_per_task: 10, eval_problems: 0}"),
        lambda p: [f"{p}:10:", "stages[1]", "'arithmetc'"],
    )
)
case("recipe/data-file-missing")(
    _recipe_case(
        _edit(10, "    data: {files: [nope.jsonl], eval_problems: 0}"),
        lambda p: [f"{p}:10:", "stages[1].data.files[0]", "nope.jsonl", "does not exist"],
    )
)
case("recipe/model-folder-missing")(
    _recipe_case(_edit(2, "model: {path: ./no-model}"), lambda p: [f"{p}:2:", "model.path", "no-model"])
)
case("recipe/task-split-empty")(
    _recipe_case(
        _edit(4, "  arithmetic: {max_digits: 2, test_fraction: 0.999999}"),
        lambda p: [f"{p}:4:", "tasks.arithmetic", "yields no train problems"],
    )
)


@case("recipe/batch-not-divisible-by-the-launch")
def _(w: World) -> Bad:
    from temper import distributed

    distributed.state()  # this process's state is decided before the launcher's variable is set
    w.monkeypatch.setenv("WORLD_SIZE", "2")
    text = _edit(11, "    train: {max_steps: 2, batch_size: 3, warmup_steps: 0}")
    path, argv = w.recipe(text)
    return Bad(argv, [f"{path}:11:", "stages[1].train.batch_size", "2 processes"], fresh=w.tmp / "runs")


case("recipe/stage-name-with-a-slash")(
    _recipe_case(RECIPE + "    name: sft/v2\n", lambda p: [f"{p}:12:", "stages[1].name", "plain folder name"])
)
case("recipe/run-name-climbing-out")(
    _recipe_case(_edit(1, "name: ../../elsewhere"), lambda p: [f"{p}:1:", "name", "plain folder name"])
)


@case("recipe/output-dir-holding-another-recipes-run")
def _(w: World) -> Bad:
    run = w.tmp / "run"
    w.file("run/recipe.yaml", RECIPE.replace("name: battery", "name: last-week"))
    w.file("run/01-pretrain/stage.json", '{"hash": "0123456789abcdef", "kind": "pretrain"}')
    _, argv = w.recipe(RECIPE, "--output-dir", str(run))
    return Bad(argv, [str(run), "recipe 'last-week'", "another --output-dir"], keep=run)


@case("recipe/model-without-chat-template")
def _(w: World) -> Bad:
    base = w.model(_unlink("chat_template.jinja"), name="base")
    text = RECIPE.replace("{preset: nano}", f"{{path: {base}}}").replace(_PRETRAIN_STAGE, "")
    path, argv = w.recipe(text)
    return Bad(argv, [f"{path}:2:", "model.path", "no chat template", "'sft'"], fresh=w.tmp / "runs")


_PRETRAIN_STAGE = """\
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 2, batch_size: 2, warmup_steps: 0}
"""


@case("recipe/chat-template-not-jinja")
def _(w: World) -> Bad:
    w.file("chat.jinja", "{{ messages[0].content ")  # an expression never closed
    path, argv = w.recipe(RECIPE.replace("{preset: nano}", "{preset: nano, chat_template: chat.jinja}"))
    return Bad(
        argv, [f"{path}:2:", "model.chat_template", "not a valid Jinja template"], fresh=w.tmp / "runs"
    )


@case("recipe/is-a-folder")
def _(w: World) -> Bad:
    return Bad(["run", str(w.tmp), "--dry-run"], [str(w.tmp), "is a folder"], fresh=w.tmp / "runs")


@case("recipe/missing")
def _(w: World) -> Bad:
    return Bad(["run", str(w.tmp / "r.yaml"), "--dry-run"], [str(w.tmp / "r.yaml"), "does not exist"])


@case("recipe/symlink-loop")
def _(w: World) -> Bad:
    path = w.loop("r.yaml")
    return Bad(["run", path, "--dry-run"], [path, "loop"], fresh=w.tmp / "runs")


@case("recipe/output-dir-is-a-file")
def _(w: World) -> Bad:
    taken = w.file("taken", "keep me")
    _, argv = w.recipe(RECIPE, "--output-dir", taken)
    return Bad(
        argv, [taken, "is a file where a folder is needed"], then=lambda: _same(Path(taken), "keep me")
    )


@case("recipe/output-dir-under-proc")
def _(w: World) -> Bad:
    _, argv = w.recipe(RECIPE, "--output-dir", "/proc/temper-battery/run")
    return Bad(argv, ["/proc/temper-battery"], fresh=Path("/proc/temper-battery"))


def _same(path: Path, text: str) -> None:
    assert path.read_text() == text


# --- data files (through `temper sft`, and `temper pretrain` for a corpus) -------------------


def _data_case(
    content: str | bytes, where: Callable[[str], list[str]], *extra: str
) -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        path = w.file("data.jsonl", content)
        return w.refused_sft(where(path), path, None, *extra)

    return build


case("data/not-utf8")(
    _data_case(ROW.encode() + b'{"messages": "\xff"}\n', lambda p: [f"{p}:2:", "not UTF-8"])
)
case("data/invalid-json")(_data_case(ROW + '{"messages": [\n', lambda p: [f"{p}:2:", "invalid JSON"]))
case("data/row-is-a-list")(_data_case(ROW + "[1, 2]\n", lambda p: [f"{p}:2:", "must be a JSON object"]))
case("data/empty-file")(_data_case("", lambda p: [p, "no usable training rows", "0 rows read"]))
case("data/blank-lines-only")(_data_case("\n  \n\r\n", lambda p: [p, "no usable training rows"]))
case("data/gzip-compressed")(
    _data_case(gzip.compress(ROW.encode() * 3, mtime=0), lambda p: [f"{p}:1:", "not UTF-8"])
)
case("data/nested-too-deep")(
    _data_case("[" * 100_000 + "]" * 100_000 + "\n", lambda p: [f"{p}:1:", "nested too deeply"])
)
case("data/duplicate-json-key")(
    _data_case(
        '{"messages": [{"role": "user", "content": "a", "content": "b"}, {"role": "assistant", "content": "c"}]}\n',
        lambda p: [f"{p}:1:", "content"],
    )
)
case("data/empty-assistant-turn")(
    _data_case(
        _row(("user", "1+1"), ("assistant", " ")), lambda p: [f"{p}:1:", "messages[1].content", "empty"]
    )
)
case("data/tool-result-without-a-call")(
    _data_case(
        _row(("user", "1+1"), ("tool", "2"), ("assistant", "2")), lambda p: [f"{p}:1:", "messages[1].role"]
    )
)
case("data/lone-assistant-turn")(
    _data_case(_row(("assistant", "2")), lambda p: [f"{p}:1:", "messages[0].role", "nothing to condition on"])
)
case("data/mixed-row-formats")(
    _data_case(ROW + json.dumps({"prompt": "1+1", "completion": "2"}) + "\n", lambda p: [f"{p}:2:"])
)
case("data/content-not-a-string")(
    _data_case(
        '{"messages": [{"role": "user", "content": NaN}, {"role": "assistant", "content": "2"}]}\n',
        lambda p: [f"{p}:1:", "messages[0].content", "must be a string"],
    )
)
case("data/unknown-role")(
    _data_case(
        _row(("human", "1+1"), ("assistant", "2")), lambda p: [f"{p}:1:", "messages[0].role", "'human'"]
    )
)
case("data/every-row-longer-than-max-len")(
    _data_case(
        _row(("user", "9" * 300), ("assistant", "2")) * 3,
        lambda p: [p, "3 longer than max_len=16"],
        "--max_len",
        "16",
    )
)


@case("data/folder-given-as-file")
def _(w: World) -> Bad:
    (w.tmp / "rows").mkdir()
    return w.refused_sft(
        ["--data.files", str(w.tmp / "rows"), "name a data file inside it"], str(w.tmp / "rows")
    )


@case("data/missing")
def _(w: World) -> Bad:
    return w.refused_sft(["--data.files", "nope.jsonl", "does not exist"], str(w.tmp / "nope.jsonl"))


@case("data/symlink-loop")
def _(w: World) -> Bad:
    path = w.loop("rows.jsonl")
    return w.refused_sft(["--data.files", path, "does not exist"], path)


@case("data/unreadable")
def _(w: World) -> Bad:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = w.file("secret.jsonl", ROW)
    os.chmod(path, 0)
    return w.refused_sft(["--data.files", path, "not readable"], path)


@case("data/pretrain-corpus-of-chat-rows")
def _(w: World) -> Bad:
    path = w.file("chat.jsonl", ROW * 3)
    argv = ["pretrain", "--preset", "nano", "--out", str(w.out), "--corpus.files", path]
    argv += ["--train.max_steps", "1", "--train.warmup_steps", "0"]
    return Bad(argv, [path, "none with a 'text' field"], fresh=w.out)


# --- model folders (through `temper sft --model`) --------------------------------------------


def _model_case(damage: Callable[[Path], object], *names: str) -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        model = w.model(damage)
        return w.refused_sft([model, *names], None, model)

    return build


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)


def _set_config(**changes: object) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))

    return damage


def _unlink(*patterns: str) -> Callable[[Path], None]:
    return lambda folder: [p.unlink() for pattern in patterns for p in folder.glob(pattern)]


def _weights_folder(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()


def _garbage_bin(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_text("<html>404</html>")


def _no_special_tokens(folder: Path) -> None:
    (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')


case("model/no-tokenizer-files")(_model_case(_unlink("tokenizer*"), "has no tokenizer.json"))
case("model/truncated-weights")(_model_case(_truncate, "model.safetensors", "truncated"))
case("model/weights-is-a-folder")(_model_case(_weights_folder, "model.safetensors", "is a folder"))
case("model/config-not-an-object")(
    _model_case(lambda f: (f / "config.json").write_text("[1, 2]"), "config.json", "JSON object")
)
case("model/config-size-inconsistent")(_model_case(_set_config(hidden_size=7), "hidden size"))
case("model/unknown-model-type")(_model_case(_set_config(model_type="nonsense"), "nonsense"))
case("model/weights-of-another-shape")(
    _model_case(_set_config(intermediate_size=96), "holds no loadable model")
)
case("model/tokenizer-without-pad-or-eos")(_model_case(_no_special_tokens, "neither a pad nor an eos token"))
case("model/garbage-pytorch-bin")(_model_case(_garbage_bin, "holds no loadable model", "Weights only load"))


@case("model/no-chat-template-for-rl")
def _(w: World) -> Bad:
    model = w.model(_unlink("chat_template.jinja"))
    argv = ["rl", "--model", model, "--out", str(w.out), "--tasks", "arithmetic", "--train.steps", "1"]
    return Bad(argv, ["--model", model, "no chat template", "'rl'"], fresh=w.out)


@case("model/no-chat-template-for-chat-rows")
def _(w: World) -> Bad:
    model = w.model(_unlink("chat_template.jinja"))
    return w.refused_sft(["--model", model, "no chat template"], None, model)


@case("model/missing")
def _(w: World) -> Bad:
    return w.refused_sft(["--model", str(w.tmp / "nomodel"), "does not exist"], None, str(w.tmp / "nomodel"))


@case("model/is-a-file")
def _(w: World) -> Bad:
    path = w.file("model.txt", "weights")
    return w.refused_sft(["--model", path, "is a file"], None, path)


@case("model/empty-folder")
def _(w: World) -> Bad:
    (w.tmp / "empty").mkdir()
    return w.refused_sft([str(w.tmp / "empty"), "has no config.json"], None, str(w.tmp / "empty"))


@case("model/a-run-folder-not-its-model")
def _(w: World) -> Bad:
    (w.tmp / "run" / "02-sft").mkdir(parents=True)
    w.model(name="run/02-sft/model")
    run = str(w.tmp / "run")
    return w.refused_sft([run, "did you mean", str(w.tmp / "run" / "02-sft" / "model")], None, run)


@case("model/hub-id-offline")
def _(w: World) -> Bad:
    w.monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return w.refused_sft(
        ["--model", "nosuch-org/nosuch-model", "HF_HUB_OFFLINE"], None, "nosuch-org/nosuch-model"
    )


@case("model/symlink-loop")
def _(w: World) -> Bad:
    path = w.loop("model")
    return w.refused_sft(["--model", path, "loop"], None, path)


# --- CLI flags ---------------------------------------------------------------------------------


def _flag_case(names: list[str], *extra: str, code: int = 2) -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        return Bad(w.sft(None, None, *extra), names, code=code, fresh=w.out)

    return build


case("flag/lr-not-a-number")(_flag_case(["--train.lr", "valid number"], "--train.lr", "3e-4x"))
case("flag/batch-size-zero")(
    _flag_case(["--train.batch_size", "greater than or equal to 1"], "--train.batch_size", "0")
)
case("flag/schedule-typo")(
    _flag_case(["--train.schedule", "did you mean 'cosine'"], "--train.schedule", "cosin")
)
case("flag/unknown-flag")(_flag_case(["unrecognized arguments: --train.lrr"], "--train.lrr", "1"))
case("flag/task-option-without-value")(
    _flag_case(["--task-option", "TASK.OPTION=VALUE"], "--task-option", "arithmetic")
)
case("flag/task-option-unknown-task")(
    _flag_case(["--task-option nosuch", "unknown task"], "--task-option", "nosuch.max_digits=2")
)
case("flag/task-option-unknown-option")(
    _flag_case(
        ["--task-option arithmetic", "unknown option 'digits'"], "--task-option", "arithmetic.digits=2"
    )
)
case("flag/tasks-unknown")(
    _flag_case(["--data.tasks arithmatic", "unknown task"], "--data.tasks", "arithmatic")
)
case("flag/lr-infinite")(_flag_case(["--train.lr", "finite number"], "--train.lr", "inf"))
case("flag/max-len-one")(_flag_case(["--max_len"], "--max_len", "1"))


@case("flag/chat-template-not-jinja")
def _(w: World) -> Bad:
    template = w.file("chat.jinja", "{% for message in messages %}{{ message.content }}")  # no endfor
    argv = w.sft(None, None, "--model.chat_template", template)
    return Bad(argv, ["--model.chat_template", template, "not a valid Jinja template"], fresh=w.out)


@case("flag/tracker-not-installed")
def _(w: World) -> Bad:
    import importlib.util

    if importlib.util.find_spec("dvclive"):
        pytest.skip("dvclive is installed here")
    argv = w.sft(None, None, "--train.trackers", "dvclive")
    return Bad(argv, ["--train.trackers", "pip install dvclive"], fresh=w.out)


@case("flag/yaml-value-unclosed")
def _(w: World) -> Bad:
    argv = ["rl", "--model", str(w.saved), "--out", str(w.out), "--tasks", "arithmetic"]
    return Bad([*argv, "--train.rewards", "{outcome: 1"], ["--train.rewards", "invalid YAML"], fresh=w.out)


@case("flag/task-split-empty")
def _(w: World) -> Bad:
    argv = ["rl", "--model", str(w.saved), "--out", str(w.out), "--tasks", "arithmetic"]
    argv += ["--task-option", "arithmetic.test_fraction=0.999999"]
    return Bad(argv, ["--tasks", "'arithmetic' yields no train problems"], fresh=w.out)


@case("flag/preset-and-path")
def _(w: World) -> Bad:
    argv = ["pretrain", "--preset", "nano", "--path", str(w.saved), "--out", str(w.out)]
    return Bad([*argv, "--corpus.tasks", "arithmetic"], ["--preset / --path", "exactly one"], fresh=w.out)


@case("flag/pretrain-without-corpus")
def _(w: World) -> Bad:
    argv = ["pretrain", "--preset", "nano", "--out", str(w.out), "--train.warmup_steps", "0"]
    return Bad(argv, ["--corpus", "corpus is empty"], fresh=w.out)


@case("flag/eval-split-unknown")
def _(w: World) -> Bad:
    argv = [
        "eval",
        "--model",
        str(w.saved),
        "--out",
        str(w.out),
        "--tasks",
        "arithmetic",
        "--splits",
        "test,dev",
    ]
    return Bad(argv, ["--splits", "'dev'"], fresh=w.out)


@case("flag/batch-not-divisible-by-the-launch")
def _(w: World) -> Bad:
    """Under `torchrun --nproc_per_node 3` a batch of 2 cannot be split: refused before the stage
    starts (the trainer would refuse it only after loading the model and the data)."""
    from temper import distributed

    distributed.state()  # this process's state is decided before the launcher's variable is set
    w.monkeypatch.setenv("WORLD_SIZE", "3")
    return Bad(w.sft(), ["--train.batch_size", "not divisible by the 3 processes"], fresh=w.out)


@case("flag/report-of-a-missing-folder")
def _(w: World) -> Bad:
    return Bad(
        ["report", str(w.tmp / "runs" / "nope")],
        [str(w.tmp / "runs" / "nope"), "does not exist"],
        fresh=w.tmp / "runs",
    )


@case("flag/report-of-a-folder-without-stages")
def _(w: World) -> Bad:
    w.file("notes/todo.txt", "not a run")
    return Bad(
        ["report", str(w.tmp / "notes")],
        [str(w.tmp / "notes"), "holds no stage folders"],
        keep=w.tmp / "notes",
    )


@case("flag/out-empty")
def _(w: World) -> Bad:
    argv = w.sft()
    argv[argv.index("--out") + 1] = ""
    return Bad(argv, ["--out is empty"])  # (and the working folder stays empty: checked for every case)


@case("flag/out-is-a-file")
def _(w: World) -> Bad:
    taken = w.file("taken.txt", "keep me")
    argv = w.sft()
    argv[argv.index("--out") + 1] = taken
    return Bad(
        argv, [taken, "is a file where a folder is needed"], then=lambda: _same(Path(taken), "keep me")
    )


@case("flag/out-under-proc")
def _(w: World) -> Bad:
    argv = w.sft()
    argv[argv.index("--out") + 1] = "/proc/temper-battery/out"
    return Bad(argv, ["/proc/temper-battery"], fresh=Path("/proc/temper-battery"))


@case("flag/rerun-with-other-settings")
def _(w: World) -> Bad:
    assert main(w.sft()) == 0
    return Bad(w.sft(None, None, "--train.lr", "0.5"), [str(w.out), "train.lr", "--overwrite"], keep=w.out)


@case("flag/out-is-a-temper-run-stage-folder")
def _(w: World) -> Bad:
    """`temper run` records a hash over the recipe's inputs that a stage command cannot recompute:
    the refusal says what the folder is and which command resumes it."""
    run = w.tmp / "run"
    w.file("run/recipe.yaml", RECIPE)
    w.file("run/02-sft/stage.started.json", '{"hash": "0123456789abcdef"}')
    w.file("run/02-sft/stage.json", '{"hash": "0123456789abcdef", "kind": "sft", "seconds": 1.0}')
    argv = w.sft()
    argv[argv.index("--out") + 1] = str(run / "02-sft")
    return Bad(
        argv, ["stage folder of the run", f"temper run {run / 'recipe.yaml'}", "another --out"], keep=run
    )


# --- faults and interrupts ---------------------------------------------------------------------

PRETRAIN = [
    "pretrain", "--preset", "nano", "--corpus.tasks", "arithmetic", "--corpus.problems_per_task", "40",
    "--max_len", "32", "--train.batch_size", "2", "--train.warmup_steps", "0", "--train.progress", "false",
]  # fmt: skip


def _pretrain(out: Path, steps: int, save_every: int) -> list[str]:
    return [
        *PRETRAIN,
        "--out",
        str(out),
        "--train.max_steps",
        str(steps),
        "--train.save_every",
        str(save_every),
    ]


def _spy_resume(w: World) -> None:
    """Record the step each in-process training resumes from."""
    import temper.train.checkpoint as checkpoint

    real = checkpoint.load_checkpoint

    def load(path, accelerator, trained=None):
        w.resumed.append(step := real(path, accelerator, trained))
        return step

    w.monkeypatch.setattr(checkpoint, "load_checkpoint", load)


def _signalled(out: Path, command: list[str], sig: signal.Signals) -> tuple[int, str]:
    """Run `command` in a subprocess; send `sig` once its first checkpoint exists."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(temper.__file__).parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "temper.cli", *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list_checkpoints(out / "checkpoints") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert list_checkpoints(out / "checkpoints"), err
    return proc.returncode, err


@case("interrupt/sigint-then-resume")
def _(w: World) -> Bad:
    out, command = w.tmp / "base", _pretrain(w.tmp / "base", 30, 5)

    def resume() -> None:
        step = int(re.search(r"resume from step (\d+)", w.said).group(1))  # type: ignore[union-attr]
        _spy_resume(w)
        assert main(command) == 0
        assert w.resumed == [step] and json.loads((out / "pretrain.json").read_text())["steps"] == 30
        assert not [p for p in out.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]

    return Bad(
        None,
        ["interrupted", "rerun the same command to resume from step", str(out / "checkpoints" / "step-")],
        code=130,
        run=lambda: _signalled(out, command, signal.SIGINT),
        then=lambda: (_no_model(out), resume()),
    )


@case("interrupt/sigterm")
def _(w: World) -> Bad:
    out = w.tmp / "base"
    return Bad(
        None,
        ["terminated (SIGTERM)", "resume from step", str(out / "checkpoints" / "step-")],
        code=128 + signal.SIGTERM,
        run=lambda: _signalled(out, _pretrain(out, 400, 5), signal.SIGTERM),
        then=lambda: _no_model(out),
    )


@case("interrupt/kill-9-then-resume")
def _(w: World) -> Bad:
    """kill -9 says nothing; the same command then resumes from the newest checkpoint, removes
    what the kill left half-written and finishes."""
    out, command = w.tmp / "base", _pretrain(w.tmp / "base", 30, 5)

    def killed_then_resumed() -> tuple[int, str]:
        code, err = _signalled(out, command, signal.SIGKILL)
        assert code == -signal.SIGKILL and "Traceback" not in err
        (
            out / "checkpoints" / ".step-0000099.tmp-k9"
        ).mkdir()  # as a kill inside a checkpoint write leaves it
        _spy_resume(w)
        w.capsys.readouterr()
        return main(command), w.capsys.readouterr().err

    def finished() -> None:
        assert w.resumed and w.resumed[0] >= 5  # resumed, not started over
        assert json.loads((out / "pretrain.json").read_text())["steps"] == 30
        load_model(out / "model")

    return Bad(None, [], code=0, quiet=True, run=killed_then_resumed, then=finished)


@case("interrupt/second-ctrl-c-during-the-clean-up")
def _(w: World) -> Bad:
    """Ctrl-C pressed twice (or torchrun forwarding its own copy): the second must not cut short
    the removal of the half-written model, nor print a traceback."""
    import temper.atomic as atomic
    import temper.stages.sft as sft

    real = atomic.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the second press, as the clean-up starts
        time.sleep(0.01)  # (a Python signal handler runs at the next bytecode)
        return real(path, *args, **kwargs)

    def interrupted(model, train, config, out, **kwargs):
        with atomic.atomic_dir(Path(out) / "model") as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            w.monkeypatch.setattr(atomic.shutil, "rmtree", rmtree)
            os.kill(os.getpid(), signal.SIGINT)  # the first press
            time.sleep(1)

    w.monkeypatch.setattr(sft, "train_supervised", interrupted)
    return Bad(
        w.sft(), ["interrupted", "rerun the same command to resume"], code=130, then=lambda: _no_model(w.out)
    )


@case("interrupt/ctrl-c-on-a-rank-other-than-0-is-silent")
def _(w: World) -> Bad:
    """Under torchrun every process gets the Ctrl-C: only rank 0 says so."""
    import temper.stages.sft as sft
    from temper import distributed

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    distributed.state()  # this process's state is decided before the launcher's variable is set
    w.monkeypatch.setenv("RANK", "1")
    w.monkeypatch.setattr(sft, "train_supervised", interrupted)
    return Bad(w.sft(), [], code=130, quiet=True)


@case("flag/refusal-on-a-rank-other-than-0-is-silent")
def _(w: World) -> Bad:
    """Every process of a launch refuses the same bad flag: only rank 0 prints it."""
    from temper import distributed

    distributed.state()  # this process's state is decided before the launcher's variable is set
    w.monkeypatch.setenv("RANK", "1")
    return Bad(w.sft(None, None, "--train.lr", "-1"), [], quiet=True, fresh=w.out)


def _held(folder: Path) -> None:
    """Hold the folder's lock as a temper process writing it would (a second open file
    description is a second holder, as another process's would be)."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".temper.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _HELD.append(fd)


_HELD: list[int] = []


@pytest.fixture(autouse=True)
def _release_held_locks():
    yield
    while _HELD:
        os.close(_HELD.pop())


@case("fault/second-command-into-a-folder-being-written")
def _(w: World) -> Bad:
    assert main(w.sft()) == 0
    (w.out / "stage.json").unlink()  # unfinished, as while the first command is still training
    _held(w.out)
    return Bad(w.sft(), ["another temper process is writing", str(w.out)], keep=w.out)


@case("fault/second-run-into-a-run-folder-being-written")
def _(w: World) -> Bad:
    path, argv = w.recipe(RECIPE, "--output-dir", str(w.tmp / "run"))
    _held(w.tmp / "run")
    return Bad(argv, ["another temper process is writing", str(w.tmp / "run")], keep=w.tmp / "run")


@case("fault/corrupt-checkpoint-in-an-unfinished-folder")
def _(w: World) -> Bad:
    out, command = w.tmp / "base", _pretrain(w.tmp / "base", 4, 2)
    assert main(command) == 0
    (out / "stage.json").unlink()  # as if killed after its last checkpoint
    shutil.rmtree(out / "model")
    (out / "checkpoints" / "step-0000004" / "pytorch_model.bin").write_bytes(b"\0" * 64)
    return Bad(
        command, [str(out / "checkpoints" / "step-0000004"), "cannot be read", "remove that folder"], keep=out
    )


@case("fault/disk-full-during-a-checkpoint")
def _(w: World) -> Bad:
    import errno

    import torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no path

    w.monkeypatch.setattr(torch, "save", full)
    argv = w.sft(None, None, "--train.save_every", "1")
    return Bad(
        argv,
        ["disk is full", str(w.out / "checkpoints" / "step-0000001")],
        then=lambda: _no_model(w.out),
    )


def _no_model(out: Path) -> None:
    assert not (out / "model").exists()


# --- user code (reward functions, env factories and envs, MCP servers, judges) ----------------
# Each case is an RL run (`temper run`) of a tiny data task whose user code fails: it stops with
# one line naming the function or file and its error, exit 2, no traceback, no model saved, no
# folder left when nothing was trained, and a hung call costs its time limit (0.5 s), not the run.
# Hung user code waits for RELEASE, made when the case ends; then no thread of it may be left.

RELEASE_ENV = "TEMPER_BATTERY_RELEASE"

REWARDS = """\
import asyncio, math, os, sys, time

CALLS = [0]


def hang():
    while not os.path.exists(os.environ["TEMPER_BATTERY_RELEASE"]):
        time.sleep(0.01)


def raises(completions, **kw):
    raise ValueError("my reward blew up")


def too_few(completions, **kw):
    return []


def strings(completions, **kw):
    return ["1.0" for _ in completions]


def scalar(completions, **kw):
    return 1.0


def nothing(completions, **kw):
    return None


def mapping(completions, **kw):
    return {"reward": 1.0}


def wrong_signature(text):
    return [0.0]


def nan(completions, **kw):
    return [math.nan for _ in completions]


def inf(completions, **kw):
    return [math.inf for _ in completions]


def minus_inf_sometimes(completions, **kw):
    return [-math.inf if i == 1 else 0.0 for i, _ in enumerate(completions)]


def hangs(completions, **kw):
    hang()


async def async_hangs(completions, **kw):
    await asyncio.sleep(0)
    hang()


async def async_raises(completions, **kw):
    raise KeyError("no such column")


def exits(completions, **kw):
    sys.exit(3)


def zero(completions, **kw):
    return [0.0 for _ in completions]


def fails_after_two_calls(completions, **kw):
    CALLS[0] += 1
    if CALLS[0] > 2:
        raise RuntimeError("the grading service went away")
    return [float(i) for i, _ in enumerate(completions)]


def fails_once(completions, **kw):
    CALLS[0] += 1
    if CALLS[0] in (1, 2):  # the first group's batch, then its first completion alone
        raise ValueError("a flaky grader")
    return [0.0 for _ in completions]
"""

ENVS = """\
import math, os, time
from temper.envs.base import StepResult


def hang():
    while not os.path.exists(os.environ["TEMPER_BATTERY_RELEASE"]):
        time.sleep(0.01)


class Env:
    stop = ()

    def __init__(self, how):
        self.how = how

    def reset(self):
        if self.how == "reset_raises":
            raise KeyError("no map for this row")
        if self.how == "reset_hangs":
            hang()
        if self.how == "reset_text":
            return "hello"
        return None

    def step(self, action):
        if self.how == "step_raises":
            raise ConnectionError("the backend died")
        if self.how == "step_hangs":
            hang()
        if self.how == "step_dict":
            return {"done": True}
        if self.how == "step_nan":
            return StepResult(done=True, reward=math.nan)
        return StepResult(done=True)

    def close(self):
        if self.how == "close_raises":
            raise OSError("workspace busy")


def factory_raises(row):
    raise RuntimeError("no server for " + row["prompt"])


def factory_hangs(row):
    hang()


def factory_int(row):
    return 42


def make(how):
    return lambda row: Env(how)


reset_raises, reset_hangs, reset_text = make("reset_raises"), make("reset_hangs"), make("reset_text")
step_raises, step_hangs, step_dict = make("step_raises"), make("step_hangs"), make("step_dict")
step_nan, close_raises = make("step_nan"), make("close_raises")
"""

ROWS = "".join(
    json.dumps({"prompt": f"say {w}", "answer": w, "split": s}) + "\n"
    for w, s in [("a", "train"), ("b", "train"), ("c", "train"), ("d", "train"), ("e", "test"), ("f", "test")]
)


def _line_of(source: str, text: str) -> int:
    return next(i + 1 for i, line in enumerate(source.splitlines()) if text in line)


def _code_recipe(
    w: World, task: str, user: str = "", train: str = "", stage: str = "", steps: int = 1
) -> list[str]:
    """`temper run` of an RL stage on a 6-row data task (`task`: its reward / env keys), `steps`
    steps of 2 prompts x 2 samples of 4 tokens, user code limited to 0.5 s (`user`: more of
    `train.user_code`, `train`: more of `train`, `stage`: more stage lines), into `w.out`."""
    w.file("rows.jsonl", ROWS)
    w.file("rewards.py", REWARDS)
    w.file("envs.py", ENVS)
    stage = stage or "    probe_groups: 0\n"
    text = f"""\
name: code
model: {{path: {w.saved}}}
tasks:
  words:
    task: dataset
    data: rows.jsonl
    split_column: split
    {task}
stages:
  - kind: rl
    tasks: [words]
{stage}    train: {{steps: {steps}, prompts_per_step: 2, group_size: 2, max_new_tokens: 4, step_timeout: 0.5, progress: false{train}, user_code: {{timeout: 0.5{user}}}}}
"""
    path = w.file("recipe.yaml", text)
    return ["run", path, "--output-dir", str(w.out)]


def _stopped(w: World, names: list[str], task: str, stage: str = "") -> Bad:
    """A run the policy stops before it trains: the line names the code; the folder is gone."""
    return Bad(_code_recipe(w, task, stage=stage), names, fresh=w.out, limit=60)


def _reward_case(fn: str, *said: str, where: str = "rl step 1") -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        return _stopped(w, [where, f"reward function rewards.py:{fn}", *said], f"rewards: [rewards.py:{fn}]")

    return build


def _raised_at(text: str) -> str:
    return f"(at rewards.py:{_line_of(REWARDS, text)})"


case("code/reward-raises")(
    _reward_case(
        "raises", "raised on problem rows.jsonl:", "ValueError: my reward blew up", _raised_at("blew up")
    )
)
case("code/reward-returns-too-few")(
    _reward_case(
        "too_few",
        "returned 0 rewards, but 2 were expected (one per prompt-completion pair)",
        "on problem rows.jsonl:",
    )
)
case("code/reward-returns-strings")(
    _reward_case("strings", "returned str '1.0' for completion 1, not a float")
)
case("code/reward-returns-a-scalar")(_reward_case("scalar", "returned float, not a list of floats or None"))
case("code/reward-returns-none")(_reward_case("nothing", "returned NoneType, not a list of floats or None"))
case("code/reward-returns-a-dict")(_reward_case("mapping", "returned dict, not a list of floats or None"))
case("code/reward-wrong-signature")(
    _reward_case("wrong_signature", "TypeError: wrong_signature() got an unexpected keyword argument")
)
case("code/reward-returns-nan")(_reward_case("nan", "returned a non-finite reward (nan) for completion 1"))
case("code/reward-returns-inf")(_reward_case("inf", "returned a non-finite reward (inf) for completion 1"))
case("code/reward-returns-minus-inf-for-one-sample")(
    _reward_case("minus_inf_sometimes", "returned a non-finite reward (-inf) for completion 2")
)
case("code/reward-hangs")(_reward_case("hangs", "did not return within 0.5 s on problem rows.jsonl:"))
case("code/async-reward-hangs")(_reward_case("async_hangs", "did not return within 0.5 s"))
case("code/async-reward-raises")(
    _reward_case("async_raises", "KeyError: 'no such column'", _raised_at("no such column"))
)
case("code/reward-calls-sys-exit")(_reward_case("exits", "SystemExit: 3", _raised_at("sys.exit(3)")))


@case("code/reward-fails-on-one-sample-of-step-1")
def _(w: World) -> Bad:
    """1 of the 4 samples fails: under max_failed_share, but the first step's rule stops the run."""
    names = ["rl step 1", "reward function rewards.py:fails_once raised on problem rows.jsonl:",
             "ValueError: a flaky grader", "train.user_code.first_step: count"]  # fmt: skip
    return _stopped(w, names, "rewards: [rewards.py:fails_once]")


@case("code/reward-fails-in-the-reachability-probe")
def _(w: World) -> Bad:
    return _stopped(w, ["reachability probe", "reward function rewards.py:raises", "ValueError: my reward blew up"],
                    "rewards: [rewards.py:raises]", stage="    probe_groups: 1\n")  # fmt: skip


@case("code/reward-fails-in-the-format-gate")
def _(w: World) -> Bad:
    gate = "    gate: {min_parse_rate: 0.0, n_problems: 2}\n    probe_groups: 0\n"
    return _stopped(w, ["format gate", "reward function rewards.py:raises", "ValueError: my reward blew up"],
                    "rewards: [rewards.py:raises]", stage=gate)  # fmt: skip


@case("code/reward-fails-in-step-1-after-a-clean-probe")
def _(w: World) -> Bad:
    """The probe (2 groups, 2 calls) passes and writes probe.json; step 1 fails: stopped before
    training, so probe.json goes too and the folder with it."""
    return _stopped(w, ["rl step 1", "rewards.py:fails_after_two_calls", "the grading service went away"],
                    "rewards: [rewards.py:fails_after_two_calls]", stage="    probe_groups: 2\n")  # fmt: skip


@case("code/reward-fails-in-step-2-on-more-than-the-share")
def _(w: World) -> Bad:
    """Step 1 trains (2 calls); every call of step 2 fails: more than max_failed_share, a stop
    before step 2 trains, no model saved; step 1's folder stays, unfinished."""
    argv = _code_recipe(w, "rewards: [rewards.py:fails_after_two_calls]", steps=2)
    names = ["rl step 2", "4 of 4 samples failed in user code (100%", "max_failed_share 0.25",
             "rewards.py:fails_after_two_calls", "the grading service went away"]  # fmt: skip
    return Bad(argv, names, limit=60, then=lambda: _unfinished(w.out / "01-rl"))


@case("code/reward-failures-counted-when-asked")
def _(w: World) -> Bad:
    """first_step: count and a share of 1: the run goes on, the failed groups left out, and the
    console names the first failure (not only a json)."""
    argv = _code_recipe(w, "rewards: [rewards.py:raises]", ", first_step: count, max_failed_share: 1.0")

    def said() -> None:
        assert "first verifier_error: reward function rewards.py:raises raised on problem" in w.said, w.said
        assert "4 of 4 samples failed in user code (verifier_error 4)" in w.said, w.said

    return Bad(argv, [], code=0, quiet=True, limit=60, then=said)


@case("code/every-step-without-a-learning-signal")
def _(w: World) -> Bad:
    argv = _code_recipe(w, "rewards: [rewards.py:zero]", ", zero_variance_steps: 2", steps=2)
    names = ["rl step 2", "2 steps in a row without a learning signal", "every group's rewards are equal",
             "truncated 100%", "raise max_new_tokens"]  # fmt: skip
    return Bad(argv, names, limit=60, then=lambda: _unfinished(w.out / "01-rl"))


@case("code/every-step-without-a-learning-signal-warned")
def _(w: World) -> Bad:
    argv = _code_recipe(
        w, "rewards: [rewards.py:zero]", ", zero_variance_steps: 2, on_zero_variance: warn", steps=2
    )

    def warned() -> None:
        assert "warning: rl step 2: 2 steps in a row without a learning signal" in w.said, w.said

    return Bad(argv, [], code=0, quiet=True, limit=60, then=warned)


@case("code/reward-module-raises-on-import")
def _(w: World) -> Bad:
    w.file("broken.py", "import json\nraise ImportError('no such backend')\n")
    argv = _code_recipe(w, "rewards: [broken.py:f]")
    file = str((w.tmp / "broken.py").resolve())
    names = [f"reward module {file!r} raised on import: ImportError: no such backend (at broken.py:2)"]
    return Bad(argv, names, fresh=w.out, limit=60)


def _env_case(fn: str, *said: str, where: str = "rl step 1") -> Callable[[World], Bad]:
    def build(w: World) -> Bad:
        return _stopped(w, [where, *said], f"env: envs.py:{fn}")

    return build


def _env_at(text: str) -> str:
    return f"(at envs.py:{_line_of(ENVS, text)})"


ENV = "env Env (env envs.py:{})"
case("code/env-factory-raises")(
    _env_case(
        "factory_raises",
        "env factory envs.py:factory_raises raised on problem rows.jsonl:",
        "RuntimeError: no server for say",
        _env_at("no server for"),
    )  # fmt: skip
)
case("code/env-factory-returns-an-int")(
    _env_case("factory_int", "env factory envs.py:factory_int returned int, not an Env")
)
case("code/env-factory-hangs")(
    _env_case(
        "factory_hangs",
        "env factory envs.py:factory_hangs on problem rows.jsonl:",
        "did not return within 0.5 s",
    )
)
case("code/env-reset-raises")(
    _env_case(
        "reset_raises",
        ENV.format("reset_raises") + ".reset raised",
        "KeyError: 'no map for this row'",
        _env_at("no map for this row"),
    )  # fmt: skip
)
case("code/env-reset-hangs")(
    _env_case("reset_hangs", ENV.format("reset_hangs") + ".reset on problem", "did not return within 0.5 s")
)
case("code/env-reset-returns-text")(
    _env_case(
        "reset_text", ENV.format("reset_text") + ".reset returned str, not a list of {role, content} messages"
    )
)
case("code/env-step-raises")(
    _env_case(
        "step_raises",
        ENV.format("step_raises") + ".step raised",
        "ConnectionError: the backend died",
        _env_at("the backend died"),
    )  # fmt: skip
)
case("code/env-step-hangs")(
    _env_case(
        "step_hangs",
        ENV.format("step_hangs") + ".step on problem",
        "did not return within 0.5 s (step_timeout)",
    )
)
case("code/env-step-returns-a-dict")(
    _env_case("step_dict", ENV.format("step_dict") + ".step returned dict, not a StepResult")
)
case("code/env-step-reward-nan")(
    _env_case("step_nan", ENV.format("step_nan") + ".step on problem", "returned a non-finite reward (nan)")
)
case("code/env-close-raises")(
    _env_case(
        "close_raises",
        ENV.format("close_raises") + ".close raised",
        "OSError: workspace busy",
        _env_at("workspace busy"),
    )  # fmt: skip
)


@case("code/env-factory-raises-in-the-format-gate")
def _(w: World) -> Bad:
    """The gate's evaluation builds envs through the same guarded path (evaluate -> make_env)."""
    gate = "    gate: {min_parse_rate: 0.0, n_problems: 2}\n    probe_groups: 0\n"
    return _stopped(w, ["format gate", "env factory envs.py:factory_raises raised", "RuntimeError: no server"],
                    "env: envs.py:factory_raises", stage=gate)  # fmt: skip


@case("code/env-module-raises-on-import")
def _(w: World) -> Bad:
    w.file("badenv.py", "import nosuchmodule\n")
    argv = _code_recipe(w, "env: badenv.py:make")
    file = str((w.tmp / "badenv.py").resolve())
    return Bad(
        argv,
        [f"env module {file!r} raised on import", "No module named 'nosuchmodule'"],
        fresh=w.out,
        limit=60,
    )


MCP_DIES = """\
import sys
sys.stderr.write("shop server: database is locked\\n")
sys.stderr.flush()
sys.exit(1)
"""


@case("code/mcp-server-fails-to-start")
def _(w: World) -> Bad:
    pytest.importorskip("mcp")
    server = w.file("server.py", MCP_DIES)
    text = f"name: m\nmodel: {{path: {w.saved}}}\ntasks:\n  multi_tool:\n    mcp: {{command: [python, {server}]}}\nstages:\n  - kind: rl\n    tasks: [multi_tool]\n"
    path = w.file("recipe.yaml", text)
    names = [f"{path}:5:", "tasks.multi_tool.mcp", f"MCP server '{sys.executable} {server}'", "failed to start",
             "its stderr: shop server: database is locked"]  # fmt: skip
    return Bad(["run", path, "--output-dir", str(w.out)], names, fresh=w.out, limit=60)


@case("code/judge-endpoint-unreachable")
def _(w: World) -> Bad:
    judge = (
        ", rewards: {judge: 1.0}, judge: {url: 'http://127.0.0.1:9/v1', model: j, retries: 0, timeout: 0.5}"
    )
    argv = _code_recipe(w, "rewards: [exact_match]", train=judge)
    return Bad(
        argv, ["judge endpoint http://127.0.0.1:9/v1/chat/completions unreachable"], fresh=w.out, limit=60
    )


@case("code/eval-says-which-reward-function-failed")
def _(w: World) -> Bad:
    """`temper eval` counts a failing reward function's completions as wrong and says, on the
    console, which function failed and how (not only in eval.json)."""
    _code_recipe(w, "rewards: []")  # (writes rows.jsonl and rewards.py)
    argv = ["eval", "--model", str(w.saved), "--out", str(w.out), "--task-data", str(w.tmp / "rows.jsonl"),
            "--reward", f"{w.tmp / 'rewards.py'}:raises", "--task-option", "rows.split_column=split",
            "--n_problems", "2", "--k", "1", "--max_new_tokens", "4", "--splits", "test"]  # fmt: skip

    def said() -> None:
        said = f"first verifier_error: reward function {w.tmp / 'rewards.py'}:raises raised on 2 completions (problem rows.jsonl:5, problem rows.jsonl:6): ValueError: my reward blew up"
        assert "user code failed (verifier_error 4); counted as wrong answers" in w.said and said in w.said, (
            w.said
        )

    return Bad(argv, [], code=0, quiet=True, limit=60, then=said)


def _unfinished(stage: Path) -> None:
    """A stage stopped after it trained: no model, not marked complete, no scratch."""
    assert stage.is_dir() and not (stage / "model").exists() and not (stage / "stage.json").exists()


# --- the battery -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    tokenizer = build_tokenizer()
    return save_model(
        build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("saved") / "model"
    )


def _files(folder: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under `folder`."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))
    }


_SAID = re.compile(r"^temper(?: \w+)?: (error|interrupted|terminated)")


def _fresh_ctrl_c(name: str) -> None:
    """The interrupt cases start from what a terminal gives a fresh process: Python's SIGINT handler,
    SIGINT unblocked (a child inherits an ignored or blocked SIGINT). In two full-suite runs of
    2026-11-30 (not reproduced alone) both SIGINT cases behaved as if SIGINT were ignored in the
    pytest process; the cause was not found. A warning names the state found, so a leak shows."""
    handler, blocked = signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if handler is not signal.default_int_handler or signal.SIGINT in blocked:
        warnings.warn(f"{name}: SIGINT handler {handler!r}, blocked {sorted(blocked)}: reset", stacklevel=2)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


class _Hung(BaseException):
    """A case ran past its hard time limit (a BaseException: nothing in temper may catch it)."""


@contextmanager
def _hard_limit(seconds: float, name: str):
    """Fail the case once it has run `seconds` (SIGALRM interrupts a wait or a sleep in the main
    thread); if even that cannot interrupt it, faulthandler ends the process 60 s later, with
    every thread's stack, rather than let the suite hang."""

    def hung(signum, frame):
        raise _Hung(f"{name} ran past its hard time limit of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + 60, exit=True, file=sys.__stderr__)
    try:
        yield
    except _Hung as err:
        pytest.fail(str(err))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_refused_cleanly(name, saved, tmp_path, capsys, monkeypatch):
    if name.startswith("interrupt/"):
        _fresh_ctrl_c(name)
    root = tmp_path / "cwd"  # the command's working folder: a relative path lands here, nowhere else
    root.mkdir()
    monkeypatch.chdir(root)
    w = World(tmp_path / "w", saved, capsys, monkeypatch)
    w.tmp.mkdir()
    release = tmp_path / "release"
    monkeypatch.setenv(RELEASE_ENV, str(release))  # hung user code waits for this file
    bad = CASES[name](w)
    before = _files(bad.keep) if bad.keep else None
    capsys.readouterr()
    try:
        with _hard_limit(bad.limit, name):
            if bad.run:
                code, err = bad.run()
            else:
                try:
                    code = main(bad.argv)
                except SystemExit as exit:  # argparse's refusal of an unknown flag
                    code = exit.code
                except KeyboardInterrupt:  # would stop pytest itself rather than fail the test
                    pytest.fail("KeyboardInterrupt escaped temper.cli.main")
                err = capsys.readouterr().err
    finally:
        release.touch()
        for thread in guard.user_threads():  # the abandoned calls of hung user code end now
            thread.join(10)
    assert guard.user_threads() == [], "a thread of user code outlived the case"
    w.said = err

    assert code == bad.code, err
    assert "Traceback" not in err, err
    said = [i for i, line in enumerate(err.splitlines()) if _SAID.match(line)]
    if bad.quiet:
        assert said == [], err
    else:
        assert len(said) == 1, err  # one error line (the lines of a block follow it indented)
        block = "\n".join(err.splitlines()[said[0] :])
        for place in bad.names:
            assert place in block, (place, block)
    scratch = [str(p) for p in tmp_path.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]
    assert scratch == [], scratch
    assert list(root.iterdir()) == []
    if bad.fresh is not None:
        assert not bad.fresh.exists(), sorted(bad.fresh.rglob("*"))
    if bad.keep is not None:
        assert _files(bad.keep) == before
    if bad.then:
        bad.then()


def test_the_battery_is_large_and_spans_every_class():
    classes = {name.split("/")[0] for name in CASES}
    assert len(CASES) >= 50 + 30  # 30 and more of them user code's (issue 24)
    assert classes == {"recipe", "data", "model", "flag", "interrupt", "fault", "code"}
    assert len([n for n in CASES if n.startswith("code/")]) >= 30
