"""Tools an episode's model calls, by name: the built-in `calculator` (arithmetic,
evaluated here without running code) and `python` (the model's code, run in the
sandbox: sandbox.py), and those an installed package adds under the entry point
group `rljob.tools`. A tool is a callable `tool(arguments: str, limits) ->
ToolResult` that never raises for what its arguments are or do."""

from __future__ import annotations

from collections.abc import Callable

from ..infra.registry import Registry
from .sandbox import Limits, ToolResult, run_python

Tool = Callable[[str, Limits], ToolResult]
TOOLS: Registry[Tool] = Registry("tool", None, "rljob.tools")
register_tool = TOOLS.register

from . import builtin  # noqa: E402,F401 - registers the built-in tools

__all__ = ["TOOLS", "Limits", "Tool", "ToolResult", "register_tool", "run_python"]
