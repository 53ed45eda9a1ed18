"""Elastic rollout scaling: what one replica more (or fewer) is worth.

δ′ = Tgen(R) − Tgen(R + 1) under the current workload, from the cost model fed
by profiles measured on the live job. The operator adds a replica when the
measured gap δ = Tgen − Ttrain has stayed at or above δ′ (StreamRL §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cost import Workload, generation_time
from .profile import GenProfile


def gain_of_one_more_replica(gen: GenProfile, workload: Workload, replicas: int) -> float:
    """Predicted reduction of Tgen from replica R + 1 (seconds, ≥ 0)."""
    return max(0.0, generation_time(gen, workload, replicas)
               - generation_time(gen, workload, replicas + 1))


def loss_of_one_fewer_replica(gen: GenProfile, workload: Workload, replicas: int) -> float:
    """Predicted increase of Tgen without replica R (seconds; inf for the last one)."""
    if replicas <= 1:
        return float("inf")
    return max(0.0, generation_time(gen, workload, replicas - 1)
               - generation_time(gen, workload, replicas))


@dataclass(frozen=True)
class ScaleDecision:
    delta: int  # +1, -1 or 0
    reason: str
    gap: float  # measured δ = Tgen − Ttrain
    gain: float  # δ′ of the move considered


def decide(gen: GenProfile, workload: Workload, replicas: int, gen_seconds: float,
           train_seconds: float, min_replicas: int, max_replicas: int,
           allow_scale_in: bool = False) -> ScaleDecision:
    """One step's verdict from the measured Tgen/Ttrain (the operator requires it
    for consecutiveSteps in a row, outside the cooldown, before acting)."""
    return verdict(gen_seconds, train_seconds, gain_of_one_more_replica(gen, workload, replicas),
                   loss_of_one_fewer_replica(gen, workload, replicas), replicas, min_replicas,
                   max_replicas, allow_scale_in)


def verdict(gen_seconds: float, train_seconds: float, gain: float, loss: float, replicas: int,
            min_replicas: int, max_replicas: int, allow_scale_in: bool = False) -> ScaleDecision:
    """Scale out when δ = Tgen − Ttrain ≥ δ′ = `gain` (> 0); scale in when
    training lags generation by at least what one fewer replica costs (`loss`)."""
    gap = gen_seconds - train_seconds
    if gap > 0 and gain > 0 and gap >= gain and replicas < max_replicas:
        return ScaleDecision(+1, f"generation lags training by {gap:.2f}s, one more replica "
                                 f"saves {gain:.2f}s", gap, gain)
    if allow_scale_in and replicas > min_replicas and gap < 0 and -gap >= loss:
        return ScaleDecision(-1, f"training lags generation by {-gap:.2f}s, one fewer "
                                 f"replica costs {loss:.2f}s", gap, loss)
    return ScaleDecision(0, "balanced", gap, gain)
