"""An MCP server (stdio) for the tests of a server that stops answering: `add` answers
at once, `wait(seconds)` takes its time without blocking the server (it still answers
a ping meanwhile), and `hang` blocks the server's event loop for good, as a server
stuck in a call does (it answers nothing after it)."""

from __future__ import annotations

import asyncio
import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("hanging", log_level="ERROR")


@server.tool()
def add(a: int, b: int) -> str:
    """a + b, and the server's pid."""
    return f"{a + b} from {os.getpid()}"


@server.tool()
async def wait(seconds: float) -> str:
    """Wait without blocking the server."""
    await asyncio.sleep(seconds)
    return f"waited {seconds:g} s"


@server.tool()
async def hang() -> str:
    """Block the server's event loop."""
    time.sleep(3600)
    return "never"


if __name__ == "__main__":
    server.run()
