"""The driver's length ranker (rollout.dispatch: skew_aware): predicts each
prompt's output length when its step is released, written as the rows' length so
that rollout claims can take the longest (or shortest) groups first, and learns
online from every finished sample through a TransferQueue task of its own
(`lengths`: ready as soon as a response is written; it reads the prompt, the
response length is in the row's metadata).

`RLJOB_LENGTH_ORACLE=answer` (benchmarks only) predicts instead the length of the
reference answer: what a perfect ranker would know of a task whose output length
is its answer's.
"""

from __future__ import annotations

import logging
import os
import threading

from .dispatch import LengthRanker
from ..transferqueue.consumer import ride_out
from ..transferqueue.dataplane import TransferQueueError

log = logging.getLogger("rljob.driver")
ORACLE_ENV = "RLJOB_LENGTH_ORACLE"


class LengthModel:
    def __init__(self, tq, tokenizer):
        self.tq = tq
        self.tok = tokenizer
        self.ranker = LengthRanker()
        self.oracle = os.environ.get(ORACLE_ENV) == "answer"
        self.observed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._learn, name="rljob-length-ranker",
                                        daemon=True)

    def start(self) -> LengthModel:
        self._thread.start()
        return self

    def predict(self, prompts: list[str], answers: list[str]) -> list[int]:
        """Predicted output tokens of each row (its rendered prompt, its answer)."""
        if self.oracle:
            return [len(self.tok.encode(a, add_special_tokens=False)) + 1 for a in answers]
        distinct = list(dict.fromkeys(prompts))  # a group's G rows share their prompt
        with self._lock:
            predicted = dict(zip(distinct, self.ranker.predict(distinct)))
        return [max(1, int(round(predicted[p]))) for p in prompts]

    def _learn(self) -> None:
        def refused(exc) -> None:  # the controller's absence goes unsaid
            if not exc.unavailable:
                log.warning("length ranker: %s", exc)

        while not self._stop.is_set():
            # a refused claim is waited out too: the ranker only learns
            batch = ride_out(lambda: self.tq.claim_get("lengths", 4096, ["prompt"], wait=1.0,
                                                       min_count=1),
                             away=refused, stop=self._stop, refusals=True)
            if batch is None or not batch.rows:
                continue
            with self._lock:
                self.ranker.observe(batch.data["prompt"], [r.length for r in batch.rows])
            self.observed += len(batch.rows)
            try:
                self.tq.ack(batch)
            except TransferQueueError as exc:  # its lease lapses and the rows come back
                log.warning("length ranker: could not ack %d rows: %s", len(batch.rows), exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
