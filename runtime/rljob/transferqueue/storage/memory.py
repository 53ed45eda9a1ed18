"""In-process storage unit (embedded runs, unit tests), and its remote view:
other processes reach a memory unit through the controller's StorageService."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .base import Buffer, StorageUnit, register_backend
from .blocks import pack_cells, pack_keys, unpack_values


_NONE: dict = {}  # a column no cell was stored under


class MemoryUnit(StorageUnit):
    """Cells column by column: per stored column name, its rows' bytes by index. A
    write's column is one update and a claim's read of a column one lookup per row
    (`get_column`), no key made per cell."""

    backend = "memory"

    def __init__(self, max_cell_bytes: int | None = None):
        self._columns: dict[str, dict[int, bytes]] = {}
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

    def _column(self, name: str) -> dict[int, bytes]:
        col = self._columns.get(name)
        if col is None:
            col = self._columns[name] = {}
        return col

    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        self.check(cells)
        with self._lock:
            for index, column, data in cells:
                self._column(column)[index] = bytes(data)

    def store_runs(self, runs: Sequence[tuple[str, Sequence[int], Sequence[Buffer]]]) -> None:
        """Runs of one column's cells (`blocks.unpack_runs`), checked by the caller."""
        with self._lock:
            for column, indices, data in runs:
                self._column(column).update(zip(indices, map(bytes, data)))

    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        with self._lock:
            cols = [self._columns.get(c, _NONE) for c in columns]
            return [[col.get(i) for col in cols] for i in indices]

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        with self._lock:
            return [self._columns.get(c, _NONE).get(i) for i, c in keys]

    def get_column(self, column: str, indices: Sequence[int]) -> list[Buffer | None]:
        """One column's cells of `indices`, in order (None where absent)."""
        with self._lock:
            return list(map(self._columns.get(column, _NONE).get, indices))

    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        with self._lock:
            for index, columns in cells:
                for c in columns:
                    col = self._columns.get(c)
                    if col is not None:
                        col.pop(index, None)
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
        import grpc

        from ..proto import transferqueue_pb2 as pb
        from ..proto import transferqueue_pb2_grpc as pbg
        from ..wire import GRPC_OPTIONS

        self._pb = pb
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
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
