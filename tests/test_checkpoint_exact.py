"""Checkpoints on exact names and messages: the default number kept, tied weights saved (not as
safetensors, which refuses shared tensors), numeric order past seven digits, and the one-line error
of a checkpoint that cannot be read.

Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.
"""

import pytest
import torch

from temper import distributed
from temper.train.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint


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
