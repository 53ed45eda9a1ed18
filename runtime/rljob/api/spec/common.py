"""Pieces every section of `RLJob.spec` uses: the patterns of names and
quantities, the accelerator a role runs on (`AcceleratorSpec`) and a container's
CPU and memory (`ComputeResources`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..base import ApiModel, Rule


# Kubernetes resource quantities (cpu "500m", memory "4Gi").
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# DNS-1123 label: names of PVCs, queues, priority classes, schedulers.
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DEFAULT_ASCEND_RESOURCE = "huawei.com/Ascend910"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


# the pods' image when an RLJob names none (the operator's runtimeImage replaces it)
DEFAULT_IMAGE = "rljob/runtime:0.1.0"


class ComputeResources(ApiModel):
    """A container's CPU and memory: requests = limits."""

    cpu: str | None = Field(None, max_length=32, pattern=QUANTITY_PATTERN,
                            description="CPU quantity (e.g. 500m, 2); unset: none.")
    memory: str | None = Field(None, max_length=32, pattern=QUANTITY_PATTERN,
                               description="Memory quantity (e.g. 512Mi, 4Gi); unset: none.")


class HcclSpec(ApiModel):
    """HCCL's environment for the Ascend collectives (accelerator.type ascend)."""

    socket_ifname: str | None = Field(
        None, max_length=64, description="HCCL_SOCKET_IFNAME, e.g. eth0."
    )
    connect_timeout_seconds: int = Field(
        1200, ge=1, le=7200, description="HCCL_CONNECT_TIMEOUT."
    )
    exec_timeout_seconds: int = Field(1800, ge=1, le=17340, description="HCCL_EXEC_TIMEOUT.")
    if_base_port: int | None = Field(
        None, ge=1024, le=65000, description="HCCL_IF_BASE_PORT: first of the ports HCCL uses."
    )


class AcceleratorSpec(ApiModel):
    """Where the workers compute: the device kind, the resource and the nodes."""

    type: Literal["cpu", "ascend", "gpu"] = Field("cpu", description="Device kind.")
    resource_name: str | None = Field(
        None,
        max_length=253,
        description=f"Extended resource to request; default {DEFAULT_ASCEND_RESOURCE} "
        f"for ascend, {DEFAULT_GPU_RESOURCE} for gpu.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the job's pods must match."
    )
    hccl: HcclSpec = Field(default_factory=HcclSpec)

    @property
    def resource(self) -> str | None:
        """The extended resource the pods request, or None on CPU."""
        if self.type == "cpu":
            return None
        if self.resource_name:
            return self.resource_name
        return DEFAULT_ASCEND_RESOURCE if self.type == "ascend" else DEFAULT_GPU_RESOURCE

    rules = (
        Rule(
            cel="self.type != 'cpu' || !has(self.resourceName)",
            message="accelerator.resourceName needs accelerator.type ascend or gpu",
            check=lambda a: a.type != "cpu" or a.resource_name is None,
            field_path=".resourceName",
        ),
    )
