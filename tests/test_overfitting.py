"""The overfitting check: held-out loss rising while the train loss falls is flagged by an exact
rule, in the report's training section (as the RL monitors are) and on the console at the end of
the training."""

import json

import pytest

from temper.data import build_sequences, parse_row
from temper.models import build_preset
from temper.report import write_report
from temper.report.training import overfitting_table
from temper.train import TrainConfig, train_supervised
from temper.train.objective import NextToken
from temper.train.overfitting import RISE, check, first_flagged, warn
from test_report import _stage  # tests/ is on the path (pytest rootdir mode)


def _rows(held: list[float], train: list[float] | None = None, every: int = 100, key: str = "eval_loss"):
    """Metrics rows with a train loss every 10 steps and the held-out losses every `every` steps;
    the train loss falls from 0.5 to 0.015 unless given (one value per held-out evaluation)."""
    n = every * len(held)
    rows = []
    for step in range(10, n + 1, 10):
        k = (step - 1) // every  # the evaluation interval the step is in
        loss = train[k] if train else 0.5 - (0.5 - 0.015) * step / n
        row = {"step": step, "loss": loss}
        if step % every == 0:
            row[key] = held[step // every - 1]
        rows.append(row)
    return rows


# the demo's shape: train 0.5 -> 0.015, held-out at its lowest at step 200, rising at the end
DEMO = [0.45, 0.43, 0.44, 0.46, 0.48]


def test_the_demo_shape_flags_when_held_out_loss_is_3_percent_above_its_lowest():
    rows = _rows(DEMO)
    found = check(rows)
    assert (found.best_step, found.best, found.last_step, found.last) == (200, 0.43, 500, 0.48)
    assert found.rise == pytest.approx(0.48 / 0.43 - 1)
    # train means of the last 3 logged losses by step 200 and by step 500
    assert found.train_at_best == pytest.approx(sum(0.5 - 0.485 * s / 500 for s in (180, 190, 200)) / 3)
    assert found.train_last == pytest.approx(sum(0.5 - 0.485 * s / 500 for s in (480, 490, 500)) / 3)
    assert found.flagged
    assert first_flagged(rows) == 400  # at 300: 0.44 is +2.3% over 0.43, under RISE
    assert (
        "held-out loss 0.43 at step 200 -> 0.48 at step 500 (+11.6%) while the train loss" in found.describe()
    )


@pytest.mark.parametrize(
    ("held", "train", "flagged"),
    [
        ([0.6, 0.5, 0.45, 0.44, 0.43], None, False),  # still falling: the latest is the lowest
        ([0.45, 0.43, 0.43 * (1 + RISE) * 0.999], None, False),  # just under RISE
        ([1.0, 1.0 * (1 + RISE) * 1.001, 1.0 * (1 + RISE) * 1.001], None, True),  # just over
        ([0.43, 0.43, 0.5], None, True),  # a tie at the lowest: the earliest step counts
        ([0.45, 0.43, 0.48], [0.5, 0.4, 0.6], False),  # train loss rose too: not memorizing (lr?)
        ([0.0, 0.0, 0.1], None, True),  # a held-out loss of 0 that rises
    ],
    ids=["falling", "under-rise", "over-rise", "tie", "train-rising", "from-zero"],
)
def test_the_rule(held, train, flagged):
    assert check(_rows(held, train)).flagged is flagged


def test_too_few_evaluations_say_nothing_and_the_preference_key_counts():
    assert check(_rows([0.43, 0.6])) is None  # two points cannot tell a rise from noise
    assert check([{"step": 1, "loss": 1.0}]) is None
    assert check(_rows(DEMO, key="eval/loss")).flagged  # dpo / kto / reward_model log eval/loss


def test_the_report_flags_it_like_a_monitor():
    flagged = overfitting_table(_rows(DEMO))
    assert "<h3>Overfitting check</h3>" in flagged and "<tr class='warn'><td>held-out loss rising" in flagged
    assert "<td>step 400</td>" in flagged and '<div class="box">held-out loss 0.43 at step 200' in flagged
    quiet = overfitting_table(_rows([0.6, 0.5, 0.45, 0.44, 0.43]))
    assert "<td>no</td>" in quiet and "class='warn'" not in quiet and 'class="box"' not in quiet
    assert "needs 3 (train.eval_every)" in overfitting_table(_rows([0.5]))
    assert overfitting_table([{"step": 1, "loss": 1.0}]) == ""  # no held-out loss: no check


def test_a_report_of_an_overfit_sft_stage_shows_the_flag(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("model: {preset: nano}\n")
    metrics = "".join(json.dumps(r) + "\n" for r in _rows(DEMO))
    _stage(run, "01-sft", "sft", 10.0, {"metrics.jsonl": metrics, "sft.json": {"steps": 500}})
    page = write_report(run).read_text()
    assert (
        "Overfitting check" in page and '<div class="box">held-out loss 0.43 at step 200 -&gt; 0.48' in page
    )


def test_the_console_says_it_at_the_end_of_an_overfitting_run(tokenizer, tmp_path, capsys):
    """A real run that overfits: held-out rows ask the training prompts for other answers, so
    memorizing the training answers raises their loss while the train loss falls."""
    train = [parse_row({"text": f"{a}+{a}={2 * a}"}, "x", i) for i, a in enumerate(range(10, 18))]
    held = [parse_row({"text": f"{a}+{a}={2 * a + 1}"}, "x", i) for i, a in enumerate(range(10, 18))]
    train_seqs, held_seqs = (build_sequences(tokenizer, rows, max_len=16)[0] for rows in (train, held))
    config = TrainConfig(
        max_steps=30, batch_size=8, lr=0.01, schedule="constant", eval_every=5, progress=False
    )
    model = build_preset("nano", tokenizer, seed=0)
    result = train_supervised(
        model,
        train_seqs,
        config,
        tmp_path / "sft",
        objective=NextToken(tokenizer.pad_token_id),
        eval_set=held_seqs,
    )
    assert check(result.history).flagged
    err = capsys.readouterr().err
    assert "warning: sft: held-out loss" in err and "overfitting" in err
    warn(tmp_path / "sft" / "metrics.jsonl", "again")
    assert "warning: again: held-out loss" in capsys.readouterr().err
    warn(tmp_path / "missing.jsonl", "none")  # no metrics: nothing to say
    assert capsys.readouterr().err == ""
