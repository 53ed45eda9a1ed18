"""The controller's storage units: their URLs (never with credentials), opening
them, waiting until they answer, what clients are told about them, and deleting
the cells of cleared partitions in the background (`CellSweeper`).

Memory units live in the controller's process (clients reach them through its
StorageService); Redis units are redis-servers the controller and the clients
connect to.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..contract import PASSWORD_ENV, REDIS_USER_ENV
from .proto import transferqueue_pb2 as pb
from .state import Cleared
from .storage.base import StorageUnit, connect
from .storage.memory import MemoryUnit

log = logging.getLogger("rljob.transferqueue")


class StorageError(RuntimeError):
    """Storage cannot be used (unreachable, refused credentials): one clear line."""


def check_unit_url(url: str) -> str:
    """A Redis URL without credentials (they come from `PASSWORD_ENV`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise StorageError(f"storage unit URL {url!r}: use redis://HOST:PORT/DB")
    if parts.password is not None or parts.username:
        raise StorageError("storage unit URL carries credentials: give the password in "
                           f"{PASSWORD_ENV} instead (a URL shows in ps, logs and Layout)")
    return url


def redis_user() -> str | None:
    """The Redis ACL user this process's units are opened as (None: the default user)."""
    return os.environ.get(REDIS_USER_ENV) or None


@dataclass
class UnitConfig:
    backend: str  # memory | redis
    address: str = ""  # redis URL (without password) for redis units
    password: str | None = None
    username: str | None = None  # the ACL user (None: Redis's default user)


def open_units(configs: Sequence[UnitConfig], job: str, max_row_bytes: int) -> list[StorageUnit]:
    """The units of `configs`: memory units made here, the others connected to."""
    units: list[StorageUnit] = []
    for u in configs:
        if u.backend == "memory":
            units.append(MemoryUnit(max_cell_bytes=max_row_bytes))
        else:
            units.append(connect(u.backend, check_unit_url(u.address), job=job,
                                 password=u.password, username=u.username))
    return units


def unit_infos(configs: Sequence[UnitConfig]) -> list[pb.StorageUnitInfo]:
    out = []
    for i, u in enumerate(configs):
        # memory units are served by this process: clients use the controller's address
        address = check_unit_url(u.address) if u.backend != "memory" else ""
        out.append(pb.StorageUnitInfo(id=i, backend=u.backend, address=address))
    return out


def wait_for_units(units: Sequence[StorageUnit], storage_wait: float) -> None:
    """Until every Redis unit answers (at most `storage_wait` seconds); a refused
    password is a `StorageError` at once."""
    import redis

    deadline = time.monotonic() + storage_wait
    for i, unit in enumerate(units):
        while True:
            try:
                unit.client.ping()
                break
            except redis.AuthenticationError as exc:
                raise StorageError(
                    f"storage unit {i} refused the credentials ({exc}): set {PASSWORD_ENV} "
                    f"to the Redis password and {REDIS_USER_ENV} to its ACL user (unset: "
                    "the default user; on a cluster both come from the job's pod spec)"
                ) from None
            except redis.ResponseError as exc:
                if "without any password" in str(exc) or "NOAUTH" in str(exc):
                    raise StorageError(f"storage unit {i}: {exc}; check {PASSWORD_ENV}") \
                        from None
                raise
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                # refused, or a timeout: a recreated unit's pod has a new address and
                # its DNS name may still point at the old one for a while
                if time.monotonic() > deadline:
                    raise StorageError(f"storage unit {i} is unreachable after "
                                       f"{storage_wait:.0f}s: {exc}") from None
                log.warning("storage unit %d unreachable (%s); waiting", i, exc)
                time.sleep(0.5)


class CellSweeper:
    """Deletes the cells of cleared partitions: acks return at once, and a background
    task (`run`) deletes what piled up in one worker-thread call."""

    def __init__(self, units: Sequence[StorageUnit]):
        self.units = units
        self.pending: list[Cleared] = []
        self._wanted = asyncio.Event()

    def queue(self, cleared: list[Cleared]) -> None:
        if cleared:
            self.pending.extend(cleared)
            self._wanted.set()

    async def run(self, linger: float = 0.02) -> None:
        while True:
            await self._wanted.wait()
            await asyncio.sleep(linger)  # let a few acks pile up
            self._wanted.clear()
            batch, self.pending = self.pending, []
            await asyncio.get_running_loop().run_in_executor(None, self.delete, batch)

    def delete(self, cleared: list[Cleared]) -> None:
        for c in cleared:
            by_unit: dict[int, list[tuple[int, tuple[str, ...]]]] = {}
            for unit, index, columns in c.cells:
                by_unit.setdefault(unit, []).append((index, columns))
            try:
                for unit, cells in by_unit.items():
                    self.units[unit].delete(cells)
            except Exception:  # storage down: the cells stay, the job goes on
                log.exception("could not delete the cells of partition %d", c.partition)
                continue
            if c.partition >= 0:
                log.info("cleared partition %d (%d rows)", c.partition, len(c.cells))
