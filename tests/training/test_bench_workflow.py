"""`rljob bench workflow` runs the four modes and prints its figures (a smoke test
of the benchmark: shape and sanity, never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_bench_workflow_prints_modes_and_speedups():
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "workflow", "--steps", "5",
                          "--prompts", "4", "--rounds", "1", "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    assert set(res["tokens_per_s"]) == {"sync", "periodic", "async(1)", "async(2)"}
    assert res["bound"]["sync"] == 1.0 and res["bound"]["async(1)"] > 1.0
    assert res["bound"]["async(2)"] == res["bound"]["async(1)"]
    for mode, bound in res["bound"].items():
        assert res["of_bound"][mode] * bound == pytest.approx(res["speedup"][mode], rel=0.2)
    assert res["speedup"]["sync"] == 1.0 and res["rounds"] == 1
    assert res["speedup_per_round"] == [res["speedup"]]
    assert all(v > 0 for v in res["tokens_per_s"].values())
    modes = res["modes"]
    assert modes["sync"]["staleness_max"] == 0 and modes["periodic"]["staleness_max"] == 0
    assert modes["async(1)"]["staleness_max"] <= 1 and modes["async(2)"]["staleness_max"] <= 2
    assert all(0 <= m["bubble_ratio"] < 1 for m in modes.values())
