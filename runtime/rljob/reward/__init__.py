"""Rewards: built-in verifiers and the plug-in point for custom functions.

`reward.name` in the spec is a built-in name or an importable `module:function`
called as fn(prompt, response, answer) -> float. A reward that raises for one
sample scores that sample 0.0 and the error is reported with it; it never
stops the job.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .builtin import BUILTINS

RewardFn = Callable[[str, str, str], float]


@dataclass(frozen=True)
class Scored:
    score: float
    error: str = ""


def get_reward(name: str) -> RewardFn:
    if name in BUILTINS:
        return BUILTINS[name]
    if ":" not in name:
        raise ValueError(f"unknown reward {name!r}: use one of {sorted(BUILTINS)} or "
                         "'module:function'")
    module_name, func_name = name.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a user's module: missing, or broken on import
        raise ValueError(f"reward {name!r}: cannot import {module_name!r} "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {module_name} has no function {func_name!r}")
    return fn


def score_all(fn: RewardFn, prompts: Sequence[str], responses: Sequence[str],
              answers: Sequence[str]) -> list[Scored]:
    out = []
    for p, r, a in zip(prompts, responses, answers):
        try:
            out.append(Scored(float(fn(p, r, a))))
        except Exception as exc:  # a user's reward: report it with the sample
            out.append(Scored(0.0, f"{type(exc).__name__}: {exc}"))
    return out
