"""An elastic queued job's rollout count under Kueue's workload slices
(rljob_operator.slices, pure)."""

from __future__ import annotations

from rljob_operator import queue, slices
from rljob_operator.slices import Scale, decide


def _wl(name: str, rollouts: int, *true: str) -> dict:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "team", "labels": {
                queue.JOB_UID_LABEL: "uid-1", "rljob.dev/name": "job"},
                "finalizers": [queue.RESOURCE_IN_USE],
                "ownerReferences": [{"kind": "RLJob", "name": "job", "uid": "uid-1"}]},
            "spec": {"queueName": "q", "priority": 10, "podSets": [
                {"name": n, "count": c, "template": {"spec": {}}}
                for n, c in (("transferqueue", 1), ("storage", 1), ("trainer", 2),
                             ("rollout", rollouts))]},
            "status": {"conditions": [{"type": t, "status": "True"} for t in true]}}


ADMITTED = ("QuotaReserved", "Admitted")


def test_more_replicas_ask_for_a_slice_and_wait_for_its_quota():
    current = _wl("w", 2, *ADMITTED)
    assert decide(current, None, 3, 2, running=True) == Scale("ask", 2)
    pending = _wl("w-s1", 3)
    assert decide(current, pending, 3, 2, running=True) == Scale("wait", 2)
    # Kueue reserved the slice's quota (and finished the one it replaces)
    reserved = _wl("w-s1", 3, "QuotaReserved")
    assert decide(_wl("w", 2, *ADMITTED, "Finished"), reserved, 3, 2, True) == Scale("adopt", 3)
    # adopted even if the count asked changed meanwhile: the next step starts from it
    assert decide(current, reserved, 5, 2, running=True) == Scale("adopt", 3)


def test_a_slice_is_withdrawn_when_the_count_changes_or_the_job_stops():
    current, pending = _wl("w", 2, *ADMITTED), _wl("w-s1", 3)
    assert decide(current, pending, 4, 2, running=True) == Scale("withdraw", 2)
    assert decide(current, pending, 2, 2, running=True) == Scale("withdraw", 2)
    assert decide(current, pending, 3, 2, running=False) == Scale("withdraw", 2)


def test_fewer_replicas_give_quota_back_once_their_pods_are_gone():
    current = _wl("w", 3, *ADMITTED)
    assert decide(current, None, 2, 3, running=True) == Scale("wait", 3)
    assert decide(current, None, 2, 2, running=True) == Scale("shrink", 2)
    assert decide(current, None, 3, 3, running=True) == Scale("none", 3)


def test_a_workload_without_quota_takes_the_count_in_place():
    waiting = _wl("w", 2)
    assert decide(waiting, None, 4, 0, running=False) == Scale("resize", 4)
    assert decide(_wl("w", 2, "QuotaReserved"), None, 4, 0, running=False) == Scale("none", 2)
    assert decide(None, None, 4, 0, running=False) == Scale("none")


def test_the_slice_keeps_the_pod_sets_in_order_and_names_the_one_it_replaces():
    current = _wl(slices.slice_name("job", "uid-1", 0), 2, *ADMITTED)
    s = slices.build_slice(current, 1, "job", "uid-1", 3)
    assert [(p["name"], p["count"]) for p in s["spec"]["podSets"]] == [
        ("transferqueue", 1), ("storage", 1), ("trainer", 2), ("rollout", 3)]
    assert s["metadata"]["annotations"] == {
        slices.REPLACEMENT_FOR: f"team/{current['metadata']['name']}"}
    assert s["metadata"]["name"] == slices.slice_name("job", "uid-1", 1) != current[
        "metadata"]["name"]
    assert s["metadata"]["labels"] == current["metadata"]["labels"]
    assert s["metadata"]["ownerReferences"] == current["metadata"]["ownerReferences"]
    assert s["spec"]["queueName"] == "q" and s["spec"]["priority"] == 10
    assert "status" not in s
    assert slices.rollout_count(current) == 2  # the current one untouched
    assert len(slices.slice_name("j" * 63, "uid", 99)) <= 63


def test_the_count_in_place_and_the_condition():
    patch = slices.with_rollouts(_wl("w", 3, *ADMITTED), 2)
    assert [p["count"] for p in patch["spec"]["podSets"]] == [1, 1, 2, 2]
    waiting = slices.condition(Scale("wait", 2), 3, "w-s1", "now", None)
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForQuota")
    assert "3 rollout replicas asked" in waiting["message"] and "w-s1" in waiting["message"]
    held = slices.condition(Scale("none", 3), 3, None, "later", waiting)
    assert (held["status"], held["reason"], held["lastTransitionTime"]) == (
        "True", "Admitted", "later")
    again = slices.condition(Scale("none", 3), 3, None, "latest", held)
    assert again["lastTransitionTime"] == "later"


def test_only_jobs_that_opt_in_are_elastic():
    assert slices.elastic({"annotations": {slices.ELASTIC_ANNOTATION: "true"}})
    assert not slices.elastic({"annotations": {}}) and not slices.elastic({})
    assert slices.index({"annotations": {slices.SLICE_ANNOTATION: "2"}}) == 2
    assert slices.index({"annotations": {slices.SLICE_ANNOTATION: "x"}}) == 0
    assert slices.index({}) == 0
