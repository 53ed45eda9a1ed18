"""`RLJob.status`: written by the operator through the status subresource only."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from .base import ApiModel

CONDITION_TYPES = (
    "Ready",
    "TransferQueueReady",
    "RolloutReady",
    "TrainerReady",
    "RewardReady",
    "Scaling",
    "Suspended",
    "ProfileTrusted",
    "Succeeded",
    "Failed",
)


class Condition(ApiModel):
    type: str = Field(max_length=64, description="One of " + ", ".join(CONDITION_TYPES) + ".")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", max_length=128)
    message: str = Field("", max_length=4096)
    last_transition_time: datetime | None = None
    observed_generation: int | None = Field(None, ge=0)


class ProgressStatus(ApiModel):
    step: int = Field(0, ge=0, description="Optimizer steps completed.")
    staleness_mean: float = Field(
        0.0, ge=0, description="Mean (trainer step − sample version) of the last step."
    )
    staleness_max: int = Field(0, ge=0)
    reward_mean: float | None = None
    tokens_per_second: float = Field(0.0, ge=0, description="Generated tokens per second.")
    samples_per_second: float = Field(0.0, ge=0, description="Trained samples per second.")
    gen_seconds: float = Field(0.0, ge=0, description="Tgen: seconds the rollouts spent "
                               "generating the step (the union of its groups' generation "
                               "spans; the wait before a replica began is not in it).")
    train_seconds: float = Field(0.0, ge=0, description="Ttrain: seconds the trainer spent "
                                 "computing the step (the union of its compute spans).")
    last_updated_time: datetime | None = None


class RolloutStatus(ApiModel):
    replicas: int = Field(0, ge=0)
    ready_replicas: int = Field(0, ge=0)
    selector: str = Field("", max_length=1024, description="Label selector of rollout pods.")


class RewardStatus(ApiModel):
    replicas: int = Field(0, ge=0, description="Reward replicas the job runs (reward.url).")
    ready_replicas: int = Field(0, ge=0)


class TrainerStatus(ApiModel):
    ready_nodes: int = Field(0, ge=0)
    restarts: int = Field(0, ge=0)


class ScaleEvent(ApiModel):
    time: datetime
    from_: int = Field(alias="from", ge=0)
    to: int = Field(ge=0)
    reason: str = Field(max_length=1024)
    delta: float | None = Field(None, description="Measured Tgen − Ttrain, seconds.")
    gain: float | None = Field(
        None, description="Predicted Tgen reduction of one more replica, seconds."
    )
    source: str | None = Field(
        None, max_length=64, description="What the prediction came from: live profile, "
        "offline profile, analytic (the model's config.json) or linear (Tgen ∝ 1/replicas).")
    predicted_gen_seconds: float | None = Field(
        None, description="Tgen predicted at the new replica count, seconds.")
    measured_gen_seconds: float | None = Field(
        None, description="Tgen measured over the steps after the scale, seconds.")
    prediction_error: float | None = Field(
        None, description="measuredGenSeconds / predictedGenSeconds − 1; the next decision "
        "asks for a gap larger than δ′ by as much.")
    checked_steps: int | None = Field(None, ge=0, description="Steps the check measured.")


class RLJobStatus(ApiModel):
    observed_generation: int | None = Field(None, ge=0)
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
    start_time: datetime | None = Field(None, description="When the job's pods first started.")
    completion_time: datetime | None = None
    progress: ProgressStatus | None = None
    rollout: RolloutStatus | None = None
    trainer: TrainerStatus | None = None
    reward: RewardStatus | None = None
    last_scale: ScaleEvent | None = None

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)
