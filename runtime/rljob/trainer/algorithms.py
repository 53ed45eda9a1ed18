"""The RL objective by name (pure torch): advantage estimators and policy losses
join registries, the trainer looks them up (`algorithm.name` names the estimator,
`algorithm.offPolicyCorrection` the loss) and never branches on the algorithm.

Advantage estimators (`ADVANTAGE_ESTIMATORS`): `grpo`, a response's reward
normalised within its group, one per response, computed by the trainer when a
group is complete; `gae`, generalised advantage estimation over a critic's
values, one per token, computed by PPO's critic (critic.py) as it scores each
sample. The critic's own loss is PPO's clipped value loss (`value_loss`).

Policy losses (`POLICY_LOSSES`, by `algorithm.offPolicyCorrection`). Three
policies meet in a step: the behaviour policy μ that sampled a token (its log-prob
travels in the row, `rollout_logp`: the rollout engine's weights and numerics),
the proximal policy π_prox (the trainer's recomputation with the weights at the
start of the step: one optimizer step per step, so it is the current forward,
detached) and the policy π_θ being updated. Per response token, with A its
advantage and ε `clipRatio`:

- `none` (the default): PPO against the behaviour policy, −min(r·A, clip(r, 1 ± ε)·A)
  with r = π_θ/μ: the ratio is the importance weight of a stale sample (and, for
  a fresh one, of the engine's numerics), the clip a trust region around the
  policy that sampled the data.
- `tis` and `mis` (AReaL's decoupled PPO): the clip is taken against the
  proximal policy, r = π_θ/π_prox, and every token is weighted by the
  behaviour→proximal importance weight w = π_prox/μ, which corrects both the
  staleness of async samples and the rollout engine's numerical mismatch:
  −w̄·min(r·A, clip(r, 1 ± ε)·A) with w̄ = min(w, C) (tis, truncated importance
  sampling) or w̄ = w where w ≤ C and 0 where it is above (mis, masked). With
  one optimizer step per step r is 1 in value (its gradient is ∇log π_θ), so the
  clip never binds: the correction is all in w̄.

Both add β times the k3 estimate of KL(π‖π_ref) = exp(ref − logp) − (ref − logp) − 1
(Periodic Asynchrony eq. 3). A response's loss is its token mean; the step's loss
is the sum over responses divided by the number of responses in the step, so
summing micro-batch gradients gives exactly the full-batch gradient however the
step is split. Each loss also returns the sums a step's off-policy figures are
made of (`OffPolicyStats`): the importance weights' mean, max, capped share and
effective sample size, and the behaviour/proximal log-prob gap of fresh samples
(the engine mismatch: both are the same weights, so only numerics separate them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields

import torch

from ..infra.registry import Registry


# ---- advantage estimators ---------------------------------------------------
class AdvantageEstimator(ABC):
    """How a sample's advantage is made. `per_token`: one per response token (else
    one per response). Which algorithm uses which estimator, and whether a critic
    scores its samples first, is the contract's (`api.spec.ALGORITHMS`)."""

    per_token: bool = False


ADVANTAGE_ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry(
    "advantage estimator", AdvantageEstimator, "rljob.advantage_estimators")
register_advantage_estimator = ADVANTAGE_ESTIMATORS.register


@register_advantage_estimator("grpo")
class GroupRelative(AdvantageEstimator):
    """GRPO: (r − mean of its group) / (std of its group + eps), one per response."""

    @staticmethod
    def of_group(rewards: list[float]) -> list[float]:
        return _relative(torch.tensor(rewards).float(), 1e-6).tolist()


@register_advantage_estimator("gae")
class GeneralisedAdvantage(AdvantageEstimator):
    """PPO: GAE over the critic's values of a response scored as a whole (its reward
    on the last token)."""

    per_token = True

    @staticmethod
    def of_response(reward: float, values: torch.Tensor, gamma: float,
                    lam: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns) over the response's tokens."""
        return gae(outcome_rewards(reward, values.numel()), values, gamma, lam)


def advantage_estimator(algorithm_spec) -> type[AdvantageEstimator]:
    """The estimator a job's `algorithm` section names."""
    return ADVANTAGE_ESTIMATORS.get(algorithm_spec.advantage_estimator)


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r − mean of its group) / (std of its group + eps): GRPO's group-relative advantage."""
    adv = torch.empty_like(rewards, dtype=torch.float32)
    for g in torch.unique(groups):
        sel = groups == g
        adv[sel] = _relative(rewards[sel].float(), eps)
    return adv


def _relative(r: torch.Tensor, eps: float) -> torch.Tensor:
    """One group's rewards (float32) → (r − mean) / (std + eps)."""
    std = r.std(unbiased=False) if r.numel() > 1 else torch.tensor(0.0)
    return (r - r.mean()) / (std + eps)


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


# ---- policy losses ------------------------------------------------------------
@dataclass
class OffPolicyStats:
    """Sums over a micro-batch's response tokens; `merge` adds micro-batches and
    `figures` makes the step's metrics of them."""

    tokens: float = 0.0
    weight_sum: float = 0.0  # w = π_prox/μ, uncapped
    weight_sq_sum: float = 0.0
    weight_max: float = 0.0
    capped: float = 0.0  # tokens with w above the cap (truncated or masked)
    fresh_tokens: float = 0.0  # of samples the step's own weights made
    mismatch_sum: float = 0.0  # |log μ − log π_prox| over fresh tokens
    mismatch_max: float = 0.0

    @classmethod
    def of(cls, values) -> OffPolicyStats:
        """From its sums in field order (`off_policy_sums`' tensor, read back)."""
        return cls(*map(float, values))

    def merge(self, other: OffPolicyStats) -> OffPolicyStats:
        return OffPolicyStats(
            self.tokens + other.tokens, self.weight_sum + other.weight_sum,
            self.weight_sq_sum + other.weight_sq_sum, max(self.weight_max, other.weight_max),
            self.capped + other.capped, self.fresh_tokens + other.fresh_tokens,
            self.mismatch_sum + other.mismatch_sum, max(self.mismatch_max, other.mismatch_max))

    def figures(self) -> dict[str, float | None]:
        """The step's off-policy metrics (metrics.jsonl keys); None where undefined."""
        n, f = self.tokens, self.fresh_tokens
        return {
            "is_weight_mean": self.weight_sum / n if n else None,
            "is_weight_max": self.weight_max if n else None,
            "is_capped": self.capped / n if n else None,
            # Kish's effective sample size of the weights, as a share of the tokens
            "is_ess": (self.weight_sum ** 2 / (n * self.weight_sq_sum)
                       if n and self.weight_sq_sum > 0 else None),
            "logp_mismatch_mean": self.mismatch_sum / f if f else None,
            "logp_mismatch_max": self.mismatch_max if f else None,
        }


STAT_FIELDS = len(fields(OffPolicyStats))


@dataclass
class LossParts:
    """A micro-batch's loss, and its figures as one detached tensor on the loss's
    device: the surrogate, the KL, the clipped share, then `OffPolicyStats`' sums in
    field order. A figure read on the host waits for the device (the properties
    below do); the trainer reads a step's figures back once, at its end
    (`step.step_figures`)."""

    loss: torch.Tensor
    figures: torch.Tensor

    @property
    def pg(self) -> float:
        return float(self.figures[0])

    @property
    def kl(self) -> float:
        return float(self.figures[1])

    @property
    def clip_frac(self) -> float:
        return float(self.figures[2])

    @property
    def stats(self) -> OffPolicyStats:
        return OffPolicyStats.of(self.figures[3:].tolist())


@dataclass
class PolicyInputs:
    """A micro-batch's log-probs, [B, T] over response positions (mask 1 on the
    response tokens the model wrote: the loss, the KL and the figures count those
    only): `logp` the policy's (with grad), `proximal` the same detached,
    `behaviour` the rollout's, `ref` the reference's; `fresh` [B] bool: made by the
    weights of this step; `advantages` [B] or [B, T]."""

    logp: torch.Tensor
    proximal: torch.Tensor
    behaviour: torch.Tensor
    ref: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    fresh: torch.Tensor


class PolicyLoss(ABC):
    """A policy loss over one micro-batch (`PolicyInputs`), made from the job's
    `algorithm` section."""

    def __init__(self, algorithm_spec):
        self.clip_ratio = algorithm_spec.clip_ratio
        self.kl_coef = algorithm_spec.kl_coef
        self.cap = algorithm_spec.cap
        self.responses_in_step = algorithm_spec.samples_per_step

    @abstractmethod
    def __call__(self, x: PolicyInputs) -> LossParts:
        """The micro-batch's share of the step's loss and its figures."""

    def _assemble(self, x: PolicyInputs, ratio: torch.Tensor, weight: torch.Tensor | None,
                  stats: torch.Tensor) -> LossParts:
        """−w̄·min(r·A, clip(r)·A) + β·KL, averaged per response, summed over the step
        (`stats`: `off_policy_sums`' tensor)."""
        mask = x.mask.float()
        a = x.advantages.unsqueeze(1) if x.advantages.dim() == 1 else x.advantages
        eps = self.clip_ratio
        surrogate = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)
        if weight is not None:
            surrogate = weight * surrogate
        kl = k3_kl(x.logp, x.ref)
        per_token = surrogate + self.kl_coef * kl
        tokens = mask.sum(1).clamp(min=1)
        per_response = (per_token * mask).sum(1) / tokens
        loss = per_response.sum() / self.responses_in_step
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > eps).float()
            n = mask.sum().clamp(min=1)
            return LossParts(loss, torch.cat([torch.stack([
                ((surrogate * mask).sum(1) / tokens).mean(), (kl * mask).sum() / n,
                (clipped * mask).sum() / n]).float(), stats]))


def off_policy_sums(x: PolicyInputs, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The behaviour→proximal importance weights [B, T], and their sums in
    `OffPolicyStats`' field order as one tensor on their device: made with masks,
    never by selecting the masked tokens (a selection's size is read back to the
    host, a wait for the device), so nothing here waits."""
    with torch.no_grad():
        mask = x.mask.bool()
        gap = (x.proximal - x.behaviour).masked_fill(~mask, 0.0)
        weight = torch.exp(gap).masked_fill(~mask, 0.0)  # 0 off the tokens: w > 0 on them
        fresh = mask & x.fresh.unsqueeze(1)
        mismatch = gap.abs().masked_fill(~fresh, 0.0)
        sums = torch.stack([t.float() for t in (
            mask.sum(), weight.sum(), (weight * weight).sum(),
            weight.max() if weight.numel() else weight.new_zeros(()),
            ((weight > cap) & mask).sum(), fresh.sum(), mismatch.sum(),
            mismatch.max() if mismatch.numel() else mismatch.new_zeros(()))])
    return weight, sums


def off_policy_stats(x: PolicyInputs, cap: float) -> tuple[torch.Tensor, OffPolicyStats]:
    """`off_policy_sums`, the sums read back to the host."""
    weight, sums = off_policy_sums(x, cap)
    return weight, OffPolicyStats.of(sums.tolist())


POLICY_LOSSES: Registry[type[PolicyLoss]] = Registry("policy loss", PolicyLoss,
                                                        "rljob.policy_losses")
register_policy_loss = POLICY_LOSSES.register


@register_policy_loss("none")
class ClippedLoss(PolicyLoss):
    """offPolicyCorrection none: PPO's ratio and clip against the behaviour policy."""

    def __call__(self, x: PolicyInputs) -> LossParts:
        _, stats = off_policy_sums(x, self.cap)
        return self._assemble(x, torch.exp(x.logp - x.behaviour), None, stats)


@register_policy_loss("tis")
class TruncatedImportanceLoss(PolicyLoss):
    """Decoupled PPO, the importance weight truncated at the cap."""

    def __call__(self, x: PolicyInputs) -> LossParts:
        weight, stats = off_policy_sums(x, self.cap)
        return self._assemble(x, torch.exp(x.logp - x.proximal),
                              weight.clamp(max=self.cap), stats)


@register_policy_loss("mis")
class MaskedImportanceLoss(PolicyLoss):
    """Decoupled PPO, a token whose importance weight is above the cap left out."""

    def __call__(self, x: PolicyInputs) -> LossParts:
        weight, stats = off_policy_sums(x, self.cap)
        return self._assemble(x, torch.exp(x.logp - x.proximal),
                              weight * (weight <= self.cap), stats)


def policy_loss(algorithm_spec) -> PolicyLoss:
    """The loss a job's `algorithm` section names, made for it."""
    return POLICY_LOSSES.get(algorithm_spec.off_policy_correction)(algorithm_spec)
