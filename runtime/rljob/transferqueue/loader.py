"""Streaming loader: yield batches as soon as their rows are ready.

In the spirit of AsyncFlow's `stream_loader(task, columns, batch_size)`: a
training loop iterates; each batch is acked once the loop asks for the next
one (the step that used it is over); leases of batches in hand are kept alive
while steps run; with `prefetch` the next batches are claimed and read in the
background during the step; and in a data-parallel group only one rank talks
to TransferQueue and broadcasts each batch to the others.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .client import TransferQueueClient
from .consumer import LeaseKeeper
from .dataplane import Batch, TransferQueueError


def broadcast_object(obj: Any, src: int = 0, group: Any = None) -> Any:
    """`obj` from rank `src` on every rank of `group` (trusted peers of one job)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


_END = object()


class StreamLoader:
    """Iterate batches of `task`; `commit()` acks the batch in hand early.

    Leaving the loop early (break, exception) releases the unacked batches so
    their rows go back to the queue: a batch counts as consumed only once the
    loop asked for the next one, reached `max_batches`, or called `commit()`.
    """

    def __init__(self, client: TransferQueueClient | None, task: str, columns: Sequence[str],
                 batch_size: int, *, max_batches: int | None = None, wait: float = 1.0,
                 group: Any = None, src: int = 0, stop_when_idle: float | None = None,
                 keep_leases: bool = True, prefetch: int = 1, **claim_kwargs: Any):
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
        self.prefetch = prefetch
        self.claim_kwargs = claim_kwargs
        self._pending: Batch | None = None
        self._keeper: LeaseKeeper | None = None
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
        """Ack the batch in hand now (otherwise it is acked when the next is asked for)."""
        batch, self._pending = self._pending, None
        if batch is not None and self._is_src:
            if self._keeper:
                self._keeper.drop(batch)
            self.client.ack(batch, wait=False)

    def _claim(self, ack: Batch | None, stop: threading.Event | None = None) -> Batch | None:
        """Claim and read one batch; None when the stream has ended (idle or stopped)."""
        idle = 0.0
        while stop is None or not stop.is_set():
            batch = self.client.claim_get(self.task, self.batch_size, self.columns,
                                          wait=self.wait, ack=ack, **self.claim_kwargs)
            ack = None
            if batch.rows:
                if self._keeper:
                    self._keeper.hold(batch)
                return batch
            idle += self.wait
            if self.stop_when_idle is not None and idle >= self.stop_when_idle:
                return None
        return None

    def _prefetcher(self, out: queue.Queue, stop: threading.Event) -> None:
        fetched = 0
        try:
            while self.max_batches is None or fetched < self.max_batches:
                batch = self._claim(None, stop)
                if batch is None:
                    break
                fetched += 1
                while True:
                    try:
                        out.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        if stop.is_set():
                            self._give_back(batch)
                            return
            out.put(_END)
        except BaseException as exc:  # surfaced in the training loop
            out.put(exc)

    def _give_back(self, batch: Batch) -> None:
        if self._keeper:
            self._keeper.drop(batch)
        try:
            self.client.release(batch)
        except TransferQueueError:
            pass  # the lease is gone already: its rows are back in the queue

    def _broadcast(self, batch: Batch | None) -> Batch | None:
        if self.group is None:
            return batch
        return broadcast_object(batch, self.src, self.group)

    def __iter__(self) -> Iterator[Batch]:
        if not self._is_src:
            while self.max_batches is None or self.batches < self.max_batches:
                batch = self._broadcast(None)
                if batch is None:
                    return
                self.batches += 1
                yield batch
            return
        self._keeper = LeaseKeeper(self.client) if self.keep_leases else None
        ahead: queue.Queue | None = None
        stop = threading.Event()
        fetcher = None
        if self.prefetch > 0:
            ahead = queue.Queue(maxsize=self.prefetch)
            fetcher = threading.Thread(target=self._prefetcher, args=(ahead, stop),
                                       name="rljob-prefetch", daemon=True)
            fetcher.start()
        finished = False
        try:
            while self.max_batches is None or self.batches < self.max_batches:
                if ahead is not None:
                    item = ahead.get()
                    if isinstance(item, BaseException):
                        raise item
                    batch = None if item is _END else item
                    self.commit()
                else:
                    # no prefetch: the ack rides on the next claim
                    pending, self._pending = self._pending, None
                    if pending is not None and self._keeper:
                        self._keeper.drop(pending)
                    batch = self._claim(pending)
                self._broadcast(batch)
                if batch is None:
                    finished = True
                    return
                self._pending = batch
                self.batches += 1
                yield batch
            self.commit()
            finished = True
        finally:
            # (in a DP group every rank leaves the loop together: same loop, same batches)
            stop.set()
            if fetcher is not None:
                fetcher.join(timeout=self.wait + 5)
                while not ahead.empty():
                    item = ahead.get_nowait()
                    if isinstance(item, Batch):
                        self._give_back(item)
            if self._pending is not None:
                self._give_back(self._pending)
                self._pending = None
            if self._keeper:
                self._keeper.close()
            if finished:
                self.client.flush()  # surface a refused ack


def stream_loader(client: TransferQueueClient | None, task: str, columns: Sequence[str],
                  batch_size: int, **kwargs: Any) -> StreamLoader:
    return StreamLoader(client, task, columns, batch_size, **kwargs)
