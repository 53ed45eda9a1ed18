"""Shared-prompt attention gives the unshared log-probs and gradients."""

from __future__ import annotations

import torch

from rljob.api.spec import ModelSpec
from rljob.inputs.models import build_model, load_tokenizer
from rljob.trainer.batch import make_batch, token_logprobs
from rljob.trainer.packing import pack, packed_logprobs

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
    packed = pack([prompt] * len(responses), responses, share=True)
    assert packed.input_ids.shape[1] == len(prompt) + sum(map(len, responses))
    logp_s = packed_logprobs(model, packed, tuple(b.mask.shape))
    shared = [logp_s[i][b.mask[i].bool()] for i in range(len(responses))]
    for a, s in zip(unshared, shared):
        assert torch.allclose(a, s, atol=1e-5), (a, s)
    loss_s = sum((x * (k + 1)).sum() for k, x in enumerate(shared))
    model.zero_grad()
    loss_s.backward()
    for gu, p in zip(grads_u, model.parameters()):
        assert torch.allclose(gu, p.grad, atol=1e-5, rtol=1e-4)


def test_packed_micro_batches_equal_the_padded_one():
    """trainer.packing: a micro-batch of two groups with mixed lengths, as one packed
    sequence per sample (`sequences`) and with one prompt copy per group
    (`shared_prompt`): the same log-probs in the padded layout and the same gradients,
    on fewer tokens."""
    from rljob.trainer.packing import padded_tokens

    tok = load_tokenizer(SPEC)
    model = build_model(SPEC, tok, seed=5)
    g = torch.Generator().manual_seed(1)
    groups = [tok.encode("47+25="), tok.encode("3+4=")]
    prompts = [p for p in groups for _ in range(3)]
    responses = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (1, 7, 3, 2, 9, 4)]
    results = {}
    for layout in ("none", "sequences", "shared_prompt"):
        b = make_batch(prompts, responses, tok.pad_token_id, layout)
        logp = token_logprobs(model, b)
        loss = (logp * b.mask * torch.arange(1, logp.shape[1] + 1)).sum()
        model.zero_grad()
        loss.backward()
        results[layout] = (logp.detach(), [p.grad.clone() for p in model.parameters()],
                           b.packed.tokens if b.packed is not None else None)
        if b.packed is not None:  # rows as long as the longest segment, fewer than samples
            assert b.packed.input_ids.numel() <= padded_tokens(prompts, responses), layout
            assert b.packed.input_ids.shape[0] <= len(prompts), layout
    padded, grads, _ = results["none"]
    for layout in ("sequences", "shared_prompt"):
        logp, g2, tokens = results[layout]
        assert torch.allclose(padded * b.mask, logp, atol=1e-5), layout
        for a, c in zip(grads, g2):
            assert torch.allclose(a, c, atol=1e-5, rtol=1e-4), layout
    assert padded_tokens(prompts, responses) == 6 * max(
        len(p) + len(r) for p, r in zip(prompts, responses))
    assert results["sequences"][2] == sum(map(len, prompts)) + sum(map(len, responses))
    assert results["shared_prompt"][2] == len(groups[0]) + len(groups[1]) + sum(map(len, responses))


def test_token_balanced_split_gives_each_rank_its_share_once():
    from rljob.trainer.source import Sample, data_parallel_shard

    lengths = [40, 3, 3, 3, 38, 4, 2, 3]
    chunk = [Sample(i, i // 2, 0, [1, 2], [5] * n, [0.0] * n, 0.0, 0.0, 0.0, 0.0)
             for i, n in enumerate(lengths)]
    rr = [data_parallel_shard(chunk, r, 2, "round_robin") for r in (0, 1)]
    tb = [data_parallel_shard(chunk, r, 2, "token_balanced") for r in (0, 1)]
    for shards in (rr, tb):
        assert sorted(s.slot for sh in shards for s in sh) == list(range(8))
        assert [len(sh) for sh in shards] == [4, 4]
    tokens = lambda sh: sum(len(s.prompt_ids) + len(s.response_ids) for s in sh)  # noqa: E731
    spread = lambda shards: abs(tokens(shards[0]) - tokens(shards[1]))  # noqa: E731
    assert spread(tb) <= spread(rr) and spread(tb) <= 2


def test_bins_first_fit_decreasing_never_split_a_segment():
    from rljob.trainer.packing import bins

    assert bins([14, 3, 5, 9, 2], 14) == [[0], [3, 2], [1, 4]]
    assert bins([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
