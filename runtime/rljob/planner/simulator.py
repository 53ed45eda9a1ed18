"""Discrete-event simulation of the RL pipeline: sync, periodic and async(k).

Entities: rollout replicas (each decodes up to `slots` samples at once; a
sample's generation time is drawn from a distribution, long tails included),
one trainer (micro-batches in order, then the optimizer step), weight sync
(after each step; `sync` blocks generation, `async` overlaps it and only the
swap at an iteration boundary costs time).

Modes, as the runtime defines them (version v = optimizer steps behind the
weights that produced a sample; the trainer at step t wants samples of step t):
- sync: step t's prompts are released once weights v = t are on every replica;
  the trainer starts step t when all its samples exist.
- periodic: same release rule; the trainer consumes step t's samples as they
  stream in, one micro-batch at a time (staleness stays 0).
- async(k): step s's prompts are released once the trainer has completed at
  least s − k steps (and replicas hold weights v ≥ s − k); the trainer streams.
`streaming=False` makes periodic/async wait for whole steps (an ablation).

Outputs: throughput, per-step time, bubble ratio (idle share of replica slots
and trainer time) and the spans for a Gantt chart.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..timeline import Span
from ..timeline import plot_gantt as _plot_panels


@dataclass(frozen=True)
class PipelineConfig:
    mode: str = "sync"  # sync | periodic | async
    max_staleness: int = 1
    streaming: bool = True
    steps: int = 20
    samples_per_step: int = 64
    micro_batch: int = 8
    replicas: int = 2
    slots: int = 16  # samples one replica decodes at once
    gen_mean: float = 1.0  # seconds per sample
    gen_sigma: float = 0.0  # log-normal sigma of a sample's generation time (0 = fixed)
    gen_max_factor: float = 8.0  # cap: no sample takes more than this × mean
    train_per_sample: float = 0.01  # trainer seconds per sample
    optimizer_seconds: float = 0.0
    weight_sync_seconds: float = 0.0
    weight_sync: str = "sync"  # sync: generation waits for the transfer; async: overlapped
    swap_seconds: float = 0.0  # async weight sync: pause to swap at an iteration boundary
    replica_npus: int = 1  # devices per replica and of the trainer: bubbles are NPU-weighted
    trainer_npus: int = 1
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ("sync", "periodic", "async"):
            raise ValueError(f"mode must be sync, periodic or async, not {self.mode!r}")
        if self.samples_per_step % self.micro_batch:
            raise ValueError("micro_batch must divide samples_per_step")

    @property
    def train_seconds(self) -> float:
        """Ttrain of one step."""
        return self.samples_per_step * self.train_per_sample + self.optimizer_seconds


@dataclass
class SimResult:
    config: PipelineConfig
    makespan: float
    samples: int
    spans: list[Span] = field(default_factory=list)
    step_end: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    bubble_ratio: float = 0.0
    slot_utilization: float = 0.0  # busy share of the replicas' decode slots

    @property
    def throughput(self) -> float:
        return self.samples / self.makespan

    @property
    def step_seconds(self) -> float:
        """Steady-state seconds per step (the first step's pipeline fill excluded)."""
        if len(self.step_end) > 2:
            return (self.step_end[-1] - self.step_end[0]) / (len(self.step_end) - 1)
        return self.makespan / max(len(self.step_end), 1)


def _durations(cfg: PipelineConfig) -> Callable[[], float]:
    rng = random.Random(cfg.seed)
    if cfg.gen_sigma <= 0:
        return lambda: cfg.gen_mean
    mu = math.log(cfg.gen_mean) - cfg.gen_sigma ** 2 / 2  # mean stays gen_mean
    cap = cfg.gen_max_factor * cfg.gen_mean
    return lambda: min(cap, rng.lognormvariate(mu, cfg.gen_sigma))


def simulate(cfg: PipelineConfig) -> SimResult:
    draw = _durations(cfg)
    n, m = cfg.samples_per_step, cfg.micro_batch
    events: list[tuple[float, int, str, tuple]] = []
    seq = 0

    def at(t: float, kind: str, *data) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, data))
        seq += 1

    result = SimResult(cfg, 0.0, n * cfg.steps)
    pending: deque[tuple[int, int]] = deque()  # (step, version) of released, unstarted samples
    free = [cfg.slots] * cfg.replicas
    busy_since: list[float | None] = [None] * cfg.replicas
    active = [0] * cfg.replicas
    rollout_version = 0  # weights on the replicas
    blocked_until = 0.0  # weight sync in progress (sync transfer) blocks generation
    ready: dict[int, int] = {}  # step -> generated samples not yet trained
    trainer_busy = False
    trained_step = 0  # optimizer steps done
    next_mb = 0  # micro-batches of the current step done
    released = 0  # steps whose prompts are out
    slot_busy_time = 0.0

    def may_release(s: int) -> bool:
        if cfg.mode == "async":
            return trained_step >= s - cfg.max_staleness and rollout_version >= s - cfg.max_staleness
        return trained_step >= s and rollout_version >= s

    def release(now: float) -> None:
        nonlocal released
        while released < cfg.steps and may_release(released):
            for _ in range(n):
                pending.append((released, rollout_version))
            released += 1
        start_samples(now)

    unblock_at = [None]  # the pending "unblock" event, if any

    def start_samples(now: float) -> None:
        nonlocal slot_busy_time
        if now < blocked_until:
            if unblock_at[0] != blocked_until:
                unblock_at[0] = blocked_until
                at(blocked_until, "unblock")
            return
        for r in range(cfg.replicas):
            while free[r] and pending:
                step, _ = pending.popleft()
                d = draw()
                free[r] -= 1
                if active[r] == 0:
                    busy_since[r] = now
                active[r] += 1
                slot_busy_time += d
                at(now + d, "generated", r, step, rollout_version)

    def try_train(now: float) -> None:
        nonlocal trainer_busy, next_mb
        if trainer_busy or trained_step >= cfg.steps:
            return
        t = trained_step
        need = m if (cfg.streaming and cfg.mode != "sync") else n - next_mb * m
        if ready.get(t, 0) < need:
            return
        take = m if need == m else need
        ready[t] -= take
        trainer_busy = True
        dur = take * cfg.train_per_sample
        result.spans.append(Span("trainer", "train", now, now + dur, t))
        next_mb += take // m
        at(now + dur, "trained", t)

    release(0.0)
    now = 0.0
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "generated":
            r, step, version = data
            free[r] += 1
            active[r] -= 1
            if active[r] == 0:
                result.spans.append(Span(f"rollout-{r}", "generate", busy_since[r], now, step))
            ready[step] = ready.get(step, 0) + 1
            result.staleness.append(step - version)
            start_samples(now)
            try_train(now)
        elif kind == "trained":
            (t,) = data
            trainer_busy = False
            if next_mb * m >= n:  # the step's last micro-batch: optimizer, then weight sync
                opt_end = now + cfg.optimizer_seconds
                if cfg.optimizer_seconds:
                    result.spans.append(Span("trainer", "optimizer", now, opt_end, t))
                trainer_busy = True
                at(opt_end, "stepped", t)
            else:
                try_train(now)
        elif kind == "stepped":
            (t,) = data
            trainer_busy = False
            trained_step = t + 1
            next_mb = 0
            result.step_end.append(now)
            w = cfg.weight_sync_seconds
            if w:
                result.spans.append(Span("trainer", "weight-sync", now, now + w, t))
            if cfg.weight_sync == "sync" or cfg.mode != "async":
                # generation stops for the transfer (on-policy modes always wait for v = t)
                blocked_until = max(blocked_until, now + w)
                at(now + w, "synced", t + 1)
            else:
                at(now + w, "synced", t + 1)
            try_train(now)
        elif kind == "synced":
            (v,) = data
            if cfg.mode == "async" and cfg.weight_sync == "async" and cfg.swap_seconds:
                blocked_until = max(blocked_until, now + cfg.swap_seconds)
            rollout_version = max(rollout_version, v)
            release(now)
        elif kind == "unblock":
            start_samples(now)
    result.makespan = now
    # bubble ratio: idle share of NPU-time; a replica is busy while any of its
    # samples decodes, the trainer while it trains or steps
    rollout_busy = sum(s.end - s.start for s in result.spans if s.kind == "generate")
    trainer_busy_time = sum(s.end - s.start for s in result.spans
                            if s.worker == "trainer" and s.kind in ("train", "optimizer"))
    npus = cfg.replicas * cfg.replica_npus + cfg.trainer_npus
    busy = rollout_busy * cfg.replica_npus + trainer_busy_time * cfg.trainer_npus
    result.bubble_ratio = 1 - busy / (result.makespan * npus)
    result.slot_utilization = slot_busy_time / (result.makespan * cfg.replicas * cfg.slots)
    return result


def compare_modes(base: PipelineConfig, modes=(("sync", True), ("periodic", True), ("async", True))
                  ) -> list[SimResult]:
    out = []
    for mode, streaming in modes:
        out.append(simulate(PipelineConfig(**{**base.__dict__, "mode": mode,
                                              "streaming": streaming})))
    return out


def plot_gantt(results: list[SimResult], path: str, window: float | None = None) -> None:
    """One timeline per simulated pipeline: replicas' generate spans, the trainer's
    train / optimizer / weight-sync spans; gaps are bubbles."""
    panels = []
    for res in results:
        cfg = res.config
        label = cfg.mode + (f"(k={cfg.max_staleness})" if cfg.mode == "async" else "")
        if not cfg.streaming:
            label += ", no streaming"
        panels.append((f"{label}: {res.throughput:.2f} samples/s, bubble ratio "
                       f"{res.bubble_ratio:.0%}", res.spans))
    _plot_panels(panels, path, window)
