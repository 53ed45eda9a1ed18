"""What a weight version is on the gRPC path: tensors as raw buffers in chunks
(no pickling), each byte copied as few times as it can be (host copy, message,
place in the received tensor), the channel options, and a sender life's epoch id."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from .proto import weights_pb2 as pb

if TYPE_CHECKING:
    import torch

CHUNK = 4 << 20
# a tensor of at most SMALL bytes goes in one message with the small ones after it
# (`WeightChunk.along`), up to BUNDLE bytes a message: a model's norms and biases
# are hundreds of tensors of a few KB, and each message is a send's round trip
SMALL, BUNDLE = 64 << 10, 1 << 20
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


def version_messages(version: int, epoch: int, tensors) -> Iterator[bytes]:
    """A version's tensors, (name, dtype, shape, bytes) in order, as the serialized
    WeightChunks of a Fetch: a large tensor in CHUNK-byte pieces, its name on the
    first; small ones together, each whole, the first's data in place
    (`chunk_bytes`), the others along with it."""
    small: list[tuple[str, str, list[int], memoryview]] = []
    held = 0

    def together() -> bytes:
        (name, dtype, shape, data), *others = small
        small.clear()
        return chunk_bytes(pb.WeightChunk(
            version=version, epoch=epoch, name=name, dtype=dtype, shape=shape, nbytes=len(data),
            along=[pb.WeightChunk(name=n, dtype=d, shape=s, nbytes=len(b), data=bytes(b))
                   for n, d, s, b in others]), data)

    rest = pb.WeightChunk(version=version, epoch=epoch)
    for name, dtype, shape, data in tensors:
        if len(data) <= SMALL:
            small.append((name, dtype, shape, data))
            held += len(data)
            if held >= BUNDLE:
                yield together()
                held = 0
            continue
        if small:  # the tensors go in order
            yield together()
            held = 0
        for off in range(0, len(data), CHUNK):
            header = rest if off else pb.WeightChunk(
                version=version, epoch=epoch, name=name, dtype=dtype, shape=shape,
                nbytes=len(data))
            yield chunk_bytes(header, data[off:off + CHUNK])
    if small:
        yield together()


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
