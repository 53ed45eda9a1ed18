"""Worker timelines: spans of generate / train / weight-sync work, the bubble
ratio (idle share of worker time) and Gantt charts (AsyncFlow Fig. 11 style).
Used by the local runtime (spans logged by each worker) and the simulator."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from .rundir import RunDir

COLORS = {"generate": "#4C72B0", "train": "#55A868", "optimizer": "#C44E52",
          "reference": "#DD8452", "weight-sync": "#8172B2", "tool": "#CCB974",
          "value": "#64B5CD", "value-update": "#8C8C8C", "score": "#DA8BC3"}
# drawn as a thin bar at the foot of its worker's row: a tool call runs inside an
# episode's generate span
THIN = ("tool",)
# drawn as a thin bar at the top of its worker's row: ppo's critic scores and learns in
# a thread of the trainer, beside the policy's own spans
TOP = ("value", "value-update")
WORK = ("generate", "train", "optimizer", "reference", "value", "value-update", "score")


# what a step spends between its compute (`rljob bench overhead` names them): a
# claim's round trip (waiting for ready rows included), the claimed cells' read, a
# write of produced cells with its notify and ack, the driver's put of a step's
# prompts, generation waiting for the newest weights (weightSync sync); and a
# collection of Python's garbage collector that took GC_SPAN or longer ("gc": the
# thread that set it off, and every other one of the process, stopped for it). Neither
# drawn nor counted in the bubble ratio (the driver, which has only these, is no
# worker of the chart)
DATA = ("claim", "read", "write", "put", "weight-wait", "gc")
GC_SPAN = 0.001


@dataclass
class Span:
    worker: str
    kind: str  # generate | train | optimizer | reference | weight-sync | tool | score
    # (a reward replica's batch) | DATA's
    start: float
    end: float
    step: int
    # what the work was, where a worker says (a profile's input, planner/live.py):
    # generate: the engine's calls (rows, tokens, prefill and decode seconds);
    # train: the micro-batch's samples and tokens
    info: dict | None = None


class SpanLog:
    """Appends a worker's spans to RUN_DIR/spans/WORKER.jsonl (wall-clock seconds).
    The process's garbage collections of GC_SPAN or longer go in too, as "gc" spans of
    the step of the latest span added before them (written with the next span)."""

    def __init__(self, run_dir: str | Path | None, worker: str):
        self.worker = worker
        self._f = None
        self._lock = threading.Lock()  # a worker's threads add spans (claims, writes)
        self.step = -1  # of the latest span added: a collection's
        self._gc_start = 0.0
        self._collections: deque[tuple[float, float, int]] = deque()
        if run_dir is not None:
            path = RunDir.of(run_dir).span_file(worker)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "a", encoding="utf-8")
            gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: dict) -> None:
        """The collector's callback: it runs inside the collection, in whichever
        thread set it off (maybe one holding this log's lock), so it only notes the
        collection; the next `add` writes it."""
        if phase == "start":
            self._gc_start = time.time()
        elif (end := time.time()) - self._gc_start >= GC_SPAN:
            self._collections.append((self._gc_start, end, self.step))

    @contextmanager
    def span(self, kind: str, step: int) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.add(kind, start, time.time(), step)

    def add(self, kind: str, start: float, end: float, step: int,
            info: dict | None = None) -> None:
        if self._f is not None:
            row = asdict(Span(self.worker, kind, start, end, step, info))
            if info is None:
                del row["info"]
            line = self._pauses() + json.dumps(row) + "\n"
            with self._lock:
                self._f.write(line)
                self._f.flush()
                self.step = max(self.step, step)

    def _pauses(self) -> str:
        """The lines of the collections noted since the last span."""
        lines = ""
        while self._collections:
            start, end, step = self._collections.popleft()
            lines += json.dumps({"worker": self.worker, "kind": "gc", "start": start,
                                 "end": end, "step": step}) + "\n"
        return lines

    def claimed(self, batch, step: int) -> None:
        """A claim's round trip and its cells' read (a `Batch` of `claim_get`)."""
        self.add("claim", *batch.claimed, step)
        if batch.read_at:
            self.add("read", batch.claimed[1], batch.read_at, step)

    def close(self) -> None:
        if self._f is not None:
            if self._collected in gc.callbacks:
                gc.callbacks.remove(self._collected)
            with self._lock:
                self._f.write(self._pauses())
            self._f.close()


def load_spans(run_dir: str | Path) -> list[Span]:
    spans = []
    for f in sorted(RunDir.of(run_dir).spans.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                spans.append(Span(**json.loads(line)))
    return spans


def covered(intervals) -> float:
    """The length of the union of (start, end) intervals (pure)."""
    total, cur_s, cur_e = 0.0, None, None
    for a, b in sorted(intervals):
        if cur_e is None or a > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def busy_seconds(spans: list[Span], window: tuple[float, float],
                 kinds: tuple[str, ...] = WORK) -> float:
    """Seconds of `window` during which some worker runs a span of `kinds` (pure): the
    rest of it, no work runs anywhere (everyone waits on the data path)."""
    t0, t1 = window
    return covered((max(s.start, t0), min(s.end, t1)) for s in spans
                   if s.kind in kinds and s.end > t0 and s.start < t1)


def bubble_ratio(spans: list[Span], weights: dict[str, float] | None = None,
                 window: tuple[float, float] | None = None) -> float:
    """Idle share of worker-time between the first and last span (work kinds only;
    weight-sync counts as idle for the worker waiting on it)."""
    spans = [s for s in spans if s.kind not in DATA]
    if not spans:
        return 0.0
    t0 = window[0] if window else min(s.start for s in spans)
    t1 = window[1] if window else max(s.end for s in spans)
    workers = sorted({s.worker for s in spans})
    weights = weights or {}
    busy = total = 0.0
    for w in workers:
        wt = weights.get(w, 1.0)
        busy += busy_seconds([s for s in spans if s.worker == w], (t0, t1)) * wt
        total += (t1 - t0) * wt
    return 1 - busy / total if total > 0 else 0.0


def run_panels(spans: list[Span], name: str, ratio: float, window: int = 3
               ) -> list[tuple[str, list[Span]]]:
    """The panels of a run's timeline (pure): the whole run, then, when it is longer
    than two windows, its first `window` steps and `window` steps of its steady state
    (the last ones), where single steps and their weight syncs can be told apart."""
    # the trained steps (a weight-sync span carries the version it loads: one more)
    steps = sorted({s.step for s in spans if s.kind == "train" and s.step >= 0}
                   or {s.step for s in spans if s.step >= 0})
    panels = [(f"{name}: all {len(steps)} steps, bubble ratio {ratio:.0%}", spans)]
    if len(steps) > 2 * window:
        for label, chosen in (("first steps", steps[:window]),
                              ("steady state", steps[-window:])):
            part = [s for s in spans if chosen[0] <= s.step <= chosen[-1]]
            # numbered from 1, as the live table and metrics.jsonl number them (a span's
            # step t is the (t+1)-th)
            panels.append((f"{name}: {label} (steps {chosen[0] + 1}-{chosen[-1] + 1}), "
                           f"bubble ratio {bubble_ratio(part):.0%}", part))
    return panels


def plot_gantt(panels: list[tuple[str, list[Span]]], path: str | Path,
               window: float | None = None, title: str | None = None) -> None:
    """One timeline per panel; spans' times are shifted to start at 0; `title` over all."""
    panels = [(heading, [s for s in spans if s.kind not in DATA]) for heading, spans in panels]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(12, 1.2 + 1.5 * sum(max(1, len({s.worker for s in sp})) * 0.45
                                                          for _, sp in panels)))
    for ax, (heading, spans) in zip(axes[:, 0], panels):
        if not spans:
            ax.set_title(heading + " (no spans)")
            continue
        t0 = min(s.start for s in spans)
        horizon = window or max(s.end for s in spans) - t0
        workers = sorted({s.worker for s in spans}, key=lambda w: (w.startswith("trainer"), w))
        for y, w in enumerate(workers):
            for kind, color in COLORS.items():
                bars = [(s.start - t0, s.end - s.start) for s in spans
                        if s.worker == w and s.kind == kind and s.start - t0 < horizon]
                if bars:
                    lane = ((y - 0.4, 0.25) if kind in THIN else (y + 0.15, 0.25)
                            if kind in TOP else (y - 0.4, 0.8))
                    ax.broken_barh(bars, lane, facecolors=color, label=kind)
        ax.set_yticks(range(len(workers)), workers)
        ax.set_xlim(0, horizon)
        ax.set_title(heading, fontsize=10)
    labels = {}
    for ax in axes[:, 0]:
        h, lab = ax.get_legend_handles_labels()
        labels.update(zip(lab, h))
    fig.legend(labels.values(), labels.keys(), loc="upper right", ncol=4, fontsize=8)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
