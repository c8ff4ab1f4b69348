"""A battery of bad recipes: each is refused by `temper run --dry-run` before anything runs, with one
`temper: error:` block naming the file, the offending line and key path, and no traceback."""

from pathlib import Path

import pytest

from temper.cli import main

# line numbers below refer to this text (edits replace whole lines, so the numbering stays)
BASE = """\
name: bad
model: {preset: nano}
tasks:
  arithmetic: {max_digits: 2}
stages:
  - kind: pretrain
    name: base
    corpus: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: sft
    name: sft
    data: {tasks: [arithmetic], problems_per_task: 10}
    train: {max_steps: 4, batch_size: 4, warmup_steps: 1}
  - kind: rl
    name: rl
    tasks: [arithmetic]
    source: sft
    train: {steps: 4, prompts_per_step: 2, group_size: 4}
  - kind: eval
    name: eval
    models: [sft, rl]
    n_problems: 4
"""

PRE, SFT, RL = (
    "    train: {max_steps: 4, batch_size: 4, ",
    "    train: {max_steps: 4, batch_size: 4, ",
    "    train: {steps: 4, ",
)

# (id, {line: new text}, line, key path, part of the message)
BAD = [
    (
        "batch-size-0",
        {13: "    train: {max_steps: 4, batch_size: 0, warmup_steps: 1}"},
        13,
        "stages[1].train.batch_size",
        "greater than or equal to 1",
    ),
    (
        "max-steps-0",
        {9: "    train: {max_steps: 0, batch_size: 4, warmup_steps: 0}"},
        9,
        "stages[0].train.max_steps",
        "greater than or equal to 1",
    ),
    ("negative-lr", {13: SFT + "lr: -0.1, warmup_steps: 1}"}, 13, "stages[1].train.lr", "greater than 0"),
    (
        "negative-warmup",
        {9: PRE + "warmup_steps: -1}"},
        9,
        "stages[0].train.warmup_steps",
        "greater than or equal to 0",
    ),
    (
        "warmup-not-below-max-steps",
        {13: SFT + "warmup_steps: 4}"},
        13,
        "stages[1].train.warmup_steps",
        "must be below max_steps (4)",
    ),
    (
        "muon-under-fsdp",
        {13: SFT + "optimizer: muon, strategy: fsdp, warmup_steps: 1}"},
        13,
        "stages[1].train.strategy",
        "optimizer muon cannot run under strategy fsdp",
    ),
    (
        "unknown-strategy",
        {18: RL + "strategy: fdsp}"},
        18,
        "stages[2].train.strategy",
        "did you mean 'fsdp'? Valid: ddp, fsdp",
    ),
    (
        "micro-batch-not-dividing",
        {13: SFT + "micro_batch_size: 3, warmup_steps: 1}"},
        13,
        "stages[1].train.micro_batch_size",
        "must divide batch_size (4)",
    ),
    (
        "misspelt-schedule",
        {13: SFT + "schedule: cosin, warmup_steps: 1}"},
        13,
        "stages[1].train.schedule",
        "did you mean 'cosine'",
    ),
    (
        "beta-of-1",
        {9: PRE + "betas: [0.9, 1.0], warmup_steps: 1}"},
        9,
        "stages[0].train.betas[1]",
        "less than 1",
    ),
    (
        "log-every-0",
        {9: PRE + "log_every: 0, warmup_steps: 1}"},
        9,
        "stages[0].train.log_every",
        "greater than or equal to 1",
    ),
    (
        "negative-grad-clip",
        {13: SFT + "grad_clip: -1, warmup_steps: 1}"},
        13,
        "stages[1].train.grad_clip",
        "greater than or equal to 0",
    ),
    (
        "prompts-per-step-0",
        {18: RL + "prompts_per_step: 0, group_size: 4}"},
        18,
        "stages[2].train.prompts_per_step",
        "greater than or equal to 1",
    ),
    (
        "negative-temperature",
        {18: RL + "temperature: -1, group_size: 4}"},
        18,
        "stages[2].train.temperature",
        "greater than or equal to 0",
    ),
    ("top-p-0", {18: RL + "top_p: 0, group_size: 4}"}, 18, "stages[2].train.top_p", "greater than 0"),
    (
        "top-p-above-1",
        {18: RL + "top_p: 1.5, group_size: 4}"},
        18,
        "stages[2].train.top_p",
        "less than or equal to 1",
    ),
    (
        "grpo-group-of-1",
        {18: RL + "prompts_per_step: 2, group_size: 1}"},
        18,
        "stages[2].train.group_size",
        "at least 2 with advantage 'grpo'",
    ),
    (
        "rloo-group-of-1",
        {18: RL + "advantage: rloo, group_size: 1}"},
        18,
        "stages[2].train.group_size",
        "at least 2 with advantage 'rloo'",
    ),
    (
        "reinforce-pp-group-of-1",
        {18: RL + "advantage: reinforce_pp, group_size: 1}"},
        18,
        "stages[2].train.group_size",
        "at least 2",
    ),
    (
        "rl-warmup-not-below-steps",
        {18: RL + "warmup_steps: 4}"},
        18,
        "stages[2].train.warmup_steps",
        "must be below steps (4)",
    ),
    (
        "too-many-minibatches",
        {18: RL + "prompts_per_step: 2, group_size: 4, minibatches: 9}"},
        18,
        "stages[2].train.minibatches",
        "at most prompts_per_step x group_size (8)",
    ),
    ("epochs-0", {18: RL + "epochs: 0}"}, 18, "stages[2].train.epochs", "greater than or equal to 1"),
    (
        "negative-clip-low",
        {18: RL + "clip_low: -0.1}"},
        18,
        "stages[2].train.clip_low",
        "greater than or equal to 0",
    ),
    ("dual-clip-below-1", {18: RL + "dual_clip: 0.5}"}, 18, "stages[2].train.dual_clip", "greater than 1"),
    (
        "negative-kl-coef",
        {18: RL + "kl_coef: -0.1}"},
        18,
        "stages[2].train.kl_coef",
        "greater than or equal to 0",
    ),
    (
        "misspelt-aggregation",
        {18: RL + "aggregation: tokn}"},
        18,
        "stages[2].train.aggregation",
        "did you mean 'token'",
    ),
    (
        "gamma-above-1",
        {18: RL + "advantage: gae, gamma: 1.5}"},
        18,
        "stages[2].train.gamma",
        "less than or equal to 1",
    ),
    (
        "overlong-buffer-too-long",
        {18: RL + "max_new_tokens: 8, overlong_buffer: 8}"},
        18,
        "stages[2].train.overlong_buffer",
        "below max_new_tokens (8)",
    ),
    (
        "unknown-reward",
        {18: RL + "rewards: {outcome: 1, formt: 0.1}}"},
        18,
        "stages[2].train.rewards.formt",
        "unknown reward component 'formt'",
    ),
    ("rl-without-tasks", {16: "    tasks: []"}, 16, "stages[2].tasks", "at least one task"),
    ("eval-k-0", {22: "    k: 0"}, 22, "stages[3].k", "greater than 0"),
    (
        "negative-problems-per-task",
        {12: "    data: {tasks: [arithmetic], problems_per_task: {arithmetic: -1}}"},
        12,
        "stages[1].data.problems_per_task.arithmetic",
        "at least 0, got -1",
    ),
    ("lora-dropout-of-1", {17: "    lora: {dropout: 1.0}"}, 17, "stages[2].lora.dropout", "less than 1"),
    (
        "unknown-task-in-sft",
        {12: "    data: {tasks: [arithmetic, nope]}"},
        12,
        "stages[1].data.tasks[1]",
        "uses task 'nope'",
    ),
    ("unknown-task-in-rl", {16: "    tasks: [arithmtic]"}, 16, "stages[2].tasks[0]", "uses task 'arithmtic'"),
    (
        "unknown-task-option",
        {4: "  arithmetic: {max_digitz: 2}"},
        4,
        "tasks.arithmetic.max_digitz",
        "did you mean 'max_digits'",
    ),
    (
        "unknown-built-in-task",
        {4: "  arithmetic: {task: arithmatic}"},
        4,
        "tasks.arithmetic.task",
        "unknown task 'arithmatic'",
    ),
    (
        "duplicate-stage-name",
        {15: "    name: sft"},
        15,
        "stages[2].name",
        "'sft' is already used by stages[1]",
    ),
    (
        "source-is-a-later-stage",
        {11: "    source: rl"},
        11,
        "stages[1].source",
        "refers to 'rl', which is not an earlier model stage",
    ),
    (
        "eval-of-an-unknown-stage",
        {21: "    models: [sft, nope]"},
        21,
        "stages[3].models[1]",
        "refers to 'nope'",
    ),
    (
        "preset-without-pretrain",
        {6: "  - kind: sft", 8: "#"},
        6,
        "stages[0].kind",
        "the first stage must be 'pretrain'",
    ),
    (
        "workers-address-for-local",
        {18: RL + "prompts_per_step: 2, group_size: 4, workers: {kind: local, address: auto}}"},
        18,
        "stages[2].train.workers.address",
        "an address is for ray workers",
    ),
    (
        "workers-unknown-kind",
        {18: RL + "prompts_per_step: 2, group_size: 4, workers: {kind: cluster}}"},
        18,
        "stages[2].train.workers.kind",
        "unknown value 'cluster' Valid: local, ray",
    ),
    (
        "empty-stage-list",
        {5: "stages: []", **{n: "#" for n in range(6, 23)}},
        5,
        "stages",
        "at least one stage",
    ),
]


def _write(tmp_path: Path, edits: dict[int, str]) -> Path:
    lines = BASE.splitlines()
    for n, text in edits.items():
        lines[n - 1] = text
    path = tmp_path / "recipe.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _dry_run(path: Path, tmp_path: Path) -> int:
    return main(["run", str(path), "--dry-run", "--output-dir", str(tmp_path / "run")])


@pytest.mark.parametrize(("edits", "line", "key", "message"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_bad_recipe_is_refused_at_its_line_and_key(tmp_path, capsys, edits, line, key, message):
    path = _write(tmp_path, edits)
    assert _dry_run(path, tmp_path) == 2
    out, err = capsys.readouterr()
    assert err.count("temper: error:") == 1 and "Traceback" not in err + out
    located = [row.strip() for row in err.splitlines() if row.strip().startswith(f"{path}:{line}: {key}: ")]
    assert located, err
    assert any(message in row for row in located), err
    assert not (tmp_path / "run").exists()  # nothing ran


def test_the_battery_is_large_and_each_case_distinct():
    assert len(BAD) >= 20 and len({c[0] for c in BAD}) == len(BAD)
    assert len({str(sorted(c[1].items())) for c in BAD}) == len(BAD)


GOOD = {
    "base": {},
    "gae-with-a-group-of-1": {18: RL + "advantage: gae, group_size: 1}"},
    "greedy-rollouts": {18: RL + "temperature: 0, group_size: 4}"},
    "no-warmup": {13: SFT + "warmup_steps: 0}"},
    "short-runs-with-the-default-warmup": {9: "    train: {max_steps: 4, batch_size: 4}", 13: SFT[:-2] + "}"},
    "micro-batch-dividing": {13: SFT + "micro_batch_size: 2, warmup_steps: 1}"},
    "fsdp": {13: SFT + "strategy: fsdp, warmup_steps: 1}", 18: RL + "strategy: fsdp}"},
    "minibatch-per-sample": {18: RL + "prompts_per_step: 2, group_size: 4, minibatches: 8}"},
    "task-variant": {4: "  arithmetic: {task: arithmetic, max_digits: 2}"},
}


@pytest.mark.parametrize("edits", list(GOOD.values()), ids=list(GOOD))
def test_a_good_recipe_still_passes(tmp_path, capsys, edits):
    assert _dry_run(_write(tmp_path, edits), tmp_path) == 0, capsys.readouterr().err


SHIPPED = sorted((Path(__file__).parents[1] / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_recipe_validates(tmp_path, capsys, path):
    assert SHIPPED
    assert _dry_run(path, tmp_path) == 0, capsys.readouterr().err
