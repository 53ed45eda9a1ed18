"""The controller's journal: its records, kept in Redis beside the data.

With Redis storage units the table outlives the controller: unit 0 holds the
journal (`JOB:journal`, a list of JSON records appended before each answer) and
a compacted snapshot (`JOB:snapshot`); every unit holds the table's id
(`JOB:table`). A restarted controller finds the same id on every unit, replays
snapshot + journal and carries on. A unit without the id came back empty (a
restarted Redis without persistence): the table's cells are gone, so the
controller deletes what is left and starts a new table with a new id, and the
job restarts from its last checkpoint.

Only one controller writes the journal. On a cluster a replacement controller
pod starts while the one it replaces is still draining, so each controller takes
a fencing token when it opens the table (`JOB:owner`, incremented) and every write
checks it atomically: a controller that has been replaced gets `Fenced` on its
next write and stops before answering anyone, and the replacement's replay holds
every record that was accepted before it took over.

Memory units live in the controller's process: nothing outlives it, and no
journal is kept.

A journal that cannot be written, or a unit that came back empty while the
controller runs, stops the controller (`stop_storage_lost`, fail-stop: no answer
is ever given for a change that would be lost); a restart recovers the table
(`recover`) or starts a new one.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from typing import NoReturn

import redis

from .controller import Controller
from .state import Cleared
from .storage.redis_unit import RedisUnit

log = logging.getLogger("rljob.transferqueue")
EXIT_STORAGE_LOST = 3  # the controller's exit status when its journal or a unit is gone


# RPUSH KEYS[2] ARGV[2..] only while KEYS[1] (the owner) still holds ARGV[1]
_FENCED_RPUSH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED another controller owns this table')
end
return redis.call('RPUSH', KEYS[2], unpack(ARGV, 2))
"""
_CHUNK = 1000  # records per script call (Lua's unpack has a limit)


class Fenced(RuntimeError):
    """Another controller opened the table after this one: this one must stop."""


class RedisJournal:
    def __init__(self, units: Sequence[RedisUnit], job: str):
        self.units = list(units)
        self.job = job
        self.client = self.units[0].client
        self.journal_key = f"{job}:journal"
        self.snapshot_key = f"{job}:snapshot"
        self.table_key = f"{job}:table"
        self.owner_key = f"{job}:owner"
        self.length = 0  # records appended since the last snapshot
        self.table_id = ""
        self.token = ""
        self._rpush = self.client.register_script(_FENCED_RPUSH)

    # ---- start-up -------------------------------------------------------
    def open(self) -> tuple[list[dict], str]:
        """(records to replay, how the table was found: recovered | new | lost).
        Takes the table over first: a controller that had it can no longer write."""
        self.token = str(self.client.incr(self.owner_key))
        ids = [u.client.get(self.table_key) for u in self.units]
        found = {i for i in ids if i is not None}
        if len(found) == 1 and None not in ids:
            self.table_id = found.pop().decode()
            snapshot = self.client.lrange(self.snapshot_key, 0, -1)
            journal = self.client.lrange(self.journal_key, 0, -1)
            self.length = len(journal)
            return [json.loads(r) for r in (*snapshot, *journal)], "recovered"
        how = "lost" if found else "new"
        for u in self.units:  # cells of a lost table (or of a finished one): nobody reads them
            u.purge()
        self.client.set(self.owner_key, self.token)  # the purge took the owner key too
        self.table_id = uuid.uuid4().hex
        for u in self.units:
            u.client.set(self.table_key, self.table_id)
        return [], how

    # ---- running --------------------------------------------------------
    def append(self, records: list[dict]) -> None:
        lines = [json.dumps(r, separators=(",", ":")) for r in records]
        for start in range(0, len(lines), _CHUNK):
            try:
                self._rpush(keys=[self.owner_key, self.journal_key],
                            args=[self.token, *lines[start:start + _CHUNK]])
            except redis.ResponseError as exc:
                if "FENCED" in str(exc):
                    raise Fenced(str(exc)) from None
                raise
        self.length += len(records)

    def compact(self, snapshot: list[dict]) -> None:
        """Replace snapshot + journal by `snapshot` in one transaction (none if another
        controller took the table over meanwhile)."""
        tmp = f"{self.snapshot_key}.new"
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self.owner_key)
                if (pipe.get(self.owner_key) or b"").decode() != self.token:
                    raise Fenced("another controller owns this table")
                pipe.multi()
                pipe.delete(tmp)
                for start in range(0, len(snapshot), 4096):
                    pipe.rpush(tmp, *(json.dumps(r, separators=(",", ":"))
                                      for r in snapshot[start:start + 4096]))
                pipe.delete(self.journal_key)
                if snapshot:
                    pipe.rename(tmp, self.snapshot_key)
                else:
                    pipe.delete(self.snapshot_key)
                pipe.execute()
            except redis.WatchError:
                raise Fenced("another controller took this table over") from None
        self.length = 0

    def lost_units(self) -> list[int]:
        """Units that no longer hold the table's id (they restarted empty)."""
        lost = []
        for i, u in enumerate(self.units):
            try:
                if u.client.get(self.table_key) != self.table_id.encode():
                    lost.append(i)
            except (redis.ConnectionError, redis.TimeoutError):
                pass  # down right now: judged when it is back
        return lost


def stop_storage_lost(message: str, *args) -> NoReturn:
    """Log why, and stop the process at once (fail-stop)."""
    log.critical(message, *args)
    logging.shutdown()
    os._exit(EXIT_STORAGE_LOST)


def recover(controller: Controller, journal: RedisJournal) -> tuple[str, list[Cleared]]:
    """Open the table and replay its records into `controller`: (how the table was
    found, the partitions the records cleared, whose cells a crash may have left)."""
    records, how = journal.open()
    cleared: list[Cleared] = []
    if records:
        t0 = time.monotonic()
        cleared = controller.replay(records)
        controller.renew_leases()
        log.warning("recovered the table from its journal: %d records, %d rows, %d leases "
                    "in %.2fs", len(records), len(controller.rows),
                    sum(len(s.leases) for s in controller.tasks.values()),
                    time.monotonic() - t0)
    elif how == "lost":
        log.error("a storage unit came back empty: the table is lost; a new one starts "
                  "(the job continues from its last checkpoint)")
    return how, cleared


def journal_changes(controller: Controller, journal: RedisJournal | None, compact_every: int) -> None:
    """Journal what the controller changed (compacting a long journal); without a
    journal, forget it."""
    records = controller.drain()
    if not records or journal is None:
        return
    try:
        journal.append(records)
        if journal.length >= max(compact_every, 4 * len(controller.rows)):
            journal.compact(controller.snapshot())
    except Exception as exc:  # noqa: BLE001 - fail-stop: never answer past a lost change
        if isinstance(exc, Fenced):
            stop_storage_lost("a newer controller took the table over: stopping without "
                              "answering (this one was replaced)")
        stop_storage_lost("cannot write the journal (%s): stopping; a restart recovers "
                          "the table from what was journaled", exc)
