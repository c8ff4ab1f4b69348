"""The OpenAI-compatible gateway: a user's agent program, written against the official `openai`
client, talks to temper's policy over HTTP on 127.0.0.1 and every call is recorded token-exactly.

- `openai_format`: the request and response bodies of `/v1/chat/completions` and
  `/v1/completions` (tool calls in OpenAI's form, read from the model's `<tool_call>` text).
- `server`: the HTTP server (standard library), one `Handler` behind it.
- `bridge`: the handler of a training episode: each call is handed to the agent loop, which
  samples the turn (`envs/gateway_env.py`).
- `recording`: the handler of `temper gateway` / `serve`: each call sampled here and recorded
  per episode as `Trajectory` rows.
- `serving`: `serve(model)`, the context manager over a saved model.
"""

from typing import TYPE_CHECKING

from temper.lazy import exports

if TYPE_CHECKING:  # the names, for type checkers; imported on first use (temper.lazy)
    from temper.gateway.recording import Recorder
    from temper.gateway.serving import serve

__getattr__, __dir__ = exports(globals(), {"Recorder": "recording", "serve": "serving"})

__all__ = ["Recorder", "serve"]
