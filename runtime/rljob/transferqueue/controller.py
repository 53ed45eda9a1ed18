"""The TransferQueue controller state machine (pure: no I/O, injectable clock).

One table per job: rows addressed by a global index, grouped in partitions
(one per training step), columns written independently by tasks. Every task
has its own view: a row is *ready* for a task when every column it consumes is
written and the task has neither acked it nor holds it under a lease.

Claims are leases. Unacked rows return to ready when the lease expires; acked
rows never come back to that task. A row is *done* when every consuming task
has acked it; a partition whose rows are all done is cleared, and the caller
deletes its cells from the storage units.

Every change is made by applying a record (a JSON-ready dict) that is also
appended to `self.journal`: the service persists the records before it answers,
and a restarted controller replays them (`replay`) into the same state.
`snapshot()` writes the live state as records, so a journal can be compacted.
Decisions (which rows a claim picks) are journaled as their effects, never
re-made on replay.

Writes by a task that holds a lease are fenced: the cells go under a key tagged
with the lease id and the notify is refused once that lease is gone, so a
worker that was paused past its lease can neither overwrite nor publish the
rows someone else has since produced.

The rows, leases and limits are in `state`; claims, acks, releases and lease
expiry in `leases` (`LeaseOps`, which the Controller takes on).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable

from .leases import LeaseOps
from .schema import ColumnSpec, TaskSpec, storage_column
from .state import (
    Cleared,
    Conflict,
    ControllerError,
    Exhausted,
    Limits,
    NotFound,
    Row,
    TaskState,
    check_lease_seconds,
    spec_from_record,
    spec_record,
)


class Controller(LeaseOps):
    def __init__(
        self,
        num_units: int = 1,
        lease_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        limits: Limits = Limits(),
    ):
        if num_units < 1:
            raise ControllerError("num_units must be at least 1")
        self.num_units = num_units
        self.lease_seconds = check_lease_seconds(lease_seconds)
        self.clock = clock
        self.limits = limits
        self.columns: dict[str, ColumnSpec] = {}
        self.tasks: dict[str, TaskState] = {}
        self.rows: dict[int, Row] = {}
        self.partitions: dict[int, set[int]] = {}
        self.partition_done: dict[int, int] = {}
        self.groups: dict[int, list[int]] = {}
        self.cleared_partitions = 0
        self.bytes_written = 0
        self.live_bytes = 0  # bytes of rows not cleared yet
        self.next_partition = 0  # one past the highest partition that ever had rows
        self._next_index = 0
        self._next_group = 0
        self._reserved: set[int] = set()  # indices handed to writers, rows not yet created
        self._relevance: dict[frozenset[str], frozenset[str]] = {}
        self._lease_seq = 0
        self._next_expiry = math.inf  # no lease ends before this (`expire` skips until then)
        self._cleared: list[Cleared] = []  # completed by discarding stale rows in a claim
        self.journal: list[dict] = []  # records applied since the service last drained it
        self.journaling = True

    # ---- records: every change goes through _do ---------------------------
    def _do(self, rec: dict):
        if self.journaling:
            self.journal.append(rec)
        return getattr(self, "_apply_" + rec["op"])(rec)

    def drain(self) -> list[dict]:
        out, self.journal = self.journal, []
        return out

    def replay(self, records: Iterable[dict]) -> list[Cleared]:
        """Apply journaled records (a restarted controller); returns what they cleared,
        whose cells may still be in storage if the last run stopped before deleting them."""
        cleared: list[Cleared] = []
        self.journaling = False
        try:
            for rec in records:
                out = getattr(self, "_apply_" + rec["op"])(rec)
                if isinstance(out, list):
                    cleared.extend(c for c in out if isinstance(c, Cleared))
        finally:
            self.journaling = True
        return cleared

    def renew_leases(self) -> None:
        """After a restart: every lease gets a full term, so its holder can reconnect."""
        deadline = self.clock() + self.lease_seconds
        for state in self.tasks.values():
            for lease in state.leases.values():
                lease.deadline = max(lease.deadline, deadline)

    def snapshot(self) -> list[dict]:
        """The live state as records: replaying them rebuilds it (journal compaction)."""
        recs: list[dict] = [{"op": "register", "tasks": [spec_record(s.spec)
                                                          for s in self.tasks.values()]}]
        recs.append({"op": "counters", "next_index": self._next_index,
                     "next_group": self._next_group, "lease_seq": self._lease_seq,
                     "cleared_partitions": self.cleared_partitions,
                     "bytes_written": self.bytes_written, "next_partition": self.next_partition,
                     "reserved": sorted(self._reserved),
                     "tasks": {n: [s.claimed, s.acked, s.expired, s.stale_discarded,
                                   s.stale_regenerated] for n, s in self.tasks.items()}})
        for p in sorted(self.partitions):
            groups = sorted({self.rows[i].group for i in self.partitions[p]})
            recs.append({"op": "rows", "partition": p,
                         "groups": [[g, self.groups[g]] for g in groups]})
        for idx in sorted(self.rows):
            r = self.rows[idx]
            recs.append({"op": "row", "index": idx, "written": sorted(r.written),
                         "length": r.length, "version": r.version, "nbytes": r.nbytes,
                         "acked": sorted(r.acked), "tags": r.tags, "issued": r.issued,
                         "initial": None if r.relevant is None else sorted(r.initial)})
        for name, state in self.tasks.items():
            for lease in state.leases.values():
                recs.append({"op": "lease", "task": name, "lease": lease.id,
                             "rows": sorted(lease.rows), "consumer": lease.consumer,
                             "deadline": lease.deadline, "counted": False,
                             "revoked": sorted(lease.revoked)})
        return recs

    # ---- registration -------------------------------------------------
    def register(self, specs: Iterable[TaskSpec]) -> None:
        specs = list(specs)
        new_columns: dict[str, ColumnSpec] = {}
        for spec in specs:
            if not spec.name or ":" in spec.name:
                raise ControllerError(f"task name {spec.name!r} must be non-empty and without ':'")
            for col in spec.produces:
                col.check()
                known = self.columns.get(col.name) or new_columns.get(col.name)
                if known and known != col:
                    raise Conflict(f"column {col.name!r} is already declared as {known.describe()}, "
                                   f"task {spec.name!r} declares {col.describe()}")
                new_columns[col.name] = col
        for spec in specs:
            old = self.tasks.get(spec.name)
            if old and old.spec != spec:
                raise Conflict(f"task {spec.name!r} is already registered with other columns")
            unknown = spec.consumes - set(self.columns) - set(new_columns)
            if unknown:
                raise NotFound(f"task {spec.name!r} consumes undeclared column(s) "
                               f"{sorted(unknown)}: register the task that produces them first "
                               "(or in the same call)")
        if all(s.name in self.tasks for s in specs):
            return  # already registered: nothing to journal
        self._do({"op": "register", "tasks": [spec_record(s) for s in specs]})

    def _apply_register(self, rec: dict) -> None:
        specs = [spec_from_record(d) for d in rec["tasks"]]
        for spec in specs:
            for col in spec.produces:
                self.columns[col.name] = col
        added = False
        for spec in specs:
            if spec.name in self.tasks:
                continue
            added = True
            state = TaskState(spec)
            self.tasks[spec.name] = state
            self._refresh_rows(self.rows.values(), state)
        if added:
            self._relevance.clear()
            for row in self.rows.values():
                if row.relevant is not None:
                    row.relevant = self._relevant_tasks(row.initial)

    def _apply_counters(self, rec: dict) -> None:
        self._next_index = rec["next_index"]
        self._next_group = rec["next_group"]
        self._lease_seq = rec["lease_seq"]
        self.cleared_partitions = rec["cleared_partitions"]
        self.bytes_written = rec["bytes_written"]
        self.next_partition = rec["next_partition"]
        self._reserved = set(rec["reserved"])
        for name, (cl, ac, ex, sd, sr) in rec["tasks"].items():
            s = self.tasks[name]
            s.claimed, s.acked, s.expired, s.stale_discarded, s.stale_regenerated = \
                cl, ac, ex, sd, sr

    def _apply_row(self, rec: dict) -> None:
        """A row's whole state (snapshots)."""
        row = self.rows[rec["index"]]
        row.written = set(rec["written"])
        row.length, row.version, row.nbytes = rec["length"], rec["version"], rec["nbytes"]
        self.live_bytes += row.nbytes
        row.acked = set(rec["acked"])
        row.tags, row.issued = dict(rec["tags"]), dict(rec["issued"])
        if rec["initial"] is not None:
            row.initial = frozenset(rec["initial"])
            row.relevant = self._relevant_tasks(row.initial)
            if row.relevant <= row.acked:
                self.partition_done[row.partition] += 1
        for state in self.tasks.values():
            self._refresh(row, state)

    def _relevant_tasks(self, initial: frozenset[str]) -> frozenset[str]:
        """Consuming tasks reachable from a row's first columns through the task graph.

        A row is done when these have all acked it: tasks of an unrelated flow
        sharing the controller (other columns) never hold its partition back.
        """
        cached = self._relevance.get(initial)
        if cached is not None:
            return cached
        columns = set(initial)
        relevant: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, state in self.tasks.items():
                if name not in relevant and state.spec.consumes and state.spec.consumes <= columns:
                    relevant.add(name)
                    columns |= {c.name for c in state.spec.produces}
                    changed = True
        out = frozenset(relevant)
        self._relevance[initial] = out
        return out

    def _task(self, name: str) -> TaskState:
        try:
            return self.tasks[name]
        except KeyError:
            raise NotFound(f"unknown task {name!r}: register it first "
                           f"(known: {sorted(self.tasks)})") from None

    # ---- rows -----------------------------------------------------------
    def _check_count(self, what: str, count: int) -> None:
        if count < 1:
            raise ControllerError(f"{what} must be at least 1, got {count}")
        if count > self.limits.rows_per_call:
            raise Exhausted(f"{what} {count} is over the limit of {self.limits.rows_per_call} "
                            "rows per call: split the request")

    def _check_room(self, count: int) -> None:
        held = len(self.rows) + len(self._reserved)
        if held + count > self.limits.table_rows:
            raise Exhausted(f"the table holds {held} rows (alive or reserved); {count} more would "
                            f"pass its limit of {self.limits.table_rows}: consume rows first")

    def _check_bytes(self) -> None:
        if self.live_bytes >= self.limits.unconsumed_bytes:
            raise Exhausted(f"{self.live_bytes} bytes of rows are not consumed yet (limit "
                            f"{self.limits.unconsumed_bytes}): new rows wait until tasks catch up")

    def _check_partition(self, partition: int) -> None:
        if partition < 0:
            raise ControllerError(f"partition must be >= 0, got {partition}")

    def allocate(self, partition: int, count: int, group_size: int = 1) -> list[Row]:
        self._check_count("count", count)
        self._check_partition(partition)
        group_size = max(group_size, 1)
        if count % group_size:
            raise ControllerError(f"count {count} is not a multiple of group_size {group_size}")
        self._check_room(count)
        start = self._next_index
        self._do({"op": "rows", "partition": partition, "groups": [
            [self._next_group + g, list(range(start + g * group_size,
                                              start + (g + 1) * group_size))]
            for g in range(count // group_size)]})
        return [self.rows[i] for i in range(start, start + count)]

    def reserve(self, count: int) -> int:
        """Hand a writer `count` fresh indices (first one returned); rows come with notify."""
        self._check_count("count", count)
        self._check_room(count)
        start = self._next_index
        self._do({"op": "reserve", "start": start, "count": count})
        return start

    def _apply_reserve(self, rec: dict) -> None:
        start, count = rec["start"], rec["count"]
        self._next_index = max(self._next_index, start + count)
        self._reserved.update(range(start, start + count))

    def _apply_rows(self, rec: dict) -> None:
        partition = rec["partition"]
        k, rows = self.num_units, self.rows
        for gid, members in rec["groups"]:
            self._next_group = max(self._next_group, gid + 1)
            if members:  # a group's members at once (a put makes hundreds of rows)
                self._reserved.difference_update(members)
                self._next_index = max(self._next_index, max(members) + 1)
                self.partitions.setdefault(partition, set()).update(members)
                for idx in members:
                    rows[idx] = Row(idx, partition, gid, idx % k)
            self.groups[gid] = list(members)
        self.partition_done.setdefault(partition, 0)
        self.next_partition = max(self.next_partition, partition + 1)

    def notify_written(
        self,
        indices: list[int],
        columns: list[str],
        lengths: list[int] | None = None,
        versions: list[int] | None = None,
        nbytes: list[int] | None = None,
        create: bool = False,
        partition: int = 0,
        group_size: int = 1,
        task: str = "",
        lease: str = "",
    ) -> int:
        """Record that `columns` of `indices` are in storage; returns rows newly ready.

        With `create`, the indices must be reserved (see `reserve`) and become
        new rows of `partition` first. With `lease` (of `task`), the write is
        fenced: refused unless that lease still holds every row, and the cells
        are read back under the lease's tag.
        """
        self._check_count("rows", len(indices))
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise NotFound(f"unknown column(s) {unknown}: declare them in a task's produces")
        if create:
            self._check_partition(partition)
            bad = ([] if self._reserved.issuperset(indices)
                   else [i for i in indices if i not in self._reserved])
            if bad or len(set(indices)) != len(indices):
                raise Conflict(f"indices {bad[:5] or indices[:5]} are not reserved for new rows "
                               "(reserve them first; each index creates one row once)")
            if len(indices) % max(group_size, 1):
                raise ControllerError(f"{len(indices)} rows are not a multiple of group_size {group_size}")
            if lease:
                raise ControllerError("a write that creates rows holds no lease")
            self._check_bytes()
        else:
            missing = ([] if all(map(self.rows.__contains__, indices))
                       else [i for i in indices if i not in self.rows])
            gone = [i for i in missing if self.cleared(i)]
            if gone:  # a late writer (its rows were made elsewhere and trained)
                raise NotFound(f"rows {gone[:5]} are no longer in the table (consumed and "
                               "cleared, or discarded): the write is refused")
            if missing:
                raise NotFound(f"unknown row index(es) {missing[:5]}: allocate rows before "
                               "writing (or the partition was already cleared)")
        if lease:
            held = self._lease(task, lease)
            outside = ([] if held.rows.issuperset(indices)
                       else [i for i in indices if i not in held.rows])
            if outside:
                raise Conflict(f"rows {outside[:5]} are not in lease {lease!r}")
            foreign = set(columns) - {c.name for c in self.tasks[task].spec.produces}
            if foreign:
                raise ControllerError(f"task {task!r} does not produce column(s) {sorted(foreign)}")
        for name, values in (("lengths", lengths), ("versions", versions), ("nbytes", nbytes)):
            if values and len(values) != len(indices):
                raise ControllerError(f"{name} has {len(values)} entries for {len(indices)} rows")
        if create:
            g = max(group_size, 1)
            self._do({"op": "rows", "partition": partition, "groups": [
                [self._next_group + k, list(indices[k * g:(k + 1) * g])]
                for k in range(len(indices) // g)]})
        before = sum(t.n_ready for t in self.tasks.values())
        self._do({"op": "written", "indices": list(indices), "columns": list(columns),
                  "lengths": list(lengths or []), "versions": list(versions or []),
                  "nbytes": list(nbytes or []), "tag": lease})
        return sum(t.n_ready for t in self.tasks.values()) - before

    def _apply_written(self, rec: dict) -> None:
        columns, lengths, versions, nbytes = (rec["columns"], rec["lengths"], rec["versions"],
                                              rec["nbytes"])
        tag = rec["tag"]
        first = frozenset(columns)
        # written columns make a row ready only for the tasks that consume one of them
        # (for the others nothing it is missing came)
        touched = [s for s in self.tasks.values() if s.spec.consumes & first]
        # rows whose tags were equal are equal after this write: they share one dict
        # (never changed in place), which a claim's answer sends once (`tag_sets`)
        retagged: dict[int | None, tuple[dict, dict]] = {}
        rows = [self.rows[idx] for idx in rec["indices"]]
        relevant = self._relevant_tasks(first)
        for row in rows:
            if row.relevant is None:
                row.initial = first
                row.relevant = relevant
            row.written.update(columns)
            if tag or row.tags:
                key = id(row.tags) if row.tags else None
                if key not in retagged:
                    tags = dict(row.tags)
                    for c in columns:
                        if tag:
                            tags[c] = tag
                        else:
                            tags.pop(c, None)
                    retagged[key] = (row.tags, tags)  # holding the old dict: no reuse of its id
                row.tags = retagged[key][1]
        if lengths:
            for row, n in zip(rows, map(int, lengths)):
                row.length = n
        if versions:
            for row, v in zip(rows, map(int, versions)):
                row.version = v
        if nbytes:
            sizes = list(map(int, nbytes))
            for row, n in zip(rows, sizes):
                row.nbytes += n
            self.bytes_written += sum(sizes)
            self.live_bytes += sum(sizes)
        for state in touched:
            self._refresh_rows(rows, state)

    def _refresh_rows(self, rows: Iterable[Row], state: TaskState) -> None:
        """Put each row in `state`'s ready set, or take it out, as it is now ready for
        the task or not (in one pass: a write, lease or return changes hundreds of
        rows at once)."""
        consumes = state.spec.consumes
        if not consumes:  # a source task: no row is ever ready for it
            return
        name, ready_of, group_ready = state.spec.name, state.ready, state.group_ready
        added = removed = 0
        for row in rows:
            p = row.partition
            ready = ready_of.get(p)
            if consumes <= row.written and name not in row.acked and name not in row.leased:
                if ready is None:
                    ready = ready_of[p] = {}
                    bisect.insort(state.ready_parts, p)
                elif row.index in ready:
                    continue
                ready[row.index] = None
                added += 1
                group_ready[row.group] = group_ready.get(row.group, 0) + 1
            elif ready is not None and row.index in ready:
                del ready[row.index]
                removed += 1
                group_ready[row.group] -= 1
                if not ready:
                    del ready_of[p]
                    del state.ready_parts[bisect.bisect_left(state.ready_parts, p)]
        state.n_ready += added - removed
        state.arrivals += added

    def _refresh(self, row: Row, state: TaskState) -> None:
        self._refresh_rows((row,), state)

    # ---- cells ----------------------------------------------------------
    def writable(self, index: int) -> bool:
        """Whether cells of `index` may be stored: a row, or an index reserved for one."""
        return index in self.rows or index in self._reserved

    def cleared(self, index: int) -> bool:
        """Whether `index` was a row once and is gone (consumed and cleared, or discarded)."""
        return 0 <= index < self._next_index and not self.writable(index)

    def refused_cells(self, indices: list[int], columns: list[str], tag: str, create: bool
                      ) -> Cleared | None:
        """Cells a refused write may have left in storage, if no accepted write owns them."""
        cells = []
        for idx in indices:
            row = self.rows.get(idx)
            if row is not None and not tag and not create:
                continue  # untagged cells of a live row: an accepted write may own them
            if create and (row is not None or idx in self._reserved):
                continue  # still the writer's: it may notify again
            names = tuple(storage_column(c, tag) for c in columns
                          if row is None or row.tags.get(c) != tag)
            if names:
                cells.append((idx % self.num_units, idx, names))
        return Cleared(-1, cells) if cells else None

    # ---- stats ------------------------------------------------------------
    def consumer_stats(self) -> list[dict]:
        """Rows each named consumer holds under lease, per task."""
        held: dict[tuple[str, str], int] = {}
        for name, s in self.tasks.items():
            for lease in s.leases.values():
                if lease.consumer and lease.rows:
                    key = (name, lease.consumer)
                    held[key] = held.get(key, 0) + len(lease.rows)
        return [{"task": t, "consumer": c, "claimed": n} for (t, c), n in sorted(held.items())]

    def task_stats(self, window: float = 10.0) -> list[dict]:
        now = self.clock()
        out = []
        for name, s in self.tasks.items():
            recent = sum(1 for t in s.ack_times if now - t <= window)
            out.append({
                "name": name,
                "ready": s.ready_count(),
                "claimed": sum(len(le.rows) for le in s.leases.values()),
                "acked": s.acked,
                "expired": s.expired,
                "stale_discarded": s.stale_discarded,
                "stale_regenerated": s.stale_regenerated,
                "acked_per_second": recent / window,
            })
        return out
