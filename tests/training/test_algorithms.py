"""GRPO pieces with real torch on a tiny model."""

from __future__ import annotations

import copy

import pytest
import torch

from rljob.api.spec import ModelSpec
from rljob.inputs.models import build_model, load_tokenizer
from rljob.api.spec import AlgorithmSpec
from rljob.trainer.algorithms import PolicyInputs, group_advantages, k3_kl, policy_loss
from rljob.trainer.batch import make_batch, token_logprobs

SPEC = ModelSpec(path="random:examples/models/tiny-qwen2", tokenizer="builtin:char",
                 dtype="float32")


def tiny():
    tok = load_tokenizer(SPEC)
    return tok, build_model(SPEC, tok, seed=0)


def test_group_advantages_are_normalised_within_each_group():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 4.0]),
                           torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0, 0.0, -1.0, 1.0]), atol=1e-4)


def test_k3_is_nonnegative_and_zero_at_the_reference():
    logp = torch.randn(100)
    assert (k3_kl(logp, logp) == 0).all()
    assert (k3_kl(logp, torch.randn(100)) >= 0).all()


def _samples(tok, n=8):
    g = torch.Generator().manual_seed(0)
    prompts = [tok.encode(f"{i}+{i + 3}=") for i in range(n)]
    responses = [torch.randint(3, 20, (int(torch.randint(1, 6, (1,), generator=g)),),
                               generator=g).tolist() for _ in range(n)]
    rewards = torch.rand(n, generator=g)
    groups = torch.arange(n) // 4
    return prompts, responses, group_advantages(rewards, groups)


def on_policy_loss(logp, ref_logp, adv, mask, responses_in_step, kl_coef=0.05):
    """The default policy loss of samples the step's own weights made, whose rollout
    log-probs equal the trainer's."""
    algo = AlgorithmSpec.model_validate({"name": "ppo", "groupSize": 1, "klCoef": kl_coef,
                                         "promptsPerStep": responses_in_step,
                                         "samplesPerMicroBatch": 1})
    fresh = torch.ones(logp.shape[0], dtype=torch.bool)
    return policy_loss(algo)(PolicyInputs(logp, logp.detach(), logp.detach(), ref_logp, adv,
                                          mask, fresh))


def _grads(model, tok, prompts, responses, adv, chunks):
    model.zero_grad()
    ref = copy.deepcopy(model)
    n = len(prompts)
    for idx in chunks:
        b = make_batch([prompts[i] for i in idx], [responses[i] for i in idx], tok.pad_token_id)
        logp = token_logprobs(model, b)
        with torch.no_grad():
            ref_logp = token_logprobs(ref, b) - 0.1  # a reference that differs
        parts = on_policy_loss(logp, ref_logp, adv[idx], b.mask, n)
        parts.loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_micro_batch_accumulation_equals_the_full_batch_gradient():
    tok, model = tiny()
    prompts, responses, adv = _samples(tok)
    full = _grads(model, tok, prompts, responses, adv, [list(range(8))])
    for split in ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 1, 2], [3, 4, 5, 6], [7]]):
        micro = _grads(model, tok, prompts, responses, adv, split)
        for a, b in zip(full, micro):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_on_policy_ratio_is_one_and_the_surrogate_follows_the_advantage():
    tok, model = tiny()
    prompts, responses, adv = _samples(tok, 4)
    b = make_batch(prompts, responses, tok.pad_token_id)
    logp = token_logprobs(model, b)
    parts = on_policy_loss(logp, logp.detach(), adv, b.mask, 4, kl_coef=0.0)
    assert parts.kl == 0 and parts.clip_frac == 0
    figures = parts.stats.figures()
    assert figures["is_weight_mean"] == figures["is_weight_max"] == figures["is_ess"] == 1.0
    assert figures["logp_mismatch_mean"] == figures["is_capped"] == 0.0
    assert abs(float(parts.loss.detach()) + float(adv.sum()) / 4) < 1e-5  # -Σ A / N at ratio 1


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)])
def test_rollout_logprobs_match_the_trainers_for_the_same_weights(temperature, top_p):
    """One definition: the hf engine's log-prob of a sampled token and the trainer's
    are the same number at any temperature and top-p (the tempered, nucleus-
    renormalised distribution), and differ from the model's plain softmax."""
    from rljob.rollout.engine import HFEngine, SamplingParams
    from rljob.sampling import TokenDistribution

    tok, model = tiny()
    params = SamplingParams(n=8, max_new_tokens=8, seed=1, temperature=temperature,
                            top_p=top_p)
    gen = HFEngine(model, tok).generate([tok.encode("12+30=")], params)[0]
    b = make_batch([tok.encode("12+30=")] * 8, [g.response_ids for g in gen], tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, b, TokenDistribution(temperature, top_p))
        plain = token_logprobs(model, b)
    worst = 0.0
    for i, g in enumerate(gen):
        got = logp[i][b.mask[i].bool()]
        worst = max(worst, float((got - torch.tensor(g.logprobs)).abs().max()))
    assert worst < 1e-4
    if (temperature, top_p) != (1.0, 1.0):
        assert float((logp - plain).abs().max()) > 1e-2


def test_right_padding_changes_no_logprob_of_a_real_token():
    """token_logprobs runs without a padding mask: a sequence's log-probs alone and
    in a batch padded to a longer one must agree on its response tokens."""
    tok, model = tiny()
    prompts, responses, _ = _samples(tok)
    prompts[0] = prompts[0] + tok.encode("123456789", add_special_tokens=False)  # the longest
    batch = make_batch(prompts, responses, tok.pad_token_id)
    padded = token_logprobs(model, batch)
    assert (batch.attention_mask == 0).any()  # some rows really are padded
    for i, (p, r) in enumerate(zip(prompts, responses)):
        alone = make_batch([p], [r], tok.pad_token_id)
        own = token_logprobs(model, alone)[0][alone.mask[0].bool()]
        torch.testing.assert_close(padded[i][batch.mask[i].bool()], own, rtol=1e-5, atol=1e-5)


def test_a_group_samples_the_same_alone_and_inside_a_batch_of_groups():
    """Several groups generated in one call (rollout.maxNumSeqs): each group's samples
    and their log-probs depend on its own seed only, bit for bit, not on the batch it
    was generated in (prompts of other lengths, one in another width bucket)."""
    from rljob.rollout.engine import HFEngine, SamplingParams, prompt_width

    tok, model = tiny()
    engine = HFEngine(model, tok)
    prompts = [tok.encode("12+30="), tok.encode("7+5="), tok.encode("1000000+2300000=")]
    assert prompt_width(len(prompts[0])) < prompt_width(len(prompts[2]))
    params = SamplingParams(n=4, max_new_tokens=8, temperature=1.0, top_p=0.9)
    together = engine.generate(prompts, SamplingParams(**{**params.__dict__,
                                                          "seeds": (11, 22, 33)}))
    for prompt, seed, got in zip(prompts, (11, 22, 33), together):
        alone = engine.generate([prompt], SamplingParams(**{**params.__dict__, "seed": seed}))[0]
        assert [g.response_ids for g in got] == [g.response_ids for g in alone]
        assert [g.logprobs for g in got] == [g.logprobs for g in alone]
    # a batch of fewer rows than the machine's BLAS computes alike (`row_floor`)
    # computes the same bits as a batch of more
    one = SamplingParams(n=1, max_new_tokens=8, top_p=0.9)
    single = engine.generate([prompts[0]], SamplingParams(**{**one.__dict__, "seed": 11}))[0]
    others = range(1, engine.min_rows + 3)
    short = [prompts[0]] + [tok.encode(f"{a}+{a}=") for a in others]
    assert len({prompt_width(len(p)) for p in short}) == 1  # one generate of them all
    many = engine.generate(short, SamplingParams(**{**one.__dict__, "seeds": (11, *others)}))
    assert [(g.response_ids, g.logprobs) for g in single] == [
        (g.response_ids, g.logprobs) for g in many[0]]
    # different seeds draw different samples
    assert [g.response_ids for g in together[0]] != [
        g.response_ids for g in engine.generate([prompts[0]], SamplingParams(
            **{**params.__dict__, "seed": 12}))[0]]


@pytest.mark.parametrize("shapes", [((128, 256), (256, 128), (128, 1000)), ((896, 896),)])
def test_from_the_row_floor_up_every_row_count_computes_each_row_alike(shapes):
    """`row_floor` measures where this machine's BLAS stops running small row counts
    on kernels of their own: from it up to ROW_PROBE rows, each row of a product has
    the bits it has in a product of ROW_PROBE rows (checked at every count here)."""
    from rljob.rollout.engine import MIN_ROWS, ROW_PROBE, row_floor

    floor = row_floor(shapes)
    assert MIN_ROWS <= floor <= ROW_PROBE  # at ROW_PROBE the engine pads to it: nothing to check
    gen = torch.Generator().manual_seed(1)
    for k, n in shapes:
        w, x = torch.randn(n, k, generator=gen), torch.randn(ROW_PROBE, k, generator=gen)
        whole = torch.nn.functional.linear(x, w)
        unlike = [rows for rows in range(floor, ROW_PROBE)
                  if not torch.equal(torch.nn.functional.linear(x[:rows], w), whole[:rows])]
        assert not unlike, f"{k}x{n}: rows {unlike[:5]} differ from the floor {floor} up"


def test_a_stop_text_ends_each_row_where_it_is_spelled_and_ends_the_call_early():
    """`SamplingParams.stop` (an environment's tool-call close tag): each row ends at
    the token that completes the text, with the tokens and log-probs of a call
    without it, and the call decodes only until every row has ended."""
    from rljob.rollout.engine import HFEngine, SamplingParams

    tok, model = tiny()
    engine = HFEngine(model, tok)
    prompt = [tok.encode("12+30=")]
    for seed in range(5, 50):  # a seed whose rows spell one character in common
        params = SamplingParams(n=3, max_new_tokens=48, seed=seed)
        free = engine.generate(prompt, params)[0]
        texts = [tok.decode(g.response_ids) for g in free]
        chars = set.intersection(*(set(t) for t in texts))
        if chars:
            break
    engine.take_timings()
    # the character every row spells soonest, so that the call can end early
    stop = min(chars, key=lambda c: max(t.index(c) for t in texts))
    cut = engine.generate(prompt, SamplingParams(**{**params.__dict__, "stop": stop}))[0]
    [timing] = engine.take_timings()
    ends = []
    for f, c in zip(free, cut):
        end = next((k + 1 for k in range(len(f.response_ids))
                    if stop in tok.decode(f.response_ids[:k + 1])), len(f.response_ids))
        ends.append(end)
        assert c.response_ids == f.response_ids[:end] and c.logprobs == f.logprobs[:end]
    assert max(ends) < params.max_new_tokens  # every row ended early, so the call did
    assert timing.steps == max(ends), (timing.steps, ends)
    print("stop", repr(stop), "rows end at", ends, "of", [len(f.response_ids) for f in free])


def test_every_prompt_is_padded_to_a_bucket_with_at_least_one_pad():
    from rljob.rollout.engine import PROMPT_BUCKET, prompt_width

    for n in range(0, 70):
        w = prompt_width(n)
        assert w % PROMPT_BUCKET == 0 and n < w <= n + PROMPT_BUCKET


def test_seeded_sampling_follows_the_distribution():
    from rljob.sampling import TokenDistribution, seeded_sample

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(40_000, 1)
    u = torch.rand(40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    freq = torch.bincount(seeded_sample(logits, u, TokenDistribution()), minlength=4) / 40_000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.01)
    # top-p 0.75: the nucleus is {0.5, 0.3}, renormalised
    freq = torch.bincount(seeded_sample(logits, u, TokenDistribution(1.0, 0.75)),
                          minlength=4) / 40_000
    assert torch.allclose(freq, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.01)


def test_a_micro_step_reads_nothing_back_from_the_device_and_a_step_reads_its_figures_once():
    """Each value read back to the host (`item`, `float(tensor)`, a boolean selection's
    size) waits for the device: a micro-step reads none (its figures stay on the
    device as one tensor), and `step_figures` reads a step's in one copy, with the
    same sums as the figures read one by one."""
    from pathlib import Path

    import numpy as np
    from torch.profiler import ProfilerActivity, profile

    from rljob.api.validation import load_rljob
    from rljob.infra.device import activate, resolve
    from rljob.preflight import resolve_paths
    from rljob.trainer.algorithms import LossParts, OffPolicyStats
    from rljob.trainer.policy import make_policy
    from rljob.trainer.source import Sample
    from rljob.trainer.step import micro_step, step_figures

    repo = Path(__file__).resolve().parents[2]
    spec = resolve_paths(load_rljob(str(repo / "examples/quickstart.yaml")),
                         repo / "examples").spec
    tok = load_tokenizer(spec.model)
    device = resolve("cpu")
    policy = make_policy(spec, tok, device, activate(device), 0, 1)
    policy.freeze_reference()
    rng = np.random.default_rng(0)
    g = spec.algorithm.group_size
    shard = [Sample(i, i // g, int(i % 3 == 0), [5, 6, 7, 8][: 2 + i % 3], [9, 10, 11][: 1 + i % 3],
                    [-1.5] * 3, float(rng.random()), 0.0, 0.0, 0.0, advantage=float(rng.normal()),
                    ref_logp=[-1.0] * 3) for i in range(spec.algorithm.micro_samples)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        figures = [micro_step(policy, shard, 1, tok, spec, last=False) for _ in range(2)]
    reads = [e for e in prof.events() if e.name == "aten::_local_scalar_dense"]
    assert reads == [], len(reads)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sums, stats = step_figures(figures, data_world=2)
    assert not [e for e in prof.events() if e.name == "aten::_local_scalar_dense"]
    # the same as reading each micro-step's figures on its own (LossParts' properties)
    parts = [LossParts(f[0], f[1:]) for f in figures]
    assert sums == {"loss": sum(float(p.loss) * 2 / 2 for p in parts),
                    "kl": sum(p.kl / 2 for p in parts), "clip": sum(p.clip_frac / 2 for p in parts)}
    merged = OffPolicyStats()
    for p in parts:
        merged = merged.merge(p.stats)
    assert stats == merged and stats.tokens == 2 * sum(min(3, len(s.response_ids))
                                                       for s in shard)
