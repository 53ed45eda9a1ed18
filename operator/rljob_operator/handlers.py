"""kopf handlers: thin. Each one builds the job model, asks the pure planner
what to do (`reconcile.plan`, `autoscaler.observe`) and applies it.

create / update / resume react at once; a timer per RLJob re-reconciles every
few seconds (level-based: whatever drifted is put back), polls the job's
TransferQueue controller for progress and runs the autoscaler.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from rljob.api import GROUP, PLURAL, VERSION, RLJob, builders
from rljob.contract import LIVE_PROFILE_SKIP, TLS_CA_ENV, operator_manages
from rljob.infra import auth, tls

from . import capacity, metrics, queue, slices
from .autoscaler import Memory, awaiting_live_profile, check_prediction, observe
from .kube import Kube, NotInstalled
from .reconcile import (iso, new_scale, now_utc, parse_time, plan, pod_view, role_of,
                        status_patch)
from .stats import ADDRESS_ANNOTATION, StatsClient
from .workers import MeasuredExecutor

# Keys of RLJob.status this operator owns (anything else is dropped on compare).
STATUS_KEYS = ("observedGeneration", "conditions", "startTime", "completionTime", "progress",
               "rollout", "trainer", "reward", "lastScale")
# Re-apply the long-lived children at least this often even without spec changes.
REAPPLY_SECONDS = 60.0

log = logging.getLogger("rljob_operator")


PROFILE_KEY = "profile.json"  # the key of rollout.autoscaling.profileConfigMap's profile
PROFILE_SECONDS = 60.0  # how often that ConfigMap is read again


@dataclass(frozen=True)
class Views:
    """The operator's views of its jobs' pods and Workloads, fed by watches (kopf
    indexes, `register`): a reconcile reads them instead of listing per job."""

    pod_index: Mapping
    workload_index: Mapping

    def pods(self, namespace: str, job: str) -> list[dict]:
        return list(self.pod_index.get((namespace, job), ()))

    def workload(self, namespace: str, name: str) -> dict | None:
        return next(iter(self.workload_index.get((namespace, name), ())), None)


def admission_state(wl: dict) -> tuple:
    """What of a Workload's status starts, stops or ends its job."""
    status = wl.get("status") or {}
    conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return (tuple(conds.get(t) for t in ("QuotaReserved", "Admitted", "Evicted", "Finished")),
            (status.get("admission") or {}).get("clusterQueue"))


@dataclass
class JobState:
    """What the operator keeps in memory per RLJob (lost on restart, by design:
    everything that matters is re-read from the cluster)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    autoscaler: Memory = field(default_factory=Memory)
    applied: tuple[int | None, float] = (None, 0.0)  # (generation, when)
    warned: set[str] = field(default_factory=set)
    # rollout.autoscaling.profileConfigMap, as last read: (profile it trusts or None,
    # the condition's reason and message, when read)
    profile: tuple = (None, "", "", -1e9)
    # the job's live profile, as last read from its controller: (profile or None, the
    # condition's reason and message), None before its trainer reported one; and the
    # record it was built from (a poll that brings the same record builds nothing)
    live: tuple | None = None
    live_record: str = ""
    # (first, latest) step its controller reported, None before the first report; a
    # step below the first starts over (a trainer life restored from a checkpoint)
    steps: tuple[int, int] | None = None
    token: str = ""  # the job's token (its Secret's), once read
    # the watch-fed views (`register`'s indexes) may not yet show what this operator
    # just wrote: after it created or deleted a pod, or wrote the Workload, the next
    # reconcile reads them from the API instead
    wrote_pods: bool = True
    wrote_workload: bool = True
    workload_seen: tuple = ()  # the Workload's admission state at its last event
    ca: str = ""  # with transferQueue.tls, the job's CA certificate (its Secret's)
    # the job's generation after this operator's last change of its spec: a body older
    # than that (a kopf event or timer behind it) is read again before it is acted on
    generation: int = 0
    # an elastic queued job asked Kueue for more rollout replicas than it holds
    # (slices.py): the autoscaler holds until Kueue answers
    scale_waiting: bool = False
    rollouts_held: int | None = None  # ... and the count its quota holds while it runs


class Operator:
    def __init__(self, kube: Kube | None = None, stats: StatsClient | None = None,
                 capacity_check: bool = True,
                 network: builders.NetworkAccess = builders.NetworkAccess(operator_namespace=None)):
        self._kube = kube
        self.capacity_check = capacity_check  # capacity.py: a start waits for room
        self.network = network  # each job's NetworkPolicy (builders/network.py)
        self.stats = stats or StatsClient()
        self._jobs: dict[tuple[str, str], JobState] = {}
        self._jobs_lock = threading.Lock()

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube()
        return self._kube

    def state(self, namespace: str, name: str) -> JobState:
        with self._jobs_lock:
            return self._jobs.setdefault((namespace, name), JobState())

    def forget(self, namespace: str, name: str) -> None:
        with self._jobs_lock:
            self._jobs.pop((namespace, name), None)
        metrics.forget(namespace, name)

    # ---- one reconcile ----------------------------------------------------
    def reconcile(self, body: kopf.Body, trigger: str, poll_stats: bool,
                  views: Views | None = None) -> None:
        """One reconcile of the job in `body`; `views` are the watch-fed pods and
        Workloads (None: read from the API)."""
        metrics.RECONCILES.labels(trigger).inc()
        try:
            with metrics.RECONCILE_SECONDS.labels(trigger).time():
                self._reconcile(body, trigger, poll_stats, views)
        except Exception:
            metrics.ERRORS.labels(trigger).inc()
            raise

    def _reconcile(self, body: kopf.Body, trigger: str, poll_stats: bool,
                   views: Views | None) -> None:
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        state = self.state(ns, name)
        with state.lock:
            body = self._current(body, state)
            if body is None:  # gone
                return
            meta, job = body["metadata"], to_job(body)
            raw_status = {k: copy.deepcopy(v) for k, v in (body.get("status") or {}).items()
                          if k in STATUS_KEYS}
            generation = meta.get("generation")
            finished = bool(raw_status.get("completionTime"))
            pods = self._pods(ns, name, state, views)
            queued = queue.queue_name(meta)
            view, hold = None, False
            if queued:  # Kueue admits it (queue.py)
                job, hold, view = self._queue(body, job, raw_status, pods, state, views)
                if hold:  # never admitted: no pod of it either
                    job.spec.suspend = True
            elif self.capacity_check and not pods and capacity.needs_check(
                    job, False, bool(raw_status.get("startTime"))):
                short = self._capacity_short(body, job, state)
                if short:  # nothing of it until all of it fits
                    hold, view = True, ("WaitingForCapacity", short, [])
                    job.spec.suspend = True
            if not finished and not hold:
                self._apply_children(job, state, generation, body)

            busy: dict[str, int] = {}
            auto = job.spec.rollout.autoscaling
            progress = raw_status.get("progress")
            running = raw_status.get("startTime") and not finished and not job.spec.suspend
            if poll_stats and running:
                address = (meta.get("annotations", {}).get(ADDRESS_ANNOTATION)
                           or builders.tq_address(job))
                try:
                    token, ca = self._credentials(job, state)
                    stats = self.stats.fetch(address, token, ca)
                except grpc.RpcError as exc:
                    log.debug("%s/%s: stats from %s unavailable: %s", ns, name, address,
                              exc.code())
                    stats = None
                if stats is not None:
                    busy = stats.busy
                    fresh = stats.progress(iso(now_utc()))
                    if not progress or {k: v for k, v in progress.items()
                                        if k != "lastUpdatedTime"} != {
                            k: v for k, v in fresh.items() if k != "lastUpdatedTime"}:
                        progress = fresh
                    # under a queue: the count admitted, or with elastic slices the
                    # count Kueue answers for
                    if auto.enabled and (not queued or (slices.elastic(meta)
                                                        and not state.scale_waiting)):
                        first = state.steps[0] if state.steps else None
                        state.steps = (stats.step if first is None or stats.step < first
                                       else first, stats.step)
                        self._live(job, state, stats.profile)
                        self._autoscale(body, job, state, raw_status, stats,
                                        self._trusted(job, state))

            if queued and state.rollouts_held is not None:  # no more than its quota
                job.spec.rollout.replicas = min(job.spec.rollout.replicas, state.rollouts_held)
            trusted = self._trusted(job, state) if auto.enabled else None
            p = plan(job, raw_status, pods, now_utc(), generation, busy,
                     None if trusted is None else (trusted[0] is not None, *trusted[1:3]),
                     view)
            self._apply_plan(body, p, state)
            status = p.status
            if progress:
                status["progress"] = progress
            patch = status_patch(raw_status, status)
            if patch:
                self.kube.patch_status(ns, name, patch)
            for e in p.events:
                kopf.event(body, type=e.type, reason=e.reason, message=e.message)
            self._gauges(ns, name, job, status)

    def _pods(self, ns: str, name: str, state: JobState, views: Views | None) -> list[dict]:
        """The job's pods as the watch has them, or listed (no watch, or this operator
        just created or deleted one of them)."""
        pods = (self.kube.list_pods(ns, name) if views is None or state.wrote_pods
                else views.pods(ns, name))
        state.wrote_pods = False
        return pods

    def _apply_plan(self, body, p, state: JobState) -> None:
        """The plan's pods created and deleted, and the children of a finished job
        cleaned up when its time came."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        state.wrote_pods = (bool(p.delete) or p.cleanup
                            or any(o["kind"] == "Pod" for o in p.create))
        for obj in p.create:
            if self.kube.create(obj):
                metrics.CHILDREN.labels(obj["kind"]).inc()
        for pod_name in dict.fromkeys(p.delete):
            self.kube.delete_pod(ns, pod_name)
        if p.cleanup:
            n = self.kube.delete_children(ns, name)
            if n:
                kopf.event(body, type="Normal", reason="Cleaned",
                           message=f"deleted {n} child object(s): "
                                   "runPolicy.ttlSecondsAfterFinished passed")

    def _queue(self, body, job: RLJob, raw_status: dict, pods: list[dict],
               state: JobState, views: Views | None) -> tuple[RLJob, bool, tuple | None]:
        """A queued job's step (`queue.decide`), applied: its Workload created, the
        job started under its admission, stopped on an eviction, the quota given back,
        the Workload finished. Returns the job as it runs (under its admission),
        whether it must hold its children (never admitted yet) and what its status
        shows of the queue (the Suspended condition's reason and message, and the
        Workload's conditions)."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        qname = queue.queue_name(meta)
        elastic = slices.elastic(meta)
        k = slices.index(meta) if elastic else 0
        state.rollouts_held = None
        wl_name = slices.slice_name(name, uid, k)
        try:
            wl = self._workload(ns, wl_name, state, views)
        except NotInstalled:
            self._warn_once(body, state, "kueue", "QueueUnavailable",
                            f"labelled {queue.QUEUE_LABEL}={qname}, but Kueue's Workload API "
                            "(kueue.x-k8s.io/v1beta2) is not served here: install Kueue, or "
                            "remove the label to run without a queue")
            return job, not raw_status.get("startTime"), (
                "QueueUnavailable", "Kueue's Workload API is not installed", [])
        previous = {c["type"]: c for c in raw_status.get("conditions") or []}
        ended = next(((kind == "Succeeded", previous[kind].get("message", ""))
                      for kind in ("Succeeded", "Failed")
                      if previous.get(kind, {}).get("status") == "True"), None)
        active = any(role_of(p) in ("trainer", "rollout", "reward") for p in pods)
        scaled = None
        if elastic and wl is not None:  # its rollout count within its quota
            wl, scaled = self._slices(body, job, wl, k, pods, ended, previous, state, views)
            wl_name = wl["metadata"]["name"]
        step = queue.decide(wl, job.spec.suspend, active, ended)
        if views is not None and step.action in ("start", "stop", "release"):
            # the watch's view may lag behind what Kueue wrote (and what a reconcile
            # read a moment ago): a job is started or stopped only on its Workload as
            # the API has it now
            wl = self.kube.get_custom(queue.GROUP, queue.VERSION, queue.PLURAL, wl_name, ns)
            step = queue.decide(wl, job.spec.suspend, active, ended)
        annotation = (meta.get("annotations") or {}).get(queue.ADMISSION_ANNOTATION)
        if step.action == "create":
            missing = self._create_workload(body, job, state, qname)
            if missing:  # its priority class: it waits
                return job, not raw_status.get("startTime"), (
                    "PriorityClassMissing", f"no WorkloadPriorityClass {missing}",
                    queue.mirrored_conditions(None))
        elif step.action == "start":
            annotation = self._start(body, job, wl)
        elif step.action == "stop":
            # the TransferQueue and storage units stay where they were admitted
            annotation = queue.kept_through_eviction(annotation)
            self._patch_job(ns, name, {
                "metadata": {"annotations": {queue.ADMISSION_ANNOTATION: annotation}},
                "spec": {"suspend": True}})
            job.spec.suspend = True
            kopf.event(body, type="Warning", reason=step.reason or "Evicted",
                       message=f"{step.message}: suspended (the trainer checkpoints, the "
                               "TransferQueue stays)")
        elif step.action == "release":
            state.wrote_workload = True
            if self._patch_workload_status(ns, wl, queue.release_status(
                    wl, step.reason, step.message, iso(now_utc()))):
                kopf.event(body, type="Normal", reason="QuotaReleased",
                           message=f"the job's pods are gone: its quota is given back and "
                                   f"it waits in LocalQueue {qname} again")
        elif step.action in ("finish", "done") and wl is not None:
            self._finish_workload(ns, wl, step, state)
        if job.spec.suspend and not raw_status.get("startTime"):
            why = ("Queued", f"waiting for admission in LocalQueue {qname}")
        elif job.spec.suspend:
            why = ("Evicted", f"evicted by Kueue, waiting in LocalQueue {qname} again")
        else:
            why = ("Admitted", "")
        return (queue.with_admission(job, annotation),
                job.spec.suspend and not raw_status.get("startTime"),
                (*why, queue.mirrored_conditions(wl) + ([scaled] if scaled else [])))

    def _finish_workload(self, ns: str, wl: dict, step: queue.Step, state: JobState) -> None:
        """An ended job's Workload finished (`finish`) and freed of its finalizer."""
        written = True
        if step.action == "finish":
            state.wrote_workload = True
            written = self._patch_workload_status(ns, wl, queue.finished_status(
                wl, step.reason, step.message, iso(now_utc())))
        if written and (step.action == "finish"
                        or queue.RESOURCE_IN_USE in (wl["metadata"].get("finalizers") or [])):
            state.wrote_workload = True
            self._drop_finalizer(ns, wl["metadata"]["name"])

    def _current(self, body, state: JobState):
        """The job to act on: `body`, or where it is older than this operator's own
        last change of the job's spec (a kopf event or timer behind it: acted on, it
        would undo that change, e.g. delete the pods of a job it just resumed), the job
        as the API has it now; None where it is gone."""
        meta = body["metadata"]
        if (meta.get("generation") or 0) >= state.generation:
            return body
        return self.kube.get_custom(GROUP, VERSION, PLURAL, meta["name"], meta["namespace"])

    def _patch_job(self, ns: str, name: str, patch: dict) -> None:
        generation = self.kube.patch_job(ns, name, patch) or 0
        state = self.state(ns, name)
        state.generation = max(state.generation, generation)

    @staticmethod
    def _warn_once(body, state: JobState, key: str, reason: str, message: str) -> None:
        if key not in state.warned:
            state.warned.add(key)
            kopf.event(body, type="Warning", reason=reason, message=message)

    def _slices(self, body, job: RLJob, wl: dict, k: int, pods: list[dict], ended,
                previous: dict, state: JobState, views: Views | None) -> tuple[dict, dict | None]:
        """An elastic queued job's rollout count within its quota (`slices.decide`),
        applied: a slice asked for, adopted once Kueue reserved its quota, withdrawn,
        or the admitted count lowered in place. The job runs (its `spec.rollout.replicas`
        here) at the count its quota holds. Returns its current Workload and, while it
        runs, its ScaleAdmitted condition."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        kind = (queue.GROUP, queue.VERSION, queue.PLURAL)
        desired, current = job.spec.rollout.replicas, wl["metadata"]["name"]
        running = (ended is None and not job.spec.suspend and queue.is_true(wl, "Admitted")
                   and not queue.is_true(wl, "Evicted"))
        pending_name = slices.slice_name(name, uid, k + 1)
        pending = (views.workload(ns, pending_name) if views is not None
                   else self.kube.get_custom(*kind, pending_name, ns))
        scale = slices.decide(wl, pending, desired, sum(role_of(p) == "rollout" for p in pods),
                              running)
        if scale.action != "wait" and scale.action != "none":
            state.wrote_workload = True
        if scale.action == "withdraw":
            self._drop_finalizer(ns, pending_name)
            self.kube.delete_custom(*kind, ns, pending_name)
            pending = None
            kopf.event(body, type="Normal", reason="ScaleWithdrawn",
                       message=f"Workload {pending_name} withdrawn: the job asks for "
                               f"{desired} rollout replicas" if running else
                       f"Workload {pending_name} withdrawn: the job no longer runs")
        elif scale.action in ("resize", "shrink"):
            try:
                self.kube.patch_custom(*kind, ns, current, slices.with_rollouts(wl, desired))
            except ApiException as exc:
                if exc.status not in (400, 403, 422):
                    raise
                kopf.event(body, type="Warning", reason="ScaleRefused",
                           message=f"Kueue refused the rollout count {desired} on Workload "
                                   f"{current} (is Kueue's ElasticJobsViaWorkloadSlices "
                                   f"feature gate on?): {str(exc.body)[:300]}")
            else:
                if scale.action == "shrink":
                    kopf.event(body, type="Normal", reason="QuotaReturned",
                               message=f"rollout replicas {slices.rollout_count(wl)} → "
                                       f"{desired}: their quota given back (Workload {current})")
        elif scale.action == "ask":
            if self.kube.create_custom(*kind, slices.build_slice(wl, k + 1, name, uid, desired)):
                kopf.event(body, type="Normal", reason="ScaleQueued",
                           message=f"asked Kueue for {desired} rollout replicas (Workload "
                                   f"{pending_name}, replacing {current})")
        elif scale.action == "adopt":
            self._patch_job(ns, name, {"metadata": {"annotations": {
                slices.SLICE_ANNOTATION: str(k + 1)}}})
            self._drop_finalizer(ns, current)
            kopf.event(body, type="Normal", reason="ScaleAdmitted",
                       message=f"Kueue admitted {scale.count} rollout replicas (Workload "
                               f"{pending_name} replaces {current})")
            wl = pending
        if running:  # the pods run at the count its quota holds
            job.spec.rollout.replicas = min(desired, scale.count)
            state.rollouts_held = scale.count
        state.scale_waiting = running and scale.action in ("ask", "wait") and desired > scale.count
        if not running:  # queued, evicted or ended: no count of its own to report
            return wl, None
        return wl, slices.condition(scale, desired, pending_name if scale.action in (
            "ask", "wait") else None, iso(now_utc()), previous.get("ScaleAdmitted"))

    def _workload(self, ns: str, wl_name: str, state: JobState,
                  views: Views | None) -> dict | None:
        """The job's Workload as its watch has it, or read (not watched yet, or just
        written here); None where there is none. Raises NotInstalled without Kueue."""
        wl = None if views is None or state.wrote_workload else views.workload(ns, wl_name)
        state.wrote_workload = False
        if wl is None:
            wl = self.kube.get_custom(queue.GROUP, queue.VERSION, queue.PLURAL, wl_name, ns)
        return wl

    def _start(self, body, job: RLJob, wl: dict) -> str:
        """The job started under its Workload's admission (its flavors' node labels and
        tolerations in the admission annotation); returns that annotation."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        flavors = {}
        for f in sorted(queue.flavors_of(wl)):
            flavors[f] = self.kube.get_custom(queue.GROUP, queue.VERSION,
                                              "resourceflavors", f) or {}
        annotation = json.dumps(queue.admission(wl, flavors), sort_keys=True)
        self._patch_job(ns, name, {
            "metadata": {"annotations": {queue.ADMISSION_ANNOTATION: annotation}},
            "spec": {"suspend": False}})
        job.spec.suspend = False
        cq = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
        kopf.event(body, type="Normal", reason="Admitted",
                   message=f"admitted by ClusterQueue {cq} (Workload "
                           f"{wl['metadata']['name']}): started")
        return annotation

    def _create_workload(self, body, job: RLJob, state: JobState, qname: str) -> str | None:
        """The job suspended (Kueue starts it) and its Workload created at its priority
        class's value; the name of a priority class that does not exist, if it names one
        (nothing is created then)."""
        meta = body["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if not job.spec.suspend:
            self._patch_job(ns, name, {"spec": {"suspend": True}})
            job.spec.suspend = True
        priority = None
        pc = (meta.get("labels") or {}).get(queue.PRIORITY_LABEL)
        if pc:
            found = self.kube.get_custom(queue.GROUP, queue.VERSION,
                                         "workloadpriorityclasses", pc)
            if found is None:
                if f"priority:{pc}" not in state.warned:
                    state.warned.add(f"priority:{pc}")
                    kopf.event(body, type="Warning", reason="PriorityClassMissing",
                               message=f"{queue.PRIORITY_LABEL}={pc}: no such "
                                       "WorkloadPriorityClass; create it or change "
                                       "the label (the job waits)")
                return pc
            priority = (pc, int(found.get("value", 0)))
        wl = queue.build_workload(job, uid, qname, priority)
        state.wrote_workload = True
        if self.kube.create_custom(queue.GROUP, queue.VERSION, queue.PLURAL, wl):
            kopf.event(body, type="Normal", reason="Queued",
                       message=f"waiting in LocalQueue {qname} "
                               f"(Workload {wl['metadata']['name']})")
        return None

    def _patch_workload_status(self, ns: str, wl: dict, status: dict) -> bool:
        """The Workload's status written at the version the decision read; False when
        Kueue changed it since (409): the next reconcile decides again on what it is."""
        try:
            self.kube.patch_custom(queue.GROUP, queue.VERSION, queue.PLURAL, ns,
                                   wl["metadata"]["name"], {
                                       "metadata": {"resourceVersion":
                                                    wl["metadata"]["resourceVersion"]},
                                       "status": status}, status=True)
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.debug("%s/%s: the Workload changed under its status patch; again next "
                      "reconcile", ns, wl["metadata"]["name"])
            return False
        return True

    def _capacity_short(self, body, job: RLJob, state: JobState) -> str | None:
        """Why the job's starting pods do not fit the nodes' free capacity together
        (capacity.py), None when they do or the nodes cannot be read (the operator's
        role lacks the cluster-wide reads: the job starts unchecked, said once)."""
        try:
            nodes = capacity.free_nodes(self.kube.list_nodes(), self.kube.list_live_pods())
        except ApiException as exc:
            if "capacity" not in state.warned:
                state.warned.add("capacity")
                log.warning("capacity check skipped: nodes and pods cannot be read (%s %s)",
                            exc.status, exc.reason)
            return None
        short = capacity.place(capacity.job_demand(job), nodes)
        if short and "capacity-wait" not in state.warned:  # one event a wait
            state.warned.add("capacity-wait")
            kopf.event(body, type="Warning", reason="WaitingForCapacity",
                       message=f"waits to start: {short}")
        return short

    def _drop_finalizer(self, ns: str, wl_name: str) -> None:
        """The Workload's finalizer removed (read again first: a status patch just
        changed its resourceVersion)."""
        wl = self.kube.get_custom(queue.GROUP, queue.VERSION, queue.PLURAL, wl_name, ns)
        if wl is None:
            return
        finalizers = wl["metadata"].get("finalizers") or []
        if queue.RESOURCE_IN_USE in finalizers:
            self.kube.patch_custom(queue.GROUP, queue.VERSION, queue.PLURAL, ns, wl_name, {
                "metadata": {"resourceVersion": wl["metadata"]["resourceVersion"],
                             "finalizers": [f for f in finalizers
                                            if f != queue.RESOURCE_IN_USE]}})

    def _owner_state(self, wl) -> tuple[str, JobState | None]:
        """The Workload's RLJob's name and its state (None: not reconciled yet; its
        own handlers come first)."""
        meta = wl["metadata"]
        owner = next(o["name"] for o in meta["ownerReferences"] if o.get("kind") == "RLJob")
        with self._jobs_lock:
            return owner, self._jobs.get((meta["namespace"], owner))

    def admission_moved(self, wl) -> bool:
        """Whether a Workload's admission changed since its job last saw it."""
        _, state = self._owner_state(wl)
        return state is not None and admission_state(wl) != state.workload_seen

    def workload_changed(self, wl: dict, views: Views) -> None:
        """A Workload of a job changed: where its admission did (admitted, evicted,
        finished), its job is reconciled now rather than at its next timer."""
        owner, state = self._owner_state(wl)
        seen = admission_state(wl)
        if state is None or seen == state.workload_seen:
            return
        state.workload_seen = seen
        body = self.kube.get_custom(GROUP, VERSION, PLURAL, owner, wl["metadata"]["namespace"])
        if body is None or not operator_manages((body.get("spec") or {}).get("managedBy")):
            return
        self.reconcile(body, "workload", poll_stats=False, views=views)

    def forget_workloads(self, ns: str, uid: str) -> None:
        """A deleted job's Workloads lose their finalizer (the garbage collector then
        deletes them with the job)."""
        try:
            wls = self.kube.list_custom(queue.GROUP, queue.VERSION, queue.PLURAL, ns,
                                        f"{queue.JOB_UID_LABEL}={uid}")
        except Exception as exc:  # noqa: BLE001 - Kueue absent: nothing to free
            log.debug("%s: no Workloads to release: %s", ns, exc)
            return
        for wl in wls:
            self._drop_finalizer(ns, wl["metadata"]["name"])

    def _credentials(self, job: RLJob, state: JobState, read: bool = False
                     ) -> tuple[str, str | None]:
        """The job's token and, with transferQueue.tls, its CA certificate, from its
        Secret (read again with `read`, as each apply of the children does), which is
        made here first if it is not there; what an older operator's Secret lacks (the
        token, the certificates) is added to it."""
        on = job.spec.transfer_queue.tls
        if state.token and not read:
            return state.token, (state.ca if on else None)
        ns, secret = job.metadata.namespace, builders.secret_name(job.metadata.name)
        data = self.kube.secret_data(ns, secret)
        if data is None:
            obj = builders.build_secret(job, builders.new_password(), auth.new_token(),
                                        tls.make().env() if on else None)
            if self.kube.create(obj):
                metrics.CHILDREN.labels("Secret").inc()
            data = self.kube.secret_data(ns, secret) or {}
        missing = {}
        if not data.get(builders.TOKEN_KEY):
            missing[builders.TOKEN_KEY] = auth.new_token()
        ca_key = builders.TLS_KEYS[TLS_CA_ENV]
        if on and not data.get(ca_key):
            missing.update({builders.TLS_KEYS[k]: v for k, v in tls.make().env().items()})
        if missing:
            self.kube.add_secret_keys(ns, secret, missing)
            data = {**data, **missing}
        state.token, state.ca = data[builders.TOKEN_KEY], data.get(ca_key, "")
        return state.token, (state.ca if on else None)

    def _apply_children(self, job: RLJob, state: JobState, generation, body) -> None:
        applied_gen, applied_at = state.applied
        if applied_gen == generation and time.monotonic() - applied_at < REAPPLY_SECONDS:
            return
        ns, name = job.metadata.namespace, job.metadata.name
        self._credentials(job, state, read=True)
        for obj in builders.build_services(job, self.network):
            try:
                self.kube.apply(obj)
            except Exception as exc:  # e.g. Volcano's PodGroup CRD is not installed
                if obj["kind"] != "PodGroup":
                    raise
                if "PodGroup" not in state.warned:
                    state.warned.add("PodGroup")
                    kopf.event(body, type="Warning", reason="PodGroupFailed",
                               message=f"cannot create the Volcano PodGroup (is Volcano "
                                       f"installed?): {str(exc)[:300]}")
        state.applied = (generation, time.monotonic())

    def _profile(self, job: RLJob, state: JobState) -> tuple:
        """rollout.autoscaling.profileConfigMap's profile, if it holds for this job
        (`Profile.fit`), with the ProfileTrusted condition's reason and message; read
        again at most every PROFILE_SECONDS."""
        if time.monotonic() - state.profile[3] < PROFILE_SECONDS:
            return state.profile
        from rljob.planner.profile import Profile

        ns, cm = job.metadata.namespace, job.spec.rollout.autoscaling.profile_config_map
        where = f"ConfigMap {cm}, key {PROFILE_KEY}"
        data = self.kube.config_map_data(ns, cm)
        profile, reason, message = None, "ProfileRefused", ""
        if data is None or PROFILE_KEY not in data:
            reason, message = "ProfileMissing", f"no {where}: autoscaling holds"
        else:
            try:
                profile, notes = Profile.from_json(data[PROFILE_KEY]).fit(job.spec, time.time())
            except ValueError as exc:
                notes = [str(exc)]
            if profile is None:
                message = f"{where}: {'; '.join(notes)}: autoscaling holds"
            else:
                reason = "Trusted"
                message = f"{where}: {profile.meta.get('source', 'a profile')}" + (
                    f" ({'; '.join(notes)})" if notes else "")
        state.profile = (profile, reason, message[:1024], time.monotonic())
        return state.profile

    @staticmethod
    def _live(job: RLJob, state: JobState, record: str) -> None:
        """The live profile in the controller's record of the trainer's recent steps
        (`planner.live.profile_from_records`), if it reported one."""
        if not record or record == state.live_record:
            return
        state.live_record = record
        from rljob.planner.live import profile_from_records

        try:
            rec = json.loads(record)
            steps = rec.get("steps") or [0, 0]
            profile, notes = profile_from_records(
                [rec], job.spec, f"live: steps {steps[0]}-{steps[-1]}").fit(job.spec,
                                                                           time.time())
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            profile, notes = None, [f"not a profile record: {exc}"]
        if profile is None:
            state.live = (None, "LiveProfileRefused",
                          f"the trainer's live profile: {'; '.join(notes)}"[:1024])
        else:
            state.live = (profile, "LiveProfile", f"live profile of steps {steps[0]}-"
                          f"{steps[-1]}, measured by the job's own pods")

    def _trusted(self, job: RLJob, state: JobState) -> tuple | None:
        """The profile δ′ comes from, with the ProfileTrusted condition's reason and
        message: the job's live profile once its trainer reports one, else
        rollout.autoscaling.profileConfigMap's (`_profile`); without either, while
        the trainer's first live record is due (`awaiting_live_profile`), none it
        trusts (LiveProfilePending: the autoscaler holds), and after that None (the
        analytic model, no condition). A live profile that does not hold falls back
        to the ConfigMap's, and without one the autoscaler holds."""
        live = state.live
        if live is not None and live[0] is not None:
            return live
        if job.spec.rollout.autoscaling.profile_config_map:
            return self._profile(job, state)
        if live is None:
            first, step = state.steps or (None, 0)
            if awaiting_live_profile(first, step):
                return (None, "LiveProfilePending",
                        f"waiting for the trainer's live profile (it reports one from its "
                        f"step {LIVE_PROFILE_SKIP + 1} on): autoscaling holds")
        return live

    def _autoscale(self, body, job: RLJob, state: JobState, raw_status: dict, stats,
                   trusted: tuple | None) -> None:
        replicas = job.spec.rollout.replicas
        auto = job.spec.rollout.autoscaling
        ns, name = job.metadata.namespace, job.metadata.name
        checked = check_prediction(state.autoscaler, stats.step, stats.gen_seconds, replicas,
                                   auto.consecutive_steps,
                                   (raw_status.get("rollout") or {}).get("readyReplicas"))
        if checked and raw_status.get("lastScale"):
            raw_status["lastScale"] = {**raw_status["lastScale"], **checked}
            self.kube.patch_status(ns, name, {"lastScale": raw_status["lastScale"]})
            metrics.SCALE_ERROR.labels(ns, name).set(checked["predictionError"])
            kopf.event(body, type="Normal", reason="ScalePredictionChecked",
                       message=f"Tgen at {replicas} rollout replicas: predicted "
                               f"{checked['predictedGenSeconds']:.2f}s, measured "
                               f"{checked['measuredGenSeconds']:.2f}s over "
                               f"{checked['checkedSteps']} step(s) "
                               f"(error {checked['predictionError']:+.0%})")
        profile = None if trusted is None else trusted[0]
        if trusted is not None and profile is None:
            return  # a profile it cannot trust: it holds (condition ProfileTrusted)
        last = parse_time((raw_status.get("lastScale") or {}).get("time"))
        action = observe(state.autoscaler, job.spec, replicas, stats.step, stats.gen_seconds,
                         stats.train_seconds, time.time(),
                         last.timestamp() if last else None, profile)
        if action is None:
            return
        d = action.decision
        direction = "out" if action.replicas_to > replicas else "in"
        raw_status["lastScale"] = new_scale({
            "time": iso(now_utc()), "from": replicas, "to": action.replicas_to,
            "reason": d.reason, "delta": round(d.gap, 4), "gain": round(d.gain, 4),
            "source": action.source,
            "predictedGenSeconds": round(action.predicted_gen_seconds, 4)})
        # the record first: a reconcile that sees the new spec.rollout.replicas then also
        # sees that the autoscaler made it (not a kubectl scale)
        self.kube.patch_status(ns, name, {"lastScale": raw_status["lastScale"]})
        self.kube.scale(ns, name, action.replicas_to)
        state.generation = max(state.generation,
                               (body["metadata"].get("generation") or 0) + 1)
        metrics.SCALES.labels(direction).inc()
        job.spec.rollout.replicas = action.replicas_to
        kopf.event(body, type="Normal", reason=f"ScaledRollout{direction.capitalize()}",
                   message=f"rollout replicas {replicas} → {action.replicas_to} at step "
                           f"{stats.step}: {d.reason} (δ={d.gap:.2f}s, δ′={d.gain:.2f}s, "
                           f"{action.source}; Tgen predicted "
                           f"{action.predicted_gen_seconds:.2f}s)")

    @staticmethod
    def _gauges(ns: str, name: str, job: RLJob, status: dict) -> None:
        prog = status.get("progress") or {}
        metrics.STEP.labels(ns, name).set(prog.get("step", 0))
        metrics.STALENESS.labels(ns, name).set(prog.get("stalenessMean", 0))
        metrics.TOKENS.labels(ns, name).set(prog.get("tokensPerSecond", 0))
        metrics.GEN.labels(ns, name).set(prog.get("genSeconds", 0))
        metrics.TRAIN.labels(ns, name).set(prog.get("trainSeconds", 0))
        metrics.ROLLOUTS.labels(ns, name).set(job.spec.rollout.replicas)
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in status.get("conditions", []))
        metrics.READY.labels(ns, name).set(1 if ready else 0)


def to_job(body: kopf.Body) -> RLJob:
    meta = body["metadata"]
    doc = {
        "apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta.get("uid")},
        "spec": dict(body.get("spec") or {}),
    }
    try:
        job = RLJob.model_validate(doc)
    except ValidationError as exc:
        # the CRD's schema and rules admit only valid specs; reaching this
        # means the CRD on the cluster is older than this operator
        raise kopf.PermanentError(f"spec does not validate (is the installed CRD older than "
                                  f"the operator? upgrade crds/rljob.yaml): {exc}") from None
    # the chart's runtimeImage: the image of pods whose RLJob names none
    return builders.with_runtime_image(job, os.environ.get("RLJOB_RUNTIME_IMAGE"))


def owned_by_a_job(meta, **_) -> bool:
    """Whether a Workload is an RLJob's (Kueue makes others for the kinds it runs)."""
    return any(o.get("kind") == "RLJob" and o.get("apiVersion", "").startswith(GROUP)
               for o in meta.get("ownerReferences") or [])


def managed_here(spec, **_) -> bool:
    """Whether this operator runs the job: its spec.managedBy is unset or the
    operator's own (another controller's jobs get no handler at all)."""
    return operator_manages((spec or {}).get("managedBy"))


def register(registry: kopf.OperatorRegistry, operator: Operator, interval: float) -> None:
    """Attach the handlers to `registry` (the timer's interval is fixed here)."""
    res = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry,
               when=managed_here)

    # the jobs' pods and Workloads, kept by watches: a reconcile reads these
    # instead of a list of pods and a read of the Workload per job and timer
    # (async: kopf runs them on its event loop; a sync one would take a worker thread
    # for every pod event)
    @kopf.index("pods", labels={builders.LABEL_NAME: kopf.PRESENT}, registry=registry,
                id="job_pods")
    async def job_pods(namespace, labels, body, **_):
        return {(namespace, labels[builders.LABEL_NAME]): pod_view(body)}

    workloads = dict(group=queue.GROUP, version=queue.VERSION, plural=queue.PLURAL,
                     labels={queue.JOB_UID_LABEL: kopf.PRESENT}, registry=registry,
                     when=owned_by_a_job)

    @kopf.index(**workloads, id="job_workloads")
    async def job_workloads(namespace, name, body, **_):
        return {(namespace, name): dict(body)}

    def views(kw: dict) -> Views:
        return Views(kw["job_pods"], kw["job_workloads"])

    def moved(meta, body, **_) -> bool:  # on the event loop, before a thread is taken
        return owned_by_a_job(meta) and operator.admission_moved(body)

    @kopf.on.event(**{**workloads, "when": moved}, id="workload")
    def on_workload(body, type, **kw):
        if type in ("ADDED", "MODIFIED", None):
            operator.workload_changed(dict(body), views(kw))

    @kopf.on.create(**res, id="create")
    def on_create(body, **kw):
        operator.reconcile(body, "create", poll_stats=False, views=views(kw))

    @kopf.on.update(**res, id="update", field="spec")
    def on_update(body, **kw):
        operator.reconcile(body, "update", poll_stats=False, views=views(kw))

    @kopf.on.resume(**res, id="resume")
    def on_resume(body, **kw):
        operator.reconcile(body, "resume", poll_stats=False, views=views(kw))

    @kopf.timer(**res, id="reconcile", interval=interval, initial_delay=interval)
    def on_timer(body, **kw):
        operator.reconcile(body, "timer", poll_stats=True, views=views(kw))

    @kopf.on.delete(**res, id="forget", optional=True)
    def on_delete(body, **_):
        meta = body["metadata"]
        operator.forget(meta["namespace"], meta["name"])
        if queue.queue_name(meta):
            operator.forget_workloads(meta["namespace"], meta["uid"])

    @kopf.on.probe(registry=registry, id="jobs")
    def probe(**_):
        return len(operator._jobs)


def configure(settings: kopf.OperatorSettings, workers: int) -> None:
    # kopf's bookkeeping goes to annotations: RLJob.status has a strict schema
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    # only our own kopf.event() calls become Events, not every log line
    settings.posting.level = logging.WARNING
    settings.execution.executor = MeasuredExecutor(max_workers=workers)
    # the pod and Workload watches carry the jobs' own objects only: the API server
    # filters them by label, not the operator after receiving every pod
    settings.watching.label_selectors["pods"] = builders.LABEL_NAME
    settings.watching.label_selectors[f"{queue.PLURAL}.{queue.GROUP}"] = queue.JOB_UID_LABEL
    settings.networking.request_timeout = 60
    settings.watching.server_timeout = 300
