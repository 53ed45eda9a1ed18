"""The model zoo (tests/zoo.py) through the real vLLM (CPU build): each checkpoint
loads as it is on disk (bf16, its embedding padded past the tokenizer, no
`random:`), takes an in-place update, never samples a padded id, and its
log-probs equal transformers' over the same ids after the update; then a LoRA
adapter (model.lora's defaults: every linear module of the layers) trained on it is
served by vLLM with the log-probs the trainer's PEFT model computes."""

from __future__ import annotations

import time

import pytest
import torch

from tests.tiers import import_or_skip  # noqa: E402
import_or_skip("vllm", "vllm", "the vLLM tier runs in tests/vllm/setup.sh's environment")

from rljob.api.spec import LoraSpec, ModelSpec, RolloutSpec  # noqa: E402
from rljob.inputs.data import prompt_ids  # noqa: E402
from rljob.inputs.models import build_model, load_tokenizer  # noqa: E402
from rljob.rollout.engine import SamplingParams  # noqa: E402
from rljob.sampling import TokenDistribution  # noqa: E402
from rljob.trainer.batch import make_batch, token_logprobs  # noqa: E402
from tests import zoo  # noqa: E402

TOL = 1e-4  # vLLM's CPU kernels and transformers' on one float32 model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return {name: zoo.build(name, root) for name in zoo.MODELS}


@pytest.mark.parametrize("name", zoo.MODELS)
def test_a_zoo_checkpoint_loads_in_vllm_updates_in_place_and_agrees(models, name):
    from rljob.rollout.vllm_engine import VLLMEngine

    spec = ModelSpec(path=str(models[name]), dtype="float32",
                     lora=LoraSpec(rank=8, alpha=16))  # served once loaded, below
    tok = load_tokenizer(spec)
    t0 = time.monotonic()
    engine = VLLMEngine(spec, RolloutSpec(engine="vllm", max_num_seqs=16), tok, "cpu", seed=0)
    print(f"{name}: vLLM started from the checkpoint in {time.monotonic() - t0:.1f} s")
    try:
        prompts = [prompt_ids(tok, p) for p in ("What is 2 + 3?", "What is 7 * 6?")]
        params = SamplingParams(n=4, max_new_tokens=8, temperature=0.8, top_p=0.9)
        before = engine.generate(prompts, params)  # the weights on disk
        assert all(len(g) == 4 for g in before)
        # the next version: the padded rows now the most likely tokens by far
        model = build_model(spec, tok, dtype=torch.float32).eval()
        head = model.get_output_embeddings().weight
        with torch.no_grad():
            head[len(tok):] = head[:len(tok)].abs().max() * 50
        engine.load_weights(model.state_dict(), 1)
        after = engine.generate(prompts, params)
        dist = TokenDistribution(0.8, 0.9, len(tok))
        worst = _worst(model, tok, prompts, after, dist)
        print(f"{name}: |vLLM - transformers| log-prob after the update: {worst:.2e}")
        assert worst < TOL
        # model.lora: the trainer's PEFT adapter on this model, as if trained, the
        # version the adapter alone (the base is version 1's)
        from peft import get_peft_model

        from rljob.trainer.lora import adapter_tensors, lora_config

        lora = get_peft_model(model, lora_config(spec.lora, model)).eval()
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n, p in lora.named_parameters():
                if ".lora_B." in n:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
        state = dict(adapter_tensors(lora))
        assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in state} == {
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
        engine.load_weights(state, 2)
        adapted = engine.generate(prompts, params)
        worst = _worst(lora, tok, prompts, adapted, dist)
        with lora.disable_adapter():
            base = _worst(lora, tok, prompts, adapted, dist)
        print(f"{name}: LoRA served: |vLLM - PEFT| log-prob {worst:.2e} (the base alone "
              f"{base:.2f} away)")
        assert worst < TOL < base
    finally:
        engine.close()


def _worst(model, tok, prompts, groups, dist) -> float:
    """The largest |vLLM log-prob - `model`'s| over the groups' sampled tokens; no
    padded id sampled."""
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for gen in group:
            assert all(t < len(tok) for t in gen.response_ids), gen.response_ids
            b = make_batch([prompt], [gen.response_ids], tok.pad_token_id)
            with torch.no_grad():
                ref = token_logprobs(model, b, dist)[0][b.mask[0].bool()]
            worst = max(worst, (torch.tensor(gen.logprobs) - ref).abs().max().item())
    return worst
