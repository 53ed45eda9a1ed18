"""Skew-aware dispatch in a real run (examples/longtail.yaml, a short warm-up): the
driver registers the lengths task and its ranker learns from every finished
sample, the rollout claims the longest predicted groups first, and every step
trains its 64 samples (the claim order itself: tests/integration/test_dispatch.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.training.test_runtime import check_plan_against_run


REPO = Path(__file__).resolve().parents[2]


def test_a_skew_aware_job_trains_every_sample_and_its_ranker_sees_them(tmp_path):
    doc = yaml.safe_load((REPO / "examples/longtail.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    spec["dataset"]["path"] = str(REPO / "examples/data/longtail.jsonl")
    spec["model"]["warmupSteps"] = 20
    job = tmp_path / "longtail.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    steps = 4
    out = subprocess.run([sys.executable, "-m", "rljob", "run", str(job), "--run-dir",
                          str(run_dir), "--max-steps", str(steps)], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import json

    ms = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in ms] == list(range(1, steps + 1))
    assert all(m["samples"] == 64 for m in ms)
    driver = (run_dir / "logs" / "driver.log").read_text()
    learned = int(re.search(r"length ranker: learned from (\d+) samples", driver).group(1))
    assert learned >= 64 * (steps - 1), learned  # every finished sample, but the last step's
    assert "claiming group_longest_first" in (run_dir / "logs" / "rollout-0.log").read_text()
    # the planner, fed the run's own profile (its steps after the first), predicts
    # the run's Tgen: one replica's four pieces a step, each as long as its longest row
    prof = subprocess.run([sys.executable, "-m", "rljob", "profile", str(job), "--from-run",
                           str(run_dir), "--skip-steps", "1", "-o", str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=120)
    assert prof.returncode == 0, prof.stderr
    check_plan_against_run(job, tmp_path / "p.json", ms[1:])
