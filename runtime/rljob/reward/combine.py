"""reward.combine: how the rule's score (reward.name) and a scorer's score (reward.url)
make the reward a sample is trained on. Pure."""

from __future__ import annotations

from collections.abc import Sequence


def asks(spec, rule: float) -> bool:
    """Whether the scorer is asked for a sample whose rule scored `rule` (combine gate:
    not below gateThreshold)."""
    return spec.combine != "gate" or rule >= spec.gate_threshold


def combine(spec, rule: float, score: float | None) -> float:
    """The reward of a sample: `score` alone (none), the weighted sum (weighted), or
    the rule's score where the gate kept the scorer out (`score` None), else `score`."""
    if spec.combine == "weighted":
        return spec.rule_weight * rule + spec.score_weight * score
    if score is None:  # gate: below the threshold
        return rule
    return score


def combine_all(spec, rules: Sequence[float], scores: Sequence[float | None]) -> list[float]:
    return [combine(spec, r, s) for r, s in zip(rules, scores)]
