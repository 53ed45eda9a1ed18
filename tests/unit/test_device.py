"""Accelerator type → torch device and collective backend."""

from __future__ import annotations

import pytest

from rljob.infra.device import activate, resolve


def test_each_accelerator_type_maps_to_its_device_and_backend():
    assert resolve("cpu", 3) == resolve("cpu")
    assert (resolve("cpu").name, resolve("cpu").backend) == ("cpu", "gloo")
    assert (resolve("ascend", 5).name, resolve("ascend", 5).backend) == ("npu:5", "hccl")
    assert (resolve("gpu", 1).name, resolve("gpu", 1).backend) == ("cuda:1", "nccl")
    assert not resolve("cpu").accelerated and resolve("ascend").accelerated
    with pytest.raises(ValueError, match="accelerator.type 'tpu'"):
        resolve("tpu")


def test_activating_a_missing_accelerator_says_what_is_missing():
    import importlib.util

    import torch

    assert str(activate(resolve("cpu"))) == "cpu"
    if importlib.util.find_spec("torch_npu") is None:
        with pytest.raises(RuntimeError, match="needs torch_npu"):
            activate(resolve("ascend"))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            activate(resolve("gpu"))


def test_cores_given_is_the_affinity_capped_by_the_cgroup_limit(tmp_path, monkeypatch):
    import os

    from rljob.infra.device import cores_given

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    limit = tmp_path / "cpu.max"
    limit.write_text("max 100000\n")
    assert cores_given(str(limit)) == 16
    limit.write_text("250000 100000\n")  # limits.cpu: 2.5
    assert cores_given(str(limit)) == 3
    assert cores_given(str(tmp_path / "absent")) == 16


def test_rljob_run_gives_busy_workers_blocks_of_cores(tmp_path, monkeypatch):
    import os
    from pathlib import Path

    import yaml

    from rljob.api import RLJob
    from rljob.local import LocalRun

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
                         .read_text())
    doc["spec"]["rollout"]["replicas"] = 2
    run = LocalRun(RLJob.model_validate(doc), tmp_path)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    # trainer-0, rollout-0, rollout-1 over 8 cores: 3 + 3 + 2; the light ones on the last
    assert run.cpus_for("trainer-0") == {0, 1, 2}
    assert run.cpus_for("rollout-0") == {3, 4, 5}
    assert run.cpus_for("rollout-1") == {6, 7}
    assert run.cpus_for("driver") == {7}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert [run.cpus_for(n) for n in ("trainer-0", "rollout-0", "rollout-1")] == [
        {0}, {1}, {0}]
