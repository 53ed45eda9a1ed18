"""Prometheus metrics of a TransferQueue controller, collected at scrape time, labelled
`rljob` (the job's name; `job` belongs to the scrape: Prometheus would rename ours)."""

from __future__ import annotations

from prometheus_client import start_http_server
from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class ControllerCollector(Collector):
    def __init__(self, service):
        self.service = service

    def collect(self):
        ctl = self.service.controller
        job = self.service.job
        rows = GaugeMetricFamily("rljob_tq_rows", "Rows alive in the table", labels=["rljob"])
        rows.add_metric([job], len(ctl.rows))
        yield rows
        parts = CounterMetricFamily("rljob_tq_cleared_partitions", "Partitions consumed and cleared",
                                    labels=["rljob"])
        parts.add_metric([job], ctl.cleared_partitions)
        yield parts
        written = CounterMetricFamily("rljob_tq_written_bytes", "Bytes written to storage units",
                                      labels=["rljob"])
        written.add_metric([job], ctl.bytes_written)
        yield written
        per_task = {
            "ready": GaugeMetricFamily("rljob_tq_task_ready_rows", "Rows ready for a task",
                                       labels=["rljob", "task"]),
            "claimed": GaugeMetricFamily("rljob_tq_task_claimed_rows", "Rows leased by a task",
                                         labels=["rljob", "task"]),
            "acked": CounterMetricFamily("rljob_tq_task_acked_rows", "Rows acked by a task",
                                         labels=["rljob", "task"]),
            "expired": CounterMetricFamily("rljob_tq_task_expired_rows",
                                           "Rows whose lease expired", labels=["rljob", "task"]),
            "stale_discarded": CounterMetricFamily("rljob_tq_task_stale_discarded_rows",
                                                   "Too-stale rows discarded",
                                                   labels=["rljob", "task"]),
        }
        for s in ctl.task_stats():
            for key, fam in per_task.items():
                fam.add_metric([job, s["name"]], s[key])
        yield from per_task.values()
        m = self.service.metrics.latest
        for name, value, doc in (
            ("step", m.step, "Trainer step last reported"),
            ("gen_seconds", m.gen_seconds, "Tgen of the last step"),
            ("train_seconds", m.train_seconds, "Ttrain of the last step"),
            ("staleness_mean", m.staleness_mean, "Mean staleness of the last step"),
            ("tokens_per_second", m.tokens_per_second, "Generated tokens per second"),
        ):
            g = GaugeMetricFamily(f"rljob_job_{name}", doc, labels=["rljob"])
            g.add_metric([job], value)
            yield g


def start_metrics_server(service, port: int, addr: str = "0.0.0.0") -> int:
    """Serve /metrics on `port` (0: any free port); returns the port bound."""
    REGISTRY.register(ControllerCollector(service))
    httpd, _ = start_http_server(port, addr=addr)
    return httpd.server_port
