"""What `rljob run` shows while a job runs and when it ends: a live table on a
terminal, a plain line per step and per event without one (CI, nohup, a pod's log),
and the run's summary. The figures come from `progress` (pure)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from . import progress
from .infra.rundir import RunDir

# short enough that the table fits an 80-column terminal (without --wide)
COLUMNS = ("step", "reward", "smooth", "loss", "kl", "stale", "tok/s", "Tgen",
           "Ttrain")


class RunView:
    """The view of one LocalRun (`runner`): `open()` gives what to `update()` each
    supervision turn (a rich Live on a terminal, PlainLines elsewhere)."""

    def __init__(self, runner, job, console: Console, warmup: int, started: float,
                 wide: bool = False, resumed: bool = False):
        self.runner, self.job, self.console = runner, job, console
        self.warmup, self.started, self.wide = warmup, started, wide
        # a resumed run's metrics.jsonl holds the earlier runs' steps too: this run's
        # lines, pace and summary are of the steps it trained (the ones after its
        # checkpoint included, which it trains again)
        self.resumed = resumed
        self.wall_started = time.time() - (time.monotonic() - started)

    def this_run(self, ms: list[dict] | None = None) -> list[dict]:
        """The steps this run trained (a resumed run's earlier ones left out) of `ms`
        (default: the run's metrics, read now)."""
        ms = self.runner.metrics() if ms is None else ms
        return [m for m in ms if m["time"] >= self.wall_started] if self.resumed else ms

    def warm(self) -> dict | None:
        """The trainer's warm-up progress so far (None before its first report)."""
        if not self.warmup:
            return None
        try:
            return json.loads(RunDir(self.runner.run_dir).warmup_progress.read_text())
        except (OSError, ValueError):
            return None

    def open(self):
        if self.console.is_terminal:
            return Live(self.render(), console=self.console, refresh_per_second=2)
        return PlainLines(self)

    def render(self):
        """The live table: the header's phase, ETA and restarts, the last 8 steps, the
        last 4 events."""
        runner, spec = self.runner, self.job.spec
        ms = runner.metrics()
        title = Text(progress.header(
            f"{self.job.metadata.name} · {spec.workflow.mode} · {spec.rollout.replicas} "
            f"rollout · {spec.trainer.world_size} trainer rank(s)", self.this_run(ms),
            runner.steps,
            self.warmup, time.monotonic() - self.started, sum(runner.restarts.values()),
            self.warm()), style="italic")
        # the header above, not as the table's title (a title as wide as the terminal
        # widens every column): the table is as wide as its figures, 80 columns fit
        episodic = spec.rollout.episodic
        t = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  caption="stale: staleness mean/max; Tgen, Ttrain in seconds"
                  + ("; turns: an episode's mean; calls: tool calls/failed"
                     if episodic else ""))
        # an episodic job's two columns take the smoothed reward's place (the header
        # above has it), so the table still fits 80 columns
        columns = (tuple(c for c in COLUMNS if c != "smooth") + progress.EPISODE
                   if episodic else COLUMNS)
        for col in columns + (tuple(c for c, _, _ in progress.WIDE) if self.wide else ()):
            t.add_column(col, justify="right", no_wrap=True)
        smooth = progress.smoothed([m["reward_mean"] for m in ms])
        for m, r in list(zip(ms, smooth))[-8:]:
            t.add_row(f"{m['step']}/{runner.steps}", f"{m['reward_mean']:.3f}",
                      *(() if episodic else (f"{r:.3f}",)),
                      progress._num(m.get("loss"), ".4f"), progress._num(m.get("kl"), ".4f"),
                      f"{m['staleness_mean']:.2f}/{m['staleness_max']}",
                      f"{m['tokens_per_second']:.0f}", f"{m['gen_seconds']:.2f}",
                      f"{m['train_seconds']:.2f}",
                      *(progress.episode_cells(m) if episodic else ()),
                      *(progress.wide_cells(m) if self.wide else ()))
        lines = progress.alerts(ms) + runner.events
        return Group(title, t, *(Text(e, style="yellow") for e in lines[-4:]))

    def summary(self, directory: Path, summary: dict, status: int, file: Path) -> None:
        """The end of a run: steps, reward, bubble ratio, restarts, what it wrote, and
        how to go on from its last checkpoint if it did not finish."""
        console, runner = self.console, self.runner
        elapsed = time.monotonic() - self.started
        ms = self.this_run()
        if ms:  # this run's steps, not a resumed run's earlier ones too
            summary = {**summary, "steps": len(ms), "reward_first": ms[0]["reward_mean"],
                       "reward_last": ms[-1]["reward_mean"], "first_step": ms[0]["step"],
                       "last_step": ms[-1]["step"],
                       "before_first": ms[0]["time"] - self.wall_started,
                       "warmed_up": bool(self.warmup)}
        console.print(summary_line(summary, elapsed), soft_wrap=True, highlight=False)
        if runner.restarts:
            console.print("restarts: " + ", ".join(f"{n} ×{k}" for n, k in
                                                   sorted(runner.restarts.items())))
        # paths and the command are never wrapped (a log file is 80 columns to rich), so
        # they can be pasted whole
        wrote = RunDir(directory).outputs()
        console.print(f"wrote {directory}/{{{', '.join(wrote)}}}" if wrote else "wrote nothing",
                      soft_wrap=True, markup=False, highlight=False)
        step = runner.resume_step() if status else 0
        if step:
            console.print(f"last checkpoint: step {step}; continue with:")
            console.print(f"rljob run {file} --resume {directory}", soft_wrap=True,
                          markup=False, highlight=False)


def summary_line(summary: dict, elapsed: float) -> str:
    """The run in one line; figures a run without steps has none of are left out,
    never printed as nan."""
    def known(key: str) -> float | None:
        v = summary.get(key)
        return v if isinstance(v, (int, float)) and math.isfinite(v) else None

    steps = summary.get("steps", 0)
    head = f"{steps} step{'' if steps == 1 else 's'}"
    if steps and summary.get("first_step", 1) != 1:  # a resumed run
        head += f" ({summary['first_step']}-{summary['last_step']})"
    head += f" in {elapsed:.0f}s"
    before = known("before_first")
    if steps and before is not None:
        head += (f", the first after {before:.0f}s of start-up"
                 + (" and warm-up" if summary.get("warmed_up") else ""))
    parts = [head]
    first, last = known("reward_first"), known("reward_last")
    if first is not None and last is not None:
        parts.append(f"mean reward {first:.3f} → {last:.3f}")
    bubble = known("bubble_ratio")
    if bubble is not None:
        parts.append(f"bubble ratio {bubble:.0%}")
    return "; ".join(parts)


class PlainLines:
    """Without a terminal: a plain line per step and per event, and a line every 30 s
    until the first step."""

    def __init__(self, view: RunView):
        self.view = view
        self.steps = self.events = 0
        self.said = -1e9

    def update(self, _renderable=None) -> None:
        runner, console, started = self.view.runner, self.view.console, self.view.started
        ms = self.view.this_run()  # a resumed run's earlier steps are not said again
        now = time.monotonic()
        said = progress.alerts(ms[:self.steps])
        for i in range(self.steps, len(ms)):
            console.print(progress.step_line(ms[:i + 1], runner.steps, now - started,
                                             self.view.wide), soft_wrap=True, highlight=False)
        for line in progress.alerts(ms)[len(said):]:
            console.print(line, soft_wrap=True, highlight=False)
        self.steps = len(ms)
        for e in runner.events[self.events:]:
            console.print(e, soft_wrap=True, highlight=False)
        self.events = len(runner.events)
        if not ms and now - self.said >= 30:
            self.said = now
            phase = progress.phase(ms, runner.steps, self.view.warmup, self.view.warm())
            console.print(f"{phase} · elapsed "
                          f"{progress.clock(now - started)}", highlight=False)

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc) -> bool:
        return False
