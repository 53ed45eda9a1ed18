"""Redis storage unit: one redis-server per unit, batched MSET/MGET.

Cells are sent without copies: redis-py's pure-Python command packer passes
memoryviews to the socket as they are (its hiredis packer would join them into
one buffer first, several times slower for large rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import socket

import redis
from redis.connection import Connection, PythonRespSerializer, SSLConnection

from ...infra import tls

_IOV_MAX = 1024  # Linux's limit of buffers per sendmsg

from .base import Buffer, StorageUnit, cell_key, register_backend


def _sendmsg_all(sock: socket.socket, chunks) -> None:
    """Send every chunk with scatter-gather writes: one syscall for many buffers."""
    views = [c if isinstance(c, memoryview) else memoryview(c) for c in chunks]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + _IOV_MAX])
        while i < len(views) and sent >= views[i].nbytes:
            sent -= views[i].nbytes
            i += 1
        if sent:
            views[i] = views[i][sent:]


class _ZeroCopyConnection(Connection):
    def _construct_command_packer(self, packer):
        return PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)

    def send_packed_command(self, command, check_health=True):
        # A batch of cells packs into 2 chunks per cell; sending them with one
        # sendmsg instead of a sendall each saves a syscall per chunk.
        if isinstance(command, str) or len(command) < 8:
            return super().send_packed_command(command, check_health)
        if not self._sock:
            self.connect_check_health(check_health=False)
        if check_health:
            self.check_health()
        try:
            _sendmsg_all(self._sock, command)
        except TimeoutError:
            self.disconnect()
            raise redis.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            self.disconnect()
            raise redis.ConnectionError(f"Error while writing to socket: {exc}") from None
        except BaseException:
            self.disconnect()
            raise


class _TlsConnection(SSLConnection):
    """rediss://: the pure-Python packer (no copy of a cell into one buffer); an SSL
    socket has no sendmsg, so its chunks go one by one."""

    def _construct_command_packer(self, packer):
        return PythonRespSerializer(self._buffer_cutoff, self.encoder.encode)


@register_backend("redis")
class RedisUnit(StorageUnit):
    backend = "redis"

    def __init__(self, address: str, job: str = "job", password: str | None = None,
                 ttl_seconds: int | None = None, username: str | None = None, **_):
        self.job = job
        self.ttl_seconds = ttl_seconds
        secure = tls.redis_client_kwargs(address)  # rediss://: the job's CA
        pool = redis.ConnectionPool.from_url(
            address, username=username, password=password,
            connection_class=_TlsConnection if address.startswith("rediss://")
            else _ZeroCopyConnection, socket_read_size=1 << 20, max_connections=64, **secure,
        )
        self.client = redis.Redis(connection_pool=pool)

    def _keys(self, indices: Sequence[int], columns: Sequence[str]) -> list[bytes]:
        return [cell_key(self.job, i, c) for i in indices for c in columns]

    def put(self, cells: Sequence[tuple[int, str, Buffer]]) -> None:
        if not cells:
            return
        flat: list = []
        for index, column, data in cells:
            flat.append(cell_key(self.job, index, column))
            flat.append(data if isinstance(data, (bytes, memoryview)) else memoryview(data))
        if self.ttl_seconds:
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("MSET", *flat)
            for key in flat[::2]:
                pipe.expire(key, self.ttl_seconds)
            pipe.execute()
        else:
            self.client.execute_command("MSET", *flat)

    def get(self, indices: Sequence[int], columns: Sequence[str]) -> list[list[Buffer | None]]:
        if not indices or not columns:
            return [[None] * len(columns) for _ in indices]
        values = self.client.execute_command("MGET", *self._keys(indices, columns))
        n = len(columns)
        return [values[r * n:(r + 1) * n] for r in range(len(indices))]

    def get_cells(self, keys: Sequence[tuple[int, str]]) -> list[Buffer | None]:
        if not keys:
            return []
        return self.client.execute_command("MGET", *(cell_key(self.job, i, c) for i, c in keys))

    def purge(self) -> int:
        """Delete every key of this job (cells, journal, marker); returns how many."""
        n = 0
        batch = []
        for key in self.client.scan_iter(match=f"{self.job}:*", count=4096):
            batch.append(key)
            if len(batch) >= 4096:
                n += self.client.unlink(*batch)
                batch = []
        if batch:
            n += self.client.unlink(*batch)
        return n

    def delete(self, cells: Sequence[tuple[int, Sequence[str]]]) -> None:
        keys = [cell_key(self.job, i, c) for i, cols in cells for c in cols]
        for start in range(0, len(keys), 4096):
            self.client.unlink(*keys[start:start + 4096])

    def close(self) -> None:
        self.client.close()

