"""A batch of cells as one CellBlock: the same cells back, malformed blocks refused."""

from __future__ import annotations

import numpy as np
import pytest

from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.storage.blocks import (
    pack_cells,
    pack_keys,
    unpack_cells,
    unpack_keys,
    unpack_values,
)


def test_cells_come_back_as_they_went():
    ids = np.arange(5, dtype=np.int32)
    cells = [(7, "prompt_ids", memoryview(ids).cast("B")), (7, "reward", b"\x00\x00\x80?"),
             (9, "prompt_ids", b""), (9, "reward:lease-1", bytearray(b"ab")),
             (12, "gen_calls", "[]".encode())]
    block = pb.CellBlock.FromString(pack_cells(cells).SerializeToString())  # over the wire
    assert list(block.columns) == ["prompt_ids", "reward", "reward:lease-1", "gen_calls"]
    back = unpack_cells(block)
    assert [(i, c, bytes(v)) for i, c, v in back] == [(i, c, bytes(d)) for i, c, d in cells]
    assert np.array_equal(np.frombuffer(back[0][2], np.int32), ids)


def test_absent_cells_stay_absent_and_keys_keep_their_order():
    keys = [(3, "b"), (1, "a"), (3, "a")]
    assert unpack_keys(pack_keys(keys)) == keys
    block = pack_cells([(3, "b", b"x"), (1, "a", None), (3, "a", b"yz")])
    assert [None if v is None else bytes(v) for v in unpack_values(block)] == [b"x", None, b"yz"]
    assert unpack_values(pack_cells([])) == []


@pytest.mark.parametrize("block, words", [
    (pb.CellBlock(indices=[0], columns=["a"], column_of=[0], sizes=[5], data=b"abc"),
     "add up to 5 bytes, its data has 3"),
    (pb.CellBlock(indices=[0], columns=["a"], column_of=[0], sizes=[1], data=b"abc"),
     "add up to 1 bytes, its data has 3"),
    (pb.CellBlock(indices=[0, 1], columns=["a"], column_of=[0, 1], sizes=[1, 1], data=b"ab"),
     "outside its 1 columns"),
    (pb.CellBlock(indices=[0, 1], columns=["a"], column_of=[0], sizes=[1, 1], data=b"ab"),
     "2 indices and 1 column positions"),
    (pb.CellBlock(indices=[0, 1], columns=["a"], column_of=[0, 0], sizes=[2], data=b"ab"),
     "2 cells and 1 sizes"),
    (pb.CellBlock(indices=[0], columns=["a"], column_of=[0], sizes=[-2], data=b""),
     "negative size"),
])
def test_a_malformed_block_is_refused_with_what_is_wrong(block, words):
    with pytest.raises(ValueError, match=words):
        unpack_cells(block)
