import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("dist_train.py")


def _run(tmp_path: Path, processes: int) -> list[float]:
    out = tmp_path / f"p{processes}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(SCRIPT),
        str(out),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "losses.json").read_text())


@pytest.mark.slow
def test_two_processes_match_one_at_the_same_global_batch(tmp_path):
    one, two = _run(tmp_path, 1), _run(tmp_path, 2)
    assert len(one) == len(two) == 4
    assert two == pytest.approx(one, rel=1e-4)
