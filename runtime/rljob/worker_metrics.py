"""Prometheus metrics of the job's workers (each worker serves its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class WorkerMetrics:
    def __init__(self, worker: str, port: int | None):
        reg = self.registry = CollectorRegistry()
        lbl = ["worker"]
        self.samples = Counter("rljob_samples", "Samples generated (rollout) or trained "
                               "(trainer)", lbl, registry=reg).labels(worker)
        self.tokens = Counter("rljob_tokens", "Response tokens generated or trained", lbl,
                              registry=reg).labels(worker)
        self.version = Gauge("rljob_weights_version", "Weights version held", lbl,
                             registry=reg).labels(worker)
        self.step = Gauge("rljob_step", "Last step released (driver) or trained (trainer)", lbl,
                          registry=reg).labels(worker)
        self.reward = Gauge("rljob_reward_mean", "Mean reward of the last step", lbl,
                            registry=reg).labels(worker)
        self.staleness = Gauge("rljob_staleness_mean", "Mean staleness of the last step", lbl,
                               registry=reg).labels(worker)
        self.gen_seconds = Gauge("rljob_gen_seconds", "Tgen of the last step", lbl,
                                 registry=reg).labels(worker)
        self.train_seconds = Gauge("rljob_train_seconds", "Ttrain of the last step", lbl,
                                   registry=reg).labels(worker)
        if port:
            start_http_server(port, registry=reg)
