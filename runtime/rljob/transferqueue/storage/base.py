"""The storage-unit interface and the backend registry."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

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


BACKENDS: dict[str, Callable[..., StorageUnit]] = {}


def register_backend(name: str, factory: Callable[..., StorageUnit]) -> None:
    if not callable(factory):
        raise TypeError(f"storage backend {name!r}: the factory must be callable")
    if BACKENDS.get(name, factory) is not factory:
        raise ValueError(f"storage backend {name!r} is already registered")
    BACKENDS[name] = factory


def connect(backend: str, address: str, **options) -> StorageUnit:
    try:
        factory = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown storage backend {backend!r}: one of {sorted(BACKENDS)}") from None
    return factory(address, **options)
