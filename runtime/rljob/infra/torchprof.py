"""torch's profiler over a few steps of a compute worker (`rljob run
--torch-profile FIRST-LAST`).

The run's timeline names what happens between the processes (claims, puts,
weights); inside a process, where a step's host time goes (operators, copies
between host and device, synchronisations, the Python around them) is torch's
profiler's to say. With `RLJOB_TORCH_PROFILE=FIRST-LAST` (steps as metrics.jsonl
counts them, from 1), the trainer's rank 0 and each rollout replica of the hf
engine record steps FIRST to LAST (`torch.profiler`: the CPU, and CUDA where
torch sees a GPU) and write, under RUN_DIR/profiles/:

- WORKER.json: the trace (chrome://tracing or https://ui.perfetto.dev);
- WORKER.txt: torch's table of operators by their own time;
- WORKER.summary.json: the steps recorded, the recording's wall milliseconds a step,
  and per operator its calls and its own host and device microseconds
  (`summarize`; `scripts/gpu-check.sh` prints it).

A step's span is where the worker starts its work on it: the trainer's step, a
replica's generation of a batch of that step. Recording slows what it records;
the steps after it are not."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

log = logging.getLogger("rljob.torchprof")

ENV = "RLJOB_TORCH_PROFILE"


def parse_steps(text: str) -> tuple[int, int]:
    """"FIRST-LAST" or "STEP" → (first, last), steps from 1; a clear error otherwise."""
    first, sep, last = text.strip().partition("-")
    try:
        steps = (int(first), int(last) if sep else int(first))
    except ValueError:
        raise ValueError(f"--torch-profile {text!r}: give the steps as FIRST-LAST "
                         "(e.g. 5-7) or one STEP, counted from 1") from None
    if steps[0] < 1 or steps[1] < steps[0]:
        raise ValueError(f"--torch-profile {text!r}: FIRST must be at least 1 and LAST "
                         "at least FIRST")
    return steps


def summarize(events, steps: int) -> dict:
    """Per operator of torch's `key_averages()`: calls, own host (CPU) and device
    microseconds, and the same a step (pure over the events' fields)."""
    ops = {}
    for e in events:
        device = getattr(e, "self_device_time_total", None)
        if device is None:  # torch before 2.4 named it for CUDA
            device = getattr(e, "self_cuda_time_total", 0.0)
        ops[e.key] = {"calls": int(e.count), "self_cpu_us": float(e.self_cpu_time_total),
                      "self_device_us": float(device or 0.0)}
    per_step = max(steps, 1)
    return {"steps": steps,
            "self_cpu_ms_per_step": sum(o["self_cpu_us"] for o in ops.values()) / 1e3 / per_step,
            "self_device_ms_per_step": sum(o["self_device_us"] for o in ops.values())
            / 1e3 / per_step,
            "ops": dict(sorted(ops.items(), key=lambda kv: -(kv[1]["self_cpu_us"]
                                                            + kv[1]["self_device_us"])))}


class StepProfiler:
    """`at(step)` before a step's work: recording starts at the first step of the
    range and stops (its files written) at the first step past it, or at `close()`."""

    def __init__(self, out_dir: Path | None, worker: str, steps: tuple[int, int] | None):
        self.out_dir, self.worker, self.steps = out_dir, worker, steps
        self._prof = None
        self._seen: set[int] = set()
        self._began = 0.0
        self.done = steps is None or out_dir is None

    @classmethod
    def from_env(cls, run_dir, worker: str) -> StepProfiler:
        """The worker's profiler as `RLJOB_TORCH_PROFILE` asks (off without it, or
        without a run directory)."""
        text = os.environ.get(ENV, "")
        if not text or run_dir is None:
            return cls(None, worker, None)
        return cls(Path(run_dir) / "profiles", worker, parse_steps(text))

    def at(self, step: int) -> None:
        if self.done:
            return
        first, last = self.steps
        if self._prof is None and first <= step <= last:
            self._start()
        if self._prof is not None:
            if step > last:
                self.close()
            else:
                self._seen.add(step)

    def _start(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities)
        self._prof.start()
        self._began = time.perf_counter()
        log.info("%s: torch profiler on from step %d", self.worker, self.steps[0])

    def close(self) -> None:
        """Stop recording and write the files (nothing if it never started)."""
        prof, self._prof, self.done = self._prof, None, True
        if prof is None:
            return
        prof.stop()
        wall = time.perf_counter() - self._began
        self.out_dir.mkdir(parents=True, exist_ok=True)
        base = self.out_dir / self.worker
        prof.export_chrome_trace(str(base.with_suffix(".json")))
        events = prof.key_averages()
        device = any((getattr(e, "self_device_time_total", 0) or 0) > 0 for e in events)
        base.with_suffix(".txt").write_text(events.table(
            sort_by="self_device_time_total" if device else "self_cpu_time_total",
            row_limit=40))
        summary = summarize(events, len(self._seen))
        summary["steps_recorded"] = sorted(self._seen)
        # the recording's wall time a step, waits included (what the ops' own times
        # leave of it is Python, waits and the profiler's own cost)
        summary["wall_ms_per_step"] = 1e3 * wall / max(len(self._seen), 1)
        Path(f"{base}.summary.json").write_text(json.dumps(summary, indent=1))
        log.info("%s: torch profile of steps %s in %s", self.worker, sorted(self._seen),
                 self.out_dir)
