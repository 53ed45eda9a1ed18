"""A rollout device's memory budget (rollout/memory.py): vLLM's share by default,
the rules that refuse a share that cannot fit, the engine's arguments, and the
check `rljob validate` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rljob.api.spec import ModelSpec, RolloutSpec
from rljob.rollout.memory import ModelBytes, rollout_memory
from rljob.rollout.vllm_engine import engine_args
from rljob.weights.collective import BUCKET_BYTES

REPO = Path(__file__).resolve().parents[2]
QWEN25_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
             "max_position_embeddings": 32768, "tie_word_embeddings": False}


def test_the_7b_example_on_64_gb_devices():
    """Qwen2.5-7B, bfloat16, tensor parallelism 4, 64 GB 910B: the largest tensor (the
    embedding, 1.09 GB) bounds a weight update's buffers; vLLM gets 0.94."""
    m = ModelBytes.from_config(QWEN25_7B)
    assert m.params == pytest.approx(7.62e9, rel=0.01)
    assert (m.largest_name, m.largest_tensor) == ("model.embed_tokens.weight",
                                                  152064 * 3584 * 2)
    plan = rollout_memory(m, 4, 64e9, BUCKET_BYTES, 256)
    assert plan.default == plan.fraction == 0.94 and plan.problems == ()
    assert plan.weights == pytest.approx(3.81e9, rel=0.01)
    assert plan.receive == pytest.approx(1.63e9, rel=0.01)
    outside = (1 - plan.fraction) * plan.device
    assert plan.receive + plan.reserve <= outside < plan.receive + plan.reserve + 0.01 * 64e9
    # the whole model in buckets on each worker (15.2 GB) did not fit what 0.85 left
    assert m.params * 2 > (1 - 0.85) * 64e9


def test_a_share_that_leaves_no_room_for_an_update_is_refused_with_the_fix():
    plan = rollout_memory(ModelBytes.from_config(QWEN25_7B), 4, 64e9, BUCKET_BYTES, 256, 0.97)
    assert len(plan.problems) == 1
    assert plan.problems[0].startswith("rollout.memoryUtilization: 0.97 leaves 1.92 GB")
    assert plan.problems[0].endswith("set it to at most 0.94")
    assert rollout_memory(ModelBytes.from_config(QWEN25_7B), 4, 64e9, BUCKET_BYTES, 256,
                          0.94).problems == ()


def test_a_model_too_big_for_its_devices_asks_for_more_tensor_parallelism():
    big = {**QWEN25_7B, "num_hidden_layers": 80, "hidden_size": 8192,
           "intermediate_size": 29568, "num_attention_heads": 64, "num_key_value_heads": 8}
    plan = rollout_memory(ModelBytes.from_config(big), 1, 64e9, BUCKET_BYTES, 256)
    assert [p.split(":")[0] for p in plan.problems] == ["rollout.tensorParallel"]
    assert rollout_memory(ModelBytes.from_config(big), 8, 64e9, BUCKET_BYTES, 256).problems == ()


def _model(tmp_path, cfg=QWEN25_7B) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_vllm_gets_the_computed_share_or_the_spec_s(tmp_path):
    model = ModelSpec(path=str(_model(tmp_path)), dtype="bfloat16")
    rollout = RolloutSpec(engine="vllm", tensor_parallel=4, npus_per_replica=4)
    assert engine_args(model, rollout, "ascend", 151000, 0)["gpu_memory_utilization"] == 0.94
    assert engine_args(model, rollout, "gpu", 151000, 0, device_bytes=141e9)[
        "gpu_memory_utilization"] == 0.95  # a 141 GB device: the cap
    given = rollout.model_copy(update={"memory_utilization": 0.8})
    assert engine_args(model, given, "ascend", 151000, 0)["gpu_memory_utilization"] == 0.8
    assert "gpu_memory_utilization" not in engine_args(model, rollout, "cpu", 151000, 0)


def test_validate_refuses_a_share_that_cannot_fit(tmp_path):
    model = _model(tmp_path)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    job = tmp_path / "job.yaml"
    job.write_text(f"""apiVersion: rljob.dev/v1alpha1
kind: RLJob
metadata: {{name: big}}
spec:
  model: {{path: {model}, tokenizer: 'builtin:char', dtype: bfloat16}}
  dataset: {{path: {data}}}
  accelerator: {{type: ascend}}
  rollout: {{engine: vllm, tensorParallel: 4, npusPerReplica: 4, memoryUtilization: 0.97}}
""")
    out = subprocess.run([sys.executable, "-m", "rljob", "validate", str(job)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "memoryUtilization" in ln]
    assert len(lines) == 1 and lines[0].endswith("set it to at most 0.94"), out.stderr


def test_on_cpu_vllm_never_prefills_a_seeded_prompt_in_chunks():
    """vLLM 0.32 rewinds a seeded request's generator when it discards the token of a
    partly prefilled prompt, which torch's CPU generator cannot do: on CPU chunked
    prefill is off, with room for a whole context a step."""
    from rljob.api.spec import ModelSpec, RolloutSpec
    from rljob.rollout.vllm_engine import engine_args

    model = ModelSpec(path=f"random:{REPO / 'examples/models/tiny-qwen2'}",
                      tokenizer="builtin:char")
    args = engine_args(model, RolloutSpec(engine="vllm", max_num_seqs=64), "cpu", 100, 0)
    assert args["enable_chunked_prefill"] is False
    assert args["max_num_batched_tokens"] >= 4096


def test_a_one_worker_cpu_engine_starts_its_worker_in_process_and_a_users_setting_stays(
        monkeypatch):
    """vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING while the engine starts: 0 then (its CPU
    worker in the engine core's process, on the threads it was given), unset again
    after; a user's value is kept."""
    import os

    from rljob.infra.device import cores_given
    from rljob.rollout.vllm_engine import IN_PROCESS_ENV, _in_process_worker

    monkeypatch.delenv(IN_PROCESS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with _in_process_worker(True):  # its threads: the mp executor's count, not vLLM's 1
        assert os.environ[IN_PROCESS_ENV] == "0"
        assert os.environ["OMP_NUM_THREADS"] == str(max(1, cores_given() - 1))
    assert IN_PROCESS_ENV not in os.environ and "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # as `rljob run` sets it
    with _in_process_worker(True):
        assert os.environ["OMP_NUM_THREADS"] == "3"
    assert os.environ["OMP_NUM_THREADS"] == "3"
    with _in_process_worker(False):  # tensor parallel, or an accelerator
        assert IN_PROCESS_ENV not in os.environ
    monkeypatch.setenv(IN_PROCESS_ENV, "1")
    with _in_process_worker(True):
        assert os.environ[IN_PROCESS_ENV] == "1"
    assert os.environ[IN_PROCESS_ENV] == "1"
