"""A batch of cells as one `CellBlock` message (the memory units' wire): the cells'
keys in packed arrays and their bytes back to back in one buffer. A message per
cell cost each side of a 256-row read a few milliseconds of protobuf objects;
a block costs one join and one slice per cell."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..proto import transferqueue_pb2 as pb
from .base import Buffer

ABSENT = -1  # the size of a cell the unit does not have


def _keys(keys: Sequence[tuple[int, str]]) -> tuple[list[int], list[str], list[int]]:
    names = [c for _, c in keys]
    position = {c: k for k, c in enumerate(dict.fromkeys(names))}
    return [i for i, _ in keys], list(position), list(map(position.__getitem__, names))


def pack_keys(keys: Sequence[tuple[int, str]]) -> pb.CellBlock:
    """The (index, column) keys of a read."""
    indices, columns, column_of = _keys(keys)
    return pb.CellBlock(indices=indices, columns=columns, column_of=column_of)


def pack_values(values: Sequence[Buffer | None]) -> pb.CellBlock:
    """Cells' bytes, None for an absent one, without their keys (a read's answer:
    the reader knows what it asked for)."""
    return pb.CellBlock(sizes=[ABSENT if d is None else len(d) for d in values],
                        data=b"".join([d for d in values if d is not None]))


def pack_cells(cells: Sequence[tuple[int, str, Buffer | None]]) -> pb.CellBlock:
    """(index, column, bytes) cells, None for an absent one, as one block."""
    block = pack_values([d for _, _, d in cells])
    indices, columns, column_of = _keys([(i, c) for i, c, _ in cells])
    block.indices[:], block.columns[:], block.column_of[:] = indices, columns, column_of
    return block


def _checked_keys(block: pb.CellBlock) -> tuple[list[str], np.ndarray]:
    """The block's columns and column positions (an array: a buffer copy, not an
    object per cell); ValueError if they do not fit."""
    columns = list(block.columns)
    column_of = np.asarray(block.column_of, dtype=np.int64)
    if len(column_of) != len(block.indices):
        raise ValueError(f"a cell block has {len(block.indices)} indices and "
                         f"{len(column_of)} column positions")
    if len(column_of) and (column_of.min() < 0 or column_of.max() >= len(columns)):
        raise ValueError(f"a cell block names column positions outside its {len(columns)} "
                         "columns")
    return columns, column_of


def unpack_keys(block: pb.CellBlock) -> list[tuple[int, str]]:
    """The block's (index, column) keys; ValueError if it names a column it lacks."""
    columns, column_of = _checked_keys(block)
    return list(zip(block.indices, map(columns.__getitem__, column_of.tolist())))


def _sized(block: pb.CellBlock, count: int) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """The block's `count` sizes, where each cell's bytes end, and the bytes;
    ValueError if there are not `count` sizes, one is below `ABSENT` or they do not
    add up to the bytes."""
    sizes = np.asarray(block.sizes, dtype=np.int64)
    if len(sizes) != count:
        raise ValueError(f"a cell block has {count} cells and {len(sizes)} sizes")
    if len(sizes) and sizes.min() < ABSENT:
        raise ValueError("a cell block has a negative size")
    ends = np.cumsum(np.maximum(sizes, 0))
    data = memoryview(block.data)
    total = int(ends[-1]) if len(ends) else 0
    if total != len(data):
        raise ValueError(f"a cell block's sizes add up to {total} bytes, "
                         f"its data has {len(data)}")
    return sizes, ends, data


def unpack_runs(block: pb.CellBlock) -> list[tuple[str, list[int], np.ndarray, memoryview]]:
    """The block's cells as runs of one column each, (column, indices, sizes, bytes):
    a write's block goes column by column, a run a column, its cells' bytes back to
    back in one view (no object made per cell). ValueError if malformed."""
    columns, at = _checked_keys(block)
    indices = np.asarray(block.indices, dtype=np.int64)
    sizes, ends, data = _sized(block, len(indices))
    if not len(indices):
        return []
    bounds = [0, *(np.flatnonzero(at[1:] != at[:-1]) + 1).tolist(), len(indices)]
    starts = [0, *ends[[b - 1 for b in bounds[1:]]].tolist()]
    return [(columns[int(at[a])], indices[a:b].tolist(), sizes[a:b],
             data[starts[k]:starts[k + 1]])
            for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def unpack_columns(block: pb.CellBlock, rows: int, columns: int
                   ) -> list[tuple[np.ndarray, memoryview]]:
    """A claim's values block (`columns` columns of `rows` rows each, column by
    column) as each column's (sizes, bytes back to back); ValueError if it does not
    hold that many cells or its sizes do not add up."""
    sizes, ends, data = _sized(block, rows * columns)
    if not len(sizes):
        return [(sizes, data)] * columns
    bounds = [0, *ends[rows - 1::rows].tolist()]
    return [(sizes[j * rows:(j + 1) * rows], data[bounds[j]:bounds[j + 1]])
            for j in range(columns)]


def gather(data: Buffer, starts: np.ndarray, sizes: np.ndarray) -> bytes:
    """The byte ranges [starts[k], starts[k] + sizes[k]) of `data`, back to back, in
    one numpy gather (a size <= 0 takes nothing)."""
    sizes = np.maximum(np.asarray(sizes, dtype=np.int64), 0)
    total = int(sizes.sum())
    if not total:
        return b""
    offsets = np.cumsum(sizes) - sizes  # where each range lands in the result
    at = np.repeat(np.asarray(starts, dtype=np.int64) - offsets, sizes) + np.arange(total)
    return np.frombuffer(data, dtype=np.uint8)[at].tobytes()


def unpack_values(block: pb.CellBlock, count: int | None = None) -> list[memoryview | None]:
    """Each cell's bytes (views into the block's buffer), None where absent;
    ValueError if there are not `count` of them (default: one per index) or the
    sizes do not add up to the buffer."""
    sizes, ends, data = _sized(block, len(block.indices) if count is None else count)
    bounds = [0, *ends.tolist()]
    views = list(map(data.__getitem__, map(slice, bounds[:-1], bounds[1:])))
    if len(sizes) and sizes.min() < 0:
        return [None if s == ABSENT else v for s, v in zip(sizes.tolist(), views)]
    return views


def unpack_cells(block: pb.CellBlock) -> list[tuple[int, str, memoryview | None]]:
    """The block's (index, column, bytes) cells; ValueError if it is malformed."""
    return [(i, c, v) for (i, c), v in zip(unpack_keys(block), unpack_values(block))]
