"""The threads that run the operator's handlers (kopf runs a sync handler in
`settings.execution.executor`), measured: how many handlers wait for a free thread
(the work queue's depth) and how long each one waited."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from . import metrics


class MeasuredExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor whose waiting work is in the operator's metrics."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        queued = time.perf_counter()
        metrics.WAITING.inc()

        def run():
            metrics.WAITING.dec()
            metrics.WAIT_SECONDS.observe(time.perf_counter() - queued)
            return fn(*args, **kwargs)

        return super().submit(run)
