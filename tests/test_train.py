import contextlib
import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fakes import Clock, Progress
from temper.algorithms.losses import IGNORE, sft_loss
from temper.data import build_sequences, parse_row
from temper.data.dataset import Sequence, collate
from temper.models import build_preset
from temper.train import NextToken, TrainConfig, supervised, train_supervised
from temper.train.objective import evaluate_loss
from temper.train.schedule import lr_at
from temper.train.supervised import batch_indices


class Interrupt(Exception):
    pass


def _data(tokenizer, n=64):
    rng = random.Random(0)
    rows = [
        parse_row({"text": f"{a}+{b}={a + b}"}, "x", i)
        for i, (a, b) in enumerate((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n))
    ]
    return build_sequences(tokenizer, rows, max_len=32)[0]


def _config(**kw):
    base = dict(max_steps=6, batch_size=8, lr=3e-3, warmup_steps=2, log_every=1, progress=False, seed=0)
    return TrainConfig(**(base | kw))


def _losses(history):
    return [row["loss"] for row in history]


def test_loss_goes_down(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=0)
    result = train_supervised(
        model, _data(tokenizer), _config(max_steps=20), tmp_path, objective=NextToken(tokenizer.pad_token_id)
    )
    losses = _losses(result.history)
    assert losses[-1] < 0.7 * losses[0]


def test_batches_are_a_function_of_seed_and_step():
    assert batch_indices(3, 10, 4, seed=1) == batch_indices(3, 10, 4, seed=1)
    epoch = batch_indices(0, 10, 5, 1) + batch_indices(1, 10, 5, 1)
    assert sorted(epoch) == list(range(10))  # one epoch covers every example once


def test_gradient_accumulation_does_not_change_the_losses(tokenizer, tmp_path):
    data = _data(tokenizer)
    whole = train_supervised(
        build_preset("nano", tokenizer),
        data,
        _config(),
        tmp_path / "a",
        objective=NextToken(tokenizer.pad_token_id),
    )
    split = train_supervised(
        build_preset("nano", tokenizer),
        data,
        _config(micro_batch_size=2),
        tmp_path / "b",
        objective=NextToken(tokenizer.pad_token_id),
    )
    assert _losses(split.history) == pytest.approx(_losses(whole.history), rel=1e-4)


def test_resume_after_interrupt_reproduces_the_uninterrupted_run(tokenizer, tmp_path):
    data = _data(tokenizer)
    config = _config(save_every=2)
    full = train_supervised(
        build_preset("nano", tokenizer),
        data,
        config,
        tmp_path / "full",
        objective=NextToken(tokenizer.pad_token_id),
    )

    def crash_at_step_5(step, row):
        if step == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_supervised(
            build_preset("nano", tokenizer),
            data,
            config,
            tmp_path / "cut",
            objective=NextToken(tokenizer.pad_token_id),
            callbacks=[crash_at_step_5],
        )
    # a fresh model: everything must come from the checkpoint at step 4
    resumed = train_supervised(
        build_preset("nano", tokenizer, seed=99),
        data,
        config,
        tmp_path / "cut",
        objective=NextToken(tokenizer.pad_token_id),
    )
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4, 5, 6]  # steps 1-4 read back from the log
    assert _losses(resumed.history) == pytest.approx(_losses(full.history), rel=1e-5)
    assert resumed.losses == pytest.approx(_losses(full.history), rel=1e-5)
    logged = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(logged) == 6  # rows past the checkpoint were dropped, then rewritten once


def test_empty_training_set_is_an_error(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="no training sequences"):
        train_supervised(build_preset("nano", tokenizer), [], _config(), tmp_path, objective=NextToken(0))


# ---- exact cases, folded in from test_supervised_exact.py --------------------------------------
# The supervised trainer on numbers computed here: a toy LM whose next-token logits depend only on
# the current token (so padding and micro-batching cannot change them), trained for three steps and
# compared with a plain loop written out below (full-batch cross-entropy, the schedule's lr, two AdamW
# parameter groups, clipping), row by row: loss, lr, grad norm, eval loss, tokens per second (on a fake
# clock), which steps are logged, the progress bar's calls and the data-parallel calls of one process
# of two.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


V = 7


class ToyLM(torch.nn.Module):
    """logits(x_t) = E[x_t] @ W + c: two 2-D parameters (weight-decayed) and one 1-D (not).
    Records every `use_cache` it is called with: training and evaluation must not build a KV cache."""

    def __init__(self, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(torch.randn(V, 3, generator=g))
        self.out = torch.nn.Parameter(torch.randn(3, V, generator=g))
        self.bias = torch.nn.Parameter(torch.randn(V, generator=g))
        self.use_cache: list = []

    def forward(self, input_ids, position_ids=None, use_cache=None):
        self.use_cache.append(use_cache)
        return SimpleNamespace(logits=self.emb[input_ids] @ self.out + self.bias)


def _seq(ids, labels):
    return Sequence(list(ids), list(labels), list(range(len(ids))))


X = IGNORE


TRAIN = [
    _seq([1, 2, 3, 4], [X, 2, 3, 4]),
    _seq([2, 5, 1], [X, X, 1]),
    _seq([3, 3, 6, 2, 1], [X, 3, 6, X, 1]),
    _seq([4, 1], [X, 1]),
    _seq([5, 6, 2], [X, 6, 2]),
    _seq([6, 2, 4, 4, 5, 1], [X, X, 4, 4, 5, 1]),
]


EVAL = [_seq([1, 4, 2], [X, 4, 2]), _seq([2, 6], [X, 6]), _seq([5, 3, 3, 1], [X, X, 3, 1])]


def _ce_sum(model, seqs) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over the supervised labels, and their count, one row at a time."""
    total, n = torch.zeros(()), 0
    for s in seqs:
        logits = model.emb[torch.tensor(s.input_ids)] @ model.out + model.bias
        targets = torch.tensor(s.labels[1:])
        keep = targets != IGNORE
        total = total + F.cross_entropy(logits[:-1][keep], targets[keep], reduction="sum")
        n += int(keep.sum())
    return total, n


def _optimizer(model, config):
    return torch.optim.AdamW(
        [
            {"params": [model.emb, model.out], "weight_decay": config.weight_decay},
            {"params": [model.bias], "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
    )


def _lr(config, step):
    return lr_at(
        step,
        lr=config.lr,
        max_steps=config.max_steps,
        warmup_steps=config.warmup_steps,
        schedule=config.schedule,
        min_lr_ratio=config.min_lr_ratio,
    )


@pytest.fixture
def clock_and_bar(monkeypatch):
    clock, bar = Clock(start=9.5), Progress()
    monkeypatch.setattr(supervised, "time", clock)
    monkeypatch.setattr(supervised, "progress_bar", bar)
    bar.clock = clock
    return bar


def test_batch_indices_cross_an_epoch_with_the_next_seeded_permutation():
    """Step 1 of 3-row batches over 5 examples: the last two of epoch 0's permutation, then the
    first of epoch 1's; each epoch's permutation is seeded seed * 100_003 + epoch."""

    def perm(seed, epoch):
        return torch.randperm(5, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()

    assert batch_indices(1, 5, 3, seed=2) == perm(2, 0)[3:5] + perm(2, 1)[:1]
    assert batch_indices(0, 5, 3, seed=2) == perm(2, 0)[:3]
    assert batch_indices(3, 5, 3, seed=2) == perm(2, 1)[4:] + perm(2, 2)[:2]


def test_three_steps_match_a_plain_full_batch_loop(tmp_path, clock_and_bar):
    config = TrainConfig(
        max_steps=3,
        batch_size=4,
        micro_batch_size=2,
        lr=0.1,
        schedule="cosine",
        warmup_steps=1,
        min_lr_ratio=0.5,
        weight_decay=0.3,
        betas=(0.8, 0.9),
        grad_clip=0.5,
        eval_every=2,
        log_every=2,
        seed=3,
        progress=True,
    )
    model, ref, seen = ToyLM(), ToyLM(), []
    result = train_supervised(
        model, TRAIN, config, tmp_path / "sft", objective=NextToken(0), eval_set=EVAL,
        callbacks=[lambda step, row: seen.append((step, row))],
    )  # fmt: skip

    opt = _optimizer(ref, config)
    expected, losses, tokens, window = [], [], 0, 0
    for step in range(3):
        batch = [TRAIN[i] for i in batch_indices(step, len(TRAIN), 4, 3)]
        for group in opt.param_groups:
            group["lr"] = _lr(config, step)
        total, n = _ce_sum(ref, batch)
        (total / n).backward()
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        losses.append((total / n).item())
        tokens += sum(len(s.input_ids) for s in batch)
        window += sum(len(s.input_ids) for s in batch)
        row = {"step": step + 1, "loss": losses[-1], "lr": _lr(config, step), "grad_norm": norm.item()}
        if step + 1 >= 2:  # eval at step 2 (eval_every) and 3 (the last); logged with it
            with torch.no_grad():
                eval_total, eval_n = _ce_sum(ref, EVAL)
            row["eval_loss"] = eval_total.item() / eval_n
            row["tokens_per_s"] = window / 0.5  # one 0.5 s clock tick between two logged rows
            window = 0
            expected.append(row)

    assert [sorted(r) for r in result.history] == [sorted(r) for r in expected]
    for got, want in zip(result.history, expected):
        assert got == pytest.approx(want, rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    assert [step for step, _ in seen] == [1, 2, 3] and [row for _, row in seen[1:]] == result.history
    assert seen[0][1]["loss"] == pytest.approx(losses[0], rel=1e-5)
    assert result.steps == 3 and result.final_loss == pytest.approx(losses[-1], rel=1e-5)
    assert result.eval_loss == pytest.approx(expected[-1]["eval_loss"], rel=1e-5)
    assert result.tokens == tokens
    assert result.seconds == 2.0  # clock calls: start, window, two logged rows, end
    assert set(model.use_cache) == {False}
    assert clock_and_bar.calls == [
        ("progress_bar", True),
        ("add_task", ("sft",), {"total": 3, "completed": 0, "info": ""}),
        *[("update", ("bar",), {"advance": 1, "info": f"loss {x:.4f}"}) for x in losses],
    ]


class _Twin:
    """Accelerate's interface as process 0 of two. reduce("sum") returns twice the tensor (the other
    process is taken to hold the same value); any other reduction is an error. Records no_sync,
    backward (with the loss it is given) and clip."""

    num_processes, process_index, is_main_process = 2, 0, True
    device = torch.device("cpu")

    def __init__(self):
        self.calls: list = []

    def prepare(self, *objects):
        return objects

    def unwrap_model(self, model):
        return model

    def wait_for_everyone(self):
        pass

    def reduce(self, tensor, reduction="mean"):
        assert reduction == "sum", reduction
        return tensor * 2

    def no_sync(self, model):
        assert isinstance(model, ToyLM)
        self.calls.append("no_sync")
        return contextlib.nullcontext()

    def backward(self, loss):
        self.calls.append(("backward", loss.item()))
        loss.backward()

    def clip_grad_norm_(self, params, max_norm):
        self.calls.append("clip")
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def test_process_zero_of_two_trains_on_its_share_with_the_global_token_count(
    tmp_path, monkeypatch, clock_and_bar
):
    """batch 4 over 2 processes, micro-batches of 1: process 0 takes the first two rows of the global
    batch, syncs gradients on the last micro-batch only, backpropagates world x (micro-batch sum /
    global token count), sums the loss over processes, never clips at grad_clip 0, and scores its own
    share of the eval set. An unnamed output folder shows as "train" on the progress bar."""
    monkeypatch.chdir(tmp_path)
    config = TrainConfig(
        max_steps=3, batch_size=4, micro_batch_size=1, lr=0.05, schedule="constant", warmup_steps=0,
        betas=(0.8, 0.9), grad_clip=0.0, log_every=2, eval_every=1, seed=1, progress=False,
    )  # fmt: skip
    model, ref, twin = ToyLM(), ToyLM(), _Twin()
    result = train_supervised(
        model, TRAIN, config, ".", objective=NextToken(0), accelerator=twin, eval_set=EVAL[:2]
    )

    opt = _optimizer(ref, config)
    calls, losses = [], []
    for step in range(3):
        batch = [TRAIN[i] for i in batch_indices(step, len(TRAIN), 4, 1)]
        n_global = _ce_sum(ref, batch)[1]
        micro_losses = [_ce_sum(ref, [s])[0] / n_global for s in batch[:2]]
        calls += [
            "no_sync",
            ("backward", 2 * micro_losses[0].item()),
            ("backward", 2 * micro_losses[1].item()),
        ]
        (2 * sum(micro_losses)).backward()
        opt.step()
        opt.zero_grad()
        losses.append(2 * sum(micro_losses).item())
    with torch.no_grad():
        eval_total, eval_n = _ce_sum(ref, EVAL[:1])  # process 0's share of 2 eval rows

    assert [c if isinstance(c, str) else c[0] for c in twin.calls] == [
        c if isinstance(c, str) else c[0] for c in calls
    ]
    assert [c[1] for c in twin.calls if c != "no_sync"] == pytest.approx(
        [c[1] for c in calls if c != "no_sync"], rel=1e-5
    )
    assert [r["step"] for r in result.history] == [1, 2, 3]  # every eval step is logged
    assert "grad_norm" not in result.history[0]
    assert [r["loss"] for r in result.history] == pytest.approx(losses, rel=1e-5)
    assert result.eval_loss == pytest.approx(eval_total.item() / eval_n, rel=1e-5)
    assert result.history[-1]["tokens_per_s"] == pytest.approx(
        2 * sum(len(TRAIN[i].input_ids) for i in batch_indices(2, len(TRAIN), 4, 1)[:2]) / 0.5
    )
    local_tokens = [len(TRAIN[i].input_ids) for step in range(3) for i in batch_indices(step, 6, 4, 1)[:2]]
    assert result.tokens == 2 * sum(local_tokens)  # over both processes
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    assert clock_and_bar.calls[:2] == [
        ("progress_bar", False),
        ("add_task", ("train",), {"total": 3, "completed": 0, "info": ""}),
    ]


def test_a_resumed_run_starts_the_bar_at_the_checkpoint_step(tmp_path, clock_and_bar):
    config = TrainConfig(max_steps=3, batch_size=2, lr=0.05, warmup_steps=0, save_every=2, progress=False)
    train_supervised(ToyLM(), TRAIN, config, tmp_path, objective=NextToken(0))
    clock_and_bar.calls.clear()
    resumed = train_supervised(ToyLM(), TRAIN, config, tmp_path, objective=NextToken(0))
    assert [r["step"] for r in resumed.history] == [3]  # the last step is logged (log_every 10)
    assert clock_and_bar.calls[1] == ("add_task", (tmp_path.name,), {"total": 3, "completed": 2, "info": ""})
    assert len(clock_and_bar.calls) == 3  # one step left to run


class _Stop(Exception):
    pass


def test_a_resumed_run_reports_the_whole_run(tmp_path, clock_and_bar):
    """Interrupted after step 3 (its checkpoint: step 2), then resumed: tokens, final and eval loss,
    every step's loss and the logged rows are the uninterrupted run's; the seconds are those of
    the steps before the checkpoint plus the resumed part's."""
    config = TrainConfig(
        max_steps=4, batch_size=2, lr=0.05, warmup_steps=0, save_every=2, log_every=1, progress=False
    )
    full = train_supervised(ToyLM(), TRAIN, config, tmp_path / "full", objective=NextToken(0), eval_set=EVAL)

    def stop_after_3(step, row):
        if step == 3:
            raise _Stop

    with pytest.raises(_Stop):
        train_supervised(
            ToyLM(),
            TRAIN,
            config,
            tmp_path / "cut",
            objective=NextToken(0),
            eval_set=EVAL,
            callbacks=[stop_after_3],
        )
    began = clock_and_bar.clock.now
    resumed = train_supervised(
        ToyLM(seed=9), TRAIN, config, tmp_path / "cut", objective=NextToken(0), eval_set=EVAL
    )
    resumed_part = clock_and_bar.clock.now - began
    assert (resumed.tokens, resumed.steps) == (full.tokens, 4)
    assert resumed.final_loss == full.final_loss and resumed.eval_loss == full.eval_loss
    timing = ("tokens_per_s",)
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed.history] == [
        {k: v for k, v in r.items() if k not in timing} for r in full.history
    ]
    assert resumed.seconds > resumed_part

    # killed after the last checkpoint (in the stage's final save): the rerun trains no step
    began = clock_and_bar.clock.now
    again = train_supervised(
        ToyLM(seed=9), TRAIN, config, tmp_path / "cut", objective=NextToken(0), eval_set=EVAL
    )
    assert (again.tokens, again.final_loss, again.eval_loss) == (full.tokens, full.final_loss, full.eval_loss)
    assert again.history == resumed.history
    assert again.seconds > clock_and_bar.clock.now - began


def test_only_the_main_process_writes_metrics(tmp_path, clock_and_bar):
    twin = _Twin()
    twin.process_index, twin.is_main_process = 1, False
    config = TrainConfig(max_steps=1, batch_size=2, warmup_steps=0, progress=True)
    train_supervised(ToyLM(), TRAIN, config, tmp_path, objective=NextToken(0), accelerator=twin)
    assert not (tmp_path / "metrics.jsonl").exists()
    assert clock_and_bar.calls[0] == ("progress_bar", False)


class _Partner:
    """Process `rank` of two whose reduce("sum") adds the other process's (loss x tokens, tokens)."""

    num_processes = 2

    def __init__(self, rank, other):
        self.process_index, self.other = rank, other

    def reduce(self, tensor, reduction="mean"):
        assert reduction == "sum", reduction
        return tensor + self.other


def _chunk(model, chunk) -> tuple[float, int]:
    """One evaluation chunk as the trainer scores it: its mean loss (a float32 number) and token count."""
    batch = collate(chunk, 0)
    labels = batch.pop("labels")
    n = int((labels[:, 1:] != IGNORE).sum())
    with torch.no_grad():
        return sft_loss(model(**batch).logits, labels, n).item(), n


def test_evaluate_loss_is_the_token_weighted_mean_over_both_processes_in_float64():
    """Rows 0-1 are process 0's share of 3, row 2 process 1's; process 1 scores its share in chunks
    of 1 and adds process 0's sums: the token-weighted mean over all rows. The sums are float64:
    they equal Python's double arithmetic on the chunks' float32 losses to the last bit."""
    model = ToyLM(seed=4)
    with torch.no_grad():
        total0, n0 = _ce_sum(model, EVAL[:2])
        total, n = _ce_sum(model, EVAL)
    other = torch.tensor([total0.item(), n0], dtype=torch.float64)
    got = evaluate_loss(model, EVAL, 0, 1, "cpu", _Partner(1, other))
    assert got == pytest.approx(total.item() / n, rel=1e-6)
    loss2, n2 = _chunk(model, EVAL[2:])
    assert got == (total0.item() + loss2 * n2) / (n0 + n2)
    assert model.training  # put back in training mode
    # one process (no accelerator): chunks of 2, every row, no reduction
    chunks = [_chunk(model, EVAL[0:2]), _chunk(model, EVAL[2:])]
    model.use_cache.clear()
    assert evaluate_loss(model.eval(), EVAL, 0, 2, "cpu") == (
        chunks[0][0] * chunks[0][1] + chunks[1][0] * chunks[1][1]
    ) / (chunks[0][1] + chunks[1][1])
    assert model.use_cache == [False, False] and not model.training


def test_evaluate_loss_with_one_supervised_token_divides_by_one():
    model = ToyLM(seed=5)
    one = [_seq([3, 5], [X, 5])]
    with torch.no_grad():
        total, n = _ce_sum(model, one)
    assert n == 1 and evaluate_loss(model, one, 0, 4, "cpu") == pytest.approx(total.item(), rel=1e-6)


def test_impossible_batch_splits_are_refused_with_their_numbers(tmp_path):
    with pytest.raises(ValueError, match=r"^no training sequences \(every example was empty or dropped\)$"):
        train_supervised(ToyLM(), [], TrainConfig(progress=False), tmp_path, objective=NextToken(0))
    with pytest.raises(ValueError, match=r"^batch_size 3 is not divisible by 2 processes$"):
        train_supervised(ToyLM(), TRAIN, TrainConfig(batch_size=3, progress=False), tmp_path, objective=NextToken(0),
                         accelerator=_Twin())  # fmt: skip
    with pytest.raises(ValueError, match=r"^per-process batch 4 is not divisible by micro_batch_size 3$"):
        train_supervised(ToyLM(), TRAIN, TrainConfig(batch_size=4, micro_batch_size=3, progress=False),
                         tmp_path, objective=NextToken(0))  # fmt: skip
