"""The warm-up of a random-init policy: supervised steps on prompt → answer
before the first RL step, its progress in the run directory's warmup.json."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import torch

from ..api.spec import RLJobSpec
from ..infra.rundir import PARTIAL, RunDir
from ..inputs.data import load_examples, prompt_ids
from ..environments import ENVIRONMENTS
from ..environments.chat import ChatTurns, observation_ids
from ..sampling import TokenDistribution
from ..tools.catalog import announced
from .batch import make_batch

log = logging.getLogger("rljob.trainer")


class WarmupStopped(Exception):
    """`stop` was set during the warm-up (SIGTERM): nothing trained to checkpoint yet."""


def warm_up(policy, tok, spec: RLJobSpec, report=None, stop=None) -> float:
    """Supervised steps on prompt → answer (teacher forcing) for random-init models (a
    row's `demonstration`, when it has one: a demonstrated episode, its tool calls and
    their results), on the rows of dataset.warmupPath, else dataset.path;
    `report(step, steps, loss)` hears every tenth step and the last. `stop` (an Event)
    set ends it between two steps with WarmupStopped."""
    steps = spec.model.warmup_steps
    if steps == 0:
        return 0.0
    examples = load_examples(*spec.dataset.for_warmup())  # dataset.warmupPath, else .path
    tools = announced(spec.rollout)
    chat = ChatTurns.of(tok, tools)
    # a turn ends at the end token where the environment has no stop text of its own
    eos_ends_turns = (spec.rollout.episodic
                      and ENVIRONMENTS.get(spec.rollout.environment).stop is None)
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.model.warmup_lr)
    rng = np.random.default_rng(spec.algorithm.seed)
    batch = 64
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        if stop is not None and stop.is_set():
            raise WarmupStopped(f"stopped in the warm-up at step {step - 1}/{steps}")
        picked = rng.choice(len(examples), size=batch)[policy.data_rank::policy.data_world]
        prompts = [prompt_ids(tok, examples[i].prompt, tools) for i in picked]
        taught = [target_ids(tok, chat, examples[i], eos_ends_turns) for i in picked]
        b = make_batch(prompts, [ids for ids, _ in taught], tok.pad_token_id,
                       loss_masks=[mask for _, mask in taught]).to(policy.device)
        logp = policy.logprobs(b, TokenDistribution(vocab=len(tok)))  # the tokenizer's ids
        loss = -(logp * b.loss_mask).sum() / b.loss_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if report is not None and (step % 10 == 0 or step == steps):
            report(step, steps, float(loss.detach()))
    return float(loss.detach())


def target_ids(tok, chat: ChatTurns | None, example, eos_ends_turns: bool = False
               ) -> tuple[list[int], list[int] | None]:
    """What the warm-up teaches for a row, as the response's tokens and their loss
    mask (None: every token counts): its demonstration, else its answer, then the
    end token. A demonstration is a text, or a demonstrated episode as messages
    (`[{"role": "assistant", "content": "<calc>2+3</calc>"}, {"role": "tool",
    "content": "<res>5</res>"}, {"role": "assistant", "content": "5"}]`) joined as
    an episode joins them (the tool messages after a turn as the chat template
    writes them, where the tokenizer has one: environments/chat.py), only the
    assistant's tokens taught. `eos_ends_turns`: the model ends each turn with its
    end token (native tool calls: the environment has no stop text), so that token
    is taught after every assistant turn, as the episode samples it."""
    shown = example.extra.get("demonstration") or example.answer
    if not isinstance(shown, list):
        return tok.encode(str(shown), add_special_tokens=False) + [tok.eos_token_id], None
    ids: list[int] = []
    mask: list[int] = []
    replies: list[str] = []
    ended = eos_ends_turns and chat is not None

    def reply() -> None:  # the environment's reply after the model's turn
        nonlocal ids, mask
        if replies:
            part = observation_ids(tok, chat, list(replies) if len(replies) > 1 else replies[0],
                                   ended)
            ids += part
            mask += [0] * len(part)
            replies.clear()

    for message in shown:
        if message.get("role") == "assistant":
            reply()
            part = tok.encode(str(message.get("content", "")), add_special_tokens=False)
            ids += part
            mask += [1] * len(part)
            if ended and message is not shown[-1]:
                ids.append(tok.eos_token_id)
                mask.append(1)
        else:
            replies.append(str(message.get("content", "")))
    reply()
    return ids + [tok.eos_token_id], mask + [1]


def warmup_reporter(run: RunDir | None):
    """`warm_up`'s report as the run directory's warmup.json (None: nowhere)."""
    if run is None:
        return None
    begun = time.monotonic()

    def report(step: int, steps: int, loss: float) -> None:
        tmp = run.warmup_progress.with_name(run.warmup_progress.name + PARTIAL)
        try:  # seconds: since the warm-up began, for the time it has left
            tmp.write_text(json.dumps({"step": step, "of": steps, "loss": loss,
                                       "seconds": round(time.monotonic() - begun, 2)}))
            tmp.replace(run.warmup_progress)
        except OSError as exc:  # progress only: the warm-up goes on
            log.debug("warm-up progress not written: %s", exc)

    return report
