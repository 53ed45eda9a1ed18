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


def test_a_sampler_built_without_the_engines_logprobs_mode_is_given_it():
    """vllm-ascend's model runner builds `AscendSampler()` without the engine's
    logprobs_mode: the extension sets it on the sampler and its top-k/top-p step, and
    leaves a sampler that has it (vLLM's own) alone."""
    from types import SimpleNamespace

    from rljob.rollout.vllm_ext import WeightUpdateExtension

    inner = SimpleNamespace(logprobs_mode="raw_logprobs")
    worker = WeightUpdateExtension()
    worker.model_runner = SimpleNamespace(sampler=SimpleNamespace(
        logprobs_mode="raw_logprobs", topk_topp_sampler=inner))
    assert worker.rljob_logprobs_mode("processed_logprobs") == "raw_logprobs"
    assert worker.model_runner.sampler.logprobs_mode == "processed_logprobs"
    assert inner.logprobs_mode == "processed_logprobs"
    assert worker.rljob_logprobs_mode("processed_logprobs") is None


def test_mindspeed_is_imported_without_the_workers_command_line(tmp_path, monkeypatch):
    """MindSpeed's adaptor parses sys.argv when imported (`-h` would exit the
    trainer, a flag named like a feature would switch it on): it sees the program
    name only, and the worker's argv is back afterwards."""
    import sys
    from types import SimpleNamespace

    from rljob.trainer.mcore import _load_mindspeed

    pkg = tmp_path / "mindspeed"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "megatron_adaptor.py").write_text("import sys\nSEEN = list(sys.argv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mindspeed", "mindspeed.megatron_adaptor"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    argv = ["rljob", "worker", "trainer", "--job", "job.yaml", "-h"]
    monkeypatch.setattr(sys, "argv", list(argv))
    _load_mindspeed(SimpleNamespace(kind="cpu"))  # not on Ascend: nothing imported
    assert "mindspeed.megatron_adaptor" not in sys.modules
    _load_mindspeed(SimpleNamespace(kind="ascend"))
    assert sys.modules["mindspeed.megatron_adaptor"].SEEN == ["rljob"]
    assert sys.argv == argv


def test_without_mindspeed_the_megatron_engine_on_ascend_says_what_is_missing(monkeypatch):
    import sys
    from types import SimpleNamespace

    import pytest

    from rljob.trainer.mcore import _load_mindspeed

    monkeypatch.setitem(sys.modules, "mindspeed", None)  # import mindspeed fails
    with pytest.raises(RuntimeError, match="MindSpeed and Megatron-LM's megatron.training"):
        _load_mindspeed(SimpleNamespace(kind="ascend"))
