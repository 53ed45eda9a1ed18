"""`rljob bench security` runs the quickstart with its credentials off and on, and the
TransferQueue with none, the token, the token and TLS, and prints the figures (a smoke
test of the benchmark: shape, and that each side ran as it says, never speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_bench_security_prints_the_cost_of_each_credential(tmp_path):
    keep = tmp_path / "runs"
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "security", "--steps", "4",
                          "--warmup", "1", "--rounds", "1", "--quick", "--json",
                          "--keep", str(keep)],
                         capture_output=True, text=True, cwd=REPO, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    job = res["job"]
    for side in ("off", "on"):
        assert job[side]["tokens_per_s"] > 0 and job[side]["step_seconds"] > 0
        assert {"transferqueue", "trainer-0", "rollout-0"} <= set(job[side]["cpu_ms"])
    assert job["ratio_on_to_off"]["tokens_per_s"] == (
        job["on"]["tokens_per_s"] / job["off"]["tokens_per_s"])
    # each side ran as it says: off without a token or TLS (its controller warns that it
    # answers anyone, and the run has no CA), on with both
    off, on = keep / "round-0" / "off", keep / "round-0" / "on"
    # both sides from the one policy the bench warmed up
    for d in (off, on):
        model = yaml.safe_load((d / "job.yaml").read_text())["spec"]["model"]
        assert model["path"] == str(keep / "warmed") and model["warmupSteps"] == 0, model
    assert "answers any caller" in (off / "logs" / "transferqueue.log").read_text()
    assert "answers any caller" not in (on / "logs" / "transferqueue.log").read_text()
    assert (on / "ca.crt").exists() and not (off / "ca.crt").exists()
    tls = {side: yaml.safe_load((d / "job.yaml").read_text())["spec"]["transferQueue"]["tls"]
           for side, d in (("off", off), ("on", on))}
    assert tls == {"off": False, "on": True}
    tq = res["transferqueue"]
    for side in ("off", "token", "token+tls"):
        assert tq[side]["put_get_64KB_MBps"] > 0 and tq[side]["claim_p50_ms"] > 0
    assert tq["ratio_to_off"]["token+tls"]["put_get_64KB_MBps"] == (
        tq["token+tls"]["put_get_64KB_MBps"] / tq["off"]["put_get_64KB_MBps"])
