"""Token batches of a micro-step and their log-probs (pure torch).

`make_batch` right-pads prompt+response sequences (or packs them, packing.py);
`token_logprobs` is every response token's log-prob under the sampling
distribution (`rljob.sampling`: the job's temperature and top-p), the quantity
the rollout engines report, so the trainer's and a rollout's log-prob of a token
compare one distribution."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, islice

import numpy as np
import torch

from ..sampling import PLAIN, TokenDistribution, right_padded, sampled_logprobs
from .packing import Packed, pack, packed_logprobs


@dataclass
class TokenBatch:
    """Right-padded prompt+response sequences; `mask` marks response tokens of
    `input_ids[:, 1:]`, `loss_mask` those of them the loss and KL count: the model's
    own (an episode's observation tokens, which its environment wrote, are part of
    the response but never trained on)."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]: 1 where the next token is a response token
    # trainer.packing: the same samples as one packed sequence (packing.py); the
    # log-probs come back in this padded layout
    packed: Packed | None = None
    loss_mask: torch.Tensor | None = None  # [B, L-1]; None: `mask`

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.mask

    def to(self, device) -> TokenBatch:
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device),
                          self.mask.to(device),
                          self.packed.to(device) if self.packed is not None else None,
                          self.loss_mask.to(device))


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               packing: str = "none", loss_masks=None) -> TokenBatch:
    """`loss_masks`: per sample, 1 or 0 for each response token (None: all count)."""
    batch = _padded(prompts, responses, pad_id)
    if loss_masks is not None and any(m is not None for m in loss_masks):
        batch.loss_mask = per_token(batch.mask, loss_masks, fill=batch.mask)
    if packing != "none":
        batch.packed = pack(prompts, responses, share=packing == "shared_prompt",
                            pad_id=pad_id)
    return batch


def per_token(mask: torch.Tensor, rows, fill: torch.Tensor | None = None) -> torch.Tensor:
    """Per-response-token values (a row's, in response order) in the [B, T] layout of
    `mask` (1 on the response positions); a row that is None keeps `fill`'s values
    (default: zeros), and so do the positions off the response (and those past a
    row's last value). The rows' values go to the device in one copy and into place
    in one masked write: no step per row (on an accelerator each was a round trip)."""
    out = fill.clone() if fill is not None else torch.zeros(mask.shape, device=mask.device)
    positions = mask != 0
    counts = positions.sum(1).tolist()
    take = [0 if row is None else min(len(row), c) for row, c in zip(rows, counts)]
    total = sum(take)
    if not total:
        return out
    flat = np.fromiter(chain.from_iterable(islice(row, k) for row, k in zip(rows, take) if k),
                       np.float64, total)
    values = torch.from_numpy(flat).to(device=out.device, dtype=out.dtype)
    # the first `take` response positions of each row, in row-major (response) order
    chosen = positions & (positions.cumsum(1) <= torch.tensor(take, device=mask.device)[:, None])
    out[chosen] = values
    return out


def _padded(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> TokenBatch:
    """Right-padded prompt+response rows, built with numpy in one pass."""
    n = len(prompts)
    lp = np.fromiter(map(len, prompts), np.int64, n)
    ls = lp + np.fromiter(map(len, responses), np.int64, n)
    length = int(ls.max())
    ids, real = right_padded(ls, chain.from_iterable(chain(p, r) for p, r in
                                                     zip(prompts, responses)), length, pad_id)
    before = np.arange(length - 1)[None, :]
    # positions predicting the response tokens
    mask = (before >= (lp - 1)[:, None]) & (before < (ls - 1)[:, None])
    return TokenBatch(torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64)),
                      torch.from_numpy(mask.astype(np.float32)))


def token_logprobs(model, batch: TokenBatch,
                   dist: TokenDistribution = PLAIN) -> torch.Tensor:
    """log π(next token) at every position, under the sampling distribution `dist`:
    [B, L-1].

    Sequences are right-padded, so under causal attention no real token ever
    sees a pad: the padding mask changes nothing where `mask` is 1, and leaving
    it out lets attention take its plain causal path (no 4-D mask built per
    call). A packed batch runs as its one packed sequence (packing.py)."""
    if batch.packed is not None:
        return packed_logprobs(model, batch.packed, tuple(batch.mask.shape), dist)
    logits = model(input_ids=batch.input_ids).logits
    return sampled_logprobs(logits[:, :-1], batch.input_ids[:, 1:], dist)
