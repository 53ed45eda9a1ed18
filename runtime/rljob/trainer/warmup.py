"""The warm-up of a random-init policy: supervised steps on prompt → answer
before the first RL step, its progress in the run directory's warmup.json."""

from __future__ import annotations

import json
import logging

import numpy as np
import torch

from ..api.spec import RLJobSpec
from ..infra.rundir import PARTIAL, RunDir
from ..inputs.data import load_examples, prompt_ids
from ..environments.chat import ChatTurns, observation_ids
from ..sampling import TokenDistribution
from .batch import make_batch

log = logging.getLogger("rljob.trainer")


def warm_up(policy, tok, spec: RLJobSpec, report=None) -> float:
    """Supervised steps on prompt → answer (teacher forcing) for random-init models (a
    row's `demonstration`, when it has one: a demonstrated episode, its tool calls and
    their results); `report(step, steps, loss)` hears every tenth step and the last."""
    steps = spec.model.warmup_steps
    if steps == 0:
        return 0.0
    examples = load_examples(spec.dataset)
    chat = ChatTurns.of(tok)
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.model.warmup_lr)
    rng = np.random.default_rng(spec.algorithm.seed)
    batch = 64
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        picked = rng.choice(len(examples), size=batch)[policy.data_rank::policy.data_world]
        prompts = [prompt_ids(tok, examples[i].prompt) for i in picked]
        taught = [target_ids(tok, chat, examples[i]) for i in picked]
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


def target_ids(tok, chat: ChatTurns | None, example) -> tuple[list[int], list[int] | None]:
    """What the warm-up teaches for a row, as the response's tokens and their loss
    mask (None: every token counts): its demonstration, else its answer, then the
    end token. A demonstration is a text, or a demonstrated episode as messages
    (`[{"role": "assistant", "content": "<calc>2+3</calc>"}, {"role": "tool",
    "content": "<res>5</res>"}, {"role": "assistant", "content": "5"}]`) joined as
    an episode joins them (a tool message as the chat template writes it, where the
    tokenizer has one: environments/chat.py), only the assistant's tokens taught."""
    shown = example.extra.get("demonstration") or example.answer
    if not isinstance(shown, list):
        return tok.encode(str(shown), add_special_tokens=False) + [tok.eos_token_id], None
    ids: list[int] = []
    mask: list[int] = []
    for message in shown:
        if message.get("role") == "assistant":
            part = tok.encode(str(message.get("content", "")), add_special_tokens=False)
            ids += part
            mask += [1] * len(part)
        else:  # the environment's reply after the model's turn (cut at its stop)
            part = observation_ids(tok, chat, str(message.get("content", "")), False)
            ids += part
            mask += [0] * len(part)
    return ids + [tok.eos_token_id], mask + [1]


def warmup_reporter(run: RunDir | None):
    """`warm_up`'s report as the run directory's warmup.json (None: nowhere)."""
    if run is None:
        return None

    def report(step: int, steps: int, loss: float) -> None:
        tmp = run.warmup_progress.with_name(run.warmup_progress.name + PARTIAL)
        try:
            tmp.write_text(json.dumps({"step": step, "of": steps, "loss": loss}))
            tmp.replace(run.warmup_progress)
        except OSError as exc:  # progress only: the warm-up goes on
            log.debug("warm-up progress not written: %s", exc)

    return report
