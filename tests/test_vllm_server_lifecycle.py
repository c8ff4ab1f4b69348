"""VLLMServerSampler's server lifecycle and HTTP, against tests/fake_vllm_server.py (a standard
library stand-in that speaks the same endpoints; no vLLM needed). The real server:
tests/test_vllm_server.py (`make test-vllm`).

What each test would catch: a started server (or its process group) left running after close(),
after an exception in the `with` block, or at interpreter exit after Ctrl-C (a); a start-up that
hangs or fails without the server's own words (b); a stop that waits forever on a server that
ignores SIGTERM (c); samples that are not the server's ids in prompt order, seeds not per prompt,
a re-tokenised prompt accepted (d); a sync that sends no weights file, keeps old versions, or
fails silently (e); a dead server waited on (f); an attached server stopped (g)."""

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from temper.rollout.server_process import ServerProcess, ServerStartError, free_port, group_members
from temper.rollout.vllm_server import VLLMServerSampler
from temper.rollout.vllm_shared import EngineError, SyncError

FAKE = [sys.executable, str(Path(__file__).with_name("fake_vllm_server.py"))]


def fake(tmp_path, mode="ok", **kwargs):
    kwargs.setdefault("start_timeout", 60)
    (tmp_path / "model").mkdir(exist_ok=True)
    return VLLMServerSampler(
        str(tmp_path / "model"),
        server_command=FAKE,
        server_args=["--fake-mode", mode],
        log=tmp_path / "s.log",
        **kwargs,
    )


def gone(pgid, within=10.0):
    deadline = time.monotonic() + within
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_members(pgid)


def running_with(argument):
    """Processes whose command line holds `argument`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if argument.encode() in cmdline.read_bytes().split(b"\0"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_samples_are_the_servers_ids_per_prompt_and_close_stops_it(tmp_path, monkeypatch):  # (a), (d)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # requests to 127.0.0.1 never go through one
    sampler = fake(tmp_path)
    pid = sampler.process.pid
    assert group_members(pid) == [pid]
    assert (sampler.token_budget, sampler.max_num_seqs, sampler.max_model_len) == (16384, 8, 256)
    prompts = [[1, 2], [10], [3, 3, 3]]
    out = sampler.sample(prompts, 2, max_new_tokens=3, seed=[100, 200, 300])
    assert [[s.prompt_ids for s in row] for row in out] == [[p, p] for p in prompts]
    # (sum(prompt) + seed + j + k) % 256: sample j of prompt i, in index order though the fake answers reversed
    assert out[1][1].token_ids == [(10 + 200 + 1 + k) % 256 for k in range(3)]
    assert out[2][0].token_ids == [(9 + 300 + k) % 256 for k in range(3)]
    assert out[0][0].logprobs == [-1.0] * 3 and out[0][0].stop_reason == "length"
    greedy = sampler.sample(prompts, 3, max_new_tokens=2, temperature=0.0, seed=[100, 200, 300])
    assert [s.token_ids for s in greedy[1]] == [[(210 + k) % 256 for k in range(2)]] * 3
    root = sampler._root
    sampler.close()
    assert gone(pid) and sampler.process.process.returncode is not None
    assert not root.exists()
    sampler.close()  # idempotent
    with pytest.raises(EngineError, match="is closed"):
        sampler.sample(prompts, 1, max_new_tokens=1)


def test_an_exception_in_the_with_block_stops_the_server(tmp_path):  # (a)
    with pytest.raises(RuntimeError, match="inside"), fake(tmp_path) as sampler:
        pid = sampler.process.pid
        raise RuntimeError("inside")
    assert gone(pid)


def test_ctrl_c_and_exit_without_close_stop_the_server(tmp_path):  # (a): atexit
    script = textwrap.dedent(f"""
        import sys
        from temper.rollout.vllm_server import VLLMServerSampler
        s = VLLMServerSampler({str(tmp_path / "m")!r}, server_command={FAKE!r}, log={str(tmp_path / "l")!r})
        print(s.process.pid, flush=True)
        raise KeyboardInterrupt
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "KeyboardInterrupt" in child.stderr
    pid = int(child.stdout.split()[0])
    assert gone(pid)


def test_a_server_that_exits_at_start_says_why(tmp_path, monkeypatch):  # (b)
    monkeypatch.setenv("TEMPER_VLLM_SERVER_ARGS", "--fake-mode 'exit'")  # how a stage passes server arguments
    (tmp_path / "model").mkdir()
    with pytest.raises(ServerStartError, match=r"(?s)exited with status 3.*refusing to start \(boom\)"):
        VLLMServerSampler(str(tmp_path / "model"), server_command=FAKE, log=tmp_path / "s.log")


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(tmp_path):  # (b)
    port = free_port()
    argv = [*FAKE, "--port", str(port), "--fake-mode", "unhealthy"]
    start = time.monotonic()
    with pytest.raises(ServerStartError, match=r"did not answer .*/health within 2 s"):
        ServerProcess(
            argv, env={}, log=tmp_path / "l", ready_url=f"http://127.0.0.1:{port}/health", ready_timeout=2
        )
    assert time.monotonic() - start < 60
    assert running_with(str(port)) == []  # stopped, not left answering 503


def test_ctrl_c_while_waiting_for_health_stops_the_server(tmp_path):  # (a)
    port = free_port()
    argv = [*FAKE, "--port", str(port), "--fake-mode", "unhealthy"]
    seen = []

    def interrupt(signum, frame):
        seen.extend(running_with(str(port)))
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 3.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            ServerProcess(
                argv,
                env={},
                log=tmp_path / "l",
                ready_url=f"http://127.0.0.1:{port}/health",
                ready_timeout=120,
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(seen) == 1 and gone(seen[0])


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):  # (c)
    port = free_port()
    server = ServerProcess(
        [*FAKE, "--port", str(port), "--fake-mode", "ignore-term"],
        env={},
        log=tmp_path / "l",
        ready_url=f"http://127.0.0.1:{port}/health",
        ready_timeout=60,
    )
    start = time.monotonic()
    server.stop(grace=1.0)
    assert server.process.returncode == -9 and time.monotonic() - start < 30
    assert gone(server.pid)


def test_a_re_tokenised_prompt_is_refused(tmp_path):  # (d)
    with fake(tmp_path, "retokenise") as sampler, pytest.raises(EngineError, match="other prompt ids"):
        sampler.sample([[1, 2, 3]], 1, max_new_tokens=2)


def test_sync_sends_the_weights_and_a_failed_one_refuses_the_server(tmp_path, tokenizer):  # (e)
    from temper.models import build_preset

    model = build_preset("nano", tokenizer, seed=0)
    with fake(tmp_path) as sampler:
        sampler.sync(model)
        sampler.sync(model)
        reload = sampler._get("/last_reload")
        assert reload["version"] == 2
        assert reload["last_reload"]["names"] == sorted(model.state_dict())
        path = Path(reload["last_reload"]["path"])
        assert path.name == "weights-2" and path.parent == sampler._root
        assert sorted(p.name for p in sampler._root.iterdir() if p.is_dir()) == [
            "weights-2"
        ]  # the old one deleted
        assert sampler.sample([[1]], 1, max_new_tokens=1, seed=[0])[0][0].logprobs == [-3.0]  # version 2
        broken = torch.nn.Module()
        broken.register_buffer("broken", torch.zeros(2))
        with pytest.raises(
            SyncError, match=r"could not load the trainer's weights .* \(500\): .*size mismatch"
        ):
            sampler.sync(broken)
        with pytest.raises(SyncError, match="unusable since a failed weight sync"):
            sampler.sample([[1]], 1, max_new_tokens=1)
        with pytest.raises(SyncError, match="unusable since a failed weight sync"):
            sampler.sync(model)


def test_a_float32_server_checks_every_sync_by_default(tmp_path, tokenizer):  # (e)
    """A server that says it runs float32, a float32 model: each sync is followed by the logprob
    check (the fake's logprobs are no model's, so it fails); a bf16 model or an explicit
    check_sync choose otherwise."""
    from temper.models import build_preset

    model = build_preset("nano", tokenizer, seed=0)
    (tmp_path / "model").mkdir()
    argv = ["--fake-dtype", "float32"]
    with VLLMServerSampler(
        str(tmp_path / "model"), server_command=FAKE, server_args=argv, log=tmp_path / "s.log"
    ) as sampler:
        assert sampler.dtype == "float32" and sampler.sync_tolerance(model) == 1e-3
        assert sampler.sync_tolerance(model.to(torch.bfloat16)) is None
        sampler.check_sync = 5.0
        assert sampler.sync_tolerance(model) == 5.0
        sampler.check_sync = None
        with pytest.raises(
            SyncError, match=r"differ from the trainer's by up to .* \(check_sync tolerance 0.001\)"
        ):
            sampler.sync(model.float())
        assert sampler.last_sync_error > 1.0


def test_a_server_without_development_endpoints_cannot_sync(tmp_path, tokenizer):  # (e)
    from temper.models import build_preset

    with fake(tmp_path, "no-dev") as sampler, pytest.raises(SyncError, match="VLLM_SERVER_DEV_MODE=1"):
        sampler.sync(build_preset("nano", tokenizer, seed=0))


def test_a_dead_server_is_said_with_its_log_and_refused(tmp_path):  # (f)
    with fake(tmp_path) as sampler:
        sampler.process.process.kill()
        sampler.process.process.wait()
        with pytest.raises(EngineError, match=r"the vLLM engine died: .*killed by signal 9"):
            sampler.sample([[1]], 1, max_new_tokens=1)
        with pytest.raises(EngineError, match="unusable since its death"):
            sampler.sample([[1]], 1, max_new_tokens=1)


def test_attach_starts_and_stops_nothing(tmp_path):  # (g)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        [*FAKE, "--port", str(port), "--model", "served"],
        env={},
        log=tmp_path / "l",
        ready_url=f"{url}/health",
        ready_timeout=60,
    )
    try:
        with VLLMServerSampler(url=url + "/v1/") as sampler:
            assert sampler.process is None and sampler.model_name == "served"
            assert sampler.sample([[4]], 1, max_new_tokens=1, seed=[1])[0][0].token_ids == [5]
        assert server.alive()
    finally:
        server.stop()
    with pytest.raises(ValueError, match="one of a model to serve and the url"):
        VLLMServerSampler("m", url=url)


def fake_python(tmp_path, monkeypatch):
    """$TEMPER_VLLM_PYTHON as a script that runs the fake for `python -m <server module> ARGS`."""
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nshift 2\necho "fake pgid $$"\nexec {FAKE[0]} {FAKE[1]} "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("TEMPER_VLLM_PYTHON", str(script))


def served_pid(log):
    return int(
        next(line for line in log.read_text().splitlines() if line.startswith("fake pgid")).split()[-1]
    )


@pytest.mark.slow  # a whole stage through the CLI
def test_an_eval_stage_starts_one_server_per_model_and_stops_it(tokenizer, tmp_path, monkeypatch):  # (a)
    from temper.cli import main
    from temper.models import build_preset, save_model

    fake_python(tmp_path, monkeypatch)
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "eval"), "--tasks", "arithmetic"]
    args += [
        "--splits",
        "test",
        "--n_problems",
        "3",
        "--k",
        "1",
        "--max_new_tokens",
        "4",
        "--sampler",
        "vllm_server",
    ]
    assert main(args) == 0
    log = tmp_path / "eval" / "vllm_server.log"
    assert gone(served_pid(log))
    assert (tmp_path / "eval" / "eval.json").exists()


@pytest.mark.slow  # a whole stage through the CLI
def test_an_eval_stage_attached_to_a_server_syncs_each_model_and_leaves_it_running(
    tokenizer, tmp_path
):  # (g)
    from temper.cli import main
    from temper.models import build_preset, save_model

    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        [*FAKE, "--port", str(port), "--model", "served"],
        env={},
        log=tmp_path / "l",
        ready_url=f"{url}/health",
        ready_timeout=60,
    )
    try:
        args = [
            "eval",
            "--model",
            str(tmp_path / "m"),
            "--out",
            str(tmp_path / "eval"),
            "--tasks",
            "arithmetic",
        ]
        args += ["--splits", "test", "--n_problems", "3", "--k", "1", "--max_new_tokens", "4"]
        assert main([*args, "--sampler", "vllm_server", "--server_url", url]) == 0
        assert server.alive()
        with urllib.request.urlopen(f"{url}/last_reload", timeout=10) as answer:
            assert json.load(answer)["version"] == 1  # the model was synced in before it was evaluated
    finally:
        server.stop()


def test_server_url_is_checked_and_left_out_of_the_hash():
    from pydantic import ValidationError

    from temper.stages.evaluation import EvalStage
    from temper.stages.markers import stage_settings
    from temper.stages.rl import RLStage

    with pytest.raises(ValidationError, match="server_url is read by sampler: vllm_server only"):
        RLStage(kind="rl", tasks=["arithmetic"], server_url="http://127.0.0.1:1")
    with pytest.raises(ValidationError, match="expected an http:// URL"):
        EvalStage(kind="eval", sampler="vllm_server", server_url="127.0.0.1:8000")
    a = RLStage(kind="rl", tasks=["arithmetic"], sampler="vllm_server", server_url="http://127.0.0.1:1")
    b = RLStage(kind="rl", tasks=["arithmetic"], sampler="vllm_server")
    assert stage_settings(a) == stage_settings(b) != stage_settings(RLStage(kind="rl", tasks=["arithmetic"]))


@pytest.mark.slow  # a whole stage through the CLI
def test_an_rl_stage_syncs_its_server_after_every_update_and_stops_it(
    tokenizer, tmp_path, monkeypatch
):  # (a), (e)
    from temper.cli import main
    from temper.models import build_preset, save_model

    fake_python(tmp_path, monkeypatch)
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    args = ["rl", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "rl"), "--tasks", "arithmetic"]
    args += ["--train.steps", "2", "--train.prompts_per_step", "2", "--train.group_size", "2"]
    args += ["--train.max_new_tokens", "4", "--train.eval_problems", "2", "--probe_groups", "0"]
    synced = []
    original = VLLMServerSampler.sync

    def recorded(self, model):
        original(self, model)
        synced.append(self._get("/last_reload")["version"])

    monkeypatch.setattr(VLLMServerSampler, "sync", recorded)
    assert main([*args, "--sampler", "vllm_server"]) == 0
    assert synced == [1, 2]  # one reload per update, each answered
    assert gone(served_pid(tmp_path / "rl" / "vllm_server.log"))


def test_async_rollouts_with_a_vllm_sampler_need_a_thread_worker_and_no_in_run_eval():
    from pydantic import ValidationError

    from temper.stages.rl import RLStage

    def stage(sampler, **train):
        return RLStage(kind="rl", tasks=["arithmetic"], sampler=sampler, train=train)

    with pytest.raises(ValidationError, match=r"train\.async_rollouts\.worker[\s\S]*needs worker: thread"):
        stage("vllm", async_rollouts={"max_staleness": 1}, eval_every=0)
    with pytest.raises(
        ValidationError, match=r"train\.eval_every[\s\S]*share the engine with the rollout worker"
    ):
        stage("vllm_server", async_rollouts={"max_staleness": 1, "worker": "thread"}, eval_every=5)
    stage("vllm_server", async_rollouts={"max_staleness": 1, "worker": "thread"}, eval_every=0)
    stage("hf", async_rollouts={"max_staleness": 1}, eval_every=5)  # the worker has its own model copy
    stage("vllm", eval_every=5)  # lockstep: the trainer syncs the engine before the eval


@pytest.mark.slow  # a whole stage through the CLI
def test_an_async_rl_stage_leaves_the_servers_syncs_to_its_worker(tokenizer, tmp_path, monkeypatch):
    """max_staleness 1 with a thread worker: the server is given each job's weights by the worker
    (jobs 1, 2, 3 sampled with versions 0, 0, 1, after the worker's start), never the trainer's
    newer ones after an update."""
    import threading

    from temper.cli import main
    from temper.models import build_preset, save_model

    fake_python(tmp_path, monkeypatch)
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    args = ["rl", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "rl"), "--tasks", "arithmetic"]
    args += ["--train.steps", "3", "--train.prompts_per_step", "2", "--train.group_size", "2"]
    args += ["--train.max_new_tokens", "4", "--train.eval_every", "0", "--probe_groups", "0"]
    args += ["--train.async_rollouts.max_staleness", "1", "--train.async_rollouts.worker", "thread"]
    synced = []
    original = VLLMServerSampler.sync

    def recorded(self, model):
        original(self, model)
        synced.append(threading.current_thread() is threading.main_thread())

    monkeypatch.setattr(VLLMServerSampler, "sync", recorded)
    assert main([*args, "--sampler", "vllm_server"]) == 0
    assert synced == [True, False, False, False]  # the worker's start (main thread), then its 3 jobs
    rows = [json.loads(line) for line in (tmp_path / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({(r["step"], r["policy_version"]) for r in rows}) == [(1, 0), (2, 0), (3, 1)]
    assert gone(served_pid(tmp_path / "rl" / "vllm_server.log"))


def test_calls_are_split_where_prefills_would_not_fit_one_step():
    """vllm_shared.fitting_calls, shared by both vLLM samplers: a budget of 100 tokens less 10
    decode slots takes 90 prefill tokens per call, n per prompt; a prompt over it is refused."""
    from temper.rollout.vllm_shared import fitting_calls

    prompts = [[1] * 30, [1] * 15, [1] * 1, [1] * 44, [1] * 2]
    assert fitting_calls(prompts, 2, 100, 10) == [range(0, 2), range(2, 4), range(4, 5)]  # 60+30 | 2+88 | 4
    assert fitting_calls(prompts, 1, 100, 10) == [range(0, 4), range(4, 5)]  # 30+15+1+44 = 90 fits exactly
    with pytest.raises(ValueError, match="prompt 3 has 44 tokens x 3 samples.*raise max_num_batched_tokens"):
        fitting_calls(prompts, 3, 100, 10)


def test_stop_reasons_read_as_the_sampler_interface_says():
    from temper.rollout.vllm_shared import stop_reason_of

    assert stop_reason_of("length", None) == "length"
    assert stop_reason_of("stop", None) == "eos"
    assert stop_reason_of("stop", 258) == "eos"  # a stop token id
    assert stop_reason_of("stop", "</s>") == "stop"  # a stop string


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_a_server_stage_without_vllm_is_a_clear_error(tokenizer, tmp_path, capsys, monkeypatch):
    from temper.cli import main
    from temper.models import build_preset, save_model

    monkeypatch.delenv("TEMPER_VLLM_PYTHON", raising=False)
    save_model(build_preset("nano", tokenizer, seed=0), tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "eval"), "--tasks", "arithmetic"]
    assert main([*args, "--sampler", "vllm_server"]) == 2
    assert "this Python has no vLLM" in capsys.readouterr().err


def test_the_sampler_settings_are_checked_and_rft_keeps_its_hash_at_the_default():
    from pydantic import ValidationError

    from temper.stages.markers import stage_settings
    from temper.stages.rft import RFTStage
    from temper.stages.sft import BestOfNData

    with pytest.raises(ValidationError, match="vllm_check_sync compares a vLLM engine"):
        RFTStage(kind="rft", tasks=["t"], vllm_check_sync=1e-3)
    with pytest.raises(ValidationError, match="server_url is read by sampler: vllm_server only"):
        RFTStage(kind="rft", tasks=["t"], sampler="vllm", server_url="http://127.0.0.1:1")
    with pytest.raises(ValidationError, match="server_url is read by sampler: vllm_server only"):
        BestOfNData(tasks=["t"], server_url="http://127.0.0.1:1")
    hf = stage_settings(RFTStage(kind="rft", tasks=["t"]))
    assert "sampler" not in hf  # an rft stage recorded before the field existed stays complete
    served = RFTStage(kind="rft", tasks=["t"], sampler="vllm_server", server_url="http://127.0.0.1:1")
    assert stage_settings(served)["sampler"] == "vllm_server" and "server_url" not in stage_settings(served)
    assert "sampler" not in BestOfNData(tasks=["t"]).model_dump()


@pytest.mark.slow  # two rounds of a whole stage
@pytest.mark.parametrize("teacher", [False, True])
def test_an_rft_stage_syncs_its_server_after_each_round_and_stops_it(
    tokenizer, tmp_path, monkeypatch, teacher
):
    """Without a teacher the server serves the student and is given each round's weights; with
    one it serves the teacher, which is never synced (the student's accuracies are hf's)."""
    from fakes import FirstByteTask
    from temper.models import build_preset, save_model
    from temper.stages.context import StageContext
    from temper.stages.rft import RFTStage, run_rft
    from temper.tasks.base import Score
    from temper.train.supervised import TrainConfig

    class AnyAnswer(FirstByteTask):  # the fake server's bytes are no task's answers
        def score(self, problem, completion):
            return Score(1.0, True, True, {"reason": "correct"})

    fake_python(tmp_path, monkeypatch)
    start = save_model(build_preset("nano", tokenizer, seed=1), tokenizer, tmp_path / "start")
    ctx = StageContext(tmp_path, tmp_path, {"first_byte": AnyAnswer()}, {})
    if teacher:
        ctx.models["teacher"] = save_model(build_preset("nano", tokenizer, seed=2), tokenizer, tmp_path / "t")
    synced = []
    original = VLLMServerSampler.sync

    def recorded(self, model):
        original(self, model)
        synced.append(self._get("/last_reload")["version"])

    served = []
    started = VLLMServerSampler.__init__

    def recorded_start(self, model=None, *a, **kw):
        served.append(Path(model).name)
        started(self, model, *a, **kw)

    monkeypatch.setattr(VLLMServerSampler, "sync", recorded)
    monkeypatch.setattr(VLLMServerSampler, "__init__", recorded_start)
    stage = RFTStage(
        kind="rft",
        tasks=["first_byte"],
        rounds=2,
        prompts=8,
        k=4,
        max_new_tokens=2,
        eval_problems=8,
        sampler="vllm_server",
        teacher="teacher" if teacher else None,
        train=TrainConfig(max_steps=2, batch_size=4, lr=1e-3, warmup_steps=1, progress=False),
    )
    out = tmp_path / "rft"
    out.mkdir()
    run_rft(stage, ctx, start, out)
    rounds = json.loads((out / "rft.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1, 2] and all(r["kept"] for r in rounds[1:])
    assert synced == ([] if teacher else [1, 2])
    log = out / "vllm_server.log"
    assert gone(served_pid(log))
    assert served == (["t"] if teacher else ["start"])  # one server, on the model it samples
