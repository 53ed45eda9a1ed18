"""Idle cores lent between the compute workers of a local run (`rljob run`).

`rljob run` gives each trainer rank and rollout replica cores of their own
(`LocalRun.cpus_for`). A side that waits leaves its cores idle: the rollouts
parked by the staleness bound in a training-bound job, the trainer waiting for
samples in a generation-bound one, and in sync mode each side in turn. Here the
waiting side's cores serve the other: a worker marks itself busy while it
computes (a byte in a file of the run directory, mapped by every worker), and a
computing worker checks, before each layer's forward and as its gradients come
in, which of the other role's workers are idle, and computes on its own cores
plus theirs (torch's intra-op threads and the affinity of every thread of the
process). The lender takes its cores back the moment it computes again: the
borrower sees its byte before its next layer. An idle worker keeps the threads
it had (they sleep): changing the thread count costs more than a micro-step of
the tiny model gains (torch's CPU kernels are made for a thread count), so the
count changes only when who is busy changes.

`rljob run --lend-cores` turns it on (off by default). Measured on the 2-core
machine with the tiny model (docs/benchmarks/placement.md), it costs more than it gives:
two threads synchronise at every operator, and the light processes and the
gRPC threads that share the lent core stall them; a forward and backward alone
on two cores is 1.5x faster than on one.

What it changes is how many threads compute, not what is computed: torch's CPU
kernels give the same bits at one and two threads for the models this runs
(`tests/unit/test_cores.py` checks logits and gradients), so periodic still
equals sync bit for bit. The cluster has no such file (pods' cores are their
own): there the share is off.

The pure part (`cores_now`) says which cores a worker computes on, given the
layout and who is busy."""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

LAYOUT = "cores.json"  # {"workers": [...], "cores": [[...], ...]}, written by `rljob run`
BUSY = "cores.busy"  # one byte per worker of the layout: 1 while it computes


def role(worker: str) -> str:
    """trainer-0 → trainer, rollout-3 → rollout."""
    return worker.rsplit("-", 1)[0]


@dataclass(frozen=True)
class Layout:
    workers: tuple[str, ...]
    cores: tuple[tuple[int, ...], ...]  # each worker's own cores

    def to_wire(self) -> dict:
        return {"workers": list(self.workers), "cores": [list(c) for c in self.cores]}

    @classmethod
    def from_wire(cls, data: dict) -> Layout:
        return cls(tuple(data["workers"]), tuple(tuple(c) for c in data["cores"]))


def cores_now(layout: Layout, me: str, busy: Sequence[bool]) -> tuple[int, ...]:
    """The cores `me` computes on now: its own, plus the cores of the other role's
    workers that are idle. Several workers of my role split what is lent (the
    i-th idle core goes to my role's worker i mod their count), so no core is lent
    twice; cores shared by two workers (fewer cores than workers) are never lent."""
    i = layout.workers.index(me)
    own = set(layout.cores[i])
    mine = [w for w in layout.workers if role(w) == role(me)]
    counted: dict[int, int] = {}
    for c in (c for cs in layout.cores for c in cs):
        counted[c] = counted.get(c, 0) + 1
    idle = [c for j, w in enumerate(layout.workers)
            if role(w) != role(me) and not busy[j]
            for c in layout.cores[j] if counted[c] == 1 and c not in own]
    lent = [c for k, c in enumerate(idle) if k % len(mine) == mine.index(me)]
    return tuple(sorted(own | set(lent)))


class CoreShare:
    """One worker's view of the shared busy bytes. `computing()` around compute:
    marks this worker busy and computes on what `cores_now` gives; `adapt()` (from
    the model's hooks) follows the others between layers."""

    def __init__(self, run_dir: Path, me: str):
        self.layout = Layout.from_wire(json.loads((Path(run_dir) / LAYOUT).read_text()))
        self.me = me
        self.index = self.layout.workers.index(me)
        self.own = self.layout.cores[self.index]
        with open(Path(run_dir) / BUSY, "r+b") as f:
            self.bytes = mmap.mmap(f.fileno(), len(self.layout.workers))
        self.bytes[self.index] = 0  # an earlier life that died computing
        self.current = self.own
        self.depth = 0

    @classmethod
    def open(cls, run_dir: Path | None, me: str | None) -> CoreShare | None:
        """The share of a local run; None in a pod, or where `rljob run` lends no cores."""
        if run_dir is None or me is None or not (Path(run_dir) / LAYOUT).exists():
            return None
        share = cls(run_dir, me)
        return share if me in share.layout.workers else None

    def busy(self) -> list[bool]:
        return [b != 0 for b in self.bytes[:len(self.layout.workers)]]

    @contextmanager
    def computing(self):
        self.depth += 1
        if self.depth == 1:
            self.bytes[self.index] = 1
            self.adapt()
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:  # idle: its threads sleep where they are; the
                self.bytes[self.index] = 0  # next compute adapts (a change of thread
                # count costs more than a micro-step gains: kernels are re-made)

    def adapt(self) -> None:
        """Compute on the cores lendable now (a hook: called before each layer)."""
        if self.depth:
            cores = cores_now(self.layout, self.me, self.busy())
            if cores != self.current:
                self._use(cores)

    def _use(self, cores: tuple[int, ...]) -> None:
        import torch

        if len(cores) > len(self.own):  # borrowing: every thread may run on them
            _pin_all(cores)
            torch.set_num_threads(len(cores))
        else:  # back to its own: fewer threads first, then the affinity
            torch.set_num_threads(len(cores))
            _pin_all(cores)
        self.current = cores

    def hook(self, model, layers: bool = True) -> None:
        """Follow the others while `model` computes: before each layer's forward
        (unless `layers` is False: its layers are hooked already), and as each
        parameter that trains gets its gradient in backward."""
        # lambdas, not bound methods: a deep copy of the model (the frozen
        # reference) shares them instead of copying this share
        for layer in _layers(model) if layers else ():
            layer.register_forward_pre_hook(lambda *_: self.adapt())
        for p in model.parameters():
            if p.requires_grad:
                p.register_hook(lambda _grad: self.adapt())

    def close(self) -> None:
        self.bytes[self.index] = 0
        self.bytes.close()


def computing(share: CoreShare | None):
    """Around a worker's compute: busy for its share, on the cores lent now (nothing
    where no cores are lent)."""
    return share.computing() if share is not None else nullcontext()


def write_layout(run_dir: Path, layout: Layout | None) -> None:
    """`rljob run`: the layout and a zeroed busy file, before the workers start
    (None: no cores are lent; an earlier run's files go)."""
    run_dir = Path(run_dir)
    if layout is None:
        for name in (LAYOUT, BUSY):
            (run_dir / name).unlink(missing_ok=True)
        return
    (run_dir / LAYOUT).write_text(json.dumps(layout.to_wire()))
    (run_dir / BUSY).write_bytes(bytes(len(layout.workers)))


def _pin_all(cores: tuple[int, ...]) -> None:
    """Affinity of every thread of this process (a pool thread keeps what it had
    when made, so each is set)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:  # a thread that ended meanwhile
            pass


def _layers(model) -> list:
    """The model's repeated blocks (the first ModuleList of more than one module),
    or the model itself."""
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1:
            return list(m)
    return [model]
