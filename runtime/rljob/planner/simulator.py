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
The release rule is the driver's own (`workflow/release.py`).
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

from ..infra.timeline import Span
from ..infra.timeline import plot_gantt as _plot_panels
from ..workflow.release import ReleaseRule


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


class _Simulation:
    """One run of the event loop: the pipeline's state, and a handler per event kind
    (`generated`, `trained`, `stepped`, `synced`, `unblock`)."""

    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        self.rule = ReleaseRule(cfg.mode, cfg.max_staleness)
        self.draw = _durations(cfg)
        self.n, self.m = cfg.samples_per_step, cfg.micro_batch
        self.events: list[tuple[float, int, str, tuple]] = []
        self.seq = 0
        self.result = SimResult(cfg, 0.0, self.n * cfg.steps)
        self.pending: deque[int] = deque()  # the steps of released, unstarted samples
        self.free = [cfg.slots] * cfg.replicas
        self.busy_since: list[float | None] = [None] * cfg.replicas
        self.active = [0] * cfg.replicas
        self.rollout_version = 0  # weights on the replicas
        self.blocked_until = 0.0  # weight sync in progress (sync transfer) blocks generation
        self.unblock_at: float | None = None  # the pending "unblock" event, if any
        self.ready: dict[int, int] = {}  # step -> generated samples not yet trained
        self.trainer_busy = False
        self.trained_step = 0  # optimizer steps done
        self.next_mb = 0  # micro-batches of the current step done
        self.released = 0  # steps whose prompts are out
        self.slot_busy_time = 0.0

    def at(self, t: float, kind: str, *data) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, data))
        self.seq += 1

    def run(self) -> SimResult:
        self.release(0.0)
        now = 0.0
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            getattr(self, f"on_{kind}")(now, *data)
        return self.finish(now)

    # ---- the rollout side ----------------------------------------------------
    def release(self, now: float) -> None:
        while self.released < self.cfg.steps and self.rule.allows(
                self.released, self.trained_step, [self.rollout_version]):
            self.pending.extend([self.released] * self.n)
            self.released += 1
        self.start_samples(now)

    def start_samples(self, now: float) -> None:
        if now < self.blocked_until:
            if self.unblock_at != self.blocked_until:
                self.unblock_at = self.blocked_until
                self.at(self.blocked_until, "unblock")
            return
        for r in range(self.cfg.replicas):
            while self.free[r] and self.pending:
                step = self.pending.popleft()
                d = self.draw()
                self.free[r] -= 1
                if self.active[r] == 0:
                    self.busy_since[r] = now
                self.active[r] += 1
                self.slot_busy_time += d
                self.at(now + d, "generated", r, step, self.rollout_version)

    def on_generated(self, now: float, r: int, step: int, version: int) -> None:
        self.free[r] += 1
        self.active[r] -= 1
        if self.active[r] == 0:
            self.result.spans.append(Span(f"rollout-{r}", "generate", self.busy_since[r], now,
                                          step))
        self.ready[step] = self.ready.get(step, 0) + 1
        self.result.staleness.append(step - version)
        self.start_samples(now)
        self.try_train(now)

    def on_unblock(self, now: float) -> None:
        self.start_samples(now)

    # ---- the trainer side ----------------------------------------------------
    def try_train(self, now: float) -> None:
        cfg, n, m = self.cfg, self.n, self.m
        if self.trainer_busy or self.trained_step >= cfg.steps:
            return
        t = self.trained_step
        need = m if (cfg.streaming and cfg.mode != "sync") else n - self.next_mb * m
        if self.ready.get(t, 0) < need:
            return
        take = m if need == m else need
        self.ready[t] -= take
        self.trainer_busy = True
        dur = take * cfg.train_per_sample
        self.result.spans.append(Span("trainer", "train", now, now + dur, t))
        self.next_mb += take // m
        self.at(now + dur, "trained", t)

    def on_trained(self, now: float, t: int) -> None:
        self.trainer_busy = False
        if self.next_mb * self.m < self.n:
            self.try_train(now)
            return
        # the step's last micro-batch: optimizer, then weight sync
        opt_end = now + self.cfg.optimizer_seconds
        if self.cfg.optimizer_seconds:
            self.result.spans.append(Span("trainer", "optimizer", now, opt_end, t))
        self.trainer_busy = True
        self.at(opt_end, "stepped", t)

    def on_stepped(self, now: float, t: int) -> None:
        cfg = self.cfg
        self.trainer_busy = False
        self.trained_step = t + 1
        self.next_mb = 0
        self.result.step_end.append(now)
        w = cfg.weight_sync_seconds
        if w:
            self.result.spans.append(Span("trainer", "weight-sync", now, now + w, t))
        if cfg.weight_sync == "sync" or cfg.mode != "async":
            # generation stops for the transfer (on-policy modes always wait for v = t)
            self.blocked_until = max(self.blocked_until, now + w)
        self.at(now + w, "synced", t + 1)
        self.try_train(now)

    def on_synced(self, now: float, v: int) -> None:
        cfg = self.cfg
        if cfg.mode == "async" and cfg.weight_sync == "async" and cfg.swap_seconds:
            self.blocked_until = max(self.blocked_until, now + cfg.swap_seconds)
        self.rollout_version = max(self.rollout_version, v)
        self.release(now)

    # ---- figures -------------------------------------------------------------
    def finish(self, now: float) -> SimResult:
        """Bubble ratio: idle share of NPU-time; a replica is busy while any of its
        samples decodes, the trainer while it trains or steps."""
        cfg, result = self.cfg, self.result
        result.makespan = now
        rollout_busy = sum(s.end - s.start for s in result.spans if s.kind == "generate")
        trainer_busy_time = sum(s.end - s.start for s in result.spans
                                if s.worker == "trainer" and s.kind in ("train", "optimizer"))
        npus = cfg.replicas * cfg.replica_npus + cfg.trainer_npus
        busy = rollout_busy * cfg.replica_npus + trainer_busy_time * cfg.trainer_npus
        result.bubble_ratio = 1 - busy / (result.makespan * npus)
        result.slot_utilization = self.slot_busy_time / (result.makespan * cfg.replicas
                                                         * cfg.slots)
        return result


def simulate(cfg: PipelineConfig) -> SimResult:
    """Run the pipeline of `cfg` to its last step (pure: the seed fixes the draws)."""
    return _Simulation(cfg).run()


def compare_modes(base: PipelineConfig, modes=(("sync", True), ("periodic", True), ("async", True))
                  ) -> list[SimResult]:
    out = []
    for mode, streaming in modes:
        out.append(simulate(PipelineConfig(**{**base.__dict__, "mode": mode,
                                              "streaming": streaming})))
    return out


def plot_gantt(results: list[SimResult], path: str, window: float | None = None,
               title: str | None = None) -> None:
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
    _plot_panels(panels, path, window, title)
