"""Prometheus metrics of the job's workers (each worker serves its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class WorkerMetrics:
    def __init__(self, worker: str, port: int | None):
        reg = self.registry = CollectorRegistry()

        def one(kind, name: str, doc: str):
            return kind(name, doc, ["worker"], registry=reg).labels(worker)

        self.samples = one(Counter, "rljob_samples",
                           "Samples generated (rollout) or trained (trainer)")
        self.tokens = one(Counter, "rljob_tokens", "Response tokens generated or trained")
        self.dropped = one(Counter, "rljob_samples_dropped",
                           "Generated samples refused because their lease had expired")
        self.version = one(Gauge, "rljob_weights_version", "Weights version held")
        self.step = one(Gauge, "rljob_step", "Last step released (driver) or trained (trainer)")
        self.reward = one(Gauge, "rljob_reward_mean", "Mean reward of the last step")
        self.staleness = one(Gauge, "rljob_staleness_mean", "Mean staleness of the last step")
        self.gen_seconds = one(Gauge, "rljob_gen_seconds", "Tgen of the last step")
        self.train_seconds = one(Gauge, "rljob_train_seconds", "Ttrain of the last step")
        if port:
            start_http_server(port, registry=reg)
