"""An MCP server (stdio) with one tool over a shipped table: `lookup(city)` gives a
city's population in thousands (examples/data/cities.json). Run it as
`python examples/tools/table_server.py`; an RLJob names it in rollout.mcpServers.
`slow` (seconds) is there for the tests: a call that takes its time."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

TABLE = json.loads((Path(__file__).resolve().parents[1] / "data/cities.json").read_text())
server = MCPServer("table", log_level="ERROR")


@server.tool()
def lookup(city: str) -> str:
    """The population of a city, in thousands.

    Args:
        city: The city's name, as the question writes it.
    """
    if city not in TABLE:
        raise ToolError(f"no city {city!r} in the table")
    return str(TABLE[city])


@server.tool()
def slow(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return f"waited {seconds:g} s"


if __name__ == "__main__":
    server.run()
