"""Which accelerators each worker of a local run (`rljob run`) computes on.

On a host with several accelerators every trainer rank and rollout replica gets
devices of its own: trainer rank r the r-th device, then each replica its
`rollout.npusPerReplica` (its tensor-parallel workers), in order. A worker sees only
its own devices (`CUDA_VISIBLE_DEVICES` / `ASCEND_RT_VISIBLE_DEVICES`), numbered from
0 there, with `LOCAL_RANK` 0: the same YAML runs on one 8-device host as on a
cluster, where each pod is given its devices by the device plugin. The plan is pure
(`device_plan`); `count` looks at the host."""

from __future__ import annotations

import glob
import os

VISIBLE = {"gpu": "CUDA_VISIBLE_DEVICES", "ascend": "ASCEND_RT_VISIBLE_DEVICES"}


def device_plan(spec, available: int) -> dict[str, tuple[int, ...]]:
    """worker → its device indices on this host (empty for CPU roles). With fewer
    devices than the workers need, workers share them round robin (a one-GPU
    machine runs a trainer and a rollout on its one device); then weights cannot go
    over a collective between a trainer and a rollout on one device (NCCL and HCCL
    refuse two ranks on one device). Raises ValueError (one line naming the fields)
    when the host has none, or the weights' collective would meet on one device."""
    roles = [("trainer", [f"trainer-{r}" for r in range(spec.trainer.world_size)], 1),
             ("rollout", [f"rollout-{i}" for i in range(spec.rollout.replicas)],
              spec.rollout.npus_per_replica)]
    need = sum(len(names) * per for role, names, per in roles
               if spec.accelerator_for(role).type != "cpu")
    if need and not available:
        kind = next(spec.accelerator_for(role).type for role, _, _ in roles
                    if spec.accelerator_for(role).type != "cpu")
        raise ValueError(f"accelerator.type {kind}: this host has no such device; run on "
                         "a host that has them, or set accelerator.type cpu")
    plan: dict[str, tuple[int, ...]] = {}
    nxt = 0
    for role, names, per in roles:
        accelerated = spec.accelerator_for(role).type != "cpu"
        for name in names:
            plan[name] = tuple((nxt + k) % available for k in range(per)) if accelerated \
                else ()
            nxt += per if accelerated else 0
    if need > available and spec.weight_transport == "collective":
        trainer = set(plan.get("trainer-0", ()))
        if any(trainer & set(d) for w, d in plan.items() if w.startswith("rollout-")):
            raise ValueError(
                f"this host has {available} device(s) for {need} (trainer.numNodes × "
                f"trainer.npusPerNode = {spec.trainer.world_size}, plus rollout.replicas "
                f"{spec.rollout.replicas} × rollout.npusPerReplica "
                f"{spec.rollout.npus_per_replica}), so the trainer and a rollout share "
                "one, and a collective cannot meet two ranks on one device; set "
                "workflow.weightTransport: grpc, or lower the counts")
    return plan


def shared(plan: dict[str, tuple[int, ...]]) -> bool:
    """Whether two workers compute on one device."""
    used = [d for ds in plan.values() for d in ds]
    return len(used) != len(set(used))


def worker_env(kind: str, devices: tuple[int, ...]) -> dict[str, str]:
    """The environment that gives a worker its devices (none on CPU)."""
    if not devices or kind not in VISIBLE:
        return {}
    return {VISIBLE[kind]: ",".join(map(str, devices)), "LOCAL_RANK": "0"}


def count(kind: str) -> int:
    """The accelerators of `kind` on this host, as visible to this process."""
    if kind == "cpu":
        return 0
    visible = os.environ.get(VISIBLE[kind])
    if visible is not None:
        return len([x for x in visible.split(",") if x.strip()])
    if kind == "ascend":  # the Ascend driver's device nodes
        return len(glob.glob("/dev/davinci[0-9]*"))
    import torch

    return torch.cuda.device_count()


def describe(plan: dict[str, tuple[int, ...]], kinds: dict[str, str]) -> str:
    """One line: which worker computes on which devices."""
    parts = [f"{w} → {kinds[w]} {','.join(map(str, d))}" for w, d in plan.items() if d]
    if not parts:
        return ""
    return "devices: " + "; ".join(parts) + (" (shared: fewer devices than workers)"
                                             if shared(plan) else "")
