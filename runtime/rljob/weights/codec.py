"""What a weight version is on the gRPC path: tensors as raw buffers in chunks
(no pickling), the channel options, and a sender life's epoch id."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

CHUNK = 4 << 20
OPTIONS = [("grpc.max_send_message_length", 64 << 20),
           ("grpc.max_receive_message_length", 64 << 20),
           ("grpc.initial_reconnect_backoff_ms", 100),
           ("grpc.max_reconnect_backoff_ms", 1000)]


def to_bytes(t: torch.Tensor) -> tuple[str, bytes]:
    import torch

    t = t.detach().cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        return dtype, t.view(torch.int16).numpy().tobytes()
    return dtype, t.numpy().tobytes()


def from_bytes(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(np.frombuffer(data, np.int16).copy()).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.frombuffer(data, np.dtype(dtype)).copy()).reshape(shape)


def new_epoch() -> int:
    """A fresh sender life's id (positive, fits an int64)."""
    return secrets.randbits(62) + 1
