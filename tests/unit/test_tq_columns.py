"""A column's cells encoded and decoded together (`schema.encode_column`,
`decode_column`) are the cells and values of `encode` and `decode` one by one."""

from __future__ import annotations

import numpy as np
import pytest

from rljob.transferqueue.schema import (ColumnError, decode, decode_column, encode,
                                        encode_column, json_column, scalar, tensor)


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
    got, want = decode_column(col, cells), [decode(col, c) for c in cells]
    for g, w in zip(got, want, strict=True):
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()
        else:
            assert g == w and type(g) is type(w)


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
