"""What a weight version is on the gRPC path: tensors as raw buffers in chunks
(no pickling), each byte copied as few times as it can be (host copy, message,
place in the received tensor), the channel options, and a sender life's epoch id."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import numpy as np

from .proto import weights_pb2 as pb

if TYPE_CHECKING:
    import torch

CHUNK = 4 << 20
OPTIONS = [("grpc.max_send_message_length", 64 << 20),
           ("grpc.max_receive_message_length", 64 << 20),
           ("grpc.initial_reconnect_backoff_ms", 100),
           ("grpc.max_reconnect_backoff_ms", 1000)]


def host_bytes(t: torch.Tensor) -> tuple[str, memoryview]:
    """A tensor's dtype name and the bytes of its host copy: one copy, from any device,
    contiguous (the tensor may change once this returns; the copy does not)."""
    import torch

    host = torch.empty(t.shape, dtype=t.dtype)
    host.copy_(t.detach())
    return str(t.dtype).removeprefix("torch."), host.reshape(-1).view(torch.uint8).numpy().data


class TensorAssembly:
    """One tensor received in chunks: each chunk's bytes copied once into place."""

    def __init__(self, dtype: str, shape: list[int], nbytes: int):
        self.dtype, self.shape = dtype, shape
        self.buf = np.empty(nbytes, np.uint8)
        self.at = 0

    def add(self, data) -> None:
        end = self.at + len(data)
        if end > len(self.buf):
            raise ValueError(f"more than the {len(self.buf)} bytes announced for a tensor")
        self.buf[self.at:end] = np.frombuffer(data, np.uint8)
        self.at = end

    def tensor(self) -> torch.Tensor:
        import torch

        if self.at != len(self.buf):
            raise ValueError(f"a tensor of {len(self.buf)} bytes ended after {self.at}")
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a tensor of an unknown dtype {self.dtype!r}")
        if not len(self.buf):
            return torch.empty(self.shape, dtype=dtype)
        return torch.from_numpy(self.buf).view(dtype).reshape(self.shape)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# the key of WeightChunk.data (length-delimited: wire type 2)
_DATA_KEY = _varint(pb.WeightChunk.DESCRIPTOR.fields_by_name["data"].number << 3 | 2)


def chunk_bytes(header: pb.WeightChunk, data) -> bytes:
    """`header` with `data` (any buffer) as its `data` field, serialized: protobuf's
    encoding of the message, `data` first (a message's fields may come in any order),
    copied once, straight into the result."""
    return b"".join((_DATA_KEY, _varint(len(data)), data, header.SerializeToString()))


def split_chunk(raw: bytes) -> tuple[pb.WeightChunk, memoryview]:
    """A serialized WeightChunk as (the message but its data, its data as a view of
    `raw`): `chunk_bytes`'s layout is read without copying the data; any other
    encoding of the message is parsed whole."""
    view = memoryview(raw)
    if raw.startswith(_DATA_KEY):
        size, shift, at = 0, 0, len(_DATA_KEY)
        while at < len(raw):
            byte = raw[at]
            size |= (byte & 0x7F) << shift
            at, shift = at + 1, shift + 7
            if not byte & 0x80:
                break
        end = at + size
        if end <= len(raw):
            header = pb.WeightChunk.FromString(view[end:])
            if not header.data:  # the data field came once: this is it
                return header, view[at:end]
    msg = pb.WeightChunk.FromString(raw)
    return msg, memoryview(msg.data)


def new_epoch() -> int:
    """A fresh sender life's id (positive, fits an int64)."""
    return secrets.randbits(62) + 1
