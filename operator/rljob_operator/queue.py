"""An RLJob queued by Kueue: the contract of Kueue's job framework, kept by this
operator for its own kind (Kueue's manager lists RLJob in
`integrations.externalFrameworks` and never creates Workloads for it; Kubeflow's
and Ray's operators keep the same contract through Kueue's Go library).

A job labelled `kueue.x-k8s.io/queue-name` starts nothing of its own: the operator
suspends it and creates a Workload (kueue.x-k8s.io/v1beta2) it owns, with one pod
set per role (transferqueue, storage, trainer, rollout) whose templates are the
pods the job would run. When Kueue admits the Workload, the operator writes the
admission (each role's flavors' node labels and tolerations, and what admission
checks add) on the job and resumes it; its pods carry them (`with_admission`).
When Kueue evicts it (preemption, a deactivated Workload), the operator suspends
the job (its trainer checkpoints on SIGTERM, its TransferQueue stays) and, once no
trainer or rollout pod is left, gives the quota back (QuotaReserved False); a later
admission resumes it from the checkpoint. When the job ends, the Workload is
finished and its finalizer goes.

Pure functions; handlers.py applies them (`Operator._queue`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from rljob.api import RLJob, builders
from rljob.api.spec.pods import PodTemplateOverride

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # a WorkloadPriorityClass
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"  # the Workload's finalizer
GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
API_VERSION = f"{GROUP}/{VERSION}"
# the admission the job runs under, as the operator wrote it on start (JSON: role ->
# nodeSelector, tolerations, labels, annotations); an eviction keeps the part of the
# roles that stay (STAYS)
ADMISSION_ANNOTATION = "rljob.dev/admission"
# the Workload's conditions the job's status mirrors (what a platform dashboard reads)
MIRRORED = ("QuotaReserved", "Admitted")
# the roles a suspended job keeps running: its table stays with them
STAYS = ("transferqueue", "storage")


def queue_name(meta: dict) -> str | None:
    """The LocalQueue a job names (its kueue.x-k8s.io/queue-name label), if any."""
    return (meta.get("labels") or {}).get(QUEUE_LABEL) or None


def workload_name(job: str, uid: str) -> str:
    """The job's Workload: one per job object (a job deleted and created again under
    the same name gets a new one)."""
    return f"rljob-{job[:50]}-{hashlib.sha256(uid.encode()).hexdigest()[:5]}"


def _template(obj: dict) -> dict:
    """A pod's or a pod template's metadata (labels, annotations) and spec."""
    meta = obj["metadata"]
    return {"metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
            "spec": obj["spec"]}


def pod_sets(job: RLJob) -> list[dict]:
    """One pod set per role, its template the pods the job runs (as built for its
    first run) and its count: the TransferQueue pod, the storage units, the trainer
    gang's ranks, the rollout replicas (spec.rollout.replicas) and, with reward.url,
    the reward replicas."""
    spec = job.spec
    tq = builders.build_tq_deployment(job)["spec"]["template"]
    redis = builders.build_redis_statefulset(job)["spec"]["template"]
    return [
        {"name": "transferqueue", "count": 1, "template": _template(tq)},
        {"name": "storage", "count": spec.transfer_queue.storage_units,
         "template": _template(redis)},
        {"name": "trainer", "count": spec.trainer.num_nodes,
         "template": _template(builders.build_trainer_pod(job, 0))},
        {"name": "rollout", "count": spec.rollout.replicas,
         "template": _template(builders.build_rollout_pod(job, 0))},
    ] + ([{"name": "reward", "count": builders.reward_replicas(job),
           "template": _template(builders.build_reward_pod(job, 0))}]
         if builders.reward_replicas(job) else [])


def build_workload(job: RLJob, uid: str, queue: str,
                   priority: tuple[str, int] | None = None) -> dict:
    """The job's Workload, owned by it (garbage-collected with it), in its queue;
    `priority`: its WorkloadPriorityClass's name and value (Kueue wants both)."""
    name, ns = job.metadata.name, job.metadata.namespace
    wl = {
        "apiVersion": API_VERSION, "kind": "Workload",
        "metadata": {
            "name": workload_name(name, uid), "namespace": ns,
            "labels": {JOB_UID_LABEL: uid, builders.LABEL_NAME: name},
            "finalizers": [RESOURCE_IN_USE],
            "ownerReferences": [{
                "apiVersion": job.api_version, "kind": "RLJob", "name": name,
                "uid": uid, "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"queueName": queue, "podSets": pod_sets(job)},
    }
    if priority:
        wl["spec"]["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass",
                                          "name": priority[0]}
        wl["spec"]["priority"] = priority[1]
    return wl


def condition(obj: dict | None, kind: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def is_true(obj: dict | None, kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c.get("status") == "True"


def flavors_of(wl: dict) -> set[str]:
    """The ResourceFlavors the Workload's admission assigns."""
    admission = (wl.get("status") or {}).get("admission") or {}
    return {f for a in admission.get("podSetAssignments") or []
            for f in (a.get("flavors") or {}).values()}


def admission(wl: dict, flavors: dict[str, dict]) -> dict[str, dict]:
    """Each pod set's share of the Workload's admission: the node labels and
    tolerations of the ResourceFlavors assigned to it (`flavors`: name ->
    ResourceFlavor) and the labels, annotations, node selector and tolerations its
    admission checks add (podSetUpdates)."""
    out: dict[str, dict] = {}
    status = wl.get("status") or {}
    for a in (status.get("admission") or {}).get("podSetAssignments") or []:
        role = out.setdefault(a["name"], {})
        for name in sorted(set((a.get("flavors") or {}).values())):
            spec = (flavors.get(name) or {}).get("spec") or {}
            role.setdefault("nodeSelector", {}).update(spec.get("nodeLabels") or {})
            role.setdefault("tolerations", []).extend(spec.get("tolerations") or [])
    for check in status.get("admissionChecks") or []:
        for update in check.get("podSetUpdates") or []:
            role = out.setdefault(update["name"], {})
            for key in ("labels", "annotations", "nodeSelector"):
                if update.get(key):
                    role.setdefault(key, {}).update(update[key])
            if update.get("tolerations"):
                role.setdefault("tolerations", []).extend(update["tolerations"])
    return {r: {k: v for k, v in d.items() if v} for r, d in out.items()}


def kept_through_eviction(written: str | None) -> str | None:
    """What stays of the admission annotation (`written`) while an evicted job
    waits: the placement of the roles a suspension keeps running (its TransferQueue
    and storage units, `STAYS`), so their pods are not rebuilt (and the table lost)
    because the admission went; None if nothing stays."""
    kept = {r: a for r, a in json.loads(written or "{}").items() if r in STAYS and a}
    return json.dumps(kept, sort_keys=True) if kept else None


def with_admission(job: RLJob, written: str | None) -> RLJob:
    """The job as it runs under its admission (the annotation's JSON, `admission`):
    its podTemplateOverrides and, after them, one per admitted role."""
    if not written:
        return job
    added = []
    for role, a in sorted(json.loads(written).items()):
        if role not in ("trainer", "rollout", "reward", "transferqueue", "storage") or not a:
            continue
        added.append(PodTemplateOverride.model_validate({
            "roles": [role],
            "metadata": {k: a[k] for k in ("labels", "annotations") if a.get(k)},
            "spec": {k: a[k] for k in ("nodeSelector", "tolerations") if a.get(k)}}))
    if not added:
        return job
    spec = job.spec.model_copy(update={
        "pod_template_overrides": [*job.spec.pod_template_overrides, *added]})
    return job.model_copy(update={"spec": spec})


@dataclass(frozen=True)
class Step:
    """What the operator does about a queued job now."""
    action: str  # create | wait | start | stop | release | finish | run | done
    reason: str = ""
    message: str = ""


def decide(wl: dict | None, suspended: bool, active: bool,
           finished: tuple[bool, str] | None) -> Step:
    """The next step of a queued job, from its Workload (None: none yet), whether
    its spec says suspend, whether any trainer or rollout pod of it is left, and
    how it ended (succeeded, message) if it did (pure; jobframework's order)."""
    if finished is not None:
        if wl is None or is_true(wl, "Finished"):
            return Step("done")
        ok, message = finished
        return Step("finish", "Succeeded" if ok else "Failed", message)
    if wl is None:
        return Step("create")
    if is_true(wl, "Finished"):
        return Step("done")
    evicted = condition(wl, "Evicted")
    if evicted is not None and evicted.get("status") == "True":
        if not suspended:
            return Step("stop", evicted.get("reason", "Evicted"),
                        f"evicted by Kueue: {evicted.get('message', '')}".strip(": "))
        if is_true(wl, "QuotaReserved") and not active:
            return Step("release", evicted.get("reason", "Evicted"),
                        evicted.get("message", ""))
        return Step("wait")
    if is_true(wl, "Admitted"):
        return Step("start") if suspended else Step("run")
    if not suspended:
        return Step("stop", "NotAdmitted", "not admitted by its ClusterQueue")
    return Step("wait")


def mirrored_conditions(wl: dict | None) -> list[dict]:
    """The Workload's QuotaReserved and Admitted conditions, for the job's status
    (False/Pending before the Workload has them)."""
    out = []
    for kind in MIRRORED:
        c = condition(wl, kind)
        if c is None:
            out.append({"type": kind, "status": "False", "reason": "Pending",
                        "message": "waiting for Kueue" if wl else "no Workload yet"})
        else:
            out.append({k: c[k] for k in ("type", "status", "reason", "message",
                                          "lastTransitionTime") if k in c})
    return out


def release_status(wl: dict, reason: str, message: str, now: str) -> dict:
    """The Workload status patch that gives its quota back after an eviction, once
    the job's pods are gone: QuotaReserved and Admitted False, no admission, and
    Requeued True after a preemption (Kueue then admits it again when it fits)."""
    conds = []
    requeue = reason in ("Preempted", "NodeFailures")
    for kind, status_, why in (("QuotaReserved", "False", "Pending"),
                               ("Admitted", "False", "NoReservation"),
                               ("Requeued", "True" if requeue else "False", reason)):
        old = condition(wl, kind)
        changed = old is None or old.get("status") != status_
        conds.append({"type": kind, "status": status_, "reason": why,
                      "message": message[:32768] or why,
                      "lastTransitionTime": now if changed else old["lastTransitionTime"],
                      "observedGeneration": wl["metadata"].get("generation", 0)})
    return {"admission": None, "conditions": _merge(wl, conds)}


def finished_status(wl: dict, reason: str, message: str, now: str) -> dict:
    """The Workload status patch that declares it finished."""
    return {"conditions": _merge(wl, [{
        "type": "Finished", "status": "True", "reason": reason,
        "message": message[:32768] or reason, "lastTransitionTime": now,
        "observedGeneration": wl["metadata"].get("generation", 0)}])}


def _merge(wl: dict, new: list[dict]) -> list[dict]:
    kinds = {c["type"] for c in new}
    return [c for c in ((wl.get("status") or {}).get("conditions") or [])
            if c.get("type") not in kinds] + new
