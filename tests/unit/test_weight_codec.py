"""The gRPC weight path's codec: a chunk serialized around its data is the message
protobuf makes; a tensor's host copy does not follow the tensor; a received tensor
is assembled in place, and a stream that gives it too many or too few bytes fails."""

from __future__ import annotations

import pytest
import torch

from rljob.weights.codec import TensorAssembly, chunk_bytes, host_bytes, split_chunk
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
