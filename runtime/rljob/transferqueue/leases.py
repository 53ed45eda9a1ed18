"""Claims, acks, releases, regeneration and lease expiry: the half of the
`Controller` that hands rows out and takes them back (pure).

`LeaseOps` is a mixin of `Controller`: the table it works on (rows, partitions,
tasks), the records (`_do`) and the readiness bookkeeping (`_refresh`) are the
Controller's. As there, every change is a record applied by an `_apply_*` handler.
"""

from __future__ import annotations

import bisect
import math
from itertools import repeat

from .policies import ReadyView, get_claim_policy
from .schema import storage_column
from .state import (
    Claim,
    ClaimedRow,
    ClaimRequest,
    Cleared,
    Conflict,
    ControllerError,
    Lease,
    Row,
    TaskState,
)


class LeaseOps:
    """The Controller's claims and leases (see the module's docstring)."""

    # ---- claims ---------------------------------------------------------
    def claim(self, req: ClaimRequest) -> Claim | None:
        """Lease up to `count` ready rows, or None if fewer than `min_count` are ready."""
        state = self._task(req.task)
        self._check_count("count", req.count)
        try:
            policy = get_claim_policy(req.policy)
        except ValueError as exc:  # unknown, or an installed one that fails to load
            raise ControllerError(str(exc)) from None
        if not 1 <= req.dp_size <= min(self.limits.max_dp_size, req.count):
            raise ControllerError(f"dp_size must be between 1 and min(count, "
                          f"{self.limits.max_dp_size}), got {req.dp_size}")
        if req.token_budget is not None and req.token_budget < 0:
            raise ControllerError(f"token_budget must be >= 0, got {req.token_budget}")
        if req.on_stale == "regenerate":
            if not req.stale_producer:
                raise ControllerError("on_stale regenerate needs stale_producer (the task that makes rows)")
            self._task(req.stale_producer)
        self.expire()
        if req.min_version is not None:
            self._filter_stale(state, req)
        min_count = req.count if req.min_count is None else req.min_count
        parts = self._candidate_partitions(state, req)
        if req.one_partition:  # the oldest partition that answers the claim
            picked = next(filter(None, (self._pick(state, policy, [p], req, min_count)
                                        for p in parts)), None)
        else:
            picked = self._pick(state, policy, parts, req, min_count,
                                whole=req.partition is None and req.max_partition is None)
        if picked is None:
            return None
        ranks = policy.ranks([self.rows[i].length for i in picked], req.dp_size)
        lease_id = f"{req.task}-{self._lease_seq + 1}"
        self._do({"op": "lease", "task": req.task, "lease": lease_id, "rows": picked,
                  "consumer": req.consumer, "deadline": self.clock() + self.lease_seconds,
                  "counted": True})
        out = []
        for idx, rank in zip(picked, ranks):
            row = self.rows[idx]
            out.append(ClaimedRow(idx, row.partition, row.unit, row.length, row.version,
                                  row.group, rank, row.tags))
        return Claim(lease_id, out)

    def _pick(self, state: TaskState, policy, parts: list[int], req: ClaimRequest,
              min_count: int, whole: bool = False) -> list[int] | None:
        """The policy's pick among the ready rows of `parts` (`whole`: every ready row
        of the task), or None where fewer than the claim needs are ready or no pick can
        answer it (a waiting claim is looked at again at each arrival)."""
        need = min(min_count, req.count)
        ready = state.n_ready if whole else sum(len(state.ready[p]) for p in parts)
        if ready < max(1, need):
            return None
        view = ReadyView([state.ready[p] for p in parts], self.rows, self.groups,
                         state.group_ready)
        picked = policy.pick(view, req.count, req.token_budget)
        return picked if picked and len(picked) >= need else None

    def _apply_lease(self, rec: dict) -> None:
        task, lease_id = rec["task"], rec["lease"]
        state = self.tasks[task]
        self._lease_seq = max(self._lease_seq, int(lease_id.rsplit("-", 1)[1]))
        lease = Lease(lease_id, task, set(rec["rows"]), rec["deadline"], rec["consumer"],
                      set(rec.get("revoked", ())))
        state.leases[lease_id] = lease
        self._next_expiry = min(self._next_expiry, lease.deadline)
        produces = bool(state.spec.produces)
        rows = [self.rows[idx] for idx in rec["rows"]]
        for row in rows:
            row.leased[task] = lease_id
            if produces:
                row.issued[lease_id] = task  # its cells may exist: deleted with the row
        self._refresh_rows(rows, state)
        if rec["counted"]:
            state.claimed += len(rec["rows"])

    def _candidate_partitions(self, state: TaskState, req: ClaimRequest) -> list[int]:
        """The partitions a claim may take rows of, oldest first: its `partition`, or
        every one with ready rows, up to its `max_partition`."""
        bound = req.max_partition
        if req.partition is not None:
            return ([req.partition] if req.partition in state.ready
                    and (bound is None or req.partition <= bound) else [])
        if bound is None:
            return state.ready_parts
        return state.ready_parts[:bisect.bisect_right(state.ready_parts, bound)]

    def _filter_stale(self, state: TaskState, req: ClaimRequest) -> list[Cleared]:
        cleared: list[Cleared] = []
        for p in list(self._candidate_partitions(state, req)):
            stale = [i for i in state.ready.get(p, ()) if self.rows[i].version < req.min_version]
            if not stale:
                continue
            if req.on_stale == "regenerate":
                self._do({"op": "regenerate", "task": state.spec.name,
                          "producer": req.stale_producer, "indices": stale})
            else:
                cleared += self._do({"op": "discard", "task": state.spec.name, "indices": stale})
        self._cleared.extend(cleared)
        return cleared

    def take_cleared(self) -> list[Cleared]:
        """Partitions a claim's staleness filter completed: their cells can go."""
        out, self._cleared = self._cleared, []
        return out

    def _apply_discard(self, rec: dict) -> list[Cleared]:
        state = self.tasks[rec["task"]]
        cleared = []
        for idx in rec["indices"]:
            row = self.rows[idx]
            row.acked.add(state.spec.name)
            self._refresh(row, state)
            state.stale_discarded += 1
            c = self._maybe_done(row)
            if c:
                cleared.append(c)
        return cleared

    def regenerate(self, task: str, lease_id: str, indices: list[int], producer: str) -> int:
        """Take `indices` out of a lease of `task` and have `producer` make them again."""
        lease = self._lease(task, lease_id)
        self._task(producer)
        foreign = sorted(set(indices) - lease.rows)
        if foreign:
            raise ControllerError(f"rows {foreign[:5]} are not in lease {lease_id!r}")
        if not indices:
            return 0
        self._do({"op": "regenerate", "task": task, "producer": producer,
                  "indices": sorted(set(indices)), "lease": lease_id})
        return len(set(indices))

    def _apply_regenerate(self, rec: dict) -> None:
        """Clear what `producer` and the tasks downstream of it wrote for the rows
        (first taking them out of the consumer's lease, when the record names one)."""
        if rec.get("lease"):
            state = self.tasks[rec["task"]]
            lease = state.leases[rec["lease"]]
            lease.rows -= set(rec["indices"])
            if not lease.rows:
                del state.leases[rec["lease"]]
            for idx in rec["indices"]:
                self.rows[idx].leased.pop(rec["task"], None)
        producer = rec["producer"]
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
        self.tasks[rec["task"]].stale_regenerated += len(rec["indices"])
        rows = [self.rows[idx] for idx in rec["indices"]]
        for row in rows:
            for name in redo:  # a producer that wrote the row but has not acked it yet
                lease_id = row.leased.pop(name, None)
                if lease_id is not None:
                    lease = self.tasks[name].leases[lease_id]
                    lease.rows.discard(row.index)
                    lease.revoked.add(row.index)
            row.written -= cleared
            row.acked -= redo
        for state in self.tasks.values():
            self._refresh_rows(rows, state)

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
        foreign = chosen - lease.rows - lease.revoked
        if foreign:
            raise Conflict(f"rows {sorted(foreign)[:5]} are not in lease {lease_id!r}")
        chosen = sorted(chosen & lease.rows)  # not the rows a regenerate took back
        cleared = self._do({"op": "ack", "task": task, "lease": lease_id, "indices": chosen})
        return len(chosen), cleared

    def _apply_ack(self, rec: dict) -> list[Cleared]:
        task, lease_id = rec["task"], rec["lease"]
        state = self.tasks[task]
        lease = state.leases[lease_id]
        cleared: list[Cleared] = []
        indices = rec["indices"]
        lease.rows.difference_update(indices)
        state.acked += len(indices)
        state.ack_times.extend(repeat(self.clock(), min(len(indices), state.ack_times.maxlen)))
        done: dict[int, int] = {}  # partition -> its rows this ack completed
        for row in map(self.rows.__getitem__, indices):
            del row.leased[task]
            row.acked.add(task)
            if row.relevant is not None and row.relevant <= row.acked:
                done[row.partition] = done.get(row.partition, 0) + 1
        for p, n in done.items():  # a partition at a time: cleared once all its rows are
            c = self._partition_done(p, n)
            if c:
                cleared.append(c)
        if not lease.rows:
            del state.leases[lease_id]
        return cleared

    def extend(self, task: str, lease_id: str) -> float:
        """Push a held lease's deadline to now + lease_seconds."""
        self._lease(task, lease_id)
        self._do({"op": "extend", "task": task, "lease": lease_id,
                  "deadline": self.clock() + self.lease_seconds})
        return self.lease_seconds

    def _apply_extend(self, rec: dict) -> None:
        self.tasks[rec["task"]].leases[rec["lease"]].deadline = rec["deadline"]
        self._next_expiry = min(self._next_expiry, rec["deadline"])

    def release(self, task: str, lease_id: str) -> int:
        lease = self._lease(task, lease_id)
        n = len(lease.rows)
        self._do({"op": "return", "task": task, "lease": lease_id, "expired": False})
        return n

    def release_consumer(self, consumer: str) -> int:
        """Return every row a consumer holds (it restarted: its leases are dead)."""
        n = 0
        for name, state in self.tasks.items():
            for lease in [le for le in state.leases.values() if le.consumer == consumer]:
                n += len(lease.rows)
                self._do({"op": "return", "task": name, "lease": lease.id, "expired": False})
        return n

    def _apply_return(self, rec: dict) -> None:
        state = self.tasks[rec["task"]]
        lease = state.leases.pop(rec["lease"])
        if rec["expired"]:
            state.expired += len(lease.rows)
        rows = [row for row in map(self.rows.get, lease.rows) if row is not None]
        for row in rows:
            row.leased.pop(state.spec.name, None)
        self._refresh_rows(rows, state)

    def expire(self) -> int:
        """Return the rows of every expired lease to their task's ready set (the leases
        are looked at once the earliest deadline has passed: deadlines only move
        later, and a new lease's is noted as it is made)."""
        now = self.clock()
        if now < self._next_expiry:
            return 0
        n = 0
        for name, state in self.tasks.items():
            for lease in [le for le in state.leases.values() if le.deadline <= now]:
                n += len(lease.rows)
                self._do({"op": "return", "task": name, "lease": lease.id, "expired": True})
        self._next_expiry = min((le.deadline for state in self.tasks.values()
                                 for le in state.leases.values()), default=math.inf)
        return n

    # ---- partition lifecycle ----------------------------------------------
    def _maybe_done(self, row: Row) -> Cleared | None:
        """After a task acked (or discarded) `row`: its partition's cells, if every row
        of it is now done."""
        if row.relevant is None or not row.relevant <= row.acked:
            return None
        return self._partition_done(row.partition, 1)

    def _partition_done(self, p: int, n: int) -> Cleared | None:
        """`n` more rows of partition `p` are done: its cells, if every row of it is."""
        self.partition_done[p] += n
        if self.partition_done[p] < len(self.partitions[p]):
            return None
        cells = []
        # rows written together have equal tags, columns and leases: each such set
        # named once, one tuple shared by its rows (holding each tags dict: no reuse
        # of its id)
        named: dict[tuple, tuple[dict, tuple[str, ...]]] = {}
        groups: set[int] = set()
        for idx in sorted(self.partitions.pop(p)):
            r = self.rows.pop(idx)
            self.live_bytes -= r.nbytes
            key = (id(r.tags), frozenset(r.written), tuple(r.issued.items()))
            got = named.get(key)
            if got is None:
                names = {storage_column(c, r.tags.get(c, "")) for c in r.written}
                for tag, task in r.issued.items():  # cells of leases that never published
                    names.update(storage_column(c.name, tag)
                                 for c in self.tasks[task].spec.produces)
                got = named[key] = (r.tags, tuple(sorted(names)))
            cells.append((r.unit, idx, got[1]))
            groups.add(r.group)
        for g in groups:
            self.groups.pop(g, None)
            for state in self.tasks.values():
                state.group_ready.pop(g, None)
        for state in self.tasks.values():
            # a task outside the row's flow may still list it (odd columns written)
            stale = state.ready.pop(p, None)
            if stale:
                state.n_ready -= len(stale)
                del state.ready_parts[bisect.bisect_left(state.ready_parts, p)]
        del self.partition_done[p]
        self.cleared_partitions += 1
        return Cleared(p, cells)
