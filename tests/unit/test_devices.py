"""Per-worker accelerators in a local run (infra/devices.py), on a faked device count."""

from __future__ import annotations

import pytest

from rljob.api import RLJob
from rljob.infra import devices
from rljob.infra.devices import describe, device_plan, worker_env
from rljob.local import LocalRun


def _job(accelerator: str = "gpu", **spec) -> RLJob:
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "d"},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl"}, "accelerator": {"type": accelerator},
                 **spec}})


def test_each_rank_and_replica_gets_devices_of_its_own():
    spec = _job(trainer={"npusPerNode": 4},
                rollout={"replicas": 2, "npusPerReplica": 2, "tensorParallel": 2}).spec
    plan = device_plan(spec, 8)
    assert plan == {"trainer-0": (0,), "trainer-1": (1,), "trainer-2": (2,),
                    "trainer-3": (3,), "rollout-0": (4, 5), "rollout-1": (6, 7)}
    assert worker_env("gpu", plan["rollout-1"]) == {"CUDA_VISIBLE_DEVICES": "6,7",
                                                   "LOCAL_RANK": "0"}
    assert worker_env("ascend", plan["trainer-2"]) == {"ASCEND_RT_VISIBLE_DEVICES": "2",
                                                      "LOCAL_RANK": "0"}
    assert worker_env("cpu", ()) == {}
    assert describe(plan, {w: "gpu" for w in plan}).startswith(
        "devices: trainer-0 → gpu 0; trainer-1 → gpu 1;")


def test_a_cpu_role_takes_no_device_and_too_few_devices_are_shared_or_refused():
    spec = _job(rollout={"replicas": 2, "accelerator": {"type": "cpu"}}).spec
    assert device_plan(spec, 1) == {"trainer-0": (0,), "rollout-0": (), "rollout-1": ()}
    # one GPU: the trainer and the rollout share it, weights over gRPC
    one = _job(workflow={"weightTransport": "grpc"}).spec
    plan = device_plan(one, 1)
    assert plan == {"trainer-0": (0,), "rollout-0": (0,)}
    assert describe(plan, {w: "gpu" for w in plan}).endswith(
        "(shared: fewer devices than workers)")
    # a collective cannot meet two ranks on one device
    with pytest.raises(ValueError, match=r"this host has 2 device\(s\) for 5 .*set "
                       r"workflow.weightTransport: grpc, or lower the counts"):
        device_plan(_job(rollout={"replicas": 2, "npusPerReplica": 2}).spec, 2)
    with pytest.raises(ValueError, match="accelerator.type gpu: this host has no such device"):
        device_plan(one, 0)


def test_rljob_run_gives_each_worker_its_devices(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "count", lambda kind: 8 if kind == "gpu" else 0)
    monkeypatch.setattr("rljob.local.count_devices", devices.count)
    run = LocalRun(_job(trainer={"npusPerNode": 2}, rollout={"replicas": 2}), tmp_path)
    assert run.devices == {"trainer-0": (0,), "trainer-1": (1,), "rollout-0": (2,),
                           "rollout-1": (3,)}
    assert LocalRun(_job("cpu"), tmp_path).devices == {}


def test_the_host_count_follows_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert devices.count("gpu") == 2
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "")
    assert devices.count("ascend") == 0
    assert devices.count("cpu") == 0
