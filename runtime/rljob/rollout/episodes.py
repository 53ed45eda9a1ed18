"""Episodes: the model's turns and its environment's replies.

Two drivers share the turn rules below. `run_episodes` (a batch engine, hf): the
first turn samples a group's G responses as a single-turn rollout does (one seed
per group); each episode then goes on by itself: its turn is cut at the
environment's stop text, the environment replies (in a thread of its own, so a
slow tool holds up its episode, not the others' replies), the observation's
tokens are appended, and the next turn is generated from the whole prefix, every
live episode of the batch in one engine call. `episode_group` (a concurrent
engine, vLLM): every episode of a group is a task of its own, each turn a new
request on the episode's whole prefix (the prefix cache keeps its KV), so the
other episodes keep generating while one waits for its tool. An episode ends when
its environment says so, after `max_turns` model turns, or when its response (the
model's tokens and the observations) reaches `budget` tokens (`rollout.
maxNewTokens`: the context check holds for episodes too). With a chat template
the model's end-of-turn token ends its turn, and the reply goes in as the template
writes a tool message (environments/chat.py).

The response of an episode is every token after the prompt; `loss_mask` marks the
model's (1) and the observations' (0); the observations' log-probs are 0 (never
trained on). An environment that raises ends its episode with the error recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from ..environments import Environment, Reply, episode_figures
from ..environments.chat import ChatTurns, observation_ids
from ..inputs.models import turn_end_ids
from ..workflow.versions import VersionChanges, changed
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
    malformed_calls: int = 0  # calls the tool-call parser could not read
    tool_seconds: float = 0.0
    env_reward: float = 0.0  # the environment's rewards, summed over its replies
    # the prefixes of its turns after the first, and of them the tokens the engine's
    # prefix cache held (a concurrent engine that reports it: vLLM)
    later_prefix_tokens: int = 0
    cached_tokens: int | None = None
    tool_spans: list[tuple[float, float]] = field(default_factory=list)  # wall clock
    # the weight version of its tokens (workflow/versions.py), from its turns' (an
    # engine that records them); observations belong to the turn before them
    versions: VersionChanges = field(default_factory=list)

    @property
    def text(self) -> str:
        """What the reward scores (the environment says which turns)."""
        return self.env.scored_text(self.turns)


def cut_at_stop(gen: Generation, stop: str | None, decode: Callable[[list[int]], str],
                ends: Collection[int], room: int) -> tuple[list[int], list[float], str]:
    """A turn's tokens up to and with the first `stop` text (or the end token), at
    most `room` of them, their log-probs and the turn's text, without its end tokens
    (`ends`: the EOS and the others that end a turn) (pure)."""
    ids, logps = list(gen.response_ids)[:room], list(gen.logprobs)[:room]
    if stop and stop in decode(ids):
        # the shortest prefix holding the stop (a longer prefix holds it too)
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if stop in decode(ids[:mid]) else (mid + 1, hi)
        ids, logps = ids[:lo], logps[:lo]
    text = decode([t for t in ids if t not in ends])
    return ids, logps, text


def run_episodes(engine: RolloutEngine, tok, prompts: list[list[int]], rows: list[Mapping],
                 params: SamplingParams, make_env: Callable[[Mapping], Environment],
                 max_turns: int, budget: int) -> list[list[Episode]]:
    """The episodes of each prompt's group (`params.n` each; `rows`: each prompt's
    dataset row, for its environments)."""
    ends, decode = frozenset(turn_end_ids(tok)), tok.decode
    chat = ChatTurns.of(tok, announced_by(make_env))
    groups: list[list[Episode]] = []
    for p, row, seed in zip(prompts, rows, params.prompt_seeds(len(prompts))):
        group = [_start(make_env, row, list(p)) for _ in range(params.n)]
        for k, e in enumerate(group):  # a group's episodes go on from its own seed
            e.seed = None if seed is None else _mix(seed, k)
        groups.append(group)
    episodes = [e for g in groups for e in g]
    # the engine may end a row at the stop text (the environments' one, where they agree)
    stops = {e.env.stop for e in episodes}
    params = replace(params, stop=stops.pop() if len(stops) == 1 else None)
    first = engine.generate(prompts, replace(params, max_new_tokens=budget))
    turn_out = [x for group in first for x in group]
    live = episodes
    with ThreadPoolExecutor(min(8, max(1, len(episodes))),
                            thread_name_prefix="rljob-env") as pool:
        for turn in range(1, max_turns + 1):
            asked = [_add_turn(e, cut_at_stop(g, e.env.stop, decode, ends,
                                              budget - len(e.response_ids)),
                               turn, max_turns, budget, ends, chat, g.versions)
                     for e, g in zip(live, turn_out)]
            replies = list(pool.map(_reply, live, asked))
            for e, reply in zip(live, replies):
                _take(e, reply, budget, tok, chat, ends)
            live = [e for e in live if not e.done]
            if not live:
                break
            seeds = (None if any(e.seed is None for e in live)
                     else tuple(_mix(e.seed, turn) for e in live))
            more = engine.generate([e.prompt_ids + e.response_ids for e in live],
                                   replace(params, n=1, seeds=seeds, max_new_tokens=max(
                                       budget - len(e.response_ids) for e in live)))
            turn_out = [group[0] for group in more]
    return groups


# one turn of one episode, for `episode_group`: (prefix ids, tokens at most, seed,
# stop text) → the model's turn, which may run past the stop (it is cut here)
Turn = Callable[[list[int], int, "int | None", "str | None"], Awaitable[Generation]]


async def episode_group(turn: Turn, tok, prompt: list[int], row: Mapping, n: int,
                        seed: int | None, make_env: Callable[[Mapping], Environment],
                        max_turns: int, budget: int, pool,
                        chat: ChatTurns | None = None) -> list[Episode]:
    """The `n` episodes of one prompt on a concurrent engine: each a task of its
    own, a turn a call of `turn` on its whole prefix; the environments answer in
    `pool` (an executor), so one slow tool never holds up the others. `chat`: the
    tokenizer's chat template's pieces (`ChatTurns.of`), where it has one."""
    loop = asyncio.get_running_loop()
    ends, decode = frozenset(turn_end_ids(tok)), tok.decode

    async def one(e: Episode) -> None:
        for t in range(1, max_turns + 1):
            room = budget - len(e.response_ids)
            seed_t = None if e.seed is None else (e.seed if t == 1 else _mix(e.seed, t - 1))
            prefix = e.prompt_ids + e.response_ids
            gen = await turn(prefix, room, seed_t, e.env.stop)
            if t > 1 and gen.cached_tokens is not None:
                e.later_prefix_tokens += len(prefix)
                e.cached_tokens = (e.cached_tokens or 0) + gen.cached_tokens
            asked = _add_turn(e, cut_at_stop(gen, e.env.stop, decode, ends, room), t,
                              max_turns, budget, ends, chat, gen.versions)
            reply = await loop.run_in_executor(pool, _reply, e, asked)
            _take(e, reply, budget, tok, chat, ends)
            if e.done:
                return

    group = [_start(make_env, row, list(prompt)) for _ in range(n)]
    for k, e in enumerate(group):
        e.seed = None if seed is None else _mix(seed, k)
    await asyncio.gather(*(one(e) for e in group))
    return group


def _add_turn(e: Episode, cut: tuple[list[int], list[float], str], turn: int,
              max_turns: int, budget: int, ends: Collection[int],
              chat: ChatTurns | None = None, versions: VersionChanges | None = None) -> bool:
    """The model's turn (cut at its stop) into the episode, with the versions of its
    tokens (`versions`: the turn's change points, where the engine records them);
    whether its environment is asked to answer it (a turn that leaves the episode
    room to go on: with a chat template an end token ends the model's turn, not the
    episode; without one it ends the episode)."""
    ids, logps, text = cut
    at = len(e.response_ids)
    for p, v, ep in versions or ():
        if p < len(ids) or p == 0:  # a change after the cut made none of its tokens
            e.versions = changed(e.versions, at + p, v, ep)
    e.response_ids += ids
    e.logprobs += logps
    e.loss_mask += [1] * len(ids)
    e.turns.append(text)
    return (turn < max_turns and len(e.response_ids) < budget
            and (chat is not None or not (ids and ids[-1] in ends)))


def announced_by(make_env) -> list[dict] | None:
    """The function schemas the job's prompts announce (its environment's tools)."""
    return [t.schema for t in getattr(make_env, "tools", ())] or None


def _start(make_env, row: Mapping, prompt: list[int]) -> Episode:
    try:
        env = make_env(row)
    except Exception as exc:  # noqa: BLE001 - a user's environment: this episode only
        from ..environments import SingleTurn

        episode = Episode(SingleTurn(row), prompt)
        episode.error = f"the environment failed to start: {type(exc).__name__}: {exc}"
        return episode
    return Episode(env, prompt)


def _reply(e: Episode, asked: bool = True) -> Reply:
    """The environment's reply to the episode's last turn (a tool call's wall-clock
    span recorded with the episode, for the timeline)."""
    if e.error or not asked:  # it never started, or it ends with this turn
        return Reply(done=True)
    t0 = time.time()
    try:
        reply = e.env.step(e.turns[-1])
        if not isinstance(reply, Reply):
            raise TypeError(f"step returned {type(reply).__name__}, not a Reply")
    except Exception as exc:  # noqa: BLE001 - a user's environment: this episode only
        return Reply(done=True, error=f"{type(e.env).__name__}.step: {type(exc).__name__}: "
                                      f"{exc}")
    if not reply.done:  # a call answered
        e.tool_spans.append((t0, time.time()))
    return reply


def _take(e: Episode, reply: Reply, budget: int, tok, chat: ChatTurns | None,
          ends: Collection[int]) -> None:
    """The environment's reply into the episode: its observation (as the chat
    template writes a tool message, where there is one, after the model's end token
    in place of the template's: `ends`), its end (a turn that left no room to go on
    was not asked: its reply is done)."""
    if not reply.done:  # the environment answered the turn's calls
        e.tool_calls += reply.calls
        e.tool_errors += (bool(reply.error) if reply.call_errors is None
                          else reply.call_errors)
        e.malformed_calls += reply.malformed
    elif reply.error:
        e.error = e.error or reply.error
    e.tool_seconds += reply.tool_seconds
    e.env_reward += reply.reward
    if reply.done:
        e.done = True
        return
    obs = observation_ids(tok, chat, list(reply.messages) or reply.observation,
                          bool(e.response_ids) and e.response_ids[-1] in ends)
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
            "malformed_calls": e.malformed_calls,
            "tool_seconds": round(e.tool_seconds, 6), "error": e.error,
            "observation_tokens": e.loss_mask.count(0),
            "env_reward": e.env_reward,
            **({"later_prefix_tokens": e.later_prefix_tokens, "cached_tokens": e.cached_tokens}
               if e.cached_tokens is not None else {})}


def summary(episodes: list[Episode]) -> dict:
    """A batch's episode figures (for its span), as the trainer's step figures."""
    return {"episodes": len(episodes), **episode_figures([episode_record(e) for e in episodes])}


def _mix(seed: int, k: int) -> int:
    """A seed of its own for the k-th of `seed`'s (deterministic: no hash salt)."""
    return (seed * 1_000_003 + k * 7919 + 1) % (2 ** 31 - 1)
