"""An OpenEnv environment as a temper `Env`, unchanged: its server, driven through its client.

OpenEnv (`openenv-core`, Meta's environment standard; `pip install 'temper[openenv]'`) serves an
`Environment` subclass over HTTP and a WebSocket session (`openenv.core.create_app`, run by
uvicorn, in a container or locally). Its clients (`EnvClient` subclasses, or `GenericEnvClient`
on plain dicts) are async; `reset(**kwargs)` and `step(action)` return a `StepResult` with
`observation`, `reward` (None: none given) and `done`.

    client = GenericEnvClient(base_url="http://127.0.0.1:8000")   # or the env's own typed client
    env = OpenEnvEnv(client,
                     render_observation=lambda obs: f"position {obs['position']}, goal {obs['goal']}",
                     make_action=lambda text: {"move": 1} if "right" in text else None,
                     instructions="Reach the goal. Answer left or right.", reset_kwargs={"seed": 3})
    messages = env.reset()
    result = env.step("right")

An async client is driven through its own `.sync()` wrapper (a background event loop); a sync one
(`SyncEnvClient`) is used as is. The episode follows the gymnasium adapter's conventions (see
temper.envs.adapters.gymnasium_text): `make_action(text)` returning None is an invalid answer
(not sent, the observation repeated, counted, `invalid_penalty`), and so is an action the server
rejects by its schema (its VALIDATION_ERROR); `reward` is the step's reward; `done` ends the
episode (OpenEnv does not tell a time limit from a goal, so every end is "terminated"); the Score
is the return, `success(terminated, last_reward, metadata)` (default: a positive last reward) and
no invalid answer. The client is closed when the episode ends (an env is one episode), or by
`close()`. A lost connection or any other server error raises: an infrastructure error, never a
silent zero.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from temper.envs.adapters._episode import INVALID_MESSAGE, TextEpisode, default_success
from temper.envs.base import StepResult

VALIDATION_ERROR = "(code: VALIDATION_ERROR)"
"""How openenv-core 0.3's client reports a server-side action validation failure: only in the
message of the RuntimeError it raises (EnvClient._send_and_receive)."""


class OpenEnvEnv:
    """An OpenEnv client's environment session as a temper `Env`; one episode per instance."""

    stop: Sequence[str] = ()

    def __init__(
        self,
        client: Any,
        *,
        render_observation: Callable[[Any], str],
        make_action: Callable[[str], Any],
        instructions: str | None = None,
        instructions_as: str = "system",
        reset_kwargs: dict[str, Any] | None = None,
        invalid_penalty: float = 0.0,
        invalid_message: str = INVALID_MESSAGE,
        max_steps: int | None = None,
        success: Callable[[bool, float, dict[str, Any]], bool] = default_success,
    ):
        self.client = client.sync() if inspect.iscoroutinefunction(getattr(client, "reset", None)) else client
        self.render, self.make_action = render_observation, make_action
        self.reset_kwargs = dict(reset_kwargs or {})
        self.episode = TextEpisode(
            instructions, instructions_as, invalid_penalty, invalid_message, max_steps, success
        )
        self.closed = False

    def reset(self) -> list[dict[str, Any]]:
        result = self.client.reset(**self.reset_kwargs)
        return self.episode.start(self.render(result.observation))

    def step(self, action: str) -> StepResult:
        self.episode.check_live()
        parsed = self.make_action(action)
        if parsed is None:
            return self._ended(self.episode.invalid("unparsed"))
        try:
            result = self.client.step(parsed)
        except RuntimeError as err:
            if VALIDATION_ERROR not in str(err):
                raise
            return self._ended(self.episode.invalid("rejected"))
        reward = 0.0 if result.reward is None else float(result.reward)
        metadata = getattr(result.observation, "metadata", None)
        info = dict(metadata) if isinstance(metadata, dict) else {}
        text = self.render(result.observation)
        return self._ended(self.episode.moved(text, reward, bool(result.done), False, info))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.close()

    def _ended(self, result: StepResult) -> StepResult:
        if result.done:
            self.close()
        return result
