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
where `Batch.mask` is 1), so the loss and everything after it is unchanged.

The mask is a dense [N, N] additive mask (N: the micro-batch's tokens after
packing), which every attention implementation takes; fine for micro-batches of
a few thousand tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("none", "sequences", "shared_prompt")


@dataclass
class Packed:
    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    attention_mask: torch.Tensor  # [1, 1, N, N] additive: 0 attend, dtype min masked
    predictors: torch.Tensor  # [T]: the packed position whose logits predict token t
    targets: torch.Tensor  # [T]: token t
    rows: torch.Tensor  # [T]: its sample (row of the padded layout)
    cols: torch.Tensor  # [T]: its position in the padded [B, L-1] log-probs

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device) -> Packed:
        return Packed(*(getattr(self, f).to(device) for f in (
            "input_ids", "position_ids", "attention_mask", "predictors", "targets", "rows",
            "cols")))


def segments(prompts: list[list[int]], share: bool) -> list[tuple[list[int], list[int]]]:
    """(prompt, sample indices) per packed segment: one per sample, or with `share`
    one per distinct prompt (its samples in their order)."""
    if not share:
        return [(list(p), [i]) for i, p in enumerate(prompts)]
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_prompt.setdefault(tuple(p), []).append(i)
    return [(list(p), members) for p, members in by_prompt.items()]


def pack(prompts: list[list[int]], responses: list[list[int]], share: bool,
         dtype=torch.float32) -> Packed:
    ids: list[int] = []
    pos: list[int] = []
    blocks: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # (start, P, sample...)
    pred, tgt, rows, cols = [], [], [], []
    for prompt, members in segments(prompts, share):
        start, p = len(ids), len(prompt)
        ids += prompt
        pos += range(p)
        spans = []
        for i in members:
            r = responses[i]
            r_start = len(ids)
            ids += r
            pos += range(p, p + len(r))
            spans.append((r_start, len(r)))
            # token j is predicted by the prompt's last token (j = 0) or response token j-1
            pred += [start + p - 1] + list(range(r_start, r_start + len(r) - 1))
            tgt += r
            rows += [i] * len(r)
            cols += range(p - 1, p - 1 + len(r))  # where make_batch's mask is 1
        blocks.append((start, p, spans))
    n = len(ids)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for start, p, spans in blocks:
        allowed[start:start + p, start:start + p] = torch.tril(
            torch.ones(p, p, dtype=torch.bool))
        for r_start, length in spans:
            allowed[r_start:r_start + length, start:start + p] = True
            allowed[r_start:r_start + length, r_start:r_start + length] = torch.tril(
                torch.ones(length, length, dtype=torch.bool))
    mask = torch.zeros(n, n, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return Packed(as_long([ids]), as_long([pos]), mask[None, None], as_long(pred),
                  as_long(tgt), as_long(rows), as_long(cols))


def packed_logprobs(model, packed: Packed, shape: tuple[int, int]) -> torch.Tensor:
    """log π of every response token from one forward of the packed sequence, in the
    padded layout `shape` ([B, L-1]; zero where no response token is)."""
    logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                   attention_mask=packed.attention_mask).logits[0]
    logp = torch.log_softmax(logits[packed.predictors].float(), dim=-1)
    picked = logp.gather(-1, packed.targets.unsqueeze(-1)).squeeze(-1)
    out = torch.zeros(shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((packed.rows, packed.cols), picked)


def padded_tokens(prompts: list[list[int]], responses: list[list[int]]) -> int:
    """Tokens a right-padded micro-batch computes on (for comparison)."""
    return len(prompts) * max(len(p) + len(r) for p, r in zip(prompts, responses))
