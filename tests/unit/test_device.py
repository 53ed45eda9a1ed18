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


def test_without_pinning_a_worker_gets_its_count_of_cores_and_no_affinity(tmp_path,
                                                                          monkeypatch):
    """`rljob run --no-pin-cores` (RLJOB_PIN_CORES=0, what the test command's lanes
    set): each worker's environment carries the count it would have been pinned to
    (RLJOB_CORES, which cores_given honours), and it is not pinned; --lend-cores pins
    regardless."""
    import os
    import subprocess
    from pathlib import Path

    import yaml

    from rljob.api import RLJob
    from rljob.infra.device import cores_given
    from rljob.local import LocalRun, pin_cores_default

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
                         .read_text())
    job = RLJob.model_validate(doc)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    spawned = []

    class Popen:
        pid = 4242  # written to logs/NAME.pid

        def __init__(self, args, env, preexec_fn, **_):
            cells = [c.cell_contents for c in preexec_fn.__closure__ or ()]
            spawned.append((env, next((c for c in cells if isinstance(c, set)), None)))

    monkeypatch.setattr(subprocess, "Popen", Popen)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setenv("RLJOB_CORES", "1")  # the caller's own: a pinned worker ignores it
    # trainer-0 and two rollouts over 8 cores: the trainer's block is 3 cores
    for pin, lend, cores, affinity in ((True, False, None, {0, 1, 2}),
                                       (False, False, "3", None),
                                       (False, True, None, {0, 1, 2})):
        LocalRun(job, tmp_path / f"{pin}{lend}", pin_cores=pin, lend_cores=lend)._spawn(
            "trainer-0", ["worker", "trainer"])
        env, pinned = spawned[-1]
        assert (env.get("RLJOB_CORES"), pinned) == (cores, affinity)
        # unpinned, vLLM's CPU workers are placed by the OS too (its own binding would
        # put every engine on the first core); pinned, it binds within the worker's cores
        assert env.get("VLLM_CPU_OMP_THREADS_BIND") == (None if pinned else "nobind")
        assert env["OMP_NUM_THREADS"] == "3"
    monkeypatch.setenv("RLJOB_CORES", "4")
    assert cores_given("/absent") == 4
    monkeypatch.setenv("RLJOB_PIN_CORES", "0")
    assert not pin_cores_default() and not LocalRun(job, tmp_path / "d").pin_cores
    monkeypatch.setenv("RLJOB_PIN_CORES", "1")
    assert pin_cores_default()
