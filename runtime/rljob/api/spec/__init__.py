"""`RLJob.spec`: what a researcher writes. Defaults make a ten-line YAML valid.

Field descriptions become the CRD's schema descriptions (`kubectl explain`).
Cross-field rules are `Rule`s: they become CEL validations in the CRD and are
enforced by these models with the same messages.

One module per part: common.py (patterns, accelerator, compute resources),
inputs.py (model, dataset, reward), algorithm.py (algorithm, workflow),
workers.py (rollout, trainer), pods.py (podTemplateOverrides), job.py (RLJobSpec and the job-wide sections).
"""

from .algorithm import ALGORITHMS, CRITIC_FIELDS, AlgorithmSpec, WorkflowSpec
from .common import (
    DEFAULT_ASCEND_RESOURCE,
    DEFAULT_GPU_RESOURCE,
    DEFAULT_IMAGE,
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    QUANTITY_PATTERN,
    AcceleratorSpec,
    ComputeResources,
    HcclSpec,
)
from .inputs import (REWARD_PATTERN, DatasetSpec, LoraSpec, ModelSpec, RemoteRewardSpec,
                     RewardModelSpec, RewardSpec)
from .job import (
    LoggingSpec,
    RedisSpec,
    RLJobSpec,
    RunPolicySpec,
    SchedulingSpec,
    TransferQueueSpec,
    WandbSpec,
)
from .pods import PodTemplateOverride
from .workers import AutoscalingSpec, McpServerSpec, ParallelismSpec, RolloutSpec, TrainerSpec

__all__ = [
    "ALGORITHMS",
    "CRITIC_FIELDS",
    "DEFAULT_ASCEND_RESOURCE",
    "DEFAULT_GPU_RESOURCE",
    "DEFAULT_IMAGE",
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "QUANTITY_PATTERN",
    "REWARD_PATTERN",
    "AcceleratorSpec",
    "AlgorithmSpec",
    "AutoscalingSpec",
    "ComputeResources",
    "DatasetSpec",
    "HcclSpec",
    "LoggingSpec",
    "LoraSpec",
    "ModelSpec",
    "ParallelismSpec",
    "PodTemplateOverride",
    "RLJobSpec",
    "RedisSpec",
    "RemoteRewardSpec",
    "RewardModelSpec",
    "RewardSpec",
    "McpServerSpec",
    "RolloutSpec",
    "RunPolicySpec",
    "SchedulingSpec",
    "TrainerSpec",
    "TransferQueueSpec",
    "WandbSpec",
    "WorkflowSpec",
]
