"""Progress of a running job, read from its TransferQueue controller's Stats RPC."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from rljob.infra import auth
from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg
from rljob.transferqueue.wire import CLIENT_OPTIONS

ADDRESS_ANNOTATION = "rljob.dev/transferqueue-address"


# status.progress: its key, the JobMetrics field (transferqueue.proto), the digits kept
PROGRESS = (("step", "step", None), ("stalenessMean", "staleness_mean", 4),
            ("stalenessMax", "staleness_max", None), ("rewardMean", "reward_mean", 4),
            ("tokensPerSecond", "tokens_per_second", 1),
            ("samplesPerSecond", "samples_per_second", 3), ("genSeconds", "gen_seconds", 3),
            ("trainSeconds", "train_seconds", 3))


@dataclass(frozen=True)
class JobStats:
    """The job's latest step figures as the controller keeps them (the proto's
    JobMetrics: `stats.step`, `stats.gen_seconds`, ...) and the rows each rollout
    pod holds under lease."""
    metrics: pb.JobMetrics
    busy: dict[str, int]  # rollout consumer (pod name) -> rows it holds under lease

    def __getattr__(self, name: str):
        if name == "metrics":  # not set yet (copying): not a field of JobMetrics
            raise AttributeError(name)
        return getattr(self.metrics, name)

    def progress(self, now_iso: str) -> dict:
        out = {}
        for key, field, digits in PROGRESS:
            value = getattr(self.metrics, field)
            out[key] = value if digits is None else round(value, digits)
        return {**out, "lastUpdatedTime": now_iso}


class StatsClient:
    """One channel per address, reused across polls. Its reconnect back-off is the
    job's own clients' (at most 1 s): with gRPC's default (up to 120 s) a restarted
    TransferQueue pod left the job's status a step count 20 s and more behind."""

    def __init__(self) -> None:
        self._channels: dict[tuple[str, str | None, str | None], grpc.Channel] = {}

    def fetch(self, address: str, token: str | None = None, ca: str | None = None,
              timeout: float = 2.0) -> JobStats:
        """The job's stats from its controller at `address`, asked with the job's
        `token` (infra/auth.py: its controller answers no one else), over TLS that
        trusts the job's `ca` alone (none: plain text)."""
        channel = self._channels.get((address, token, ca))
        if channel is None:
            channel = auth.channel(address, CLIENT_OPTIONS, token or "", (ca or "").encode())
            self._channels[(address, token, ca)] = channel
        resp = pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=timeout)
        busy: dict[str, int] = {}
        for c in resp.consumers:
            if c.task == "rollout":
                busy[c.consumer] = busy.get(c.consumer, 0) + c.claimed
        return JobStats(resp.metrics, busy)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
