"""Checkpoints on one process, exactly: the RNG streams continue where they were saved, the
step and the run's totals come back, and only the newest `keep` complete checkpoints stay (TESTING.md)."""

import json
import random

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from temper import distributed
from temper.train.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resume,
    save_checkpoint,
)


def _prepared():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return accelerator, *accelerator.prepare(model, optimizer)


def _draws():
    return torch.rand(4).tolist(), random.random(), float(np.random.rand())


def test_loading_a_checkpoint_restores_weights_step_and_every_rng(tmp_path):
    accelerator, model, _ = _prepared()
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    path = save_checkpoint(tmp_path, 3, accelerator)
    assert path == tmp_path / "step-0000003"
    assert json.loads((path / "state.json").read_text()) == {"step": 3, "totals": {}}
    expected_weight = model.weight.detach().clone()
    expected = _draws()  # what a run that never stopped draws next

    torch.manual_seed(123), random.seed(123), np.random.seed(123)
    with torch.no_grad():
        model.weight.zero_()
    assert load_checkpoint(path, accelerator) == 3
    assert torch.equal(model.weight, expected_weight)
    assert _draws() == expected


def test_only_the_newest_keep_complete_checkpoints_stay(tmp_path):
    accelerator, *_ = _prepared()
    for step in (9, 10, 11):
        save_checkpoint(tmp_path, step, accelerator, keep=2)
    # numeric order: step 9 is older than step 10, so it is the one removed
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000010", "step-0000011"]
    (tmp_path / "step-0000012").mkdir()  # no state.json: an incomplete folder is not a checkpoint
    (tmp_path / "notes").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000010", "step-0000011"]
    save_checkpoint(tmp_path, 12_000_000, accelerator, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-12000000"]
    assert list_checkpoints(tmp_path / "missing") == []


def test_resume_loads_the_newest_and_hands_back_its_totals_and_says_so(tmp_path, capsys):
    accelerator, model, _ = _prepared()
    assert resume(tmp_path / "checkpoints", accelerator) == (0, {})  # none yet: start at 0
    totals = {"tokens": 120, "seconds": 2.5, "losses": [0.75, 0.5]}
    save_checkpoint(tmp_path / "checkpoints", 2, accelerator, totals=totals)
    save_checkpoint(tmp_path / "checkpoints", 3, accelerator, totals=totals | {"tokens": 180})
    capsys.readouterr()
    assert resume(tmp_path / "checkpoints", accelerator) == (3, totals | {"tokens": 180})
    newest = tmp_path / "checkpoints" / "step-0000003"
    assert capsys.readouterr().err == f"{tmp_path.name}: resuming from step 3 ({newest})\n"
    (newest / "state.json").write_text(json.dumps({"step": 3}))  # written before totals were kept
    assert resume(tmp_path / "checkpoints", accelerator) == (3, {})


# ---- exact cases, folded in from test_checkpoint_exact.py --------------------------------------
# Checkpoints on exact names and messages: the default number kept, tied weights saved (not as
# safetensors, which refuses shared tensors), numeric order past seven digits, and the one-line error
# of a checkpoint that cannot be read.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False)
        self.b.weight = self.a.weight  # shared, as tied embeddings and LM head are


def test_two_checkpoints_are_kept_by_default_and_tied_weights_round_trip(tmp_path):
    accelerator = distributed.make_accelerator()
    model = accelerator.prepare(_Tied())
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, accelerator)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000002", "step-0000003"]
    with torch.no_grad():
        model.a.weight.fill_(7.0)
    assert load_checkpoint(tmp_path / "step-0000003", accelerator) == 3
    assert model.b.weight is model.a.weight and model.a.weight.ne(7.0).all()


def test_checkpoints_are_ordered_by_step_number_not_by_name(tmp_path):
    for name in ("step-10000000", "step-9999999", "step-0000005"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "state.json").write_text("{}")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000005", "step-9999999", "step-10000000"]


def test_an_unreadable_checkpoint_is_named_with_the_error_on_one_line(tmp_path):
    path = tmp_path / ("x" * 150) / "checkpoints" / "step-0000004"
    path.mkdir(parents=True)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, distributed.make_accelerator())
    why = f"[Errno 2] No such file or directory: '{path / 'state.json'}'"[:200]  # cut at 200 characters
    assert str(err.value) == (
        f"checkpoint {path} cannot be read (FileNotFoundError: {why}); remove that folder to resume from "
        f"the checkpoint before it, or remove {tmp_path / ('x' * 150)} to start the stage over"
    )
    assert isinstance(err.value.__cause__, FileNotFoundError)


class _Broken:
    def load_state(self, path):
        raise RuntimeError("line one\n   line two")


class _Silent:
    def load_state(self, path):
        raise RuntimeError()


def test_a_multi_line_error_is_joined_and_an_empty_one_is_named_by_its_type(tmp_path):
    path = tmp_path / "run" / "checkpoints" / "step-0000001"
    path.mkdir(parents=True)
    (path / "state.json").write_text('{"step": 1}')
    tail = f"; remove that folder to resume from the checkpoint before it, or remove {tmp_path / 'run'} to start the stage over"
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, _Broken())
    assert str(err.value) == f"checkpoint {path} cannot be read (RuntimeError: line one line two)" + tail
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, _Silent())
    assert str(err.value) == f"checkpoint {path} cannot be read (RuntimeError: RuntimeError)" + tail
