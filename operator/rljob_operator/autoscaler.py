"""Elastic rollout scaling for a running RLJob (StreamRL §4.2), as pure logic.

At most every `intervalSeconds`, on a step not seen before, the measured gap δ = Tgen − Ttrain is
compared with δ′, what one more rollout replica is predicted to save. The
operator adds one replica when δ ≥ δ′ held for `consecutiveSteps` observed
steps in a row, outside `cooldownSeconds` of the last scale, within
`maxReplicas`; scale-in is the mirror image and only with `allowScaleIn`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rljob.api.spec import RLJobSpec
from rljob.planner.scaling import ScaleDecision, verdict


def predicted_change(spec: RLJobSpec, replicas: int, gen_seconds: float) -> tuple[float, float]:
    """(δ′ of one more replica, cost of one fewer), seconds.

    The measured Tgen is scaled by the cost model's relative change, so the
    prediction follows the live job even where the analytic profile's
    absolute times are off. A model the planner cannot size (no config.json
    reachable, no preset) falls back to linear scaling, Tgen ∝ 1/replicas."""
    from rljob.planner.job import job_model

    try:
        model = job_model(spec)
        now = model.tgen(replicas)
        gain_ratio = 1.0 - model.tgen(replicas + 1) / now
        loss_ratio = model.tgen(replicas - 1) / now - 1.0 if replicas > 1 else math.inf
    except (ValueError, ZeroDivisionError, OSError):
        gain_ratio = 1.0 / (replicas + 1)
        loss_ratio = 1.0 / (replicas - 1) if replicas > 1 else math.inf
    return gen_seconds * max(gain_ratio, 0.0), gen_seconds * max(loss_ratio, 0.0)


@dataclass
class Memory:
    """What the autoscaler remembers about one job between observations."""

    last_step: int = -1
    last_time: float | None = None  # when the last counted observation was made
    direction: int = 0
    streak: int = 0


@dataclass(frozen=True)
class ScaleAction:
    replicas_from: int
    replicas_to: int
    decision: ScaleDecision


def observe(memory: Memory, spec: RLJobSpec, replicas: int, step: int, gen_seconds: float,
            train_seconds: float, now: float, last_scale_time: float | None) -> ScaleAction | None:
    """Feed one observation; returns the scale to perform, if any. Only a step
    not seen before, `intervalSeconds` or more after the last one counted, counts
    towards `consecutiveSteps`."""
    auto = spec.rollout.autoscaling
    if not auto.enabled or step <= memory.last_step or gen_seconds <= 0 or train_seconds <= 0:
        return None
    if memory.last_time is not None and now - memory.last_time < auto.interval_seconds:
        return None
    memory.last_step, memory.last_time = step, now
    gain, loss = predicted_change(spec, replicas, gen_seconds)
    max_replicas = spec.rollout.max_replicas or replicas
    decision = verdict(gen_seconds, train_seconds, gain, loss, replicas,
                       spec.rollout.min_replicas, max_replicas, auto.allow_scale_in)
    if decision.delta == 0:
        memory.direction, memory.streak = 0, 0
        return None
    if decision.delta != memory.direction:
        memory.direction, memory.streak = decision.delta, 0
    memory.streak += 1
    if memory.streak < auto.consecutive_steps:
        return None
    if last_scale_time is not None and now - last_scale_time < auto.cooldown_seconds:
        return None
    memory.direction, memory.streak = 0, 0
    return ScaleAction(replicas, replicas + decision.delta, decision)
