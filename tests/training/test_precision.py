"""Trainer numerics: float32 master weights under bfloat16 compute, and gradient
clipping, on the trainer's own policy class (CPU autocast computes bfloat16 as
an accelerator does)."""

from __future__ import annotations

import torch

from rljob.api.spec import RLJobSpec
from rljob.infra.device import resolve
from rljob.inputs.models import build_model, load_tokenizer
from rljob.trainer.batch import make_batch, token_logprobs
from rljob.trainer.policy import TorchPolicy

SPEC = RLJobSpec.model_validate({
    "model": {"path": "random:examples/models/tiny-qwen2", "tokenizer": "builtin:char",
              "dtype": "bfloat16"},
    "dataset": {"path": "examples/data/arith.jsonl"},
    "accelerator": {"type": "cpu"},
})


def _batch(tok):
    prompts = [tok.encode(f"{i}+{i + 3}=") for i in range(8)]
    responses = [tok.encode(str(2 * i + 3), add_special_tokens=False) for i in range(8)]
    return make_batch(prompts, responses, tok.pad_token_id)


def _nll(logp, batch):
    return -(logp * batch.mask).sum() / batch.mask.sum()


def _changed(before: dict, after: dict) -> float:
    """The fraction of weight elements an update changed."""
    n = sum(v.numel() for v in before.values())
    return sum(int((before[k] != after[k]).sum()) for k in before) / n


def test_a_bfloat16_policy_learns_at_an_rl_learning_rate():
    tok = load_tokenizer(SPEC.model)
    batch = _batch(tok)

    # what an optimizer stepping bfloat16 weights directly does at lr 1e-6
    naive = build_model(SPEC.model, tok, seed=0, dtype=torch.bfloat16)
    before = {k: v.clone() for k, v in naive.state_dict().items()}
    opt = torch.optim.AdamW(naive.parameters(), lr=1e-6, weight_decay=0.0)
    _nll(token_logprobs(naive, batch), batch).backward()
    opt.step()
    lost = _changed(before, naive.state_dict())

    policy = TorchPolicy(SPEC, tok, resolve("cpu"), torch.device("cpu"), 0, 1,
                         compute=torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # the master copy
    master0 = {k: v.clone() for k, v in policy.model.state_dict().items()}
    sent0 = policy.hf_state()
    assert {v.dtype for v in sent0.values()} == {torch.bfloat16}  # what rollouts load
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
    for _ in range(10):
        opt.zero_grad()
        logp = policy.logprobs(batch)
        assert logp.dtype == torch.float32
        _nll(logp, batch).backward()
        policy.clip_grad_norm(1.0)
        opt.step()
    kept = _changed(master0, policy.model.state_dict())
    sent = _changed(sent0, policy.hf_state())
    print(f"elements changed at lr 1e-6: bf16 weights stepped directly {lost:.4f} "
          f"(1 step); fp32 master {kept:.4f}; the bf16 weights sent {sent:.4f} (10 steps)")
    assert lost < 0.05  # the failure mode this guards against: updates lost
    assert kept > 0.95  # every weight with a gradient moves
    assert sent > 10 * max(lost, 1e-4)  # and the moves reach what rollouts generate with


def test_gradients_are_clipped_to_max_grad_norm():
    tok = load_tokenizer(SPEC.model)
    batch = _batch(tok)
    policy = TorchPolicy(SPEC, tok, resolve("cpu"), torch.device("cpu"), 0, 1)
    _nll(policy.logprobs(batch), batch).backward()
    grads = [p.grad.clone() for p in policy.parameters()]
    norm = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item()
    assert abs(policy.clip_grad_norm(0.0) - norm) < 1e-3 * norm  # 0: reported, not clipped
    assert all(torch.equal(p.grad, g) for p, g in zip(policy.parameters(), grads))
    assert norm > 0.05
    assert abs(policy.clip_grad_norm(norm / 4) - norm) < 1e-3 * norm
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in policy.parameters()]))
    assert abs(clipped.item() - norm / 4) < 1e-3 * norm
    for p, g in zip(policy.parameters(), grads):  # same direction
        assert torch.allclose(p.grad, g / 4, rtol=1e-3, atol=1e-9)
    policy.clip_grad_norm(10 * norm)  # a norm under the bound is left alone
    assert all(torch.allclose(p.grad, g / 4, rtol=1e-3, atol=1e-9)
               for p, g in zip(policy.parameters(), grads))


def test_the_frozen_reference_keeps_its_matrices_in_the_compute_dtype_and_its_bits():
    """The reference computes under the same autocast as the policy: its matrix
    weights are stored in bfloat16 (about half the memory of a float32 copy) and its
    log-probs equal, bit for bit, those of a float32 copy of the same weights."""
    import copy

    tok = load_tokenizer(SPEC.model)
    batch = _batch(tok)
    policy = TorchPolicy(SPEC, tok, resolve("cpu"), torch.device("cpu"), 0, 1,
                         compute=torch.bfloat16)
    float32_ref = copy.deepcopy(policy.model).eval()
    policy.freeze_reference()
    dtypes = {n: p.dtype for n, p in policy.ref.named_parameters()}
    assert {d for n, d in dtypes.items() if n.endswith("proj.weight")} == {torch.bfloat16}
    assert dtypes["model.embed_tokens.weight"] == torch.float32  # autocast leaves it
    assert {d for n, d in dtypes.items() if "norm" in n} == {torch.float32}
    nbytes = sum(p.numel() * p.element_size() for p in policy.ref.parameters())
    full = sum(p.numel() * p.element_size() for p in float32_ref.parameters())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = token_logprobs(float32_ref, batch).float()
    got = policy.ref_logprobs(batch)
    print(f"reference: {nbytes / 1e6:.2f} MB in bfloat16 matrices, {full / 1e6:.2f} MB "
          "in float32")
    assert nbytes < 0.75 * full
    assert torch.equal(got, want)
