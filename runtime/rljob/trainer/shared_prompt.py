"""Shared-prompt attention for GRPO (Periodic Asynchrony §4.3).

A GRPO group is one prompt and G responses. Instead of G sequences that each
repeat the prompt, pack one: [prompt][response 1]…[response G]. A block mask
lets every response attend to the prompt and to its own earlier tokens only,
and each response's positions restart where the prompt ends, so every token
sees exactly the context it would see alone: the log-probs (and gradients) are
those of the unshared computation, while the prompt is encoded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SharedPromptBatch:
    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    attention_mask: torch.Tensor  # [1, 1, L, L] additive: 0 attend, -inf masked
    # for response r, token j: the packed position whose logits predict it
    predictors: list[torch.Tensor]
    targets: list[torch.Tensor]


def pack_group(prompt: list[int], responses: list[list[int]], dtype=torch.float32
               ) -> SharedPromptBatch:
    p = len(prompt)
    ids = list(prompt)
    pos = list(range(p))
    spans = []
    for r in responses:
        start = len(ids)
        ids += r
        pos += range(p, p + len(r))
        spans.append((start, len(r)))
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
    predictors, targets = [], []
    for start, length in spans:
        allowed[start:start + length, :p] = True  # the shared prompt
        allowed[start:start + length, start:start + length] = torch.tril(
            torch.ones(length, length, dtype=torch.bool))
        # token j of this response is predicted by the position before it: the
        # prompt's last token for j = 0, else the response's own previous token
        predictors.append(torch.tensor([p - 1] + list(range(start, start + length - 1))))
        targets.append(torch.tensor(ids[start:start + length]))
    mask = torch.zeros(n, n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return SharedPromptBatch(torch.tensor([ids]), torch.tensor([pos]), mask[None, None],
                             predictors, targets)


def shared_prompt_logprobs(model, batch: SharedPromptBatch) -> list[torch.Tensor]:
    """Per response, the log-probs of its tokens, from one packed forward pass."""
    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                   attention_mask=batch.attention_mask).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return [logp[pred].gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            for pred, tgt in zip(batch.predictors, batch.targets)]
