"""Plan-time checks of a recipe's inputs (temper.preflight): a missing or unreadable model, data
file or cache folder, a hub id that cannot be fetched, and a task split that yields nothing are
refused by `temper run` (and `--dry-run`) before any stage runs, each at its line and key path, in
one `temper: error:` block with no traceback and no run folder."""

import json
from pathlib import Path

import pytest

from temper import preflight
from temper.cli import main
from temper.data import sources

# line numbers below refer to this text (edits replace whole lines, so the numbering stays)
BASE = """\
name: inputs
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
stages:
  - kind: pretrain
    name: base
    corpus: {tasks: [arithmetic], problems_per_task: 10, files: [corpus.txt]}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: sft
    name: sft
    data: {tasks: [arithmetic], problems_per_task: 10, files: [chat.jsonl]}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: eval
    name: eval
    splits: [test, ood]
    n_problems: 4
"""

NO_SFT_EVAL = "    data: {tasks: [arithmetic], problems_per_task: 10, eval_problems: 0}"
EMPTY_TEST = "  arithmetic: {max_digits: 1, ood_digits: 2, ops: ['+'], test_fraction: 0.01}"

# (id, {line: new text}, [(line, key path, part of the message)]): every problem of a case is listed
BAD = [
    (
        "missing-sft-file",
        {12: "    data: {tasks: [arithmetic], files: [nope.jsonl]}"},
        [(12, "stages[1].data.files[0]", "nope.jsonl' does not exist")],
    ),
    (
        "corpus-file-is-a-folder",
        {8: "    corpus: {tasks: [arithmetic], files: [folder]}"},
        [
            (
                8,
                "stages[0].corpus.files[0]",
                "folder' is a folder but not one `datasets` wrote with save_to_disk",
            )
        ],
    ),
    (
        "two-missing-files-reported-together",
        {
            8: "    corpus: {tasks: [arithmetic], files: [gone.txt]}",
            12: "    data: {tasks: [arithmetic], files: [chat.jsonl, gone.jsonl]}",
        },
        [
            (8, "stages[0].corpus.files[0]", "gone.txt' does not exist"),
            (12, "stages[1].data.files[1]", "gone.jsonl' does not exist"),
        ],
    ),
    (
        "cache-under-a-file",
        {7: "    cache: corpus.txt/base"},
        [(7, "stages[0].cache", "is not a directory")],
    ),
    (
        "cache-is-a-file",
        {7: "    cache: corpus.txt"},
        [(7, "stages[0].cache", "is a file, not a directory")],
    ),
    (
        "missing-local-model",
        {2: "model: {path: ./no-such-model}", 6: "#", 7: "#", 8: "#", 9: "#"},
        [(2, "model.path", "'./no-such-model' does not exist")],
    ),
    (
        "model-dir-with-a-broken-config",
        {2: "model: {path: ./folder}", 6: "#", 7: "#", 8: "#", 9: "#"},
        [(2, "model.path", "config.json is not valid JSON")],
    ),
    (
        "eval-split-with-no-problems",
        {4: EMPTY_TEST, 12: NO_SFT_EVAL},
        [(4, "tasks.arithmetic", "task 'arithmetic' yields no test problems")],
    ),
    (
        "eval-split-named-with-its-stage",
        {4: EMPTY_TEST, 12: NO_SFT_EVAL},
        [(4, "tasks.arithmetic", "which stage 'eval' uses")],
    ),
    (
        "sft-eval-split-with-no-problems",
        {4: EMPTY_TEST, 16: "    splits: [ood]"},
        [(4, "tasks.arithmetic", "no test problems (no test problem found")],
    ),
    (
        "sft-eval-split-named-with-its-stage",
        {4: EMPTY_TEST, 16: "    splits: [ood]"},
        [(4, "tasks.arithmetic", "which stage 'sft' uses")],
    ),
    (
        "rl-gate-split-with-no-problems",
        {
            4: EMPTY_TEST,
            12: NO_SFT_EVAL,
            14: "  - kind: rl",
            15: "    tasks: [arithmetic]",
            16: "    gate: {n_problems: 4}",
            17: "#",
        },
        [(4, "tasks.arithmetic", "which stage 'rl' uses")],
    ),
    (
        "rl-periodic-eval-split-with-no-problems",
        {
            4: EMPTY_TEST,
            12: NO_SFT_EVAL,
            14: "  - kind: rl",
            15: "    tasks: [arithmetic]",
            16: "    train: {eval_every: 2}",
            17: "#",
        },
        [(4, "tasks.arithmetic", "which stage 'rl' uses")],
    ),
]


def _write(tmp_path: Path, edits: dict[int, str]) -> Path:
    lines = BASE.splitlines()
    for n, text in edits.items():
        lines[n - 1] = text
    (tmp_path / "corpus.txt").write_text("one document\n")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
    (tmp_path / "folder").mkdir(exist_ok=True)
    (tmp_path / "folder" / "config.json").write_text("{")  # a model folder whose config is cut off
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(path: Path, tmp_path: Path, *flags: str) -> int:
    return main(["run", str(path), *flags, "--output-dir", str(tmp_path / "run")])


@pytest.fixture(autouse=True)
def _recipe_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # model paths are relative to the working directory


def _assert_refused(err: str, out: str, path: Path, expected: list[tuple[int, str, str]]) -> None:
    assert err.count("temper: error:") == 1 and "Traceback" not in err + out, err
    rows = [row.strip() for row in err.splitlines()]
    for line, key, message in expected:
        located = [row for row in rows if row.startswith(f"{path}:{line}: {key}: ")]
        assert any(message in row for row in located), err
    assert len([r for r in rows if r.startswith(f"{path}:")]) == len(expected), err  # nothing else


@pytest.mark.parametrize("flags", [["--dry-run"], []], ids=["dry-run", "run"])
@pytest.mark.parametrize(("edits", "expected"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_input_is_refused_before_any_stage(tmp_path, capsys, edits, expected, flags):
    path = _write(tmp_path, edits)
    assert _run(path, tmp_path, *flags) == 2
    out, err = capsys.readouterr()
    _assert_refused(err, out, path, expected)
    assert not (tmp_path / "run").exists()  # nothing ran, not even the run folder


def test_the_base_recipe_passes(tmp_path, capsys):
    assert _run(_write(tmp_path, {}), tmp_path, "--dry-run") == 0, capsys.readouterr().err


def test_an_unused_empty_split_is_not_refused(tmp_path, capsys):
    """The check follows the splits the stages use: no test split used, no error."""
    edits = {4: EMPTY_TEST, 12: "    data: {tasks: [arithmetic], eval_problems: 0}", 16: "    splits: [ood]"}
    assert _run(_write(tmp_path, edits), tmp_path, "--dry-run") == 0, capsys.readouterr().err


HUB = {2: "model: {path: nobody-temper/no-such-model}", 6: "#", 7: "#", 8: "#", 9: "#"}


def test_a_hub_id_offline_is_refused_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(preflight, "hub_reachable", lambda: pytest.fail("offline must not probe the network"))
    path = _write(tmp_path, HUB)
    assert _run(path, tmp_path, "--dry-run") == 2
    out, err = capsys.readouterr()
    _assert_refused(err, out, path, [(2, "model.path", "HF_HUB_OFFLINE is set")])


def test_a_hub_id_without_network_is_refused_at_once(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(preflight, "hub_reachable", lambda: False)
    path = _write(tmp_path, HUB)
    assert _run(path, tmp_path) == 2
    out, err = capsys.readouterr()
    _assert_refused(err, out, path, [(2, "model.path", "cannot be reached")])
    assert not (tmp_path / "run").exists()


def test_a_reachable_hub_id_is_planned_as_fetched(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(preflight, "hub_reachable", lambda: True)
    assert _run(_write(tmp_path, HUB), tmp_path, "--dry-run") == 0
    out, _ = capsys.readouterr()
    assert "model 'nobody-temper/no-such-model': will be fetched from the hub" in out


def test_the_network_probe_gives_up_within_its_timeout(monkeypatch):
    """A request that hangs past its own timeout (name resolution ignores socket timeouts) costs the
    probe's timeout, not a minute; the answer is remembered, not asked again."""
    import threading
    import time

    calls, entered, release = [], threading.Event(), threading.Event()

    def hang(*args, **kwargs):
        calls.append(1)
        entered.set()
        release.wait(60)  # held until the probe has answered: it must not wait for the request
        raise OSError("released")  # then the probe's thread ends quietly, not in a later test

    monkeypatch.setattr(sources.urllib.request, "urlopen", hang)
    monkeypatch.setattr(sources, "_reachable", None)
    start = time.perf_counter()
    try:
        assert sources.hub_reachable(timeout=0.3) is False
        assert sources.hub_reachable(timeout=0.3) is False
        assert entered.wait(30) and len(calls) == 1  # asked once (on a busy machine perhaps late)
        # only guards a probe that waits for the request (60 s): generous, so a busy machine passes
        assert time.perf_counter() - start < 30
    finally:
        release.set()
    monkeypatch.setattr(sources, "_reachable", None)


def test_an_opener_that_answers_nothing_means_unreachable_and_raises_in_no_thread(monkeypatch):
    """urlopen gives None when no handler takes the endpoint's scheme: the probe says unreachable;
    it used to raise AttributeError on None.close() in its thread, seen in whatever test ran next."""
    import threading

    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)
    monkeypatch.setattr(sources.urllib.request, "urlopen", lambda *args, **kwargs: None)
    monkeypatch.setattr(sources, "_reachable", None)
    assert sources.hub_reachable(timeout=30) is False  # the thread ends at once; 30 s only bounds a hang
    assert raised == []
    monkeypatch.setattr(sources, "_reachable", None)


def test_an_eval_only_recipe_evaluates_the_recipe_model(tmp_path, capsys, tokenizer, nano):
    from temper.models import save_model

    save_model(nano, tokenizer, tmp_path / "mine")
    path = tmp_path / "eval.yaml"
    path.write_text(
        "name: eval-only\nmodel: {path: ./mine}\ntasks:\n  arithmetic: {max_digits: 1, ood_digits: 2}\n"
        "stages:\n  - kind: eval\n    splits: [test]\n    n_problems: 2\n    k: 1\n    max_new_tokens: 4\n"
    )
    assert _run(path, tmp_path) == 0, capsys.readouterr().err
    results = json.loads((tmp_path / "run" / "01-eval" / "eval.json").read_text())
    assert list(results["arithmetic"]) == ["./mine"]
    assert results["arithmetic"]["./mine"]["test"]


HOOKS = """\
name: hooks
model: {preset: nano}
tasks: {arithmetic: {max_digits: 2}, general_points: {}}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 10, files: [corpus.txt]}
    train: {epochs: 1, batch_size: 4, warmup_steps: 0}
  - kind: sft
    data: {tasks: [], files: [FILE], eval_problems: 0}
    train: {epochs: 2, batch_size: 4, warmup_steps: 0}
  - kind: rl
    tasks: [arithmetic]
    train: {steps: 2, eval_every: 0}
  - {kind: eval, splits: [test, ood], n_problems: 4, seed: 3}
"""


@pytest.mark.parametrize("file, chats", [("text.jsonl", False), ("chat.jsonl", True)])
def test_the_plan_asks_each_kind_what_it_reads(tmp_path, file, chats):
    """The splits a stage draws, whether it renders chats, its epoch bound, its caches and its eval
    sets come from its kind's hooks (`StageKind`), never from `stage.kind == ...` in the plan."""
    from temper.recipe import parse_recipe
    from temper.runner import eval_specs
    from temper.stages import registry

    (tmp_path / "corpus.txt").write_text("one line\nanother\n")
    (tmp_path / "text.jsonl").write_text('{"text": "a"}\n' * 6)
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    recipe = parse_recipe(HOOKS.replace("FILE", file), base_dir=tmp_path)
    pretrain, sft, rl, ev = recipe.stages
    assert [preflight.stage_splits(s, recipe) for s in recipe.stages] == [
        [("arithmetic", "train")],
        [],
        [("arithmetic", "train")],  # no gate and no periodic evals: the test split is not read
        [(t, s) for t in ("arithmetic", "general_points") for s in ("test", "ood")],  # every task
    ]
    renders = [registry.get(s.kind).renders_chats(s, tmp_path) for s in recipe.stages]
    assert renders == [False, chats, True, True]
    assert preflight._epoch_notes(pretrain, tmp_path) == [
        "pretrain: 1 epochs of 12 rows at batch_size 4 = at most 3 steps (exact once tokenized; packing makes fewer)"
    ]
    rows = 6 if file == "text.jsonl" else 1
    steps = -(-2 * rows // 4)
    assert preflight._epoch_notes(sft, tmp_path) == [
        f"sft: 2 epochs of {rows} rows at batch_size 4 = at most {steps} steps (exact once tokenized)"
    ]
    assert preflight._epoch_notes(rl, tmp_path) == []
    assert registry.get("pretrain").caches(pretrain) == []
    assert eval_specs(recipe) == [([], ["test", "ood"], 4, 3)]
