"""The handler of a training episode: each call of the agent is handed to the episode's env
(`envs/gateway_env.py`), whose turn the agent loop samples with the policy; the call's HTTP
thread waits for the answer.

    bridge = Bridge("policy")
    body = bridge.next_call(timeout)      # the env: the agent's next request (None: none came)
    bridge.answer(response_body)          # ... or bridge.refuse(BadRequest(...))

One call at a time: an agent episode is a conversation, and a second call made while one is
pending is refused (409) rather than interleaved into the recorded tokens.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from temper.gateway.openai_format import BadRequest


class Bridge:
    def __init__(self, model_name: str, answer_timeout: float = 600.0):
        self.model_name = model_name
        self.answer_timeout = answer_timeout
        self.calls: queue.Queue[dict[str, Any]] = queue.Queue()
        self.answers: queue.Queue[dict[str, Any] | BadRequest] = queue.Queue()
        self.busy = threading.Lock()
        self.closed = False

    # the HTTP side -------------------------------------------------------------------------
    def chat(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.closed:
            raise BadRequest("this episode is over", 410)
        if not self.busy.acquire(blocking=False):
            raise BadRequest("another call of this episode is in flight: make one call at a time", 409)
        try:
            self.calls.put(body)
            try:
                answer = self.answers.get(timeout=self.answer_timeout)
            except queue.Empty:
                raise BadRequest("the trainer did not answer in time", 504) from None
            if isinstance(answer, BadRequest):
                raise answer
            return answer
        finally:
            self.busy.release()

    def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        raise BadRequest(
            "a training episode is a chat: call /v1/chat/completions (temper gateway serves "
            "/v1/completions for inference)"
        )

    # the env side --------------------------------------------------------------------------
    def next_call(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.calls.get(timeout=timeout)
        except queue.Empty:
            return None

    def answer(self, body: dict[str, Any]) -> None:
        self.answers.put(body)

    def refuse(self, error: BadRequest) -> None:
        self.answers.put(error)

    def close(self) -> None:
        """No more answers: a call still waiting is told the episode is over."""
        self.closed = True
        self.answers.put(BadRequest("this episode is over", 410))
