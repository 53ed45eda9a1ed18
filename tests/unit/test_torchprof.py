"""torch's profiler over a worker's steps (`rljob run --torch-profile`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from rljob.infra.torchprof import StepProfiler, parse_steps, summarize


def test_steps_are_first_dash_last_or_one_step_counted_from_one():
    assert parse_steps("5-7") == (5, 7)
    assert parse_steps(" 3 ") == (3, 3)
    for bad in ("0-2", "4-3", "a-b", "", "5-"):
        with pytest.raises(ValueError, match="--torch-profile"):
            parse_steps(bad)


def test_the_summary_adds_each_operators_own_times_a_step():
    events = [SimpleNamespace(key="aten::mm", count=4, self_cpu_time_total=300.0,
                              self_device_time_total=900.0),
              # torch before 2.4 names the device time for CUDA
              SimpleNamespace(key="aten::copy_", count=2, self_cpu_time_total=100.0,
                              self_cuda_time_total=50.0)]
    out = summarize(events, steps=2)
    assert out["ops"]["aten::copy_"] == {"calls": 2, "self_cpu_us": 100.0, "self_device_us": 50.0}
    assert out["self_cpu_ms_per_step"] == pytest.approx(0.2)
    assert out["self_device_ms_per_step"] == pytest.approx(0.475)
    assert list(out["ops"]) == ["aten::mm", "aten::copy_"]  # most time first


def test_it_records_the_steps_asked_and_writes_its_files_after_them(tmp_path, monkeypatch):
    monkeypatch.setenv("RLJOB_TORCH_PROFILE", "2-3")
    prof = StepProfiler.from_env(tmp_path, "trainer-0")
    a = torch.randn(64, 64)
    for step in (1, 2, 3, 4):
        prof.at(step)
        (a @ a).sum().item()
        if step < 4:
            assert not (tmp_path / "profiles").exists()  # written once recording ends
    prof.close()  # already written at step 4: nothing more
    summary = json.loads((tmp_path / "profiles" / "trainer-0.summary.json").read_text())
    assert summary["steps_recorded"] == [2, 3] and summary["steps"] == 2
    assert summary["ops"]["aten::mm"]["calls"] == 2  # steps 2 and 3's, not 1's or 4's
    assert summary["wall_ms_per_step"] > 0
    assert "aten::mm" in (tmp_path / "profiles" / "trainer-0.txt").read_text()
    trace = json.loads((tmp_path / "profiles" / "trainer-0.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_off_without_the_variable_or_a_run_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("RLJOB_TORCH_PROFILE", raising=False)
    for prof in (StepProfiler.from_env(tmp_path, "trainer-0"),
                 StepProfiler.from_env(None, "trainer-0")):
        prof.at(1)
        prof.close()
    monkeypatch.setenv("RLJOB_TORCH_PROFILE", "1")
    StepProfiler.from_env(None, "rollout-0").at(1)
    assert not (tmp_path / "profiles").exists()
