"""Shared-prompt attention gives the unshared log-probs and gradients."""

from __future__ import annotations

import torch

from rljob.api.spec import ModelSpec
from rljob.models import build_model, load_tokenizer
from rljob.trainer.algorithms import make_batch, token_logprobs
from rljob.trainer.shared_prompt import pack_group, shared_prompt_logprobs

SPEC = ModelSpec(path="random:examples/models/tiny-qwen2", tokenizer="builtin:char",
                 dtype="float32")


def test_packed_group_equals_separate_sequences():
    tok = load_tokenizer(SPEC)
    model = build_model(SPEC, tok, seed=3)
    prompt = tok.encode("47+25=")
    g = torch.Generator().manual_seed(0)
    responses = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (1, 4, 2, 6)]

    # unshared: G padded sequences, each with the prompt
    b = make_batch([prompt] * len(responses), responses, tok.pad_token_id)
    logp = token_logprobs(model, b)
    unshared = [logp[i][b.mask[i].bool()] for i in range(len(responses))]
    loss_u = sum((x * (k + 1)).sum() for k, x in enumerate(unshared))
    model.zero_grad()
    loss_u.backward()
    grads_u = [p.grad.clone() for p in model.parameters()]

    # shared: one packed sequence with a block mask and per-response positions
    packed = pack_group(prompt, responses)
    assert packed.input_ids.shape[1] == len(prompt) + sum(map(len, responses))
    shared = shared_prompt_logprobs(model, packed)
    for a, s in zip(unshared, shared):
        assert torch.allclose(a, s, atol=1e-5), (a, s)
    loss_s = sum((x * (k + 1)).sum() for k, x in enumerate(shared))
    model.zero_grad()
    loss_s.backward()
    for gu, p in zip(grads_u, model.parameters()):
        assert torch.allclose(gu, p.grad, atol=1e-5, rtol=1e-4)
