"""Elastic rollout scaling for a running RLJob (StreamRL §4.2), as pure logic.

At most every `intervalSeconds`, on a step not seen before, the measured gap δ = Tgen − Ttrain is
compared with δ′, what one more rollout replica is predicted to save. The
operator adds one replica when δ ≥ δ′ held for `consecutiveSteps` observed
steps in a row, outside `cooldownSeconds` of the last scale, within
`maxReplicas`; scale-in is the mirror image and only with `allowScaleIn`.

δ′ comes from the job's live profile (its trainer's own timings) or a profile of the
job that holds (`rollout.autoscaling.profileConfigMap`); until the trainer's first
live record is due (`awaiting_live_profile`) a job with neither holds, and only
after that falls back to the analytic model of its config.json, else Tgen ∝
1/replicas; the source is recorded with the scale. Each
scale's predicted Tgen is checked against the Tgen of the steps after it
(`check_prediction`), and the relative error raises the bar of the next decision:
the gap must exceed δ′ · (1 + |error|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rljob.api.spec import RLJobSpec
from rljob.contract import LIVE_PROFILE_SKIP
from rljob.planner.profile import Profile
from rljob.planner.scaling import ScaleDecision, verdict


@dataclass(frozen=True)
class Prediction:
    """What one replica more saves (`gain`, δ′) and one fewer costs (`loss`), in
    seconds of Tgen, and what the cost model was fed (`source`): a profile (live or
    offline, `rljob profile`), the analytic model of the job's config.json, or
    `linear` (Tgen ∝ 1/replicas: the model could not be sized)."""

    gain: float
    loss: float
    source: str


def prediction(spec: RLJobSpec, replicas: int, gen_seconds: float,
               profile: Profile | None = None) -> Prediction:
    """The measured Tgen scaled by the cost model's relative change, so the
    prediction follows the live job even where the model's absolute times are off.
    `profile`: one that holds for this job (`Profile.fit`); without it the analytic
    model, and without a model size the linear fallback."""
    from rljob.planner.job import job_model

    source = "linear"
    try:
        model = job_model(spec, profile)
        now = model.tgen(replicas)
        gain_ratio = 1.0 - model.tgen(replicas + 1) / now
        loss_ratio = model.tgen(replicas - 1) / now - 1.0 if replicas > 1 else math.inf
        source = (profile_source(profile) if profile is not None else "analytic")
    except (ValueError, ZeroDivisionError, OSError):
        gain_ratio = 1.0 / (replicas + 1)
        loss_ratio = 1.0 / (replicas - 1) if replicas > 1 else math.inf
    return Prediction(gen_seconds * max(gain_ratio, 0.0), gen_seconds * max(loss_ratio, 0.0),
                      source)


# steps past the trainer's first live record (its life's step LIVE_PROFILE_SKIP + 1,
# rljob/contract.py) that the autoscaler waits for it before it acts on the analytic
# model or the linear fallback (a record that does not come: a trainer image that
# reports none, a controller that lost it)
LIVE_PROFILE_GRACE = 3


def awaiting_live_profile(first_step: int | None, step: int) -> bool:
    """Whether a job whose trainer has reported no live profile yet, and which has no
    profile of its own, holds rather than scale on the weaker estimates (pure):
    `first_step` is the first step the operator saw of this trainer life (None:
    none yet), `step` the latest. The record is due LIVE_PROFILE_SKIP + 1 steps in;
    the wait ends LIVE_PROFILE_GRACE steps after that."""
    if first_step is None:
        return True
    return step - first_step < LIVE_PROFILE_SKIP + 1 + LIVE_PROFILE_GRACE


def profile_source(profile: Profile) -> str:
    """`live profile`, `offline profile` or `profile` (one without a record of how)."""
    kind = (profile.meta.get("source") or "").split(":")[0].strip()
    return f"{kind} profile" if kind in ("live", "offline") else "profile"


def predicted_change(spec: RLJobSpec, replicas: int, gen_seconds: float,
                     profile: Profile | None = None) -> tuple[float, float]:
    """(δ′ of one more replica, cost of one fewer), seconds (`prediction`'s)."""
    p = prediction(spec, replicas, gen_seconds, profile)
    return p.gain, p.loss


@dataclass
class Check:
    """A scale's prediction, compared with what the steps after it measure."""

    step: int  # the step observed when the scale was made
    replicas: int  # the replicas it made
    predicted: float  # Tgen predicted at `replicas`
    measured: list[float] = field(default_factory=list)


@dataclass
class Memory:
    """What the autoscaler remembers about one job between observations."""

    last_step: int = -1
    last_time: float | None = None  # when the last counted observation was made
    direction: int = 0
    streak: int = 0
    check: Check | None = None  # the last scale's prediction, while it is checked
    # the relative error of the last checked prediction: the next decision asks for a
    # gap larger than δ′ by as much (a model that was 40 % off must be beaten by 40 %)
    error: float = 0.0
    checked_step: int = -1


@dataclass(frozen=True)
class ScaleAction:
    replicas_from: int
    replicas_to: int
    decision: ScaleDecision
    source: str = "analytic"  # what δ′ came from (`Prediction.source`)
    predicted_gen_seconds: float = 0.0  # Tgen predicted at replicas_to


def check_prediction(memory: Memory, step: int, gen_seconds: float, replicas: int,
                     steps: int, ready: int | None = None) -> dict | None:
    """Feed a step's measured Tgen after a scale; once `steps` steps run wholly at the
    scale's replica count, every one of them Ready (`ready`: the rollout's ready
    replicas; the step in progress when the count was reached, and the next, left
    out: a new replica starting up generates nothing yet), are in, the prediction's
    record for status.lastScale — predicted and measured Tgen and the relative error
    — and `memory.error` for the next decision. Steps at another replica count do not
    count; the next scale replaces the check."""
    c = memory.check
    if c is None or step <= memory.checked_step or gen_seconds <= 0:
        return None
    memory.checked_step = step
    if replicas != c.replicas:  # another count (scaled again by hand, a stale read)
        return None
    if ready is not None and ready != c.replicas:  # not all there yet: count from later
        c.step, c.measured = step, []
        return None
    if step <= c.step + 1:
        return None
    c.measured.append(gen_seconds)
    if len(c.measured) < steps:
        return None
    measured = sum(c.measured) / len(c.measured)
    memory.error = measured / c.predicted - 1 if c.predicted > 0 else 0.0
    memory.check = None
    return {"predictedGenSeconds": round(c.predicted, 4),
            "measuredGenSeconds": round(measured, 4),
            "predictionError": round(memory.error, 4), "checkedSteps": len(c.measured)}


def observe(memory: Memory, spec: RLJobSpec, replicas: int, step: int, gen_seconds: float,
            train_seconds: float, now: float, last_scale_time: float | None,
            profile: Profile | None = None) -> ScaleAction | None:
    """Feed one observation; returns the scale to perform, if any. Only a step
    not seen before, `intervalSeconds` or more after the last one counted, counts
    towards `consecutiveSteps`. δ′ comes from `profile` when one is given (it holds
    for this job: `Profile.fit`) and is raised by the last checked prediction's
    relative error (`Memory.error`)."""
    auto = spec.rollout.autoscaling
    if not auto.enabled or step <= memory.last_step or gen_seconds <= 0 or train_seconds <= 0:
        return None
    if memory.last_time is not None and now - memory.last_time < auto.interval_seconds:
        return None
    memory.last_step, memory.last_time = step, now
    p = prediction(spec, replicas, gen_seconds, profile)
    doubt = 1.0 + abs(memory.error)
    max_replicas = spec.rollout.max_replicas or replicas
    decision = verdict(gen_seconds, train_seconds, p.gain * doubt, p.loss * doubt, replicas,
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
    to = replicas + decision.delta
    predicted = gen_seconds - p.gain if decision.delta > 0 else gen_seconds + p.loss
    memory.check = Check(step, to, predicted)
    return ScaleAction(replicas, to, decision, p.source, predicted)
