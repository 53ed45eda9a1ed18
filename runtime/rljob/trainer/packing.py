"""A micro-batch as one packed sequence instead of right-padded rows
(`trainer.packing`).

- `sequences`: every sample's prompt + response back to back, each attending to
  itself only (a block-diagonal causal mask, positions restarting per sample):
  no compute on padding, which a micro-batch of mixed lengths is mostly made of.
- `shared_prompt` (Periodic Asynchrony §4.3): the samples of one prompt (a GRPO
  group) share one copy of it: [prompt][response 1]...[response G], every
  response attending to the prompt and to its own earlier tokens, its positions
  continuing where the prompt ends. The prompt is encoded once instead of G times.

Either way every token sees exactly the context it would see in its own padded
row, so the log-probs (and gradients) equal the padded computation's within float
rounding. `packed_logprobs` scatters them back to the padded layout ([B, L-1],
where `TokenBatch.mask` is 1), so the loss and everything after it is unchanged.

Segments are packed into rows ("bins", first-fit decreasing) as long as the
longest segment, so no sequence is split, the attention of a row is no wider than
a padded row's and a micro-batch of mixed lengths takes fewer rows than it has
samples. Each row carries a dense [C, C] additive mask, which every attention
implementation takes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import PLAIN, TokenDistribution, sampled_logprobs

LAYOUTS = ("none", "sequences", "shared_prompt")


@dataclass
class Packed:
    input_ids: torch.Tensor  # [R, C]: R rows (bins) of C positions
    position_ids: torch.Tensor  # [R, C]
    attention_mask: torch.Tensor  # [R, 1, C, C] additive: 0 attend, dtype min masked
    predictors: torch.Tensor  # [T]: the flat position (row·C + column) predicting token t
    targets: torch.Tensor  # [T]: token t
    rows: torch.Tensor  # [T]: its sample (row of the padded layout)
    cols: torch.Tensor  # [T]: its position in the padded [B, L-1] log-probs
    tokens: int = 0  # real tokens packed (the rest of the bins is padding)

    def to(self, device) -> Packed:
        return Packed(*(getattr(self, f).to(device) for f in (
            "input_ids", "position_ids", "attention_mask", "predictors", "targets", "rows",
            "cols")), self.tokens)


def segments(prompts: list[list[int]], share: bool) -> list[tuple[list[int], list[int]]]:
    """(prompt, sample indices) per packed segment: one per sample, or with `share`
    one per distinct prompt (its samples in their order)."""
    if not share:
        return [(list(p), [i]) for i, p in enumerate(prompts)]
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(tuple(p), []).append(i)
    return [(list(p), members) for p, members in by_prompt.items()]


def bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: segment indices per bin of at most `capacity` tokens.
    With the capacity at the longest segment no segment is split and a micro-batch
    of mixed lengths takes far fewer rows than it has samples."""
    out: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True):
        for b, left in enumerate(room):
            if lengths[i] <= left:
                out[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            out.append([i])
            room.append(capacity - lengths[i])
    return out


def pack(prompts: list[list[int]], responses: list[list[int]], share: bool,
         pad_id: int = 0, dtype=torch.float32) -> Packed:
    segs = segments(prompts, share)
    seg_len = [len(p) + sum(len(responses[i]) for i in members) for p, members in segs]
    capacity = max(seg_len)
    layout = bins(seg_len, capacity)
    r_count = len(layout)
    ids = torch.full((r_count, capacity), pad_id, dtype=torch.long)
    pos = torch.zeros((r_count, capacity), dtype=torch.long)
    allowed = torch.zeros((r_count, capacity, capacity), dtype=torch.bool)
    pred, tgt, rows, cols = [], [], [], []
    for row, members_of_row in enumerate(layout):
        at = 0
        for s in members_of_row:
            prompt, members = segs[s]
            p = len(prompt)
            start = at
            ids[row, at:at + p] = torch.tensor(prompt)
            pos[row, at:at + p] = torch.arange(p)
            allowed[row, at:at + p, at:at + p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
            at += p
            for i in members:
                r = responses[i]
                n = len(r)
                ids[row, at:at + n] = torch.tensor(r, dtype=torch.long)
                pos[row, at:at + n] = torch.arange(p, p + n)
                allowed[row, at:at + n, start:start + p] = True  # the (shared) prompt
                allowed[row, at:at + n, at:at + n] = torch.tril(
                    torch.ones(n, n, dtype=torch.bool))
                # token j is predicted by the prompt's last token (j = 0) or token j-1
                flat = row * capacity
                pred += [flat + start + p - 1] + list(range(flat + at, flat + at + n - 1))
                tgt += r
                rows += [i] * n
                cols += range(p - 1, p - 1 + n)  # where make_batch's mask is 1
                at += n
    # a padding position attends to itself only (a row of the mask is never empty)
    idle = ~allowed.any(-1)
    allowed |= torch.diag_embed(idle)
    mask = torch.zeros((r_count, 1, capacity, capacity), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return Packed(ids, pos, mask, as_long(pred), as_long(tgt), as_long(rows), as_long(cols),
                  sum(seg_len))


def packed_logprobs(model, packed: Packed, shape: tuple[int, int],
                    dist: TokenDistribution = PLAIN) -> torch.Tensor:
    """log π of every response token (under the sampling distribution `dist`) from
    one forward of the packed rows, in the padded layout `shape` ([B, L-1]; zero
    where no response token is)."""
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                   attention_mask=packed.attention_mask).logits
    logits = logits.reshape(-1, logits.shape[-1])[packed.predictors]
    picked = sampled_logprobs(logits, packed.targets, dist)
    out = torch.zeros(shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((packed.rows, packed.cols), picked)


def padded_tokens(prompts: list[list[int]], responses: list[list[int]]) -> int:
    """Tokens a right-padded micro-batch computes on (for comparison)."""
    return len(prompts) * max(len(p) + len(r) for p, r in zip(prompts, responses))
