"""`rljob bench updates` end to end at a small size: drain, interrupt (recompute) and
interrupt (keep) on the slow-tool agentic job, each a real local run (a smoke test of
the benchmark: its shape and what each policy must do, never its speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_bench_updates_runs_drain_interrupt_and_keep_on_the_slow_tool_job(tmp_path):
    keep = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "updates", "--jobs",
                          "agentic-slow-tool", "--steps", "8", "--rounds", "1", "--warmup",
                          "3", "--tool-seconds", "0.2", "--json", "--keep", str(keep)],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert res["engine"] == "hf" and res["rounds"] == 1 and res["tool_seconds"] == 0.2
    job = res["jobs"]["agentic-slow-tool"]
    runs = job["runs"]
    # the job's warm-up ran once, in the bench: every run started from its weights
    where = keep / "agentic-slow-tool"
    assert (where / "warmed" / "model.safetensors").exists()
    for policy in ("drain", "interrupt", "keep"):
        run = yaml.safe_load((where / f"{policy}-0" / "job.yaml").read_text())["spec"]["model"]
        assert run["path"] == str(where / "warmed") and run["warmupSteps"] == 0, run
        assert not (where / f"{policy}-0" / "warmup.json").exists()
    assert set(runs) == {"drain", "interrupt", "keep"} and set(job["vs_drain"]) == {
        "interrupt", "keep"}
    for policy, f in runs.items():
        assert f["steps"] == 5 and f["tokens_per_s"] > 0, (policy, f)
        assert f["updates"] > 0, (policy, f)  # the weight-sync spans were read
        assert f["staleness_max"] <= 1, (policy, f)  # async(1)'s bound, token by token
        assert 0 <= f["rollout_idle_share"] < 1 and f["update_latency_max"] >= \
            f["update_latency_median"] > 0
        assert abs(sum(f["staleness_tokens"].values()) - 1) < 1e-9
    # drain never interrupts a sample; an interrupting update stops none of the
    # episodes that wait on their tool, and waits for none of those tools: drain waits
    # for the batch in flight, tools included
    assert runs["drain"]["interrupted_share"] == 0
    for policy in ("interrupt", "keep"):
        assert runs[policy]["update_latency_median"] < runs["drain"]["update_latency_median"]
    print({p: (round(f["tokens_per_s"]), f["update_latency_median"]) for p, f in runs.items()})
