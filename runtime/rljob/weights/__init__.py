"""Versioned weight sync: WeightSender (trainer rank 0) → WeightReceiver (rollouts).

The sender serves the latest published version over gRPC streaming, in
chunks, tensors as raw buffers (no pickling). Receivers fetch a version, and
report what they loaded, so the driver can release on-policy prompts only once
every live replica holds the new weights.

Every sender has an epoch (its life). A trainer restored from a checkpoint
publishes older versions than the ones replicas hold, under a new epoch:
receivers take the new epoch's weights at once, whatever their version, and a
replica that still holds another epoch's weights counts as holding none. In `weightSync: async` a receiver
fetches in the background into host memory and the engine swaps at a
generation-iteration boundary (delayed parameter update); in `sync` the
rollout blocks until the new weights are loaded.

Two data paths (`workflow.weightTransport`): `grpc` streams each version from host
memory in chunks (any network, across clusters); `collective` keeps the version
on the trainer's device in a few buckets and broadcasts them to each replica's
engine ranks in a process group of their own (`collective.py`: gloo, NCCL, HCCL),
gRPC staying the control plane.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import torch

from . import collective as coll
from .proto import weights_pb2 as pb
from .proto import weights_pb2_grpc as pbg

log = logging.getLogger("rljob.weights")

CHUNK = 4 << 20
OPTIONS = [("grpc.max_send_message_length", 64 << 20),
           ("grpc.max_receive_message_length", 64 << 20),
           ("grpc.initial_reconnect_backoff_ms", 100),
           ("grpc.max_reconnect_backoff_ms", 1000)]


def _to_bytes(t: torch.Tensor) -> tuple[str, bytes]:
    t = t.detach().cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    if t.dtype == torch.bfloat16:
        return dtype, t.view(torch.int16).numpy().tobytes()
    return dtype, t.numpy().tobytes()


def _from_bytes(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.frombuffer(data, np.int16).copy()).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.frombuffer(data, np.dtype(dtype)).copy()).reshape(shape)


def new_epoch() -> int:
    """A fresh sender life's id (positive, fits an int64)."""
    return secrets.randbits(62) + 1


class _Published:
    """One version: host bytes per tensor (grpc), or device buckets (collective)."""

    def __init__(self, version: int, tensors: list[tuple[str, str, list[int], bytes]] = (),
                 slots: list[coll.Slot] = (), buckets: list[torch.Tensor] = ()):
        self.version = version
        self.tensors = list(tensors)
        self.slots, self.buckets = list(slots), list(buckets)
        self.total = (sum(len(t[3]) for t in self.tensors)
                      + sum(b.numel() for b in self.buckets))

    def items(self) -> Iterator[tuple[str, str, list[int], bytes]]:
        """Every tensor as (name, dtype, shape, bytes); a collective version's are
        copied to the host one by one, only when a gRPC receiver asks."""
        yield from self.tensors
        for name, t in coll.unpack(self.slots, self.buckets).items():
            dtype, data = _to_bytes(t)
            yield name, dtype, list(t.shape), data

    def plan(self, epoch: int) -> pb.BroadcastPlan:
        return pb.BroadcastPlan(
            version=self.version, epoch=epoch, buckets=[b.numel() for b in self.buckets],
            tensors=[pb.TensorSlot(name=s.name, dtype=s.dtype, shape=s.shape, bucket=s.bucket,
                                   offset=s.offset, nbytes=s.nbytes) for s in self.slots])


class _Group:
    """The sender's side of one replica's weight group: rank 0. Connecting and
    sending run in order on a thread of its own, so a slow or dead replica holds
    up nobody else; a failed collective drops the group (the replica joins anew)."""

    def __init__(self, request: pb.JoinRequest, timeout: float):
        self.replica, self.name = request.replica, request.group
        self.backend, self.timeout = request.backend, timeout
        self.group = None
        self.failed = False
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="rljob-weight-group")
        self._pool.submit(self._connect, request.store, request.world)

    def _connect(self, store: str, world: int) -> None:
        try:
            self.group, self._store = coll.new_group(self.backend, store, self.name, 0, world,
                                                     self.timeout)
            log.info("weight group %s: joined (%s, %d ranks)", self.name, self.backend, world)
        except Exception as exc:  # noqa: BLE001 - the replica went away: it joins again
            log.warning("weight group %s: could not join: %s", self.name, exc)
            self.failed = True

    def send(self, pub: _Published) -> None:
        self._pool.submit(self._send, pub)

    def _send(self, pub: _Published) -> None:
        if self.group is None:
            return
        try:
            for b in pub.buckets:
                coll.broadcast(self.group, b if self.backend != "gloo" else b.cpu())
            if pub.buckets and pub.buckets[0].is_cuda:
                torch.cuda.synchronize(pub.buckets[0].device)
        except Exception as exc:  # noqa: BLE001 - a replica died or stalled mid-transfer
            log.warning("weight group %s: broadcast of version %d failed: %s",
                        self.name, pub.version, exc)
            self.failed, self.group = True, None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class WeightSender(pbg.WeightServiceServicer):
    """Serves the latest version; `publish` replaces it (readers of the old one finish)."""

    def __init__(self, listen: str, epoch: int | None = None, transport: str = "grpc",
                 bucket_bytes: int = coll.BUCKET_BYTES, group_timeout: float = 600.0):
        self.epoch = epoch or new_epoch()
        self.transport = transport
        self.bucket_bytes, self.group_timeout = bucket_bytes, group_timeout
        self._groups: dict[str, _Group] = {}
        self._latest: _Published | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._replicas: dict[str, tuple[int, float]] = {}
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=OPTIONS)
        pbg.add_WeightServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(listen)
        if not self.port:
            raise RuntimeError(f"weight sender cannot listen on {listen}")
        self._server.start()

    @property
    def version(self) -> int:
        return self._latest.version if self._latest else -1

    def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Make `version` the one served: with the collective transport a copy of
        `state_dict` in buckets on its device, else its bytes in host memory."""
        if self.transport == "collective":
            pub = _Published(version, (), *coll.pack(state_dict, self.bucket_bytes))
        else:
            tensors = []
            for name, t in state_dict.items():
                dtype, data = _to_bytes(t)
                tensors.append((name, dtype, list(t.shape), data))
            pub = _Published(version, tensors)
        with self._cond:
            self._latest = pub
            self._cond.notify_all()

    def wait_replicas(self, version: int, timeout: float, fresh_seconds: float = 10.0) -> bool:
        """Wait until every live replica reports `version` or newer (or `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                replicas = self._fresh(fresh_seconds)
                if replicas and min(r.version for r in replicas) >= version:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))

    def stop(self, grace: float = 2.0) -> None:
        """Stop serving: waits for a version (Fetch, Status) end at once, transfers
        in progress get `grace` seconds."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            groups, self._groups = list(self._groups.values()), {}
        self._server.stop(grace).wait()
        for g in groups:
            g.close()

    # ---- RPCs ----
    def Latest(self, request, context):
        pub = self._latest
        return pb.VersionInfo(version=pub.version if pub else -1,
                              total_bytes=pub.total if pub else 0, epoch=self.epoch)

    def _await(self, request, context) -> _Published:
        """The latest version once it is ≥ request.min_version (of the sender's epoch;
        a receiver of another life's weights takes this life's at once)."""
        deadline = time.monotonic() + request.wait_seconds
        with self._cond:
            while self._latest is None or (request.epoch in (0, self.epoch)
                                           and self._latest.version < request.min_version):
                if self._closing:
                    context.abort(grpc.StatusCode.UNAVAILABLE,
                                  f"the weight sender stopped at version {self.version}")
                left = deadline - time.monotonic()
                if left <= 0:
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"version {request.min_version} not published within "
                                  f"{request.wait_seconds}s (latest {self.version})")
                self._cond.wait(min(left, 1.0))
            return self._latest

    def Fetch(self, request, context) -> Iterator[pb.WeightChunk]:
        pub = self._await(request, context)
        for name, dtype, shape, data in pub.items():
            for off in range(0, max(len(data), 1), CHUNK):
                first = off == 0
                yield pb.WeightChunk(version=pub.version, epoch=self.epoch,
                                     name=name if first else "",
                                     dtype=dtype if first else "", shape=shape if first else [],
                                     nbytes=len(data) if first else 0, data=data[off:off + CHUNK])

    def Join(self, request, context):
        if self.transport != "collective":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this trainer sends weights over gRPC (workflow.weightTransport "
                          f"{self.transport}): fetch them")
        group = _Group(request, self.group_timeout)
        with self._cond:
            old = self._groups.pop(request.replica, None)
            self._groups[request.replica] = group
        if old is not None:
            old.close()
        return pb.JoinAck()

    def Broadcast(self, request, context):
        pub = self._await(request, context)
        with self._cond:
            group = self._groups.get(request.replica)
        if group is None or group.name != request.group or group.failed:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"weight group {request.group} is not joined: join again")
        group.send(pub)
        return pub.plan(self.epoch)

    def Report(self, request, context):
        with self._cond:
            version = request.version if request.epoch == self.epoch else -1
            self._replicas[request.replica] = (version, time.monotonic())
            self._cond.notify_all()
        return pb.ReportAck()

    def _fresh(self, fresh_seconds: float) -> list[pb.ReplicaVersion]:
        now = time.monotonic()
        fresh = fresh_seconds or 1e9
        return [pb.ReplicaVersion(replica=r, version=v) for r, (v, t) in self._replicas.items()
                if now - t <= fresh]

    def Status(self, request, context):
        deadline = time.monotonic() + request.wait_seconds
        with self._cond:
            while request.wait and not self._closing:
                replicas = self._fresh(request.fresh_seconds)
                if (self.version >= request.wait_version and replicas
                        and min(r.version for r in replicas) >= request.wait_version):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            return pb.StatusResponse(version=self.version, epoch=self.epoch,
                                     replicas=self._fresh(request.fresh_seconds))


class WeightClient:
    """Talks to a WeightSender: versions, fetches, replica reports."""

    def __init__(self, address: str):
        self._channel = grpc.insecure_channel(address, options=OPTIONS)
        self._stub = pbg.WeightServiceStub(self._channel)
        self.address = address
        self.last_epoch = 0
        self.last_transfer_seconds = 0.0  # of the last fetch: first chunk to last

    def latest(self) -> int:
        return self.latest_info().version

    def latest_info(self) -> pb.VersionInfo:
        return self._stub.Latest(pb.LatestRequest(), timeout=30, wait_for_ready=True)

    def fetch(self, min_version: int = 0, wait: float = 600.0, epoch: int = 0
              ) -> tuple[int, dict[str, torch.Tensor]]:
        """The latest version once it is ≥ min_version, or at once if `epoch` (the one
        the caller holds; 0: none) is not the sender's. The epoch served is in
        `last_epoch` afterwards."""
        state: dict[str, torch.Tensor] = {}
        version = -1
        name = dtype = None
        shape: list[int] = []
        parts: list[bytes] = []
        request = pb.FetchRequest(min_version=min_version, wait_seconds=wait, epoch=epoch)
        first = None
        for chunk in self._stub.Fetch(request, timeout=wait + 600, wait_for_ready=True):
            first = first or time.monotonic()
            version, self.last_epoch = chunk.version, chunk.epoch
            if chunk.name:
                if name is not None:
                    state[name] = _from_bytes(dtype, shape, b"".join(parts))
                name, dtype, shape, parts = chunk.name, chunk.dtype, list(chunk.shape), []
            parts.append(chunk.data)
        if name is not None:
            state[name] = _from_bytes(dtype, shape, b"".join(parts))
        self.last_transfer_seconds = time.monotonic() - first if first else 0.0
        return version, state

    def join(self, replica: str, group: str, store: str, world: int, backend: str) -> None:
        self._stub.Join(pb.JoinRequest(replica=replica, group=group, store=store, world=world,
                                       backend=backend), timeout=30, wait_for_ready=True)

    def broadcast(self, replica: str, group: str, min_version: int = 0, wait: float = 600.0,
                  epoch: int = 0) -> pb.BroadcastPlan:
        """As `fetch`, over the collective path: the version's plan; the sender then
        broadcasts its buckets in `group`."""
        request = pb.BroadcastRequest(replica=replica, group=group, min_version=min_version,
                                      wait_seconds=wait, epoch=epoch)
        plan = self._stub.Broadcast(request, timeout=wait + 30, wait_for_ready=True)
        self.last_epoch = plan.epoch
        return plan

    def report(self, replica: str, version: int, epoch: int = 0) -> None:
        self._stub.Report(pb.ReplicaVersion(replica=replica, version=version, epoch=epoch),
                          timeout=10, wait_for_ready=True)

    def status(self, fresh_seconds: float = 10.0, wait_version: int | None = None,
               wait: float = 0.0) -> pb.StatusResponse:
        """Versions now; with wait_version, once trainer and replicas reach it (or `wait` s)."""
        req = pb.StatusRequest(fresh_seconds=fresh_seconds, wait=wait_version is not None,
                               wait_version=wait_version or 0, wait_seconds=wait)
        return self._stub.Status(req, timeout=wait + 10, wait_for_ready=True)

    def close(self) -> None:
        self._channel.close()


class WeightReceiver:
    """A rollout replica's side. A background thread long-polls the sender for the
    next version, receives it (gRPC into host memory, or a broadcast into device
    buffers) and swaps it into the engine under the engine lock, i.e. between two
    generations (AsyncFlow's delayed parameter update). An engine with processes
    of its own (vLLM) receives a broadcast in those processes, while its requests
    in flight drain. With `weightSync: sync` the rollout loop also refuses to
    generate with an older version than the newest published (`latest` +
    `wait_version`)."""

    def __init__(self, address: str, replica: str, mode: str = "async",
                 transport: str = "grpc", backend: str = "gloo"):
        self.client = WeightClient(address)
        self.replica = replica
        self.mode = mode
        self.transport, self.backend = transport, backend
        self.version = -1
        self.epoch = 0  # the sender life whose weights the engine holds
        self.lock = threading.Lock()  # held by the rollout while it generates
        self.swapped = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swap_seconds: list[tuple[float, float, int]] = []  # (start, end, version)
        self.drain_seconds: list[float] = []  # of each swap: waiting for generations in flight
        self.transfer_seconds: list[float] = []  # of each update: moving the bytes
        self._store = self._group = self._group_name = None  # the collective path's

    def _update(self, engine, min_version: int, wait: float) -> int:
        """Receive the first version ≥ min_version (or any of a new sender life) and
        swap it in; grpc.RpcError when none comes within `wait` s."""
        if self.transport == "collective":
            return self._update_collective(engine, min_version, wait)
        version, state = self.client.fetch(min_version, wait, self.epoch)
        epoch = self.client.last_epoch
        self._swap(engine, version, epoch, self.client.last_transfer_seconds,
                   lambda: engine.load_weights(state, version, epoch))
        return version

    def _swap(self, engine, version: int, epoch: int, transfer: float | None, load) -> None:
        t0 = time.time()
        if epoch != self.epoch and self.epoch:
            log.info("the trainer restarted: taking version %d of its new epoch "
                     "(held %d)", version, self.version)
        with self.lock:  # waits for the generation in progress to finish
            load()
            self.version, self.epoch = version, epoch
        self.swap_seconds.append((t0, time.time(), version))
        self.drain_seconds.append(engine.drain_seconds)
        self.transfer_seconds.append(engine.transfer_seconds if transfer is None else transfer)
        with self.swapped:
            self.swapped.notify_all()

    def _join(self, engine) -> None:
        """A new weight group with the sender: rank 0 the sender, then the engine's
        ranks (this process's one when the engine has none of its own)."""
        if self._store is None:
            self._store, self._store_address = coll.open_store(self.client.address)
        name = f"{self.replica}.{secrets.token_hex(4)}"
        ranks = engine.weight_ranks or 1
        log.info("joining weight group %s: store at %s, %d ranks", name, self._store_address,
                 1 + ranks)
        self.client.join(self.replica, name, self._store_address, 1 + ranks, self.backend)
        if engine.weight_ranks:
            engine.join_weight_group(self.backend, self._store_address, name, 1, 1 + ranks)
        else:
            self._group, self._group_store = coll.new_group(
                self.backend, self._store_address, name, 1, 1 + ranks)
        self._group_name = name
        log.info("joined weight group %s (%s, %d ranks)", name, self.backend, 1 + ranks)

    def _update_collective(self, engine, min_version: int, wait: float) -> int:
        if self._group_name is None:
            self._join(engine)
        plan = self.client.broadcast(self.replica, self._group_name, min_version, wait,
                                     self.epoch)
        slots = [coll.Slot(t.name, t.dtype, tuple(t.shape), t.bucket, t.offset, t.nbytes)
                 for t in plan.tensors]
        sizes, version, epoch = list(plan.buckets), plan.version, plan.epoch
        try:
            if engine.weight_ranks:  # its processes receive, while its requests drain
                self._swap(engine, version, epoch, None,
                           lambda: engine.load_broadcast(sizes, slots, version, epoch))
            else:  # received while generating goes on, swapped between generations
                t0 = time.monotonic()
                state = coll.unpack(slots, coll.receive(self._group, sizes,
                                                        engine.weight_device()))
                self._swap(engine, version, epoch, time.monotonic() - t0,
                           lambda: engine.load_weights(state, version, epoch))
        except RuntimeError:  # the group broke (the sender died, or a transfer stalled)
            self._group = self._group_name = None
            raise
        return version

    def load_latest(self, engine, min_version: int = 0, wait: float = 600.0) -> int:
        """Block until a version ≥ min_version is loaded (a replica joining the run)."""
        version = self._update(engine, min_version, wait)
        self.client.report(self.replica, version, self.epoch)
        return version

    def start_background(self, engine, heartbeat: float = 2.0) -> None:
        def report(version: int) -> None:
            try:
                self.client.report(self.replica, version, self.epoch)
            except (grpc.RpcError, ValueError):  # ValueError: stop() closed the channel
                pass  # the trainer is away (restarting): the next heartbeat says it again

        def run():
            while not self._stop.is_set():
                try:
                    self._update(engine, self.version + 1, heartbeat)
                except (grpc.RpcError, ValueError, RuntimeError) as exc:
                    # ValueError: stop() closed the channel; RuntimeError: a weight
                    # group broke (joined anew on the next round)
                    if self._stop.is_set():
                        return  # stop() cancelled the fetch
                    code = exc.code() if isinstance(exc, grpc.RpcError) else None
                    if code == grpc.StatusCode.FAILED_PRECONDITION:
                        self._group = self._group_name = None  # a new sender: join it
                    elif code not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                      grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.CANCELLED):  # the sender stopping
                        log.error("fetching weights failed (retrying): %s", exc)
                        self._stop.wait(1.0)
                    report(self.version)  # no new version yet: say we are alive
                    continue
                if not self._stop.is_set():
                    report(self.version)

        self._thread = threading.Thread(target=run, name="rljob-weight-receiver", daemon=True)
        self._thread.start()

    def latest(self) -> tuple[int, int]:
        """The newest (version, epoch) the sender has published; (-1, 0) while it is
        unreachable (a restarting trainer: generate with what we hold)."""
        try:
            info = self.client.latest_info()
            return info.version, info.epoch
        except grpc.RpcError:
            return -1, 0

    def holds(self, version: int, epoch: int = 0) -> bool:
        """Whether the engine holds `version` or newer (of `epoch`, when given)."""
        return self.version >= version and (not epoch or self.epoch == epoch)

    def wait_version(self, version: int, timeout: float = 600.0, epoch: int = 0) -> None:
        """Block until the engine holds `version` or newer of `epoch` (or `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self.swapped:
            while not self.holds(version, epoch) and time.monotonic() < deadline:
                self.swapped.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self.client.close()  # cancels the fetch in flight: the thread ends at once
        if self._thread:
            self._thread.join(timeout=5)
