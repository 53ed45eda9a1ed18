"""TransferQueue clients: control calls to the controller, data straight to the units.

A write is: allocate rows (new ones) → put cells on their storage units in one
batch per unit → tell the controller (notify-written). A read is: claim (a
lease with row metadata) → get cells from the units → ack after use. Cells go
through a `DataPlane` (dataplane.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from ..infra import auth
from .dataplane import Batch, DataPlane, TransferQueueError, claimed_rows, rpc_error
from .proto import transferqueue_pb2 as pb
from .proto import transferqueue_pb2_grpc as pbg
from .policies import get_claim_policy
from .schema import ColumnError, ColumnSpec, TaskSpec
from .session import SyncSession
from .wire import CLIENT_OPTIONS, POLICY_PB, task_to_pb

log = logging.getLogger("rljob.transferqueue")

RESERVE_BLOCK = 1024  # indices reserved per round trip by a writer
_STALE_PB = {"discard": pb.DISCARD, "regenerate": pb.REGENERATE}


def _claimed(task: str, resp: pb.ClaimResponse) -> Batch:
    return Batch(task, resp.lease, claimed_rows(resp.rows), lease_seconds=resp.lease_seconds,
                 tag_sets=[dict(t.tags) for t in resp.tag_sets])


def _claim_request(task: str, count: int, *, min_count: int | None = None, policy: str = "fifo",
                   token_budget: int | None = None, dp_size: int = 1, wait: float = 0.0,
                   partition: int | None = None, min_version: int | None = None,
                   on_stale: str = "discard", stale_producer: str | None = None,
                   ack: Batch | None = None, consumer: str = "",
                   max_partition: int | None = None,
                   one_partition: bool = False) -> pb.ClaimRequest:
    get_claim_policy(policy)  # a ValueError naming the policies for an unknown one
    return pb.ClaimRequest(
        task=task, count=count, min_count=min_count or 0,
        policy=POLICY_PB.get(policy, pb.CLAIM_POLICY_UNSPECIFIED), policy_name=policy,
        token_budget=token_budget or 0, dp_size=dp_size, wait_seconds=wait,
        has_partition=partition is not None, partition=partition or 0,
        has_min_version=min_version is not None, min_version=min_version or 0,
        on_stale=_STALE_PB[on_stale], stale_producer=stale_producer or "",
        ack_lease=ack.lease if ack is not None and ack.task == task else "",
        consumer=consumer, has_max_partition=max_partition is not None,
        max_partition=max_partition or 0, one_partition=one_partition)


class TransferQueueClient:
    """Blocking client. Thread-safe for concurrent claims (gRPC channels are)."""

    def __init__(self, address: str, password: str | None = None):
        self._channel = auth.channel(address, CLIENT_OPTIONS)  # the job's token
        self._stub = pbg.TransferQueueControllerStub(self._channel)
        self._session = SyncSession(self._stub, TransferQueueError)
        # (kind, future) of put(wait=False) / ack(wait=False) whose answer is unchecked
        self._unchecked: list = []
        self._unchecked_lock = threading.Lock()
        self._wakes = itertools.count(1)
        self.wakes = 0  # wake() calls so far (`claim`'s `since`)
        self._bounds: dict[str, int] = {}  # task -> max_partition of its claims (`bound`)
        self._bound_lock = threading.Lock()  # a bound and the claims sent in its order
        self._data = DataPlane(address, password)
        self._data.set_layout(self._call(self._stub.Layout, pb.LayoutRequest()))

    def _call(self, method, request, timeout: float | None = 60.0):
        try:
            # wait_for_ready: ride through a controller restart within the timeout
            return method(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise rpc_error(exc) from None

    @property
    def columns(self) -> dict[str, ColumnSpec]:
        return self._data.columns

    def register(self, *tasks: TaskSpec) -> None:
        resp = self._call(self._stub.RegisterTasks,
                          pb.RegisterTaskRequest(tasks=[task_to_pb(t) for t in tasks]))
        self._data.set_columns(resp.columns)

    def allocate(self, partition: int, count: int, group_size: int = 1) -> pb.AllocateResponse:
        return self._call(self._stub.Allocate, pb.AllocateRequest(
            partition=partition, count=count, group_size=group_size))

    @property
    def table_id(self) -> str:
        """The table's id: another one after a restarted controller lost the table."""
        return self._data.table_id

    def write(self, indices: Sequence[int], columns: Mapping[str, Sequence[Any]], *,
              versions: Sequence[int] | None = None, length_column: str | None = None,
              lengths: Sequence[int] | None = None, lease: Batch | None = None,
              ack: bool = False) -> int:
        """Write columns of existing rows, then notify; returns rows newly ready.

        With `lease` (the Batch the rows were claimed in) the write is fenced:
        if that lease has expired meanwhile, the controller refuses it
        (FAILED_PRECONDITION) and no reader ever sees these cells. With `ack` too,
        the rows are acked for the lease's task by the same notify (one round trip
        for a producer's write and ack)."""
        if ack and lease is None:
            raise ValueError("ack=True acks the rows of a lease: pass lease")
        per_unit, measured, nbytes = self._data.encode_rows(
            indices, columns, length_column, lease.lease if lease else "")
        cells = self._data.store_all(per_unit)
        return self._session.call("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, lease=lease, ack=ack, cells=cells)).newly_ready

    def _reserve(self, n: int) -> list[int]:
        while (got := self._data.take_reserved(n, self._session.open())) is None:
            self._data.refill(self._session.call("reserve",
                                         pb.ReserveRequest(count=max(n, RESERVE_BLOCK))))
        return got

    def put(self, partition: int, columns: Mapping[str, Sequence[Any]], *, group_size: int = 1,
            versions: Sequence[int] | None = None, length_column: str | None = None,
            lengths: Sequence[int] | None = None, wait: bool = True) -> list[int]:
        """Append new rows to `partition` (one controller round trip); returns their indices.

        With wait=False the call returns once the cells are stored and the
        notify is sent, so a streaming producer overlaps the controller's answer
        with its next write; a refused notify raises from a later put or flush().
        """
        self._check(block=False)
        n = len(next(iter(columns.values())))
        if n % max(group_size, 1):
            raise ColumnError(f"{n} rows are not a multiple of group_size {group_size}")
        indices = self._reserve(n)
        per_unit, measured, nbytes = self._data.encode_rows(indices, columns, length_column)
        cells = self._data.store_all(per_unit)
        fut = self._session.send("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, create=True, partition=partition,
            group_size=group_size, cells=cells))
        if wait:
            self._session.result(fut, "notify")
        else:
            with self._unchecked_lock:
                self._unchecked.append(("notify", fut))
        return indices

    def _check(self, block: bool) -> None:
        """Raise the first refusal among earlier wait=False puts and acks."""
        with self._unchecked_lock:
            ready = [(k, f) for k, f in self._unchecked if block or f.done()]
            self._unchecked = [(k, f) for k, f in self._unchecked if not (block or f.done())]
        for kind, fut in ready:  # the first refusal raises; the others were seen with it
            self._session.result(fut, kind)

    def flush(self) -> None:
        """Wait until every put/ack sent with wait=False is answered; raise a refusal."""
        self._check(block=True)

    def claim(self, task: str, count: int, *, since: int | None = None,
              **kwargs: Any) -> Batch:
        """Lease up to `count` ready rows of `task` (metadata only; see `get`).

        Options: min_count (wait for this many, default count), wait (seconds to
        long-poll), policy (a claim policy name: policies.py), token_budget,
        dp_size, partition, min_version with on_stale (discard | regenerate)
        and stale_producer, ack (a previous Batch of this task to ack first),
        max_partition (default: the task's `bound`), one_partition (rows of one
        partition: the oldest whose ready rows answer the claim).
        A waiting claim is answered at once, with what is ready, by a `wake()` of
        this client; `since` (`wakes` read before the caller looked for other work)
        counts the wakes that came before the claim was sent too.
        """
        return _claimed(task, self._claim(task, count, since, kwargs))

    def _claim(self, task: str, count: int, since: int | None, kwargs: dict,
               read: Sequence[str] = ()) -> pb.ClaimResponse:
        req = _claim_request(task, count, **{"consumer": self._data.consumer, **kwargs})
        req.read.extend(read)
        with self._bound_lock:
            if task in self._bounds and not req.has_max_partition:
                req.has_max_partition, req.max_partition = True, self._bounds[task]
            fut = self._session.send("claim", req)
        if since is not None and self.wakes != since:
            self._session.send("wake", pb.WakeRequest())  # it came before the claim
        return self._session.result(fut, "claim", timeout=req.wait_seconds + 60.0)

    def wake(self) -> None:
        """Answer this client's waiting claims at once, with whatever is ready (maybe
        nothing): a worker whose claim waits for one kind of work, woken when another
        kind arrives. Returns without waiting for the controller."""
        self.wakes = next(self._wakes)
        self._session.send("wake", pb.WakeRequest())

    def bound(self, task: str, max_partition: int) -> None:
        """From now on this client's claims of `task` take rows of partitions up to
        `max_partition` only, and so do its claims of the task waiting now: they look
        again under the new bound (a rollout replica whose new weights may generate
        the next step takes its prompts without a new claim). Returns without waiting
        for the controller."""
        with self._bound_lock:
            self._bounds[task] = max_partition
            self._session.send("bound", pb.BoundRequest(task=task, max_partition=max_partition))

    def get(self, batch: Batch, columns: Sequence[str]) -> Batch:
        batch.data.update(self._data.read(batch.rows, columns, batch.tag_sets))
        return batch

    def claim_get(self, task: str, count: int, columns: Sequence[str], **kwargs) -> Batch:
        """Claim, then read the columns; rows whose cells cannot be read go back at once.
        A claim whose lease ran out before its read (the process paused or starved past
        the lease: its rows went to another consumer, which may have finished and
        cleared them) is dropped: an empty batch, and a warning that says so."""
        sent = time.time()
        # the cells on memory units come with the claim's answer
        resp = self._claim(task, count, kwargs.pop("since", None), kwargs,
                           self._data.reads_with_claim(columns))
        batch = _claimed(task, resp)
        batch.claimed = (sent, time.time())
        if not batch.rows:
            return batch
        try:
            batch.data.update(self._data.read(batch.rows, columns, batch.tag_sets, resp.cells))
            batch.read_at = time.time()
            return batch
        except TransferQueueError as exc:
            try:
                self.release(batch)
            except TransferQueueError as gone:
                if gone.code == grpc.StatusCode.FAILED_PRECONDITION:  # the lease is not held
                    log.warning("dropped a claim of %d rows of %s before reading them (%s): %s",
                                len(batch.rows), task, exc, gone.message)
                    return Batch(task, "", [])
                # else the lease expires instead
            raise

    def ack(self, batch: Batch, indices: Sequence[int] | None = None, wait: bool = True) -> int:
        """Mark rows of the batch consumed by its task. With wait=False, return at once
        (-1) and surface a refusal from a later put/ack or flush()."""
        if not batch.lease:
            return 0
        self._check(block=False)
        fut = self._session.send("ack", pb.AckRequest(
            task=batch.task, lease=batch.lease, indices=list(indices or [])))
        if not wait:
            with self._unchecked_lock:
                self._unchecked.append(("ack", fut))
            return -1
        return self._session.result(fut, "ack").acked

    def extend(self, batch: Batch) -> float:
        """Keep the batch's lease alive (call well within lease_seconds)."""
        return self._session.call("extend", pb.ExtendRequest(
            task=batch.task, lease=batch.lease)).lease_seconds

    def release(self, batch: Batch) -> int:
        if not batch.lease:
            return 0
        return self._session.call("release", pb.ReleaseRequest(
            task=batch.task, lease=batch.lease)).released

    def regenerate(self, batch: Batch, indices: list[int], producer: str) -> int:
        """Refuse rows of a claimed batch: they leave its lease and `producer` makes
        them again (the rest of the batch stays held)."""
        return self._call(self._stub.Regenerate, pb.RegenerateRequest(
            task=batch.task, lease=batch.lease, indices=indices, producer=producer)).released

    def release_consumer(self, consumer: str | None = None) -> int:
        """Give back every lease `consumer` (default: this process's name) holds,
        e.g. those of a previous life of a restarted worker."""
        return self._call(self._stub.ReleaseConsumer, pb.ReleaseConsumerRequest(
            consumer=consumer or self._data.consumer)).released

    @property
    def consumer(self) -> str:
        return self._data.consumer

    def report_metrics(self, **fields: Any) -> None:
        self._call(self._stub.ReportMetrics, pb.JobMetrics(**fields))

    def stats(self) -> pb.StatsResponse:
        return self._call(self._stub.Stats, pb.StatsRequest())

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._session.close()
        self._data.close()
        self._channel.close()

    def __enter__(self) -> TransferQueueClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

