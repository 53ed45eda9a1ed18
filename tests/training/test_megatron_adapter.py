"""The Megatron-core engine as far as a CPU allows: process groups over gloo, the
GPTModel built from the Hugging Face config, weights converted both ways and
loaded. (mcore's attention forward needs a CUDA/NPU device.)"""

from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path

import pytest
import torch

mcore = pytest.importorskip("megatron.core", reason="megatron-core is the npu extra")

from rljob.api.spec import ModelSpec  # noqa: E402
from rljob.models import build_model, load_tokenizer  # noqa: E402
from rljob.trainer.megatron_engine import MegatronEngine, hf_to_mcore, mcore_to_hf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gloo():
    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield


def test_weights_convert_both_ways_and_load_into_gptmodel(gloo):
    warnings.filterwarnings("ignore", message="Apex is not installed")
    spec = ModelSpec(path="random:examples/models/tiny-qwen2", tokenizer="builtin:char",
                     dtype="float32")
    tok = load_tokenizer(spec)
    hf = build_model(spec, tok, seed=0)
    cfg = json.loads((REPO / "examples/models/tiny-qwen2/config.json").read_text())
    cfg["vocab_size"] = len(tok)
    state = {k: v for k, v in hf.state_dict().items()}
    back = mcore_to_hf(hf_to_mcore(state, cfg), cfg)
    for k, v in state.items():
        assert torch.equal(back[k], v), k

    engine = MegatronEngine(cfg, dtype=torch.float32, cpu_init=True)
    model = engine.build()
    n_mcore = sum(p.numel() for p in model.parameters())
    assert n_mcore == sum(p.numel() for p in hf.parameters())
    engine.load_hf_state(state)
    for k, v in engine.hf_state().items():
        assert torch.equal(v, state[k]), k
