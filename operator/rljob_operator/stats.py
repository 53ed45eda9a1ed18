"""Progress of a running job, read from its TransferQueue controller's Stats RPC."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg

ADDRESS_ANNOTATION = "rljob.dev/transferqueue-address"


@dataclass(frozen=True)
class JobStats:
    step: int
    gen_seconds: float
    train_seconds: float
    staleness_mean: float
    staleness_max: int
    tokens_per_second: float
    samples_per_second: float
    reward_mean: float
    busy: dict[str, int]  # rollout consumer (pod name) -> rows it holds under lease

    def progress(self, now_iso: str) -> dict:
        return {
            "step": self.step,
            "stalenessMean": round(self.staleness_mean, 4),
            "stalenessMax": self.staleness_max,
            "rewardMean": round(self.reward_mean, 4),
            "tokensPerSecond": round(self.tokens_per_second, 1),
            "samplesPerSecond": round(self.samples_per_second, 3),
            "genSeconds": round(self.gen_seconds, 3),
            "trainSeconds": round(self.train_seconds, 3),
            "lastUpdatedTime": now_iso,
        }


class StatsClient:
    """One channel per address, reused across polls."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.Channel] = {}

    def fetch(self, address: str, timeout: float = 2.0) -> JobStats:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.insecure_channel(address)
        resp = pbg.TransferQueueControllerStub(channel).Stats(pb.StatsRequest(), timeout=timeout)
        m = resp.metrics
        busy: dict[str, int] = {}
        for c in resp.consumers:
            if c.task == "rollout":
                busy[c.consumer] = busy.get(c.consumer, 0) + c.claimed
        return JobStats(m.step, m.gen_seconds, m.train_seconds, m.staleness_mean,
                        m.staleness_max, m.tokens_per_second, m.samples_per_second,
                        m.reward_mean, busy)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
