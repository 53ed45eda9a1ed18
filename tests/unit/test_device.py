"""Accelerator type → torch device and collective backend."""

from __future__ import annotations

import pytest

from rljob.device import activate, resolve


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
