"""The vLLM sampler kinds of the rl and eval stages (`sampler: vllm | vllm_server`, docs/vllm.md),
imported only where a stage asks for one, and the rules of their settings.

`vllm`: an engine in this process (`VLLMSampler`). `vllm_server`: an OpenAI-compatible vLLM server
on 127.0.0.1 (`VLLMServerSampler`), started for the stage and stopped when it ends (a failure and
Ctrl-C included), or with `server_url` the running server at that URL, which is neither started nor
stopped and is first given the stage's model through a weight sync (a server serving another
model, or one that cannot sync, fails there in one line rather than sample from the wrong one)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from temper import distributed
from temper.models import load_model
from temper.stages.base import Loc
from temper.stages.loading import whole_model

if TYPE_CHECKING:
    import torch

    from temper.rollout import Sampler

SamplerKind = Literal["hf", "vllm", "vllm_server"]


def server_url_rules(sampler: str, server_url: str | None) -> list[tuple[Loc, str]]:
    """`server_url` only with `sampler: vllm_server`, and an http(s) URL."""
    if server_url is None:
        return []
    if sampler != "vllm_server":
        return [
            (
                ("server_url",),
                f"server_url is read by sampler: vllm_server only (this stage has sampler: {sampler})",
            )
        ]
    if not server_url.startswith(("http://", "https://")):
        return [
            (("server_url",), f"expected an http:// URL such as http://127.0.0.1:8000, got {server_url!r}")
        ]
    return []


def vllm_sampler(
    kind: str,
    model: Path | str,
    stop_token_ids: Sequence[int],
    owned: ExitStack,
    *,
    server_url: str | None = None,
    log_dir: Path | None = None,
    loaded: torch.nn.Module | None = None,
) -> Sampler:
    """The stage's vLLM sampler of `kind` for the model folder `model`; a server it starts is
    stopped when `owned` closes (its log in `log_dir`). An attached server (`server_url`) is given
    the model's weights first: `loaded`, or `model` loaded here."""
    if kind == "vllm":
        from temper.rollout.vllm_sampler import VLLMSampler

        return VLLMSampler(whole_model(model, "sampler: vllm"), stop_token_ids=stop_token_ids)
    from temper.rollout.vllm_server import VLLMServerSampler

    if server_url is not None:
        sampler = owned.enter_context(VLLMServerSampler(url=server_url, stop_token_ids=stop_token_ids))
        sampler.sync(loaded if loaded is not None else load_model(model))
        return sampler
    log = None
    if log_dir is not None:
        suffix = f".rank{distributed.rank()}" if distributed.world_size() > 1 else ""
        log = log_dir / f"vllm_server{suffix}.log"
    served = whole_model(model, "sampler: vllm_server")
    return owned.enter_context(VLLMServerSampler(served, stop_token_ids=stop_token_ids, log=log))
