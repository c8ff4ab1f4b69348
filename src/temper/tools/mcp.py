"""Tools from any MCP server (the official `mcp` Python SDK, stdio transport), called through the
same registry as local tools (`temper.tools.registry`). Needs the `mcp` extra.

    server = MCPConnection("python", ["-m", "temper.envs.mcp_servers.shop"])
    registry = CostRegistry().add(server.tools(), costs={"quote": 0.2}, requires={"convert": ["rate"]})
    ...
    server.close()                       # also at interpreter exit

MCP has no fields for costs or dependencies, so they come from the caller (a recipe).

Why a thread: the SDK is async and an env's `step` is sync, run from the agent loop's worker
threads. Each connection owns one event loop in a daemon thread; one task there enters the SDK's
context managers (`stdio_client`, `ClientSession`), which anyio requires to be exited by the task
that entered them, and waits for `close`. Calls from any thread are scheduled onto that loop with
`run_coroutine_threadsafe` (a `ClientSession` serves concurrent requests) and waited for with a
timeout.

Failures: a tool's own error (the result's `is_error`) is the model's business, raised as
`ToolFailed` with the server's text, so the registry shows it as an error observation. A server
that exits, times out, or answers with a protocol error raises `ToolServerError`: an
infrastructure failure, which ends the episode as env_error (never a zero reward), counted and
printed by the RL run (`temper.train.user_code`). Every such message names the server (its
command line) and ends with the last lines the server wrote to its stderr, which is kept in a
temporary file (the server's log lines are not printed while it works).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

from temper.guard import last_line
from temper.tools.calls import Tool
from temper.tools.registry import ToolFailed, ToolServerError

CONNECT_TIMEOUT_S = 60.0
STDERR_TAIL = 5
"""Lines of the server's stderr an error message quotes."""


class MCPConnection:
    """One MCP server started as a subprocess and spoken to over stdio (module docstring).

    command: the executable; "python" is the running interpreter, which then also passes on
        PYTHONPATH, so a server module of this checkout imports the same code as the client.
    timeout_s: the longest one call may take before it is an infrastructure failure."""

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float = 30.0,
    ):
        from mcp import StdioServerParameters  # the optional `mcp` extra, only when used

        env = dict(env or {})
        if command == "python":
            command = sys.executable
            if "PYTHONPATH" in os.environ:
                env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
        self.params = StdioServerParameters(command=command, args=list(args), env=env or None, cwd=cwd)
        self.timeout_s = timeout_s
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._closing: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._session: Any = None
        self._errlog = tempfile.TemporaryFile("a+", encoding="utf-8", errors="replace")  # the server's stderr
        self.listed: list[Any] = []  # the server's tools (mcp_types.Tool) as list_tools gave them
        self._thread = threading.Thread(target=self._serve, name=f"mcp:{command}", daemon=True)
        self._thread.start()
        if not self._ready.wait(CONNECT_TIMEOUT_S):
            stderr = self.stderr_tail()
            self.close()
            raise ToolServerError(
                f"MCP server {self._label()} did not start in {CONNECT_TIMEOUT_S:.0f} s{stderr}"
            )
        if self._error is not None:
            stderr = self.stderr_tail()
            self.close()
            raise ToolServerError(
                f"MCP server {self._label()} failed to start: {last_line(self._error)}{stderr}"
            ) from self._error
        atexit.register(self.close)

    def _label(self) -> str:
        return repr(" ".join([self.params.command, *self.params.args]))

    def stderr_tail(self) -> str:
        """'; its stderr: <its last lines>' ('' when it wrote nothing), for an error message."""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            lines = [line.rstrip() for line in self._errlog.read().splitlines() if line.strip()]
        except (OSError, ValueError):  # closed
            return ""
        tail = " | ".join(lines[-STDERR_TAIL:])
        return f"; its stderr: {tail[-600:]}" if tail else "; it wrote nothing to stderr"

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as err:  # reported to the constructor, or to later calls
            self._error = self._error or err
        finally:
            self._ready.set()
            self.loop.close()

    async def _main(self) -> None:
        from mcp import ClientSession, stdio_client

        self._closing = asyncio.Event()
        try:  # the server's log lines are not ours to print: kept for an error message
            async with stdio_client(self.params, errlog=self._errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.listed = await _list_all(session)
                    self._session = session
                    self._ready.set()
                    await self._closing.wait()
        finally:
            self._session = None

    def _run(self, coro: Any, what: str) -> Any:
        if not self.alive:
            coro.close()
            died = f": {last_line(self._error)}" if self._error is not None else ""
            raise ToolServerError(
                f"MCP server {self._label()} is not connected ({what}){died}{self.stderr_tail()}"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.timeout_s)
        except TimeoutError:
            future.cancel()
            raise ToolServerError(
                f"MCP server {self._label()}: {what} timed out after {self.timeout_s} s{self.stderr_tail()}"
            ) from None
        except Exception as err:  # the connection closed, or a JSON-RPC error: not the model's doing
            raise ToolServerError(
                f"MCP server {self._label()}: {what} failed: {last_line(err)}{self.stderr_tail()}"
            ) from err

    @property
    def alive(self) -> bool:
        """The session is open (False after `close`; a server that died shows at the next call)."""
        return self._session is not None and self._thread.is_alive()

    def list_tools(self) -> list[Any]:
        """The server's tools now (`mcp_types.Tool`: name, description, input_schema)."""
        return self._run(_list_all(self._session), "list_tools")

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text of a tool's result; `ToolFailed` with the server's text when the tool reports
        an error; `ToolServerError` when the server does not answer properly."""
        result = self._run(self._session.call_tool(name, arguments), f"call_tool {name!r}")
        text = "\n".join(getattr(c, "text", None) or f"[{c.type} content]" for c in result.content)
        if result.is_error:
            # MCPServer (FastMCP) prefixes the tool's message; the registry names the tool itself
            raise ToolFailed(text.removeprefix(f"Error executing tool {name}: "))
        return text

    def tools(self) -> list[Tool]:
        """The listed tools as registry `Tool`s: the server's input schema as the parameters, a
        call through `call`."""
        return [
            Tool(
                _Caller(self, t.name),
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": (t.description or "").strip(),
                        "parameters": dict(t.input_schema),
                    },
                },
            )
            for t in self.listed
        ]

    def close(self) -> None:
        """End the session and the server process (idempotent; waits for the SDK's shutdown)."""
        if self._closing is not None and self._thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self._closing.set)
            except RuntimeError:  # the serving thread closed its loop since is_alive(): nothing to end
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(CONNECT_TIMEOUT_S)
            errlog = getattr(self, "_errlog", None)
            if errlog is not None and not self._thread.is_alive():
                errlog.close()
        atexit.unregister(self.close)

    def __enter__(self) -> MCPConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Caller:
    """A tool's function: keyword arguments -> the server's text (a class, not a lambda, so the
    name shows in tracebacks)."""

    def __init__(self, connection: MCPConnection, name: str):
        self.connection, self.name = connection, name

    def __call__(self, **arguments: Any) -> str:
        return self.connection.call(self.name, arguments)


async def _list_all(session: Any) -> list[Any]:
    """Every page of `tools/list`."""
    from mcp import types

    tools, cursor = [], None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools
