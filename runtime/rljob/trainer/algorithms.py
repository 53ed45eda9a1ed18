"""GRPO, written so PPO's critic terms plug in the same way (pure torch).

Per token t of response i: ratio = exp(logp − old_logp); the clipped surrogate
−min(ratio·A_i, clip(ratio, 1 ± ε)·A_i); plus β times the k3 estimate of
KL(π‖π_ref) = exp(ref − logp) − (ref − logp) − 1 (Periodic Asynchrony eq. 3).
A response's loss is its token mean; the step's loss is the sum over responses
divided by the number of responses in the step, so summing micro-batch
gradients gives exactly the full-batch gradient however the step is split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packing import Packed, pack, packed_logprobs


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r − mean of its group) / (std of its group + eps): GRPO's group-relative advantage."""
    adv = torch.empty_like(rewards, dtype=torch.float32)
    for g in torch.unique(groups):
        sel = groups == g
        r = rewards[sel].float()
        std = r.std(unbiased=False) if r.numel() > 1 else torch.tensor(0.0)
        adv[sel] = (r - r.mean()) / (std + eps)
    return adv


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Unbiased, non-negative per-token estimate of KL(π‖π_ref)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


@dataclass
class LossParts:
    loss: torch.Tensor
    pg: float
    kl: float
    clip_frac: float


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor,
              advantages: torch.Tensor, mask: torch.Tensor, clip_ratio: float, kl_coef: float,
              responses_in_step: int) -> LossParts:
    """logp, old_logp, ref_logp, mask: [B, T] over response tokens; advantages: [B]."""
    mask = mask.float()
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(1)
    surrogate = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio) * a)
    kl = k3_kl(logp, ref_logp)
    per_token = surrogate + kl_coef * kl
    tokens = mask.sum(1).clamp(min=1)
    per_response = (per_token * mask).sum(1) / tokens
    loss = per_response.sum() / responses_in_step
    with torch.no_grad():
        clipped = ((ratio - 1).abs() > clip_ratio).float()
        n = mask.sum().clamp(min=1)
        return LossParts(loss, float(((surrogate * mask).sum(1) / tokens).mean()),
                         float((kl * mask).sum() / n), float((clipped * mask).sum() / n))


@dataclass
class Batch:
    """Right-padded prompt+response sequences; `mask` marks response tokens of
    `input_ids[:, 1:]`."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]: 1 where the next token is a response token
    # trainer.packing: the same samples as one packed sequence (packing.py); the
    # log-probs come back in this padded layout
    packed: Packed | None = None

    def to(self, device) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device),
                     self.mask.to(device),
                     self.packed.to(device) if self.packed is not None else None)


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               packing: str = "none") -> Batch:
    batch = _padded(prompts, responses, pad_id)
    if packing != "none":
        batch.packed = pack(prompts, responses, share=packing == "shared_prompt",
                            pad_id=pad_id)
    return batch


def _padded(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> Batch:
    seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), length), dtype=torch.long)
    mask = torch.zeros((len(seqs), length - 1), dtype=torch.float32)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        s = seqs[i]
        ids[i, :len(s)] = torch.tensor(s)
        attn[i, :len(s)] = 1
        mask[i, len(p) - 1:len(s) - 1] = 1  # positions predicting the response tokens
    return Batch(ids, attn, mask)


def token_logprobs(model, batch: Batch) -> torch.Tensor:
    """log π(next token) at every position: [B, L-1].

    Sequences are right-padded, so under causal attention no real token ever
    sees a pad: the padding mask changes nothing where `mask` is 1, and leaving
    it out lets attention take its plain causal path (no 4-D mask built per
    call). A packed batch runs as its one packed sequence (packing.py)."""
    if batch.packed is not None:
        return packed_logprobs(model, batch.packed, tuple(batch.mask.shape))
    logits = model(input_ids=batch.input_ids).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
