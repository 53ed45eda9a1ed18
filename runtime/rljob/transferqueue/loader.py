"""Streaming loader: yield batches as soon as their rows are ready.

In the spirit of AsyncFlow's `stream_loader(task, columns, batch_size)`: a
training loop iterates; each batch is acked together with the claim of the
next one (the step that used it is over), its lease is kept alive while the
step runs, and in a data-parallel group only one rank talks to TransferQueue
and broadcasts the batch to the others.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .client import Batch, TransferQueueClient, TransferQueueError


class _LeaseKeeper:
    """Extends the lease of the batch in hand every lease_seconds/3."""

    def __init__(self, client: TransferQueueClient):
        self.client = client
        self._batch: Batch | None = None
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rljob-lease-keeper", daemon=True)
        self._thread.start()

    def hold(self, batch: Batch | None) -> None:
        self._batch = batch
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            batch = self._batch
            period = batch.lease_seconds / 3 if batch is not None and batch.lease_seconds else None
            self._wake.wait(period)
            self._wake.clear()
            if self._stop or batch is None or batch is not self._batch:
                continue
            try:
                self.client.extend(batch)
            except TransferQueueError:
                pass  # already acked/released, or expired: the claim side will say so

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)


class StreamLoader:
    """Iterate batches of `task`; `commit()` acks the batch in hand early.

    Leaving the loop early (break, exception) releases the unacked batch so its
    rows go back to the queue: a batch counts as consumed only once the loop
    asked for the next one, reached `max_batches`, or called `commit()`.
    """

    def __init__(self, client: TransferQueueClient | None, task: str, columns: Sequence[str],
                 batch_size: int, *, max_batches: int | None = None, wait: float = 1.0,
                 group: Any = None, src: int = 0, stop_when_idle: float | None = None,
                 keep_leases: bool = True, **claim_kwargs: Any):
        self.client = client
        self.task = task
        self.columns = list(columns)
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.wait = wait
        self.group = group
        self.src = src
        self.stop_when_idle = stop_when_idle
        self.keep_leases = keep_leases
        self.claim_kwargs = claim_kwargs
        self._pending: Batch | None = None
        self.batches = 0
        self._is_src = self._rank() == src
        if self._is_src and client is None:
            raise ValueError("the source rank needs a TransferQueue client")

    def _rank(self) -> int:
        if self.group is None:
            return self.src
        import torch.distributed as dist

        return dist.get_rank()

    def commit(self) -> None:
        """Ack the batch in hand now (otherwise it is acked with the next claim)."""
        if self._pending is not None and self._is_src:
            self.client.ack(self._pending)
        self._pending = None

    def _fetch(self) -> Batch | None:
        """Ack the batch in hand and claim the next (source rank); None at the end."""
        idle = 0.0
        while True:
            batch = self.client.claim_get(self.task, self.batch_size, self.columns,
                                          wait=self.wait, ack=self._pending, **self.claim_kwargs)
            self._pending = None
            if batch.rows:
                return batch
            idle += self.wait
            if self.stop_when_idle is not None and idle >= self.stop_when_idle:
                return None

    def _broadcast(self, batch: Batch | None) -> Batch | None:
        if self.group is None:
            return batch
        import torch.distributed as dist

        box = [batch]
        # trusted peers of one job: the batch travels as one object
        dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]

    def __iter__(self) -> Iterator[Batch]:
        keeper = _LeaseKeeper(self.client) if self._is_src and self.keep_leases else None
        try:
            while self.max_batches is None or self.batches < self.max_batches:
                batch = self._fetch() if self._is_src else None
                batch = self._broadcast(batch)
                if batch is None:
                    return
                self._pending = batch
                if keeper:
                    keeper.hold(batch)
                self.batches += 1
                yield batch
            self.commit()
        finally:
            if keeper:
                keeper.hold(None)
                keeper.close()
            if self._pending is not None and self._is_src:
                self.client.release(self._pending)
            self._pending = None


def stream_loader(client: TransferQueueClient | None, task: str, columns: Sequence[str],
                  batch_size: int, **kwargs: Any) -> StreamLoader:
    return StreamLoader(client, task, columns, batch_size, **kwargs)
