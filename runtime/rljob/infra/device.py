"""Where a worker computes: the torch device and the collective backend for
`accelerator.type` (cpu → gloo; ascend → npu:LOCAL_RANK + hccl through
torch_npu, imported only here; gpu → cuda:LOCAL_RANK + nccl)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    kind: str  # cpu | ascend | gpu
    name: str  # the torch device: cpu, npu:0, cuda:0
    backend: str  # torch.distributed backend: gloo, hccl, nccl

    @property
    def accelerated(self) -> bool:
        return self.kind != "cpu"


def resolve(kind: str, local_rank: int = 0) -> Device:
    """The device for an accelerator type; pure (nothing imported or touched)."""
    if kind == "cpu":
        return Device("cpu", "cpu", "gloo")
    if kind == "ascend":
        return Device("ascend", f"npu:{local_rank}", "hccl")
    if kind == "gpu":
        return Device("gpu", f"cuda:{local_rank}", "nccl")
    raise ValueError(f"accelerator.type {kind!r}: use cpu, ascend or gpu")


def activate(device: Device):
    """Make the device usable in this process and return its torch.device."""
    import torch

    if device.kind == "ascend":
        try:
            import torch_npu  # noqa: F401 - registers the npu device and hccl
        except ImportError as exc:
            raise RuntimeError("accelerator.type ascend needs torch_npu: "
                               "pip install 'rljob[npu]' in the runtime image") from exc
        torch.npu.set_device(device.name)
    elif device.kind == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("accelerator.type gpu but torch sees no CUDA device "
                               "(check the pod's GPU request and the image's torch build)")
        torch.cuda.set_device(device.name)
    return torch.device(device.name)


CORES_ENV = "RLJOB_CORES"  # the cores `rljob run --no-pin-cores` gives a worker, by count


def cores_given(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """Cores this process may compute on: its CPU affinity (what `rljob run` pinned it
    to), or the count `rljob run --no-pin-cores` gave it (RLJOB_CORES), capped by a
    cgroup v2 CPU limit (a pod's `limits.cpu`)."""
    import math
    import os

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if os.environ.get(CORES_ENV, "").isdigit():
        n = min(n, max(1, int(os.environ[CORES_ENV])))
    try:
        quota, period = open(cpu_max).read().split()[:2]
        if quota != "max":
            n = min(n, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)
