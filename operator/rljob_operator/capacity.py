"""Whether a job fits the cluster's free capacity before it starts: the check that
keeps a job larger than the free nodes from holding part of them (pure).

Without a gang scheduler (`scheduling.schedulerName: volcano`) and without Kueue, the
pods a job creates are scheduled one by one: a job too large for the nodes would run
its TransferQueue and some ranks, hold their CPU, memory and accelerators, and wait
for the rest forever. Before it creates anything, the operator places the pods the
job starts with (the TransferQueue, its storage units, every trainer rank and the
`rollout.minReplicas` replicas) on the nodes' free capacity, first-fit decreasing,
honouring node selectors and NoSchedule/NoExecute taints. If they do not all fit,
the job creates nothing and says so (Suspended, reason WaitingForCapacity); the
check runs again on each reconcile. It is a check, not a reservation: two jobs
checked at the same moment may both start. Kueue and Volcano reserve.

A node's free capacity is its allocatable less the requests of the pods bound to it
that have not ended. A pod's requests are the scheduler's: the larger of its
containers' (with sidecars) and any init container's (with the sidecars started
before it), plus its overhead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rljob.api import RLJob, builders

ENDED = ("Succeeded", "Failed")


def pod_requests(pod: dict) -> dict[str, float]:
    """What the scheduler reserves for `pod` (resource -> amount; cpu in cores)."""
    spec = pod.get("spec") or {}

    def of(container: dict) -> dict[str, float]:
        req = (container.get("resources") or {}).get("requests") or {}
        return {k: builders.quantity(str(v)) for k, v in req.items()}

    def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}

    def most(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: max(a.get(k, 0.0), b.get(k, 0.0)) for k in a.keys() | b.keys()}

    sidecars: dict[str, float] = {}
    peak: dict[str, float] = {}
    for init in spec.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":  # a sidecar: runs on with the pod
            sidecars = add(sidecars, of(init))
        else:
            peak = most(peak, add(sidecars, of(init)))
    total: dict[str, float] = dict(sidecars)
    for c in spec.get("containers") or []:
        total = add(total, of(c))
    overhead = {k: builders.quantity(str(v)) for k, v in (spec.get("overhead") or {}).items()}
    return {k: v for k, v in add(most(total, peak), overhead).items() if v}


@dataclass
class Node:
    name: str
    labels: dict[str, str]
    taints: list[dict]
    free: dict[str, float]


def free_nodes(nodes: list[dict], pods: list[dict]) -> list[Node]:
    """The schedulable, Ready nodes with what their bound, running pods leave free."""
    used: dict[str, dict[str, float]] = {}
    for p in pods:
        host = (p.get("spec") or {}).get("nodeName")
        if not host or (p.get("status") or {}).get("phase") in ENDED:
            continue
        u = used.setdefault(host, {})
        for k, v in pod_requests(p).items():
            u[k] = u.get(k, 0.0) + v
    out = []
    for n in nodes:
        meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if spec.get("unschedulable") or not ready:
            continue
        alloc = {k: builders.quantity(str(v))
                 for k, v in (status.get("allocatable") or {}).items()}
        u = used.get(meta.get("name", ""), {})
        out.append(Node(meta.get("name", ""), meta.get("labels") or {},
                        spec.get("taints") or [],
                        {k: v - u.get(k, 0.0) for k, v in alloc.items()}))
    return out


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    """Whether one of `tolerations` tolerates `taint` (Kubernetes' matching)."""
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True  # PreferNoSchedule only steers
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


@dataclass
class Demand:
    """One pod the job starts with: its role, requests and placement."""
    role: str
    requests: dict[str, float]
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, role: str, pod: dict) -> Demand:
        spec = pod.get("spec") or {}
        return cls(role, pod_requests(pod), dict(spec.get("nodeSelector") or {}),
                   list(spec.get("tolerations") or []))


def job_demand(job: RLJob) -> list[Demand]:
    """The pods `job` starts with, as built: the TransferQueue, its storage units,
    every trainer rank, `rollout.minReplicas` replicas and the reward replicas."""
    spec = job.spec
    tq = builders.build_tq_deployment(job)["spec"]["template"]
    redis = builders.build_redis_statefulset(job)["spec"]["template"]
    return ([Demand.of("transferqueue", tq)]
            + [Demand.of("storage", redis)] * spec.transfer_queue.storage_units
            + [Demand.of("trainer", builders.build_trainer_pod(job, r))
               for r in range(spec.trainer.num_nodes)]
            + [Demand.of("rollout", builders.build_rollout_pod(job, i))
               for i in range(spec.rollout.min_replicas)]
            + [Demand.of("reward", builders.build_reward_pod(job, i))
               for i in range(builders.reward_replicas(job))])


def _fmt(resource: str, amount: float) -> str:
    if resource == "cpu":
        return f"{amount:g}"
    if resource in ("memory", "ephemeral-storage"):
        return (f"{amount / 2 ** 30:.1f}Gi" if abs(amount) >= 2 ** 30
                else f"{amount / 2 ** 20:.0f}Mi")
    return f"{amount:g}"


def place(demand: list[Demand], nodes: list[Node]) -> str | None:
    """None if every pod of `demand` fits the nodes' free capacity together (first
    fit, largest CPU first); else one line saying which pod does not and what the
    nodes have free."""
    free = {n.name: dict(n.free) for n in nodes}
    for d in sorted(demand, key=lambda d: (-d.requests.get("cpu", 0.0),
                                          -d.requests.get("memory", 0.0))):
        for n in nodes:
            if any(n.labels.get(k) != v for k, v in d.node_selector.items()):
                continue
            if not all(tolerates(d.tolerations, t) for t in n.taints):
                continue
            room = free[n.name]
            if all(room.get(k, 0.0) >= v for k, v in d.requests.items()):
                for k, v in d.requests.items():
                    room[k] = room.get(k, 0.0) - v
                break
        else:
            want = ", ".join(f"{k} {_fmt(k, v)}" for k, v in sorted(d.requests.items()))
            roomiest = sorted(nodes, key=lambda n: -free[n.name].get("cpu", 0.0))[:3]
            have = "; ".join(
                f"{n.name}: " + ", ".join(f"{k} {_fmt(k, free[n.name].get(k, 0.0))}"
                                          for k in sorted(d.requests))
                for n in roomiest) or "no Ready, schedulable node"
            total = len(demand)
            return (f"its {total} starting pods do not fit the free capacity together: a "
                    f"{d.role} pod ({want or 'no requests'}) has no node left (free, "
                    f"after the pods placed before it, on the roomiest nodes: {have})")
    return None


def needs_check(job: RLJob, queued: bool, started: bool) -> bool:
    """Whether the job's start waits for this check: not yet started, not queued by
    Kueue, not placed by a gang scheduler, not suspended."""
    return not (started or queued or builders.volcano(job) or job.spec.suspend)
