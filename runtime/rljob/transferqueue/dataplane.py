"""What a TransferQueue client reads and writes, and how: `Batch` (a claimed set of
rows), `TransferQueueError`, and `DataPlane`, which both clients share: the
table's layout (columns, storage units), encoding cells, storing them on their
units and reading them back. Cells go straight between the client and the units;
the controller only hears which rows were written.
"""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from typing import Any, NamedTuple

import grpc
import numpy as np
import redis

from ..contract import PASSWORD_ENV
from ..infra import auth
from .proto import transferqueue_pb2 as pb
from .proto import transferqueue_pb2_grpc as pbg
from .schema import (
    ColumnError,
    ColumnSpec,
    decode_block,
    decode_column,
    encode_block,
    encode_column,
    storage_column,
)
from .storage import StorageUnit, connect
from .storage.blocks import unpack_columns
from .units import redis_user
from .wire import GRPC_OPTIONS, column_from_pb


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


def rpc_error(exc: grpc.RpcError) -> TransferQueueError:
    return TransferQueueError(exc.code(), exc.details())


@contextmanager
def unit_errors(unit: int) -> Iterator[None]:
    """A storage unit's failure as the client's error: an unreachable unit (Redis
    restarting) is UNAVAILABLE, which callers retry like a restarting controller."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TransferQueueError(grpc.StatusCode.UNAVAILABLE,
                                 f"storage unit {unit} is unreachable: {exc}") from None
    except grpc.RpcError as exc:  # a memory unit is served by the controller
        raise rpc_error(exc) from None


class RowMeta(NamedTuple):
    """A claimed row: where it is and what the controller knows of it."""

    index: int
    partition: int
    unit: int
    length: int
    version: int
    group: int
    rank: int = 0  # TOKEN_BALANCED: the DP rank the row goes to
    # fenced writes: Batch.tag_sets[tag_set - 1] names its cells; 0: none
    tag_set: int = 0


_ROW = partial(tuple.__new__, RowMeta)  # a RowMeta of a tuple of its fields, in C


def claimed_rows(rows: pb.ClaimedRows) -> list[RowMeta]:
    """A claim's rows (`ClaimResponse.rows`: one column a field) as RowMetas."""
    n = len(rows.index)
    return list(map(_ROW, zip(rows.index, rows.partition, rows.unit or repeat(0, n),
                              rows.length, rows.version, rows.group,
                              rows.rank or repeat(0, n), rows.tag_set or repeat(0, n))))


@dataclass
class Batch:
    """A claimed set of rows: metadata, and the columns once fetched."""

    task: str
    lease: str
    rows: list[RowMeta]
    data: dict[str, list[Any]] = field(default_factory=dict)
    lease_seconds: float = 0.0
    # wall-clock seconds (`claim_get`): the claim sent, its answer, the cells read
    # (a worker's timeline shows each claim's round trip and read)
    claimed: tuple[float, float] = (0.0, 0.0)
    read_at: float = 0.0
    # the claim's distinct tags (column -> lease id its cells are stored under):
    # row.tag_set k > 0 is tag_sets[k - 1]
    tag_sets: list[dict[str, str]] = field(default_factory=list)

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)


@dataclass
class ColumnCells:
    """One column's cells of a write, made at once (`schema.encode_block`): each
    cell's size and their bytes back to back."""

    sizes: np.ndarray
    data: memoryview | bytes

    def split(self) -> list[memoryview]:
        """Each cell's bytes (views)."""
        ends = np.cumsum(self.sizes).tolist()
        view = memoryview(self.data)
        return [view[a:b] for a, b in zip([0, *ends[:-1]], ends)]


@dataclass
class UnitWrite:
    """A write's cells on one unit, column by column: the unit's rows, and per
    column the name its cells are stored under and its cells (each row's bytes, or
    a `ColumnCells` block)."""

    indices: list[int]
    columns: list[tuple[str, list[Any] | ColumnCells]] = field(default_factory=list)

    def cells(self) -> list[tuple[int, str, Any]]:
        """(index, column, bytes) cells, for `StorageUnit.put`."""
        return [(i, name, d) for name, data in self.columns
                for i, d in zip(self.indices,
                                data.split() if isinstance(data, ColumnCells) else data)]

    def block(self) -> pb.CellBlock:
        """The cells as one block (`storage/blocks.py`), built column by column."""
        n = len(self.indices)
        sizes, parts = [], []
        for _, column in self.columns:
            if isinstance(column, ColumnCells):
                sizes.append(column.sizes)
                parts.append(column.data)
            else:
                sizes.append(np.fromiter(map(len, column), np.int64, len(column)))
                parts.extend(column)
        return pb.CellBlock(indices=self.indices * len(self.columns),
                            columns=[name for name, _ in self.columns],
                            column_of=[k for k in range(len(self.columns)) for _ in range(n)],
                            sizes=np.concatenate(sizes).tolist() if sizes else [],
                            data=b"".join(parts))


class DataPlane:
    """Cell encoding and unit routing, shared by the sync and async clients."""

    def __init__(self, address: str, password: str | None):
        self.address = address
        self.password = password if password is not None else os.environ.get(PASSWORD_ENV)
        self.username = redis_user()  # Redis's ACL user
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
        self._unit_io: ThreadPoolExecutor | None = None  # the units' round trips at once

    def set_layout(self, layout: pb.LayoutResponse) -> None:
        self.job = layout.job
        self.table_id = layout.table_id
        self.max_row_bytes = layout.max_row_bytes
        self.set_columns(layout.columns)
        for u in self.units:
            u.close()
        self.units = [connect(u.backend, u.address or self.address, job=layout.job,
                              password=self.password, username=self.username, unit=u.id)
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
        with auth.channel(self.address, GRPC_OPTIONS) as channel:
            try:
                return pbg.TransferQueueControllerStub(channel).Layout(pb.LayoutRequest(),
                                                                       timeout=30)
            except grpc.RpcError as exc:
                raise rpc_error(exc) from None

    def encode_rows(self, indices: Sequence[int], columns: Mapping[str, Sequence[Any]],
                    length_column: str | None, tag: str = ""):
        """Each unit's cells (`UnitWrite`), per-row lengths and bytes; raises before
        any write."""
        n = len(indices)
        for name, values in columns.items():
            if len(values) != n:
                raise ColumnError(f"column {name!r} has {len(values)} values for {n} rows")
        specs = {name: self.column(name) for name in columns}
        k = len(self.units)
        positions: dict[int, list[int] | None] = {indices[0] % k: None} if n else {}
        if any(idx % k != indices[0] % k for idx in indices):  # rows on several units
            positions = {}
            for r, idx in enumerate(indices):
                positions.setdefault(idx % k, []).append(r)
        per_unit = {u: UnitWrite(list(indices) if pos is None else [indices[r] for r in pos])
                    for u, pos in positions.items()}
        lengths = [0] * n
        sums = np.zeros(n, np.int64)  # each row's bytes
        # every row on one unit that lives in the controller: its columns go as blocks
        # (a Redis unit stores cells, views of the values as they are)
        one = (len(positions) == 1 and None in positions.values()
               and self.in_controller(next(iter(positions))))
        for name, values in columns.items():
            values = list(values)
            stored = storage_column(name, tag)
            block = encode_block(specs[name], values) if one else None
            if block is not None:  # the column's cells at once, none made one by one
                sizes, joined, counts = block
                sums += sizes
                if name == length_column:
                    lengths = counts.tolist()
                for u in positions:
                    per_unit[u].columns.append((stored, ColumnCells(sizes, joined)))
                continue
            encoded = encode_column(specs[name], values)
            data = [d for d, _ in encoded]
            sums += np.fromiter(map(len, data), np.int64, n)
            if name == length_column:
                lengths = [length for _, length in encoded]
            for u, pos in positions.items():
                per_unit[u].columns.append((stored, data if pos is None
                                            else [data[r] for r in pos]))
        nbytes = sums.tolist()
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
                       lease: Batch | None = None, ack: bool = False, cells=()):
        return pb.NotifyWrittenRequest(
            indices=list(indices), columns=list(columns),
            lengths=list(lengths) if lengths is not None else (measured if length_column else []),
            versions=list(versions or []), nbytes=nbytes, create=create, partition=partition,
            group_size=group_size, task=lease.task if lease else "",
            lease=lease.lease if lease else "", ack=ack, cells=cells)

    def in_controller(self, unit: int) -> bool:
        """A memory unit: it lives in the controller, so its cells travel in the
        notify and the claim themselves (no Put or Get round trip of their own)."""
        return self.units[unit].backend == "memory"

    def reads_with_claim(self, columns: Sequence[str]) -> list[str]:
        """`ClaimRequest.read`: the columns, where some unit lives in the controller."""
        return list(columns) if any(map(self.in_controller, range(len(self.units)))) else []

    def read(self, rows: Sequence[RowMeta], columns: Sequence[str],
             tag_sets: Sequence[Mapping[str, str]] = (),
             claimed: Sequence[pb.UnitCells] = ()) -> dict[str, list[Any]]:
        """The rows' cells of `columns`, decoded; `claimed`: the cells that came with
        the claim (`ClaimResponse.cells`), the other units' read from them."""
        specs = [self.column(c) for c in columns]
        by_unit: dict[int, list[int]] = {}
        for pos, row in enumerate(rows):
            by_unit.setdefault(row.unit, []).append(pos)
        # the cells' names under each tag set (fenced writes: "column:lease")
        names = [list(columns)] + [[storage_column(c, tags.get(c, "")) for c in columns]
                                   for tags in tag_sets]
        came = {uc.unit: uc.block for uc in claimed}
        width = len(columns)

        # a unit's cells read from it: flat, row by row (a row's columns in order)
        def fetch(unit: int, positions: list[int]) -> list:
            with unit_errors(unit):
                if any(rows[p].tag_set for p in positions):  # fenced: per-row cell names
                    return self.units[unit].get_cells(
                        [(rows[p].index, name) for p in positions
                         for name in names[rows[p].tag_set]])
                return list(chain.from_iterable(
                    self.units[unit].get([rows[p].index for p in positions], columns)))

        remote = [(u, ps) for u, ps in by_unit.items() if u not in came]
        flat = dict(zip([u for u, _ in remote], self._each_unit(fetch, remote)))
        out: dict[str, list[Any]] = {spec.name: [] for spec in specs} if not rows else {}
        for unit, positions in by_unit.items():
            n = len(positions)
            if unit in came:  # column by column (`ClaimResponse.cells`)
                try:
                    blocks = unpack_columns(came[unit], n, width)
                except ValueError as exc:
                    raise TransferQueueError(grpc.StatusCode.DATA_LOSS,
                                             f"unit {unit}'s cells in the claim: {exc}") from None
            for j, spec in enumerate(specs):
                # this column's cells, the unit's rows in order
                if unit in came:
                    sizes, data = blocks[j]
                    missing = np.flatnonzero(sizes < 0)
                    at = int(missing[0]) if len(missing) else -1
                else:
                    cells = flat[unit][j::width]
                    at = cells.index(None) if None in cells else -1
                if at >= 0:
                    raise TransferQueueError(
                        grpc.StatusCode.DATA_LOSS,
                        f"cell ({rows[positions[at]].index}, {spec.name!r}) is missing from "
                        f"unit {unit}")
                # each column's cells decoded together (scalars in one numpy call)
                values = (decode_block(spec, sizes, data) if unit in came
                          else decode_column(spec, cells))
                if len(by_unit) == 1:  # every row, in order
                    out[spec.name] = values
                    continue
                column = out.setdefault(spec.name, [None] * len(rows))
                for p, value in zip(positions, values):
                    column[p] = value
        return out

    def store(self, unit: int, write: UnitWrite) -> None:
        with unit_errors(unit):
            self.units[unit].put(write.cells())

    def store_all(self, per_unit: Mapping[int, UnitWrite]) -> list[pb.UnitCells]:
        """Each unit's cells (`encode_rows`): stored on the units outside the
        controller, the units at the same time; those of the units in it returned,
        for the notify (`NotifyWrittenRequest.cells`)."""
        self._each_unit(self.store, [(u, w) for u, w in per_unit.items()
                                     if not self.in_controller(u)])
        return [pb.UnitCells(unit=u, block=w.block()) for u, w in per_unit.items()
                if self.in_controller(u)]

    def _each_unit(self, call, work) -> list:
        """call(unit, arg) for each (unit, arg), the units at the same time (a round
        trip each: a step's rows are spread over every unit); results in order, the
        first error raised."""
        work = list(work)
        if len(work) < 2:
            return [call(u, a) for u, a in work]
        with self._lock:
            if self._unit_io is None:
                self._unit_io = ThreadPoolExecutor(len(self.units),
                                                   thread_name_prefix="rljob-tq-units")
        return [f.result() for f in [self._unit_io.submit(call, u, a) for u, a in work]]

    def close(self) -> None:
        if self._unit_io is not None:
            self._unit_io.shutdown(wait=False)
        for u in self.units:
            u.close()
