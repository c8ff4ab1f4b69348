"""The gateway's HTTP server: OpenAI's `/v1/chat/completions`, `/v1/completions` and
`/v1/models` on 127.0.0.1, each call handed to a `Handler` (a training episode's `Bridge`, or
the `Recorder` of `temper gateway`).

    with GatewayServer(handler) as server:
        client = openai.OpenAI(base_url=server.base_url("ep-1"), api_key="temper")

The episode a call belongs to is named, first found first: in the path (`/e/<episode>/v1/...`,
what `base_url(episode)` gives, so an agent that only reads `OPENAI_BASE_URL` needs no change),
the `X-Temper-Episode` header, or the request's `user` field; else "default".

Why the standard library: a few calls a second from local agents need no framework, and
`ThreadingHTTPServer` (a thread per connection, daemon threads) adds no dependency. It listens on
127.0.0.1 only: the policy is served to this machine's processes, never the network.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import unquote

from temper.gateway.openai_format import BadRequest, error_body

HEADER = "X-Temper-Episode"
MAX_BODY = 64 * 1024 * 1024


class Handler(Protocol):
    """What serves the calls: `chat` and `complete` take (episode, request body) and return the
    response body, or raise `BadRequest`. Implemented by `bridge.Bridge` and `recording.Recorder`."""

    model_name: str

    def chat(self, episode: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]: ...


def _route(path: str) -> tuple[str | None, str]:
    """(episode named in the path or None, endpoint after /v1)."""
    path = path.split("?", 1)[0].rstrip("/")
    episode = None
    if path.startswith("/e/"):
        rest = path[3:]
        episode, _, path = rest.partition("/")
        episode, path = unquote(episode), "/" + path
    if not path.startswith("/v1"):
        return episode, ""
    return episode, path[3:]


def _request_handler(handler: Handler) -> type[BaseHTTPRequestHandler]:
    class Request(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # a connection per call: no thread outlives `close`

        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            _, endpoint = _route(self.path)
            if endpoint == "/models":
                model = {"id": handler.model_name, "object": "model", "owned_by": "temper"}
                return self._send(200, {"object": "list", "data": [model]})
            self._send(404, error_body(f"no route GET {self.path}", 404))

        def do_POST(self) -> None:
            episode, endpoint = _route(self.path)
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    raise BadRequest("request body too large", 413)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError as err:
                    raise BadRequest(f"the body is not JSON: {err}") from None
                if not isinstance(body, dict):
                    raise BadRequest("the body is not a JSON object")
                if body.get("stream"):
                    raise BadRequest("streaming is not supported: call with stream=False")
                if body.get("n", 1) != 1:
                    raise BadRequest("n must be 1: run the agent once per sample")
                episode = episode or self.headers.get(HEADER) or body.get("user") or "default"
                if endpoint == "/chat/completions":
                    answer = handler.chat(str(episode), body)
                elif endpoint == "/completions":
                    answer = handler.complete(str(episode), body)
                else:
                    raise BadRequest(f"no route POST {self.path}", 404)
            except BadRequest as err:
                return self._send(err.status, error_body(str(err), err.status))
            except Exception as err:  # temper's own failure: the agent gets a 500, the server stays up
                return self._send(500, error_body(f"{type(err).__name__}: {err}", 500))
            self._send(200, answer)

    return Request


class GatewayServer:
    """The server over one handler, on 127.0.0.1 (`port` 0: a free one), serving from a daemon
    thread between `start` and `close` (or as a context manager)."""

    def __init__(self, handler: Handler, port: int = 0, host: str = "127.0.0.1"):
        self.handler = handler
        self.httpd = ThreadingHTTPServer((host, port), _request_handler(handler))
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def base_url(self, episode: str | None = None) -> str:
        """The `base_url` an `openai.OpenAI` client takes; with `episode`, one that names it."""
        prefix = f"/e/{episode}" if episode else ""
        return f"http://127.0.0.1:{self.port}{prefix}/v1"

    def start(self) -> GatewayServer:
        self.thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="temper-gateway",
            daemon=True,
        )
        self.thread.start()
        return self

    def close(self) -> None:
        if self.thread is not None:
            self.httpd.shutdown()
            self.thread.join()
            self.thread = None
        self.httpd.server_close()

    def __enter__(self) -> GatewayServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
