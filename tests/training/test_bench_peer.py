"""`scripts/gpu-check.sh` on CPU (`RLJOB_CHECK_ACCEL=cpu`, its peer part: `rljob bench
peer`, our sync and async(1) and TRL's GRPOTrainer on one job) and `rljob bench
overhead` (the orchestration's milliseconds a step): smoke tests of the scripts and
benchmarks, their shape and consistency, never their speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_gpu_check_script_runs_its_peer_part_on_cpu(tmp_path):
    """The GPU check's side by side, with the tiny model on CPU: every run measured,
    each of ours with its ratio to TRL, async's bound from sync's own figures, and
    where a step goes."""
    out = tmp_path / "out"
    env = dict(os.environ, RLJOB_CHECK_ACCEL="cpu", RLJOB_CHECK_PARTS="peer",
               RLJOB_CHECK_PEER_STEPS="5", RLJOB_BENCH_WHEELS="none", OUT=str(out),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    res = json.loads((out / "peer.json").read_text())
    assert res["accelerator"] == "cpu" and res["model"] == "tiny"
    modes = res["modes"]
    assert set(modes) == {"sync", "async(1)"}
    trl = res["trl"]
    assert trl["steps"] == 2 and trl["tokens_per_s"] > 0
    for name, r in modes.items():
        assert r["steps"] == 2 and r["tokens_per_s"] > 0
        assert r["vs_trl"] == pytest.approx(r["tokens_per_s"] / trl["tokens_per_s"])
        assert r["of_bound"] * r["bound"] == pytest.approx(r["speedup"])
        assert {"rollout", "trainer"} <= set(r["step_parts"])
        assert r["step_parts"]["rollout"]["generate"] > 0
        assert r["step_parts"]["trainer"]["train"] > 0
    assert modes["sync"]["bound"] == 1.0 and modes["async(1)"]["bound"] > 1.0
    assert modes["sync"]["staleness_max"] == 0 and modes["async(1)"]["staleness_max"] <= 1
    for run in ("sync", "async-1"):  # each run's directory is kept, its timeline drawn
        assert (out / "peer-runs" / run / "timeline.png").exists()
    table = (out / "peer.txt").read_text()
    assert "rljob async(1)" in table and "TRL" in table and "where a step of rljob sync" in table


def test_the_gpu_check_script_runs_its_run_part_with_torchs_profiler_on_cpu(tmp_path):
    """The GPU check's `rljob run` of the quickstart, with the tiny model on CPU: its
    summary line, and torch's profile of the trainer and a replica over the steps it
    names (what it prints of them: their time a step, their copies and waits)."""
    out = tmp_path / "out"
    env = dict(os.environ, RLJOB_CHECK_ACCEL="cpu", RLJOB_CHECK_PARTS="run",
               RLJOB_CHECK_STEPS="6", RLJOB_BENCH_WHEELS="none", OUT=str(out),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "scripts/gpu-check.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert "rljob run on cpu, trainer.engine torch: 6 steps" in summary
    for worker in ("trainer-0", "rollout-0"):
        prof = json.loads((out / "run-torch" / "profiles" / f"{worker}.summary.json")
                          .read_text())
        assert prof["steps_recorded"] == [3, 4, 5], worker  # the middle's three
        assert prof["wall_ms_per_step"] > 0 and prof["self_cpu_ms_per_step"] > 0
        assert f"torch profile, torch engine, {worker}, steps [3, 4, 5]" in summary
    assert "copies and waits" in (out / "profile-torch.txt").read_text()


def test_bench_overhead_splits_each_step_into_compute_and_orchestration(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rljob", "bench", "overhead", "--steps", "8",
                           "--warmup", "2", "--modes", "sync,periodic,async", "--json",
                           "--keep", str(tmp_path / "runs")],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(done.stdout)
    assert set(res["modes"]) == {"sync", "periodic", "async(1)"}
    for m in res["modes"].values():
        assert m["step_ms"] > 0 and m["compute_ms"] > 0
        assert m["compute_ms"] + m["orchestration_ms"] == pytest.approx(m["step_ms"])
        assert 0 < m["idle_ms"] < m["step_ms"]  # part of a step no worker computes
        assert m["step_parts_ms"]["trainer"]["train"] > 0
        # each process's CPU a step, read from /proc: the computing ones used some, and
        # all together no more than the machine's cores give in a step (a read's tick
        # of 10 ms a process aside)
        cpu = m["cpu_ms"]
        assert list(cpu) == ["transferqueue", "driver", "rollout-0", "trainer-0"]
        assert cpu["trainer-0"] > 0 and cpu["rollout-0"] > 0 and min(cpu.values()) >= 0
        assert sum(cpu.values()) <= (os.cpu_count() + 1) * m["step_ms"]
    # sync's one replica (maxReplicas 1) makes its step in one batch, which one
    # reference claim would take whole: the trainer computes its samples' reference
    # log-probs as they arrive, and writes nothing (no reference task, no second claim)
    sync = res["modes"]["sync"]["step_parts_ms"]
    assert sync["trainer"]["reference"] > 0 and "write" not in sync["trainer"]
    assert "reference" not in sync["rollout"]
    # the release: the driver puts a step's prompts before the weights that release it
    # are published (step s's once s − 1 is released), and a replica generates a step
    # only once it holds weights that may (its claims' bound): sync's step s after its
    # swap to v = s, async(1)'s after its swap to v ≥ s − 1; none is made again
    from rljob.infra.timeline import load_spans

    for name, k in (("sync", 0), ("async-1", 1)):
        run = tmp_path / "runs" / "round-0" / name
        spans = load_spans(run)
        put = {x.step: x for x in spans if x.worker == "driver" and x.kind == "put"}
        published = {x.step + 1: x for x in spans  # weight-sync of step t publishes v = t + 1
                     if x.worker == "trainer-0" and x.kind == "weight-sync" and x.step >= 0}
        # (over 8 steps: a 2-core machine busy with other work can delay a put behind
        # the trainer's publish in a run's first steps)
        ahead = [s for s in put if s - k in published and put[s].end < published[s - k].start]
        steps = [s for s in put if s - k in published]
        assert steps and len(ahead) * 2 >= len(steps), (name, len(ahead), len(steps))
        swaps = sorted((x.end, x.step) for x in spans  # a replica's swap: step = version
                       if x.worker == "rollout-0" and x.kind == "weight-sync")
        for g in (x for x in spans if x.worker == "rollout-0" and x.kind == "generate"):
            held = max(v for end, v in swaps if end <= g.start)
            assert g.step - k <= held, (name, g.step, held)
            assert g.info["version"] == held, (name, g.step, g.info["version"], held)
        ms = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert all(m["rows_regenerated"] == 0 and m["staleness_max"] <= k for m in ms)
    # periodic's replica generates a step in four batches of 64: the claim of the next
    # batch goes out once a generation has started (answered while it runs), not in
    # the gap between two generations (three of a step's four generations send one;
    # the step's first is the batch held since the step before)
    spans = load_spans(tmp_path / "runs" / "round-0" / "periodic")
    gens = [x for x in spans if x.worker == "rollout-0" and x.kind == "generate"]
    claims = [x for x in spans if x.worker == "rollout-0" and x.kind == "claim" and x.step >= 0]
    inside = [c for c in claims if any(g.start <= c.start <= g.end for g in gens)]
    assert len(gens) >= 4 * 8 and len(inside) * 2 >= len(gens), (len(inside), len(gens))
