"""Prometheus metrics of the job's workers (each worker serves its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


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
        self.inflight = one(Gauge, "rljob_rollout_sequences_in_flight",
                            "Sequences a concurrent rollout engine is generating")
        buckets = (0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100)
        self.weight_swap = Histogram(
            "rljob_weight_swap_seconds", "A rollout's weight update: generations in flight "
            "finishing plus the load", ["worker"], buckets=buckets, registry=reg).labels(worker)
        self.weight_drain = Histogram(
            "rljob_weight_drain_seconds", "Of a rollout's weight update: waiting for the "
            "generations in flight", ["worker"], buckets=buckets, registry=reg).labels(worker)
        self.weight_transfer = Histogram(
            "rljob_weight_transfer_seconds", "A rollout's weight update: moving the version "
            "from the trainer (gRPC stream or collective broadcast)", ["worker"],
            buckets=buckets, registry=reg).labels(worker)
        if port:
            start_http_server(port, registry=reg)
