"""The trainer's side (rank 0): `WeightSender` serves each published version to the
rollout replicas, over gRPC in chunks or broadcast in a weight group of its own per
replica (`collective.py`), and tracks what every replica reports it loaded."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import torch

from ..infra import auth, tls
from . import collective as coll
from .codec import OPTIONS, host_bytes, new_epoch, version_messages
from .proto import weights_pb2 as pb
from .proto import weights_pb2_grpc as pbg

log = logging.getLogger("rljob.weights")


class _Published:
    """One version, in host memory: bytes per tensor (grpc), or buckets (collective)
    that each replica's group gets staged on `device` one at a time."""

    def __init__(self, version: int, tensors: list[tuple[str, str, list[int], memoryview]] = (),
                 slots: list[coll.Slot] = (), buckets: list[torch.Tensor] = (),
                 device: torch.device = torch.device("cpu")):
        self.version = version
        self.tensors = list(tensors)
        self.slots, self.buckets = list(slots), list(buckets)
        self.device = device
        self.total = (sum(len(t[3]) for t in self.tensors)
                      + sum(b.numel() for b in self.buckets))

    def items(self) -> Iterator[tuple[str, str, list[int], memoryview]]:
        """Every tensor as (name, dtype, shape, bytes); a collective version's are
        copied to the host one by one, only when a gRPC receiver asks."""
        yield from self.tensors
        for name, t in coll.unpack(self.slots, self.buckets).items():
            dtype, data = host_bytes(t)
            yield name, dtype, list(t.shape), data

    def after(self, base: _Published) -> _Published:
        """This version with `base` (the weights under its adapter) first: a receiver
        that holds no base of this sender yet gets both in one transfer."""
        shift = len(base.buckets)
        slots = [dataclasses.replace(s, bucket=s.bucket + shift) for s in self.slots]
        return _Published(self.version, base.tensors + self.tensors, base.slots + slots,
                          base.buckets + self.buckets, self.device)

    def plan(self, epoch: int) -> pb.BroadcastPlan:
        return pb.BroadcastPlan(
            version=self.version, epoch=epoch, buckets=[b.numel() for b in self.buckets],
            tensors=[pb.TensorSlot(name=s.name, dtype=s.dtype, shape=s.shape, bucket=s.bucket,
                                   offset=s.offset, nbytes=s.nbytes) for s in self.slots])


class _Group:
    """The sender's side of one replica's weight group: rank 0. Connecting and
    sending run in order on a thread of its own, so a slow or dead replica holds
    up nobody else; a failed collective drops the group (the replica joins anew)."""

    def __init__(self, request: pb.JoinRequest, timeout: float, token: str | None):
        self.replica, self.name = request.replica, request.group
        self.prefix = coll.store_prefix(self.name, token)  # only the job's ranks meet there
        self.backend, self.timeout = request.backend, timeout
        self.group = None
        self.failed = False
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="rljob-weight-group")
        self._pool.submit(self._connect, request.store, request.world)

    def _connect(self, store: str, world: int) -> None:
        try:
            self.group, self._store = coll.new_group(self.backend, store, self.prefix, 0, world,
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
                # NCCL/HCCL send from the device: one bucket there at a time
                coll.broadcast(self.group, b if self.backend == "gloo"
                               else b.to(pub.device, non_blocking=True))
            if pub.device.type == "cuda":
                torch.cuda.synchronize(pub.device)
        except Exception as exc:  # noqa: BLE001 - a replica died or stalled mid-transfer
            log.warning("weight group %s: broadcast of version %d failed: %s",
                        self.name, pub.version, exc)
            self.failed, self.group = True, None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Handlers:
    """What the generated registration hands a server: the service's name and its
    methods' handlers."""

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, dict(handlers)


def _add_to_server(servicer: WeightSender, server: grpc.Server) -> None:
    """The service's methods as generated, but Fetch's answers are sent as they are:
    WeightChunks serialized already (`chunk_bytes`)."""
    got = _Handlers()
    pbg.add_WeightServiceServicer_to_server(servicer, got)
    got.handlers["Fetch"] = grpc.unary_stream_rpc_method_handler(
        servicer.Fetch, request_deserializer=pb.FetchRequest.FromString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(got.service,
                                                                          got.handlers),))
    server.add_registered_method_handlers(got.service, got.handlers)


class WeightSender(pbg.WeightServiceServicer):
    """Serves the latest version; `publish` replaces it (readers of the old one finish)."""

    def __init__(self, listen: str, epoch: int | None = None, transport: str = "grpc",
                 bucket_bytes: int = coll.BUCKET_BYTES, group_timeout: float = 600.0,
                 token: str | None = None):
        self.epoch = epoch or new_epoch()
        self.transport = transport
        self.bucket_bytes, self.group_timeout = bucket_bytes, group_timeout
        self._groups: dict[str, _Group] = {}
        self._latest: _Published | None = None
        self._base: _Published | None = None  # model.lora: the weights under the adapter
        self._cond = threading.Condition()
        self._closing = False
        self._replicas: dict[str, tuple[int, float]] = {}
        # only the job's callers (its token, else this process's), on gRPC and in the groups
        self._token = auth.token_from_env(token)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=OPTIONS,
                                   interceptors=auth.server_interceptors(self._token))
        _add_to_server(self, self._server)
        self.port = tls.add_port(self._server, listen)  # the job's certificate, if any
        if not self.port:
            raise RuntimeError(f"weight sender cannot listen on {listen}")
        self._server.start()

    @property
    def version(self) -> int:
        return self._latest.version if self._latest else -1

    def publish(self, version: int, tensors, base=None) -> None:
        """Make `version` the one served: a host copy of `tensors` (a dict, or (name,
        tensor) pairs copied one at a time as they come, e.g. `Policy.hf_tensors`):
        buckets with the collective transport, bytes per tensor with grpc. `base`
        (model.lora's adapter-only sync: `tensors` is the adapter alone, `base` the
        weights under it, `Policy.base_tensors`) is kept for this sender's life and
        sent before the version to every receiver that does not hold it: one that
        holds no version of this epoch (new, restarted, or of a dead trainer life)."""
        pub = self._copy(version, tensors)
        kept = self._copy(version, base) if base is not None else None
        with self._cond:
            if kept is not None:
                self._base = kept
            self._latest = pub
            self._cond.notify_all()

    def _copy(self, version: int, tensors) -> _Published:
        items = iter(tensors.items() if isinstance(tensors, dict) else tensors)
        if self.transport == "collective":
            first = next(items, None)
            device = first[1].device if first else torch.device("cpu")
            chained = itertools.chain([first] if first else [], items)
            return _Published(version, (), *coll.pack(chained, self.bucket_bytes),
                              device=device)
        host = []
        for name, t in items:
            dtype, data = host_bytes(t)
            host.append((name, dtype, list(t.shape), data))
        return _Published(version, host)

    def wait_replicas(self, version: int, timeout: float, fresh_seconds: float = 10.0,
                      live: bool = False) -> bool:
        """Wait until every live replica reports `version` or newer (or `timeout` s);
        with `live`, not at all while no replica is live (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                replicas = self._fresh(fresh_seconds)
                if replicas and min(r.version for r in replicas) >= version:
                    return True
                if live and not replicas:
                    return False
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
            if self._base is not None and request.epoch != self.epoch:
                return self._latest.after(self._base)  # it holds none of this life's base
            return self._latest

    def Fetch(self, request, context) -> Iterator[bytes]:
        """The version as WeightChunks, each already serialized (`chunk_bytes`: a
        chunk's bytes go from the host copy into the message once)."""
        pub = self._await(request, context)
        yield from version_messages(pub.version, self.epoch, pub.items())

    def Join(self, request, context):
        if self.transport != "collective":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this trainer sends weights over gRPC (workflow.weightTransport "
                          f"{self.transport}): fetch them")
        group = _Group(request, self.group_timeout, self._token)
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
