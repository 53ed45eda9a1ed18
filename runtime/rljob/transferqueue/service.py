"""The TransferQueue controller as a gRPC service (the pod entrypoint).

`rljob worker transferqueue` runs `serve()`: the controller RPCs, the storage
service for memory units, the gRPC health service for probes, and a Prometheus
endpoint. The controller state machine is synchronous and every RPC runs on
one asyncio loop, so each request is applied atomically; long-poll claims wait
on a condition that writes, releases and lease expiry signal.

With Redis units every change is journaled in Redis before the answer goes
out (see `journal`), so a restarted controller continues where it stopped;
a journal that cannot be written stops the controller (fail-stop: no answer is
ever given for a change that would be lost). The units themselves (opening,
waiting for them, deleting cleared cells) are `units`'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time
import uuid
from dataclasses import dataclass, field

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from ..infra import auth, tls
from .controller import Controller
from .journal import RedisJournal, journal_changes, recover, stop_storage_lost
from .proto import transferqueue_pb2 as pb
from .proto import transferqueue_pb2_grpc as pbg
from .schema import ColumnError, storage_column
from .state import ClaimRequest, Cleared, ControllerError, Limits
from .storage.base import StorageUnit
from .storage.blocks import gather, pack_values, unpack_keys, unpack_runs
from .storage.memory import MemoryUnit
from .units import (
    CellSweeper,
    UnitConfig,
    open_units,
    unit_infos,
    wait_for_units,
)
from .wire import GRPC_OPTIONS, POLICY, STALE, column_to_pb, task_from_pb

log = logging.getLogger("rljob.transferqueue")

GRPC_CODE = {"invalid_argument": grpc.StatusCode.INVALID_ARGUMENT,
             "not_found": grpc.StatusCode.NOT_FOUND,
             "failed_precondition": grpc.StatusCode.FAILED_PRECONDITION,
             "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED}
DEFAULT_MAX_ROW_BYTES = 64 << 20
# turns of the event loop a write that made rows ready yields before its reply: the
# claims it woke look again and write their answers first (`_signal`)
ANSWER_TURNS = 4
SESSION_OPS = {}  # filled below the class: op name -> TransferQueueService method


@dataclass
class JobMetricsStore:
    latest: pb.JobMetrics = field(default_factory=pb.JobMetrics)


def _unary_rpc(op: str):
    """A unary RPC that runs the controller operation `op` (a method's name) through
    `_unary`: refusals become gRPC statuses, changes are journaled before the answer."""
    async def rpc(self, request, context):
        return await self._unary(getattr(self, op), request, context)

    rpc.__name__ = op
    return rpc


def _in_claim_order(n: int, parts) -> tuple[np.ndarray, bytes]:
    """One column's cells of a claim's rows when they are stored under several names
    (rows written under several leases): each name's (positions in the claim, sizes,
    bytes back to back) put in claim order."""
    sizes = np.empty(n, np.int64)
    starts = np.empty(n, np.int64)
    offset = 0
    for positions, part_sizes, part_data in parts:
        lens = np.maximum(part_sizes, 0)
        sizes[positions] = part_sizes
        starts[positions] = offset + np.cumsum(lens) - lens
        offset += len(part_data)
    return sizes, gather(b"".join(d for _, _, d in parts), starts, sizes)


class TransferQueueService(pbg.TransferQueueControllerServicer, pbg.StorageServiceServicer):
    def __init__(self, job: str, units: list[UnitConfig], lease_seconds: float = 60.0,
                 max_row_bytes: int = DEFAULT_MAX_ROW_BYTES, public_address: str = "",
                 limits: Limits = Limits(), storage_wait: float = 30.0,
                 compact_every: int = 50_000):
        if not units:
            raise ValueError("at least one storage unit is needed")
        self.job = job
        self.unit_configs = units
        self.max_row_bytes = max_row_bytes
        self.public_address = public_address
        # wall-clock deadlines: a journaled lease means the same in the next process
        self.controller = Controller(len(units), lease_seconds, clock=time.time, limits=limits)
        self.units: list[StorageUnit] = open_units(units, job, max_row_bytes)
        self.metrics = JobMetricsStore()
        self._changed: asyncio.Condition | None = None
        self.sweeper = CellSweeper(self.units)
        self.compact_every = compact_every
        self.journal = None
        self.table_id = uuid.uuid4().hex
        self.recovered = "new"
        if all(u.backend == "redis" for u in units):
            self._open_journal(storage_wait)

    def _open_journal(self, storage_wait: float) -> None:
        wait_for_units(self.units, storage_wait)
        self.journal = RedisJournal(self.units, self.job)
        self.recovered, cleared = recover(self.controller, self.journal)
        self.table_id = self.journal.table_id
        self._clear(cleared)  # cells a crash left undeleted

    def persist(self) -> None:
        """Journal what the controller changed; without a journal, forget it."""
        journal_changes(self.controller, self.journal, self.compact_every)

    # ---- helpers ------------------------------------------------------------
    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _signal(self, answer_first: bool = False) -> None:
        """Wake the waiting claims (they look again). `answer_first`: the op that
        signals replies after they answered (a few turns of the loop: the woken claim
        looks again and writes its answer), so the writer's next ops (a replica's bound
        and claim after its write) do not come between the rows and their consumer."""
        async with self.changed:
            self.changed.notify_all()
        if answer_first:
            for _ in range(ANSWER_TURNS):
                await asyncio.sleep(0)

    async def _fail(self, context, exc: Exception):
        code = GRPC_CODE.get(getattr(exc, "code", ""), grpc.StatusCode.INVALID_ARGUMENT)
        await context.abort(code, str(exc))

    def _clear(self, cleared: list[Cleared]) -> None:
        """Queue cleared partitions' cells for deletion (`CellSweeper`)."""
        self.sweeper.queue(cleared)

    def unit_infos(self) -> list[pb.StorageUnitInfo]:
        return unit_infos(self.unit_configs)

    # ---- controller operations (shared by unary RPCs and sessions) ----------
    async def _register(self, request):
        specs = [task_from_pb(t) for t in request.tasks]
        self.controller.register(specs)
        await self._signal()
        return pb.RegisterTaskResponse(
            columns=[column_to_pb(c) for c in self.controller.columns.values()],
            units=self.unit_infos())

    async def _allocate(self, request):
        rows = self.controller.allocate(request.partition, request.count, request.group_size)
        return pb.AllocateResponse(indices=[r.index for r in rows], groups=[r.group for r in rows])

    async def _reserve(self, request):
        return pb.ReserveResponse(start=self.controller.reserve(request.count),
                                  count=request.count)

    async def _notify(self, request):
        if request.ack and not request.lease:
            raise ControllerError("ack is for a fenced write: name the lease the rows are "
                                  "claimed in")
        stores = self._notified_cells(request)  # checked now, stored once accepted
        try:
            too_big = [i for i, n in zip(request.indices, request.nbytes)
                       if n > self.max_row_bytes]
            if too_big:
                raise ControllerError(f"rows {too_big[:5]} exceed max_row_bytes={self.max_row_bytes}")
            n = self.controller.notify_written(
                list(request.indices), list(request.columns), list(request.lengths) or None,
                list(request.versions) or None, list(request.nbytes) or None,
                create=request.create, partition=request.partition,
                group_size=request.group_size, task=request.task, lease=request.lease)
        except ControllerError:
            # the refused writer's cells are nobody's: delete them (fenced or orphan writes)
            refused = self.controller.refused_cells(list(request.indices)[:65536],
                                                    list(request.columns), request.lease,
                                                    request.create)
            self._clear([refused] if refused else [])
            raise
        for unit, runs in stores:  # before any await: no claim sees the rows without them
            unit.store_runs(runs)
        acked = 0
        if request.ack:  # the lease holds every row: notify_written checked it
            acked, cleared = self.controller.ack(request.task, request.lease,
                                                 list(request.indices))
            self._clear(cleared)
        if n:  # the trainer's claim waiting for these rows is answered before the writer
            await self._signal(answer_first=True)
        return pb.NotifyWrittenResponse(newly_ready=n, acked=acked)

    def _unit_cells(self, unit_id: int, block: pb.CellBlock) -> tuple[MemoryUnit, list]:
        """A block for one of this controller's memory units (a Put's, or a notify's
        `cells`) as runs of one column, checked: well formed, each cell with its
        bytes, within the row limit."""
        unit = self._memory_unit(unit_id)
        try:
            runs = unpack_runs(block)
            unit.check_runs(runs)
        except ValueError as exc:
            raise ControllerError(f"unit {unit_id}'s cells: {exc}") from None
        if any(len(sizes) and sizes.min() < 0 for _, _, sizes, _ in runs):
            raise ControllerError("a cell block to store has a cell without bytes (size -1)")
        return unit, runs

    def _notified_cells(self, request) -> list[tuple[MemoryUnit, list]]:
        """A notify's memory-unit cells (`NotifyWrittenRequest.cells`), checked as a
        Put's are (`_unit_cells`) and of the rows the notify names."""
        stores = []
        named: set[int] | None = None
        for uc in request.cells:
            unit, runs = self._unit_cells(uc.unit, uc.block)
            stores.append((unit, runs))
            checked: list[list[int]] = []  # a write's columns name the same rows: once
            for _, indices, _, _ in runs:
                if any(indices == c for c in checked):
                    continue
                checked.append(indices)
                named = set(request.indices) if named is None else named
                stray = sorted(set(indices) - named)
                if stray:
                    raise ControllerError(f"cells of rows {stray[:5]} that the notify does "
                                          "not name")
        return stores

    def _claimed_cells(self, rows, read: list[str]) -> list[pb.UnitCells]:
        """`ClaimRequest.read`: the claimed rows' cells on memory units, a block of
        values per unit: column by column, each the unit's rows in claim order, each
        row's cell under its tags."""
        by_unit: dict[int, list] = {}
        for r in rows:
            by_unit.setdefault(r.unit, []).append(r)
        out = []
        for u, unit_rows in by_unit.items():
            unit = self.units[u] if 0 <= u < len(self.units) else None
            if not isinstance(unit, MemoryUnit):
                continue  # the client reads it from the unit itself
            # rows written together share their tags dict: the rows of each, in order
            # (rows hold it, so its id stays theirs while the claim is answered)
            sets: dict[int, tuple[dict, list[int], list[int]]] = {}
            first = unit_rows[0].tags
            if (all(r.tags is first for r in unit_rows)  # rows written together
                    or not any(r.tags for r in unit_rows)):  # or untagged
                sets[0] = (first, list(range(len(unit_rows))), [r.index for r in unit_rows])
            else:
                for p, r in enumerate(unit_rows):
                    key = id(r.tags) if r.tags else 0  # 0: untagged
                    s = sets.get(key)
                    if s is None:
                        s = sets[key] = (r.tags or {}, [], [])
                    s[1].append(p)
                    s[2].append(r.index)
            sizes, data = [], []
            for c in read:
                parts = [(positions, *unit.read_column(storage_column(c, tags.get(c, "")),
                                                       indices))
                         for tags, positions, indices in sets.values()]
                column_sizes, column_data = (parts[0][1:] if len(parts) == 1
                                             else _in_claim_order(len(unit_rows), parts))
                sizes.append(column_sizes)
                data.append(column_data)
            out.append(pb.UnitCells(unit=u, block=pb.CellBlock(
                sizes=np.concatenate(sizes).tolist() if sizes else [], data=b"".join(data))))
        return out

    async def _claim(self, request, woken=None, bound=None):
        """`woken()`: whether a wake op of the claim's session came since it arrived
        (then it stops waiting, as if out of time); `bound()`: the claim's
        max_partition now (a session's `bound` op moves it while the claim waits)."""
        req = ClaimRequest(
            task=request.task, count=request.count,
            min_count=request.min_count or None,
            policy=request.policy_name or POLICY.get(request.policy, "?"),
            token_budget=request.token_budget or None, dp_size=max(request.dp_size, 1),
            partition=request.partition if request.has_partition else None,
            min_version=request.min_version if request.has_min_version else None,
            on_stale=STALE.get(request.on_stale, "discard"),
            stale_producer=request.stale_producer or None, consumer=request.consumer,
            max_partition=request.max_partition if request.has_max_partition else None,
            one_partition=request.one_partition)
        wait = request.wait_seconds
        if not 0 <= wait <= self.controller.limits.max_wait_seconds:  # also refuses nan
            raise ControllerError(f"wait_seconds must be in [0, {self.controller.limits.max_wait_seconds:.0f}]"
                          f", got {wait}")
        deadline = time.monotonic() + wait
        if request.ack_lease:
            _, cleared = self.controller.ack(request.task, request.ack_lease)
            self._clear(cleared)
        while True:
            if bound is not None and bound() != req.max_partition:
                req = dataclasses.replace(req, max_partition=bound())
            claim = self.controller.claim(req)
            self._clear(self.controller.take_cleared())
            self.persist()
            if claim is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (woken is not None and woken()):
                # out of time (or woken): hand over whatever is ready (maybe nothing)
                claim = self.controller.claim(ClaimRequest(**{**req.__dict__, "min_count": 1}))
                self._clear(self.controller.take_cleared())
                break
            # until a row becomes ready for this task (or a wake, a new bound, or a
            # while: a lease that expires brings rows back without anyone writing)
            state = self.controller.tasks[req.task]
            arrivals = state.arrivals
            try:
                async with asyncio.timeout(min(remaining, 0.5)), self.changed:
                    while (state.arrivals == arrivals and not (woken is not None and woken())
                           and (bound is None or bound() == req.max_partition)):
                        await self.changed.wait()
            except TimeoutError:
                pass
        if claim is None:
            return pb.ClaimResponse(lease="", lease_seconds=self.controller.lease_seconds)
        # each distinct tags dict once (rows written together share theirs)
        sets: dict[int, int] = {}
        tag_sets = []
        for r in claim.rows:
            if r.tags and id(r.tags) not in sets:
                tag_sets.append(pb.TagSet(tags=r.tags))
                sets[id(r.tags)] = len(tag_sets)
        resp = pb.ClaimResponse(
            lease=claim.lease, lease_seconds=self.controller.lease_seconds, tag_sets=tag_sets,
            cells=self._claimed_cells(claim.rows, list(request.read)) if request.read else ())
        # the rows as columns, each one extend (unit, rank, tag_set: empty where all 0)
        index, partition, unit, length, version, group, rank, tags = zip(*claim.rows)
        out = resp.rows
        out.index.extend(index)
        out.partition.extend(partition)
        out.length.extend(length)
        out.version.extend(version)
        out.group.extend(group)
        if any(unit):
            out.unit.extend(unit)
        if any(rank):
            out.rank.extend(rank)
        if sets:
            out.tag_set.extend([sets.get(id(t), 0) if t else 0 for t in tags])
        return resp

    async def _ack(self, request):
        n, cleared = self.controller.ack(request.task, request.lease,
                                         list(request.indices) or None)
        self._clear(cleared)
        return pb.AckResponse(acked=n)

    async def _release(self, request):
        n = self.controller.release(request.task, request.lease)
        await self._signal()
        return pb.ReleaseResponse(released=n)

    async def _regenerate(self, request):
        if not request.producer:
            raise ControllerError("producer must name the task that makes the rows again")
        n = self.controller.regenerate(request.task, request.lease, list(request.indices),
                                       request.producer)
        await self._signal()
        return pb.ReleaseResponse(released=n)

    async def _extend(self, request):
        return pb.ExtendResponse(lease_seconds=self.controller.extend(request.task, request.lease))

    async def _release_consumer(self, request):
        if not request.consumer:
            raise ControllerError("consumer must not be empty")
        n = self.controller.release_consumer(request.consumer)
        if n:
            await self._signal()
        return pb.ReleaseResponse(released=n)

    async def _unary(self, op, request, context):
        try:
            return await op(request)
        except (ControllerError, ColumnError) as exc:
            await self._fail(context, exc)
        finally:
            self.persist()  # before the answer leaves: what the op changed is journaled

    # ---- unary RPCs ---------------------------------------------------------------
    async def Layout(self, request, context):
        return pb.LayoutResponse(job=self.job, units=self.unit_infos(),
                                 columns=[column_to_pb(c) for c in self.controller.columns.values()],
                                 max_row_bytes=self.max_row_bytes, table_id=self.table_id)

    RegisterTasks = _unary_rpc("_register")
    Allocate = _unary_rpc("_allocate")
    Reserve = _unary_rpc("_reserve")
    NotifyWritten = _unary_rpc("_notify")
    Claim = _unary_rpc("_claim")
    Ack = _unary_rpc("_ack")
    Release = _unary_rpc("_release")
    ReleaseConsumer = _unary_rpc("_release_consumer")
    Regenerate = _unary_rpc("_regenerate")
    Extend = _unary_rpc("_extend")

    async def ReportMetrics(self, request, context):
        latest = pb.JobMetrics()
        latest.CopyFrom(request)
        if not latest.timestamp:
            latest.timestamp = time.time()
        self.metrics.latest = latest
        return pb.MetricsAck()

    async def Stats(self, request, context):
        ctl = self.controller
        return pb.StatsResponse(
            tasks=[pb.TaskStats(**s) for s in ctl.task_stats()],
            consumers=[pb.ConsumerStats(**s) for s in ctl.consumer_stats()],
            rows=len(ctl.rows), partitions=len(ctl.partitions),
            cleared_partitions=ctl.cleared_partitions, bytes_written=ctl.bytes_written,
            metrics=self.metrics.latest, next_partition=ctl.next_partition,
            table_id=self.table_id)

    # ---- session: the same operations over one bidirectional stream ----------------
    async def Session(self, request_iterator, context):
        """Ops in, results out (matched by id). A stream message costs the server a
        fraction of a unary call, which is what the data path pays per batch.
        Ops run in arrival order; a claim that has to wait runs on its own, until
        its rows are ready, its time is up or a later wake op of the session."""
        write_lock = asyncio.Lock()
        waiting: set[asyncio.Task] = set()
        wakes = 0  # wake ops so far: a claim stops waiting once there is one more
        # task -> the max_partition of the session's latest bounded claim or bound op
        # (in arrival order: the client sends its current bound with each)
        bounds: dict[str, int] = {}

        async def run(op_msg, kind, woken=None, bound=None):
            result = pb.OpResult(id=op_msg.id)
            try:
                msg = getattr(op_msg, kind)
                resp = await (self._claim(msg, woken, bound) if kind == "claim"
                              else SESSION_OPS[kind](self, msg))
                getattr(result, kind).CopyFrom(resp)
            except (ControllerError, ColumnError) as exc:
                result.code = GRPC_CODE.get(getattr(exc, "code", ""),
                                            grpc.StatusCode.INVALID_ARGUMENT).value[0]
                result.error = str(exc)
            finally:
                self.persist()
            async with write_lock:
                await context.write(result)

        try:
            async for op_msg in request_iterator:
                kind = op_msg.WhichOneof("op")
                if kind == "wake":
                    wakes += 1
                    woken = sum(1 for t in waiting if not t.done())
                    await self._signal()  # the waiting claims look again, and see it
                    async with write_lock:
                        await context.write(pb.OpResult(id=op_msg.id,
                                                        wake=pb.WakeResponse(woken=woken)))
                elif kind == "bound":
                    bounds[op_msg.bound.task] = op_msg.bound.max_partition
                    await self._signal()  # the waiting claims look again under it
                    async with write_lock:
                        await context.write(pb.OpResult(id=op_msg.id, bound=pb.BoundResponse(
                            waiting=sum(1 for t in waiting if not t.done()))))
                elif kind not in SESSION_OPS:
                    async with write_lock:
                        await context.write(pb.OpResult(
                            id=op_msg.id, code=grpc.StatusCode.INVALID_ARGUMENT.value[0],
                            error=f"unknown session op {kind!r}"))
                elif kind == "claim" and op_msg.claim.wait_seconds > 0:
                    claim = op_msg.claim
                    bound = None
                    if claim.has_max_partition:
                        bounds[claim.task] = claim.max_partition
                        bound = lambda task=claim.task: bounds[task]  # noqa: E731
                    task = asyncio.create_task(
                        run(op_msg, kind, lambda since=wakes: wakes != since, bound))
                    waiting.add(task)
                    task.add_done_callback(waiting.discard)
                else:
                    await run(op_msg, kind)
            if waiting:
                await asyncio.gather(*waiting)
        finally:
            for task in list(waiting):
                task.cancel()

    # ---- storage service (memory units) --------------------------------------
    def _memory_unit(self, unit: int) -> MemoryUnit:
        if not 0 <= unit < len(self.units) or not isinstance(self.units[unit], MemoryUnit):
            raise ControllerError(f"unit {unit} is not a memory unit of this controller")
        return self.units[unit]  # type: ignore[return-value]

    async def Put(self, request, context):
        try:
            unit, runs = self._unit_cells(request.unit, request.block)
            unknown = sorted(i for i in set(request.block.indices)
                             if not self.controller.writable(i))
            gone = [i for i in unknown if self.controller.cleared(i)]
            if gone:
                raise ControllerError(f"rows {gone[:5]} are no longer in the table (consumed and "
                              "cleared, or discarded): their cells are refused")
            if unknown:
                raise ControllerError(f"rows {unknown[:5]} were never created nor reserved: "
                              "reserve indices (or allocate rows) before writing cells")
            unit.store_runs(runs)
        except ControllerError as exc:
            await self._fail(context, exc)
        return pb.PutResponse()

    async def Get(self, request, context):
        try:
            unit = self._memory_unit(request.unit)
            keys = unpack_keys(request.keys)
        except (ControllerError, ValueError) as exc:
            await self._fail(context, exc)
        return pb.GetResponse(block=pack_values(unit.get_cells(keys)))  # in the keys' order

    # ---- background -----------------------------------------------------------
    async def reap_leases(self, interval: float = 0.25, check_units: float = 2.0) -> None:
        last_check = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            expired = self.controller.expire()
            self.persist()
            if expired:
                await self._signal()
            if self.journal is not None and time.monotonic() - last_check > check_units:
                last_check = time.monotonic()
                lost = await asyncio.get_running_loop().run_in_executor(
                    None, self.journal.lost_units)
                if lost:
                    stop_storage_lost("storage unit(s) %s came back empty: the table's cells "
                                      "are gone; stopping (a restart starts a new table)", lost)


SESSION_OPS.update({
    "notify": TransferQueueService._notify,
    "claim": TransferQueueService._claim,
    "ack": TransferQueueService._ack,
    "release": TransferQueueService._release,
    "extend": TransferQueueService._extend,
    "reserve": TransferQueueService._reserve,
})


async def serve(service: TransferQueueService, listen: str, metrics_port: int | None = None,
                grace: float = 5.0, ready: asyncio.Event | None = None,
                health_port: int | None = None) -> None:
    """Run until SIGTERM/SIGINT, then stop accepting and drain for `grace` seconds;
    with `health_port`, the health service alone is served there too, in plain text
    (the kubelet's gRPC probe speaks no TLS; health tells a caller nothing else)."""
    # only the job's callers (its token); the health service stays open
    server = grpc.aio.server(options=GRPC_OPTIONS,
                             interceptors=auth.server_interceptors(is_async=True))
    pbg.add_TransferQueueControllerServicer_to_server(service, server)
    pbg.add_StorageServiceServicer_to_server(service, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    port = tls.add_port(server, listen)  # the job's certificate, where it has one
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen}")
    if not service.public_address:
        host = listen.rsplit(":", 1)[0]
        service.public_address = f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"
    if metrics_port is not None:
        from .metrics import start_metrics_server

        metrics_port = start_metrics_server(service, metrics_port)
    probes = None
    if health_port is not None:
        probes = grpc.aio.server(options=GRPC_OPTIONS)
        health_pb2_grpc.add_HealthServicer_to_server(health, probes)
        if probes.add_insecure_port(f"{listen.rsplit(':', 1)[0]}:{health_port}") == 0:
            raise RuntimeError(f"cannot serve health on port {health_port}")
        await probes.start()
    await server.start()
    for name in ("", "rljob.transferqueue.v1.TransferQueueController"):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    reaper = asyncio.create_task(service.reap_leases())
    deleter = asyncio.create_task(service.sweeper.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("transferqueue %s listening on %s (%d %s units)", service.job, service.public_address,
             len(service.units), service.unit_configs[0].backend)
    if ready is not None:
        ready.set()
    metrics = f", metrics on :{metrics_port}" if metrics_port is not None else ""
    print(f"transferqueue listening on {service.public_address} (table {service.table_id}, "
          f"{service.recovered}{metrics})", flush=True)
    await stop.wait()
    log.info("shutting down: draining for %.1fs", grace)
    for name in ("", "rljob.transferqueue.v1.TransferQueueController"):
        await health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    reaper.cancel()
    await server.stop(grace)
    if probes is not None:
        await probes.stop(0)
    deleter.cancel()
    service.sweeper.delete(service.sweeper.pending)  # what the last acks cleared
    for u in service.units:
        u.close()
