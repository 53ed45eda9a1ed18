"""Rewards: built-in verifiers and the plug-in point for custom functions.

`reward.name` in the spec is a built-in name (or one an installed package adds by
entry point, group `rljob.rewards`), an importable `module:function`,
or a file and a function in it, `path/to/reward.py:function` (a relative path is
read from the job file's directory on this machine; in the pods, put the file on
the dataset's PVC and give its path there, `/data/reward.py:score`). The
function is called as fn(prompt, response, answer, **row) -> float, where `row`
holds the dataset row's other keys (a test list, a data source) when the
function asks for them: by name, or all of them with `**kwargs`. A coroutine
function is awaited, a batch's calls concurrently (a remote verifier's latency is
paid once per batch, not once per sample). The rollout scores a batch in its
writer thread, while the next batch generates.

A reward that raises for one sample scores that sample 0.0 and the error is
reported with it; it never stops the job.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..infra.registry import file_part, import_file
from . import builtin  # noqa: F401 - registers the built-in verifiers
from .registry import REWARDS, RewardFn


@dataclass(frozen=True)
class Scored:
    score: float
    error: str = ""


def _number(value) -> float:
    """A reward's value as a float: a number (numpy's too), never a string or None."""
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"the reward returned {type(value).__name__} {value!r:.40}, not a number")


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _load_file(path: Path, name: str):
    if not path.is_file():
        raise ValueError(f"reward {name!r}: {path} is not a file")
    try:
        return import_file(path)
    except Exception as exc:  # noqa: BLE001 - a user's file, broken on import
        raise ValueError(f"reward {name!r}: {path} fails on import ({_one_line(exc)})") from None


def get_reward(name: str, base: Path | None = None) -> RewardFn:
    """The reward function `name` names; a relative file is read from `base`."""
    if ":" not in name:
        if name not in REWARDS:
            raise ValueError(f"unknown reward {name!r}{REWARDS.suggest(name)}: use one of "
                             f"{REWARDS.names()}, "
                             "'module:function' or 'path/to/reward.py:function'")
        return REWARDS.get(name)
    module_name, func_name = name.rsplit(":", 1)
    file = file_part(name)
    if file is not None:
        path = Path(file)
        module = _load_file(path if path.is_absolute() or base is None else base / path, name)
        where = str(path)
    else:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - a user's module: missing, or broken on import
            raise ValueError(f"reward {name!r}: cannot import {module_name!r} "
                             f"({_one_line(exc)}); give a file instead, "
                             f"'path/to/{module_name.split('.')[-1]}.py:{func_name}'"
                             ) from None
        where = module_name
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ValueError(f"reward {name!r}: {where} has no function {func_name!r}")
    return fn


def row_keys(fn: RewardFn) -> Callable[[Mapping], dict]:
    """Which of a row's other keys `fn` takes: those it names, or all (**kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: none
        return lambda row: {}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict
    named = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    named -= {"prompt", "response", "answer"}
    return lambda row: {k: v for k, v in row.items() if k in named}


def score_all(fn: RewardFn, prompts: Sequence[str], responses: Sequence[str],
              answers: Sequence[str], rows: Sequence[Mapping] | None = None) -> list[Scored]:
    """Each sample's reward; `rows`: each sample's dataset row (its other keys)."""
    rows = rows if rows is not None else [{}] * len(prompts)
    extra = row_keys(fn)
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(_score_async(fn, prompts, responses, answers, rows, extra))
    out = []
    for p, r, a, row in zip(prompts, responses, answers, rows):
        try:
            out.append(Scored(_number(fn(p, r, a, **extra(row)))))
        except Exception as exc:  # a user's reward: report it with the sample
            out.append(Scored(0.0, f"{type(exc).__name__}: {exc}"))
    return out


async def _score_async(fn, prompts, responses, answers, rows, extra) -> list[Scored]:
    async def one(p, r, a, row) -> Scored:
        try:
            return Scored(_number(await fn(p, r, a, **extra(row))))
        except Exception as exc:  # a user's reward: report it with the sample
            return Scored(0.0, f"{type(exc).__name__}: {exc}")

    return list(await asyncio.gather(*(one(*x) for x in zip(prompts, responses, answers, rows))))


def try_reward(fn: RewardFn, example) -> str | None:
    """Call `fn` once on a dataset example with its answer as the response (what
    `rljob validate` does): None when it returns a number, else the problem."""
    got = score_all(fn, [example.prompt], [example.answer], [example.answer],
                    [example.extra])[0]
    if got.error:
        return got.error
    return None
