"""An unmodified agent program as an environment: `task: gateway` runs the user's agent script,
written against the official `openai` client, once per episode, and the policy answers its calls.

    my_agent:
      task: gateway
      agent: agents/my_agent.py        # a Python script; its own process per episode
      data: rows.jsonl                 # one row per problem, handed to the agent
      rewards: [my_rewards.py:solved]  # TRL's signature: graded on the agent's last answer
      agent_timeout: 30                # seconds the agent may take before each call (and to exit)

Each episode starts the script as `python agent.py` (working directory: the recipe's folder) with
`OPENAI_BASE_URL` pointing at a gateway server of its own on 127.0.0.1 (`temper.gateway.server`,
the episode named in the path), `OPENAI_API_KEY` set, and its row as JSON on stdin and in
`TEMPER_ROW`. So `OpenAI()` with no arguments talks to the policy.

How a call becomes a turn of the agent loop (`rollout/loop.py`): the first call's `messages`
(and `tools`) are what `reset` returns; each later call answers the previous turn: `step(action)`
sends the sampled turn back as the call's response (its `<tool_call>` blocks as OpenAI
`tool_calls`) and waits for the agent's next call, whose messages after the conversation so far
(the tool results) are the step's `messages`. The loop samples every turn in its batched sampler
call and appends the sampled ids verbatim; the assistant turn the agent echoes back is rendered
from the model's own text (matched by `openai_format.assistant_key`), never from the client's
re-serialisation, and the loop's prefix check still refuses a template that would re-tokenise.
The episode ends when the agent exits: exit status 0 is graded by the task's reward functions on
the last answer the agent received; any other status, or no call nor exit within `agent_timeout`
(the process is then killed), ends it as an env_error naming the script, the problem, and the
tail of its stderr.

A call whose history does not extend the conversation the loop recorded (the agent rewrote,
dropped or summarised earlier turns, or changed its tools) is the step's `history`: the loop
renders it and, when its tokens do not extend the episode's, starts a new row of the trajectory
with that rendering as the row's prompt (`Trajectory.rows`), never a re-tokenisation of what
was sampled into a trained row. The episode goes on from there; the trainer makes each row a
batch row of its own, every row with the episode's advantage (`train/rollouts.to_batch`), and
counts the rows (`gateway/segments_per_episode`, `gateway/rewrites`). The `Recorder` of
`temper gateway` splits its rows by the same rule.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper import guard
from temper.envs.base import Env, StepResult
from temper.gateway.bridge import Bridge
from temper.gateway.openai_format import (
    BadRequest,
    assistant_key,
    chat_messages,
    chat_response,
    tools_of_request,
)
from temper.gateway.server import GatewayServer
from temper.tasks.base import Problem, TaskOptionError
from temper.tasks.dataset_task import DataTask, DataTaskConfig

STDERR_TAIL = 400
"""Characters of the agent's stderr a failure line quotes."""


@dataclass(frozen=True)
class GatewayTaskConfig(DataTaskConfig):
    agent: str | None = None
    """The agent: a Python script (relative to the recipe's folder) that talks to the policy with
    the `openai` client (`OpenAI()` reads the gateway's address from OPENAI_BASE_URL)."""
    agent_timeout: float = 30.0
    """Seconds the agent may take before its next call (or its exit); then it is killed."""


class GatewayTask(DataTask):
    """The user's openai-client agent script, run once per episode against the gateway
    (docs/gateway.md): the `dataset` task's options, plus `agent` and `agent_timeout`."""

    config_type = GatewayTaskConfig

    def __init__(self, config: GatewayTaskConfig, name: str = "gateway", base_dir: Path | None = None):
        super().__init__(config, name, base_dir)
        if not config.agent:
            raise TaskOptionError(
                ("agent",), f"task {name!r}: a gateway task needs `agent` (a Python script)"
            )
        path = Path(config.agent)
        self.agent = path if path.is_absolute() else self.base_dir / path
        if not self.agent.is_file():
            raise TaskOptionError(("agent",), f"task {name!r}: agent script {config.agent} not found")
        for key in ("env", "environment_factory"):
            if getattr(config, key):
                raise TaskOptionError(
                    (key,), f"task {name!r}: a gateway task's episodes are its agent's; drop `{key}`"
                )
        if not config.agent_timeout > 0:
            raise TaskOptionError(("agent_timeout",), f"task {name!r}: agent_timeout must be > 0")
        if config.max_turns < 1:
            raise TaskOptionError(("max_turns",), f"task {name!r}: max_turns must be at least 1")
        self.max_turns = config.max_turns

    def make_env(self, problem: Problem) -> Env:
        return GatewayEnv(self, problem)

    def fingerprint(self) -> str:
        h = hashlib.sha256(super().fingerprint().encode())
        h.update(self.agent.read_bytes())
        return h.hexdigest()[:16]


class GatewayEnv:
    """One run of the agent script as an episode (module docstring)."""

    stop: Sequence[str] = ()

    def __init__(self, task: GatewayTask, problem: Problem):
        self.task, self.problem = task, problem
        self.tools: list[dict[str, Any]] | None = None
        self.label = f"agent {task.config.agent}"
        self.context = f"problem {problem.id}"
        self.bridge: Bridge | None = None
        self.server: GatewayServer | None = None
        self.proc: subprocess.Popen | None = None
        self.stderr: Any = None
        self.conversation: list[dict[str, Any]] = []  # what the loop has rendered so far
        self.served: dict[str, str] = {}  # assistant_key of an answer -> the model's text
        self.last_answer = ""
        self.calls = 0

    def describe(self, method: str) -> str:
        return f"{self.label} ({method}) on {self.context}"

    # --------------------------------------------------------------------------- the episode
    def reset(self) -> list[dict[str, Any]]:
        self.bridge = Bridge("temper-policy", answer_timeout=max(600.0, 4 * self.task.config.agent_timeout))
        self.server = GatewayServer(self.bridge).start()
        row = dict(self.problem.data["row"])
        episode = uuid.uuid4().hex[:12]
        env = os.environ | {
            "OPENAI_BASE_URL": self.server.base_url(episode),
            "OPENAI_API_KEY": "temper-gateway",
            "TEMPER_EPISODE": episode,
            "TEMPER_ROW": json.dumps(row, default=str),
        }
        self.stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.task.agent)],
                cwd=self.task.base_dir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
            )
        except OSError as err:
            raise guard.raised(err, f"starting {self.label}", self.context) from err
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(row, default=str).encode() + b"\n")
            self.proc.stdin.close()
        except OSError:
            pass  # an agent that exited at once: told below
        body = self._next_call()
        if body is None:
            raise self._failure("exited before its first call")
        try:
            messages = chat_messages(body)
            self.tools = tools_of_request(body)
        except BadRequest as err:
            self.bridge.refuse(err)
            raise self._failure(f"made a call temper cannot serve: {err}") from None
        self.conversation = [dict(m) for m in messages]
        return messages

    def step(self, action: str) -> StepResult:
        assert self.bridge is not None
        response = chat_response(self.bridge.model_name, action, "stop", [], [])
        self.served[assistant_key(response["choices"][0]["message"])] = action
        self.bridge.answer(response)
        self.last_answer = action
        self.calls += 1
        self.conversation.append({"role": "assistant", "content": action})
        body = self._next_call()
        if body is None:  # the agent exited 0: its episode is over
            return StepResult(
                done=True, score=self.task.score(self.problem, self.last_answer), signals=self._signals()
            )
        try:
            messages = [self._own_turn(m) for m in chat_messages(body)]
            tools = tools_of_request(body)
        except BadRequest as err:
            self.bridge.refuse(err)
            raise self._failure(f"made a call temper cannot serve: {err}") from None
        n = len(self.conversation)
        if messages[:n] != self.conversation or tools != self.tools or len(messages) == n:
            # a rewritten history: the loop renders it whole (a new row unless its tokens extend)
            self.conversation, self.tools = [dict(m) for m in messages], tools
            return StepResult(history=messages, signals=self._signals())
        new = messages[n:]
        self.conversation += new
        return StepResult(messages=new, signals=self._signals())

    def cut(self, reason: str) -> dict[str, Any]:
        """The loop ended the episode (its turn or token limit): the agent's pending call is
        refused and the agent stopped at `close`."""
        if self.bridge is not None:
            self.bridge.refuse(BadRequest(f"the episode was ended by the trainer ({reason})", 410))
        return {}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
        if self.bridge is not None:
            self.bridge.close()
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None

    # --------------------------------------------------------------------------- helpers
    def _signals(self) -> dict[str, Any]:
        return {"gateway_calls": 1}

    def _own_turn(self, message: dict[str, Any]) -> dict[str, Any]:
        """An assistant turn the agent echoes back, as the model wrote it (token-exact)."""
        if message.get("role") == "assistant":
            text = self.served.get(assistant_key(message))
            if text is not None:
                return {"role": "assistant", "content": text}
        return message

    def _next_call(self) -> dict[str, Any] | None:
        """The agent's next request; None when it exited with status 0 (a failure raised for any
        other exit, and for neither within `agent_timeout`: the agent is then killed)."""
        assert self.bridge is not None and self.proc is not None
        deadline = time.monotonic() + self.task.config.agent_timeout
        while time.monotonic() < deadline:
            body = self.bridge.next_call(0.02)
            if body is not None:
                return body
            rc = self.proc.poll()
            if rc is not None:
                body = self.bridge.next_call(0.0)  # a call that came in as it exited
                if body is not None:
                    return body
                if rc == 0:  # (before its first call: reset says so)
                    return None
                raise self._failure(f"exited with status {rc}")
        self.proc.kill()
        self.proc.wait()
        raise self._failure(
            f"made no call and did not exit within {self.task.config.agent_timeout:g} s (killed)"
        )

    def _failure(self, what: str) -> guard.UserCodeFailure:
        tail = ""
        if self.stderr is not None:
            self.stderr.flush()
            self.stderr.seek(0)
            text = self.stderr.read().decode(errors="replace").strip()
            if text:
                text = " | ".join(line for line in text.splitlines()[-6:] if line.strip())
                tail = "; stderr: " + (text if len(text) <= STDERR_TAIL else "..." + text[-STDERR_TAIL:])
        return guard.UserCodeFailure(f"{self.label} {what} on {self.context}{tail}", "raised")
