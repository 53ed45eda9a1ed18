"""A column's cells encoded and decoded together (`schema.encode_column`,
`decode_column`) are the cells and values of `encode` and `decode` one by one."""

from __future__ import annotations

import numpy as np
import pytest

from rljob.transferqueue.schema import (ColumnError, decode, decode_block, decode_column,
                                        encode, encode_column, json_column, scalar, tensor)


@pytest.mark.parametrize("col, values", [
    (scalar("reward", "float32"), [0.5, -1.25, 3, True, 1e-30]),
    (scalar("epoch", "int64"), [0, 7, -3, 2**40]),
    (scalar("slot", "int32"), [1, 2, 3]),
    (scalar("ok", "bool"), [True, False, True]),
    (scalar("t", "float64"), [1764284400.123456, 0.0]),
    (scalar("x", "float32"), [np.float32(0.25), 1.5]),  # not plain: cell by cell
    (tensor("ids", "int32"), [np.arange(3, dtype=np.int32), np.zeros(0, np.int32)]),
    (tensor("pairs", "float32", 2), [np.ones((2, 2), np.float32)]),
    (json_column("calls"), [[], [{"a": 1}], "text", None]),
    (json_column("extra"), [{}, [], {}, {"k": []}, [], [[]], {}]),
    # equal keys, different JSON: each its own cell
    (json_column("extra"), [1, True, 1.0, "1", 1, True, None, None, "é", "é"]),
    (json_column("prompt"), ["what is 2+2?"] * 4 + [{"k": [1]}, {"k": [1]}]),
    # tensors viewed as they are, and those that need a cast or a copy
    (tensor("ids", "int32"), [np.arange(6, dtype=np.int32)[::2], np.arange(2, dtype=np.int32)]),
    (tensor("pairs", "float32", 2), [np.ones((3, 2), np.float32), np.zeros((0, 2), np.float32)]),
])
def test_a_column_at_once_is_its_cells_one_by_one(col, values):
    together = encode_column(col, values)
    alone = [encode(col, v) for v in values]
    assert [(bytes(d), n) for d, n in together] == [(bytes(d), n) for d, n in alone]
    cells = [bytes(d) for d, _ in alone]
    want = [decode(col, c) for c in cells]
    # ...and so does a block's column (a claim's: sizes, and the bytes back to back)
    block = decode_block(col, np.array([len(c) for c in cells]), b"".join(cells))
    for got in (decode_column(col, cells), block):
        for g, w in zip(got, want, strict=True):
            if isinstance(w, np.ndarray):
                assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()
            else:
                assert g == w and type(g) is type(w)


def test_a_block_column_whose_cells_do_not_fit_the_dtype_fails_as_cell_by_cell():
    """A cell that is not a whole number of elements is refused as `decode` refuses
    it (the numpy view over the column is not taken)."""
    with pytest.raises(ValueError, match="multiple of element size"):
        decode_block(tensor("ids", "int32"), np.array([4, 3]), b"\0" * 7)
    assert decode_block(scalar("r", "float32"), np.zeros(0, np.int64), b"") == []


@pytest.mark.parametrize("col, values", [
    (scalar("slot", "int32"), [1, 2.5]),  # a float in an int column
    (scalar("reward", "float32"), [0.5, "high"]),
    (tensor("ids", "int32"), [np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)]),
    (tensor("ids", "int32"), [np.arange(3, dtype=np.int32), np.arange(3, dtype=">i4")]),
    (tensor("pairs", "float32", 2), [np.ones((2, 2), np.float32), np.ones((2, 3), np.float32)]),
    (json_column("extra"), ["fine", {"not": {1, 2}}]),
])
def test_a_value_that_does_not_fit_is_refused_as_cell_by_cell(col, values):
    with pytest.raises(ColumnError, match=col.name):
        encode_column(col, values)


def test_a_json_column_shares_decoded_strings_but_not_lists_or_objects():
    col = json_column("extra")
    cells = [bytes(d) for d, _ in encode_column(col, ["same", "same", {"a": []}, {"a": []}])]
    got = decode_column(col, [memoryview(c) for c in cells])
    assert got == ["same", "same", {"a": []}, {"a": []}]
    got[2]["a"].append(1)  # a row's object is its own
    assert got[3] == {"a": []}
    empty = decode_column(col, [b"[]", b"[]", b"{}", b"{}", b" []"])
    assert empty == [[], [], {}, {}, []]
    assert len({id(v) for v in empty}) == 5  # empty ones too
    empty[0].append(1)
    assert empty[1] == []
