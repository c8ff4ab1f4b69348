"""The sampler a stage generates with (`sampler: hf | vllm | vllm_server`, docs/vllm.md), and the
rules of its settings: rl, eval and rft name one, and sft's `data.best_of_n` block.

`hf`: transformers in this process (`HFSampler`, over the live model). `vllm`: an engine in this
process (`VLLMSampler`). `vllm_server`: an OpenAI-compatible vLLM server on 127.0.0.1
(`VLLMServerSampler`), started for the stage and stopped when it ends (a failure and Ctrl-C
included), or with `server_url` the running server at that URL, which is neither started nor
stopped and is first given the stage's model through a weight sync (a server serving another
model, or one that cannot sync, fails there in one line rather than sample from the wrong one).
vLLM is imported only where a stage asks for it. A stage that trains the model it samples syncs
the sampler after each update (`sampler.sync(model)`: a no-op for `hf`, which reads the live
model)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from temper import distributed
from temper.models import load_model
from temper.stages.base import Loc
from temper.stages.loading import whole_model

if TYPE_CHECKING:
    import torch

    from temper.rollout import Sampler

SamplerKind = Literal["hf", "vllm", "vllm_server"]


def async_sampler_rules(sampler: str, train: Any) -> list[tuple[Loc, str]]:
    """With a vLLM sampler and `async_rollouts.max_staleness` > 0 the rollout worker is a thread of
    this process that owns the engine (it syncs each job's weights into it before sampling): a
    process worker would fork the engine, and an in-run eval would share it with the worker (and
    read the job's weights, not the trainer's)."""
    block = train.async_rollouts
    if sampler == "hf" or not block.max_staleness:
        return []
    errors: list[tuple[Loc, str]] = []
    if block.worker != "thread":
        errors.append(
            (
                ("train", "async_rollouts", "worker"),
                f"sampler: {sampler} with max_staleness {block.max_staleness} needs worker: thread (the "
                "worker drives the engine, which a forked process cannot share)",
            )
        )
    if train.eval_every:
        errors.append(
            (
                ("train", "eval_every"),
                f"sampler: {sampler} with max_staleness {block.max_staleness}: an in-run eval would share the "
                "engine with the rollout worker, which holds older weights; set eval_every: 0 and evaluate "
                "in an eval stage",
            )
        )
    return errors


def sampler_rules(
    sampler: str, server_url: str | None, check_sync: float | None = None
) -> list[tuple[Loc, str]]:
    """`server_url` only with `sampler: vllm_server`, and an http(s) URL; `vllm_check_sync` only
    with a vLLM sampler."""
    errors: list[tuple[Loc, str]] = []
    if check_sync is not None and sampler == "hf":
        errors.append(
            (
                ("vllm_check_sync",),
                "vllm_check_sync compares a vLLM engine with the trainer after a sync; sampler: hf "
                "samples the trained model itself (set sampler: vllm or vllm_server, or drop it)",
            )
        )
    if server_url is None:
        return errors
    if sampler != "vllm_server":
        return errors + [
            (
                ("server_url",),
                f"server_url is read by sampler: vllm_server only (this stage has sampler: {sampler})",
            )
        ]
    if not server_url.startswith(("http://", "https://")):
        errors.append(
            (("server_url",), f"expected an http:// URL such as http://127.0.0.1:8000, got {server_url!r}")
        )
    return errors


def stage_sampler(
    kind: str,
    path: Path | str,
    model: torch.nn.Module | None,
    tokenizer: Any,
    stop_token_ids: Sequence[int],
    owned: ExitStack,
    *,
    server_url: str | None = None,
    log_dir: Path | None = None,
    check_sync: float | None = None,
    **hf_kwargs: Any,
) -> Sampler:
    """The stage's sampler of `kind` for the model folder `path` (`model`: that model loaded, or
    None where only vLLM reads it). An engine or a server it starts is closed when `owned` closes
    (a server's log in `log_dir`). An attached server (`server_url`) is given the model's weights
    first: `model`, or `path` loaded here. `hf_kwargs` go to `HFSampler`."""
    if kind == "hf":
        from temper.rollout import HFSampler

        if model is None:
            model = load_model(path)
        return HFSampler(model, tokenizer, **hf_kwargs)
    if kind == "vllm":
        from temper.rollout.vllm_sampler import VLLMSampler

        engine = VLLMSampler(
            whole_model(path, "sampler: vllm"), stop_token_ids=stop_token_ids, check_sync=check_sync
        )
        owned.callback(engine.close)
        return engine
    from temper.rollout.vllm_server import VLLMServerSampler

    if server_url is not None:
        sampler = owned.enter_context(
            VLLMServerSampler(url=server_url, stop_token_ids=stop_token_ids, check_sync=check_sync)
        )
        sampler.sync(model if model is not None else load_model(path))
        return sampler
    log = None
    if log_dir is not None:
        suffix = f".rank{distributed.rank()}" if distributed.world_size() > 1 else ""
        log = log_dir / f"vllm_server{suffix}.log"
    served = whole_model(path, "sampler: vllm_server")
    return owned.enter_context(
        VLLMServerSampler(served, stop_token_ids=stop_token_ids, log=log, check_sync=check_sync)
    )
