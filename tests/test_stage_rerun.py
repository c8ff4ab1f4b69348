"""A stand-alone stage command reruns as `temper run` does: the same settings into a complete
folder do nothing (its summary untouched), other settings are refused naming the changed keys
unless --overwrite, and the same settings into an interrupted folder resume from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper.cli import main
from temper.stages.markers import changed_keys


@pytest.fixture
def sft(tmp_path: Path, tokenizer, nano) -> list[str]:
    """`temper sft` from a saved nano model on eight rows, two steps, into tmp_path/out."""
    model = tmp_path / "model"
    nano.save_pretrained(model)
    tokenizer.save_pretrained(model)
    data = tmp_path / "d.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"{i}+1"}, {"role": "assistant", "content": f"{i + 1}"}]}
        for i in range(8)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "sft", "--model", str(model), "--out", str(tmp_path / "out"), "--data.files", str(data),
        "--train.max_steps", "2", "--train.batch_size", "4",  # the default warm-up fits 2 steps
    ]  # fmt: skip


def _files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `folder`: its bytes and mtime (ns), to see that nothing changed."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_same_settings_into_a_complete_folder_do_nothing(sft, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(sft) == 0
    before = _files(out)
    assert json.loads((out / "sft.json").read_text())["steps"] == 2
    capsys.readouterr()
    assert main(sft) == 0
    err = capsys.readouterr().err
    assert f"temper sft: complete, nothing to do ({out})" in err.splitlines()
    assert "sft:" not in err.replace("temper sft:", "")  # no training started: it says so once
    assert _files(out) == before  # sft.json's bytes and mtime included


def test_other_settings_are_refused_naming_the_changed_key(sft, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(sft) == 0
    before = _files(out)
    capsys.readouterr()
    assert main([*sft, "--train.lr", "0.0003"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = err.strip().splitlines()
    assert line.startswith(f"temper: error: {out} holds a sft stage started with other settings")
    assert "(train.lr: 0.001 -> 0.0003)" in line and "--overwrite" in line
    assert _files(out) == before


def test_another_input_model_is_a_changed_setting(sft, tmp_path, capsys, tokenizer, nano):
    assert main(sft) == 0
    other = tmp_path / "other"
    nano.save_pretrained(other)
    tokenizer.save_pretrained(other)
    capsys.readouterr()
    argv = list(sft)
    argv[argv.index("--model") + 1] = str(other)
    assert main(argv) == 2
    assert (
        f"input.path: {json.dumps(str(tmp_path / 'model'))} -> {json.dumps(str(other))}"
        in capsys.readouterr().err
    )


def test_overwrite_replaces_a_folder_of_other_settings(sft, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*sft, "--train.save_every", "1"]) == 0
    assert (out / "checkpoints").exists()
    assert main([*sft, "--train.lr", "0.0003", "--overwrite"]) == 0
    assert not (out / "checkpoints").exists()  # cleared, not resumed from the old run's step 2
    started = json.loads((out / "stage.started.json").read_text())
    assert started["settings"]["train"]["lr"] == 0.0003
    assert json.loads((out / "stage.json").read_text())["hash"] == started["hash"]
    assert json.loads((out / "sft.json").read_text())["steps"] == 2
    capsys.readouterr()
    assert main([*sft, "--train.lr", "0.0003"]) == 0  # and is now complete with those settings
    assert "complete, nothing to do" in capsys.readouterr().err


def test_an_interrupted_run_resumes_with_the_same_settings(sft, tmp_path, capsys, monkeypatch):
    import temper.train.supervised as supervised

    out = tmp_path / "out"
    argv = [*sft, "--train.save_every", "1"]
    save = supervised.save_checkpoint

    def save_then_interrupt(root, step, accelerator, **kwargs):
        save(root, step, accelerator, **kwargs)
        raise KeyboardInterrupt  # Ctrl-C right after the first checkpoint

    monkeypatch.setattr(supervised, "save_checkpoint", save_then_interrupt)
    assert main(argv) == 130
    assert (out / "stage.started.json").exists() and not (out / "stage.json").exists()
    monkeypatch.setattr(supervised, "save_checkpoint", save)
    capsys.readouterr()
    assert main(argv) == 0
    assert f"out: resuming from step 1 ({out / 'checkpoints' / 'step-0000001'})" in capsys.readouterr().err
    assert json.loads((out / "sft.json").read_text())["steps"] == 2 and (out / "stage.json").exists()


def test_a_kill_in_the_final_save_leaves_the_whole_runs_summary(sft, tmp_path, capsys, monkeypatch):
    """Interrupted while saving the model after its last step: the rerun resumes from that step's
    checkpoint, says so, and writes the summary of the whole run (tokens, final loss, seconds)."""
    import temper.stages.sft as sft_stage

    argv = [*sft, "--train.save_every", "1"]
    whole = [*argv[:4], str(tmp_path / "whole"), *argv[5:]]
    assert whole[3] == "--out" and main(whole) == 0
    real = sft_stage.save_trained

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sft_stage, "save_trained", killed)
    assert main(argv) == 130
    monkeypatch.setattr(sft_stage, "save_trained", real)
    capsys.readouterr()
    assert main(argv) == 0
    assert (
        f"resuming from step 2 ({tmp_path / 'out' / 'checkpoints' / 'step-0000002'})"
        in capsys.readouterr().err
    )
    got = json.loads((tmp_path / "out" / "sft.json").read_text())
    want = json.loads((tmp_path / "whole" / "sft.json").read_text())
    assert (got["tokens"], got["final_loss"], got["steps"]) == (want["tokens"], want["final_loss"], 2)
    assert got["tokens"] > 0 and got["seconds"] > 0.01  # two steps of training, not the rerun's none


def test_an_interrupted_run_with_other_settings_is_refused(sft, tmp_path, capsys, monkeypatch):
    import temper.stages.sft as sft_stage

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sft_stage, "train_supervised", interrupted)
    assert main(sft) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main([*sft, "--train.max_steps", "3"]) == 2
    assert "train.max_steps: 2 -> 3" in capsys.readouterr().err


def test_changed_keys_name_nested_added_and_removed_settings():
    old = {"train": {"lr": 0.001, "betas": [0.9, 0.95]}, "data": {"files": ["a"]}, "gone": 1}
    new = {"train": {"lr": 0.001, "betas": [0.9, 0.99]}, "data": {"files": ["b"]}, "new": "x"}
    assert changed_keys(old, new) == [
        "data.files: ['a'] -> ['b']",
        "gone: 1 -> (unset)",
        'new: (unset) -> "x"',
        "train.betas: [0.9, 0.95] -> [0.9, 0.99]",
    ]


def test_an_unset_warmup_is_hashed_as_the_steps_it_resolves_to():
    """Folders recorded when the default warm-up was a flat 20 keep their hash wherever it still
    resolves to 20 (200 steps or more); where it resolves lower, the training differs and so does
    the hash; with epochs the steps are not known yet and the unset value is what is hashed."""
    from temper.stages.markers import stage_settings
    from temper.stages.sft import SFTStage

    def settings(**train):
        spec = SFTStage.model_validate({"kind": "sft", "data": {"tasks": ["arithmetic"]}, "train": train})
        return stage_settings(spec)

    def warmup(**train):
        return settings(**train)["train"]["warmup_steps"]

    assert warmup() == warmup(warmup_steps=20) == 20  # max_steps 500: the old default's hash
    assert warmup(max_steps=200) == 20 and warmup(max_steps=199) == 19
    assert warmup(max_steps=100) == 10 and warmup(max_steps=9) == 0
    assert settings(max_steps=100) == settings(max_steps=100, warmup_steps=10)
    assert settings(max_steps=100) != settings(max_steps=100, warmup_steps=20)
    assert warmup(epochs=2) is None and warmup(epochs=2, warmup_steps=20) == 20
