"""Versioned weight sync: WeightSender (trainer rank 0) → WeightReceiver (rollouts).

The sender serves the latest published version over gRPC streaming, in
chunks, tensors as raw buffers (no pickling). Receivers fetch a version, and
report what they loaded, so the driver can release on-policy prompts only once
every live replica holds the new weights. In `weightSync: async` a receiver
fetches in the background into host memory and the engine swaps at a
generation-iteration boundary (delayed parameter update); in `sync` the
rollout blocks until the new weights are loaded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import torch

from .proto import weights_pb2 as pb
from .proto import weights_pb2_grpc as pbg

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


class _Published:
    def __init__(self, version: int, tensors: list[tuple[str, str, list[int], bytes]]):
        self.version = version
        self.tensors = tensors
        self.total = sum(len(t[3]) for t in tensors)


class WeightSender(pbg.WeightServiceServicer):
    """Serves the latest version; `publish` replaces it (readers of the old one finish)."""

    def __init__(self, listen: str):
        self._latest: _Published | None = None
        self._cond = threading.Condition()
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

    def stop(self, grace: float = 2.0) -> None:
        self._server.stop(grace)

    # ---- RPCs ----
    def Latest(self, request, context):
        pub = self._latest
        return pb.VersionInfo(version=pub.version if pub else -1, total_bytes=pub.total if pub else 0)

    def Fetch(self, request, context) -> Iterator[pb.WeightChunk]:
        deadline = time.monotonic() + request.wait_seconds
        with self._cond:
            while self._latest is None or self._latest.version < request.min_version:
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
                yield pb.WeightChunk(version=pub.version, name=name if first else "",
                                     dtype=dtype if first else "", shape=shape if first else [],
                                     nbytes=len(data) if first else 0, data=data[off:off + CHUNK])

    def Report(self, request, context):
        self._replicas[request.replica] = (request.version, time.monotonic())
        return pb.ReportAck()

    def Status(self, request, context):
        now = time.monotonic()
        fresh = request.fresh_seconds or 1e9
        return pb.StatusResponse(version=self.version, replicas=[
            pb.ReplicaVersion(replica=r, version=v) for r, (v, t) in self._replicas.items()
            if now - t <= fresh])


class WeightClient:
    """Talks to a WeightSender: versions, fetches, replica reports."""

    def __init__(self, address: str):
        self._channel = grpc.insecure_channel(address, options=OPTIONS)
        self._stub = pbg.WeightServiceStub(self._channel)

    def latest(self) -> int:
        return self._stub.Latest(pb.LatestRequest(), timeout=30, wait_for_ready=True).version

    def fetch(self, min_version: int = 0, wait: float = 600.0) -> tuple[int, dict[str, torch.Tensor]]:
        state: dict[str, torch.Tensor] = {}
        version = -1
        name = dtype = None
        shape: list[int] = []
        parts: list[bytes] = []
        for chunk in self._stub.Fetch(pb.FetchRequest(min_version=min_version, wait_seconds=wait),
                                      timeout=wait + 600, wait_for_ready=True):
            version = chunk.version
            if chunk.name:
                if name is not None:
                    state[name] = _from_bytes(dtype, shape, b"".join(parts))
                name, dtype, shape, parts = chunk.name, chunk.dtype, list(chunk.shape), []
            parts.append(chunk.data)
        if name is not None:
            state[name] = _from_bytes(dtype, shape, b"".join(parts))
        return version, state

    def report(self, replica: str, version: int) -> None:
        self._stub.Report(pb.ReplicaVersion(replica=replica, version=version), timeout=10,
                          wait_for_ready=True)

    def status(self, fresh_seconds: float = 10.0) -> pb.StatusResponse:
        return self._stub.Status(pb.StatusRequest(fresh_seconds=fresh_seconds), timeout=10,
                                 wait_for_ready=True)

    def close(self) -> None:
        self._channel.close()


class WeightReceiver:
    """A rollout replica's side: loads versions into its engine, sync or async."""

    def __init__(self, address: str, replica: str, mode: str = "async"):
        self.client = WeightClient(address)
        self.replica = replica
        self.mode = mode
        self.version = -1
        self._staged: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load_latest(self, engine, min_version: int = 0, wait: float = 600.0) -> int:
        """Block until a version ≥ min_version is loaded (joining replicas, sync mode)."""
        version, state = self.client.fetch(min_version, wait)
        engine.load_weights(state, version)
        self.version = version
        self.client.report(self.replica, version)
        return version

    def start_background(self, poll: float = 0.2) -> None:
        """Async mode: keep fetching newer versions into host memory."""
        def run():
            while not self._stop.is_set():
                try:
                    latest = self.client.latest()
                    staged = self._staged[0] if self._staged else self.version
                    if latest > staged:
                        got = self.client.fetch(latest, 30)
                        with self._lock:
                            self._staged = got
                    self.client.report(self.replica, self.version)
                except grpc.RpcError:
                    pass  # the trainer restarts or is gone: try again
                self._stop.wait(poll)

        self._thread = threading.Thread(target=run, name="rljob-weight-receiver", daemon=True)
        self._thread.start()

    def swap_if_ready(self, engine) -> bool:
        """At an iteration boundary: load staged weights, if newer. True if swapped."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is None or staged[0] <= self.version:
            return False
        engine.load_weights(staged[1], staged[0])
        self.version = staged[0]
        self.client.report(self.replica, self.version)
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        self.client.close()
