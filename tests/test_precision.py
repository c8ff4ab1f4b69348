"""Precision: bf16 autocast trains and samples like fp32 within bf16's rounding, `auto` is fp32
untimed on a CPU without AMX and otherwise measures once per (machine, model) and reuses its
verdict whatever the load, a run keeps the choice it recorded, and a forced choice is obeyed.
No test depends on this machine's CPU: its flags are set by the tests that need them."""

import json
import random

import pytest
import torch

from fakes import FirstByteTask  # tests/ is on the path (pytest rootdir mode)
from temper import precision as prec
from temper.data import build_sequences, parse_row
from temper.models import build_preset
from temper.precision import FP32, PrecisionChoice, resolve_precision
from temper.rollout import HFSampler
from temper.train import NextToken, TrainConfig, train_supervised
from temper.train.rl import RLConfig, train_rl

BF16 = PrecisionChoice("bf16", "bf16")


@pytest.fixture
def amx(monkeypatch):
    """This machine as a CPU with AMX, the one kind on which `auto` measures."""
    with_amx = prec.machine() | {"flags": ["amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2"]}
    monkeypatch.setattr(prec, "machine", lambda: with_amx)


def _data(tokenizer, n=32):
    rng = random.Random(0)
    rows = [
        parse_row({"text": f"{a}+{b}={a + b}"}, "x", i)
        for i, (a, b) in enumerate((rng.randint(0, 99), rng.randint(0, 99)) for _ in range(n))
    ]
    return build_sequences(tokenizer, rows, max_len=32)[0]


def _train(tokenizer, tmp_path, precision):
    model = build_preset("tiny", tokenizer, seed=0)
    config = TrainConfig(
        max_steps=4, batch_size=8, lr=3e-3, warmup_steps=1, log_every=1, progress=False, precision=precision
    )
    return train_supervised(
        model, _data(tokenizer), config, tmp_path / precision, objective=NextToken(tokenizer.pad_token_id)
    )


def test_bf16_training_stays_within_bf16_rounding_of_fp32(tokenizer, tmp_path):
    fp32, bf16 = _train(tokenizer, tmp_path, "fp32"), _train(tokenizer, tmp_path, "bf16")
    assert (fp32.precision["dtype"], bf16.precision["dtype"]) == ("fp32", "bf16")
    a, b = torch.tensor([r["loss"] for r in fp32.history]), torch.tensor([r["loss"] for r in bf16.history])
    assert (a - b).abs().max() > 0  # bf16 really ran (identical losses would mean fp32 twice)
    # measured: at most 5e-4 relative over 4 steps; bf16 keeps 8 bits of mantissa (4e-3 per op)
    torch.testing.assert_close(b, a, rtol=1e-2, atol=0)
    assert b[-1] < 0.8 * b[0]  # and it learns


def test_applied_runs_matmuls_in_bf16_and_hands_back_fp32(tokenizer):
    model = build_preset("nano", tokenizer, seed=0)
    seen = []
    hook = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    ids = torch.tensor([[1, 2, 3, 4]])
    with BF16.applied(model, None):
        out = model(input_ids=ids, output_hidden_states=True)
    assert seen == [torch.bfloat16]
    assert out.logits.dtype == torch.float32 and {h.dtype for h in out.hidden_states} == {torch.float32}
    assert "forward" not in model.__dict__  # the patch is gone
    model(input_ids=ids)
    with FP32.applied(model):
        model(input_ids=ids)
    hook.remove()
    assert seen == [torch.bfloat16, torch.float32, torch.float32]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def _prompts(tokenizer):
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in ["hi", "What is 12 + 345?", "2+2="]
    ]


def test_bf16_sampler_logprobs_match_teacher_forcing(tokenizer):
    model = build_preset("nano", tokenizer, seed=0)
    sampler = HFSampler(model, tokenizer, precision=BF16)
    out = sampler.sample(_prompts(tokenizer), 3, max_new_tokens=10, temperature=0.7, seed=1)
    gaps_fp32, gaps_bf16 = [], []
    for s in (s for row in out for s in row):
        ids = torch.tensor([s.prompt_ids + s.token_ids])
        targets = torch.tensor(s.token_ids)[:, None]
        with torch.no_grad():
            for gaps, choice in ((gaps_fp32, FP32), (gaps_bf16, BF16)):
                with choice.applied(model):
                    logits = model(ids).logits[0, len(s.prompt_ids) - 1 : -1]
                expected = torch.log_softmax(logits / 0.7, -1).gather(-1, targets).squeeze(-1)
                gaps.append((torch.tensor(s.logprobs) - expected).abs().max())
    # measured: ~2e-3 from either teacher (fp32 sampling matches to 1e-4, test_sampler.py)
    assert max(gaps_bf16) < 2e-2 and max(gaps_fp32) < 2e-2
    assert max(gaps_fp32) > 1e-4  # the sampler did decode in bf16


def test_bf16_rl_with_a_reference_starts_near_zero_kl(tokenizer, tmp_path):
    model = build_preset("nano", tokenizer, seed=1)
    reference = build_preset("nano", tokenizer, seed=1).requires_grad_(False)
    config = RLConfig(
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=2,
        kl_coef=0.1,
        progress=False,
        precision="bf16",
    )
    result = train_rl(model, tokenizer, [FirstByteTask()], config, tmp_path, reference=reference)
    assert result.precision["dtype"] == "bf16"
    assert abs(result.history[0]["kl_ref"]) < 1e-2  # sampler and reference both bf16, same weights
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_forced_choices_and_bad_names(nano, tmp_path):
    for name in ("fp32", "bf16"):
        choice = resolve_precision(name, nano, cache_dir=tmp_path)
        assert (choice.dtype, choice.reason, choice.figures) == (name, "requested", {})
    assert not (tmp_path / "precision.json").exists()  # nothing measured, nothing cached
    with pytest.raises(ValueError, match="valid: auto, fp32, bf16"):
        resolve_precision("fp16", nano)


def test_auto_is_bf16_on_cuda_without_measuring(nano, monkeypatch, tmp_path):
    monkeypatch.setattr(prec, "measure", lambda *a, **k: pytest.fail("measured on CUDA"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    choice = prec._decide("auto", nano, "train", torch.device("cuda"), tmp_path)
    assert (choice.dtype, choice.reason, choice.device_type) == ("bf16", "cuda", "cuda")


@pytest.mark.parametrize("flags", [["avx512_bf16", "avx512f", "avx2"], ["avx512f", "avx2"], ["avx2"], []])
def test_auto_is_fp32_without_timing_on_a_cpu_without_amx(nano, monkeypatch, tmp_path, flags):
    """Zen4 (AVX512_BF16, no AMX): bf16 sampling measured 1.14x fp32 loaded and 0.79x quiet, so a
    timing made the recipe's weights depend on the load; without native bf16 it is 5-100x slower."""
    monkeypatch.setattr(prec, "machine", lambda: {"cpu": "x", "flags": flags})
    monkeypatch.setattr(prec, "measure", lambda *a, **k: pytest.fail("timed without AMX"))
    for mode in ("train", "sample"):
        choice = resolve_precision("auto", nano, mode, cache_dir=tmp_path)
        assert (choice.dtype, choice.reason) == ("fp32", "no AMX on this CPU: fp32 without timing")
    assert not (tmp_path / "precision.json").exists()  # nothing measured, nothing to cache
    assert resolve_precision("bf16", nano, cache_dir=tmp_path).dtype == "bf16"  # asked for: obeyed


def test_auto_measures_once_per_machine_and_model(tokenizer, monkeypatch, tmp_path, amx):
    calls = []

    def fake_measure(model, mode):
        calls.append(mode)
        return {"mode": mode, "matmul": [], "model": {"speedup": 1.5 if mode == "train" else 0.5}}

    monkeypatch.setattr(prec, "measure", fake_measure)
    nano, tiny = build_preset("nano", tokenizer), build_preset("tiny", tokenizer)
    first = resolve_precision("auto", nano, cache_dir=tmp_path)
    again = resolve_precision("auto", nano, cache_dir=tmp_path)
    assert (first.dtype, first.reason, again.dtype, again.reason) == ("bf16", "measured", "bf16", "cached")
    assert again.figures == first.figures and calls == ["train"]
    assert resolve_precision("auto", nano, "sample", cache_dir=tmp_path).dtype == "fp32"  # 0.5x: slower
    assert resolve_precision("auto", tiny, cache_dir=tmp_path).reason == "measured"  # another shape
    assert calls == ["train", "sample", "train"]

    entries = json.loads((tmp_path / "precision.json").read_text())
    assert len(entries) == 3
    key = next(iter(entries.values()))["key"]
    assert key["machine"]["cpu"] and key["machine"]["torch"] == torch.__version__
    assert key["model"]["hidden_size"] == nano.config.hidden_size

    other = prec.machine() | {"cpu": "Another CPU"}
    monkeypatch.setattr(prec, "machine", lambda: other)
    assert resolve_precision("auto", nano, cache_dir=tmp_path).reason == "measured"  # another machine
    assert calls == ["train", "sample", "train", "train"]


def test_a_busy_measurement_keeps_fp32_and_every_later_run_agrees(nano, monkeypatch, tmp_path, amx):
    """Load inflated bf16's measured gain (Zen4: 1.14x loaded, 0.79x quiet), so a busy
    measurement may not choose bf16; its verdict is cached, so later runs agree whatever their load."""
    calls = []
    load = {"load1": 6.0, "cpus": 2}

    def fake_measure(model, mode):
        calls.append(mode)
        return {"matmul": [], "model": {"speedup": 1.5}, "load": dict(load)}

    monkeypatch.setattr(prec, "measure", fake_measure)
    first = resolve_precision("auto", nano, cache_dir=tmp_path)
    assert (first.dtype, first.reason) == ("fp32", "measured")
    assert "measured at load 6.0 on 2 cores: bf16 not trusted" in first.describe()
    load["load1"] = 0.5  # quiet now: the cached verdict stands
    again = resolve_precision("auto", nano, cache_dir=tmp_path)
    assert (again.dtype, again.reason, len(calls)) == ("fp32", "cached", 1)
    quiet = resolve_precision("auto", nano, cache_dir=tmp_path / "fresh")  # a quiet first measurement
    assert (quiet.dtype, quiet.reason) == ("bf16", "measured")


def test_no_model_step_when_bf16_matmul_is_faster_at_no_size(nano, monkeypatch):
    slow = [
        {"size": 512, "fp32_gflops": 17.0, "bf16_gflops": 9.7},
        {"size": 1024, "fp32_gflops": 49.0, "bf16_gflops": 15.0},
    ]
    monkeypatch.setattr(prec, "matmul_sweep", lambda sizes: slow)
    monkeypatch.setattr(prec, "model_step_times", lambda *a: pytest.fail("model measured"))
    figures = prec.measure(nano, "train")
    assert figures["model"] is None and "best 0.57x" in figures["skipped_model"]
    fast = [{"size": 512, "fp32_gflops": 280.0, "bf16_gflops": 300.0}]
    monkeypatch.setattr(prec, "matmul_sweep", lambda sizes: fast)
    monkeypatch.setattr(prec, "model_step_times", lambda *a: {"speedup": 1.2})
    assert prec.measure(nano, "train")["model"] == {"speedup": 1.2}


def test_auto_verdict_follows_the_margin(nano, monkeypatch, tmp_path, amx):
    for i, (speedup, dtype) in enumerate([(1.05, "fp32"), (prec.MARGIN, "bf16"), (None, "fp32")]):
        model = {"speedup": speedup} if speedup else None
        monkeypatch.setattr(prec, "measure", lambda *a, m=model: {"matmul": [], "model": m})
        assert resolve_precision("auto", nano, cache_dir=tmp_path / str(i)).dtype == dtype


def test_a_real_measurement_leaves_the_model_alone(nano, tmp_path, amx):
    nano.train()
    state = torch.get_rng_state()
    choice = resolve_precision("auto", nano, cache_dir=tmp_path)
    figures = choice.figures
    assert figures["matmul"] and all(r["fp32_gflops"] > 0 and r["bf16_gflops"] > 0 for r in figures["matmul"])
    if figures["model"] is not None:
        faster = figures["model"]["speedup"] >= prec.MARGIN
        assert (choice.dtype == "bf16") == (faster and not prec.busy(figures))
    else:  # bf16 matmul faster at no size (a CPU without native bf16)
        assert choice.dtype == "fp32"
    assert torch.equal(torch.get_rng_state(), state) and nano.training
    assert all(p.grad is None for p in nano.parameters())


def test_model_step_times_measure_both(nano):
    times = prec.model_step_times(nano, "train", fp32_gflops=50.0, repeats=1)
    assert times["fp32_s"] > 0 and times["bf16_s"] > 0 and times["batch"][1] == 128
    assert all(p.grad is None for p in nano.parameters())


def test_under_torch_distributed_rank0_decides_for_all(tmp_path):
    import socket

    from dist_precision import rank_resolves  # a light module: the spawned processes import it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(
        rank_resolves, args=(2, port, str(tmp_path / "cache"), str(tmp_path)), nprocs=2
    )
    choices = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert choices[0] == choices[1] and choices[0]["dtype"] == "bf16" and choices[0]["reason"] == "measured"


def test_an_unwritable_cache_does_not_stop_training(nano, monkeypatch, tmp_path, amx):
    monkeypatch.setattr(prec, "measure", lambda *a: {"matmul": [], "model": {"speedup": 2.0}})
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert resolve_precision("auto", nano, cache_dir=blocker / "sub").dtype == "bf16"


def _measuring(monkeypatch, speedup):
    calls = []

    def fake_measure(model, mode):
        calls.append(mode)
        return {"matmul": [], "model": {"speedup": speedup[mode]}}

    monkeypatch.setattr(prec, "measure", fake_measure)
    return calls


def test_a_run_keeps_the_choice_it_recorded(nano, monkeypatch, tmp_path, amx):
    """The record in a run's folder, not the machine's cache or a new measurement, decides a
    resumed run: measured bf16 at the start, it stays bf16 though the machine now says fp32."""
    record = tmp_path / "run" / prec.RECORD
    calls = _measuring(monkeypatch, {"train": 1.5, "sample": 0.5})
    train = resolve_precision("auto", nano, cache_dir=tmp_path / "c1", record=record)
    sample = resolve_precision("auto", nano, "sample", cache_dir=tmp_path / "c1", record=record)
    assert (train.dtype, sample.dtype) == ("bf16", "fp32")
    written = json.loads(record.read_text())
    assert {m: c["dtype"] for m, c in written.items()} == {"train": "bf16", "sample": "fp32"}

    calls = _measuring(monkeypatch, {"train": 0.5, "sample": 1.5})  # the verdicts flip here now
    resumed = resolve_precision("auto", nano, cache_dir=tmp_path / "c2", record=record)
    resumed_sample = resolve_precision("auto", nano, "sample", cache_dir=tmp_path / "c2", record=record)
    assert (resumed.dtype, resumed_sample.dtype) == ("bf16", "fp32") and calls == []
    assert resumed.reason == "recorded by this run on cpu" and resumed.figures == train.figures
    assert resolve_precision("auto", nano, cache_dir=tmp_path / "c2").dtype == "fp32"  # without it
    # an explicit precision is in the stage's settings: the record neither decides nor grows
    assert resolve_precision("fp32", nano, cache_dir=tmp_path / "c2", record=record).dtype == "fp32"
    assert json.loads(record.read_text()) == written


def test_a_record_this_device_cannot_keep_is_refused(nano, monkeypatch, tmp_path):
    record = tmp_path / prec.RECORD
    record.write_text(json.dumps({"train": PrecisionChoice("bf16", "auto", "measured").as_dict()}))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    with pytest.raises(
        prec.PrecisionRecordError, match=rf"{prec.RECORD}: this run chose precision bf16 for train on cpu"
    ):
        prec._recorded(record, "auto", "train", torch.device("cuda"))
    kept = prec._recorded(record, "auto", "train", torch.device("cpu"))
    assert kept.dtype == "bf16" and prec._recorded(record, "auto", "sample", torch.device("cpu")) is None


def test_a_resumed_training_run_keeps_its_recorded_precision(tokenizer, monkeypatch, tmp_path, amx):
    """train_supervised writes the record in its folder; run again there (a resume of the finished
    run: nothing left to train) on a machine whose cache and measurement now say fp32, it is bf16."""
    _measuring(monkeypatch, {"train": 1.5})
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(tmp_path / "cache1"))
    model = build_preset("nano", tokenizer, seed=0)
    config = TrainConfig(
        max_steps=2, batch_size=4, log_every=1, save_every=1, progress=False, precision="auto"
    )
    pad = tokenizer.pad_token_id
    first = train_supervised(model, _data(tokenizer, 8), config, tmp_path / "run", objective=NextToken(pad))
    assert first.precision["dtype"] == "bf16" and (tmp_path / "run" / prec.RECORD).exists()
    calls = _measuring(monkeypatch, {"train": 0.5})
    monkeypatch.setenv("TEMPER_CACHE_DIR", str(tmp_path / "cache2"))
    again = train_supervised(model, _data(tokenizer, 8), config, tmp_path / "run", objective=NextToken(pad))
    assert (
        again.precision["dtype"] == "bf16" and again.precision["reason"].startswith("recorded") and not calls
    )
