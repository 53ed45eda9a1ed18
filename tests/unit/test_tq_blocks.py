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


def test_a_writes_cells_go_to_their_units_column_by_column():
    """`DataPlane.encode_rows` groups a write's cells by unit (index mod units): each
    unit's block holds exactly its rows' cells, the same as packing them one by one,
    and the per-row bytes and lengths are counted over every column."""
    from rljob.transferqueue import json_column, scalar, tensor
    from rljob.transferqueue.dataplane import DataPlane

    plane = DataPlane("unused:0", None)
    plane.columns = {c.name: c for c in (tensor("ids", "int32"), scalar("reward"),
                                         json_column("prompt"))}
    plane.units = [object()] * 3
    indices = [4, 5, 6, 7, 9]
    ids = [np.arange(i % 4 + 1, dtype=np.int32) for i in indices]
    per_unit, lengths, nbytes = plane.encode_rows(
        indices, {"ids": ids, "reward": [0.5] * 5, "prompt": ["p"] * 5}, "ids", tag="l1")
    assert sorted(per_unit) == [0, 1, 2]
    assert lengths == [len(x) for x in ids]
    assert nbytes == [4 * len(x) + 4 + 3 for x in ids]
    for unit, write in per_unit.items():
        assert write.indices == [i for i in indices if i % 3 == unit]
        cells = write.cells()
        assert {(i, c) for i, c, _ in cells} == {(i, c) for i in write.indices
                                                 for c in ("ids:l1", "reward:l1", "prompt:l1")}
        block = pb.CellBlock.FromString(write.block().SerializeToString())
        assert block == pack_cells(cells)
        back = {(i, c): bytes(v) for i, c, v in unpack_cells(block)}
        for i in write.indices:
            assert back[(i, "ids:l1")] == ids[indices.index(i)].tobytes()
            assert back[(i, "prompt:l1")] == b'"p"'
    single = DataPlane("unused:0", None)
    single.columns, single.units = plane.columns, [type("Unit", (), {"backend": "redis"})()]
    (write,) = single.encode_rows(indices, {"reward": [1.0] * 5}, None)[0].values()
    assert write.indices == indices and unpack_cells(write.block())[0][0] == 4


def test_a_block_comes_apart_in_runs_of_one_column_and_a_memory_unit_keeps_columns():
    """`unpack_runs`: a write's block (column by column) is a run a column, its cells'
    bytes one view; cells of columns that alternate are runs as they come. A memory
    unit stores runs and cells alike, reads a column's rows in order, and forgets a
    column with its last cell."""
    from rljob.transferqueue.storage.blocks import unpack_runs
    from rljob.transferqueue.storage.memory import MemoryUnit

    cells = [(1, "a", b"x"), (2, "a", b"yy"), (1, "b:l", b""), (2, "b:l", b"z"),
             (3, "a", b"w")]
    runs = unpack_runs(pb.CellBlock.FromString(pack_cells(cells).SerializeToString()))
    assert [(c, i, s.tolist(), bytes(d)) for c, i, s, d in runs] == [
        ("a", [1, 2], [1, 2], b"xyy"), ("b:l", [1, 2], [0, 1], b"z"), ("a", [3], [1], b"w")]
    assert unpack_runs(pack_cells([])) == []
    with pytest.raises(ValueError, match="outside its 1 columns"):
        unpack_runs(pb.CellBlock(indices=[0], columns=["a"], column_of=[3], sizes=[0]))
    with pytest.raises(ValueError, match="add up to 2 bytes, its data has 3"):
        unpack_runs(pb.CellBlock(indices=[0], columns=["a"], column_of=[0], sizes=[2],
                                 data=b"abc"))

    unit = MemoryUnit(max_cell_bytes=4)
    unit.store_runs(runs)
    unit.put([(4, "a", b"v")])
    assert unit.get_column("a", [3, 1, 9, 4]) == [b"w", b"x", None, b"v"]
    assert unit.get_column("nothing", [1]) == [None]
    assert unit.get([1, 2], ["b:l", "a"]) == [[b"", b"x"], [b"z", b"yy"]]
    assert unit.get_cells([(2, "a"), (2, "c")]) == [b"yy", None] and len(unit) == 6
    with pytest.raises(ValueError, match="over the 4-byte row limit"):
        unit.put([(5, "a", b"12345")])
    with pytest.raises(ValueError, match=r"cell \(8, 'a'\) is 5 bytes, over the 4-byte"):
        unit.check_runs(unpack_runs(pack_cells([(7, "a", b"1"), (8, "a", b"12345")])))
    unit.delete([(1, ["a", "b:l"]), (2, ["b:l"])])
    assert "b:l" not in unit._columns and len(unit) == 3


def test_a_memory_unit_reads_a_column_as_sizes_and_bytes_in_the_order_asked():
    """`read_column`: the cells of the rows asked, in their order, whatever runs they
    are in (a whole run, a slice of one, several, a gather, absent ones), the same
    bytes cell by cell; `gather` takes byte ranges back to back."""
    from rljob.transferqueue.storage.blocks import gather
    from rljob.transferqueue.storage.memory import MemoryUnit

    assert gather(b"abcdef", np.array([4, 0, 2]), np.array([2, 1, -1])) == b"efa"
    assert gather(b"abc", np.array([0]), np.array([0])) == b""
    unit = MemoryUnit()
    first = {i: bytes([i]) * (i % 3) for i in range(10)}  # sizes 0, 1 and 2
    unit.put([(i, "c", first[i]) for i in range(10)])
    unit.put([(i, "c", b"new" + bytes([i])) for i in (4, 11, 12)])  # 4 written again
    cells = {**first, 4: b"new\x04", 11: b"new\x0b", 12: b"new\x0c"}
    for asked in ([*range(10)][:4], list(range(10)), [2, 3, 4, 5], [9, 0, 5, 1],
                  [11, 12, 7, 8, 4, 20, 3], [], [20, 21]):
        sizes, data = unit.read_column("c", asked)
        assert sizes.tolist() == [len(cells[i]) if i in cells else -1 for i in asked]
        assert bytes(data) == b"".join(cells.get(i, b"") for i in asked)
    sizes, data = unit.read_column("other", [1, 2])
    assert sizes.tolist() == [-1, -1] and bytes(data) == b""


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
