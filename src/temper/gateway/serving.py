"""`serve(model)`: the gateway over a saved model, for inference and recording (`temper gateway`).

    with temper.gateway.serve("runs/x/03-rl/model", port=8000) as gw:
        client = openai.OpenAI(base_url=gw.base_url("ep-1"), api_key="temper")
        ...
        gw.recorder.trajectories("ep-1")        # the episode's token-exact rows

The model is loaded with transformers and sampled with `HFSampler` (CPU or GPU), one call at a
time; the server listens on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from temper.gateway.recording import Recorder
from temper.gateway.server import GatewayServer


@dataclass
class Serving:
    server: GatewayServer
    recorder: Recorder

    def base_url(self, episode: str | None = None) -> str:
        return self.server.base_url(episode)


@contextmanager
def serve(model: str | Path, port: int = 0, max_new_tokens: int = 256, seed: int = 0) -> Iterator[Serving]:
    """Serve the saved model at `model` (a folder `save_model` wrote) until the block ends."""
    from temper.models import load_model, load_tokenizer
    from temper.rollout.hf_sampler import HFSampler

    policy, tokenizer = load_model(Path(model)), load_tokenizer(Path(model))
    policy.eval()
    recorder = Recorder(HFSampler(policy, tokenizer), tokenizer, Path(model).name, max_new_tokens, seed)
    with GatewayServer(recorder, port) as server:
        yield Serving(server, recorder)
