"""The gRPC weight path's codec: a chunk serialized around its data is the message
protobuf makes; a tensor's host copy does not follow the tensor; a received tensor
is assembled in place, and a stream that gives it too many or too few bytes fails."""

from __future__ import annotations

import pytest
import torch

from rljob.weights.codec import (BUNDLE, CHUNK, SMALL, TensorAssembly, chunk_bytes,
                                 host_bytes, split_chunk, version_messages)
from rljob.weights.proto import weights_pb2 as pb


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 70_000])
def test_a_chunk_serialized_around_its_data_is_protobufs_message(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    header = pb.WeightChunk(version=3, epoch=9, name="w", dtype="bfloat16", shape=[2, 3],
                            nbytes=size)
    got = pb.WeightChunk.FromString(chunk_bytes(header, memoryview(data)))
    want = pb.WeightChunk(version=3, epoch=9, name="w", dtype="bfloat16", shape=[2, 3],
                          nbytes=size, data=data)
    assert got == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_tensor_goes_through_its_host_copy_and_an_assembly_bit_exact(dtype):
    t = (torch.randn(5, 7) * 100).to(dtype)[:, 1:6]  # not contiguous
    name, data = host_bytes(t)
    t_before = t.clone()
    t.zero_()  # the copy is the version's: the trainer's next step changes the tensor
    tensor = TensorAssembly(name, [5, 5], len(data))
    for off in range(0, len(data), 16):  # in chunks
        tensor.add(bytes(data[off:off + 16]))
    got = tensor.tensor()
    assert got.dtype == dtype and torch.equal(got, t_before)


def test_an_assembly_refuses_too_many_and_too_few_bytes_and_unknown_dtypes():
    tensor = TensorAssembly("float32", [2], 8)
    with pytest.raises(ValueError, match="more than the 8 bytes"):
        tensor.add(bytes(12))
    tensor.add(bytes(4))
    with pytest.raises(ValueError, match="ended after 4"):
        tensor.tensor()
    with pytest.raises(ValueError, match="unknown dtype 'load'"):
        TensorAssembly("load", [0], 0).tensor()
    assert TensorAssembly("float32", [0, 4], 0).tensor().shape == (0, 4)


@pytest.mark.parametrize("size", [0, 1, 200, 70_000])
def test_a_chunk_is_split_into_its_message_and_a_view_of_its_data(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    header = pb.WeightChunk(version=3, epoch=9, name="w", shape=[size], nbytes=size)
    raw = chunk_bytes(header, data)
    got, view = split_chunk(raw)
    assert got == header and bytes(view) == data
    assert isinstance(view, memoryview) and view.obj is raw  # not copied
    # protobuf's own encoding (data last, or a message made elsewhere) is read too
    whole = pb.WeightChunk(version=3, name="w", data=data)
    got, view = split_chunk(whole.SerializeToString())
    assert got.version == 3 and got.name == "w" and bytes(view) == data


def test_small_tensors_go_together_and_large_ones_in_chunks_all_in_order():
    """A version's messages (`version_messages`): small tensors whole, several to a
    message (at most about BUNDLE bytes), the first's data in place and the others
    along with it; a large tensor in CHUNK-byte pieces; read back, every tensor's
    bytes in the order they were given."""
    per_message = BUNDLE // SMALL  # small ones until BUNDLE bytes are held
    count = per_message + 3
    tensors = [(f"norm{k}", "float32", [SMALL // 4], bytes([k]) * SMALL)
               for k in range(count)]  # more than a message's worth, before a large one
    tensors += [("empty", "float32", [0], b""),
                ("big", "uint8", [CHUNK + 5], bytes(range(256)) * (CHUNK // 256) + b"12345"),
                ("last", "int64", [1], bytes(8))]
    raws = list(version_messages(7, 3, [(n, d, s, memoryview(b)) for n, d, s, b in tensors]))
    got, messages = [], []
    for raw in raws:
        chunk, data = split_chunk(raw)
        assert chunk.version == 7 and chunk.epoch == 3
        messages.append([chunk.name] + [a.name for a in chunk.along])
        if chunk.name:
            got.append([chunk.name, chunk.dtype, list(chunk.shape), bytes(data)])
        else:  # a large tensor's next piece
            got[-1][3] += bytes(data)
        got += [[a.name, a.dtype, list(a.shape), a.data] for a in chunk.along]
        assert all(a.nbytes == len(a.data) for a in chunk.along)
    assert [tuple(x) for x in got] == tensors
    assert messages == [[f"norm{k}" for k in range(per_message)],
                        [f"norm{k}" for k in range(per_message, count)] + ["empty"],
                        ["big"], [""], ["last"]]
