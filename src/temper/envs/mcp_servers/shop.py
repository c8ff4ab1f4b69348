"""The shop world's tools (`temper.envs.shop_tools`) served over MCP on stdio, with the official
SDK's `MCPServer` (FastMCP in mcp 1.x):

    python -m temper.envs.mcp_servers.shop [--seed 0] [--items 64]

The tools are the local ones, so the `multi_tool` task gets the same observations either way; a
tool's ValueError (an unknown item, rate id or currency) comes back as the tool error's text."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from temper.envs.shop_tools import world


def build(seed: int = 0, n_items: int = 64) -> MCPServer:
    server = MCPServer("temper-shop")
    for fn in world(seed, n_items).tools():
        server.add_tool(_reported(fn))
    return server


def _reported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its ValueError (the caller's mistake) sent back as the tool error's text: the
    SDK withholds the text of any other exception and says only "Error executing tool ..."."""

    @functools.wraps(fn)
    def tool(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValueError as err:
            raise ToolError(str(err)) from None

    return tool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--items", type=int, default=64)
    args = parser.parse_args()
    build(args.seed, args.items).run("stdio")


if __name__ == "__main__":
    main()
