"""A queued job's rollout count under its quota: Kueue's elastic workload slices.

A job that opts in (`kueue.x-k8s.io/elastic-job: "true"`, Kueue's own annotation for
elastic jobs; Kueue's `ElasticJobsViaWorkloadSlices` feature gate on) changes its
rollout count without giving its quota back and queueing again:

- **Out**: more rollout replicas than its admitted Workload holds ask Kueue for a new
  Workload, a slice: the same pod sets with the larger rollout count, annotated
  `kueue.x-k8s.io/workload-slice-replacement-for: NAMESPACE/CURRENT`. Kueue's
  scheduler charges the ClusterQueue only the difference, preempts nothing for the
  slice's sake and, when the difference fits, reserves the slice's quota and
  finishes the slice it replaces (`WorkloadSliceReplaced`). Until then the job runs
  at the count it holds and says it waits (condition `ScaleAdmitted` False,
  `WaitingForQuota`); once the slice holds quota the job adopts it (annotation
  `rljob.dev/workload-slice`) and adds the replicas.
- **In**: fewer replicas remove pods first; once no more rollout pods are left than
  asked, the admitted Workload's rollout count is lowered in place (Kueue admits
  that for elastic Workloads) and the ClusterQueue's usage drops at once.
- A slice not admitted yet is withdrawn (deleted) when the count asked changes
  again, when the job is evicted or ends.

Kueue's scheduler, not its job framework, finishes the replaced slice
(`pkg/scheduler`'s `replaceWorkloadSlice` at v0.17.0), so a Workload that an
operator owns gets the same treatment as a Job's. Pure functions; handlers.py
applies them (`Operator._slices`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .queue import RESOURCE_IN_USE, is_true, workload_name

ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
REPLACEMENT_FOR = "kueue.x-k8s.io/workload-slice-replacement-for"
SLICE_ANNOTATION = "rljob.dev/workload-slice"  # the job's: the index of its slice
ROLLOUT = "rollout"


def elastic(meta: dict) -> bool:
    return (meta.get("annotations") or {}).get(ELASTIC_ANNOTATION) == "true"


def index(meta: dict) -> int:
    """The job's current slice (0: the Workload it was queued with)."""
    try:
        return max(0, int((meta.get("annotations") or {}).get(SLICE_ANNOTATION, 0)))
    except ValueError:
        return 0


def slice_name(job: str, uid: str, k: int) -> str:
    """Slice `k` of a job's Workload; 0 is the Workload it was queued with. Within 63
    characters (Kueue puts Workload names in label values)."""
    if k == 0:
        return workload_name(job, uid)
    return f"{workload_name(job[:44], uid)}-s{k}"


def rollout_count(wl: dict) -> int:
    """The rollout pod set's count the Workload asks for."""
    return next((ps.get("count", 0) for ps in wl["spec"]["podSets"]
                 if ps["name"] == ROLLOUT), 0)


def build_slice(current: dict, k: int, job: str, uid: str, replicas: int) -> dict:
    """The slice that replaces `current` with `replicas` rollout replicas (pure): its
    pod sets in the same order (Kueue pairs them by position), its queue, priority,
    labels, owner and finalizer."""
    meta = current["metadata"]
    spec = {**copy.deepcopy(current["spec"]), **with_rollouts(current, replicas)["spec"]}
    return {
        "apiVersion": current["apiVersion"], "kind": "Workload",
        "metadata": {
            "name": slice_name(job, uid, k), "namespace": meta["namespace"],
            "labels": dict(meta.get("labels") or {}),
            "annotations": {REPLACEMENT_FOR: f"{meta['namespace']}/{meta['name']}"},
            "finalizers": [RESOURCE_IN_USE],
            "ownerReferences": copy.deepcopy(meta.get("ownerReferences") or [])},
        "spec": spec,
    }


@dataclass(frozen=True)
class Scale:
    """What the operator does about a queued job's rollout count now."""
    action: str  # none | resize | ask | wait | adopt | withdraw | shrink
    count: int = 0  # the rollout count it holds (adopt: the slice's)


def decide(current: dict | None, pending: dict | None, desired: int, rollouts: int,
           running: bool) -> Scale:
    """The next step for an elastic job's rollout count (pure): its current Workload
    and the slice asked for after it (None: none), the replicas its spec asks for,
    the rollout pods it has (terminating ones too: they hold their requests until
    gone) and whether it runs (admitted, not ended)."""
    if current is None:
        return Scale("none")
    held = rollout_count(current)
    if pending is not None and is_true(pending, "QuotaReserved"):
        # Kueue replaced the current slice with it (a count asked since is the next
        # step's, against the slice adopted)
        return Scale("adopt", rollout_count(pending))
    if pending is not None and (not running or rollout_count(pending) != desired):
        return Scale("withdraw", held)
    if not running:
        if not is_true(current, "QuotaReserved") and not is_true(current, "Finished") \
                and held != desired:
            return Scale("resize", desired)  # no quota held: the count is the spec's
        return Scale("none", held)
    if pending is not None:
        return Scale("wait", held)
    if desired > held:
        return Scale("ask", held)
    if desired < held:
        return Scale("shrink", desired) if rollouts <= desired else Scale("wait", held)
    return Scale("none", held)


def with_rollouts(wl: dict, replicas: int) -> dict:
    """The Workload spec patch that sets its rollout count in place (pure; the pod
    sets whole: a merge patch replaces the list): lower on an admitted Workload, any
    on one that holds no quota."""
    sets = copy.deepcopy(wl["spec"]["podSets"])
    for ps in sets:
        if ps["name"] == ROLLOUT:
            ps["count"] = replicas
    return {"spec": {"podSets": sets}}


def condition(scale: Scale, desired: int, pending: str | None, now: str,
              previous: dict | None) -> dict:
    """The job's ScaleAdmitted condition: whether the rollout count it asks for is
    the one its quota holds."""
    waiting = scale.action in ("ask", "wait") and desired > scale.count
    ok = not waiting
    if waiting:
        reason = "WaitingForQuota"
        message = (f"{desired} rollout replicas asked of Kueue (Workload "
                   f"{pending or 'being created'}); {scale.count} run within the quota "
                   "held meanwhile")
    else:
        reason, message = "Admitted", f"{scale.count} rollout replicas within the quota held"
    status = "True" if ok else "False"
    changed = previous is None or previous.get("status") != status
    return {"type": "ScaleAdmitted", "status": status, "reason": reason,
            "message": message,
            "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now)}
