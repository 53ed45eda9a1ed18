"""Environments: what answers the model's turns of an episode (`rollout.environment`).

An environment starts from a dataset row (its prompt, answer and other keys) and
answers each model turn with a `Reply`: an observation to append (tokenized and
never trained on), whether the episode is done, and an error to record. A turn
ends at the environment's `stop` text (a tool call's closing tag) or at the end
token. `single_turn`, the default, ends every episode after the model's first
turn: one prompt, one response, as a job without an environment runs.
`calculator` lets the model call the calculator tool, `python` run code in the
tool sandbox (tools/sandbox.py). A user's environment is a
`module:Class` (an `Environment` subclass) or one an installed package adds under
the entry point group `rljob.environments`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from ..infra.registry import Registry
from ..tools import TOOLS, Limits


@dataclass(frozen=True)
class Reply:
    observation: str = ""  # appended after the model's turn; '' for none
    done: bool = True
    error: str = ""  # a tool's or the environment's error, recorded with the episode
    tool_seconds: float = 0.0


class Environment(ABC):
    stop: str | None = None  # a model turn ends at this text (else at the end token)

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


CALL = re.compile(r"<calc>(.*?)</calc>\s*$", re.S)


@ENVIRONMENTS.register("calculator")
class Calculator(Environment):
    """The model may call the calculator as `<calc>EXPRESSION</calc>`; the value comes
    back as `<res>VALUE</res>` (`<res>error: ...</res>` for what is not arithmetic). A
    turn without a call ends the episode, and the reward scores that last turn (the
    tool's results are not the model's answer)."""

    stop = "</calc>"
    limits = Limits()

    def step(self, turn: str) -> Reply:
        call = CALL.search(turn)
        if call is None:
            return Reply(done=True)
        result = TOOLS.get("calculator")(call.group(1), self.limits)
        text = result.output if result.ok else f"error: {result.error}"
        return Reply(f"<res>{text}</res>", done=False, error=result.error,
                     tool_seconds=result.seconds)

    def scored_text(self, turns: list[str]) -> str:
        return turns[-1] if turns else ""


PROGRAM = re.compile(r"<py>(.*?)</py>\s*$", re.S)


@ENVIRONMENTS.register("python")
class Python(Environment):
    """The model may run code as `<py>CODE</py>`; what it printed comes back as
    `<out>OUTPUT</out>` (`<out>error: ...</out>` for code that fails or passes a
    sandbox limit: time, memory, output, processes, network). A turn without code ends
    the episode, and the reward scores that last turn."""

    stop = "</py>"
    limits = Limits()
    shown = 512  # characters of a program's output the model reads

    def step(self, turn: str) -> Reply:
        program = PROGRAM.search(turn)
        if program is None:
            return Reply(done=True)
        result = TOOLS.get("python")(program.group(1), self.limits)
        text = result.output[-self.shown:] if result.ok else f"error: {result.error}"
        return Reply(f"<out>{text}</out>", done=False, error=result.error,
                     tool_seconds=result.seconds)

    def scored_text(self, turns: list[str]) -> str:
        return turns[-1] if turns else ""
