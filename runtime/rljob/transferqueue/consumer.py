"""A consumer's dealings with the TransferQueue controller.

`Consumer.join`: a worker's place among the consumers: the job's tasks declared
(idempotent: whoever comes first declares them), the leases an earlier life of
this consumer held given back, and a lease keeper for the batches it holds while
it works on them. `ride_out`: a call that waits while the controller is away (it
restarts: the client's session reconnects by itself).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from .client import TransferQueueClient
from .dataplane import Batch, TransferQueueError
from .schema import TaskSpec

T = TypeVar("T")
PAUSE = 0.5  # seconds between two tries while the controller is away
CLAIMING_AGAIN = "transferqueue unavailable (%s); claiming again"


class LeaseKeeper:
    """Extends the leases of the batches held, every lease_seconds/3."""

    def __init__(self, client: TransferQueueClient):
        self.client = client
        self._held: dict[str, Batch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rljob-lease-keeper", daemon=True)
        self._thread.start()

    def hold(self, batch: Batch) -> None:
        with self._lock:
            self._held[batch.lease] = batch

    def drop(self, batch: Batch) -> None:
        with self._lock:
            self._held.pop(batch.lease, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                held = list(self._held.values())
            period = min((b.lease_seconds for b in held if b.lease_seconds), default=3.0) / 3
            if self._stop.wait(period):
                return
            for batch in held:
                with self._lock:
                    if batch.lease not in self._held:
                        continue
                try:
                    self.client.extend(batch)
                except TransferQueueError:
                    pass  # acked or released meanwhile, or expired: the claim side says so

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def warn(log: logging.Logger, note: str = CLAIMING_AGAIN) -> Callable[[TransferQueueError], None]:
    """`ride_out`'s `away`: `note` logged as a warning, with the status code's name."""
    return lambda exc: log.warning(note, exc.code.name)


def ride_out(call: Callable[[], T], *, away: Callable[[TransferQueueError], None] | None = None,
             stop: threading.Event | None = None, once: bool = False, pause: float = PAUSE,
             refusals: bool = False) -> T | None:
    """`call()`'s answer, tried again while the controller is away
    (`TransferQueueError.unavailable`); any other error is raised. Each time `away(exc)`
    hears of it, then a `pause` (cut short by `stop`). None instead of an answer: after
    the first pause with `once`, or once `stop` is set. `refusals`: a refused call (not
    only the controller's absence) is waited out too."""
    while True:
        try:
            return call()
        except TransferQueueError as exc:
            if not (exc.unavailable or refusals):
                raise
            if away is not None:
                away(exc)
        if stop is not None:
            stop.wait(pause)
        elif pause > 0:
            time.sleep(pause)
        if once or (stop is not None and stop.is_set()):
            return None


class Consumer:
    """A worker's client to the controller and its lease keeper (`keeper.hold` a
    claimed batch while it is worked on, `keeper.drop` it once acked or released)."""

    def __init__(self, tq: TransferQueueClient, released: int = 0):
        self.tq = tq
        self.released = released  # rows an earlier life of this consumer held, given back
        self.keeper = LeaseKeeper(tq)

    @classmethod
    def join(cls, address: str, tasks: Sequence[TaskSpec]) -> Consumer:
        """Connect, declare the job's tasks and give back what an earlier life of this
        consumer (this process's name: a restarted worker) held."""
        tq = TransferQueueClient(address)
        try:
            tq.register(*tasks)  # idempotent: whoever comes first declares it
            return cls(tq, tq.release_consumer())
        except BaseException:
            tq.close()
            raise

    def close(self, refused: Callable[[Exception], None] | None = None) -> None:
        """Stop keeping leases, then let go of the client. `refused`: hears of an ack
        refused meanwhile, which is raised otherwise."""
        self.keeper.close()
        if refused is not None:
            try:
                self.tq.flush()  # surface a refused ack
            except Exception as exc:  # noqa: BLE001 - shutting down: report, do not mask
                refused(exc)
        self.tq.close()
