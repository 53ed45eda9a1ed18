"""A job's tools: those `rollout.tools` names (functions.py) and those its
`rollout.mcpServers` serve (mcp.py), and the schemas its prompts announce."""

from __future__ import annotations

from .functions import FunctionTool, resolve


def job_tools(rollout) -> list[FunctionTool]:
    """A job's tools: `rollout.tools`, then those its `rollout.mcpServers` serve
    (each server started once in this process: mcp.py)."""
    tools = resolve(rollout.tools)
    if rollout.mcp_servers:
        from .mcp import server_for

        for server in rollout.mcp_servers:
            tools += server_for(server).tools()
        names = [t.name for t in tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"rollout.mcpServers: two tools are named {twice[0]!r}; a "
                             "model calls tools by name (list the ones to use in the "
                             "server's tools)")
    return tools


def announced(rollout) -> list[dict] | None:
    """The schemas of a job's tools, as a chat template's `tools=` announces them
    (None: no tools)."""
    if not (rollout.tools or rollout.mcp_servers):
        return None
    return [t.schema for t in job_tools(rollout)]
