"""`rljob bench updates`: what a weight update does to generation in flight, drain
against interrupt (`workflow.weightUpdate`) that recomputes an interrupted sample's
prefix and interrupt that keeps its cache (`workflow.interruptCache: keep`), in one run
on three jobs in async(1):

- longtail: examples/longtail.yaml (outputs an order of magnitude apart), one
  replica;
- agentic-slow-tool: examples/agentic-calculator.yaml with a calculator that
  takes `--tool-seconds` a call (an environment file of the user's kind,
  `path.py:Class`), so an update under drain waits for the slowest tool;
- quickstart: examples/quickstart.yaml.

Each job's supervised warm-up runs once, in this process; every run of the job starts
from that policy. Each job runs with drain, then interrupt (then keep), in rounds
(drain, interrupt, ...: a shared machine drifts over a minute), and the longtail job
once in sync for the overlap bound (`planner.cost.overlap_bound` from sync's Tgen and
Ttrain). Figures per run, over the steady state (after the first `warmup` steps): generated
tokens/s, seconds a step, an update's latency (the new weights in host memory to
the engine serving them: the rollout's weight-sync spans, median and max), the
share of the rollout's wall time it did not generate, the share of samples an
update interrupted, the per-token staleness (mean and its distribution over the
generated tokens) and the reward of the last steps."""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter
from pathlib import Path

from rljob.api import RLJob
from rljob.api.validation import load_rljob
from rljob.infra.timeline import load_spans
from rljob.local import LocalRun
from rljob.planner.cost import overlap_bound
from rljob.preflight import resolve_paths

from .examples import example, warmed

POLICIES = ("drain", "interrupt", "keep")  # keep: interrupt with interruptCache keep
JOBS = ("longtail", "agentic-slow-tool", "quickstart")

SLOW_TOOL = '''"""The calculator, taking {seconds} s a call (a slow tool, for rljob bench updates)."""
import time
from dataclasses import replace

from rljob.environments import Calculator


class SlowCalculator(Calculator):
    def step(self, turn):
        reply = super().step(turn)
        if not reply.done:  # a call answered
            time.sleep({seconds})
            reply = replace(reply, tool_seconds=reply.tool_seconds + {seconds})
        return reply
'''


def job_for(name: str, policy: str, steps: int, root: Path, tool_seconds: float,
            mode: str = "async", engine: str = "hf", model: dict | None = None) -> RLJob:
    """The benchmark's `name` job with `workflow.weightUpdate: policy` in `mode`
    (async: maxStaleness 1, weightSync async) on rollout engine `engine`; `model`:
    settings of spec.model replaced (the warmed policy every run starts from)."""
    file = {"longtail": "longtail.yaml", "agentic-slow-tool": "agentic-calculator.yaml",
            "quickstart": "quickstart.yaml"}[name]
    path = example(file)
    job = resolve_paths(load_rljob(str(path)), path.parent)
    doc = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = doc["spec"]
    spec["workflow"] = {"mode": mode, "weightSync": "async"}
    if mode == "async":
        spec["workflow"] |= {"maxStaleness": 1,
                             "weightUpdate": "interrupt" if policy == "keep" else policy}
        if policy == "keep":
            spec["workflow"]["interruptCache"] = "keep"
    spec["algorithm"]["maxSteps"] = steps
    spec["model"] |= model or {}
    spec["trainer"] = {**spec.get("trainer", {}), "checkpointEvery": 10_000}
    spec["rollout"]["engine"] = engine
    if name == "agentic-slow-tool":
        tool = root / "slow_tool.py"
        tool.write_text(SLOW_TOOL.format(seconds=tool_seconds))
        spec["rollout"]["environment"] = f"{tool}:SlowCalculator"
    doc["metadata"]["name"] = f"{name}-{policy if mode == 'async' else mode}"
    return RLJob.model_validate(doc)


def figures(metrics: list[dict], spans: list, warmup: int, last: int = 10) -> dict:
    """A run's figures from its metrics.jsonl lines and timeline spans (pure)."""
    steady = metrics[warmup:]
    t0, t1 = metrics[warmup - 1]["time"], metrics[-1]["time"]
    tokens = sum(m["tokens"] for m in steady)
    swaps = sorted(s.end - s.start for s in spans
                   if s.worker.startswith("rollout") and s.kind == "weight-sync"
                   and t0 <= s.start <= t1)
    generating = [(s.start, s.end) for s in spans
                  if s.worker.startswith("rollout") and s.kind == "generate"
                  and s.end >= t0 and s.start <= t1]
    busy = _union([(max(a, t0), min(b, t1)) for a, b in generating])
    staleness: Counter = Counter()
    for m in steady:
        for k, n in (m.get("staleness_tokens") or {}).items():
            staleness[int(k)] += n
    counted = sum(staleness.values())
    return {
        "steps": len(steady),
        "tokens_per_s": tokens / (t1 - t0),
        "step_seconds": (t1 - t0) / len(steady),
        "gen_seconds": statistics.fmean(m["gen_seconds"] for m in steady),
        "train_seconds": statistics.fmean(m["train_seconds"] for m in steady),
        "update_latency_median": statistics.median(swaps) if swaps else None,
        "update_latency_max": max(swaps) if swaps else None,
        "updates": len(swaps),
        "rollout_idle_share": 1 - busy / (t1 - t0),
        "interrupted_share": sum(m.get("interrupted", 0) for m in steady)
        / max(1, sum(m["samples"] for m in steady)),
        "staleness_token_mean": statistics.fmean(m.get("staleness_token_mean", 0.0)
                                                 for m in steady),
        "staleness_tokens": {k: staleness[k] / counted for k in sorted(staleness)}
        if counted else {},
        "staleness_max": max(m["staleness_max"] for m in steady),
        "reward_last": statistics.fmean(m["reward_mean"] for m in metrics[-last:]),
    }


def _union(spans: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of `spans` (pure)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= a:
            continue
        if a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return total


def _run(job: RLJob, directory: Path, warmup: int) -> dict:
    local = LocalRun(job, directory)
    local.run_to_end(poll=0.5)
    return figures(local.metrics(), load_spans(directory), warmup)


def run(jobs=JOBS, steps: int = 30, rounds: int = 2, warmup: int = 5,
        tool_seconds: float = 2.0, keep: Path | None = None, progress=None,
        engine: str = "hf") -> dict:
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-updates-") as tmp:
        root = keep or Path(tmp)
        for name in jobs:
            per_round: list[dict[str, dict]] = []
            bound = None
            # every run of the job starts from one warmed policy, warmed once
            (root / name).mkdir(parents=True, exist_ok=True)
            model = warmed(job_for(name, "drain", steps, root / name, tool_seconds),
                           root / name / "warmed")
            if progress and model:
                progress(f"{name}: warmed up once in {root / name / 'warmed'}")
            if name == "longtail":  # sync's Tgen and Ttrain: the most overlap can give
                d = root / name / "sync"
                d.mkdir(parents=True, exist_ok=True)
                sync = _run(job_for(name, "drain", steps, d, tool_seconds, "sync", engine,
                                    model), d, warmup)
                bound = {"sync_tokens_per_s": sync["tokens_per_s"],
                         "bound": overlap_bound("async", sync["gen_seconds"],
                                                sync["train_seconds"])}
            policies = POLICIES
            for r in range(rounds):
                res = {}
                for policy in policies:
                    d = root / name / f"{policy}-{r}"
                    d.mkdir(parents=True, exist_ok=True)
                    res[policy] = _run(job_for(name, policy, steps, d, tool_seconds,
                                               engine=engine, model=model), d, warmup)
                    if progress:
                        f = res[policy]
                        progress(f"{name} {policy} round {r + 1}: {f['tokens_per_s']:.0f} "
                                 f"tokens/s, update latency "
                                 f"{_s(f['update_latency_median'])} s median")
                per_round.append(res)
            runs = {p: _median([res[p] for res in per_round]) for p in policies}
            ratios = {p: [res[p]["tokens_per_s"] / res["drain"]["tokens_per_s"]
                          for res in per_round] for p in policies if p != "drain"}
            out = {"runs": runs,
                   "interrupt_vs_drain": statistics.median(ratios["interrupt"]),
                   "per_round": ratios["interrupt"],
                   "vs_drain": {p: statistics.median(r) for p, r in ratios.items()},
                   "vs_drain_per_round": ratios}
            if bound is not None:
                out |= bound
                for f in runs.values():
                    f["of_bound"] = f["tokens_per_s"] / bound["sync_tokens_per_s"] / \
                        bound["bound"]
            results[name] = out
    return {"steps": steps, "warmup": warmup, "rounds": rounds, "tool_seconds": tool_seconds,
            "engine": engine, "jobs": results}


def _median(runs: list[dict]) -> dict:
    out = {}
    for key, value in runs[0].items():
        values = [r[key] for r in runs if r[key] is not None]
        if key == "staleness_max":
            out[key] = max(values)
        elif isinstance(value, dict):
            out[key] = value  # the first round's distribution
        else:
            out[key] = statistics.median(values) if values else None
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    t = Table(title=f"weight updates: drain vs interrupt (recompute) vs interrupt (keep), async(1), {results['engine']} engine; "
              f"steady state "
              f"after {results['warmup']} of {results['steps']} steps; medians of "
              f"{results['rounds']} rounds; the slow tool takes {results['tool_seconds']} s")
    for c in ("job", "update", "tokens/s", "vs drain", "of bound", "step s", "update s "
              "(median / max)", "rollout idle", "interrupted", "staleness/token",
              "token staleness 0/1", "reward (last 10)"):
        t.add_column(c, justify="right")
    for name, job in results["jobs"].items():
        for policy, f in job["runs"].items():
            dist = f["staleness_tokens"]
            t.add_row(name, policy, f"{f['tokens_per_s']:.0f}",
                      f"{job['vs_drain'][policy]:.2f}x" if policy != "drain" else "",
                      f"{f['of_bound']:.0%}" if "of_bound" in f else "",
                      f"{f['step_seconds']:.2f}",
                      f"{_s(f['update_latency_median'])} / {_s(f['update_latency_max'])}",
                      f"{f['rollout_idle_share']:.0%}", f"{f['interrupted_share']:.0%}",
                      f"{f['staleness_token_mean']:.2f}",
                      " / ".join(f"{dist.get(k, 0.0):.0%}" for k in (0, 1)),
                      f"{f['reward_last']:.3f}")
    console.print(t)
    for name, job in results["jobs"].items():
        if "bound" in job:
            console.print(f"{name}: sync {job['sync_tokens_per_s']:.0f} tokens/s; the most "
                          f"async overlap can give over it {job['bound']:.2f}x")
        for policy, ratios in job["vs_drain_per_round"].items():
            console.print(f"{name}: {policy} over drain per round "
                          + ", ".join(f"{x:.2f}x" for x in ratios))
