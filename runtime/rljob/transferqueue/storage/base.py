"""The storage-unit interface and the backend registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ...infra.registry import Registry

Buffer = bytes | bytearray | memoryview


def cell_key(job: str, index: int, column: str) -> bytes:
    return f"{job}:{index}:{column}".encode()


class StorageUnit(ABC):
    """One shard of a job's table: cells keyed by (row index, column)."""

    backend: str = ""

    @abstractmethod
    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        """Write (index, column, bytes) cells in one batch."""

    @abstractmethod
    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        """Cells of `indices` × `columns` in one batch: result[row][column]; None if absent."""

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        """Exactly these (index, column) cells, in one batch; None where absent."""
        return [self.get([i], [c])[0][0] for i, c in keys]

    @abstractmethod
    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        """Remove the given (index, columns) cells."""

    def close(self) -> None:  # noqa: B027  (optional hook)
        pass


# backends join by decorator (`@register_backend("redis")` on a StorageUnit class
# whose constructor takes the unit's address and the client's options)
BACKENDS: Registry[type[StorageUnit]] = Registry("storage backend", StorageUnit,
                                                  "rljob.storage_backends")
register_backend = BACKENDS.register


def connect(backend: str, address: str, **options) -> StorageUnit:
    return BACKENDS.get(backend)(address, **options)
