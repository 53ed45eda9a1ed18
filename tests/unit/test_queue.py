"""A queued job's pure parts (rljob_operator/queue.py): its Workload, the admission
its pods carry, and the step the operator takes from the Workload's conditions. The
lifecycle against a real Kueue: tests/cluster/test_kueue.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from rljob.api import RLJob, builders
from rljob_operator import queue

REPO = Path(__file__).resolve().parents[2]


def _job(**spec) -> RLJob:
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"].update(namespace="team-a", labels={queue.QUEUE_LABEL: "lq"})
    doc["spec"].update(spec)
    return RLJob.model_validate(doc)


def _cond(kind: str, status: str = "True", reason: str = "R", message: str = "m") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-28T00:00:00Z"}


def _wl(*conds, admission=None) -> dict:
    return {"metadata": {"name": "w", "generation": 1, "resourceVersion": "7"},
            "status": {"conditions": list(conds),
                       **({"admission": admission} if admission else {})}}


def test_the_workload_has_a_pod_set_per_role_with_the_pods_the_job_runs():
    job = _job(trainer={"numNodes": 2, "checkpointPvc": "ck"})
    wl = queue.build_workload(job, "uid-1", "lq", ("high", 1000))
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    meta = wl["metadata"]
    assert meta["name"] == queue.workload_name("quickstart-cluster", "uid-1")
    assert meta["namespace"] == "team-a" and meta["finalizers"] == [queue.RESOURCE_IN_USE]
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "RLJob", "quickstart-cluster", "uid-1", True)
    assert wl["spec"]["queueName"] == "lq"
    assert wl["spec"]["priorityClassRef"]["name"] == "high" and wl["spec"]["priority"] == 1000
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert {n: p["count"] for n, p in sets.items()} == {
        "transferqueue": 1, "storage": 1, "trainer": 2, "rollout": 2}
    # the templates are the pods themselves: their containers and requests count
    trainer = builders.build_trainer_pod(job, 0)
    assert sets["trainer"]["template"]["spec"] == trainer["spec"]
    assert [c["name"] for c in sets["transferqueue"]["template"]["spec"]["containers"]] == [
        "transferqueue", "driver"]
    assert sets["rollout"]["template"]["metadata"]["labels"][builders.LABEL_ROLE] == "rollout"
    # a name per job object, within a label's 63 characters
    assert queue.workload_name("x" * 63, "a") != queue.workload_name("x" * 63, "b")
    assert len(queue.workload_name("x" * 63, "a")) <= 63


def test_the_admission_puts_each_flavors_labels_and_tolerations_in_its_roles_pods():
    gpu_taint = {"key": "pool", "operator": "Equal", "value": "train", "effect": "NoSchedule"}
    flavors = {"train-pool": {"spec": {"nodeLabels": {"pool": "train"},
                                       "tolerations": [gpu_taint]}},
               "default": {"spec": {}}}
    wl = _wl(_cond("Admitted"), admission={"clusterQueue": "cq", "podSetAssignments": [
        {"name": "trainer", "flavors": {"cpu": "train-pool", "memory": "train-pool"}},
        {"name": "rollout", "flavors": {"cpu": "default"}}]})
    wl["status"]["admissionChecks"] = [{"name": "prov", "podSetUpdates": [
        {"name": "rollout", "labels": {"checked": "yes"}, "nodeSelector": {"zone": "a"}}]}]
    assert queue.flavors_of(wl) == {"train-pool", "default"}
    got = queue.admission(wl, flavors)
    assert got == {"trainer": {"nodeSelector": {"pool": "train"}, "tolerations": [gpu_taint]},
                   "rollout": {"labels": {"checked": "yes"}, "nodeSelector": {"zone": "a"}}}
    job = queue.with_admission(_job(), json.dumps(got))
    trainer = builders.build_trainer_pod(job, 0)
    assert trainer["spec"]["nodeSelector"]["pool"] == "train"
    assert gpu_taint in trainer["spec"]["tolerations"]
    rollout = builders.build_rollout_pod(job, 1)
    assert rollout["spec"]["nodeSelector"]["zone"] == "a"
    assert rollout["metadata"]["labels"]["checked"] == "yes"
    # the roles it did not name, and a job without an admission, are as they were
    tq = builders.build_tq_deployment(job)["spec"]["template"]["spec"]
    assert "pool" not in tq.get("nodeSelector", {})
    assert queue.with_admission(_job(), None) == _job()


def test_an_eviction_keeps_the_placement_of_the_roles_that_stay():
    """The TransferQueue and its storage units run on through an eviction: their
    pods' templates must not change (a changed template rebuilds the pods and, without
    persistence, the table), so their part of the admission stays."""
    host = {"kubernetes.io/hostname": "n1"}
    written = json.dumps({r: {"nodeSelector": host}
                          for r in ("transferqueue", "storage", "trainer", "rollout")})
    kept = queue.kept_through_eviction(written)
    assert json.loads(kept) == {"transferqueue": {"nodeSelector": host},
                                "storage": {"nodeSelector": host}}
    admitted, evicted = queue.with_admission(_job(), written), queue.with_admission(_job(), kept)
    for build in (builders.build_tq_deployment, builders.build_redis_statefulset):
        assert build(evicted) == build(admitted)
    assert "nodeSelector" not in builders.build_trainer_pod(evicted, 0)["spec"]
    assert queue.kept_through_eviction(None) is None
    assert queue.kept_through_eviction(json.dumps({"trainer": {"nodeSelector": host}})) is None


def test_each_step_follows_the_workloads_conditions():
    decide = queue.decide
    assert decide(None, False, False, None).action == "create"
    waiting = _wl(_cond("QuotaReserved", "False", "Pending"))
    assert decide(waiting, True, False, None).action == "wait"
    # a running job whose Workload is not admitted (any more) is stopped
    stop = decide(waiting, False, True, None)
    assert (stop.action, stop.reason) == ("stop", "NotAdmitted")
    admitted = _wl(_cond("QuotaReserved"), _cond("Admitted"))
    assert decide(admitted, True, False, None).action == "start"
    assert decide(admitted, False, True, None).action == "run"
    # evicted: stop, then (its pods gone) give the quota back, then wait
    evicted = _wl(_cond("QuotaReserved"), _cond("Admitted"),
                  _cond("Evicted", reason="Preempted", message="by a higher priority"))
    stop = decide(evicted, False, True, None)
    assert (stop.action, stop.reason) == ("stop", "Preempted")
    assert "by a higher priority" in stop.message
    assert decide(evicted, True, True, None).action == "wait"  # pods still going
    release = decide(evicted, True, False, None)
    assert (release.action, release.reason) == ("release", "Preempted")
    released = _wl(_cond("QuotaReserved", "False", "Pending"),
                   _cond("Evicted", reason="Preempted"))
    assert decide(released, True, False, None).action == "wait"
    # re-admitted (Kueue resets Evicted): started again
    again = _wl(_cond("QuotaReserved"), _cond("Admitted"), _cond("Evicted", "False"))
    assert decide(again, True, False, None).action == "start"
    # the end
    finish = decide(admitted, False, True, (True, "trained 60 steps"))
    assert (finish.action, finish.reason, finish.message) == (
        "finish", "Succeeded", "trained 60 steps")
    assert decide(admitted, False, True, (False, "x")).reason == "Failed"
    assert decide(_wl(_cond("Finished")), False, False, (True, "")).action == "done"


def test_the_status_patches_give_the_quota_back_and_finish():
    evicted = _wl(_cond("QuotaReserved"), _cond("Admitted"), _cond("Evicted", reason="Preempted"),
                  admission={"clusterQueue": "cq", "podSetAssignments": []})
    patch = queue.release_status(evicted, "Preempted", "by a higher priority",
                                 "2026-11-28T01:00:00Z")
    assert patch["admission"] is None
    by = {c["type"]: c for c in patch["conditions"]}
    assert (by["QuotaReserved"]["status"], by["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert by["Admitted"]["status"] == "False" and by["Requeued"]["status"] == "True"
    assert by["Evicted"]["status"] == "True"  # kept: Kueue resets it on re-admission
    assert queue.release_status(evicted, "Deactivated", "", "t")["conditions"][-1][
        "status"] == "False"  # requeued only after a preemption or a node failure
    done = queue.finished_status(evicted, "Succeeded", "", "t")["conditions"]
    assert {c["type"]: c["status"] for c in done}["Finished"] == "True"
    mirrored = queue.mirrored_conditions(evicted)
    assert [(c["type"], c["status"]) for c in mirrored] == [
        ("QuotaReserved", "True"), ("Admitted", "True")]
    assert [c["reason"] for c in queue.mirrored_conditions(None)] == ["Pending", "Pending"]


def test_a_queued_job_shows_why_it_waits_and_the_workloads_conditions():
    from datetime import datetime, timezone

    from rljob_operator.reconcile import plan

    job = _job(suspend=True)
    now = datetime(2026, 11, 28, tzinfo=timezone.utc)
    out = plan(job, {}, [], now, 1, queued=("Queued", "waiting for admission in LocalQueue lq",
                                           queue.mirrored_conditions(_wl())))
    by = {c["type"]: c for c in out.status["conditions"]}
    assert (by["Suspended"]["status"], by["Suspended"]["reason"]) == ("True", "Queued")
    assert by["QuotaReserved"]["status"] == "False" and by["Admitted"]["status"] == "False"
    assert not out.create and "startTime" not in out.status  # nothing started
    assert not any(e.reason == "Started" for e in out.events)
