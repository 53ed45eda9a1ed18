"""A column's cells encoded and decoded together (`schema.encode_column`,
`encode_block`, `decode_column`) are the cells and values of `encode` and `decode`
one by one."""

from __future__ import annotations

import numpy as np
import pytest

from rljob.transferqueue.dataplane import DataPlane
from rljob.transferqueue.schema import (ColumnError, decode, decode_block, decode_column,
                                        encode, encode_block, encode_column, json_column,
                                        scalar, tensor)
from rljob.transferqueue.wire import column_to_pb


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
    # a block of the column's cells, where one is made, holds the same bytes
    block = encode_block(col, values)
    if block is not None:
        sizes, data, lengths = block
        assert sizes.tolist() == [len(d) for d, _ in alone]
        assert data == b"".join(bytes(d) for d, _ in alone)
        assert lengths.tolist() == [n for _, n in alone]
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
    assert encode_block(col, values) is None  # no block: the cells, one by one, refuse it
    with pytest.raises(ColumnError, match=col.name):
        encode_column(col, values)


def test_blocks_are_made_for_arrays_and_plain_numbers_only():
    ids = tensor("ids", "int32")
    assert encode_block(ids, [np.arange(3, dtype=np.int32), np.zeros(0, np.int32)]) is not None
    assert encode_block(ids, [[1, 2, 3]]) is None  # a list: cell by cell
    assert encode_block(ids, []) is None
    assert encode_block(json_column("x"), [1, 2]) is None
    assert encode_block(tensor("h", "bfloat16"), [np.zeros(2, np.uint16)]) is None
    assert encode_block(scalar("x", "float32"), [np.float32(1)]) is None


@pytest.mark.parametrize("units", [1, 3])
def test_a_write_makes_the_same_cells_with_blocks_or_one_by_one(units):
    """`DataPlane.encode_rows`: a write whose rows share one unit takes its columns as
    blocks; its unit block, its cells for a unit outside the controller, its lengths
    and bytes per row are those of the cells made one by one (rows on several units)."""
    cols = [tensor("ids", "int32"), tensor("pairs", "float32", 2), scalar("r", "float32"),
            json_column("meta")]
    plane = DataPlane("unused:0", None)
    plane.set_columns([column_to_pb(c) for c in cols])
    plane.units = [type("Unit", (), {"backend": "memory"})()] * units
    rng = np.random.default_rng(0)
    values = {"ids": [rng.integers(0, 99, k, dtype=np.int32) for k in (3, 0, 5, 1)],
              "pairs": [np.ones((k, 2), np.float32) * k for k in (1, 2, 0, 3)],
              "r": [0.5, 1, True, -2.25], "meta": [{"k": 1}, None, [], "x"]}
    indices = [0, 3, 6, 7] if units == 3 else [0, 1, 2, 3]  # units 0, 0, 0, 1 with three
    per_unit, lengths, nbytes = plane.encode_rows(indices, values, "ids", "lease-1")
    want = {(i, f"{c.name}:lease-1", bytes(encode(c, v)[0]))
            for c in cols for i, v in zip(indices, values[c.name])}
    cells = [(i, c, bytes(d)) for w in per_unit.values() for i, c, d in w.cells()]
    assert sorted(cells) == sorted(want)
    assert lengths == [3, 0, 5, 1]
    assert nbytes == [sum(len(encode(c, values[c.name][r])[0]) for c in cols)
                      for r in range(4)]
    for unit, write in per_unit.items():
        block = write.block()
        mine = [(i, c, d) for i, c, d in cells if i % units == unit]  # column by column
        assert list(block.sizes) == [len(d) for _, _, d in mine]
        assert block.data == b"".join(d for _, _, d in mine)
        assert list(block.indices) == [i for i, _, _ in mine]
    kinds = {type(c).__name__ for w in per_unit.values() for _, c in w.columns}
    assert kinds == ({"ColumnCells", "list"} if units == 1 else {"list"})


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
