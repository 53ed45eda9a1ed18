"""The driver's length predictor (rollout.dispatch: skew_aware): predicts each
prompt's output length when its step is released, written as the rows' length so
that rollout claims can take the longest (or shortest) groups first, and learns
from every finished sample through a TransferQueue task of its own (`lengths`:
ready as soon as a response is written; it reads the prompt, the response length
is in the row's metadata).

`rollout.lengthPredictor` names the predictor: `online` (the default: a ranker that
learns from the finished samples), one an installed package adds (entry point group
`rljob.length_predictors`) or an importable `module:Class` (a `LengthPredictor`).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

from ..infra.registry import Registry
from ..transferqueue.consumer import ride_out
from ..transferqueue.dataplane import TransferQueueError
from .dispatch import LengthRanker

log = logging.getLogger("rljob.driver")


class LengthPredictor(ABC):
    """Predicts the output tokens of a step's rows when the driver releases them."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    @abstractmethod
    def predict(self, prompts: list[str], answers: list[str]) -> list[int]:
        """Predicted output tokens of each row (its rendered prompt, its answer)."""

    def observe(self, prompts: list[str], lengths: list[int]) -> None:
        """Finished samples: each prompt and the tokens its response took."""


LENGTH_PREDICTORS: Registry[type[LengthPredictor]] = Registry(
    "rollout.lengthPredictor", LengthPredictor, "rljob.length_predictors")


@LENGTH_PREDICTORS.register("online")
class OnlineRanker(LengthPredictor):
    """StreamRL's ranker, learning online from the finished samples."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.ranker = LengthRanker()

    def predict(self, prompts: list[str], answers: list[str]) -> list[int]:
        distinct = list(dict.fromkeys(prompts))  # a group's G rows share their prompt
        predicted = dict(zip(distinct, self.ranker.predict(distinct)))
        return [max(1, int(round(predicted[p]))) for p in prompts]

    def observe(self, prompts: list[str], lengths: list[int]) -> None:
        self.ranker.observe(prompts, lengths)


class LengthModel:
    """The job's predictor, and the thread that feeds it the finished samples."""

    def __init__(self, tq, tokenizer, predictor: str = "online"):
        self.tq = tq
        self.predictor = LENGTH_PREDICTORS.get(predictor)(tokenizer)
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
        with self._lock:
            return self.predictor.predict(prompts, answers)

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
                self.predictor.observe(batch.data["prompt"], [r.length for r in batch.rows])
            self.observed += len(batch.rows)
            try:
                self.tq.ack(batch)
            except TransferQueueError as exc:  # its lease lapses and the rows come back
                log.warning("length ranker: could not ack %d rows: %s", len(batch.rows), exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
