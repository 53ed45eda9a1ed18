"""Columns and their wire encoding.

Cells are stored as raw bytes: tensors as their little-endian buffer (dtype
fixed per column, first dimension variable per row, no padding), scalars as a
0-d buffer of the column dtype, JSON/text as UTF-8. Decoding tensors is a
`numpy.frombuffer` view: no copy.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


def storage_column(column: str, tag: str = "") -> str:
    """The name a cell is stored under: fenced writes carry their lease id."""
    return f"{column}:{tag}" if tag else column

KINDS = ("tensor", "scalar", "json")
DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64")


class ColumnError(ValueError):
    """A value that does not fit its column (kind, dtype or shape)."""


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    kind: str = "tensor"
    dtype: str = ""
    trailing_shape: tuple[int, ...] = ()

    def check(self) -> None:
        if not self.name or ":" in self.name:
            raise ColumnError(f"column name {self.name!r} must be non-empty and without ':'")
        if self.kind not in KINDS:
            raise ColumnError(f"column {self.name!r}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind in ("tensor", "scalar") and self.dtype not in DTYPES:
            raise ColumnError(f"column {self.name!r}: dtype {self.dtype!r} is not one of {DTYPES}")
        if self.kind == "json" and self.dtype:
            raise ColumnError(f"column {self.name!r}: json columns take no dtype")

    def describe(self) -> str:
        if self.kind == "json":
            return "json"
        shape = ",".join(str(d) for d in ("N", *self.trailing_shape))
        return f"{self.kind}[{self.dtype}]({shape})" if self.kind == "tensor" else f"scalar[{self.dtype}]"


@dataclass(frozen=True)
class TaskSpec:
    """A task's registration: the columns it consumes (a row is ready for it once all
    of them are written) and the columns it produces."""

    name: str
    consumes: frozenset[str] = frozenset()
    produces: tuple[ColumnSpec, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "consumes", frozenset(self.consumes))
        object.__setattr__(self, "produces", tuple(self.produces))


def tensor(name: str, dtype: str, *trailing: int) -> ColumnSpec:
    return ColumnSpec(name, "tensor", dtype, tuple(trailing))


def scalar(name: str, dtype: str = "float32") -> ColumnSpec:
    return ColumnSpec(name, "scalar", dtype)


def json_column(name: str) -> ColumnSpec:
    return ColumnSpec(name, "json")


@functools.lru_cache(maxsize=None)
def _numpy_dtype(dtype: str) -> np.dtype:  # per cell read: made once per dtype
    # numpy has no bfloat16: its cells travel as raw 16-bit words
    return np.dtype("uint16") if dtype == "bfloat16" else np.dtype(dtype).newbyteorder("<")


def _as_numpy(col: ColumnSpec, value: Any) -> np.ndarray:
    mod = type(value).__module__
    if mod.startswith("torch"):
        import torch

        want = getattr(torch, col.dtype)
        if value.dtype != want:
            raise ColumnError(f"column {col.name!r} holds {col.dtype}, got torch {value.dtype}")
        t = value.detach().cpu().contiguous()
        if col.dtype == "bfloat16":
            t = t.view(torch.int16)
        return t.numpy()
    arr = np.asarray(value)
    if col.dtype == "bfloat16":
        raise ColumnError(f"column {col.name!r} holds bfloat16: pass a torch tensor")
    if arr.dtype != np.dtype(col.dtype):
        if col.kind == "scalar" and arr.ndim == 0 and np.can_cast(arr.dtype, col.dtype, "same_kind"):
            return arr.astype(col.dtype)
        raise ColumnError(f"column {col.name!r} holds {col.dtype}, got {arr.dtype}")
    return arr


# made once: json.dumps with options builds an encoder per call (a few µs a cell)
_JSON_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_JSON_DECODE = json.JSONDecoder().decode
_IMMUTABLE = (str, int, float, bool, type(None))  # JSON values a column may share
_MISS = object()
_EMPTY = {b"[]": list, b"{}": dict}  # a fresh one each (rows' `extra`, `gen_calls`)
_EMPTY_CELLS = {list: (b"[]", 0), dict: (b"{}", 0)}  # their cells


def _encode_json(col: ColumnSpec, value: Any) -> tuple[bytes, int]:
    try:
        data = _JSON_ENCODE(value).encode()
    except (TypeError, ValueError) as exc:
        raise ColumnError(f"column {col.name!r} holds JSON: {exc}") from None
    return data, len(value) if isinstance(value, (str, list)) else 0


def encode(col: ColumnSpec, value: Any) -> tuple[memoryview | bytes, int]:
    """(cell bytes, length) of one row's value; length is the first dimension."""
    if col.kind == "json":
        return _encode_json(col, value)
    arr = _as_numpy(col, value)
    if col.kind == "scalar":
        if arr.ndim != 0:
            raise ColumnError(f"column {col.name!r} is scalar, got shape {tuple(arr.shape)}")
        return arr.tobytes(), 1
    if arr.ndim != 1 + len(col.trailing_shape) or tuple(arr.shape[1:]) != col.trailing_shape:
        raise ColumnError(f"column {col.name!r} takes shape (N,{','.join(map(str, col.trailing_shape))}), "
                          f"got {tuple(arr.shape)}")
    arr = np.ascontiguousarray(arr)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return _cell_view(arr)


def _cell_view(arr: np.ndarray) -> tuple[memoryview, int]:
    """A C-contiguous little-endian array's bytes and first dimension (viewed flat:
    a (0, k) array cannot be cast as it is)."""
    return memoryview(arr.reshape(-1)).cast("B"), int(arr.shape[0])


def decode(col: ColumnSpec, data: bytes | memoryview) -> Any:
    """The row's value: numpy view for tensors, Python number, or JSON value."""
    if col.kind == "json":
        return _JSON_DECODE(bytes(data).decode())
    arr = np.frombuffer(data, dtype=_numpy_dtype(col.dtype))
    if col.kind == "scalar":
        return arr[0].item()
    return arr.reshape(-1, *col.trailing_shape)


_PLAIN_NUMBERS = (bool, int, float)


def encode_column(col: ColumnSpec, values: list) -> list[tuple[memoryview | bytes, int]]:
    """`encode` of each row's value of one column (the cells a write makes), the same
    bytes as cell by cell. A scalar column of plain numbers goes through numpy at
    once (each value cast to the column's dtype); a tensor column of numpy arrays
    that already have its dtype and shape is viewed as they are; a JSON column
    encodes each distinct string, number or null once (a group's rows repeat their
    prompt); anything else, cell by cell."""
    if col.kind == "json":
        seen: dict = {}
        out = []
        for v in values:
            if type(v) in _IMMUTABLE:
                key = (type(v), v)  # 1, 1.0 and True are equal keys, not equal JSON
                cell = seen.get(key)
                if cell is None:
                    cell = seen[key] = _encode_json(col, v)
                out.append(cell)
            elif type(v) in _EMPTY_CELLS and not v:  # rows' `extra` {}, `gen_calls` []
                out.append(_EMPTY_CELLS[type(v)])
            else:
                out.append(_encode_json(col, v))
        return out
    if col.kind == "tensor" and _arrays_fit(col, values):
        return [_cell_view(np.ascontiguousarray(v)) for v in values]
    if col.kind == "scalar" and (block := encode_block(col, values)) is not None:
        size, raw = _numpy_dtype(col.dtype).itemsize, block[1]
        return [(raw[k * size:(k + 1) * size], 1) for k in range(len(values))]
    return [encode(col, v) for v in values]


def _arrays_fit(col: ColumnSpec, values: list) -> bool:
    """Whether a tensor column's values are numpy arrays of its dtype and shape (then
    their bytes are the cells as they are)."""
    if col.dtype == "bfloat16":
        return False
    want, dims, trailing = _numpy_dtype(col.dtype), 1 + len(col.trailing_shape), col.trailing_shape
    return (all(type(v) is np.ndarray for v in values)
            and all(v.dtype == want for v in values)
            and all(v.ndim == dims for v in values)
            and (not trailing or all(v.shape[1:] == trailing for v in values)))


def encode_block(col: ColumnSpec, values: list
                 ) -> tuple[np.ndarray, memoryview, np.ndarray] | None:
    """A column's cells at once, as a block holds them: (each cell's size, their bytes
    back to back in a new buffer, each row's length), the bytes `encode_column`
    makes; for a tensor column whose values are numpy arrays of its dtype and shape,
    or a scalar column of plain numbers. None for any other column: its cells are
    encoded one by one."""
    n = len(values)
    if not n or col.kind == "json" or col.dtype == "bfloat16":
        return None
    want = _numpy_dtype(col.dtype)
    if col.kind == "tensor":
        if not _arrays_fit(col, values):
            return None
        lengths = np.fromiter(map(len, values), np.int64, n)
        width = want.itemsize * math.prod(col.trailing_shape)
        return lengths * width, _cell_view(np.concatenate(values))[0], lengths
    if col.kind == "scalar" and all(type(v) in _PLAIN_NUMBERS for v in values):
        arr = np.asarray(values)
        if arr.ndim == 1 and (arr.dtype == np.dtype(col.dtype)
                              or np.can_cast(arr.dtype, col.dtype, "same_kind")):
            return (np.full(n, want.itemsize, np.int64), _cell_view(arr.astype(want))[0],
                    np.ones(n, np.int64))
    return None


def decode_column(col: ColumnSpec, cells: list) -> list:
    """`decode` of each cell of one column (the values a read returns). A JSON
    column's equal cells that hold a string, number or null decode once (lists and
    objects are decoded per row: a row's value is its own to change)."""
    if col.kind == "json":
        seen: dict = {}
        out = []
        for c in cells:
            raw = bytes(c)
            value = seen.get(raw, _MISS)
            if value is _MISS:
                value = _EMPTY.get(raw, _MISS)
                value = _JSON_DECODE(raw.decode()) if value is _MISS else value()
                if type(value) in _IMMUTABLE:
                    seen[raw] = value
            out.append(value)
        return out
    dtype = _numpy_dtype(col.dtype)
    if col.kind == "scalar":
        if all(len(c) == dtype.itemsize for c in cells):
            return np.frombuffer(b"".join(cells), dtype=dtype).tolist()
        return [decode(col, c) for c in cells]
    if col.trailing_shape:
        return [np.frombuffer(c, dtype=dtype).reshape(-1, *col.trailing_shape) for c in cells]
    return [np.frombuffer(c, dtype=dtype) for c in cells]


def decode_block(col: ColumnSpec, sizes: np.ndarray, data) -> list:
    """`decode_column` of cells given as their sizes and their bytes back to back (a
    claim's block, column by column): a numeric column is one numpy view over the
    bytes, each row's value a slice of it; the same values as cell by cell."""
    if col.kind != "json" and len(sizes):
        dtype = _numpy_dtype(col.dtype)
        width = dtype.itemsize * math.prod(col.trailing_shape)
        if width and sizes.min() >= 0 and not (sizes % width).any():
            arr = np.frombuffer(data, dtype=dtype)
            if col.kind == "scalar" and (sizes == dtype.itemsize).all():
                return arr.tolist()
            if col.kind == "tensor":  # a row: its first dimension's slice
                arr = arr.reshape(-1, *col.trailing_shape)
                ends = np.cumsum(sizes // width).tolist()
                return [arr[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    ends = np.cumsum(np.maximum(sizes, 0)).tolist()
    view = memoryview(data)
    return decode_column(col, [view[a:b] for a, b in zip([0, *ends[:-1]], ends)])
