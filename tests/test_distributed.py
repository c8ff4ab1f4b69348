"""Multi-process runs are real: two CPU processes (torchrun, gloo) see a world of 2; SFT, GRPO and
prompt distillation give the same losses as one process at the same global batch; a 2-process RL
run resumes exactly; a whole recipe under torchrun is one job writing one run folder.

`accelerate launch --cpu --num_processes 2` is not used: with accelerate 1.15 it starts one
process (see temper/distributed.py), so a test launched that way compares one process with itself.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def launch(
    args: list[str], processes: int, timeout: float = 240, ok: bool = True
) -> subprocess.CompletedProcess:
    """`python ARGS` alone (processes=1: the plain single-process path) or under torchrun."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TESTS.parent / "src")}
    launcher = [sys.executable]
    if processes > 1:
        # --standalone: a free port per launch, so concurrent test runs do not collide
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    done = subprocess.run(launcher + args, env=env, capture_output=True, text=True, timeout=timeout)
    assert (done.returncode == 0) == ok, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def worlds(out: Path) -> list[tuple[int, int]]:
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("world-*.json"))]
    return [(r["rank"], r["world"]) for r in rows]


@pytest.mark.slow
def test_sft_two_processes_match_one_at_the_same_global_batch(tmp_path):
    launch([str(TESTS / "dist_train.py"), str(tmp_path / "p1")], 1)
    launch([str(TESTS / "dist_train.py"), str(tmp_path / "p2")], 2)
    assert worlds(tmp_path / "p2") == [(0, 2), (1, 2)]  # two processes, each sees both
    one = json.loads((tmp_path / "p1" / "losses.json").read_text())
    two = json.loads((tmp_path / "p2" / "losses.json").read_text())
    assert len(one) == len(two) == 4
    assert two == pytest.approx(one, rel=1e-4)
    one_eval = json.loads((tmp_path / "p1" / "eval_losses.json").read_text())
    two_eval = json.loads((tmp_path / "p2" / "eval_losses.json").read_text())
    assert len(one_eval) == 2 and two_eval == pytest.approx(one_eval, rel=1e-5)  # each scored its share
    assert len((tmp_path / "p2" / "metrics.jsonl").read_text().splitlines()) == 4  # one row per step


RL_SETTINGS = json.dumps({"steps": 4, "save_every": 2})


@pytest.fixture(scope="module")
def rl_runs(tmp_path_factory) -> Path:
    """A few GRPO steps (minibatches=1, no dynamic sampling) alone (p1) and in 2 processes (p2)."""
    root = tmp_path_factory.mktemp("rl")
    launch([str(TESTS / "dist_rl.py"), str(root / "p1"), RL_SETTINGS], 1)
    launch([str(TESTS / "dist_rl.py"), str(root / "p2"), RL_SETTINGS], 2)
    return root


def _history(out: Path) -> list[dict]:
    return json.loads((out / "history.json").read_text())


@pytest.mark.slow
def test_rl_two_processes_match_one_at_the_same_global_batch(rl_runs):
    """Each process samples and trains on half of the groups; the rewards (a group's samples do
    not depend on the process that draws it) and the losses and gradient norm (DDP-averaged
    gradients of globally normalized losses) equal one process's, step after step."""
    assert worlds(rl_runs / "p2") == [(0, 2), (1, 2)]
    one, two = _history(rl_runs / "p1"), _history(rl_runs / "p2")
    assert [r["step"] for r in two] == [1, 2, 3, 4]
    for a, b in zip(one, two, strict=True):
        assert b["reward"] == a["reward"] and b["response_length"] == a["response_length"]
        for key in ("loss/policy", "loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert len(set(r["reward"] for r in one)) > 1  # the policy moved: later steps test the update
    rows = (rl_runs / "p2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4]  # written once, by the main process
    assert (rl_runs / "p2" / "rollouts.jsonl").read_text() == (rl_runs / "p1" / "rollouts.jsonl").read_text()


@pytest.mark.slow
def test_rl_two_processes_resume_exactly(rl_runs, tmp_path):
    """Interrupted after step 3, a 2-process run resumes from its step-2 checkpoint (weights,
    optimizer and each process's RNG) and replays steps 3-4 as the uninterrupted run did."""
    out = tmp_path / "cut"
    launch([str(TESTS / "dist_rl.py"), str(out), RL_SETTINGS, "3"], 2, ok=False)
    ckpt = out / "checkpoints" / "step-0000002"
    assert sorted(p.name for p in ckpt.glob("random_states_*")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]
    launch([str(TESTS / "dist_rl.py"), str(out), RL_SETTINGS], 2)
    full, resumed = _history(rl_runs / "p2"), _history(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # the result is the whole run's: 1-2 read back
    for a, b in zip(full[2:], resumed[2:], strict=True):
        assert b["reward"] == a["reward"]
        for key in ("loss/policy", "loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1, 2, 3, 4]  # step 3 logged once, not twice


@pytest.mark.slow
def test_async_rl_two_processes_match_one(tmp_path):
    """With max_staleness 1 each process's worker samples its share of step s with the weights
    after update s - 1: the fixed schedule makes 2 processes equal 1, as in the lockstep loop."""
    settings = json.dumps({"steps": 4, "async_rollouts": {"max_staleness": 1}})
    launch([str(TESTS / "dist_rl.py"), str(tmp_path / "p1"), settings], 1)
    launch([str(TESTS / "dist_rl.py"), str(tmp_path / "p2"), settings], 2)
    one, two = _history(tmp_path / "p1"), _history(tmp_path / "p2")
    assert [r["async/staleness"] for r in two] == [0, 1, 1, 1]
    for a, b in zip(one, two, strict=True):
        assert b["reward"] == a["reward"] and b["response_length"] == a["response_length"]
        # off-policy, the ratio is no longer 1: the loss (~0.01) is a mean of terms of size ~1 that
        # cancel, so the processes' other packing roundings (~1e-6 per logprob) show at ~1e-6 absolute
        for key in ("loss/policy", "loss", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    assert len(set(r["reward"] for r in one)) > 1
    assert (tmp_path / "p2" / "rollouts.jsonl").read_text() == (tmp_path / "p1" / "rollouts.jsonl").read_text()


MICRO = """\
name: micro
model: {preset: nano, seed: 0}
tasks:
  arithmetic: {max_digits: 1, ood_digits: 2}
stages:
  - kind: pretrain
    corpus: {tasks: [arithmetic], problems_per_task: 100}
    max_len: 64
    train: {max_steps: 6, batch_size: 8, lr: 0.003, warmup_steps: 2, log_every: 2, progress: false}
  - kind: sft
    data: {tasks: [arithmetic], problems_per_task: 50, eval_problems: 8}
    train: {max_steps: 4, batch_size: 8, lr: 0.001, warmup_steps: 1, log_every: 1, save_every: 2, progress: false}
  - kind: rl
    tasks: [arithmetic]
    gate: {min_parse_rate: 0.0}
    probe_groups: 2
    train: {steps: 3, prompts_per_step: 4, group_size: 4, max_new_tokens: 8, log_rollouts: 4,
            eval_every: 2, eval_problems: 4, save_every: 2, progress: false}
  - kind: eval
    n_problems: 4
    k: 1
    max_new_tokens: 8
"""


@pytest.mark.slow
def test_two_process_temper_run_writes_one_run_folder(tmp_path):
    """A whole recipe under torchrun is one job: every metrics row once, one model per stage, the
    RL rollouts of the global batch once, the probe, eval and report written by the main process."""
    recipe = tmp_path / "micro.yaml"
    recipe.write_text(MICRO)
    run = tmp_path / "run"
    done = launch(["-m", "temper.cli", "run", str(recipe), "--output-dir", str(run)], 2)
    assert done.stdout.count("arithmetic / rl") == 2  # its test and ood rows: the table is printed once

    assert sorted(p.name for p in run.iterdir()) == [
        ".temper.lock",
        "01-pretrain",
        "02-sft",
        "03-rl",
        "04-eval",
        "plots",
        "recipe.yaml",
        "report.html",
    ]  # fmt: skip  (.temper.lock: held by the main process while it writes the run)
    for stage, steps in (("01-pretrain", [2, 4, 6]), ("02-sft", [1, 2, 3, 4]), ("03-rl", [1, 2, 3])):
        rows = [json.loads(line) for line in (run / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == steps, stage
        assert not [p.name for p in (run / stage).iterdir() if p.name.startswith(".")]  # no scratch dirs
        assert (run / stage / "model" / "model.safetensors").exists()
    rl_rows = [json.loads(line) for line in (run / "03-rl" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/arithmetic/accuracy" in rl_rows[1] and "eval/arithmetic/accuracy" in rl_rows[2]
    rollouts = (run / "03-rl" / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 3 * 4 * 4  # steps x groups x samples: the gathered global batch, once
    ckpt = run / "03-rl" / "checkpoints" / "step-0000002"
    assert sorted(p.name for p in ckpt.glob("random_states_*.pkl")) == [
        "random_states_0.pkl",
        "random_states_1.pkl",
    ]  # each process's RNG is kept
    probe = json.loads((run / "03-rl" / "probe.json").read_text())
    assert probe["gate"]["passed"] and probe["probe"]["groups"] == 2
    assert set(json.loads((run / "04-eval" / "eval.json").read_text())["arithmetic"]) == {
        "pretrain", "sft", "rl",
    }  # fmt: skip


def test_a_step_without_a_learning_signal_skips_the_update(tokenizer, tmp_path):
    """Dynamic sampling that keeps no group (every process trains on the smallest kept count, which
    may be 0) logs the step's sampling diagnostics and leaves the weights alone."""
    import torch

    from temper.models import build_preset
    from temper.tasks.base import Problem, Score
    from temper.train.features.dynamic_sampling import DynamicSampling
    from temper.train.rl import RLConfig, train_rl

    class Constant:
        name = "constant"

        def sample(self, split, n, seed):
            return [Problem(self.name, split, f"{seed}-{i}", "q") for i in range(n)]

        def score(self, problem, completion):
            return Score(0.0, False, True, {"reason": "wrong"})

    model = build_preset("nano", tokenizer, seed=1)
    before = [p.detach().clone() for p in model.parameters()]
    config = RLConfig(
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=2,
        dynamic_sampling=DynamicSampling(),
        progress=False,
    )
    result = train_rl(model, tokenizer, [Constant()], config, tmp_path)
    assert [r["step"] for r in result.history] == [1, 2]
    assert result.history[0]["zero_variance"] == 1.0 and result.history[0]["kept_groups"] == 0
    assert "loss" not in result.history[0]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


DISTILL = """\
name: pd2
model: {preset: nano, seed: 0}
tasks:
  bare: {task: instructed_arithmetic, system: false, grade: rule}
stages:
  - kind: pretrain
    corpus: {tasks: [bare], problems_per_task: 64}
    max_len: 64
    train: {max_steps: 4, batch_size: 8, lr: 0.003, warmup_steps: 0, progress: false}
  - kind: prompt_distill
    tasks: [bare]
    system: "House rule: answer with the last digit."
    prompts: 16
    max_new_tokens: 8
    eval_problems: 4
    train: {max_steps: 4, batch_size: 8, lr: 0.001, warmup_steps: 0, log_every: 1, save_every: 2, progress: false}
"""


@pytest.mark.slow
def test_prompt_distillation_in_two_processes_matches_one(tmp_path):
    """The teacher samples and the greedy evaluations on the main process, the KL steps in the
    supervised loop on both (each its half of the global batch): the rows of one process, once."""
    recipe = tmp_path / "pd.yaml"
    recipe.write_text(DISTILL)
    rows = []
    for processes in (1, 2):
        run = tmp_path / f"p{processes}"
        done = launch(["-m", "temper.cli", "run", str(recipe), "--output-dir", str(run)], processes)
        assert done.stdout.count("KL to the teacher") == 1  # the stage's table, printed once
        log = run / "02-prompt_distill" / "metrics.jsonl"
        rows.append([json.loads(line) for line in log.read_text().splitlines()])
        assert (run / "02-prompt_distill" / "samples.jsonl").read_text().count("\n") == 16
    assert [r["step"] for r in rows[1]] == [1, 2, 3, 4]
    for a, b in zip(*rows, strict=True):
        assert b["kl"] == pytest.approx(a["kl"], rel=1e-4) and b["grad_norm"] == pytest.approx(
            a["grad_norm"], rel=1e-4
        )
