"""The Megatron-core engine as far as a CPU allows: process groups over gloo, the
GPTModel built from the Hugging Face config, weights converted both ways and
loaded. (mcore's attention forward needs a CUDA/NPU device.)"""

from __future__ import annotations

import json
import socket
import warnings
from pathlib import Path

import pytest
import torch

from tests.tiers import import_or_skip  # noqa: E402

mcore = import_or_skip("megatron", "megatron.core", "megatron-core is the dev extra")

from rljob.api.spec import ModelSpec  # noqa: E402
from rljob.inputs.models import build_model, load_tokenizer  # noqa: E402
from rljob.trainer.mcore import MegatronEngine, hf_to_mcore, mcore_to_hf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_weights_convert_both_ways_and_load_into_gptmodel(gloo):
    warnings.filterwarnings("ignore", message="Apex is not installed")
    cfg, hf = _tiny_model()
    state = hf.state_dict()
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


def _tiny_model():
    """The tiny Qwen2 of the examples (random init) and its config."""
    spec = ModelSpec(path="random:examples/models/tiny-qwen2", tokenizer="builtin:char",
                     dtype="float32")
    tok = load_tokenizer(spec)
    hf = build_model(spec, tok, seed=0)
    cfg = json.loads((REPO / "examples/models/tiny-qwen2/config.json").read_text())
    cfg["vocab_size"] = len(tok)
    return cfg, hf


def _tiny_state():
    cfg, hf = _tiny_model()
    return cfg, hf.state_dict()


def test_tensor_parallel_shards_split_and_join_back():
    from rljob.trainer.mcore import shard_tp, unshard_tp

    cfg, state = _tiny_state()
    full = hf_to_mcore(state, cfg)
    for tp in (2,):  # tiny-qwen2 has 2 query groups: tp 2 is the largest that divides them
        shards = [shard_tp(full, tp, r) for r in range(tp)]
        qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
        assert shards[0][qkv].shape[0] == full[qkv].shape[0] // tp
        fc1 = "decoder.layers.0.mlp.linear_fc1.weight"
        gate, up = full[fc1].chunk(2)  # each rank holds [its gate part; its up part]
        assert torch.equal(shards[1][fc1], torch.cat([gate.chunk(tp)[1], up.chunk(tp)[1]]))
        back = unshard_tp(shards)
        assert back.keys() == full.keys()
        for k in full:
            assert torch.equal(back[k], full[k]), k
    with pytest.raises(ValueError, match="trainer.parallelism.tp=3"):
        shard_tp(full, 3, 0)


def _load_tp_rank(rank: int, world: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from rljob.trainer.mcore import shard_tp, unshard_tp

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    cfg, state = _tiny_state()
    engine = MegatronEngine(cfg, tensor_parallel=world, dtype=torch.float32, cpu_init=True)
    model = engine.build()
    full = hf_to_mcore(state, cfg)
    missing, unexpected = model.load_state_dict(shard_tp(full, world, rank), strict=False)
    assert not [k for k in missing if not k.endswith("_extra_state")] and not unexpected
    mine = {k: v for k, v in model.state_dict().items() if "_extra_state" not in k}
    parts = {k: [torch.empty_like(v) for _ in range(world)] for k, v in mine.items()}
    for k, v in mine.items():
        dist.all_gather(parts[k], v.contiguous())
    gathered = unshard_tp([{k: p[r] for k, p in parts.items()} for r in range(world)])
    # the trainer's own path: rank 0 gathers one parameter at a time (hf_tensors)
    from megatron.core import parallel_state

    from rljob.trainer.mcore import MegatronPolicy

    policy = object.__new__(MegatronPolicy)
    policy.model, policy.cfg, policy.tp, policy.compute = model, cfg, world, torch.float32
    policy.tp_rank = parallel_state.get_tensor_model_parallel_rank()
    policy.tp_group = parallel_state.get_tensor_model_parallel_group()
    policy.data_rank, policy._dist = 0, dist
    streamed = dict(policy.hf_tensors())
    if rank == 0:
        back = mcore_to_hf(gathered, cfg)
        torch.save({"ok": all(torch.equal(back[k], v) for k, v in state.items()),
                    "streamed": streamed.keys() == state.keys()
                    and all(torch.equal(streamed[k], v) for k, v in state.items())}, out)
    else:
        assert streamed == {}  # only the sender gets the weights
    dist.destroy_process_group()


def test_tensor_parallel_shards_fit_mcores_own_tp2_model_and_gather_back(tmp_path):
    """Two gloo ranks build the GPTModel at tp 2: every shard fits mcore's own
    parameter of that rank, and gathering them gives the Hugging Face weights back,
    as does the trainer's stream of them (`MegatronPolicy.hf_tensors`, a parameter's
    shards gathered onto rank 0 at a time)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "result.pt"
    mp.start_processes(_load_tp_rank, args=(2, port, str(out)), nprocs=2, join=True,
                       start_method="spawn")
    assert torch.load(out) == {"ok": True, "streamed": True}


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.8, 0.9)])
def test_the_megatron_engine_scores_tokens_under_the_sampling_distribution(
        gloo, temperature, top_p):
    """mcore's log-probs (vocab-parallel cross entropy, or the gathered vocabulary
    for a top-p nucleus) are rljob.sampling's, as the torch engine's are."""
    from megatron.core import parallel_state

    from rljob.sampling import TokenDistribution, sampled_logprobs
    from rljob.trainer.mcore import vocab_parallel_logprobs

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 5, 40, generator=g)
    targets = torch.randint(0, 40, (2, 5), generator=g)
    dist = TokenDistribution(temperature, top_p)
    want = sampled_logprobs(logits, targets, dist)
    torch.testing.assert_close(vocab_parallel_logprobs(logits, targets, dist), want,
                               rtol=1e-5, atol=1e-5)
