"""Accelerator-only calls, as far as this machine can check them: where torch_npu's
HCCL process group lives and what it is given (vllm-ascend builds its stateless
groups the same way: `torch_npu._C._distributed_c10d.ProcessGroupHCCL(store, rank,
size, options)` with the timeout in `Options()._timeout`)."""

from __future__ import annotations

import datetime
import sys
import types

import pytest

from rljob.weights import collective


@pytest.fixture
def torch_npu_c10d(monkeypatch):
    """Only the module path torch_npu binds the class at (no NPU here); records calls."""
    made = []

    class ProcessGroupHCCL:
        class Options:
            _timeout = None

        def __init__(self, store, rank, size, options):
            made.append((store, rank, size, options))

    mod = types.ModuleType("torch_npu._C._distributed_c10d")
    mod.ProcessGroupHCCL = ProcessGroupHCCL
    for name in ("torch_npu", "torch_npu._C"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torch_npu._C._distributed_c10d", mod)
    return made


def test_the_hccl_group_comes_from_torch_npus_c_extension_with_options(torch_npu_c10d):
    assert collective.hccl_group_class().__module__ == __name__  # the stub's class
    opts = collective.hccl_options(datetime.timedelta(seconds=7))
    assert opts._timeout == datetime.timedelta(seconds=7)
    collective.hccl_group_class()("store", 1, 3, opts)
    assert torch_npu_c10d == [("store", 1, 3, opts)]


def test_without_torch_npu_the_hccl_group_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(ImportError):
        collective.hccl_group_class()
