"""`WeightClient`: a WeightSender's control plane and gRPC data path as its callers
see it (versions, fetches, joins, replica reports, waiting for a version). It
imports no tensor library, so the driver, which only asks for versions, starts
without one; a fetch's tensors are assembled by codec.TensorAssembly."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..infra import auth
from .codec import OPTIONS, TensorAssembly, split_chunk
from .proto import weights_pb2 as pb
from .proto import weights_pb2_grpc as pbg

if TYPE_CHECKING:
    import torch


class WeightClient:
    """Talks to a WeightSender: versions, fetches, replica reports."""

    def __init__(self, address: str):
        self._channel = auth.channel(address, OPTIONS)  # the job's token
        self._stub = pbg.WeightServiceStub(self._channel)
        # Fetch's chunks as they arrive (serialized): `split_chunk` reads each one's
        # data in place
        self._fetch = self._channel.unary_stream(
            f"/{pb.DESCRIPTOR.services_by_name['WeightService'].full_name}/Fetch",
            request_serializer=pb.FetchRequest.SerializeToString)
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
        name, tensor = None, None
        request = pb.FetchRequest(min_version=min_version, wait_seconds=wait, epoch=epoch)
        first = None
        for raw in self._fetch(request, timeout=wait + 600, wait_for_ready=True):
            first = first or time.monotonic()
            chunk, data = split_chunk(raw)
            version, self.last_epoch = chunk.version, chunk.epoch
            if chunk.name:
                if name is not None:
                    state[name] = tensor.tensor()
                name = chunk.name
                tensor = TensorAssembly(chunk.dtype, list(chunk.shape), chunk.nbytes)
            tensor.add(data)
            if chunk.along:  # small tensors, each whole, after this one (whole too)
                state[name] = tensor.tensor()
                for whole in chunk.along:
                    small = TensorAssembly(whole.dtype, list(whole.shape), whole.nbytes)
                    small.add(whole.data)
                    state[whole.name] = small.tensor()
                name = tensor = None
        if name is not None:
            state[name] = tensor.tensor()
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
