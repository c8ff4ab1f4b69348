"""Checkpoints on one process, exactly: the RNG streams continue where they were saved, the
step and the run's totals come back, and only the newest `keep` complete checkpoints stay (TESTING.md)."""

import json
import random

import numpy as np
import torch
from accelerate import Accelerator

from temper.train.checkpoint import list_checkpoints, load_checkpoint, resume, save_checkpoint


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
