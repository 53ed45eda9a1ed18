"""Environments: what answers the model's turns of an episode (`rollout.environment`).

An environment starts from a dataset row (its prompt, answer and other keys) and
answers each model turn with a `Reply`: an observation to append (tokenized and
never trained on), whether the episode is done, a reward for the turn (summed
over the episode and added to the job's reward of its scored text) and an error
to record. A turn
ends at the environment's `stop` text (a tool call's closing tag) or at the end
token. `single_turn`, the default, ends every episode after the model's first
turn: one prompt, one response, as a job without an environment runs.
`calculator` lets the model call the calculator tool, `python` run code in the
tool sandbox (tools/sandbox.py), both with tags of their own. `tools` speaks the
model's own tool calls: the job's `rollout.tools` (function schemas, announced by
the chat template's `tools=`) are called as the `rollout.toolParser` reads the
model's turn, each call answered by a tool message in order. Every environment
class a job runs sees the job's tools and parser as `self.tools` and
`self.parser` (`environment_factory`). A user's environment is a
`module:Class` (an `Environment` subclass) or one an installed package adds under
the entry point group `rljob.environments`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from ..infra.registry import Registry
from ..tools import TOOLS, Limits
from ..tools.functions import FunctionTool
from ..tools.parsers import CallError, ToolParser


@dataclass(frozen=True)
class Reply:
    observation: str = ""  # appended after the model's turn; '' for none
    done: bool = True
    error: str = ""  # a tool's or the environment's error, recorded with the episode
    tool_seconds: float = 0.0
    # the environment's reward for this turn: an episode's rewards are summed and
    # added to what the job's reward gives its scored text
    reward: float = 0.0
    # tool messages, one per call of the turn in order (in place of `observation`)
    messages: tuple[str, ...] = ()
    calls: int = 1  # the calls this reply answers (done: none)
    call_errors: int | None = None  # of them, those that failed (None: 1 with an error)
    malformed: int = 0  # of them, those the parser could not read


def episode_figures(records: list[dict]) -> dict:
    """Figures of episodes from their records (`rollout.episodes.episode_record`):
    turns, tool calls and their errors, tool seconds, episodes ended by an
    environment error, observation tokens, the environments' rewards and (an engine
    with a prefix cache) the share of later turns' prefixes it held; none without
    records."""
    if not records:
        return {}
    n = len(records)
    return {"turns_mean": sum(e["turns"] for e in records) / n,
            "turns_max": max(e["turns"] for e in records),
            "tool_calls": sum(e["tool_calls"] for e in records),
            "tool_errors": sum(e["tool_errors"] for e in records),
            "malformed_calls": sum(e.get("malformed_calls", 0) for e in records),
            "tool_seconds": sum(e["tool_seconds"] for e in records),
            "episode_errors": sum(bool(e["error"]) for e in records),
            "observation_tokens": sum(e["observation_tokens"] for e in records),
            "env_reward_mean": sum(e.get("env_reward", 0.0) for e in records) / n,
            **_prefix_cache(records)}


def _prefix_cache(records: list[dict]) -> dict:
    """The share of later turns' prefixes the engine's prefix cache held (engines
    that report it)."""
    later = [e for e in records if e.get("cached_tokens") is not None]
    prefix = sum(e["later_prefix_tokens"] for e in later)
    return {"prefix_cache_hit": sum(e["cached_tokens"] for e in later) / prefix} if prefix else {}


class Environment(ABC):
    stop: str | None = None  # a model turn ends at this text (else at the end token)
    tools: tuple[FunctionTool, ...] = ()  # the job's rollout.tools
    parser: ToolParser | None = None  # the job's rollout.toolParser

    def __init__(self, row: Mapping):
        self.row = row  # the dataset row: prompt, answer and its other keys

    @abstractmethod
    def step(self, turn: str) -> Reply:
        """The reply to the model's turn `turn` (its text, the stop text included)."""

    def scored_text(self, turns: list[str]) -> str:
        """What the job's reward scores: the model's turns (default: all of them)."""
        return "".join(turns)


ENVIRONMENTS: Registry[type[Environment]] = Registry("rollout.environment", Environment,
                                                     "rljob.environments")


@ENVIRONMENTS.register("single_turn")
class SingleTurn(Environment):
    """One prompt, one response."""

    def step(self, turn: str) -> Reply:
        return Reply(done=True)


class ToolEnvironment(Environment):
    """A turn that ends in a call (`call`ARGUMENTS`stop`) runs the tool named `tool`
    and the result comes back between `reply_open` and `reply_close` (`error: ...`
    for a failed call); a turn without a call ends the episode, and the reward scores
    that last turn (the tool's results are not the model's answer)."""

    tool: str
    call: str
    reply_open: str
    reply_close: str
    limits = Limits()
    shown = 512  # characters of a result the model reads (its end)

    def step(self, turn: str) -> Reply:
        turn = turn.rstrip()
        _, found, arguments = turn.removesuffix(self.stop).rpartition(self.call)
        if not (found and turn.endswith(self.stop)):
            return Reply(done=True)
        result = TOOLS.get(self.tool)(arguments, self.limits)
        text = result.output[-self.shown:] if result.ok else f"error: {result.error}"
        return Reply(f"{self.reply_open}{text}{self.reply_close}", done=False,
                     error=result.error, tool_seconds=result.seconds)

    def scored_text(self, turns: list[str]) -> str:
        return turns[-1] if turns else ""


@ENVIRONMENTS.register("calculator")
class Calculator(ToolEnvironment):
    """`<calc>EXPRESSION</calc>` → `<res>VALUE</res>` (`<res>error: ...</res>` for what
    is not arithmetic)."""

    tool, call, stop = "calculator", "<calc>", "</calc>"
    reply_open, reply_close = "<res>", "</res>"


@ENVIRONMENTS.register("python")
class Python(ToolEnvironment):
    """`<py>CODE</py>` → `<out>OUTPUT</out>` (`<out>error: ...</out>` for code that fails
    or passes a sandbox limit: time, memory, output, processes, network)."""

    tool, call, stop = "python", "<py>", "</py>"
    reply_open, reply_close = "<out>", "</out>"


@ENVIRONMENTS.register("tools")
class ToolCalling(Environment):
    """The model's own tool calls: a turn the parser finds calls in gets one tool
    message per call, in order (the tool's result, its end when longer than
    `shown` characters; `error: ...` for a call the parser could not read, a tool
    the job does not have, or a tool that failed); a turn without a call ends the
    episode, and the reward scores that last turn."""

    limits = Limits()
    shown = 512

    def step(self, turn: str) -> Reply:
        calls = self.parser.parse(turn) if self.parser is not None else []
        if not calls:
            return Reply(done=True)
        by_name = {t.name: t for t in self.tools}
        messages, errors, malformed, seconds = [], [], 0, 0.0
        for call in calls:
            if isinstance(call, CallError):
                malformed += 1
                error = call.message
            elif call.name not in by_name:
                error = (f"no tool is named {call.name!r}: call one of "
                         f"{', '.join(sorted(by_name))}")
            else:
                result = by_name[call.name](call.arguments, self.limits)
                seconds += result.seconds
                error = result.error
                if result.ok:
                    messages.append(result.output[-self.shown:])
                    continue
            errors.append(error)
            messages.append(f"error: {error}")
        return Reply(messages=tuple(messages), done=False, error="; ".join(errors),
                     tool_seconds=seconds, calls=len(calls), call_errors=len(errors),
                     malformed=malformed)

    def scored_text(self, turns: list[str]) -> str:
        return turns[-1] if turns else ""


def environment_factory(name: str, tools: list[FunctionTool] | tuple = (),
                        parser: str = "hermes") -> type[Environment]:
    """The environment class `name` (rollout.environment) with the job's tools and
    tool-call parser as its `tools` and `parser`; a ValueError naming the field for
    what is not available."""
    from ..tools.parsers import TOOL_PARSERS

    cls = ENVIRONMENTS.get(name)
    if not tools:
        if cls is ToolCalling:
            raise ValueError("rollout.environment 'tools' answers the calls of "
                             "rollout.tools: list the tools the model may call")
        return cls
    return type(cls.__name__, (cls,), {"tools": tuple(tools), "__module__": cls.__module__,
                                       "parser": TOOL_PARSERS.get(parser)()})
