"""The start check's arithmetic (operator/rljob_operator/capacity.py): a pod's
requests as the scheduler counts them, a node's free capacity, taints, and whether a
job's starting pods fit together (its run on a real node: tests/cluster/test_e2e.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rljob.api import RLJob
from rljob_operator import capacity

REPO = Path(__file__).resolve().parents[2]


def _c(**req):
    return {"resources": {"requests": req}}


def _node(name, cpu="2", memory="4Gi", labels=None, taints=None, ready="True", **spec):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or [], **spec},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def _pod(node, cpu, phase="Running"):
    return {"spec": {"nodeName": node, "containers": [_c(cpu=cpu)]}, "status": {"phase": phase}}


def test_a_pods_requests_are_the_schedulers():
    pod = {"spec": {
        "initContainers": [{**_c(cpu="3"), "name": "setup"},  # alone, then gone
                           {**_c(cpu="250m", memory="1Gi"), "restartPolicy": "Always"}],
        "containers": [_c(cpu="1", memory="512Mi"), _c(cpu="500m")],
        "overhead": {"cpu": "100m"}}}
    got = capacity.pod_requests(pod)
    # containers 1.5 + the sidecar 0.25 = 1.75 cpu; the init container ran before the
    # sidecar started: max(1.75, 3) + overhead
    assert got["cpu"] == pytest.approx(3.1)
    assert got["memory"] == pytest.approx(1.5 * 2 ** 30)
    assert capacity.pod_requests({"spec": {"containers": [{}]}}) == {}


def test_a_nodes_free_capacity_leaves_out_ended_pods_and_unusable_nodes():
    nodes = [_node("a"), _node("b", unschedulable=True), _node("c", ready="False")]
    pods = [_pod("a", "500m"), _pod("a", "1", phase="Succeeded"), _pod(None, "1")]
    free = capacity.free_nodes(nodes, pods)
    assert [n.name for n in free] == ["a"]
    assert free[0].free["cpu"] == pytest.approx(1.5)


def test_taints_and_tolerations_match_as_kubernetes_matches_them():
    taint = {"key": "pool", "value": "npu", "effect": "NoSchedule"}
    assert not capacity.tolerates([], taint)
    assert capacity.tolerates([{"key": "pool", "operator": "Exists"}], taint)
    assert capacity.tolerates([{"key": "pool", "value": "npu", "effect": "NoSchedule"}], taint)
    assert not capacity.tolerates([{"key": "pool", "value": "gpu"}], taint)
    assert not capacity.tolerates([{"operator": "Exists", "effect": "NoExecute"}], taint)
    assert capacity.tolerates([], {**taint, "effect": "PreferNoSchedule"})


def _job(**trainer) -> RLJob:
    doc = yaml.safe_load((REPO / "examples/quickstart-cluster.yaml").read_text())
    doc["metadata"]["namespace"] = "ns"
    doc["spec"]["trainer"].update(trainer)
    return RLJob.model_validate(doc)


def test_a_job_starts_with_its_transferqueue_storage_trainer_gang_and_minimum_rollouts():
    job = _job(numNodes=2)
    job.spec.rollout.min_replicas = 1
    roles = [d.role for d in capacity.job_demand(job)]
    assert roles == ["transferqueue", "storage", "trainer", "trainer", "rollout"]


def test_a_job_fits_only_when_all_its_starting_pods_fit_together():
    fits = _job()  # the quickstart: sized for a 2-core node
    nodes = capacity.free_nodes([_node("n1")], [])
    assert capacity.place(capacity.job_demand(fits), nodes) is None
    big = _job(numNodes=2, resources={"cpu": "1500m"})  # two ranks of 1.5 cores
    one = capacity.free_nodes([_node("n1")], [])
    short = capacity.place(capacity.job_demand(big), one)
    assert short is not None and "a trainer pod (cpu 1.5" in short and "n1: cpu 0.5" in short
    # two nodes hold a rank each
    two = capacity.free_nodes([_node("n1"), _node("n2")], [])
    assert capacity.place(capacity.job_demand(big), two) is None
    # ...but not when another pod holds most of the second
    busy = capacity.free_nodes([_node("n1"), _node("n2")], [_pod("n2", "1")])
    assert capacity.place(capacity.job_demand(big), busy) is not None
    # a node the pods' selector does not name, or a taint they do not tolerate, is no room
    job = _job(resources={"cpu": "1"})
    job.spec.accelerator.node_selector = {"pool": "train"}
    elsewhere = capacity.free_nodes([_node("n1", cpu="8")], [])
    assert "has no node left" in capacity.place(capacity.job_demand(job), elsewhere)
    tainted = capacity.free_nodes([_node("n1", cpu="8", labels={"pool": "train"}, taints=[
        {"key": "dedicated", "value": "x", "effect": "NoSchedule"}])], [])
    assert capacity.place(capacity.job_demand(job), tainted) is not None
    assert capacity.place(capacity.job_demand(job), capacity.free_nodes(
        [_node("n1", cpu="8", labels={"pool": "train"})], [])) is None


def test_only_a_job_that_starts_unqueued_and_ungrouped_waits_for_the_check():
    job = _job()
    assert capacity.needs_check(job, queued=False, started=False)
    assert not capacity.needs_check(job, queued=True, started=False)
    assert not capacity.needs_check(job, queued=False, started=True)
    job.spec.scheduling.scheduler_name = "volcano"
    assert not capacity.needs_check(job, queued=False, started=False)
