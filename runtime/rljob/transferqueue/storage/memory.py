"""In-process storage unit (embedded runs, unit tests), and its remote view:
other processes reach a memory unit through the controller's StorageService."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .base import Buffer, StorageUnit, register_backend
from .blocks import pack_cells, pack_keys, unpack_values


class MemoryUnit(StorageUnit):
    backend = "memory"

    def __init__(self, max_cell_bytes: int | None = None):
        self._cells: dict[tuple[int, str], bytes] = {}
        self._lock = threading.Lock()
        self.max_cell_bytes = max_cell_bytes

    def check(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        """ValueError if a cell is over the row limit (`put` then stores nothing)."""
        if self.max_cell_bytes is not None:
            for index, column, data in cells:
                if len(data) > self.max_cell_bytes:
                    raise ValueError(f"cell ({index}, {column!r}) is {len(data)} bytes, over the "
                                     f"{self.max_cell_bytes}-byte row limit")

    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        self.check(cells)
        with self._lock:
            for index, column, data in cells:
                self._cells[(index, column)] = bytes(data)

    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        with self._lock:
            return [[self._cells.get((i, c)) for c in columns] for i in indices]

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        with self._lock:
            return [self._cells.get(k) for k in keys]

    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        with self._lock:
            for index, columns in cells:
                for c in columns:
                    self._cells.pop((index, c), None)

    def __len__(self) -> int:
        return len(self._cells)


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
