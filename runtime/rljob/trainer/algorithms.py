"""GRPO and PPO losses and advantages (pure torch).

Per token t of response i: ratio = exp(logp − old_logp); the clipped surrogate
−min(ratio·A, clip(ratio, 1 ± ε)·A); plus β times the k3 estimate of
KL(π‖π_ref) = exp(ref − logp) − (ref − logp) − 1 (Periodic Asynchrony eq. 3).
GRPO's A is the response's group-relative reward (one per response); PPO's is
GAE over the critic's values (one per token). The critic's loss is PPO's clipped
value loss. A response's loss is its token mean; the step's loss is the sum over
responses divided by the number of responses in the step, so summing micro-batch
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


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over one response's tokens: rewards and
    values [T] (V(s_t), the state before token t; the state after the last token is
    terminal, V = 0). δ_t = r_t + γ·V_{t+1} − V_t, A_t = Σ_k (γλ)^k δ_{t+k};
    returns R_t = A_t + V_t (the critic's targets)."""
    rewards, values = rewards.float(), values.float()
    adv = torch.zeros_like(values)
    running = torch.zeros((), dtype=values.dtype)
    for t in range(values.numel() - 1, -1, -1):
        following = values[t + 1] if t + 1 < values.numel() else 0.0
        running = rewards[t] + gamma * following - values[t] + gamma * lam * running
        adv[t] = running
    return adv, adv + values


def outcome_rewards(reward: float, length: int) -> torch.Tensor:
    """A response scored as a whole: its reward on the last token, 0 before."""
    r = torch.zeros(max(length, 1))
    r[-1] = reward
    return r


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float, responses_in_step: int) -> tuple[torch.Tensor, float]:
    """PPO's clipped value loss, ½·max((V − R)², (clip(V, V_old ± c) − R)²) per token,
    averaged per response and summed over the step's responses / their number
    (micro-batch sums equal the full batch's); [B, T] each. Returns the loss and
    the share of tokens the clip held back (the clipped term the larger)."""
    mask = mask.float()
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    plain_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    per_token = 0.5 * torch.maximum(plain_sq, clipped_sq)
    tokens = mask.sum(1).clamp(min=1)
    loss = ((per_token * mask).sum(1) / tokens).sum() / responses_in_step
    with torch.no_grad():
        held = ((values - old_values).abs() > clip) & (clipped_sq > plain_sq)
        frac = float((held.float() * mask).sum() / mask.sum().clamp(min=1))
    return loss, frac


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
    """logp, old_logp, ref_logp, mask: [B, T] over response tokens; advantages: [B]
    (one per response: GRPO) or [B, T] (one per token: PPO)."""
    mask = mask.float()
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
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
class TokenBatch:
    """Right-padded prompt+response sequences; `mask` marks response tokens of
    `input_ids[:, 1:]`."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1]: 1 where the next token is a response token
    # trainer.packing: the same samples as one packed sequence (packing.py); the
    # log-probs come back in this padded layout
    packed: Packed | None = None

    def to(self, device) -> TokenBatch:
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device),
                     self.mask.to(device),
                     self.packed.to(device) if self.packed is not None else None)


def make_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
               packing: str = "none") -> TokenBatch:
    batch = _padded(prompts, responses, pad_id)
    if packing != "none":
        batch.packed = pack(prompts, responses, share=packing == "shared_prompt",
                            pad_id=pad_id)
    return batch


def _padded(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> TokenBatch:
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
    return TokenBatch(ids, attn, mask)


def token_logprobs(model, batch: TokenBatch) -> torch.Tensor:
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
