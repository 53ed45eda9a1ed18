"""Workers' Prometheus series follow the conventions: counters for totals, no `job`
label, the job-level figures under the names the controller and operator use."""

from __future__ import annotations

import re

from prometheus_client import generate_latest

from rljob.infra.worker_metrics import WorkerMetrics


def test_rollout_and_trainer_series():
    rollout = WorkerMetrics("rollout-0", None)
    rollout.samples.inc(8)
    rollout.tokens.inc(100)
    rollout.weight_transfer.observe(0.2)
    body = generate_latest(rollout.registry).decode()
    assert 'rljob_generated_samples_total{worker="rollout-0"} 8.0' in body
    assert 'rljob_generated_tokens_total{worker="rollout-0"} 100.0' in body
    assert "# TYPE rljob_generated_tokens_total counter" in body
    assert 'rljob_weight_transfer_seconds_count{worker="rollout-0"} 1.0' in body
    trainer = WorkerMetrics("trainer-0", None)
    trainer.tokens.inc(5)
    trainer.step.set(3)
    body = generate_latest(trainer.registry).decode()
    assert 'rljob_trained_tokens_total{worker="trainer-0"} 5.0' in body
    assert 'rljob_job_step{worker="trainer-0"} 3.0' in body
    driver = generate_latest(WorkerMetrics("driver", None).registry).decode()
    assert "rljob_released_step" in driver
    for text in (body, driver):
        assert not re.search(r'[{,]job="', text)
