"""An MCP server (stdio) whose one tool is the calculator: it computes as the built-in
`calculator` does (rljob.tools.builtin.evaluate) and is announced with the same name,
description and parameter (its schema as the SDK writes it, with titles). A job that
names it in rollout.mcpServers instead of `tools: [calculator]` gives its model the
same tool over MCP. Run it as `python examples/tools/calculator_server.py`; with
MCP_CALCULATOR_LOG set (in the server's `env`), each call appends a line to that file
(the server's pid and the expression)."""

from __future__ import annotations

import os
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from rljob.tools.builtin import evaluate

server = MCPServer("calculator", log_level="ERROR")


@server.tool(description="Evaluate an arithmetic expression: numbers, + - * / // % ** "
             "and parentheses.")
def calculator(expression: Annotated[str, Field(
        description="The expression, e.g. (12 + 7) * 3")]) -> str:
    if os.environ.get("MCP_CALCULATOR_LOG"):
        with open(os.environ["MCP_CALCULATOR_LOG"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {expression}\n")
    try:
        out = evaluate(expression)
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    return repr(out) if isinstance(out, int) else f"{out:.10g}"


if __name__ == "__main__":
    server.run()
