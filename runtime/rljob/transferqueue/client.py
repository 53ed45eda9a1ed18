"""TransferQueue clients: control calls to the controller, data straight to the units.

A write is: allocate rows (new ones) → put cells on their storage units in one
batch per unit → tell the controller (notify-written). A read is: claim (a
lease with row metadata) → get cells from the units → ack after use.
`AsyncTransferQueueClient` is the same over grpc.aio.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
import redis

from ..contract import PASSWORD_ENV
from .proto import transferqueue_pb2 as pb
from .proto import transferqueue_pb2_grpc as pbg
from .policies import get_claim_policy
from .schema import ColumnError, ColumnSpec, TaskSpec, decode, encode, storage_column
from .session import AsyncSession, SyncSession
from .storage import StorageUnit, connect
from .wire import CLIENT_OPTIONS, GRPC_OPTIONS, POLICY_PB, column_from_pb, task_to_pb

RESERVE_BLOCK = 1024  # indices reserved per round trip by a writer
_STALE_PB = {"discard": pb.DISCARD, "regenerate": pb.REGENERATE}


class TransferQueueError(RuntimeError):
    """The controller refused a request; `code` is the gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @property
    def unavailable(self) -> bool:
        """The controller could not be reached (it may be restarting): try again."""
        return self.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                             grpc.StatusCode.DEADLINE_EXCEEDED)

    @property
    def refused(self) -> bool:
        """The controller said no (e.g. a lease that expired): drop the work."""
        return not self.unavailable


def _wrap(exc: grpc.RpcError) -> TransferQueueError:
    return TransferQueueError(exc.code(), exc.details())


@contextmanager
def _unit_errors(unit: int) -> Iterator[None]:
    """A storage unit's failure as the client's error: an unreachable unit (Redis
    restarting) is UNAVAILABLE, which callers retry like a restarting controller."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TransferQueueError(grpc.StatusCode.UNAVAILABLE,
                                 f"storage unit {unit} is unreachable: {exc}") from None
    except grpc.RpcError as exc:  # a memory unit is served by the controller
        raise _wrap(exc) from None


@dataclass
class Batch:
    """A claimed set of rows: metadata, and the columns once fetched."""

    task: str
    lease: str
    rows: list[pb.RowMeta]
    data: dict[str, list[Any]] = field(default_factory=dict)
    lease_seconds: float = 0.0

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


def _claimed(task: str, resp: pb.ClaimResponse) -> Batch:
    return Batch(task, resp.lease, list(resp.rows), lease_seconds=resp.lease_seconds)


def _claim_request(task: str, count: int, *, min_count: int | None = None, policy: str = "fifo",
                   token_budget: int | None = None, dp_size: int = 1, wait: float = 0.0,
                   partition: int | None = None, min_version: int | None = None,
                   on_stale: str = "discard", stale_producer: str | None = None,
                   ack: Batch | None = None, consumer: str = "") -> pb.ClaimRequest:
    get_claim_policy(policy)  # a ValueError naming the policies for an unknown one
    return pb.ClaimRequest(
        task=task, count=count, min_count=min_count or 0,
        policy=POLICY_PB.get(policy, pb.CLAIM_POLICY_UNSPECIFIED), policy_name=policy,
        token_budget=token_budget or 0, dp_size=dp_size, wait_seconds=wait,
        has_partition=partition is not None, partition=partition or 0,
        has_min_version=min_version is not None, min_version=min_version or 0,
        on_stale=_STALE_PB[on_stale], stale_producer=stale_producer or "",
        ack_lease=ack.lease if ack is not None and ack.task == task else "",
        consumer=consumer)


class _Data:
    """Cell encoding and unit routing, shared by the sync and async clients."""

    def __init__(self, address: str, password: str | None):
        self.address = address
        self.password = password if password is not None else os.environ.get(PASSWORD_ENV)
        # how this process shows in Stats' per-consumer leases (the pod name in a cluster)
        self.consumer = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        self.job = ""
        self.table_id = ""
        self.columns: dict[str, ColumnSpec] = {}
        self.units: list[StorageUnit] = []
        self.max_row_bytes = 0
        self._pool: list[int] = []  # reserved row indices not used yet
        self._pool_generation = 0
        self._lock = threading.Lock()

    def set_layout(self, layout: pb.LayoutResponse) -> None:
        self.job = layout.job
        self.table_id = layout.table_id
        self.max_row_bytes = layout.max_row_bytes
        self.set_columns(layout.columns)
        for u in self.units:
            u.close()
        self.units = [connect(u.backend, u.address or self.address, job=layout.job,
                              password=self.password, unit=u.id)
                      for u in sorted(layout.units, key=lambda u: u.id)]

    def set_columns(self, columns) -> None:
        self.columns = {c.name: column_from_pb(c) for c in columns}

    def column(self, name: str) -> ColumnSpec:
        spec = self.columns.get(name)
        if spec is None:
            # another process may have registered it since we last looked
            self.set_columns(self._fetch_layout().columns)
            spec = self.columns.get(name)
        if spec is None:
            raise ColumnError(f"unknown column {name!r}: register a task that produces it "
                              f"(known: {sorted(self.columns)})")
        return spec

    def _fetch_layout(self) -> pb.LayoutResponse:
        """A blocking Layout call (also from the async client's worker threads)."""
        with grpc.insecure_channel(self.address, options=GRPC_OPTIONS) as channel:
            try:
                return pbg.TransferQueueControllerStub(channel).Layout(pb.LayoutRequest(),
                                                                       timeout=30)
            except grpc.RpcError as exc:
                raise _wrap(exc) from None

    def encode_rows(self, indices: Sequence[int], columns: Mapping[str, Sequence[Any]],
                    length_column: str | None, tag: str = ""):
        """Per-unit cell lists, per-row lengths and bytes; raises before any write."""
        n = len(indices)
        for name, values in columns.items():
            if len(values) != n:
                raise ColumnError(f"column {name!r} has {len(values)} values for {n} rows")
        specs = {name: self.column(name) for name in columns}
        per_unit: dict[int, list[tuple[int, str, Any]]] = {}
        lengths = [0] * n
        nbytes = [0] * n
        for name, values in columns.items():
            for r, (idx, value) in enumerate(zip(indices, values)):
                data, length = encode(specs[name], value)
                nbytes[r] += len(data)
                if name == length_column:
                    lengths[r] = length
                per_unit.setdefault(idx % len(self.units), []).append(
                    (idx, storage_column(name, tag), data))
        too_big = [indices[r] for r in range(n) if self.max_row_bytes and nbytes[r] > self.max_row_bytes]
        if too_big:
            raise ColumnError(f"rows {too_big[:5]} are larger than max_row_bytes="
                              f"{self.max_row_bytes}")
        return per_unit, lengths, nbytes

    def take_reserved(self, n: int, generation: int) -> list[int] | None:
        """n reserved indices from the local pool, or None if it must be refilled.

        Reservations live in the controller's memory: a new session (maybe a
        restarted controller) starts a new pool.
        """
        with self._lock:
            if generation != self._pool_generation:
                self._pool, self._pool_generation = [], generation
            if len(self._pool) < n:
                return None
            out, self._pool = self._pool[:n], self._pool[n:]
            return out

    def refill(self, resp: pb.ReserveResponse) -> None:
        with self._lock:
            self._pool.extend(range(resp.start, resp.start + resp.count))

    @staticmethod
    def notify_request(indices, columns, measured, nbytes, *, versions=None, lengths=None,
                       length_column=None, create=False, partition=0, group_size=1,
                       lease: Batch | None = None):
        return pb.NotifyWrittenRequest(
            indices=list(indices), columns=list(columns),
            lengths=list(lengths) if lengths is not None else (measured if length_column else []),
            versions=list(versions or []), nbytes=nbytes, create=create, partition=partition,
            group_size=group_size, task=lease.task if lease else "",
            lease=lease.lease if lease else "")

    def read(self, rows: Sequence[pb.RowMeta], columns: Sequence[str]) -> dict[str, list[Any]]:
        specs = [self.column(c) for c in columns]
        by_unit: dict[int, list[int]] = {}
        for pos, row in enumerate(rows):
            by_unit.setdefault(row.unit, []).append(pos)
        out: dict[str, list[Any]] = {c: [None] * len(rows) for c in columns}
        for unit, positions in by_unit.items():
            if any(rows[p].tags for p in positions):  # fenced writes: per-row cell names
                keys = [(rows[p].index, storage_column(c, rows[p].tags.get(c, "")))
                        for p in positions for c in columns]
                with _unit_errors(unit):
                    flat = self.units[unit].get_cells(keys)
                cells = [flat[k * len(columns):(k + 1) * len(columns)]
                         for k in range(len(positions))]
            else:
                with _unit_errors(unit):
                    cells = self.units[unit].get([rows[p].index for p in positions], columns)
            for p, values in zip(positions, cells):
                for spec, value in zip(specs, values):
                    if value is None:
                        raise TransferQueueError(
                            grpc.StatusCode.DATA_LOSS,
                            f"cell ({rows[p].index}, {spec.name!r}) is missing from unit {unit}")
                    out[spec.name][p] = decode(spec, value)
        return out

    def store(self, unit: int, cells) -> None:
        with _unit_errors(unit):
            self.units[unit].put(cells)

    def close(self) -> None:
        for u in self.units:
            u.close()


class TransferQueueClient:
    """Blocking client. Thread-safe for concurrent claims (gRPC channels are)."""

    def __init__(self, address: str, password: str | None = None):
        self._channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        self._stub = pbg.TransferQueueControllerStub(self._channel)
        self._session = SyncSession(self._stub, TransferQueueError)
        # (kind, future) of put(wait=False) / ack(wait=False) whose answer is unchecked
        self._unchecked: list = []
        self._unchecked_lock = threading.Lock()
        self._data = _Data(address, password)
        self._data.set_layout(self._call(self._stub.Layout, pb.LayoutRequest()))

    def _call(self, method, request, timeout: float | None = 60.0):
        try:
            # wait_for_ready: ride through a controller restart within the timeout
            return method(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise _wrap(exc) from None

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
              lengths: Sequence[int] | None = None, lease: Batch | None = None) -> int:
        """Write columns of existing rows, then notify; returns rows newly ready.

        With `lease` (the Batch the rows were claimed in) the write is fenced:
        if that lease has expired meanwhile, the controller refuses it
        (FAILED_PRECONDITION) and no reader ever sees these cells."""
        per_unit, measured, nbytes = self._data.encode_rows(
            indices, columns, length_column, lease.lease if lease else "")
        for unit, cells in per_unit.items():
            self._data.store(unit, cells)
        return self._session.call("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, lease=lease)).newly_ready

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
        for unit, cells in per_unit.items():
            self._data.store(unit, cells)
        fut = self._session.send("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, create=True, partition=partition,
            group_size=group_size))
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

    def claim(self, task: str, count: int, **kwargs: Any) -> Batch:
        """Lease up to `count` ready rows of `task` (metadata only; see `get`).

        Options: min_count (wait for this many, default count), wait (seconds to
        long-poll), policy (a claim policy name: policies.py), token_budget,
        dp_size, partition, min_version with on_stale (discard | regenerate)
        and stale_producer, ack (a previous Batch of this task to ack first).
        """
        req = _claim_request(task, count, **{"consumer": self._data.consumer, **kwargs})
        resp = self._session.call("claim", req, timeout=req.wait_seconds + 60.0)
        return _claimed(task, resp)

    def get(self, batch: Batch, columns: Sequence[str]) -> Batch:
        batch.data.update(self._data.read(batch.rows, columns))
        return batch

    def claim_get(self, task: str, count: int, columns: Sequence[str], **kwargs) -> Batch:
        """Claim, then read the columns; rows whose cells cannot be read go back at once."""
        batch = self.claim(task, count, **kwargs)
        if not batch.rows:
            return batch
        try:
            return self.get(batch, columns)
        except TransferQueueError:
            try:
                self.release(batch)
            except TransferQueueError:
                pass  # the lease expires instead
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


class AsyncTransferQueueClient:
    """asyncio client: control over grpc.aio, storage I/O in worker threads."""

    def __init__(self, address: str, password: str | None = None):
        self._channel = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
        self._stub = pbg.TransferQueueControllerStub(self._channel)
        self._session = AsyncSession(self._stub, TransferQueueError)
        self._data = _Data(address, password)

    @classmethod
    async def connect(cls, address: str, password: str | None = None) -> AsyncTransferQueueClient:
        client = cls(address, password)
        layout = await client._call(client._stub.Layout, pb.LayoutRequest())
        await asyncio.to_thread(client._data.set_layout, layout)
        return client

    async def _call(self, method, request, timeout: float | None = 60.0):
        try:
            return await method(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise _wrap(exc) from None

    async def register(self, *tasks: TaskSpec) -> None:
        resp = await self._call(self._stub.RegisterTasks,
                                pb.RegisterTaskRequest(tasks=[task_to_pb(t) for t in tasks]))
        self._data.set_columns(resp.columns)

    async def write(self, indices: Sequence[int], columns: Mapping[str, Sequence[Any]], *,
                    versions: Sequence[int] | None = None, length_column: str | None = None,
                    lengths: Sequence[int] | None = None, lease: Batch | None = None) -> int:
        per_unit, measured, nbytes = self._data.encode_rows(
            indices, columns, length_column, lease.lease if lease else "")
        await self._store(per_unit)
        resp = await self._session.call("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, lease=lease))
        return resp.newly_ready

    async def _store(self, per_unit) -> None:
        await asyncio.gather(*(asyncio.to_thread(self._data.store, u, cells)
                               for u, cells in per_unit.items()))

    async def put(self, partition: int, columns: Mapping[str, Sequence[Any]], *,
                  group_size: int = 1, versions: Sequence[int] | None = None,
                  length_column: str | None = None,
                  lengths: Sequence[int] | None = None) -> list[int]:
        n = len(next(iter(columns.values())))
        if n % max(group_size, 1):
            raise ColumnError(f"{n} rows are not a multiple of group_size {group_size}")
        while (indices := self._data.take_reserved(n, await self._session.open())) is None:
            self._data.refill(await self._session.call("reserve",
                                               pb.ReserveRequest(count=max(n, RESERVE_BLOCK))))
        per_unit, measured, nbytes = self._data.encode_rows(indices, columns, length_column)
        await self._store(per_unit)
        await self._session.call("notify", self._data.notify_request(
            indices, columns, measured, nbytes, versions=versions, lengths=lengths,
            length_column=length_column, create=True, partition=partition,
            group_size=group_size))
        return indices

    async def claim(self, task: str, count: int, **kwargs: Any) -> Batch:
        """As `TransferQueueClient.claim` (its options)."""
        req = _claim_request(task, count, **{"consumer": self._data.consumer, **kwargs})
        resp = await self._session.call("claim", req, timeout=req.wait_seconds + 60.0)
        return _claimed(task, resp)

    async def get(self, batch: Batch, columns: Sequence[str]) -> Batch:
        batch.data.update(await asyncio.to_thread(self._data.read, batch.rows, columns))
        return batch

    async def claim_get(self, task: str, count: int, columns: Sequence[str], **kwargs) -> Batch:
        batch = await self.claim(task, count, **kwargs)
        return await self.get(batch, columns) if batch.rows else batch

    async def ack(self, batch: Batch, indices: Sequence[int] | None = None) -> int:
        if not batch.lease:
            return 0
        resp = await self._session.call("ack", pb.AckRequest(
            task=batch.task, lease=batch.lease, indices=list(indices or [])))
        return resp.acked

    async def extend(self, batch: Batch) -> float:
        resp = await self._session.call("extend", pb.ExtendRequest(
            task=batch.task, lease=batch.lease))
        return resp.lease_seconds

    async def release(self, batch: Batch) -> int:
        if not batch.lease:
            return 0
        resp = await self._session.call("release", pb.ReleaseRequest(
            task=batch.task, lease=batch.lease))
        return resp.released

    async def report_metrics(self, **fields: Any) -> None:
        await self._call(self._stub.ReportMetrics, pb.JobMetrics(**fields))

    async def stats(self) -> pb.StatsResponse:
        return await self._call(self._stub.Stats, pb.StatsRequest())

    async def close(self) -> None:
        await self._session.close()
        self._data.close()
        await self._channel.close()
