"""Small network helpers for local runs and benchmarks."""

from __future__ import annotations

import socket
from contextlib import closing


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
