"""`rljob bench workflow` runs the four modes and prints its figures (a smoke test
of the benchmark: shape and sanity, never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rljob.planner.cost import overlap_bound

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
    shape = res["shape"]
    assert shape["prompts"] == 4 and shape["chosen_by"] == "--prompts"
    assert shape["probe"]["prompts"] == [4, 16] and shape["gen_fixed"] >= 0
    for m in modes.values():  # each side's compute next to the other over alone (sync)
        assert m["gen_busy_seconds"] > 0 and m["train_busy_seconds"] > 0
        assert m["gen_contention"] == pytest.approx(
            m["gen_busy_seconds"] / modes["sync"]["gen_busy_seconds"])
    assert modes["sync"]["gen_contention"] == modes["sync"]["train_contention"] == 1.0
    # the bound counts the reference's forwards (a task either side takes)
    sync = modes["sync"]
    assert sync["reference_seconds"] > 0
    assert res["bound"]["async(1)"] == pytest.approx(overlap_bound(
        "async", sync["gen_seconds"], sync["train_seconds"],
        t_either=sync["reference_seconds"]))
    for m in modes.values():  # the controller's and driver's CPU, read from /proc
        assert set(m["light_cpu_share"]) == {"transferqueue", "driver"}
        assert all(0 <= v < 1 for v in m["light_cpu_share"].values())


def test_the_probe_times_each_side_and_picks_a_step_size(tmp_path):
    """Without --prompts the benchmark probes the machine: both sides timed alone at
    two step sizes, and the choice is one of the candidates, from those times."""
    from rljob_bench import probe
    from rljob_bench.workflow import bench_job

    found = probe.run_probe(lambda p: bench_job("sync", None, 1, tmp_path, p), 1, 1,
                            sizes=(1, 2), repeats=1)
    assert found.prompts == (1, 2) and found.rollout_threads == found.trainer_threads == 1
    assert all(t > 0 for t in found.gen_seconds + found.train_seconds)
    assert probe.choose_prompts(found) in probe.CANDIDATES


def test_the_peer_reads_the_same_token_ids():
    """`--peer trl`: TRL's GRPOTrainer gets the built-in character vocabulary as a
    transformers tokenizer of the same ids (TRL's run on a job:
    tests/training/test_bench_peer.py)."""
    from rljob_bench.peer_trl import char_tokenizer_fast
    from rljob.inputs.models import CharTokenizer

    fast, chars = char_tokenizer_fast(), CharTokenizer()
    for text in ("20+9=", "a b\nc", "12+30=42"):
        assert fast.encode(text, add_special_tokens=False) == chars.encode(
            text, add_special_tokens=False)
