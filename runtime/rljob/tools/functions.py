"""Tools as functions the model calls by name, announced by OpenAI-style function
schemas (`{"type": "function", "function": {"name", "description", "parameters"}}`)
through the chat template's `tools=`.

A job lists them in `rollout.tools`: a built-in (`calculator`, `python`), one an
installed package adds under the entry point group `rljob.function_tools`, or a
Python function (`module:function`, `path/to/file.py:function`) whose schema comes
from its signature and docstring (transformers' `get_json_schema`: type hints,
Google-style `Args:`). A function's result is the tool message's content; what it
raises is an error message to the model, never a crash. The checks on a schema
(`schema_problems`) are pure.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..infra.registry import Registry
from .sandbox import Limits, ToolResult, run_python

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name


@dataclass(frozen=True)
class FunctionTool:
    """A tool the model calls with JSON arguments: its schema and what runs it
    (`run(arguments, limits) -> ToolResult`, never raising)."""
    schema: dict
    run: Callable[[dict, Limits], ToolResult]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    def __call__(self, arguments: dict, limits: Limits = Limits()) -> ToolResult:
        missing = [k for k in self.schema["function"].get("parameters", {}).get("required", ())
                   if k not in arguments]
        if missing:
            return ToolResult("", f"{self.name}: missing argument "
                              f"{', '.join(repr(k) for k in missing)}", 0.0)
        return self.run(arguments, limits)


def schema_problems(schema) -> list[str]:
    """What keeps `schema` from being a function schema a chat template announces
    (pure; empty when it is one)."""
    if not isinstance(schema, Mapping) or schema.get("type") != "function":
        return ['it is not {"type": "function", "function": {...}}']
    fn = schema.get("function")
    if not isinstance(fn, Mapping):
        return ['"function" is not an object']
    problems = []
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        problems.append(f"function.name {name!r} is not 1-64 letters, digits, _ or -")
    if not isinstance(fn.get("description", ""), str):
        problems.append("function.description is not a string")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or params.get("type") != "object":
        problems.append('function.parameters is not a JSON schema of "type": "object"')
    else:
        props = params.get("properties", {})
        if not isinstance(props, Mapping):
            problems.append("function.parameters.properties is not an object")
            props = {}
        for key in params.get("required", ()):
            if key not in props:
                problems.append(f"function.parameters.required names {key!r}, not a property")
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        problems.append(f"it is not JSON: {exc}")
    return problems


def from_function(fn: Callable) -> FunctionTool:
    """A Python function as a tool: its schema from its signature and docstring,
    called with the model's arguments as keywords; its result as text."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers' DocstringParsingException, ...
        raise ValueError(f"no function schema from {getattr(fn, '__name__', fn)!r}: "
                         f"{' '.join(str(exc).split())} (give it type hints and a "
                         "docstring with an Args: section)") from None
    schema["function"].pop("return", None)
    schema.pop("return", None)
    accepts = set(inspect.signature(fn).parameters)

    def run(arguments: dict, limits: Limits) -> ToolResult:
        started = time.monotonic()
        unknown = sorted(set(arguments) - accepts)
        if unknown:
            return ToolResult("", f"{fn.__name__}: no argument "
                              f"{', '.join(repr(k) for k in unknown)}", 0.0)
        try:
            out = fn(**arguments)
        except Exception as exc:  # noqa: BLE001 - a user's tool: an error to the model
            return ToolResult("", f"{type(exc).__name__}: {exc}", time.monotonic() - started)
        text = out if isinstance(out, str) else json.dumps(out, default=str)
        return ToolResult(text, "", time.monotonic() - started)

    return FunctionTool(schema, run)


FUNCTION_TOOLS: Registry[FunctionTool] = Registry("rollout.tools", None,
                                                  "rljob.function_tools")


def _builtin(name: str, description: str, argument: str, about: str,
             run: Callable[[str, Limits], ToolResult]) -> FunctionTool:
    schema = {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {argument: {
            "type": "string", "description": about}}, "required": [argument]}}}
    return FUNCTION_TOOLS.register(name)(FunctionTool(
        schema, lambda arguments, limits: run(str(arguments[argument]), limits)))


def _register_builtins() -> None:
    from .builtin import calculator, python

    _builtin("calculator", "Evaluate an arithmetic expression: numbers, + - * / // % ** "
             "and parentheses.", "expression", "The expression, e.g. (12 + 7) * 3",
             calculator)
    _builtin("python", "Run a Python program in a sandbox and read what it prints.",
             "code", "The program; print what you want to read.", python)


_register_builtins()


def resolve(names: list[str]) -> list[FunctionTool]:
    """The tools `names` name (rollout.tools): a registered one as it is, a Python
    function made one (`from_function`); a ValueError naming the field otherwise."""
    tools, seen = [], set()
    for name in names:
        thing = FUNCTION_TOOLS.get(name)
        tool = thing if isinstance(thing, FunctionTool) else from_function(thing)
        problems = schema_problems(tool.schema)
        if problems:
            raise ValueError(f"rollout.tools {name!r}: its schema: {'; '.join(problems)}")
        if tool.name in seen:
            raise ValueError(f"rollout.tools: two tools are named {tool.name!r}; a model "
                             "calls tools by name")
        seen.add(tool.name)
        tools.append(tool)
    return tools


__all__ = ["FUNCTION_TOOLS", "FunctionTool", "from_function", "resolve", "run_python",
           "schema_problems"]
