"""`rljob bench trainer` on CPU with the tiny model: both trainer engines train
through the worker's step and the figures come out (a smoke test of the
benchmark: shape and sanity, never speed)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiers import import_or_skip

REPO = Path(__file__).resolve().parents[2]


def test_bench_trainer_times_both_engines_and_prints_their_figures(capsys):
    import_or_skip("megatron", "megatron.core", "megatron-core is the dev extra")
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "trainer", "--accelerator",
                          "cpu", "--model", "tiny", "--engines", "torch,megatron", "--steps",
                          "2", "--warmup", "1", "--prompt-len", "8", "--response-len", "16",
                          "--group", "4", "--micro-batch", "4", "--micro-batches", "2",
                          "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    job = res["job"]
    assert job["prompts"] == 2 and job["tokens_per_step"] == 8 * 24
    assert set(res["engines"]) == {"torch", "megatron"}
    for name, e in res["engines"].items():
        assert "error" not in e, (name, e)
        for key in ("step_seconds", "tokens_per_s", "samples_per_s", "optimizer_state_mb",
                    "grad_norm", "build_seconds"):
            assert math.isfinite(e[key]) and e[key] > 0, (name, key, e[key])
        assert e["tokens_per_s"] == pytest.approx(job["tokens_per_step"] / e["step_seconds"])
        assert e["peak_memory_gb"] is None  # CPU: no device allocator to read
        assert math.isfinite(e["loss"]) and math.isfinite(e["kl"])
        assert 0 < e["weight_change"] < 1e-2  # AdamW moved the weights, a little
        # AdamW: two float32 moments per parameter, plus the step counters
        assert e["optimizer_state_mb"] * 1e6 >= 2 * 4 * e["parameters"]
    # the same model under both engines, trained on the same samples: the same step
    # (mcore's default dropout of 0.1 in training made the megatron one differ)
    t, m = res["engines"]["torch"], res["engines"]["megatron"]
    assert t["parameters"] == m["parameters"]
    assert m["grad_norm"] == pytest.approx(t["grad_norm"], rel=1e-4)
    assert m["kl"] == pytest.approx(t["kl"], abs=1e-6)
    assert m["weight_change"] == pytest.approx(t["weight_change"], rel=1e-3)
    assert res["megatron_over_torch"]["step_seconds"] > 0

    from rljob_bench import trainer

    trainer.render(res)
    printed = capsys.readouterr().out
    assert "trainer step: tiny" in printed and "megatron / torch" in printed
    for name in ("torch", "megatron"):
        row = next(line for line in printed.splitlines()
                   if line.startswith("│") and f" {name} " in line)
        assert f"{res['engines'][name]['step_seconds']:.4f}" in row


def test_bench_trainer_sets_a_lora_step_beside_the_full_one():
    """torch-lora: the torch engine's step with model.lora (r=8): it trains the adapter
    alone (its optimizer state and parameters a fraction of the full step's), moves it,
    and both peaks of host memory are read."""
    out = subprocess.run([sys.executable, "-m", "rljob", "bench", "trainer", "--model",
                          "tiny", "--engines", "torch-lora,torch", "--lora-rank", "8",
                          "--steps", "2", "--warmup", "1", "--prompt-len", "8",
                          "--response-len", "16", "--group", "4", "--micro-batch", "4",
                          "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout)
    lora, full = res["engines"]["torch-lora"], res["engines"]["torch"]
    assert res["job"]["lora_rank"] == 8
    assert lora["parameters"] == 65_536 and full["parameters"] == 604_800
    assert lora["optimizer_state_mb"] < full["optimizer_state_mb"] / 5
    assert 0 < lora["weight_change"] and lora["peak_host_gb"] > 0 < full["peak_host_gb"]
    r = res["lora_over_torch"]
    assert r["optimizer_state_mb"] == lora["optimizer_state_mb"] / full["optimizer_state_mb"]


def test_a_step_is_whole_groups_of_on_policy_samples():
    import numpy as np

    from rljob_bench.trainer import step_shape, synthetic_step

    assert step_shape(8, 8, 4) == 4
    with pytest.raises(ValueError, match="whole groups"):
        step_shape(8, 4, 1)
    samples = synthetic_step(3, 2, 4, 5, 7, 100, np.random.default_rng(0))
    assert [s.slot for s in samples] == list(range(8))
    assert all(s.version == 3 and len(s.prompt_ids) == 5 and len(s.response_ids) == 7
               for s in samples)
    assert all(3 <= i < 100 for s in samples for i in s.prompt_ids + s.response_ids)
    for g in (0, 1):  # a group shares its prompt; its advantages are centred
        members = samples[g * 4:(g + 1) * 4]
        assert all(m.prompt_ids == members[0].prompt_ids for m in members)
        assert abs(sum(m.advantage for m in members)) < 1e-4
