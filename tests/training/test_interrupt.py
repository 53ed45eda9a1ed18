"""weightUpdate interrupt on the hf engine, with real torch on a tiny model: an update
stops generation at a token boundary and the rows go on under the new weights."""

from __future__ import annotations

import threading

import torch

from rljob.rollout.engine import HFEngine, SamplingParams
from rljob.rollout.updates import UpdateGate
from rljob.workflow.versions import changed, token_versions
from rljob.sampling import TokenDistribution
from rljob.trainer.batch import make_batch, token_logprobs
from tests.training.test_algorithms import tiny


def _perturbed(model, scale: float = 0.05) -> dict:
    g = torch.Generator().manual_seed(7)
    return {k: v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
            for k, v in model.state_dict().items()}


def _logprobs(model, prompt, responses, dist):
    b = make_batch([prompt] * len(responses), responses, 0)
    with torch.no_grad():
        logp = token_logprobs(model, b, dist)
    return [logp[i][b.mask[i].bool()] for i in range(len(responses))]


def test_an_update_interrupts_generation_and_the_rows_go_on_under_the_new_weights():
    """Version 0 generates; after a few decode steps version 1 is loaded through the
    gate. Every row that was still going carries a change point; its tokens before
    it are the ones an uninterrupted call draws, with version 0's log-probs, and its
    tokens after it have version 1's log-probs (the trainer's definition, 1e-4)."""
    tok, model = tiny()
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(model)
    prompt = tok.encode("12+30=")
    params = SamplingParams(n=4, max_new_tokens=40, seed=3, temperature=1.0, top_p=1.0)
    dist = TokenDistribution(1.0, 1.0, vocab=len(tok))

    plain = HFEngine(model, tok)
    plain.load_weights(old, 0, epoch=5)
    [whole] = plain.generate([prompt], params)

    engine = HFEngine(model, tok).interruptible()
    engine.load_weights(old, 0, epoch=5)
    forwards, third = [0], threading.Event()

    def count(module, args):
        forwards[0] += 1
        if forwards[0] == 3:
            third.set()

    hook = model.register_forward_pre_hook(count)
    got: list = []
    worker = threading.Thread(target=lambda: got.extend(engine.generate([prompt], params)))
    worker.start()
    try:
        assert third.wait(60), "generation never started"
        engine.gate.update(lambda: engine.load_weights(new, 1, epoch=5))
    finally:
        worker.join(120)
        hook.remove()
    [group] = got
    assert engine.version == 1
    interrupted = [g for g in group if len(g.versions) == 2]
    assert interrupted, [g.versions for g in group]
    for g, w in zip(group, whole):
        assert g.versions[0] == (0, 0, 5)
        at = g.versions[1][0] if len(g.versions) == 2 else len(g.response_ids)
        if len(g.versions) == 2:
            assert g.versions[1][1:] == (1, 5) and 3 <= at < len(g.response_ids)
        # before the update: what the uninterrupted call drew, bit for bit
        assert g.response_ids[:at] == w.response_ids[:at]
        assert g.logprobs[:at] == w.logprobs[:at]
        assert token_versions(g.versions, len(g.response_ids)) == \
            [0] * at + [1] * (len(g.response_ids) - at)
    model.load_state_dict(old)
    before = _logprobs(model, prompt, [g.response_ids for g in interrupted], dist)
    model.load_state_dict(new)
    after = _logprobs(model, prompt, [g.response_ids for g in interrupted], dist)
    for g, lo, ln in zip(interrupted, before, after):
        at = g.versions[1][0]
        got_lp = torch.tensor(g.logprobs)
        assert float((got_lp[:at] - lo[:at]).abs().max()) < 1e-4
        assert float((got_lp[at:] - ln[at:]).abs().max()) < 1e-4
        assert float((lo[at:] - ln[at:]).abs().max()) > 1e-3  # the weights did change


def test_without_an_update_an_interruptible_engine_draws_what_a_draining_one_does():
    tok, model = tiny()
    params = SamplingParams(n=4, max_new_tokens=24, seeds=(11, 22), top_p=0.9)
    prompts = [tok.encode("12+30="), tok.encode("1000000+2300000=")]
    a = HFEngine(model, tok).generate(prompts, params)
    b = HFEngine(model, tok).interruptible().generate(prompts, params)
    assert [[(g.response_ids, g.logprobs) for g in x] for x in a] == \
        [[(g.response_ids, g.logprobs) for g in x] for x in b]
    assert all(g.versions == [(0, -1, 0)] for x in b for g in x)


def test_an_update_waits_for_the_stretch_in_progress_and_the_next_waits_for_the_update():
    gate = UpdateGate()
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def stretch():
        with gate.generating():
            inside.set()
            release.wait(10)
            order.append("stretch")

    t = threading.Thread(target=stretch)
    t.start()
    assert inside.wait(10)
    u = threading.Thread(target=lambda: gate.update(lambda: order.append("load")))
    u.start()
    while not gate.requested():
        pass
    release.set()
    t.join(10)
    u.join(10)
    assert order == ["stretch", "load"] and not gate.requested()


def test_change_points_and_token_versions():
    c = changed([], 0, 3, 1)
    assert c == [(0, 3, 1)] and changed(c, 5, 3, 1) == c
    c = changed(c, 5, 4, 1)
    assert c == [(0, 3, 1), (5, 4, 1)]
    assert token_versions(c, 7) == [3] * 5 + [4] * 2
    assert token_versions(c, 4) == [3] * 4
    # a version that generated nothing leaves no change point
    assert changed(c, 5, 6, 1) == [(0, 3, 1), (5, 6, 1)]
    assert changed([(0, 3, 1), (5, 4, 1)], 5, 3, 1) == [(0, 3, 1)]
    assert changed([(0, 3, 1)], 0, 4, 1) == [(0, 4, 1)]


def test_weights_of_a_new_trainer_life_start_the_batch_again():
    """An update from a restarted trainer (another epoch) mid-generation: the dead
    life's tokens would be refused, so every row starts again under the new weights
    and draws what a fresh call under them draws, bit for bit."""
    tok, model = tiny()
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new = _perturbed(model)
    prompt = tok.encode("12+30=")
    params = SamplingParams(n=4, max_new_tokens=40, seed=3)
    fresh = HFEngine(model, tok)
    fresh.load_weights(new, 2, epoch=9)
    [expected] = fresh.generate([prompt], params)
    model.load_state_dict(old)

    engine = HFEngine(model, tok).interruptible()
    engine.load_weights(old, 4, epoch=5)
    forwards, third = [0], threading.Event()

    def count(module, args):
        forwards[0] += 1
        if forwards[0] == 3:
            third.set()

    hook = model.register_forward_pre_hook(count)
    got: list = []
    worker = threading.Thread(target=lambda: got.extend(engine.generate([prompt], params)))
    worker.start()
    try:
        assert third.wait(60), "generation never started"
        engine.gate.update(lambda: engine.load_weights(new, 2, epoch=9))
    finally:
        worker.join(120)
        hook.remove()
    [group] = got
    assert [g.versions for g in group] == [[(0, 2, 9)]] * 4
    assert [(g.response_ids, g.logprobs) for g in group] == \
        [(g.response_ids, g.logprobs) for g in expected]
