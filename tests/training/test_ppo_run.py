"""PPO end to end on the local runtime: the critic streams through its own
TransferQueue task, every step is scored by the critic of that step, sync and
periodic make bit-identical updates (actor and critic), and a resumed run goes on
from the critic's checkpoint."""

from __future__ import annotations

import json

import torch
import yaml

from .test_runtime import REPO, final_weights, metrics, rljob_run


def ppo_job(tmp_path, name: str, mode: str):
    doc = yaml.safe_load((REPO / "examples" / "ppo-quickstart.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["path"] = f"random:{REPO / 'examples/models/tiny-qwen2'}"
    doc["spec"]["dataset"]["path"] = str(REPO / "examples/data/arith.jsonl")
    doc["spec"]["model"]["warmupSteps"] = 20
    doc["spec"]["workflow"] = {"mode": mode}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def critic_state(run_dir, version: int) -> dict:
    ck = torch.load(run_dir / "checkpoints" / "critic" / f"step-{version}.pt", weights_only=True)
    return ck["model"]


def test_ppo_streams_its_critic_and_periodic_equals_sync(tmp_path):
    runs = {}
    for mode in ("sync", "periodic"):
        runs[mode] = tmp_path / mode
        rljob_run(ppo_job(tmp_path, f"ppo-{mode}", mode), runs[mode], "--max-steps", "3")
    a, b = final_weights(runs["sync"]), final_weights(runs["periodic"])
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "periodic's actor diverged from sync"
    ca, cb = critic_state(runs["sync"], 3), critic_state(runs["periodic"], 3)
    assert all(torch.equal(ca[k], cb[k]) for k in ca), "periodic's critic diverged from sync"
    assert not torch.equal(ca["head.weight"], torch.zeros_like(ca["head.weight"]))  # it learnt
    for mode, run in runs.items():
        ms = metrics(run)
        assert [m["step"] for m in ms] == [1, 2, 3]
        assert all(m["samples"] == 64 and m["rows_claimed"] == 64 for m in ms)
        # step t (from 1) was scored by the critic that had learnt from t − 1 steps
        assert [m["scored_by_critic"] for m in ms] == [[0, 0], [1, 1], [2, 2]], mode
        assert all(m["value_loss"] is None or m["value_loss"] > 0 for m in ms)
        log = (run / "logs" / "trainer-0.log").read_text()
        assert "critic: step 3 value loss" in log
        # the critic's work is on the trainer's row of the timeline, a span a step each
        spans = (run / "spans" / "trainer-0.jsonl").read_text().splitlines()
        kinds = [json.loads(x) for x in spans]
        learnt = sorted(k["step"] for k in kinds if k["kind"] == "value-update")
        assert learnt == [0, 1, 2], kinds
        assert {k["step"] for k in kinds if k["kind"] == "value"} >= {0, 1, 2}
    assert [m["reward_mean"] for m in metrics(runs["sync"])] == \
        [m["reward_mean"] for m in metrics(runs["periodic"])]

    # resumed: the critic goes on from its own checkpoint, at the trainer's step
    rljob_run(ppo_job(tmp_path, "ppo-sync", "sync"), runs["sync"], "--resume", str(runs["sync"]),
              "--max-steps", "5")
    ms = metrics(runs["sync"])
    assert [m["step"] for m in ms] == [1, 2, 3, 4, 5]
    assert [m["scored_by_critic"] for m in ms[3:]] == [[3, 3], [4, 4]]
    assert "critic: resumed at version 3" in (runs["sync"] / "logs" / "trainer-0.log").read_text()
