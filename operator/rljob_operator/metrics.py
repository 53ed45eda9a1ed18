"""The operator's own Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("rljob_operator_reconciles_total", "Reconciles of RLJobs.", ["trigger"])
ERRORS = Counter("rljob_operator_errors_total", "Reconciles that raised.", ["trigger"])
SCALES = Counter("rljob_operator_scale_decisions_total", "Rollout scale decisions taken.",
                 ["direction"])
# a reconcile's own time, and the time a handler waited for a worker thread first
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RECONCILE_SECONDS = Histogram("rljob_operator_reconcile_seconds",
                              "Seconds a reconcile of an RLJob took (its own work).",
                              ["trigger"], buckets=_SECONDS)
WAIT_SECONDS = Histogram("rljob_operator_worker_wait_seconds",
                         "Seconds a handler waited for a free worker thread.", buckets=_SECONDS)
WAITING = Gauge("rljob_operator_work_queue_depth",
                "Handlers waiting for a free worker thread now.")
CHILDREN = Counter("rljob_operator_children_created_total", "Child objects created.", ["kind"])
_labels = ["namespace", "rljob"]
STEP = Gauge("rljob_job_step", "Optimizer steps completed.", _labels)
STALENESS = Gauge("rljob_job_staleness_mean", "Mean staleness of the last step.", _labels)
TOKENS = Gauge("rljob_job_tokens_per_second", "Generated tokens per second.", _labels)
GEN = Gauge("rljob_job_gen_seconds", "Tgen of the last step.", _labels)
TRAIN = Gauge("rljob_job_train_seconds", "Ttrain of the last step.", _labels)
ROLLOUTS = Gauge("rljob_job_rollout_replicas", "Desired rollout replicas.", _labels)
READY = Gauge("rljob_job_ready", "1 when the job's Ready condition is True.", _labels)
SCALE_ERROR = Gauge("rljob_job_scale_prediction_error",
                    "Relative error of the last checked scale's predicted Tgen "
                    "(measured / predicted - 1).", _labels)
GAUGES = (STEP, STALENESS, TOKENS, GEN, TRAIN, ROLLOUTS, READY, SCALE_ERROR)


def forget(namespace: str, name: str) -> None:
    for g in GAUGES:
        try:
            g.remove(namespace, name)
        except KeyError:
            pass
