"""The RLJob resource: apiVersion, kind, metadata, spec, status."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import ApiModel, Rule
from .spec import RLJobSpec
from .status import RLJobStatus

GROUP = "rljob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ("rlj",)
# Children are named NAME-<role>-<n>; a StatefulSet pod name plus its revision
# hash must fit a 63-character label, so job names stay short.
MAX_NAME_LENGTH = 40
# ... and Services need DNS-1035 labels
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(BaseModel):
    """The metadata fields RLJob reads; the apiserver owns the rest."""

    model_config = ConfigDict(extra="allow")

    name: str | None = Field(None, max_length=253)
    generate_name: str | None = Field(None, alias="generateName")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class RLJob(ApiModel):
    api_version: Literal["rljob.dev/v1alpha1"] = Field(API_VERSION, alias="apiVersion")
    kind: Literal["RLJob"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: RLJobSpec
    status: RLJobStatus | None = None

    rules = (
        Rule(
            cel=f"!has(self.metadata.name) || size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            message=f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
            "(the job's pods and services are named after it)",
            check=lambda j: j.metadata.name is None or len(j.metadata.name) <= MAX_NAME_LENGTH,
        ),
        Rule(
            cel="!has(self.metadata.name) || self.metadata.name.matches("
            f"'{NAME_PATTERN}')",
            message="metadata.name must be a DNS label: lowercase letters, digits and '-', "
            "starting with a letter and ending with a letter or digit, e.g. grpo-qwen-7b "
            "(the job's services are named after it)",
            check=lambda j: j.metadata.name is None
            or re.fullmatch(NAME_PATTERN, j.metadata.name) is not None,
        ),
    )


def _started(job: RLJob) -> bool:
    st = job.status
    return bool(st and st.start_time and not st.completion_time)


# Transition rule: evaluated on updates with the stored object as oldSelf.
TRAINER_IMMUTABLE = Rule(
    cel="!has(oldSelf.status) || !has(oldSelf.status.startTime) || "
    "has(oldSelf.status.completionTime) || "
    "(has(oldSelf.spec.suspend) && oldSelf.spec.suspend) || "
    "self.spec.trainer == oldSelf.spec.trainer",
    message="spec.trainer is immutable while the job runs: set spec.suspend: true, "
    "then change the trainer shape",
    check=lambda pair: not _started(pair[0])
    or pair[0].spec.suspend
    or pair[1].spec.trainer == pair[0].spec.trainer,
)
MANAGED_BY_IMMUTABLE = Rule(
    cel="(has(self.spec.managedBy) ? self.spec.managedBy : '') == "
    "(has(oldSelf.spec.managedBy) ? oldSelf.spec.managedBy : '')",
    message="spec.managedBy is immutable: delete the job and create it with the other "
    "controller's name",
    check=lambda pair: pair[1].spec.managed_by == pair[0].spec.managed_by,
)
TRANSITION_RULES = (TRAINER_IMMUTABLE, MANAGED_BY_IMMUTABLE)


def transition_failures(old: RLJob, new: RLJob) -> list[Rule]:
    """Rules an update from `old` to `new` breaks (the apiserver checks the same)."""
    return [r for r in TRANSITION_RULES if not r.check((old, new))]
