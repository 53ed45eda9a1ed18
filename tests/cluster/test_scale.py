"""The scale bench (bench_operator.py) at a size the cluster tier affords: kwok's
simulated nodes, the real control plane, Kueue and the operator. What must hold at
any size: every job admitted at the end has each of its pods, once; no pod of a job
that was never evicted is created twice; no reconcile raises; the queue preempted,
and jobs that finished gave their quota to waiting ones."""

from __future__ import annotations

from tests.cluster import bench_operator


def test_queued_jobs_on_simulated_nodes_get_their_pods_once_through_preemption_and_finish():
    r = bench_operator.run(nodes=24, jobs=10, steady=10, interval=2.0, seed=1)
    bench_operator.report(r)
    w = r.watch
    assert r.final_admitted, "no job admitted at the end"
    for job in r.final_admitted:
        assert r.final_pods[job] == w.want[job], (
            f"{job}: {r.final_pods[job]} pods, its spec runs {w.want[job]}")
    never_evicted = {j for j in w.admitted if j not in w.evicted}
    twice = {pod: n for pod, n in r.creates.items()
             if n > 1 and bench_operator.job_of_pod(pod) in never_evicted}
    assert not twice, f"pods the operator created more than once: {twice}"
    assert bench_operator.metric(r.metrics, "rljob_operator_errors_total") == 0, (
        "a reconcile raised")
    assert w.evicted, "no job was preempted: the high-priority jobs reclaimed nothing"
    assert set(r.preempting) & set(w.admitted), "no high-priority job was admitted"
    assert r.admitted_after_finish, "no waiting job started when others finished"
    # the steady window: the operator watches, it does not poll per job
    window, running = r.steady
    assert running and sum(r.requests.values()) / (running * window / 60) < 60, (
        f"{dict(r.requests)} in {window:.0f} s with {running} jobs running")
