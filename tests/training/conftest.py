"""Fixtures of the training tier."""

from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture(scope="module")
def gloo():
    """A default process group of one gloo rank in this process (Megatron-core's
    parallel state needs one), made once and kept."""
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
