"""In-process storage unit (embedded runs, unit tests), and its remote view:
other processes reach a memory unit through the controller's StorageService."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import repeat

import numpy as np

from .base import Buffer, StorageUnit, register_backend
from .blocks import ABSENT, gather, pack_cells, pack_keys, unpack_values


_NONE: dict = {}  # a column no cell was stored under


class _Run:
    """One write's cells of one column: their bytes back to back, in the write's row
    order (each row's at starts[k], sizes[k] long). The unit maps each row of the run
    to it; the bytes go when no row maps to it any more."""

    __slots__ = ("indices", "sizes", "starts", "data", "_at")

    def __init__(self, indices: list[int], sizes: np.ndarray, data: Buffer):
        self.indices = indices
        self.sizes = sizes
        self.starts = np.cumsum(sizes) - sizes
        self.data = bytes(data)
        self._at: dict[int, int] | None = None  # row index -> position, made when asked

    def positions(self, indices: Sequence[int]) -> np.ndarray:
        if self._at is None:
            self._at = dict(zip(self.indices, range(len(self.indices))))
        return np.fromiter(map(self._at.__getitem__, indices), np.int64, len(indices))

    def cell(self, index: int) -> memoryview:
        (k,) = self.positions([index]).tolist()
        start = int(self.starts[k])
        return memoryview(self.data)[start:start + int(self.sizes[k])]

    def take(self, indices: list[int]) -> tuple[np.ndarray, Buffer]:
        """The sizes of `indices`' cells and their bytes back to back: the run itself
        when it is asked for whole, in order; a slice when they are consecutive."""
        if indices == self.indices:
            return self.sizes, self.data
        at = self.positions(indices)
        sizes = self.sizes[at]
        if len(at) and at[-1] - at[0] == len(at) - 1 and (np.diff(at) == 1).all():
            start = int(self.starts[at[0]])
            return sizes, memoryview(self.data)[start:start + int(sizes.sum())]
        return sizes, gather(self.data, self.starts[at], sizes)


class MemoryUnit(StorageUnit):
    """Cells column by column: per stored column name, each row's run (`_Run`: a
    write's cells of that column, their bytes in one buffer). A write's column is one
    buffer and one dict update; a claim's read of a column one lookup per row and a
    slice or a gather of bytes per run (`read_column`); nothing is made per cell."""

    backend = "memory"

    def __init__(self, max_cell_bytes: int | None = None):
        self._columns: dict[str, dict[int, _Run]] = {}
        self._lock = threading.Lock()
        self.max_cell_bytes = max_cell_bytes

    def check(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        """ValueError if a cell is over the row limit (`put` then stores nothing)."""
        limit = self.max_cell_bytes
        if limit is None or not cells or max(len(d) for _, _, d in cells) <= limit:
            return
        for index, column, data in cells:
            if len(data) > limit:
                raise ValueError(f"cell ({index}, {column!r}) is {len(data)} bytes, over the "
                                 f"{limit}-byte row limit")

    def check_runs(self, runs: Sequence[tuple[str, list[int], np.ndarray, Buffer]]) -> None:
        """`check` of runs (`blocks.unpack_runs`)."""
        limit = self.max_cell_bytes
        if limit is None:
            return
        for column, indices, sizes, _ in runs:
            if len(sizes) and sizes.max() > limit:
                k = int(np.argmax(sizes > limit))
                raise ValueError(f"cell ({indices[k]}, {column!r}) is {int(sizes[k])} bytes, "
                                 f"over the {limit}-byte row limit")

    def _column(self, name: str) -> dict[int, _Run]:
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = {}
        return col

    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        self.check(cells)
        by_column: dict[str, tuple[list[int], list[Buffer]]] = {}
        for index, column, data in cells:
            indices, values = by_column.setdefault(column, ([], []))
            indices.append(index)
            values.append(data)
        self.store_runs([(c, indices, np.fromiter(map(len, values), np.int64, len(values)),
                          b"".join(values)) for c, (indices, values) in by_column.items()])

    def store_runs(self, runs: Sequence[tuple[str, list[int], np.ndarray, Buffer]]) -> None:
        """Runs of one column's cells (`blocks.unpack_runs`), checked by the caller."""
        made = [(column, _Run(list(indices), np.asarray(sizes, np.int64), data))
                for column, indices, sizes, data in runs]
        with self._lock:
            for column, run in made:
                self._column(column).update(zip(run.indices, repeat(run)))

    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        cols = [self.get_column(c, indices) for c in columns]
        return [list(row) for row in zip(*cols)] if cols else [[] for _ in indices]

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        with self._lock:
            runs = [self._columns.get(c, _NONE).get(i) for i, c in keys]
        return [None if run is None else run.cell(i) for (i, _), run in zip(keys, runs)]

    def get_column(self, column: str, indices: Sequence[int]) -> list[Buffer | None]:
        """One column's cells of `indices`, in order (None where absent)."""
        with self._lock:
            runs = list(map(self._columns.get(column, _NONE).get, indices))
        return [None if run is None else run.cell(i) for i, run in zip(indices, runs)]

    def read_column(self, column: str, indices: list[int]) -> tuple[np.ndarray, Buffer]:
        """One column's cells of `indices`, in order, as a block's values are: their
        sizes (`ABSENT` where the unit has none) and their bytes back to back. Rows
        in a row from one run cost a slice of it (or one gather)."""
        with self._lock:
            runs = list(map(self._columns.get(column, _NONE).get, indices))
        n = len(indices)
        if not n:
            return np.zeros(0, np.int64), b""
        if runs[0] is not None and runs.count(runs[0]) == n:  # one write's rows
            return runs[0].take(indices)
        ids = np.fromiter(map(id, runs), np.uint64, n)
        cuts = [0, *(np.flatnonzero(ids[1:] != ids[:-1]) + 1).tolist(), n]
        sizes, pieces = [], []
        for a, b in zip(cuts, cuts[1:]):
            run = runs[a]
            if run is None:
                sizes.append(np.full(b - a, ABSENT, np.int64))
                continue
            s, d = run.take(indices[a:b])
            sizes.append(s)
            pieces.append(d)
        return np.concatenate(sizes), b"".join(pieces)

    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        # rows that name the same columns (a cleared partition's share one tuple)
        # are deleted a column at a time
        by_names: dict[tuple[str, ...], list[int]] = {}
        for index, columns in cells:
            by_names.setdefault(tuple(columns), []).append(index)
        with self._lock:
            for columns, indices in by_names.items():
                for c in columns:
                    col = self._columns.get(c)
                    if col is not None:
                        list(map(col.pop, indices, repeat(None)))
                        if not col:  # a lease's tagged names go with its rows
                            del self._columns[c]

    def __len__(self) -> int:
        with self._lock:
            return sum(map(len, self._columns.values()))


@register_backend("memory")
class RemoteMemoryUnit(StorageUnit):
    """A memory unit in another process, over the StorageService gRPC API (a batch
    of cells a `CellBlock`: blocks.py)."""

    backend = "memory"

    def __init__(self, address: str, unit: int = 0, **_):
        from ...infra import auth
        from ..proto import transferqueue_pb2 as pb
        from ..proto import transferqueue_pb2_grpc as pbg
        from ..wire import GRPC_OPTIONS

        self._pb = pb
        self._channel = auth.channel(address, GRPC_OPTIONS)  # the job's token
        self._stub = pbg.StorageServiceStub(self._channel)
        self.unit = unit

    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        self._stub.Put(self._pb.PutRequest(unit=self.unit, block=pack_cells(cells)))

    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        flat = self.get_cells([(i, c) for i in indices for c in columns])
        n = len(columns)
        return [flat[r * n:(r + 1) * n] for r in range(len(indices))]

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        resp = self._stub.Get(self._pb.GetRequest(unit=self.unit, keys=pack_keys(keys)))
        return unpack_values(resp.block, len(keys))  # in the order asked

    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        raise NotImplementedError("memory units are cleared by the controller that hosts them")

    def close(self) -> None:
        self._channel.close()
