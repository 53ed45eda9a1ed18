"""The TransferQueue controller state machine (pure: no I/O, injectable clock).

One table per job: rows addressed by a global index, grouped in partitions
(one per training step), columns written independently by tasks. Every task
has its own view: a row is *ready* for a task when every column it consumes is
written and the task has neither acked it nor holds it under a lease.

Claims are leases. Unacked rows return to ready when the lease expires; acked
rows never come back to that task. A row is *done* when every consuming task
has acked it; a partition whose rows are all done is cleared, and the caller
deletes its cells from the storage units.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .samplers import balance_over_ranks
from .schema import ColumnSpec


POLICIES = ("fifo", "group", "token_balanced", "longest_first", "shortest_first")


class TQError(Exception):
    """A request the controller refuses; nothing was changed."""

    code = "invalid_argument"


class NotFound(TQError):
    code = "not_found"


class Conflict(TQError):
    code = "failed_precondition"


@dataclass(frozen=True)
class TaskSpec:
    name: str
    consumes: frozenset[str]
    produces: tuple[ColumnSpec, ...] = ()


@dataclass
class Row:
    index: int
    partition: int
    group: int
    unit: int
    written: set[str] = field(default_factory=set)
    length: int = 0
    version: int = -1
    nbytes: int = 0
    acked: set[str] = field(default_factory=set)
    leased: dict[str, str] = field(default_factory=dict)  # task -> lease id
    # the consuming tasks this row flows through (set by its first write)
    relevant: frozenset[str] | None = None
    initial: frozenset[str] = frozenset()


@dataclass
class Lease:
    id: str
    task: str
    rows: set[int]
    deadline: float
    consumer: str = ""


@dataclass(frozen=True)
class ClaimedRow:
    index: int
    partition: int
    unit: int
    length: int
    version: int
    group: int
    rank: int = 0


@dataclass
class Claim:
    lease: str
    rows: list[ClaimedRow]


@dataclass
class TaskState:
    spec: TaskSpec
    # partition -> ordered set of ready row indices (dict keeps readiness order)
    ready: dict[int, dict[int, None]] = field(default_factory=dict)
    group_ready: dict[int, int] = field(default_factory=dict)  # group -> ready members
    leases: dict[str, Lease] = field(default_factory=dict)
    claimed: int = 0
    acked: int = 0
    expired: int = 0
    stale_discarded: int = 0
    stale_regenerated: int = 0
    ack_times: deque = field(default_factory=lambda: deque(maxlen=4096))

    ready_parts: list[int] = field(default_factory=list)  # sorted ids of non-empty ready sets
    n_ready: int = 0

    def ready_count(self) -> int:
        return self.n_ready


@dataclass(frozen=True)
class ClaimRequest:
    task: str
    count: int
    min_count: int | None = None
    policy: str = "fifo"  # fifo | group | token_balanced | longest_first | shortest_first
    token_budget: int | None = None
    dp_size: int = 1
    partition: int | None = None
    min_version: int | None = None
    on_stale: str = "discard"  # discard | regenerate
    stale_producer: str | None = None
    consumer: str = ""


@dataclass(frozen=True)
class Cleared:
    partition: int
    cells: list[tuple[int, int, tuple[str, ...]]]  # (unit, index, columns)


class Controller:
    def __init__(
        self,
        num_units: int = 1,
        lease_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if num_units < 1:
            raise TQError("num_units must be at least 1")
        self.num_units = num_units
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.columns: dict[str, ColumnSpec] = {}
        self.tasks: dict[str, TaskState] = {}
        self.rows: dict[int, Row] = {}
        self.partitions: dict[int, set[int]] = {}
        self.partition_done: dict[int, int] = {}
        self.groups: dict[int, list[int]] = {}
        self.cleared_partitions = 0
        self.bytes_written = 0
        self._next_index = 0
        self._next_group = 0
        self._reserved: set[int] = set()  # indices handed to writers, rows not yet created
        self._relevance: dict[frozenset[str], frozenset[str]] = {}
        self._lease_ids = itertools.count(1)

    # ---- registration -------------------------------------------------
    def register(self, specs: Iterable[TaskSpec]) -> None:
        specs = list(specs)
        new_columns: dict[str, ColumnSpec] = {}
        for spec in specs:
            if not spec.name:
                raise TQError("task name must not be empty")
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
        self.columns.update(new_columns)
        added = False
        for spec in specs:
            if spec.name in self.tasks:
                continue
            added = True
            state = TaskState(spec)
            self.tasks[spec.name] = state
            for row in self.rows.values():
                self._refresh(row, state)
        if added:
            self._relevance.clear()
            for row in self.rows.values():
                if row.relevant is not None:
                    row.relevant = self._relevant_tasks(row.initial)

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
    def allocate(self, partition: int, count: int, group_size: int = 1) -> list[Row]:
        if count < 1:
            raise TQError(f"count must be at least 1, got {count}")
        group_size = max(group_size, 1)
        if count % group_size:
            raise TQError(f"count {count} is not a multiple of group_size {group_size}")
        rows = []
        for g in range(count // group_size):
            gid = self._next_group
            self._next_group += 1
            members = []
            for _ in range(group_size):
                idx = self._next_index
                self._next_index += 1
                row = Row(idx, partition, gid, idx % self.num_units)
                self.rows[idx] = row
                self.partitions.setdefault(partition, set()).add(idx)
                members.append(idx)
                rows.append(row)
            self.groups[gid] = members
        self.partition_done.setdefault(partition, 0)
        return rows

    def reserve(self, count: int) -> int:
        """Hand a writer `count` fresh indices (first one returned); rows come with notify."""
        if count < 1:
            raise TQError(f"count must be at least 1, got {count}")
        start = self._next_index
        self._next_index += count
        self._reserved.update(range(start, start + count))
        return start

    def _create(self, indices: list[int], partition: int, group_size: int) -> None:
        group_size = max(group_size, 1)
        if len(indices) % group_size:
            raise TQError(f"{len(indices)} rows are not a multiple of group_size {group_size}")
        for start in range(0, len(indices), group_size):
            gid = self._next_group
            self._next_group += 1
            members = indices[start:start + group_size]
            for idx in members:
                self._reserved.discard(idx)
                self.rows[idx] = Row(idx, partition, gid, idx % self.num_units)
                self.partitions.setdefault(partition, set()).add(idx)
            self.groups[gid] = list(members)
        self.partition_done.setdefault(partition, 0)

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
    ) -> int:
        """Record that `columns` of `indices` are in storage; returns rows newly ready.

        With `create`, the indices must be reserved (see `reserve`) and become
        new rows of `partition` first.
        """
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise NotFound(f"unknown column(s) {unknown}: declare them in a task's produces")
        if create:
            bad = [i for i in indices if i not in self._reserved]
            if bad or len(set(indices)) != len(indices):
                raise Conflict(f"indices {bad[:5] or indices[:5]} are not reserved for new rows "
                               "(reserve them first; each index creates one row once)")
            if len(indices) % max(group_size, 1):
                raise TQError(f"{len(indices)} rows are not a multiple of group_size {group_size}")
        else:
            missing = [i for i in indices if i not in self.rows]
            if missing:
                raise NotFound(f"unknown row index(es) {missing[:5]}: allocate rows before "
                               "writing (or the partition was already cleared)")
        for name, values in (("lengths", lengths), ("versions", versions), ("nbytes", nbytes)):
            if values and len(values) != len(indices):
                raise TQError(f"{name} has {len(values)} entries for {len(indices)} rows")
        if create:
            self._create(list(indices), partition, group_size)
        before = sum(t.n_ready for t in self.tasks.values())
        first = frozenset(columns)
        for i, idx in enumerate(indices):
            row = self.rows[idx]
            if row.relevant is None:
                row.initial = first
                row.relevant = self._relevant_tasks(first)
            row.written.update(columns)
            if lengths:
                row.length = int(lengths[i])
            if versions:
                row.version = int(versions[i])
            if nbytes:
                row.nbytes += int(nbytes[i])
                self.bytes_written += int(nbytes[i])
            for state in self.tasks.values():
                self._refresh(row, state)
        return sum(t.n_ready for t in self.tasks.values()) - before

    def _is_ready(self, row: Row, state: TaskState) -> bool:
        name = state.spec.name
        return (bool(state.spec.consumes) and state.spec.consumes <= row.written
                and name not in row.acked and name not in row.leased)

    def _refresh(self, row: Row, state: TaskState) -> None:
        p = row.partition
        ready = state.ready.get(p)
        now = self._is_ready(row, state)
        was = ready is not None and row.index in ready
        if now and not was:
            if ready is None:
                ready = state.ready[p] = {}
                bisect.insort(state.ready_parts, p)
            ready[row.index] = None
            state.n_ready += 1
            state.group_ready[row.group] = state.group_ready.get(row.group, 0) + 1
        elif was and not now:
            del ready[row.index]
            state.n_ready -= 1
            state.group_ready[row.group] -= 1
            if not ready:
                del state.ready[p]
                del state.ready_parts[bisect.bisect_left(state.ready_parts, p)]

    # ---- claims ---------------------------------------------------------
    def claim(self, req: ClaimRequest) -> Claim | None:
        """Lease up to `count` ready rows, or None if fewer than `min_count` are ready."""
        state = self._task(req.task)
        if req.count < 1:
            raise TQError(f"count must be at least 1, got {req.count}")
        if req.policy not in POLICIES:
            raise TQError(f"unknown claim policy {req.policy!r}: use one of {', '.join(POLICIES)}")
        if req.on_stale == "regenerate":
            if not req.stale_producer:
                raise TQError("on_stale regenerate needs stale_producer (the task that makes rows)")
            self._task(req.stale_producer)
        self.expire()
        if req.min_version is not None:
            self._filter_stale(state, req)
        picked = self._pick(state, req)
        min_count = req.count if req.min_count is None else req.min_count
        if not picked or len(picked) < min(min_count, req.count):
            return None
        ranks = [0] * len(picked)
        if req.policy == "token_balanced" and req.dp_size > 1:
            ranks = balance_over_ranks([self.rows[i].length for i in picked], req.dp_size)
        lease = Lease(f"{req.task}-{next(self._lease_ids)}", req.task, set(picked),
                      self.clock() + self.lease_seconds, req.consumer)
        state.leases[lease.id] = lease
        out = []
        for idx, rank in zip(picked, ranks):
            row = self.rows[idx]
            row.leased[req.task] = lease.id
            self._refresh(row, state)
            out.append(ClaimedRow(idx, row.partition, row.unit, row.length, row.version,
                                  row.group, rank))
        state.claimed += len(out)
        return Claim(lease.id, out)

    def _candidate_partitions(self, state: TaskState, req: ClaimRequest) -> list[int]:
        if req.partition is not None:
            return [req.partition] if req.partition in state.ready else []
        return state.ready_parts

    def _pick(self, state: TaskState, req: ClaimRequest) -> list[int]:
        picked: list[int] = []
        tokens = 0
        budget = req.token_budget
        if req.policy == "group":
            seen: set[int] = set()
            for p in self._candidate_partitions(state, req):
                for idx in state.ready[p]:
                    row = self.rows[idx]
                    members = self.groups[row.group]
                    if row.group in seen or state.group_ready.get(row.group, 0) < len(members):
                        continue
                    seen.add(row.group)
                    if len(picked) + len(members) > req.count:
                        return picked
                    group_tokens = sum(self.rows[m].length for m in members)
                    if budget is not None and picked and tokens + group_tokens > budget:
                        return picked
                    picked.extend(members)
                    tokens += group_tokens
            return picked
        if req.policy in ("longest_first", "shortest_first"):
            ids = [i for p in self._candidate_partitions(state, req) for i in state.ready[p]]
            ids.sort(key=lambda i: self.rows[i].length, reverse=req.policy == "longest_first")
        else:
            ids = (i for p in self._candidate_partitions(state, req) for i in state.ready[p])
        for idx in ids:
            length = self.rows[idx].length
            if budget is not None and picked and tokens + length > budget:
                return picked
            picked.append(idx)
            tokens += length
            if len(picked) == req.count:
                return picked
        return picked

    def _filter_stale(self, state: TaskState, req: ClaimRequest) -> None:
        for p in list(self._candidate_partitions(state, req)):
            stale = [i for i in state.ready.get(p, ()) if self.rows[i].version < req.min_version]
            for idx in stale:
                row = self.rows[idx]
                if req.on_stale == "regenerate":
                    self._regenerate(row, req.stale_producer)
                    state.stale_regenerated += 1
                else:
                    row.acked.add(state.spec.name)
                    self._refresh(row, state)
                    state.stale_discarded += 1
                    self._maybe_done(row)

    def _regenerate(self, row: Row, producer: str) -> None:
        """Clear what `producer` and the tasks downstream of it wrote for `row`."""
        cleared = {c.name for c in self.tasks[producer].spec.produces}
        redo = {producer}
        changed = True
        while changed:
            changed = False
            for state in self.tasks.values():
                if state.spec.name not in redo and state.spec.consumes & cleared:
                    redo.add(state.spec.name)
                    cleared |= {c.name for c in state.spec.produces}
                    changed = True
        row.written -= cleared
        row.acked -= redo
        for state in self.tasks.values():
            self._refresh(row, state)

    # ---- acks, releases, leases -----------------------------------------
    def _lease(self, task: str, lease_id: str) -> Lease:
        state = self._task(task)
        lease = state.leases.get(lease_id)
        if lease is None:
            raise Conflict(f"lease {lease_id!r} of task {task!r} is not held: it expired "
                           "(its rows went back to the queue) or was already acked/released")
        return lease

    def ack(self, task: str, lease_id: str, indices: list[int] | None = None) -> tuple[int, list[Cleared]]:
        lease = self._lease(task, lease_id)
        chosen = set(indices) if indices else set(lease.rows)
        foreign = chosen - lease.rows
        if foreign:
            raise Conflict(f"rows {sorted(foreign)[:5]} are not in lease {lease_id!r}")
        state = self.tasks[task]
        cleared: list[Cleared] = []
        now = self.clock()
        for idx in chosen:
            row = self.rows[idx]
            del row.leased[task]
            row.acked.add(task)
            lease.rows.discard(idx)
            state.acked += 1
            state.ack_times.append(now)
            c = self._maybe_done(row)
            if c:
                cleared.append(c)
        if not lease.rows:
            del state.leases[lease_id]
        return len(chosen), cleared

    def extend(self, task: str, lease_id: str) -> float:
        """Push a held lease's deadline to now + lease_seconds."""
        lease = self._lease(task, lease_id)
        lease.deadline = self.clock() + self.lease_seconds
        return self.lease_seconds

    def release(self, task: str, lease_id: str) -> int:
        lease = self._lease(task, lease_id)
        self._return(self.tasks[task], lease)
        return len(lease.rows)

    def _return(self, state: TaskState, lease: Lease) -> None:
        for idx in lease.rows:
            row = self.rows.get(idx)
            if row is None:
                continue
            row.leased.pop(state.spec.name, None)
            self._refresh(row, state)
        state.leases.pop(lease.id, None)

    def expire(self) -> int:
        """Return the rows of every expired lease to their task's ready set."""
        now = self.clock()
        n = 0
        for state in self.tasks.values():
            for lease in [le for le in state.leases.values() if le.deadline <= now]:
                state.expired += len(lease.rows)
                n += len(lease.rows)
                self._return(state, lease)
        return n

    def next_deadline(self) -> float | None:
        deadlines = [le.deadline for s in self.tasks.values() for le in s.leases.values()]
        return min(deadlines, default=None)

    # ---- partition lifecycle ----------------------------------------------
    def _maybe_done(self, row: Row) -> Cleared | None:
        if row.relevant is None or not row.relevant <= row.acked:
            return None
        p = row.partition
        self.partition_done[p] += 1
        if self.partition_done[p] < len(self.partitions[p]):
            return None
        cells = []
        for idx in sorted(self.partitions.pop(p)):
            r = self.rows.pop(idx)
            cells.append((r.unit, idx, tuple(sorted(r.written))))
            self.groups.pop(r.group, None)
            for state in self.tasks.values():
                state.group_ready.pop(r.group, None)
        for state in self.tasks.values():
            # a task outside the row's flow may still list it (odd columns written)
            stale = state.ready.pop(p, None)
            if stale:
                state.n_ready -= len(stale)
                del state.ready_parts[bisect.bisect_left(state.ready_parts, p)]
        del self.partition_done[p]
        self.cleared_partitions += 1
        return Cleared(p, cells)

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
