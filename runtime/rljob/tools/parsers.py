"""Tool-call parsers: the calls in a model's turn, as its family writes them
(`rollout.toolParser`).

- `hermes` (Qwen2.5, Qwen3 and the models trained on Hermes' format): each call a
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block, several in one
  turn answered in order;
- `llama3_json` (Llama 3.1 / 3.2): the turn is a JSON object `{"name": ...,
  "parameters": {...}}` (`arguments` is read too), after an optional
  `<|python_tag|>`; several objects are separated by `;`.

A parser is pure: `parse(text)` gives the turn's calls in order, a call it cannot
read as an error message in its place (the model reads it as that call's tool
message, and the step counts it), never an exception. A turn with no call ends the
episode. A user's parser is a `ToolParser` subclass: installed under the entry
point group `rljob.tool_parsers`, or named as `module:Class` /
`path/to/file.py:Class`.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..infra.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CallError:
    """A call the parser could not read: what the model is told."""
    message: str


class ToolParser(ABC):
    @abstractmethod
    def parse(self, text: str) -> list[ToolCall | CallError]:
        """The calls in a model's turn `text`, in order (empty: no call)."""


TOOL_PARSERS: Registry[type[ToolParser]] = Registry("rollout.toolParser", ToolParser,
                                                    "rljob.tool_parsers")


def call_from_json(raw: str, n: int, arguments_keys=("arguments",)) -> ToolCall | CallError:
    """Call `n` (1-based) of a turn from its JSON text (pure)."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        return CallError(f"tool call {n} is not JSON ({exc.msg} at character {exc.pos}): "
                         'write {"name": ..., "arguments": {...}}')
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError(f'tool call {n} has no "name": write {{"name": ..., '
                         '"arguments": {...}}')
    args = next((obj[k] for k in arguments_keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return CallError(f"tool call {n} ({obj['name']}): its arguments are not an object")
    return ToolCall(obj["name"], args)


@TOOL_PARSERS.register("hermes")
class Hermes(ToolParser):
    BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str) -> list[ToolCall | CallError]:
        return [call_from_json(m.group(1).strip(), n)
                for n, m in enumerate(self.BLOCK.finditer(text), 1)]


@TOOL_PARSERS.register("llama3_json")
class Llama3Json(ToolParser):
    TAG = "<|python_tag|>"

    def parse(self, text: str) -> list[ToolCall | CallError]:
        body = text.strip()
        tagged = body.startswith(self.TAG)
        body = body.removeprefix(self.TAG).strip()
        if not (tagged or body.startswith("{")):
            return []  # an answer, not a call
        calls: list[ToolCall | CallError] = []
        decoder, at, n = json.JSONDecoder(), 0, 0
        while at < len(body):
            n += 1
            try:
                _, end = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                calls.append(call_from_json(body[at:], n, ("parameters", "arguments")))
                break
            calls.append(call_from_json(body[at:end], n, ("parameters", "arguments")))
            at = end
            rest = body[at:].lstrip()
            if not rest.startswith(";"):
                if rest:  # text after the calls
                    calls.append(CallError(f"text after tool call {n}: separate calls "
                                           "with ;"))
                break
            at = len(body) - len(rest) + 1
            at = len(body) - len(body[at:].lstrip())
        return calls
