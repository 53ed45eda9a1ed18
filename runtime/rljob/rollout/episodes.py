"""Episodes: the model's turns and its environment's replies, for a batch of groups.

The first turn samples a group's G responses as a single-turn rollout does (one
seed per group). Each episode then goes on by itself: its turn is cut at the
environment's stop text, the environment replies (in a thread of its own, so a
slow tool holds up its episode, not the others' replies), the observation's
tokens are appended, and the next turn is generated from the whole prefix, every
live episode of the batch in one engine call. An episode ends when its
environment says so, after `max_turns` model turns, or when its response (the
model's tokens and the observations) reaches `budget` tokens (`rollout.
maxNewTokens`: the context check holds for episodes too).

The response of an episode is every token after the prompt; `loss_mask` marks the
model's (1) and the observations' (0); the observations' log-probs are 0 (never
trained on). An environment that raises ends its episode with the error recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from ..environments import Environment, Reply, episode_figures
from .engine import Generation, RolloutEngine, SamplingParams

log = logging.getLogger("rljob.rollout")


@dataclass
class Episode:
    env: Environment
    prompt_ids: list[int]
    seed: int | None = None  # its next turns' samples (None: unseeded)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # the model's, as text
    done: bool = False
    error: str = ""
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0

    @property
    def text(self) -> str:
        """What the reward scores (the environment says which turns)."""
        return self.env.scored_text(self.turns)


def cut_at_stop(gen: Generation, stop: str | None, decode: Callable[[list[int]], str],
                eos: int, room: int) -> tuple[list[int], list[float], str]:
    """A turn's tokens up to and with the first `stop` text (or the end token), at
    most `room` of them, their log-probs and the turn's text (pure)."""
    ids, logps = list(gen.response_ids)[:room], list(gen.logprobs)[:room]
    if stop and stop in decode(ids):
        # the shortest prefix holding the stop (a longer prefix holds it too)
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if stop in decode(ids[:mid]) else (mid + 1, hi)
        ids, logps = ids[:lo], logps[:lo]
    text = decode([t for t in ids if t != eos])
    return ids, logps, text


def run_episodes(engine: RolloutEngine, tok, prompts: list[list[int]], rows: list[Mapping],
                 params: SamplingParams, make_env: Callable[[Mapping], Environment],
                 max_turns: int, budget: int) -> list[list[Episode]]:
    """The episodes of each prompt's group (`params.n` each; `rows`: each prompt's
    dataset row, for its environments)."""
    eos = tok.eos_token_id
    decode = tok.decode
    groups: list[list[Episode]] = []
    for p, row, seed in zip(prompts, rows, params.prompt_seeds(len(prompts))):
        group = [_start(make_env, row, list(p)) for _ in range(params.n)]
        for k, e in enumerate(group):  # a group's episodes go on from its own seed
            e.seed = None if seed is None else _mix(seed, k)
        groups.append(group)
    episodes = [e for g in groups for e in g]
    first = engine.generate(prompts, replace(params, max_new_tokens=budget))
    turn_out = [x for group in first for x in group]
    live = episodes
    with ThreadPoolExecutor(min(8, max(1, len(episodes))),
                            thread_name_prefix="rljob-env") as pool:
        for turn in range(1, max_turns + 1):
            cut = [cut_at_stop(g, e.env.stop, decode, eos, budget - len(e.response_ids))
                   for e, g in zip(live, turn_out)]
            for e, (ids, logps, text) in zip(live, cut):
                e.response_ids += ids
                e.logprobs += logps
                e.loss_mask += [1] * len(ids)
                e.turns.append(text)
            # the environment answers a turn that leaves the episode room to go on
            asked = [turn < max_turns and len(e.response_ids) < budget
                     and not (ids and ids[-1] == eos) for e, (ids, _, _) in zip(live, cut)]
            replies = list(pool.map(_reply, live, [c[2] for c in cut], asked))
            going = []
            for e, reply in zip(live, replies):
                _take(e, reply, budget, tok)
                if not e.done:
                    going.append(e)
            live = going
            if not live:
                break
            seeds = (None if any(e.seed is None for e in live)
                     else tuple(_mix(e.seed, turn) for e in live))
            more = engine.generate([e.prompt_ids + e.response_ids for e in live],
                                   replace(params, n=1, seeds=seeds, max_new_tokens=max(
                                       budget - len(e.response_ids) for e in live)))
            turn_out = [group[0] for group in more]
    return groups


def _start(make_env, row: Mapping, prompt: list[int]) -> Episode:
    try:
        env = make_env(row)
    except Exception as exc:  # noqa: BLE001 - a user's environment: this episode only
        from ..environments import SingleTurn

        episode = Episode(SingleTurn(row), prompt)
        episode.error = f"the environment failed to start: {type(exc).__name__}: {exc}"
        return episode
    return Episode(env, prompt)


def _reply(e: Episode, text: str, asked: bool = True) -> Reply:
    if e.error or not asked:  # it never started, or it ends with this turn
        return Reply(done=True)
    try:
        reply = e.env.step(text)
        if not isinstance(reply, Reply):
            raise TypeError(f"step returned {type(reply).__name__}, not a Reply")
        return reply
    except Exception as exc:  # noqa: BLE001 - a user's environment: this episode only
        return Reply(done=True, error=f"{type(e.env).__name__}.step: {type(exc).__name__}: "
                                      f"{exc}")


def _take(e: Episode, reply: Reply, budget: int, tok) -> None:
    """The environment's reply into the episode: its observation, its end (a turn
    that left no room to go on was not asked: its reply is done)."""
    if not reply.done:  # the environment answered a call
        e.tool_calls += 1
        e.tool_errors += bool(reply.error)
    elif reply.error:
        e.error = e.error or reply.error
    e.tool_seconds += reply.tool_seconds
    if reply.done:
        e.done = True
        return
    obs = tok.encode(reply.observation, add_special_tokens=False)
    room = budget - len(e.response_ids)
    if len(obs) >= room:  # no room left for the model to answer
        e.done = True
        return
    e.response_ids += obs
    e.logprobs += [0.0] * len(obs)
    e.loss_mask += [0] * len(obs)


def episode_record(e: Episode) -> dict:
    """What the row carries of its episode (the trainer's step figures sum them)."""
    return {"turns": len(e.turns), "tool_calls": e.tool_calls, "tool_errors": e.tool_errors,
            "tool_seconds": round(e.tool_seconds, 6), "error": e.error,
            "observation_tokens": e.loss_mask.count(0)}


def summary(episodes: list[Episode]) -> dict:
    """A batch's episode figures (for its span), as the trainer's step figures."""
    return {"episodes": len(episodes), **episode_figures([episode_record(e) for e in episodes])}

def _mix(seed: int, k: int) -> int:
    """A seed of its own for the k-th of `seed`'s (deterministic: no hash salt)."""
    return (seed * 1_000_003 + k * 7919 + 1) % (2 ** 31 - 1)
