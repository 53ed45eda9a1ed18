"""One level-based reconcile of an RLJob, as a pure function.

Input: the RLJob (spec + current status), the pods it owns as the apiserver
lists them, the time, and which rollout replicas hold leased rows. Output: a
`Plan` — pods to create and delete, the status to write, the events to post.
The handlers apply plans; they never decide anything themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rljob.contract import EXIT_PROBLEMS, PREFLIGHT_CONTAINER
from rljob.api import RLJob, builders


def now_utc() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


# ---- pod state --------------------------------------------------------------

def pod_ready(pod: dict) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def pod_view(pod) -> dict:
    """What a reconcile reads of a pod (its name, labels, annotations, deletion and
    status): the operator keeps this much of each of its jobs' pods in memory."""
    meta, status = pod["metadata"], pod.get("status") or {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels",
                                               "annotations", "deletionTimestamp")
                         if k in meta},
            "status": {k: status[k] for k in ("phase", "reason", "message", "conditions",
                                              "initContainerStatuses", "containerStatuses")
                       if k in status}}


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def deleting(pod: dict) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def preflight_problems(pod: dict) -> str | None:
    """The problems `rljob worker preflight` found in this pod (its termination
    message), or None when it passed, still runs, or failed for another reason (a
    crash or an OOM kill is a failure like any other, not a problem of the job)."""
    for c in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if c.get("name") != PREFLIGHT_CONTAINER:
            continue
        for state in (c.get("state"), c.get("lastState")):
            done = (state or {}).get("terminated") or {}
            if done.get("exitCode") == EXIT_PROBLEMS:
                return (done.get("message") or "").strip() or "the preflight check failed"
    return None


def status_patch(seen: dict, status: dict) -> dict:
    """The merge patch from the status a reconcile read (`seen`) to the one it
    computed: only the keys it changed (a key it did not compute stays as it is). A
    key it left as it read it is not written back, so a reconcile working from an
    older copy of the object cannot put back a value a later one wrote (pure)."""
    return {k: v for k, v in status.items() if seen.get(k) != v}


def role_of(pod: dict) -> str:
    return pod.get("metadata", {}).get("labels", {}).get(builders.LABEL_ROLE, "")


def _int_label(pod: dict, key: str) -> int:
    try:
        return int(pod["metadata"]["labels"][key])
    except (KeyError, ValueError):
        return -1


# ---- the plan ---------------------------------------------------------------

@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    create: list[dict] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # pod names
    status: dict = field(default_factory=dict)  # the whole status to write
    events: list[Event] = field(default_factory=list)
    cleanup: bool = False  # ttlSecondsAfterFinished passed: delete every child
    finished: bool = False


def _condition(previous: dict[str, dict], type_: str, ok: bool, reason: str, message: str,
               generation: int | None, now: datetime) -> dict:
    status = "True" if ok else "False"
    old = previous.get(type_)
    changed = old is None or old.get("status") != status
    return {
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": iso(now) if changed else old.get("lastTransitionTime", iso(now)),
        "observedGeneration": generation,
    }


def choose_rollouts_to_remove(pods: list[dict], count: int, busy: dict[str, int]) -> list[dict]:
    """Which replicas go on scale-in: never one mid-generation if avoidable.
    Not-ready replicas first, then those holding the fewest leased rows, then
    the highest index."""
    def key(p: dict):
        name = p["metadata"]["name"]
        return (pod_ready(p), busy.get(name, 0), -_int_label(p, builders.LABEL_REPLICA))
    return sorted(pods, key=key)[:count]


@dataclass
class Observed:
    """What the job's status and pods say now (`observe`)."""
    raw_status: dict
    previous: dict[str, dict]  # the conditions written last, by type
    by_role: dict[str, list[dict]]
    trainers: list[dict]  # not being deleted
    rollouts: list[dict]  # not being deleted
    rewards: list[dict]  # not being deleted (reward.url's replicas)
    terminating: set[str]  # pod names being deleted
    restarts: int  # trainer gang restarts so far
    progressed: bool  # the job reported a step
    started: datetime | None
    completed: datetime | None
    failed: bool
    succeeded: bool

    @property
    def current_restart(self) -> list[dict]:
        """The trainer pods of the current gang generation."""
        return [p for p in self.trainers if _gang_generation(p) == str(self.restarts)]


def _gang_generation(pod: dict) -> str:
    return pod["metadata"].get("annotations", {}).get(builders.ANNOTATION_GANG_RESTART, "0")


def observe(raw_status: dict, pods: list[dict]) -> Observed:
    previous = {c["type"]: c for c in raw_status.get("conditions") or []}
    by_role: dict[str, list[dict]] = {}
    for p in pods:
        by_role.setdefault(role_of(p), []).append(p)
    return Observed(
        raw_status=raw_status, previous=previous, by_role=by_role,
        trainers=[p for p in by_role.get("trainer", []) if not deleting(p)],
        rollouts=[p for p in by_role.get("rollout", []) if not deleting(p)],
        rewards=[p for p in by_role.get("reward", []) if not deleting(p)],
        terminating={p["metadata"]["name"] for p in pods if deleting(p)},
        restarts=int((raw_status.get("trainer") or {}).get("restarts", 0)),
        progressed=bool((raw_status.get("progress") or {}).get("step")),
        started=parse_time(raw_status.get("startTime")),
        completed=parse_time(raw_status.get("completionTime")),
        failed=previous.get("Failed", {}).get("status") == "True",
        succeeded=previous.get("Succeeded", {}).get("status") == "True")


Outcome = tuple[str, str, str]  # (condition, reason, message)


def terminal_outcome(job: RLJob, obs: Observed, now: datetime) -> tuple[Outcome | None, bool]:
    """How an unfinished job ends now, if it does: its preflight failed, rank 0
    succeeded, the gang failed past its backoff limit, or its deadline passed; and
    whether the gang restarts instead (a failure within the backoff limit)."""
    spec = job.spec
    if obs.completed is not None:
        return None, False
    trainers, restarts = obs.trainers, obs.restarts
    rank0 = next((p for p in trainers if _int_label(p, builders.LABEL_RANK) == 0), None)
    failed_ranks = sorted(_int_label(p, builders.LABEL_RANK) for p in trainers
                          if pod_phase(p) == "Failed")
    current = obs.current_restart
    deadline = spec.run_policy.active_deadline_seconds
    problems = preflight_problems(rank0) if rank0 is not None else None
    if problems is not None:
        # the job itself is wrong (a path, a key, the reward): a restart would fail
        # the same way
        return ("Failed", "PreflightFailed", " · ".join(problems.splitlines())), False
    if rank0 is not None and pod_phase(rank0) == "Succeeded" and rank0 in current:
        return ("Succeeded", "TrainerSucceeded", f"trained {spec.algorithm.max_steps} steps"), False
    if failed_ranks and [p for p in current if pod_phase(p) == "Failed"]:
        if restarts >= spec.run_policy.backoff_limit:
            return ("Failed", "BackoffLimitExceeded",
                    f"trainer rank(s) {failed_ranks} failed after {restarts} gang "
                    f"restart(s) (runPolicy.backoffLimit {spec.run_policy.backoff_limit})"), False
        return None, True
    if lost_ranks(job, obs) and not spec.suspend:
        # a rank's pod went (deleted, evicted) while its peers run: they cannot go on
        # without it, and a rank that came back alone would join a gang at another
        # step; the whole gang restarts from the checkpoint, as after a failure
        return None, True
    if (deadline and obs.started is not None and not spec.suspend
            and (now - obs.started).total_seconds() >= deadline):
        return ("Failed", "DeadlineExceeded",
                f"ran longer than runPolicy.activeDeadlineSeconds ({deadline}s)"), False
    return None, False


def lost_ranks(job: RLJob, obs: Observed) -> list[int]:
    """The ranks of a gang of several whose pods of the current generation are being
    deleted (by someone else: the operator deletes only pods of older generations, or
    all of them to suspend) (pure). None for a gang of one, whose pod simply comes back
    from the checkpoint. Seen while the pods terminate (their grace period), before
    the names are free again."""
    if job.spec.trainer.num_nodes < 2:
        return []
    return sorted(_int_label(p, builders.LABEL_RANK) for p in obs.by_role.get("trainer", [])
                  if deleting(p) and _gang_generation(p) == str(obs.restarts))


def _gang_restart_event(job: RLJob, obs: Observed, restarts: int, limit: int) -> Event:
    failed_ranks = sorted(_int_label(p, builders.LABEL_RANK) for p in obs.current_restart
                          if pod_phase(p) == "Failed")
    what = (f"trainer rank(s) {failed_ranks} failed" if failed_ranks else
            f"the pod(s) of trainer rank(s) {lost_ranks(job, obs)} went")
    return Event("Warning", "TrainerGangRestart",
                 f"{what}: restarting the whole gang from its last checkpoint "
                 f"({restarts}/{limit})")


def finished_pods(job: RLJob, obs: Observed, completed: datetime, now: datetime,
                  out: Plan) -> None:
    """A finished job frees the accelerators (finished trainer pods stay for their
    logs) and, past ttlSecondsAfterFinished, asks for every child to go."""
    out.delete += [p["metadata"]["name"] for p in obs.rollouts + obs.rewards]
    out.delete += [p["metadata"]["name"] for p in obs.trainers
                   if pod_phase(p) not in ("Succeeded", "Failed")]
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    if ttl is not None and (now - completed).total_seconds() >= ttl:
        out.cleanup = True


def trainer_gang(job: RLJob, obs: Observed, restarts: int, out: Plan) -> None:
    """Every rank of the current restart generation, and no other trainer pod."""
    spec, name = job.spec, job.metadata.name
    for p in obs.trainers:
        if (_gang_generation(p) != str(restarts)
                or _int_label(p, builders.LABEL_RANK) >= spec.trainer.num_nodes):
            out.delete.append(p["metadata"]["name"])
    have = {_int_label(p, builders.LABEL_RANK) for p in obs.trainers}
    for rank in range(spec.trainer.num_nodes):
        pod_name = builders.trainer_pod_name(name, rank)
        if rank not in have and pod_name not in obs.terminating:
            # a trainer pod deleted (or evicted) after the job made progress comes
            # back from the last checkpoint, not from step 0
            out.create.append(builders.build_trainer_pod(job, rank, restarts,
                                                  resume=restarts > 0 or obs.progressed))


def rollout_replicas(job: RLJob, obs: Observed, busy: dict[str, int], out: Plan) -> None:
    """Evicted or failed replicas are replaced; the count follows the spec (scale-in
    removes the least busy, new replicas take the lowest free indices)."""
    name, desired = job.metadata.name, job.spec.rollout.replicas
    live = []
    for p in obs.rollouts:
        if pod_phase(p) in ("Failed", "Succeeded"):
            out.delete.append(p["metadata"]["name"])
        else:
            live.append(p)
    if len(live) > desired:
        for p in choose_rollouts_to_remove(live, len(live) - desired, busy):
            out.delete.append(p["metadata"]["name"])
    elif len(live) < desired:
        used = {_int_label(p, builders.LABEL_REPLICA) for p in live}
        used |= {int(n.rsplit("-", 1)[1]) for n in obs.terminating
                 if n.startswith(f"{name}-rollout-")}
        index = 0
        for _ in range(desired - len(live)):
            while index in used:
                index += 1
            used.add(index)
            out.create.append(builders.build_rollout_pod(job, index))


def reward_replicas(job: RLJob, obs: Observed, out: Plan) -> None:
    """reward.url's replicas: a failed or evicted one is replaced, the count follows
    reward.replicas (none without reward.url; the highest indices go first)."""
    name, desired = job.metadata.name, builders.reward_replicas(job)
    live = []
    for p in obs.rewards:
        if pod_phase(p) in ("Failed", "Succeeded"):
            out.delete.append(p["metadata"]["name"])
        else:
            live.append(p)
    by_index = sorted(live, key=lambda p: _int_label(p, builders.LABEL_REPLICA))
    out.delete += [p["metadata"]["name"] for p in by_index[desired:]]
    used = {_int_label(p, builders.LABEL_REPLICA) for p in by_index[:desired]}
    for index in range(desired):
        if index not in used and builders.reward_pod_name(name, index) not in obs.terminating:
            out.create.append(builders.build_reward_pod(job, index))


# status.lastScale's optional figures: a new record names each (None where it has
# none), so that the merge patch the status goes out as removes the previous
# scale's (its prediction check above all) instead of keeping them beside the new one
SCALE_FIGURES = ("delta", "gain", "source", "predictedGenSeconds", "measuredGenSeconds",
                 "predictionError", "checkedSteps")


def new_scale(record: dict) -> dict:
    """A new status.lastScale (`SCALE_FIGURES` it does not set: None) (pure)."""
    return {**dict.fromkeys(SCALE_FIGURES), **record}


def scale_record(job: RLJob, obs: Observed, now: datetime, status: dict,
                 out: Plan) -> dict:
    """The last scaling decision: a change of spec.rollout.replicas not made by the
    autoscaler (kubectl scale, an edit) is recorded like the autoscaler's own."""
    desired = job.spec.rollout.replicas
    previous_desired = (obs.raw_status.get("rollout") or {}).get("replicas")
    last_scale = obs.raw_status.get("lastScale") or {}
    if previous_desired and previous_desired != desired and last_scale.get("to") != desired:
        status["lastScale"] = new_scale({
            "time": iso(now), "from": previous_desired, "to": desired,
            "reason": "spec.rollout.replicas changed (kubectl scale or edit)"})
        out.events.append(Event("Normal", "ScaleRequested",
                                f"rollout replicas {previous_desired} → {desired} requested"))
        last_scale = status["lastScale"]
    return last_scale


@dataclass
class Readiness:
    tq: bool  # the controller
    storage: int  # storage units ready
    trainer: int  # trainer nodes ready (and staying)
    rollout: int  # rollout replicas ready (and staying)
    reward: int = 0  # reward replicas ready (and staying)


def readiness(obs: Observed, out: Plan) -> Readiness:
    def kept(pods):
        return sum(pod_ready(p) for p in pods if p["metadata"]["name"] not in out.delete)
    return Readiness(tq=any(pod_ready(p) for p in obs.by_role.get("transferqueue", [])),
                     storage=sum(pod_ready(p) for p in obs.by_role.get("storage", [])),
                     trainer=kept(obs.trainers), rollout=kept(obs.rollouts),
                     reward=kept(obs.rewards))


def conditions(job: RLJob, obs: Observed, ready_: Readiness, last_scale: dict,
               finished: bool, failed: bool, succeeded: bool, outcome: Outcome | None,
               generation: int | None, now: datetime) -> list[dict]:
    """The job's conditions: Ready first, then each component's, Scaling, Suspended,
    and Succeeded / Failed once it ends."""
    spec, previous, g, n = job.spec, obs.previous, generation, now
    units, nodes = spec.transfer_queue.storage_units, spec.trainer.num_nodes
    desired, minimum = spec.rollout.replicas, spec.rollout.min_replicas
    tq_ok = ready_.tq and ready_.storage >= units
    conds = [
        _condition(previous, "TransferQueueReady", tq_ok,
                   "Ready" if tq_ok else "Waiting",
                   f"controller {'ready' if ready_.tq else 'not ready'}, "
                   f"{ready_.storage}/{units} storage unit(s) ready", g, n),
        _condition(previous, "TrainerReady", ready_.trainer >= nodes,
                   "Ready" if ready_.trainer >= nodes else "Waiting",
                   f"{ready_.trainer}/{nodes} trainer node(s) ready", g, n),
        _condition(previous, "RolloutReady", ready_.rollout >= minimum,
                   "Ready" if ready_.rollout >= minimum else "Waiting",
                   f"{ready_.rollout}/{desired} rollout replica(s) ready "
                   f"(minReplicas {minimum})", g, n),
    ]
    if spec.reward.streamed:  # reward.url: its replicas are needed to train
        rewards = builders.reward_replicas(job)
        conds.append(_condition(previous, "RewardReady", ready_.reward >= rewards,
                                "Ready" if ready_.reward >= rewards else "Waiting",
                                f"{ready_.reward}/{rewards} reward replica(s) ready", g, n))
    parts = len(conds)  # the components Ready waits for
    scaling = (not finished and not spec.suspend and bool(last_scale)
               and last_scale.get("to") == desired and ready_.rollout != desired)
    conds.append(_condition(
        previous, "Scaling", scaling, "ScalingOut" if scaling and last_scale.get("from", 0) < desired
        else "ScalingIn" if scaling else "Stable",
        f"rollout replicas {last_scale.get('from')} → {desired}: {ready_.rollout} ready"
        if scaling else f"{ready_.rollout}/{desired} rollout replica(s) ready", g, n))
    conds.append(_condition(previous, "Suspended", spec.suspend and not finished,
                            "Suspended" if spec.suspend else "Running",
                            "spec.suspend is true: trainer and rollout pods deleted, "
                            "TransferQueue kept" if spec.suspend else "", g, n))
    ready = (not finished and not spec.suspend
             and all(c["status"] == "True" for c in conds[:parts]))
    not_ready = [c["type"] for c in conds[:parts] if c["status"] != "True"]
    conds.insert(0, _condition(
        previous, "Ready", ready,
        "Running" if ready else ("Finished" if finished else "Suspended" if spec.suspend
                                 else "Waiting"),
        "every component is ready" if ready else
        ("the job finished" if finished else "suspended" if spec.suspend
         else "waiting for " + ", ".join(not_ready)), g, n))
    if succeeded or (outcome and outcome[0] == "Succeeded"):
        reason, message = (outcome[1], outcome[2]) if outcome else (
            previous["Succeeded"]["reason"], previous["Succeeded"]["message"])
        conds.append(_condition(previous, "Succeeded", True, reason, message, g, n))
    if failed:
        reason, message = (outcome[1], outcome[2]) if outcome else (
            previous["Failed"]["reason"], previous["Failed"]["message"])
        conds.append(_condition(previous, "Failed", True, reason, message, g, n))
    return conds


def transition_events(previous: dict[str, dict], conds: list[dict]) -> list[Event]:
    """An event for each readiness condition that changed."""
    return [Event("Normal" if c["status"] == "True" else "Warning",
                  f"{c['type']}{c['status']}", c["message"])
            for c in conds
            if (old := previous.get(c["type"])) is not None
            and old.get("status") != c["status"]
            and c["type"] in ("Ready", "TransferQueueReady", "TrainerReady", "RolloutReady",
                              "RewardReady")]


def plan(job: RLJob, raw_status: dict, pods: list[dict], now: datetime,
         generation: int | None, busy: dict[str, int] | None = None,
         profile: tuple[bool, str, str] | None = None,
         queued: tuple[str, str, list[dict]] | None = None) -> Plan:
    """Compare what the job asks for with the pods that exist; say what to do:
    the terminal state, the pods to create and delete, the status and events.
    `queued` (a job Kueue admits, queue.py, or one that waits for capacity,
    capacity.py): why it is suspended (reason, message) and the Workload's conditions
    its status mirrors (none for a capacity wait)."""
    spec = job.spec
    out = Plan()
    obs = observe(raw_status, pods)
    status = {k: v for k, v in raw_status.items() if k != "conditions"}
    if obs.started is None and not spec.suspend:
        obs.started = now
        status["startTime"] = iso(now)
        out.events.append(Event("Normal", "Started", "created the job's children"))

    outcome, gang_restart = terminal_outcome(job, obs, now)
    restarts, completed = obs.restarts, obs.completed
    failed, succeeded = obs.failed, obs.succeeded
    if gang_restart:
        restarts += 1
        out.events.append(_gang_restart_event(job, obs, restarts,
                                               spec.run_policy.backoff_limit))
    if outcome is not None:
        cond, reason, message = outcome
        completed = now
        status["completionTime"] = iso(now)
        failed, succeeded = cond == "Failed", cond == "Succeeded"
        out.events.append(Event("Normal" if succeeded else "Warning", reason, message))
    out.finished = finished = completed is not None

    if finished:
        finished_pods(job, obs, completed, now, out)
    elif spec.suspend:
        out.delete += [p["metadata"]["name"] for p in obs.trainers + obs.rollouts + obs.rewards]
    else:
        trainer_gang(job, obs, restarts, out)
        rollout_replicas(job, obs, busy or {}, out)
        reward_replicas(job, obs, out)

    ready_ = readiness(obs, out)
    status["observedGeneration"] = generation
    status["rollout"] = {"replicas": spec.rollout.replicas, "readyReplicas": ready_.rollout,
                         "selector": builders.selector_string(job.metadata.name, "rollout")}
    status["trainer"] = {"readyNodes": ready_.trainer, "restarts": restarts}
    if spec.reward.streamed:
        status["reward"] = {"replicas": builders.reward_replicas(job),
                            "readyReplicas": ready_.reward}
    last_scale = scale_record(job, obs, now, status, out)
    conds = conditions(job, obs, ready_, last_scale, finished, failed, succeeded, outcome,
                       generation, now)
    if profile is not None:  # (trusted, reason, message) of autoscaling's profile
        conds.insert(-1 if failed or succeeded else len(conds), _condition(
            obs.previous, "ProfileTrusted", *profile, generation, now))
    if queued is not None:
        reason, message, mirrored = queued
        for c in conds:
            if c["type"] == "Suspended" and spec.suspend and not finished:
                c["reason"], c["message"] = reason, message
        at = len(conds) - (1 if failed or succeeded else 0)
        conds[at:at] = [{**c, "observedGeneration": generation} for c in mirrored]
    out.events += transition_events(obs.previous, conds)
    status["conditions"] = conds
    out.status = status
    return out
