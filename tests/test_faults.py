"""Faults end cleanly: Ctrl-C, a full disk, an --out that is a file or cannot be written, and
unreadable model files each give exit 2 (130 for Ctrl-C) and one line naming the place, with no
traceback, and leave nothing half-written; a killed run's scratch folders are removed at the next
start of its stage, and what is written follows the user's umask."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from temper.atomic import DiskFullError, atomic_dir, atomic_write_json, remove_stale
from temper.cli import main
from temper.models import ModelNotFoundError, load_model, load_tokenizer, save_model
from temper.stages import registry
from temper.stages.base import StageKind, StageRun, Strict


class FaultStage(Strict):
    kind: Literal["fault"]
    name: str = "fault"
    source: str | None = None


def _writes_a_model(stage: FaultStage, job: StageRun) -> Path:
    with atomic_dir(job.out / "model") as tmp:
        (tmp / "weights.txt").write_text("ok")
    return job.out / "model"


FAULT = StageKind(
    name="fault",
    spec=FaultStage,
    run=_writes_a_model,
    describe=lambda stage, recipe: "fault",
    reads="model",
    produces_model=True,
    help="a toy stage whose run each test replaces",
)


@pytest.fixture
def stage() -> Callable[[Callable[[FaultStage, StageRun], object]], None]:
    """Register the toy kind with a given run."""

    def register(run: Callable[[FaultStage, StageRun], object]) -> None:
        registry.unregister("fault")
        registry.register(dataclasses.replace(FAULT, run=run))

    register(_writes_a_model)
    yield register
    registry.unregister("fault")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    d = tmp_path / "source"
    d.mkdir()
    return d


def _cli(capsys, *args: str) -> tuple[int, str]:
    try:
        code = main(list(args))
    except KeyboardInterrupt:  # would stop pytest itself rather than fail the test
        pytest.fail("KeyboardInterrupt escaped temper.cli.main")
    return code, capsys.readouterr().err


def _one_clean_line(err: str, *names: str) -> str:
    """The error is one `temper: error:` line (plus at most a hint line) naming `names`."""
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("temper:")]
    assert 1 <= len(lines) <= 2, err
    assert len(lines) == 1 or lines[1].startswith("temper: hint: ")
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


def _scratch(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def _checkpoint(out: Path, step: int) -> None:
    ck = out / "checkpoints" / f"step-{step:07d}"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text(json.dumps({"step": step}))


# --- Ctrl-C -------------------------------------------------------------------------------


def test_ctrl_c_exits_130_with_the_step_to_resume_from(stage, source, tmp_path, capsys):
    def interrupted(spec, job):
        _checkpoint(job.out, 40)
        with atomic_dir(job.out / "model") as tmp:  # Ctrl-C in the middle of the final save
            (tmp / "weights.txt").write_text("half")
            raise KeyboardInterrupt

    stage(interrupted)
    out = tmp_path / "out"
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    assert code == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == [
        f"temper: interrupted; rerun the same command to resume from step 40 "
        f"({out / 'checkpoints' / 'step-0000040'})"
    ]
    assert not (out / "model").exists() and _scratch(out) == []


def test_ctrl_c_before_any_checkpoint_says_resume_without_a_step(stage, source, tmp_path, capsys):
    def interrupted(spec, job):
        raise KeyboardInterrupt

    stage(interrupted)
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(tmp_path / "out"))
    assert (code, err.strip()) == (130, "temper: interrupted; rerun the same command to resume")


def test_ctrl_c_in_a_recipe_names_the_running_stages_checkpoint(stage, source, tmp_path, capsys):
    def interrupted(spec, job):
        _checkpoint(job.out, 7)
        raise KeyboardInterrupt

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"name: toy\nmodel: {{path: {source}}}\nstages:\n  - kind: fault\n  - kind: fault\n    name: two\n"
    )
    stage(_writes_a_model)
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    (run / "02-two" / "stage.json").unlink()  # the second stage runs again, and is interrupted
    stage(interrupted)
    code, err = _cli(capsys, "run", str(recipe), "--output-dir", str(run))
    assert code == 130 and "Traceback" not in err
    assert err.strip().endswith(
        f"rerun the same command to resume from step 7 ({run / '02-two' / 'checkpoints' / 'step-0000007'})"
    )


# --- full disk ----------------------------------------------------------------------------


def test_a_full_disk_during_a_folder_write_names_the_folder(stage, source, tmp_path, capsys):
    def full(spec, job):
        with atomic_dir(job.out / "model") as tmp:
            (tmp / "weights.txt").write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no path

    stage(full)
    out = tmp_path / "out"
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    assert code == 2
    line = _one_clean_line(err, out / "model")
    assert line == f"temper: error: the disk is full while writing {out / 'model'}"
    assert "free space" in err
    assert not (out / "model").exists() and _scratch(out) == []


def test_torch_saves_iostream_error_on_a_full_disk_is_called_a_full_disk(
    stage, source, tmp_path, capsys, monkeypatch
):
    def full(spec, job):
        with atomic_dir(job.out / "checkpoints" / "step-0000002") as tmp:
            (tmp / "model.bin").write_text("half")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . basic_ios::clear: iostream error")

    stage(full)
    out = tmp_path / "out"
    real = shutil.disk_usage
    monkeypatch.setattr(
        "temper.atomic.shutil.disk_usage",
        lambda p: real(p)._replace(free=4096) if str(out) in str(p) else real(p),
    )
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    assert code == 2
    _one_clean_line(err, "disk is full", out / "checkpoints" / "step-0000002")
    assert _scratch(out) == [] and not (out / "checkpoints" / "step-0000002").exists()


def test_a_full_disk_outside_an_atomic_write_names_the_output_folder(stage, source, tmp_path, capsys):
    def full(spec, job):
        with open(job.out / "metrics.jsonl", "a") as f:  # an append, as the metrics log does
            f.write("x")
            raise OSError(errno.ENOSPC, "No space left on device")

    stage(full)
    out = tmp_path / "out"
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    assert code == 2
    assert _one_clean_line(err) == f"temper: error: the disk is full while writing under {out}"


def test_a_full_disk_during_a_file_write_names_the_file(tmp_path, monkeypatch):
    class Full:
        def __init__(self, fd, mode):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("temper.atomic.os.fdopen", Full)
    with pytest.raises(DiskFullError) as caught:
        atomic_write_json(tmp_path / "summary.json", {"a": 1})
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(tmp_path / "summary.json")
    assert list(tmp_path.iterdir()) == []  # neither the file nor its scratch copy


def test_a_bug_is_not_mistaken_for_a_full_disk(tmp_path):
    with pytest.raises(ZeroDivisionError), atomic_dir(tmp_path / "model"):
        1 / 0  # noqa: B018  (the disk has room: the error stays what it is)


# --- output folders -----------------------------------------------------------------------


@pytest.mark.parametrize("under", [False, True], ids=["out-is-a-file", "out-under-a-file"])
def test_out_that_is_a_file_is_one_line(stage, source, tmp_path, capsys, under):
    file = tmp_path / "taken.txt"
    file.write_text("keep me")
    out = file / "sub" if under else file
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    assert code == 2
    line = _one_clean_line(err, file)
    assert "is a file where a folder is needed" in line
    assert file.read_text() == "keep me"


def test_an_existing_folder_that_must_be_new_is_not_called_a_file(tmp_path):
    from temper.cli import _expected

    (tmp_path / "d").mkdir()
    with pytest.raises(FileExistsError) as caught:
        (tmp_path / "d").mkdir()
    assert _expected(caught.value) == (f"{tmp_path / 'd'} already exists", None)


def test_an_unwritable_out_is_one_line(stage, source, tmp_path, capsys, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked / "out"
    if os.geteuid() == 0:  # root ignores permissions: make mkdir refuse as it would for a user
        real = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if self == out or locked in self.parents and not self.exists():
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    else:
        locked.chmod(0o500)
    try:
        code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(out))
    finally:
        locked.chmod(0o700)
    assert code == 2
    line = _one_clean_line(err, out)
    assert line.startswith("temper: error: permission denied:")
    assert not out.exists()


# --- model directories --------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    from temper.models import build_preset, build_tokenizer

    tokenizer = build_tokenizer()
    return save_model(
        build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("m") / "model"
    )


def _truncate(d: Path) -> None:
    weights = d / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)


BROKEN = {
    "truncated weights": (_truncate, "model.safetensors", "truncated"),
    "empty weights": (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors", "empty"),
    "garbage weights": (
        lambda d: (d / "model.safetensors").write_text("<html>404</html>"),
        "model.safetensors",
        "not safetensors",
    ),
    "config not JSON": (
        lambda d: (d / "config.json").write_text("{model_type: llama"),
        "config.json",
        "not valid JSON",
    ),
    "config binary": (
        lambda d: (d / "config.json").write_bytes(b"\xff\xfe\x00"),
        "config.json",
        "not a text file",
    ),
    "no config": (lambda d: (d / "config.json").unlink(), "has no config.json", ""),
    "tokenizer not JSON": (
        lambda d: (d / "tokenizer.json").write_text("{"),
        "tokenizer.json",
        "not valid JSON",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_unreadable_model_files_are_named(saved, tmp_path, case):
    model = tmp_path / "model"
    shutil.copytree(saved, model)
    damage, name, why = BROKEN[case]
    damage(model)
    with pytest.raises(ModelNotFoundError) as caught:
        load_model(model)
        load_tokenizer(model)
    message = str(caught.value)
    assert name in message and why in message and "\n" not in message


def test_unreadable_weights_through_the_cli_are_one_line(stage, saved, tmp_path, capsys):
    stage(lambda spec, job: load_model(job.source))
    model = tmp_path / "model"
    shutil.copytree(saved, model)
    (model / "model.safetensors").write_bytes(b"")
    code, err = _cli(capsys, "fault", "--model", str(model), "--out", str(tmp_path / "out"))
    assert code == 2
    _one_clean_line(err, model / "model.safetensors", "empty")


def test_a_model_folder_without_tokenizer_files_names_the_missing_file(saved, tmp_path):
    """Without any tokenizer file transformers tries to convert a slow tokenizer and blames a
    missing sentencepiece install; the folder check names the file instead."""
    model = tmp_path / "model"
    shutil.copytree(saved, model)
    for f in model.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ModelNotFoundError) as caught:
        load_tokenizer(model)
    message = str(caught.value)
    assert message.startswith(f"model directory {str(model)!r} has no tokenizer.json")
    assert "sentencepiece" not in message and "\n" not in message


def test_a_long_message_is_cut_after_a_whole_sentence():
    from temper.models.loading import _whole_sentences

    long = "Unrecognized model in d.\nShould have a `model_type` key.\n" + ", ".join(["llama"] * 200)
    assert _whole_sentences(long) == "Unrecognized model in d. Should have a `model_type` key."


# --- stale scratch folders, umask ---------------------------------------------------------


def _killed_run(out: Path) -> None:
    """What kill -9 leaves: a half-saved model, the old model moved aside, a partial checkpoint."""
    (out / ".model.tmp-abc123").mkdir(parents=True)
    (out / ".model.tmp-abc123" / "model.safetensors").write_bytes(b"\0" * 100)
    (out / ".model.old-4242").mkdir()
    (out / ".metrics.jsonl.tmp-x1").write_text("{")
    _checkpoint(out, 10)
    (out / "checkpoints" / ".step-0000020.tmp-zz").mkdir()
    (out / "checkpoints" / ".step-0000020.tmp-zz" / "optimizer.bin").write_bytes(b"\0" * 100)


def test_a_stage_command_removes_what_a_killed_run_left(stage, source, tmp_path, capsys):
    out = tmp_path / "out"
    _killed_run(out)
    assert main(["fault", "--model", str(source), "--out", str(out)]) == 0
    assert _scratch(out) == []
    assert (out / "checkpoints" / "step-0000010" / "state.json").exists()  # real checkpoints stay
    assert (out / "model" / "weights.txt").read_text() == "ok"


def test_stale_removal_stays_near_the_folder(tmp_path):
    deep = tmp_path / "a" / "b" / ".x.tmp-1"  # two levels down: not the stage's scratch
    deep.mkdir(parents=True)
    (tmp_path / ".report.html.tmp-2").write_text("")
    (tmp_path / ".notes.tmp").write_text("")  # not our pattern
    assert remove_stale(tmp_path) == [tmp_path / ".report.html.tmp-2"]
    assert deep.exists() and (tmp_path / ".notes.tmp").exists()


def test_a_recipe_stage_removes_what_a_killed_run_left(stage, source, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: toy\nmodel: {{path: {source}}}\nstages:\n  - kind: fault\n")
    run = tmp_path / "run"
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    (run / "01-fault" / "stage.json").unlink()  # killed: started with these settings, not finished
    _killed_run(run / "01-fault")
    (run / ".report.html.tmp-k").write_text("<html")
    assert main(["run", str(recipe), "--output-dir", str(run)]) == 0
    assert (run / "01-fault" / "checkpoints" / "step-0000010").exists()  # resumed, not started over
    assert _scratch(run) == [] and (run / "01-fault" / "stage.json").exists()


def test_a_kill_during_the_final_save_does_not_break_the_next_save(saved, tmp_path):
    from temper.models import build_tokenizer

    out = tmp_path / "out"
    _killed_run(out)  # killed between the two renames: no model, the old one aside
    assert sorted(p.name for p in remove_stale(out)) == [
        ".metrics.jsonl.tmp-x1",
        ".model.old-4242",
        ".model.tmp-abc123",
        ".step-0000020.tmp-zz",
    ]
    save_model(load_model(saved), build_tokenizer(), out / "model")
    load_model(out / "model")
    assert _scratch(out) == []


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(saved, tmp_path, mask):
    from temper.models import build_tokenizer

    old = os.umask(mask)
    try:
        save_model(load_model(saved), build_tokenizer(), tmp_path / "model")
        atomic_write_json(tmp_path / "summary.json", {"a": 1})
    finally:
        os.umask(old)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(tmp_path / "model") == 0o777 & ~mask
    assert mode(tmp_path / "model" / "model.safetensors") == 0o666 & ~mask  # tempfile's default is 0600
    assert mode(tmp_path / "model" / "config.json") == 0o666 & ~mask
    assert mode(tmp_path / "summary.json") == 0o666 & ~mask


# --- debug --------------------------------------------------------------------------------


def test_temper_debug_shows_the_traceback(stage, source, tmp_path, capsys, monkeypatch):
    file = tmp_path / "taken.txt"
    file.write_text("")
    monkeypatch.setenv("TEMPER_DEBUG", "1")
    code, err = _cli(capsys, "fault", "--model", str(source), "--out", str(file))
    assert code == 2 and "Traceback" in err and "FileExistsError" in err
    assert err.strip().splitlines()[-2].startswith("temper: error:")


def test_a_bug_keeps_its_traceback(stage, source, tmp_path):
    def bug(spec, job):
        return {}["missing"]

    stage(bug)
    with pytest.raises(KeyError):  # propagates: Python prints the traceback, exit 1
        main(["fault", "--model", str(source), "--out", str(tmp_path / "out")])


# --- a real stage -------------------------------------------------------------------------


def test_pretrain_interrupted_in_its_final_save_resumes_cleanly(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the final save of a real stage: 130 and the step, then the same command
    resumes from that checkpoint, finishes, and leaves no scratch folder behind."""
    import temper.stages.pretrain as pretrain

    out = tmp_path / "base"
    command = ["pretrain", "--preset", "nano", "--out", str(out), "--corpus.tasks", "arithmetic"]
    command += ["--corpus.problems_per_task", "40", "--max_len", "32", "--train.max_steps", "4"]
    command += ["--train.save_every", "2", "--train.batch_size", "2", "--train.warmup_steps", "0"]
    real_save = pretrain.save_model

    def killed(model, tokenizer, target):
        with atomic_dir(target) as tmp:
            model.save_pretrained(tmp)
            raise KeyboardInterrupt

    monkeypatch.setattr(pretrain, "save_model", killed)
    code, err = _cli(capsys, *command)
    assert code == 130 and "Traceback" not in err
    assert "rerun the same command to resume from step 4" in err
    assert not (out / "model").exists() and _scratch(out) == []

    (out / "checkpoints" / ".step-0000006.tmp-x").mkdir()  # as a kill -9 in a checkpoint leaves it
    monkeypatch.setattr(pretrain, "save_model", real_save)
    assert main(command) == 0
    assert json.loads((out / "pretrain.json").read_text())["steps"] == 4
    load_model(out / "model")
    assert _scratch(out) == []
