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
from .algorithms import STAT_FIELDS, OffPolicyStats, PolicyInputs, policy_loss
from .batch import make_batch, per_token
from .source import Sample


def micro_step(policy, shard, t, tok, spec, last) -> torch.Tensor:
    """Forward and backward of this rank's share of a micro-batch of step t. Its
    figures (loss, surrogate, KL, clipped share, off-policy sums) come back as one
    detached tensor on the policy's device, which `step_figures` reads once a step:
    each figure read on its own was a wait for the device, a dozen a micro-step.
    Per-token columns are laid out on the host and go to the device in one copy
    each, so nothing here waits for it (the backward aside, which autograd runs)."""
    with policy.no_sync(last):
        if not shard:
            # this rank has nothing in this micro-batch: a zero loss keeps DDP in step
            loss = sum(p.sum() for p in policy.parameters()) * 0.0
            loss.backward()
            return torch.zeros(4 + STAT_FIELDS, device=policy.device)
        host = make_batch([s.prompt_ids for s in shard], [s.response_ids for s in shard],
                          tok.pad_token_id, spec.trainer.packing,
                          [s.loss_mask for s in shard])
        batch = host.to(policy.device)

        def column(rows):  # [B, T] on the host, then one copy
            return per_token(host.mask, rows).to(policy.device)

        dist = TokenDistribution.of(spec.rollout, len(tok))
        logp = policy.logprobs(batch, dist)
        if not spec.algorithm.kl_coef:
            ref_logp = logp.detach()  # no KL term, no reference forward
        elif shard[0].ref_logp is not None:  # the reference task computed them
            ref_logp = column([s.ref_logp for s in shard])
        else:
            with torch.no_grad():
                ref_logp = policy.ref_logprobs(batch, dist)
        advantages = (torch.tensor([s.advantage for s in shard], device=policy.device)
                      if shard[0].token_advantages is None  # one per response (grpo)
                      else column([s.token_advantages for s in shard]))  # the critic's
        parts = policy_loss(spec.algorithm)(PolicyInputs(
            logp, logp.detach(), column([s.rollout_logp for s in shard]), ref_logp,
            advantages, batch.loss_mask,
            torch.tensor([s.version == t for s in shard], device=logp.device)))
        # DDP averages gradients over the data-parallel ranks; the objective sums
        # over all samples
        (parts.loss * policy.data_world).backward()
    return torch.cat([parts.loss.detach().float().reshape(1), parts.figures])


def step_figures(micro: list[torch.Tensor], data_world: int = 1
                 ) -> tuple[dict[str, float], OffPolicyStats]:
    """A step's loss, KL and clipped share (each the mean over its micro-batches) and
    its off-policy sums, from `micro_step`'s tensors: read back to the host in one
    copy (one wait for the device a step)."""
    rows = torch.stack(micro).tolist() if micro else []
    sums = {"loss": 0.0, "kl": 0.0, "clip": 0.0}
    stats = OffPolicyStats()
    for row in rows:
        sums["loss"] += row[0] * data_world / len(rows)
        sums["kl"] += row[2] / len(rows)
        sums["clip"] += row[3] / len(rows)
        stats = stats.merge(OffPolicyStats.of(row[4:]))
    return sums, stats
