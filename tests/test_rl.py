"""The RL loop at the level users see it: the reward rises on a learnable task; dynamic sampling,
the probe's causes, the format gate and resume behave as documented."""

import json
import math

import pytest
import torch

from fakes import Clock, FirstByteTask, PatternSampler, Progress, YesTask
from temper.data.chat import prompt_ids
from temper.models import build_preset
from temper.rewards.diagnostics import CAUSES, breakdown, zero_variance_cause
from temper.rewards.monitors import MonitorConfig
from temper.rollout import HFSampler
from temper.rollout.sampler import Sample, derive_seed
from temper.tasks.base import Problem, Score
from temper.train import rl, rl_metrics
from temper.train.checkpoint import list_checkpoints
from temper.train.features import Features
from temper.train.features.dynamic_sampling import DynamicSampling, Refill
from temper.train.rl import (
    RLConfig,
    collect_groups,
    problems_for_step,
    rollout_metrics,
    sample_share,
    train_rl,
)
from temper.train.rollouts import Group, Rollout, one_step
from temper.train.schedule import lr_at


def _config(**kw):
    base = dict(steps=12, prompts_per_step=4, group_size=8, max_new_tokens=2, lr=3e-3, seed=0, progress=False)
    return RLConfig(**(base | kw))


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_reward_rises_on_a_learnable_task(tokenizer, tmp_path, advantage):
    torch.manual_seed(0)
    model = build_preset("nano", tokenizer, seed=1)
    result = train_rl(model, tokenizer, [FirstByteTask()], _config(advantage=advantage, lr=1e-2), tmp_path)
    rewards = [row["reward"] for row in result.history]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.25, rewards


def test_kl_to_reference_and_metrics_are_logged(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=1).requires_grad_(False)
    result = train_rl(
        model, tokenizer, [FirstByteTask()], _config(steps=3, kl_coef=0.1), tmp_path, reference=reference
    )
    first, last = result.history[0], result.history[-1]
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-5)  # identical weights before the first update
    assert last["kl_ref"] > 0
    for key in (
        "reward",
        "reward/outcome",
        "accuracy",
        "zero_variance",
        "entropy",
        "clip_frac",
        "response_length",
        "rollout_tokens_per_s",
        "train_tokens_per_s",
        "time/sample",
        "time/train",
        "kl",
    ):
        assert key in last, key
    assert (tmp_path / "rollouts.jsonl").read_text().count("\n") == 3 * 2 * 8


def test_dynamic_sampling_never_keeps_a_constant_reward_group(tokenizer):
    model = build_preset("nano", tokenizer, seed=1)
    sampler = HFSampler(model, tokenizer)
    config = _config(group_size=3, prompts_per_step=6)
    groups, stats = collect_groups(
        sampler, tokenizer, [FirstByteTask()], config, step=0, features=Features([Refill(6)])
    )
    assert stats["zero_variance"] > 0  # with 3 samples some groups are constant...
    assert groups and all(len(set(g.rewards)) > 1 for g in groups)  # ...and none of them is kept
    assert len(groups) <= 6 and stats["sampling_rounds"] >= 2


def _score(correct, parsed=True, reason=None):
    return Score(float(correct), correct, parsed, {"reason": reason or ("correct" if correct else "wrong")})


def test_probe_attributes_zero_variance_causes():
    assert zero_variance_cause([_score(True), _score(False)], [1.0, 0.0], [False, False]) is None
    assert zero_variance_cause([_score(True)] * 3, [1.0] * 3, [False] * 3) == "all_correct"
    assert zero_variance_cause([_score(False)] * 3, [0.0] * 3, [False] * 3) == "all_wrong"
    assert zero_variance_cause([_score(False, False)] * 3, [0.0] * 3, [False] * 3) == "parse_failure"
    assert zero_variance_cause([_score(False, False)] * 3, [0.0] * 3, [True] * 3) == "truncated"
    verifier = [_score(False), _score(False, reason="verifier_error")]
    assert zero_variance_cause(verifier, [0.0, 0.0], [False, False]) == "verifier_error"
    shares = breakdown([None, "all_wrong", "all_wrong", "parse_failure"])
    assert shares["zero_variance"] == 0.75
    assert shares["zero_variance/all_wrong"] == 0.5 and shares["zero_variance/parse_failure"] == 0.25
    assert shares["zero_variance/all_correct"] == 0.0


def test_resume_reproduces_the_uninterrupted_run(tokenizer, tmp_path, monkeypatch):
    import temper.train.rl as rl

    clock = Clock()
    monkeypatch.setattr(rl, "time", clock)
    config = _config(steps=4, save_every=2)
    full = train_rl(
        build_preset("nano", tokenizer, seed=1), tokenizer, [FirstByteTask()], config, tmp_path / "a"
    )

    class Stop(Exception):
        pass

    def crash(step, row):
        if step == 3:
            raise Stop

    with pytest.raises(Stop):
        train_rl(
            build_preset("nano", tokenizer, seed=1),
            tokenizer,
            [FirstByteTask()],
            config,
            tmp_path / "b",
            callbacks=[crash],
        )
    began = clock.now
    resumed = train_rl(
        build_preset("nano", tokenizer, seed=5), tokenizer, [FirstByteTask()], config, tmp_path / "b"
    )
    # the summary covers the whole run: the rows and tokens before the resume too
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]
    assert (resumed.sampled_tokens, resumed.trained_tokens) == (full.sampled_tokens, full.trained_tokens)
    assert resumed.seconds > clock.now - began
    for a, b in zip(full.history[2:], resumed.history[2:]):
        # the on-policy loss is ~0 (advantages sum to zero per group): compare it absolutely, and the
        # update through its gradient norm and the policy's entropy
        assert a["reward"] == b["reward"] and a["loss/policy"] == pytest.approx(b["loss/policy"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-5)
    # rerun after the last checkpoint (a kill in the stage's final save): no step, the same summary
    began = clock.now
    again = train_rl(
        build_preset("nano", tokenizer, seed=5), tokenizer, [FirstByteTask()], config, tmp_path / "b"
    )
    assert again.history == resumed.history and again.seconds > clock.now - began
    assert (again.sampled_tokens, again.trained_tokens) == (full.sampled_tokens, full.trained_tokens)


def test_rollout_batch_masks_only_completion_tokens(tokenizer):
    from temper.rollout.sampler import Sample
    from temper.train.rollouts import Group, Rollout, one_step, to_batch

    def rollout(prompt, completion, logprobs, reward):
        score = Score(reward, reward == 1.0, True)
        sample = Sample(prompt, completion, logprobs, "", "eos")
        return Rollout(Problem("t", "train", "x", "q"), one_step(sample, score), score, reward, {})

    group = Group(
        [rollout([5, 6, 7], [8, 9], [-0.5, -0.25], 1.0), rollout([5], [1, 2, 3], [-1.0, -2.0, -3.0], 0.0)],
        None,
        [1.0, 0.0],
    )
    batch = to_batch([group])
    assert batch.prompts == [[5, 6, 7], [5]]
    assert batch.completions_R_T.tolist() == [[8, 9, 0], [1, 2, 3]]
    assert batch.mask_R_T.tolist() == [[True, True, False], [True, True, True]]
    assert batch.old_logprobs_R_T.tolist() == [[-0.5, -0.25, 0], [-1.0, -2.0, -3.0]]
    assert batch.rewards_G_N.tolist() == [[1.0, 0.0]]


def test_format_gate_stops_a_policy_that_cannot_answer(tokenizer):
    from temper.catalog import make_task
    from temper.stages.rl import GateError, GateSpec, format_gate

    model = build_preset("nano", tokenizer, seed=1)  # untrained: never writes "Answer: ..."
    sampler = HFSampler(model, tokenizer)
    tasks = {"arithmetic": make_task("arithmetic")}
    with pytest.raises(GateError, match="parse rate below 50%.*arithmetic 0%.*SFT is not done"):
        format_gate(GateSpec(min_parse_rate=0.5, n_problems=8), sampler, tokenizer, tasks, max_new_tokens=8)
    warned = format_gate(
        GateSpec(min_parse_rate=0.5, n_problems=8, on_fail="warn"), sampler, tokenizer, tasks, 8
    )
    assert warned["passed"] is False and warned["parse_rates"] == {"arithmetic/parse_rate": 0.0}
    passing = format_gate(GateSpec(min_parse_rate=0.0, n_problems=8), sampler, tokenizer, tasks, 8)
    assert passing["passed"] is True


def test_lora_rl_stage_uses_the_adapter_disabled_base_as_reference(tokenizer, tmp_path):
    from temper.models import load_model, save_model
    from temper.stages.context import StageContext
    from temper.stages.rl import RLStage, run_rl

    base = build_preset("nano", tokenizer, seed=1)
    save_model(base, tokenizer, tmp_path / "base")
    stage = RLStage(
        kind="rl",
        tasks=["first_byte"],
        lora={"r": 4, "alpha": 8},
        probe_groups=4,
        train=_config(steps=3, kl_coef=0.1, lr=1e-2),
    )
    ctx = StageContext(
        run_dir=tmp_path, base_dir=tmp_path, tasks={"first_byte": FirstByteTask()}, task_options={}
    )
    out = tmp_path / "rl"
    out.mkdir()
    merged = run_rl(stage, ctx, tmp_path / "base", out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # adapter B starts at zero: policy == reference
    assert rows[-1]["kl"] > 0 and rows[-1]["kl_ref"] != 0  # k3 (the loss term) is >= 0; k1 may be either sign
    trained = load_model(merged)  # adapter merged into plain weights
    assert not any("lora" in n for n, _ in trained.named_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(trained.parameters(), base.parameters()))
    probe = json.loads((out / "probe.json").read_text())["probe"]
    assert probe["groups"] == 4 and 0 <= probe["zero_variance"] <= 1


# ---- exact cases, folded in from test_rl_loop_exact.py -----------------------------------------
# The RL loop's bookkeeping on numbers computed here: which problems a step draws, what the
# sampler is asked for (prompts, seeds, settings) in each dynamic-sampling round, which groups are
# kept, the step's metrics (sampling stats, rollout means, process means), and `train_rl`'s row, timing,
# token counts, progress bar, evaluation, rollout records and checkpoints on a scripted sampler.
#
# A scripted sampler stands in for generation: each call it is given one pattern per prompt (True: the
# group's rewards differ), so the test knows which groups dynamic sampling keeps. A toy task grades
# "yes" right and anything else wrong.
#
# Written against the survivors of a mutmut run (TESTING.md): each test here failed with a mutant applied.


def _problems(task, n, seed, step, stream):
    return task.sample("train", n, derive_seed(seed, step, stream, 0))


def _ids(groups):
    return [g.rollouts[0].problem.id for g in groups]


# ---- problems_for_step -----------------------------------------------------------------------------


def test_problems_for_step_splits_n_over_tasks_each_with_its_own_seed():
    a, b = YesTask("a"), YesTask("b")
    got = problems_for_step([a, b], 5, seed=3, step=7, stream=2)
    want = [(a, p) for p in a.sample("train", 3, derive_seed(3, 7, 2, 0))]
    want += [(b, p) for p in b.sample("train", 2, derive_seed(3, 7, 2, 1))]
    assert [(t.name, p.id) for t, p in got] == [(t.name, p.id) for t, p in want]
    default = problems_for_step([a], 2, seed=3, step=7)  # stream 0: the step's own batch
    assert [p.id for _, p in default] == [p.id for p in a.sample("train", 2, derive_seed(3, 7, 0, 0))]


# ---- sample_share ----------------------------------------------------------------------------------


def _loop_config(**kw):
    base = dict(prompts_per_step=4, group_size=2, max_new_tokens=5, temperature=0.7, top_p=0.9, seed=11,
                rewards={"outcome": 1.0, "overlong": 0.5}, overlong_buffer=2)  # fmt: skip
    return RLConfig(**(base | kw))


def test_dynamic_sampling_refills_a_share_round_by_round(tokenizer):
    """Process 1 of 2, 4 prompts a step: round 0 samples global prompts 2 and 3 with their global
    seeds and keeps one group (keep rate 1/2); round 1 (stream 1 x 2 + 1 = 3) draws ceil(1 / 0.5) = 2
    and keeps none; round 2 (stream 5) draws ceil(1 / 0.25) = 4 and keeps two; two are returned.
    4-token completions with max_new_tokens 5 and an overlong buffer of 2 cost 0.5 x 0.5."""
    task, config = YesTask(), _loop_config()
    sampler = PatternSampler([[False, True], [False, False], [False, True, True, False]])
    kept, causes, rounds, failed = sample_share(
        sampler, tokenizer, [task], config, step=2, rank=1, world=2, features=Features([Refill(3)])
    )

    rounds_drawn = [
        (_problems(task, 4, 11, 2, 0)[2:4], [derive_seed(11, 2, 0, i) for i in (2, 3)]),
        (_problems(task, 2, 11, 2, 3), [derive_seed(11, 2, 3, i) for i in range(2)]),
        (_problems(task, 4, 11, 2, 5), [derive_seed(11, 2, 5, i) for i in range(4)]),
    ]
    assert sampler.calls == [
        {"prompts": [prompt_ids(tokenizer, p.messages()) for p in problems], "n": 2, "max_new_tokens": 5,
         "temperature": 0.7, "top_p": 0.9, "seed": seeds}
        for problems, seeds in rounds_drawn
    ]  # fmt: skip
    assert _ids(kept) == [rounds_drawn[0][0][1].id, rounds_drawn[2][0][1].id]
    assert causes == ["all_wrong", None] and rounds == 3 and failed == []  # causes of the first round only
    assert kept[0].rewards == [0.75, -0.25]  # 1 - 0.25 and 0 - 0.25


def test_dynamic_sampling_stops_after_max_rounds(tokenizer):
    """Nothing kept in round 0 (keep rate 0): round 1 draws min(4 x 2, ceil(2 / 0.25)) = 8; then the
    round limit (2) ends the step with no group."""
    task, config = YesTask(), _loop_config(prompts_per_step=2)
    sampler = PatternSampler([[False, False], [False] * 8])
    kept, causes, rounds, failed = sample_share(
        sampler, tokenizer, [task], config, step=0, features=Features([Refill(2)])
    )
    assert [len(c["prompts"]) for c in sampler.calls] == [2, 8]
    assert kept == [] and causes == ["all_wrong", "all_wrong"] and rounds == 2 and failed == []


def test_without_dynamic_sampling_every_group_is_kept_in_one_round(tokenizer):
    task, config = YesTask(), _loop_config(prompts_per_step=2)
    sampler = PatternSampler([[False, True]])
    kept, stats = collect_groups(sampler, tokenizer, [task], config, step=1)
    assert len(sampler.calls) == 1 and len(kept) == 2
    assert stats == {
        "zero_variance": 0.5,
        **{f"zero_variance/{c}": 0.5 if c == "all_wrong" else 0.0 for c in CAUSES},
        "sampling_rounds": 1,
    }
    sampler = PatternSampler([[False, True], [True, False]])  # round 1 draws ceil(1 / 0.5) = 2
    kept, stats = collect_groups(
        sampler, tokenizer, [task], _loop_config(prompts_per_step=2), 1, features=Features([Refill(4)])
    )
    assert stats["kept_groups"] == 2 == len(kept) and stats["sampling_rounds"] == 2


# ---- step metrics ----------------------------------------------------------------------------------


def _rollout(reward, correct, parsed, length, stop, parts, details):
    problem = Problem("toy", "train", "p", "q")
    sample, score = (
        Sample([1], [3] * length, [-1.0] * length, "x", stop),
        Score(reward, correct, parsed, details),
    )
    return Rollout(problem, one_step(sample, score), score, reward, parts)


def test_rollout_metrics_are_means_over_every_sample():
    groups = [
        Group([
            _rollout(1.0, True, True, 3, "eos", {"outcome": 1.0, "format": 1.0}, {"rewards": {"f": 0.5, "g": None}}),
            _rollout(0.0, False, True, 5, "length", {"outcome": 0.0, "format": 1.0}, {"rewards": {"f": 1.0, "g": 2.0}}),
        ]),
        Group([_rollout(0.5, False, False, 2, "stop", {"outcome": 0.5, "format": 0.0}, {})]),
    ]  # fmt: skip
    row = rollout_metrics(groups, RLConfig(rewards={"outcome": 1.0, "format": 0.5}), seconds=0.5)
    assert row == pytest.approx(
        {
            "reward": 0.5,
            "accuracy": 1 / 3,
            "parse_rate": 2 / 3,
            "truncation_rate": 1 / 3,
            "response_length": 10 / 3,
            "rollout_tokens_per_s": 20.0,
            "time/sample": 0.5,
            "reward/outcome": 0.5,
            "reward/format": 2 / 3,
            "reward_fn/f": 0.75,  # the samples each function graded (None: not applicable)
            "reward_fn/g": 2.0,
        },
        rel=1e-12,
    )
    assert set(row) == {"reward", "accuracy", "parse_rate", "truncation_rate", "response_length",
                        "rollout_tokens_per_s", "time/sample", "reward/outcome", "reward/format",
                        "reward_fn/f", "reward_fn/g"}  # fmt: skip


class _Partner:
    """Process 0 of `world`; reduce("sum") adds the other processes' values, in sorted key order."""

    def __init__(self, world, other=None):
        self.num_processes, self.other, self.reduced = world, other, []

    def reduce(self, tensor, reduction="mean"):
        assert reduction == "sum" and tensor.dtype == torch.float64
        self.reduced.append(tensor.tolist())
        return tensor + torch.tensor(self.other, dtype=torch.float64)


def test_process_means_divide_by_world_except_kl_sums():
    values = {"loss": 0.1 + 1e-12, "kl_ref/tokens": 4.0, "kl_ref/sum": 3.0, "entropy": 2.0}
    one = _Partner(1)
    assert rl_metrics._mean_over_processes(dict(values), one) == values and one.reduced == []
    # sorted keys: entropy, kl_ref/sum, kl_ref/tokens, loss
    two = _Partner(2, other=[4.0, 1.0, 6.0, 0.3])
    assert rl_metrics._mean_over_processes(dict(values), two) == {
        "entropy": 3.0,
        "kl_ref/sum": 4.0,
        "kl_ref/tokens": 10.0,
        "loss": (0.1 + 1e-12 + 0.3) / 2,
    }
    assert two.reduced == [[2.0, 3.0, 4.0, 0.1 + 1e-12]]


# ---- train_rl --------------------------------------------------------------------------------------


class _Precision:
    """resolve_precision's stand-in: records what it was asked and which modules each `applied` wraps."""

    def __init__(self):
        self.resolved, self.wrapped = [], []

    def __call__(self, precision, model, mode="train", **kw):
        self.resolved.append((precision, mode))
        return self

    def applied(self, *modules):
        self.wrapped.append(modules)
        return _NullCtx()

    def as_dict(self):
        return {"fake": True}


class _NullCtx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def harness(monkeypatch):
    clock, bar, precision, adamw = Clock(start=9.5), Progress(), _Precision(), []
    monkeypatch.setattr(rl, "time", clock)
    monkeypatch.setattr(rl, "progress_bar", bar)
    monkeypatch.setattr(rl, "resolve_precision", precision)
    real = torch.optim.AdamW

    class AdamW(real):
        def __init__(self, params, **kw):
            adamw.append(kw)
            super().__init__(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    return bar, precision, adamw


def _rl_config(**kw):
    base = dict(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=4, lr=1e-3, warmup_steps=1,
                schedule="cosine", weight_decay=0.01, kl_coef=0.1,
                dynamic_sampling=DynamicSampling(max_rounds=1), eval_every=3, save_every=3, log_rollouts=1, seed=5, progress=True,
                epochs=2, monitors=MonitorConfig(enabled=False))  # fmt: skip
    return RLConfig(**(base | kw))  # (the monitors' rows are test_monitors.py's)


def _zero_variance(all_wrong: float) -> dict[str, float]:
    return {"zero_variance": all_wrong} | {
        f"zero_variance/{c}": all_wrong if c == "all_wrong" else 0.0 for c in CAUSES
    }


def test_train_rl_rows_tokens_timing_and_side_effects(tokenizer, tmp_path, harness, capsys, monkeypatch):
    """Step 1 keeps both groups, step 2 none (dynamic sampling, one round), step 3 one. Completions
    of 2 and 3 tokens; a 0.5 s clock tick between every two readings of the clock."""
    bar, precision, adamw = harness
    model, reference = build_preset("nano", tokenizer, seed=0), build_preset("nano", tokenizer, seed=1)
    sampler = PatternSampler([[True, True], [False, False], [False, True]], lengths=[2, 3])
    config, out = _rl_config(), tmp_path / "runs" / "run"
    evals, seen = [], []

    def evaluate(step):
        evals.append(step)
        return {"acc": step / 10}

    updates = []  # what the update returned, step by step: the row holds the means of its lists
    real_update = rl.update
    monkeypatch.setattr(rl, "update", lambda *a, **kw: updates.append(real_update(*a, **kw)) or updates[-1])
    result = train_rl(model, tokenizer, [YesTask()], config, out, sampler=sampler, reference=reference,
                      evaluate=evaluate, callbacks=[lambda step, row: seen.append((step, row))])  # fmt: skip

    rollout_means = {
        "reward": 0.5, "accuracy": 0.5, "parse_rate": 1.0, "truncation_rate": 0.0, "response_length": 2.5,
        "time/sample": 0.5, "reward/outcome": 0.5,
    }  # fmt: skip
    first, empty, last = result.history
    assert empty == {
        "step": 2,
        **_zero_variance(1.0),
        "sampling_rounds": 1,
        "kept_groups": 0,
    }
    assert first | last == first | last | rollout_means  # every mean as computed by hand
    assert first["rollout_tokens_per_s"] == 20.0 and last["rollout_tokens_per_s"] == 10.0
    assert {k: first[k] for k in _zero_variance(0)} == _zero_variance(0.0) and first["kept_groups"] == 2
    assert {k: last[k] for k in _zero_variance(0)} == _zero_variance(0.5) and last["kept_groups"] == 1
    assert first["sampling_rounds"] == last["sampling_rounds"] == 1 and "eval/acc" not in first
    assert last["eval/acc"] == 0.3 and evals == [3]  # every eval_every (3) steps, and the last
    for row, step in ((first, 0), (last, 2)):
        lr = lr_at(step, lr=1e-3, max_steps=3, warmup_steps=1, schedule="cosine")
        assert row["lr"] == lr and row["time/prepare"] == 0.5 and row["time/train"] == 0.5
        assert math.isfinite(row["kl_ref"]) and row["kl_ref"] != 0 and "kl_ref/sum" not in row
        assert "kl_ref/tokens" not in row and math.isfinite(row["loss"])
    for row, (stats, _) in zip((first, last), updates, strict=True):
        assert len(stats["loss"]) == 2  # two epochs
        assert {k: row[k] for k in stats} == {k: sum(v) / len(v) for k, v in stats.items()}
    # tokens read by the update: prompt (6) + completion (2 or 3) - 1 = 7 or 8 per sequence, packed
    # into rows of the longest (8) that fit one each: 4 x 8 in step 1, 2 x 8 in step 3; read twice (2 epochs)
    assert {len(c) for call in sampler.calls for c in call["prompts"]} == {6}
    assert last["lr"] == pytest.approx(1e-4)  # cosine's end: the default floor, 0.1 x lr
    assert first["train_tokens_per_s"] == 64 / 0.5 and last["train_tokens_per_s"] == 32 / 0.5
    assert result.sampled_tokens == 15 and result.trained_tokens == 96
    # 13 readings 0.5 s apart: the start, t0 t1 per step and t2 t3 when it trains, the checkpoint (step 3), the end
    assert result.steps == 3 and result.seconds == 6.0 and result.precision == {"fake": True}
    assert seen == [(1, first), (2, empty), (3, last)]
    assert "rl: step 2 kept no group with a learning signal" in capsys.readouterr().err

    assert [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] == result.history
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    kept_first = _problems(YesTask(), 2, 5, 0, 0)[0].id
    kept_last = _problems(YesTask(), 2, 5, 2, 0)[1].id
    assert [(r["step"], r["problem"]) for r in records] == [(1, kept_first)] * 2 + [(3, kept_last)] * 2
    # shown with the tokenizer: the decoded token ids, and the graded text beside them
    assert [r["graded"] for r in records] == ["yes", "no", "yes", "no"]
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step-0000003"]
    assert bar.calls == [
        ("progress_bar", True),
        ("add_task", ("run",), {"total": 3, "completed": 0, "info": ""}),
        ("update", ("bar",), {"advance": 1, "info": "reward 0.500 acc 0.500"}),
        ("update", ("bar",), {"advance": 1, "info": "reward nan acc nan"}),
        ("update", ("bar",), {"advance": 1, "info": "reward 0.500 acc 0.500"}),
    ]
    assert precision.resolved == [("fp32", "train")]
    assert precision.wrapped == [(model, reference), (model,)] * 2
    assert adamw == [{"lr": 1e-3, "weight_decay": 0.01, "betas": (0.9, 0.99)}]
    assert sampler.synced == 2 and not model.training


class _Twin:
    """Accelerate's interface as process 0 of two whose twin holds the same values: reduce("sum")
    doubles, "mean" keeps."""

    num_processes, process_index, is_main_process = 2, 0, True
    device = torch.device("cpu")

    def prepare(self, *objects):
        return objects

    def wait_for_everyone(self):
        pass

    def reduce(self, tensor, reduction="mean"):
        return tensor * 2 if reduction == "sum" else tensor

    def __init__(self, rank=0):
        self.process_index, self.is_main_process, self.backwards = rank, rank == 0, 0

    def backward(self, loss):
        self.backwards += 1
        loss.backward()

    def no_sync(self, module):
        raise AssertionError("one micro-batch: nothing to accumulate without sync")

    def clip_grad_norm_(self, params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def test_process_zero_of_two_samples_its_share_and_counts_both_processes_tokens(
    tokenizer, tmp_path, harness, monkeypatch
):
    """2 prompts a step over 2 processes: process 0 samples global prompt 0 with its global seed,
    builds its own sampler at the sampling precision, sums the trained tokens over processes (its
    twin read as many) and shows an unnamed output folder as "rl"."""
    bar, precision, _ = harness
    monkeypatch.chdir(tmp_path)
    sampler, built = PatternSampler([[True]], lengths=[2, 3]), []
    monkeypatch.setattr(rl, "HFSampler", lambda *args, **kw: built.append((args, kw)) or sampler)
    model = build_preset("nano", tokenizer, seed=0)
    config = _rl_config(steps=1, kl_coef=0.0, eval_every=0, save_every=0, progress=False)
    twin = _Twin()
    result = train_rl(model, tokenizer, [YesTask()], config, ".", accelerator=twin)
    assert twin.backwards == 2  # the update's backward goes through the accelerator (2 epochs)

    assert built == [((model, tokenizer), {"precision": precision})]
    assert precision.resolved == [("fp32", "sample"), ("fp32", "train")]
    assert precision.wrapped == [(model, None), (model,)]
    assert sampler.calls[0]["seed"] == [derive_seed(5, 0, 0, 0)] and len(sampler.calls) == 1
    # 2 sequences packed into 2 rows of 8, read in 2 epochs, on each process
    assert result.trained_tokens == 2 * 2 * 16
    assert result.history[0]["train_tokens_per_s"] == 2 * 2 * 16 / 0.5
    assert result.sampled_tokens == 5
    assert bar.calls[:2] == [
        ("progress_bar", False),
        ("add_task", ("rl",), {"total": 1, "completed": 0, "info": ""}),
    ]


def test_settings_that_cannot_run_are_refused_with_their_numbers(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=0)
    with pytest.raises(ValueError, match=r"^kl_coef > 0 needs a reference model$"):
        train_rl(model, tokenizer, [YesTask()], RLConfig(kl_coef=0.5, progress=False), tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()  # made with its parents before the settings are checked
    with pytest.raises(ValueError, match=r"^prompts_per_step 3 is not divisible by 2 processes$"):
        train_rl(model, tokenizer, [YesTask()], RLConfig(prompts_per_step=3, progress=False), tmp_path,
                 accelerator=_Twin())  # fmt: skip


def test_only_the_main_process_writes_metrics_and_rollouts(tokenizer, tmp_path, harness):
    """Process 1 of 2 writes nothing; it evaluates every eval_every (2) steps and at the last (3)."""
    (tmp_path / "out").mkdir()
    config = _rl_config(steps=3, prompts_per_step=2, kl_coef=0.0, eval_every=2, save_every=0, progress=True,
                        epochs=1)  # fmt: skip
    model, evals = build_preset("nano", tokenizer, seed=0), []
    train_rl(model, tokenizer, [YesTask()], config, tmp_path / "out", sampler=PatternSampler([[True]] * 3),
             accelerator=_Twin(1), evaluate=lambda step: evals.append(step) or {})  # fmt: skip
    assert list((tmp_path / "out").iterdir()) == []
    assert evals == [2, 3]
    assert harness[0].calls[0] == ("progress_bar", False)
