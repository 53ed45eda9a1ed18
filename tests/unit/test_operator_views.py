"""The operator's watch-fed views, its measured worker pool, and the scale bench's
readers of Prometheus text (pure parts; the bench itself runs in test_scale.py)."""

from __future__ import annotations

import threading

import pytest

from rljob_operator import metrics
from rljob_operator.handlers import Views, admission_state
from rljob_operator.workers import MeasuredExecutor
from tests.cluster.bench_operator import job_of_pod, metric, quantile


def test_views_read_a_jobs_pods_and_its_workload_from_the_indexes():
    pod_a, pod_b = {"metadata": {"name": "j-trainer-0"}}, {"metadata": {"name": "j-rollout-0"}}
    wl = {"metadata": {"name": "rljob-j-abcde"}}
    views = Views({("ns", "j"): [pod_a, pod_b]}, {("ns", "rljob-j-abcde"): [wl]})
    assert views.pods("ns", "j") == [pod_a, pod_b]
    assert views.pods("ns", "other") == []
    assert views.workload("ns", "rljob-j-abcde") is wl
    assert views.workload("ns", "rljob-k-00000") is None


def test_admission_state_changes_only_with_what_starts_stops_or_ends_a_job():
    def wl(**conds):
        return {"status": {"conditions": [{"type": t, "status": s} for t, s in conds.items()],
                           "admission": {"clusterQueue": "team-a"} if conds else None}}

    queued, admitted = wl(), wl(QuotaReserved="True", Admitted="True")
    assert admission_state(queued) != admission_state(admitted)
    # a condition Kueue adds that changes no admission leaves the state as it was
    again = wl(QuotaReserved="True", Admitted="True", PodsReady="True")
    assert admission_state(again) == admission_state(admitted)
    evicted = wl(QuotaReserved="True", Admitted="True", Evicted="True")
    assert admission_state(evicted) != admission_state(admitted)


def test_the_executor_counts_what_waits_for_a_worker():
    release = threading.Event()
    before = metrics.WAIT_SECONDS.collect()[0].samples
    count0 = next(s.value for s in before if s.name.endswith("_count"))
    with MeasuredExecutor(max_workers=1) as pool:
        busy = pool.submit(release.wait)
        waiting = [pool.submit(lambda i=i: i) for i in range(3)]
        assert metrics.WAITING._value.get() >= 3  # the one worker is busy
        release.set()
        assert [f.result(timeout=5) for f in waiting] == [0, 1, 2]
        busy.result(timeout=5)
    assert metrics.WAITING._value.get() == 0
    after = metrics.WAIT_SECONDS.collect()[0].samples
    assert next(s.value for s in after if s.name.endswith("_count")) == count0 + 4


TEXT = """# HELP x
rljob_operator_reconcile_seconds_bucket{le="0.1",trigger="timer"} 90.0
rljob_operator_reconcile_seconds_bucket{le="1.0",trigger="timer"} 100.0
rljob_operator_reconcile_seconds_bucket{le="+Inf",trigger="timer"} 100.0
rljob_operator_reconcile_seconds_bucket{le="0.1",trigger="create"} 0.0
rljob_operator_reconcile_seconds_bucket{le="1.0",trigger="create"} 10.0
rljob_operator_reconcile_seconds_bucket{le="+Inf",trigger="create"} 10.0
rljob_operator_reconcile_seconds_count{trigger="timer"} 100.0
rljob_operator_reconcile_seconds_count{trigger="create"} 10.0
"""


def test_quantiles_and_sums_read_off_prometheus_text():
    name = "rljob_operator_reconcile_seconds"
    # timer alone: 90 of 100 within 0.1 s, the rest by 1 s
    assert quantile(TEXT, name, 0.5, 'trigger="timer"') == pytest.approx(0.1 * 50 / 90)
    assert quantile(TEXT, name, 0.95, 'trigger="timer"') == pytest.approx(0.1 + 0.9 * 0.5)
    # both: 90 of 110 within 0.1 s
    assert quantile(TEXT, name, 0.99) == pytest.approx(0.1 + 0.9 * (108.9 - 90) / 20)
    assert metric(TEXT, name + "_count") == 110
    assert metric(TEXT, name + '_count{trigger="create"}') == 10
    assert metric(TEXT, "absent_total") == 0


def test_a_pod_belongs_to_the_job_its_name_starts_with():
    assert job_of_pod("team-a/job-1-trainer-0") == "team-a/job-1"
    assert job_of_pod("team-a/job-10-rollout-12") == "team-a/job-10"


def test_only_an_rljobs_workloads_are_watched():
    from rljob_operator.handlers import owned_by_a_job

    ours = {"ownerReferences": [{"apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob",
                                 "name": "j"}]}
    batch = {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j"}]}
    assert owned_by_a_job(ours) and not owned_by_a_job(batch) and not owned_by_a_job({})


def test_the_operator_keeps_of_a_pod_what_a_reconcile_reads():
    from rljob_operator.reconcile import pod_phase, pod_ready, pod_view, role_of

    pod = {"metadata": {"name": "j-trainer-0", "namespace": "ns", "uid": "u",
                        "labels": {"rljob.dev/role": "trainer"}, "managedFields": [{}] * 9,
                        "deletionTimestamp": None},
           "spec": {"containers": [{"name": "c", "env": [{}] * 50}]},
           "status": {"phase": "Running", "podIP": "10.0.0.1",
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    view = pod_view(pod)
    assert "spec" not in view and "managedFields" not in view["metadata"]
    assert (pod_phase(view), pod_ready(view), role_of(view)) == (
        pod_phase(pod), pod_ready(pod), role_of(pod))


def test_the_watches_ask_the_api_server_for_the_jobs_own_pods_and_workloads():
    import kopf

    from rljob_operator.handlers import configure

    settings = kopf.OperatorSettings()
    configure(settings, workers=4)
    selectors = settings.watching.label_selectors
    pods = kopf.Resource("", "v1", "pods", kind="Pod", namespaced=True)
    workloads = kopf.Resource("kueue.x-k8s.io", "v1beta2", "workloads", kind="Workload",
                              namespaced=True)
    rljobs = kopf.Resource("rljob.dev", "v1alpha1", "rljobs", kind="RLJob", namespaced=True)
    assert selectors.collect(pods) == ["rljob.dev/name"]
    assert selectors.collect(workloads) == ["kueue.x-k8s.io/job-uid"]
    assert selectors.collect(rljobs) == []


def test_a_body_behind_the_operators_own_change_is_read_again():
    """A kopf event or timer may carry the job as it was before the operator's own
    last change of its spec (a resume: spec.suspend false): acted on, it would delete
    the pods just created. The operator reads such a body again; a body as new as its
    own change is acted on as it is."""
    from rljob_operator.handlers import Operator

    class Kube:
        def __init__(self):
            self.job = {"metadata": {"name": "j", "namespace": "ns", "generation": 3},
                        "spec": {"suspend": False}}
            self.reads = 0

        def patch_job(self, ns, name, patch):
            self.job["spec"].update(patch.get("spec", {}))
            self.job["metadata"]["generation"] += 1
            return self.job["metadata"]["generation"]

        def get_custom(self, group, version, plural, name, namespace=None):
            self.reads += 1
            return self.job

    kube = Kube()
    op = Operator(kube=kube)
    state = op.state("ns", "j")
    stale = {"metadata": {"name": "j", "namespace": "ns", "generation": 3},
             "spec": {"suspend": True}}
    assert op._current(stale, state) is stale and kube.reads == 0  # nothing written yet
    op._patch_job("ns", "j", {"spec": {"suspend": False}})
    assert state.generation == 4
    assert op._current(stale, state) is kube.job and kube.reads == 1
    fresh = {"metadata": {"name": "j", "namespace": "ns", "generation": 4}, "spec": {}}
    assert op._current(fresh, state) is fresh and kube.reads == 1
