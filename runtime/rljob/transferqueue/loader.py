"""Streaming loader: yield batches as soon as their rows are ready.

In the spirit of AsyncFlow's `stream_loader(task, columns, batch_size)`: a
training loop iterates, each batch is acked when the next one is requested
(the step that used it is over), and in a data-parallel group only one rank
talks to TransferQueue and broadcasts the batch to the others.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .client import Batch, TransferQueueClient


class StreamLoader:
    """Iterate batches of `task`; `commit()` acks the batch in hand early.

    Leaving the loop early (break, exception) releases the unacked batch so its
    rows go back to the queue: a batch counts as consumed only once the loop
    asked for the next one, reached `max_batches`, or called `commit()`.
    """

    def __init__(self, client: TransferQueueClient | None, task: str, columns: Sequence[str],
                 batch_size: int, *, max_batches: int | None = None, wait: float = 1.0,
                 group: Any = None, src: int = 0, stop_when_idle: float | None = None,
                 **claim_kwargs: Any):
        self.client = client
        self.task = task
        self.columns = list(columns)
        self.batch_size = batch_size
        self.max_batches = max_batches
        self.wait = wait
        self.group = group
        self.src = src
        self.stop_when_idle = stop_when_idle
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
        if self._pending is not None and self._is_src:
            self.client.ack(self._pending)
        self._pending = None

    def _release(self) -> None:
        if self._pending is not None and self._is_src:
            self.client.release(self._pending)
        self._pending = None

    def _fetch(self) -> Batch | None:
        """Claim and read one batch (source rank); None when the stream has ended."""
        idle = 0.0
        while True:
            batch = self.client.claim_get(self.task, self.batch_size, self.columns,
                                          wait=self.wait, **self.claim_kwargs)
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
        try:
            while self.max_batches is None or self.batches < self.max_batches:
                batch = self._fetch() if self._is_src else None
                batch = self._broadcast(batch)
                if batch is None:
                    return
                self._pending = batch
                self.batches += 1
                yield batch
                self.commit()
        finally:
            self._release()


def stream_loader(client: TransferQueueClient | None, task: str, columns: Sequence[str],
                  batch_size: int, **kwargs: Any) -> StreamLoader:
    return StreamLoader(client, task, columns, batch_size, **kwargs)
