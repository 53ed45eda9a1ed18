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
    def __init__(self, version: int, tensors: list[tuple[str, str, list[int], bytes]]):
        self.version = version
        self.tensors = tensors
        self.total = sum(len(t[3]) for t in tensors)


class WeightSender(pbg.WeightServiceServicer):
    """Serves the latest version; `publish` replaces it (readers of the old one finish)."""

    def __init__(self, listen: str, epoch: int | None = None):
        self.epoch = epoch or new_epoch()
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
        tensors = []
        for name, t in state_dict.items():
            dtype, data = _to_bytes(t)
            tensors.append((name, dtype, list(t.shape), data))
        with self._cond:
            self._latest = _Published(version, tensors)
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
        self._server.stop(grace).wait()

    # ---- RPCs ----
    def Latest(self, request, context):
        pub = self._latest
        return pb.VersionInfo(version=pub.version if pub else -1,
                              total_bytes=pub.total if pub else 0, epoch=self.epoch)

    def Fetch(self, request, context) -> Iterator[pb.WeightChunk]:
        deadline = time.monotonic() + request.wait_seconds
        with self._cond:
            # a receiver of another life's weights takes this life's at once
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
            pub = self._latest
        for name, dtype, shape, data in pub.tensors:
            for off in range(0, max(len(data), 1), CHUNK):
                first = off == 0
                yield pb.WeightChunk(version=pub.version, epoch=self.epoch,
                                     name=name if first else "",
                                     dtype=dtype if first else "", shape=shape if first else [],
                                     nbytes=len(data) if first else 0, data=data[off:off + CHUNK])

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
        self.last_epoch = 0

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
        for chunk in self._stub.Fetch(request, timeout=wait + 600, wait_for_ready=True):
            version, self.last_epoch = chunk.version, chunk.epoch
            if chunk.name:
                if name is not None:
                    state[name] = _from_bytes(dtype, shape, b"".join(parts))
                name, dtype, shape, parts = chunk.name, chunk.dtype, list(chunk.shape), []
            parts.append(chunk.data)
        if name is not None:
            state[name] = _from_bytes(dtype, shape, b"".join(parts))
        return version, state

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
    next version, fetches it into host memory and swaps it into the engine under
    the engine lock, i.e. between two generations (AsyncFlow's delayed parameter
    update). With `weightSync: sync` the rollout loop also refuses to generate
    with an older version than the newest published (`latest` + `wait_version`)."""

    def __init__(self, address: str, replica: str, mode: str = "async"):
        self.client = WeightClient(address)
        self.replica = replica
        self.mode = mode
        self.version = -1
        self.epoch = 0  # the sender life whose weights the engine holds
        self.lock = threading.Lock()  # held by the rollout while it generates
        self.swapped = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swap_seconds: list[tuple[float, float, int]] = []  # (start, end, version)
        self.drain_seconds: list[float] = []  # of each swap: waiting for generations in flight

    def load_latest(self, engine, min_version: int = 0, wait: float = 600.0) -> int:
        """Block until a version ≥ min_version is loaded (a replica joining the run)."""
        version, state = self.client.fetch(min_version, wait)
        with self.lock:
            engine.load_weights(state, version, self.client.last_epoch)
            self.version, self.epoch = version, self.client.last_epoch
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
                    version, state = self.client.fetch(self.version + 1, heartbeat,
                                                       self.epoch)
                except (grpc.RpcError, ValueError) as exc:  # ValueError: channel closed
                    if self._stop.is_set():
                        return  # stop() cancelled the fetch
                    code = exc.code() if isinstance(exc, grpc.RpcError) else None
                    if code not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.UNAVAILABLE):
                        log.error("fetching weights failed (retrying): %s", exc)
                        self._stop.wait(1.0)
                    report(self.version)  # no new version yet: say we are alive
                    continue
                t0 = time.time()
                epoch = self.client.last_epoch
                if epoch != self.epoch and self.epoch:
                    log.info("the trainer restarted: taking version %d of its new epoch "
                             "(held %d)", version, self.version)
                with self.lock:  # waits for the generation in progress to finish
                    engine.load_weights(state, version, epoch)
                    self.version, self.epoch = version, epoch
                self.swap_seconds.append((t0, time.time(), version))
                self.drain_seconds.append(engine.drain_seconds)
                with self.swapped:
                    self.swapped.notify_all()
                if not self._stop.is_set():
                    report(version)

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
