"""The TransferQueue controller's data: its rows, leases and claims, the tasks' views,
the limits it holds requests to and the refusals it answers with (pure)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from .schema import ColumnSpec, TaskSpec


class ControllerError(Exception):
    """A request the controller refuses; nothing was changed."""

    code = "invalid_argument"


class NotFound(ControllerError):
    code = "not_found"


class Conflict(ControllerError):
    code = "failed_precondition"


class Exhausted(ControllerError):
    """Over a limit: retry later (back-pressure) or ask for less."""

    code = "resource_exhausted"


@dataclass(frozen=True)
class Limits:
    """What one request, and the table as a whole, may hold."""

    rows_per_call: int = 16384      # Allocate / Reserve / Claim / NotifyWritten
    table_rows: int = 1 << 21       # rows alive + indices reserved
    unconsumed_bytes: int = 16 << 30  # bytes of rows not yet cleared: new rows wait
    max_dp_size: int = 4096
    max_wait_seconds: float = 600.0


MAX_LEASE_SECONDS = 7 * 24 * 3600.0


def check_lease_seconds(value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value)
            and 0 < value <= MAX_LEASE_SECONDS):
        raise ControllerError(f"lease_seconds must be a number in (0, {MAX_LEASE_SECONDS:.0f}], "
                      f"got {value!r}: a claim must expire so a dead consumer's rows come back")
    return float(value)


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
    # column -> lease id of its cells; shared by rows with equal tags, so replaced,
    # never changed in place
    tags: dict[str, str] = field(default_factory=dict)
    issued: dict[str, str] = field(default_factory=dict)  # lease id -> producing task
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
    # rows a regenerate took back from this (producer's) lease before it acked them: its
    # late ack skips them, so they are made again instead of counting as made
    revoked: set[int] = field(default_factory=set)


class ClaimedRow(NamedTuple):  # a tuple: a claim makes one per row
    index: int
    partition: int
    unit: int
    length: int
    version: int
    group: int
    rank: int = 0
    tags: dict[str, str] = {}  # the row's (shared: read only)


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
    arrivals: int = 0  # rows that became ready, ever: a waiting claim looks again when it moves

    def ready_count(self) -> int:
        return self.n_ready


@dataclass(frozen=True)
class ClaimRequest:
    task: str
    count: int
    min_count: int | None = None
    policy: str = "fifo"  # a name in policies.CLAIM_POLICIES (get_claim_policy)
    token_budget: int | None = None
    dp_size: int = 1
    partition: int | None = None
    min_version: int | None = None
    on_stale: str = "discard"  # discard | regenerate
    stale_producer: str | None = None
    consumer: str = ""
    max_partition: int | None = None  # only rows of partitions <= this (a release bound)
    one_partition: bool = False  # rows of one partition: the oldest that answers the claim


@dataclass(frozen=True)
class Cleared:
    partition: int
    cells: list[tuple[int, int, tuple[str, ...]]]  # (unit, index, columns)


def spec_record(spec: TaskSpec) -> dict:
    return {"name": spec.name, "consumes": sorted(spec.consumes),
            "produces": [[c.name, c.kind, c.dtype, list(c.trailing_shape)]
                         for c in spec.produces]}


def spec_from_record(d: dict) -> TaskSpec:
    return TaskSpec(d["name"], frozenset(d["consumes"]),
                    tuple(ColumnSpec(n, k, t, tuple(sh)) for n, k, t, sh in d["produces"]))
