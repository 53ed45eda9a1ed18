"""`RLJob.spec` as a whole (`RLJobSpec`), its cross-field rules, and the job-wide
sections: TransferQueue and its Redis units, scheduling, run policy, logging."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rljob.contract import OPERATOR_MANAGER, operator_manages

from ..base import ApiModel, Rule
from .algorithm import AlgorithmSpec, WorkflowSpec
from .common import (
    DEFAULT_IMAGE,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    AcceleratorSpec,
    ComputeResources,
)
from .inputs import DatasetSpec, ModelSpec, RewardSpec
from .pods import PodTemplateOverride
from .workers import RolloutSpec, TrainerSpec

# a domain-prefixed path, as Kubernetes' Job.spec.managedBy
MANAGED_BY_PATTERN = (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                      r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class RedisSpec(ApiModel):
    """The TransferQueue's Redis storage units."""

    image: str = Field("redis:7.2", min_length=1, max_length=512,
                       description="Image of each storage unit (a Redis 7 server).")
    resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="1", memory="4Gi"),
        description="Requests and limits of each storage unit.",
    )
    persistence: bool = Field(
        False,
        description="Keep each unit's append-only file on a PVC, so it survives the pod "
        "being deleted or rescheduled; without, it lives in an emptyDir and survives "
        "restarts of redis within the pod.",
    )
    storage_size: str = Field(
        "20Gi", max_length=32, pattern=QUANTITY_PATTERN,
        description="Size of each unit's PVC when persistence is on.",
    )


class TransferQueueSpec(ApiModel):
    """The TransferQueue: its controller, its storage units and their leases."""

    storage_units: int = Field(
        1, ge=1, le=64, description="Redis storage units; rows shard over them by index."
    )
    lease_seconds: int = Field(
        60,
        ge=1,
        le=86400,
        description="A claimed row returns to its task if not acked within this time.",
    )
    redis: RedisSpec = Field(default_factory=RedisSpec)
    tls: bool = Field(
        True,
        description="TLS on the job's connections: the TransferQueue controller, its storage "
        "units (Redis too) and the weight server present a certificate of a CA made for the "
        "job, which its clients alone trust. Off: plain text, the job token and Redis "
        "password readable on the wire.",
    )
    resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="1", memory="2Gi"),
        description="Requests of the TransferQueue controller's container (its memory "
        "limit is 8Gi or the request, if larger).",
    )
    driver_resources: ComputeResources = Field(
        default_factory=lambda: ComputeResources(cpu="500m", memory="1Gi"),
        description="Requests of the workflow driver's container, beside the controller, "
        "and of trainer rank 0's preflight init container, which reads the same files "
        "(the memory limit is 4Gi or the request, if larger).",
    )


class SchedulingSpec(ApiModel):
    """How the job's pods are scheduled: scheduler, queue and priority."""

    scheduler_name: str | None = Field(
        None, max_length=63, pattern=DNS_LABEL_PATTERN, description="e.g. volcano."
    )
    queue: str | None = Field(
        None, max_length=63, pattern=DNS_LABEL_PATTERN, description="Volcano queue."
    )
    priority_class_name: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PriorityClass of every pod of the job.")

    rules = (
        Rule(
            cel="!has(self.queue) || (has(self.schedulerName) && self.schedulerName == 'volcano')",
            message="scheduling.queue needs scheduling.schedulerName: volcano",
            check=lambda s: s.queue is None or s.scheduler_name == "volcano",
            field_path=".queue",
        ),
    )


class RunPolicySpec(ApiModel):
    """Restarts, deadline and clean-up of the job."""

    backoff_limit: int = Field(
        3, ge=0, le=1000, description="Trainer gang restarts before the job fails."
    )
    active_deadline_seconds: int | None = Field(
        None, ge=1, description="Fail the job after this many seconds of running."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the finished job's children after this many seconds."
    )
    not_ready_toleration_seconds: int | None = Field(
        None, ge=0, le=86400,
        description="Seconds the job's pods stay on a node that is NotReady or unreachable "
                    "before Kubernetes evicts them and the job replaces them (the "
                    "tolerationSeconds of the node.kubernetes.io/not-ready and /unreachable "
                    "NoExecute taints; unset: the cluster's default, 300).")


class WandbSpec(ApiModel):
    """Weights & Biases logging."""

    project: str = Field(..., min_length=1, max_length=128,
                         description="Weights & Biases project of the job's runs.")
    entity: str | None = Field(None, min_length=1, max_length=128,
                               description="W&B team or user (default: the API key's).")
    mode: Literal["online", "offline"] = Field(
        "online", description="online: sent as the job runs (needs WANDB_API_KEY); offline: "
        "written under the run directory's wandb/ for `wandb sync`.")
    api_key_secret: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN,
        description="Secret whose key 'apiKey' holds the W&B API key, given to the trainer "
        "pods as WANDB_API_KEY (local runs read WANDB_API_KEY from the environment).")


class LoggingSpec(ApiModel):
    """Where each step's figures go besides metrics.jsonl."""

    tensorboard: bool = Field(
        True, description="TensorBoard event files of every step in the run directory's "
        "tensorboard/ (in the pods: beside the checkpoints, with trainer.checkpointPvc).")
    wandb: WandbSpec | None = Field(
        None, description="Also log every step to Weights & Biases (needs rljob[wandb]).")


class RLJobSpec(ApiModel):
    model: ModelSpec
    dataset: DatasetSpec
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    workflow: WorkflowSpec = Field(default_factory=WorkflowSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    reward: RewardSpec = Field(default_factory=RewardSpec)
    transfer_queue: TransferQueueSpec = Field(default_factory=TransferQueueSpec)
    accelerator: AcceleratorSpec = Field(default_factory=AcceleratorSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    image: str = Field(
        DEFAULT_IMAGE,
        min_length=1,
        max_length=512,
        description="Runtime image of the TransferQueue controller, rollout and trainer pods.",
    )
    suspend: bool = Field(False, description="Delete the job's pods, keeping its data and status.")
    pod_template_overrides: list[PodTemplateOverride] = Field(
        default_factory=list, max_length=8,
        description="Additions to the pods of some roles, in order (labels, annotations, "
        "node selector, tolerations, affinity, volumes, sidecars and init containers, "
        "image pull secrets, service account, scheduling gates, the roles' containers' "
        "environment and mounts). The operator's own containers, volumes, mount paths, "
        "ports, environment variables and labels may not be changed.")
    managed_by: str | None = Field(
        None, max_length=63, pattern=MANAGED_BY_PATTERN,
        description=f"The controller that runs this job. Unset or {OPERATOR_MANAGER}: this "
        "operator. Another controller's name (e.g. kueue.x-k8s.io/multikueue, which runs "
        "the job on a worker cluster and mirrors its status here) leaves the job to that "
        "controller: this operator creates nothing for it and writes nothing to it. "
        "Immutable.")

    @property
    def managed_here(self) -> bool:
        """Whether this operator runs the job (`managedBy` unset or its own)."""
        return operator_manages(self.managed_by)

    def overrides_for(self, role: str) -> list[PodTemplateOverride]:
        """The podTemplateOverrides naming `role` (a rljob.dev/role label), in order."""
        return [o for o in self.pod_template_overrides if role in o.roles]

    def accelerator_for(self, role: str) -> AcceleratorSpec:
        """The accelerator of `role` (rollout, trainer): its own section, else the job's;
        the reward replicas' the job's for a reward model, none for reward.url's calls."""
        if role == "reward":
            return self.accelerator if self.reward.model is not None else AcceleratorSpec()
        own = getattr(self, role).accelerator if role in ("rollout", "trainer") else None
        return own or self.accelerator

    @property
    def weight_transport(self) -> str:
        """The weight transport in force between this job's trainer and rollouts
        (auto with model.lora: grpc, as an update is the adapter's megabytes)."""
        if self.model.lora is not None and self.workflow.weight_transport == "auto":
            return "grpc"
        return self.workflow.transport(self.accelerator_for("trainer").type,
                                       self.accelerator_for("rollout").type)

    rules = (
        Rule(
            cel="!has(self.model.lora) || self.trainer.engine == 'torch'",
            message="model.lora is trained by trainer.engine torch (PEFT's adapters on a "
            "transformers model); the megatron engine trains every weight: remove "
            "model.lora or set trainer.engine: torch",
            check=lambda s: s.model.lora is None or s.trainer.engine == "torch",
            field_path=".model.lora",
        ),
        Rule(
            cel="!has(self.model.lora) || self.rollout.engine != 'vllm' || "
            "self.workflow.weightTransport != 'collective'",
            message="model.lora's updates reach vLLM over gRPC (its workers receive a "
            "broadcast into whole weights, an update is the adapter's megabytes): set "
            "workflow.weightTransport: grpc or auto",
            check=lambda s: s.model.lora is None or s.rollout.engine != "vllm"
            or s.workflow.weight_transport != "collective",
            field_path=".workflow.weightTransport",
        ),
        Rule(
            cel="!has(self.dataset.warmupPath) || "
            "(has(self.model.warmupSteps) && self.model.warmupSteps > 0)",
            message="dataset.warmupPath is read by the warm-up only, and model.warmupSteps "
            "is 0: set model.warmupSteps, or remove dataset.warmupPath",
            check=lambda s: s.dataset.warmup_path is None or s.model.warmup_steps > 0,
            field_path=".dataset.warmupPath",
        ),
        Rule(
            cel="(has(self.trainer.accelerator) ? self.trainer.accelerator.type : "
            "self.accelerator.type) != 'cpu' || self.trainer.engine == 'torch'",
            message="trainer.engine megatron needs accelerator.type ascend or gpu (the "
            "trainer's: trainer.accelerator, else accelerator)",
            check=lambda s: s.accelerator_for("trainer").type != "cpu"
            or s.trainer.engine == "torch",
            field_path=".trainer.engine",
        ),
        Rule(
            cel="self.workflow.weightTransport != 'collective' || "
            "(has(self.trainer.accelerator) ? self.trainer.accelerator.type : "
            "self.accelerator.type) == (has(self.rollout.accelerator) ? "
            "self.rollout.accelerator.type : self.accelerator.type)",
            message="workflow.weightTransport collective needs the trainer and the rollouts "
            "on one accelerator kind (a process group spans one collective library); set "
            "weightTransport: grpc or auto",
            check=lambda s: s.workflow.weight_transport != "collective"
            or s.accelerator_for("trainer").type == s.accelerator_for("rollout").type,
            field_path=".workflow.weightTransport",
        ),
    )
