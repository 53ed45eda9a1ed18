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
    opt = torch.optim.AdamW(policy.parameters(), lr=spec.model.warmup_lr)
    rng = np.random.default_rng(spec.algorithm.seed)
    batch = 64
    loss = torch.tensor(0.0)
    for step in range(1, steps + 1):
        picked = rng.choice(len(examples), size=batch)[policy.data_rank::policy.data_world]
        prompts = [prompt_ids(tok, examples[i].prompt) for i in picked]
        answers = [tok.encode(target(examples[i]), add_special_tokens=False)
                   + [tok.eos_token_id] for i in picked]
        b = make_batch(prompts, answers, tok.pad_token_id).to(policy.device)
        logp = policy.logprobs(b, TokenDistribution(vocab=len(tok)))  # the tokenizer's ids
        loss = -(logp * b.mask).sum() / b.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if report is not None and (step % 10 == 0 or step == steps):
            report(step, steps, float(loss.detach()))
    return float(loss.detach())


def target(example) -> str:
    """What the warm-up teaches for a row: its demonstration, else its answer."""
    return str(example.extra.get("demonstration") or example.answer)


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
