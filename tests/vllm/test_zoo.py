"""The model zoo (tests/zoo.py) through the real vLLM (CPU build): each checkpoint
loads as it is on disk (bf16, its embedding padded past the tokenizer, no
`random:`), takes an in-place update, never samples a padded id, and its
log-probs equal transformers' over the same ids after the update."""

from __future__ import annotations

import time

import pytest
import torch

from tests.tiers import import_or_skip  # noqa: E402
import_or_skip("vllm", "vllm", "the vLLM tier runs in tests/vllm/setup.sh's environment")

from rljob.api.spec import ModelSpec, RolloutSpec  # noqa: E402
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

    spec = ModelSpec(path=str(models[name]), dtype="float32")
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
        worst = 0.0
        for prompt, group in zip(prompts, after):
            for gen in group:
                assert all(t < len(tok) for t in gen.response_ids), gen.response_ids
                b = make_batch([prompt], [gen.response_ids], tok.pad_token_id)
                with torch.no_grad():
                    ref = token_logprobs(model, b, dist)[0][b.mask[0].bool()]
                worst = max(worst, (torch.tensor(gen.logprobs) - ref).abs().max().item())
        print(f"{name}: |vLLM - transformers| log-prob after the update: {worst:.2e}")
        assert worst < TOL
    finally:
        engine.close()
