"""`rljob bench transferqueue` runs end to end and prints its figures as JSON.

A smoke test of the benchmark itself: it asserts shape and sanity, never speed."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_prints_every_figure():
    # without the append-only file a job's units keep (synced at every answer, it makes
    # the same data take several times as long here): the shape is the same
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "transferqueue", "--quick",
                          "--appendfsync", "no", "--json"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout)
    assert figures["appendfsync"] == "no"
    assert set(figures["put_get"]) == {"4KB", "64KB", "256KB"}
    for label, ours in figures["put_get"].items():
        assert ours["1_consumers"] > 0 and ours["4_consumers"] > 0
        raw = figures["raw"][label]
        assert min(raw.values()) > 0
        assert raw["put_get"] < min(raw["set"], raw["get"])  # both phases, one payload
        assert figures["ratio_to_raw"][label] == ours["1_consumers"] / raw["put_get"]
    lat = figures["claim_latency_ms"]
    assert lat["consumers"] == 8 and lat["claims"] > 0 and 0 < lat["p50"] <= lat["p99"]
