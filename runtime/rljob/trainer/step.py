"""A micro-step: forward and backward of a rank's share of a micro-batch.

Its log-probs, each of a token under the sampling distribution (`rljob.sampling`:
the job's temperature and top-p): the policy's (with grad); the proximal policy's,
the same detached (one optimizer step per step, so the weights at the step's start
are the current ones: no second forward); the behaviour policy's, which the
rollout engine reported while sampling and the row carries; the frozen
reference's, which the sample carries too with the torch engine (reference.py: a
task of its own, computed by rank 0 while it waits for samples or by an idle
replica, or rank 0's own as samples arrive), else (megatron) computed in the
micro-step. The policy loss that
combines them is the one `algorithm.offPolicyCorrection` names (algorithms.py),
and each step reports the importance weights and the engine mismatch they show
(`OffPolicyStats`). The loss, the KL and those figures count the model's own tokens
only (`TokenBatch.loss_mask`: an episode's observation tokens are left out).
"""

from __future__ import annotations

import torch

from ..sampling import TokenDistribution
from .algorithms import OffPolicyStats, PolicyInputs, policy_loss
from .batch import make_batch, per_token
from .source import Sample


def micro_step(policy, shard, t, tok, spec, last):
    """Forward and backward of this rank's share of a micro-batch of step t; its loss,
    KL, clipped share and off-policy sums."""
    with policy.no_sync(last):
        if not shard:
            # this rank has nothing in this micro-batch: a zero loss keeps DDP in step
            loss = sum(p.sum() for p in policy.parameters()) * 0.0
            loss.backward()
            return {"loss": 0.0, "kl": 0.0, "clip": 0.0, "stats": OffPolicyStats()}
        batch = make_batch([s.prompt_ids for s in shard], [s.response_ids for s in shard],
                           tok.pad_token_id, spec.trainer.packing,
                           [s.loss_mask for s in shard]).to(policy.device)
        dist = TokenDistribution.of(spec.rollout, len(tok))
        logp = policy.logprobs(batch, dist)
        if not spec.algorithm.kl_coef:
            ref_logp = logp.detach()  # no KL term, no reference forward
        elif shard[0].ref_logp is not None:  # the reference task computed them
            ref_logp = per_token(batch.mask, [s.ref_logp for s in shard])
        else:
            with torch.no_grad():
                ref_logp = policy.ref_logprobs(batch, dist)
        parts = policy_loss(spec.algorithm)(PolicyInputs(
            logp, logp.detach(), per_token(batch.mask, [s.rollout_logp for s in shard]), ref_logp,
            _advantages(batch, shard), batch.loss_mask,
            torch.tensor([s.version == t for s in shard], device=logp.device)))
        # DDP averages gradients over the data-parallel ranks; the objective sums
        # over all samples
        (parts.loss * policy.data_world).backward()
    return {"loss": float(parts.loss.detach()) * policy.data_world, "kl": parts.kl,
            "clip": parts.clip_frac, "stats": parts.stats}


def _advantages(batch, shard: list[Sample]) -> torch.Tensor:
    """One advantage per response ([B]: grpo) or the critic's per token ([B, T])."""
    if shard[0].token_advantages is None:
        return torch.tensor([s.advantage for s in shard], device=batch.mask.device)
    return per_token(batch.mask, [s.token_advantages for s in shard])
