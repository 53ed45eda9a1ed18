"""The rollout's vLLM engine against the real vLLM (CPU build) on the tiny model:
log-probs equal transformers', weights update in place, many groups in flight."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tests.tiers import import_or_skip  # noqa: E402
import_or_skip("vllm", "vllm", "the vLLM tier runs in tests/vllm/setup.sh's environment")

from rljob.api.spec import ModelSpec, RolloutSpec  # noqa: E402
from rljob.inputs.models import build_model, load_tokenizer
from rljob.rollout.engine import SamplingParams
from rljob.trainer.batch import make_batch, token_logprobs

MODEL = ModelSpec(path="random:examples/models/tiny-qwen2", tokenizer="builtin:char",
                  dtype="float32")
TOL = 1e-5


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MODEL)


@pytest.fixture(scope="module")
def engine(tok):
    from rljob.rollout.vllm_engine import VLLMEngine

    t0 = time.monotonic()
    # an episodic job's engine (the prefix cache in 32-token blocks on CPU); single
    # prompts run on it as on any other
    e = VLLMEngine(MODEL, RolloutSpec(engine="vllm", max_num_seqs=64,
                                      environment="calculator"), tok, "cpu", seed=0)
    print(f"vLLM engine started in {time.monotonic() - t0:.1f} s")
    yield e
    e.close()


def _policy(tok, seed: int, noise: float = 0.0):
    model = build_model(MODEL, tok, seed=seed, dtype=torch.float32).eval()
    if noise:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn(p.shape, generator=g))
    return model


def _max_error(model, tok, prompts, groups) -> float:
    """The largest |vLLM log-prob - transformers log-prob| over every sampled token."""
    worst = 0.0
    for prompt, group in zip(prompts, groups):
        for gen in group:
            b = make_batch([prompt], [gen.response_ids], tok.pad_token_id)
            with torch.no_grad():
                ref = token_logprobs(model, b)[0][b.mask[0].bool()]
            assert len(gen.logprobs) == len(gen.response_ids) == len(ref)
            worst = max(worst, (torch.tensor(gen.logprobs) - ref).abs().max().item())
    return worst


PROMPTS_TEXT = ["12+34=", "7+8=", "99+1=", "40+2="]
PARAMS = SamplingParams(n=4, max_new_tokens=12, temperature=1.0, top_p=1.0)


def test_generation_log_probs_equal_transformers_and_updates_take_effect(engine, tok):
    prompts = [tok.encode(t) for t in PROMPTS_TEXT]
    first = _policy(tok, seed=0)
    engine.load_weights(first.state_dict(), 0)
    groups = engine.generate(prompts, PARAMS)
    assert [len(g) for g in groups] == [4] * len(prompts)
    err0 = _max_error(first, tok, prompts, groups)

    second = _policy(tok, seed=0, noise=0.05)  # a trainer's next version
    engine.load_weights(second.state_dict(), 1)
    assert engine.version == 1
    print(f"weight update: drain {engine.drain_seconds * 1e3:.1f} ms, "
          f"reload {engine.reload_seconds * 1e3:.1f} ms")
    after = engine.generate(prompts, PARAMS)
    err1 = _max_error(second, tok, prompts, after)
    stale = _max_error(first, tok, prompts, after)  # the old weights do not explain them
    print(f"max |logp error| vs transformers: {err0:.2e} (v0), {err1:.2e} (v1); "
          f"v1 samples under v0 weights: {stale:.2e}")
    assert err0 < TOL and err1 < TOL
    assert stale > 100 * TOL


def test_hf_vllm_and_the_trainer_give_one_log_prob_at_temperature_and_top_p(engine, tok):
    """One definition of a token's log-prob (rljob.sampling): at T=0.7, top-p 0.9 on
    the same weights, vLLM's log-prob of each token it sampled (processed_logprobs),
    transformers' row forward's (`row_logprobs`, the reference task's) and the
    trainer's agree; vLLM's raw softmax would not."""
    from rljob.sampling import TokenDistribution, row_logprobs

    model = _policy(tok, seed=0, noise=0.05)  # a peaked, trained-looking distribution
    engine.load_weights(model.state_dict(), 5)
    dist = TokenDistribution(0.7, 0.9)
    params = SamplingParams(n=8, max_new_tokens=12, temperature=dist.temperature,
                            top_p=dist.top_p)
    prompts = [tok.encode(t) for t in PROMPTS_TEXT]
    worst = {"hf": 0.0, "trainer": 0.0}
    plain_gap = 0.0
    tokens = 0
    for prompt, group in zip(prompts, engine.generate(prompts, params)):
        responses = [g.response_ids for g in group]
        b = make_batch([prompt] * len(group), responses, tok.pad_token_id)
        with torch.no_grad():
            trainer = token_logprobs(model, b, dist)
            plain = token_logprobs(model, b)
        hf_logps = row_logprobs(model, tok.pad_token_id, [prompt] * len(group),
                                responses, dist)
        for k, (gen, hf_logp) in enumerate(zip(group, hf_logps)):
            on = b.mask[k].bool()
            vllm = torch.tensor(gen.logprobs)
            worst["hf"] = max(worst["hf"], float((vllm - torch.tensor(hf_logp)).abs().max()))
            worst["trainer"] = max(worst["trainer"], float((vllm - trainer[k][on]).abs().max()))
            plain_gap = max(plain_gap, float((vllm - plain[k][on]).abs().max()))
            tokens += len(gen.response_ids)
    print(f"T=0.7 top-p 0.9, {tokens} sampled tokens: max |vLLM - hf| {worst['hf']:.2e}, "
          f"|vLLM - trainer| {worst['trainer']:.2e}; vLLM against the plain softmax "
          f"{plain_gap:.2f}")
    assert worst["hf"] < 1e-4 and worst["trainer"] < 1e-4
    assert plain_gap > 0.05  # the definitions differ: the test would see the wrong one


def test_vllms_own_workers_already_sample_with_the_engines_logprobs_mode(engine):
    """The call the engine makes at start for platforms whose runner builds its own
    sampler (vllm-ascend) finds vLLM's CPU workers already reporting processed
    log-probs: nothing to change."""
    got = engine._call(engine.llm.collective_rpc("rljob_logprobs_mode",
                                                 args=("processed_logprobs",)))
    assert got == [None] * engine.weight_ranks


def test_a_groups_samples_depend_on_its_seed_only(engine, tok):
    engine.load_weights(_policy(tok, seed=0).state_dict(), 2)
    prompt = tok.encode("12+34=")
    alone = engine.generate([prompt], SamplingParams(n=4, max_new_tokens=12, seed=7))[0]
    others = [tok.encode(f"{i}+{i}=") for i in range(10)]
    crowd = engine.generate(others + [prompt], SamplingParams(
        n=4, max_new_tokens=12, seeds=tuple(range(10)) + (7,)))[-1]
    assert [g.response_ids for g in alone] == [g.response_ids for g in crowd]
    assert len({tuple(g.response_ids) for g in alone}) > 1  # n distinct draws


def test_an_update_waits_for_the_groups_in_flight(engine, tok):
    """Groups submitted before an update are generated by the old weights alone,
    groups submitted after it by the new ones: each is tagged with its version."""
    old, new = _policy(tok, seed=0), _policy(tok, seed=0, noise=0.05)
    engine.load_weights(old.state_dict(), 3)
    prompts = [tok.encode(f"{i}+{2 * i}=") for i in range(24)]
    params = SamplingParams(n=4, max_new_tokens=12)
    before = [engine.submit(p, params, i) for i, p in enumerate(prompts)]
    swap = threading.Thread(target=engine.load_weights, args=(new.state_dict(), 4))
    swap.start()
    # the update has begun once its gate is shut (it drains the groups before) or it is
    # done (they had already finished): groups submitted now get the new weights
    deadline = time.monotonic() + 120
    while engine._open.is_set() and engine.version != 4:
        assert time.monotonic() < deadline, "the update never began"
        time.sleep(0.001)
    after = [engine.submit(p, params, 100 + i) for i, p in enumerate(prompts)]
    swap.join()
    for futures, model, version in ((before, old, 3), (after, new, 4)):
        results = [f.result() for f in futures]
        assert {(v, e) for _, v, e in results} == {(version, 0)}
        assert _max_error(model, tok, prompts, [g for g, _, _ in results]) < TOL
    print(f"update with 24 groups in flight: drain {engine.drain_seconds * 1e3:.0f} ms, "
          f"reload {engine.reload_seconds * 1e3:.0f} ms")


def test_a_one_worker_cpu_replica_runs_its_worker_in_the_engine_core(engine):
    """No process of its own for the worker (docs/concepts/engines.md): the engine's
    processes are its engine core alone, and this process's setting is as it was."""
    import os

    import psutil

    titles = [" ".join(p.cmdline()) or p.name()
              for p in psutil.Process().children(recursive=True)]
    assert any("EngineCore" in t for t in titles), titles
    assert not any("Worker" in t for t in titles), titles
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ


def test_a_broadcast_version_is_received_by_the_workers_and_loaded(engine, tok):
    """weightTransport collective: the engine's worker joins a weight group (gloo on
    CPU) with a real sender, receives each version's buckets and reloads them; the
    log-probs then equal transformers' under the sent weights."""
    from rljob.infra.netutil import free_port
    from rljob.weights import WeightReceiver, WeightSender

    sender = WeightSender(f"127.0.0.1:{free_port()}", transport="collective",
                          bucket_bytes=1 << 20)
    receiver = WeightReceiver(f"127.0.0.1:{sender.port}", "rollout-0", transport="collective",
                              backend="gloo")
    prompts = [tok.encode(t) for t in PROMPTS_TEXT]
    try:
        for version, noise in ((10, 0.0), (11, 0.05)):
            model = _policy(tok, seed=0, noise=noise)
            sender.publish(version, model.state_dict())
            assert receiver.load_latest(engine, version, wait=60) == version
            assert (engine.version, len(sender._latest.buckets) > 1) == (version, True)
            err = _max_error(model, tok, prompts, engine.generate(prompts, PARAMS))
            print(f"broadcast version {version}: {sender._latest.total / 1e6:.1f} MB in "
                  f"{len(sender._latest.buckets)} buckets, received in "
                  f"{engine.transfer_seconds * 1e3:.1f} ms, drain "
                  f"{engine.drain_seconds * 1e3:.1f} ms, load {engine.reload_seconds * 1e3:.1f}"
                  f" ms; max |logp error| {err:.2e}")
            assert err < TOL
        assert len(receiver.transfer_seconds) == 2 and min(receiver.transfer_seconds) > 0
    finally:
        receiver.stop()
        sender.stop(grace=0)


def test_a_tensor_parallel_worker_holds_its_shard_and_one_bucket_during_an_update():
    """`rljob bench weight-memory` on a 2-worker replica (a 270 MB model, 16 MB
    buckets): during an update over either transport a worker's private memory grows
    by far less than the model (a worker that received the whole version would grow
    by all of it, over gRPC by twice that)."""
    from rljob_bench import weight_memory

    shape = {**weight_memory.SHAPE, "num_hidden_layers": 6}
    results = weight_memory.run(tp=2, bucket_mb=16, shape=shape)
    weight_memory.render(results)
    assert [r["transport"] for r in results["rows"]] == ["grpc", "collective"]
    for row in results["rows"]:
        workers = {n: p for n, p in row["peaks_mb"].items() if n.startswith("worker")}
        assert len(workers) == 2, row
        for private, _ in workers.values():
            assert private < results["model_mb"] / 3, row


def _stop_text(engine, tok, prompt: list[int]) -> str:
    """The character the loaded weights spell most after `prompt`: an episode's stop
    text, so its turns end at it."""
    from collections import Counter

    free = engine.generate([prompt], SamplingParams(n=8, max_new_tokens=24, seed=1))[0]
    return Counter(c for g in free for c in tok.decode(g.response_ids)
                   if c.isprintable() and c not in "<>").most_common(1)[0][0]


def test_episodes_go_on_from_their_prefix_end_turns_at_the_stop_and_mask_observations(
        engine, tok):
    """Episodes on vLLM (`submit_episodes`): each turn is a request on the episode's
    whole prefix; a turn ends where its tokens spell the environment's stop text (the
    request is aborted there, its tokens and log-probs those of a request left to
    run); the observations are masked; every model token's log-prob is what
    transformers gives it in the whole episode's context."""
    from rljob.environments import Environment, Reply

    model = _policy(tok, seed=0, noise=0.05)
    engine.load_weights(model.state_dict(), 6)
    prompt = tok.encode("12+34=")
    params = SamplingParams(n=4, max_new_tokens=40)
    stop = _stop_text(engine, tok, prompt)

    # one turn, left to run and stopped at the text, with one seed (room for 50 tokens
    # of the 57 that the model's 64 positions leave after the prompt: the stop comes
    # far earlier)
    whole = engine._call(engine._turn(prompt, params, 50, 3, None))
    end = next((k + 1 for k in range(len(whole.response_ids))
                if stop in tok.decode(whole.response_ids[:k + 1])), None)
    assert end is not None and end < len(whole.response_ids)
    returned = []
    for _ in range(3):
        cut = engine._call(engine._turn(prompt, params, 50, 3, stop))
        assert cut.response_ids[:end] == whole.response_ids[:end]
        assert cut.logprobs[:end] == pytest.approx(whole.logprobs[:end], abs=1e-6)
        returned.append(len(cut.response_ids))
    # the request is aborted once its tokens spell the stop: it does not run to the end.
    # The engine core runs on in its own process meanwhile, so on a busy machine one
    # try's tokens can reach the end before this process reads the stop (they come as
    # one delta); in one try of three at least they do not. Without the abort, none would.
    assert min(returned) < len(whole.response_ids), (returned, len(whole.response_ids))
    print(f"stop {stop!r}: at token {end}; the aborted requests returned {returned} "
          f"tokens, the whole one {len(whole.response_ids)}")

    class Echo(Environment):  # answers every call, never ends an episode itself
        def step(self, turn):
            return Reply("[ok]", done=False)

    Echo.stop = stop
    row = {"prompt": "12+34=", "answer": "46"}
    group, version, epoch = engine.submit_episodes(prompt, row, params, 7, Echo, 3, 40).result()
    assert (version, epoch) == (6, 0) and len(group) == 4
    obs = tok.encode("[ok]", add_special_tokens=False)
    for e in group:
        assert len(e.response_ids) == len(e.loss_mask) == len(e.logprobs) <= 40
        assert 1 <= len(e.turns) <= 3 and e.tool_calls == len(e.turns) - 1
        turns, k = [], 0
        while k < len(e.response_ids):  # the model's turns between the observations
            j = k
            while j < len(e.response_ids) and e.loss_mask[j]:
                j += 1
            turns.append(e.response_ids[k:j])
            if j < len(e.response_ids):
                assert e.response_ids[j:j + len(obs)] == obs
                assert e.loss_mask[j:j + len(obs)] == [0] * len(obs)
                assert e.logprobs[j:j + len(obs)] == [0.0] * len(obs)
            k = j + len(obs)
        for t in turns[:-1]:  # each turn the environment answered ended at the stop
            assert tok.decode(t).endswith(stop)
        b = make_batch([prompt], [e.response_ids], tok.pad_token_id)
        with torch.no_grad():
            ref = token_logprobs(model, b)[0][b.mask[0].bool()]
        on = torch.tensor(e.loss_mask, dtype=torch.bool)
        assert (torch.tensor(e.logprobs)[on] - ref[on]).abs().max().item() < TOL
    assert sum(e.tool_calls for e in group) > 0
    # each later turn's prefix is the turn before's whole context: the prefix cache
    # held some of it (vLLM caches whole blocks)
    from rljob.environments import episode_figures
    from rljob.rollout.episodes import episode_record

    figures = episode_figures([episode_record(e) for e in group])
    later = [e for e in group if len(e.turns) > 1]
    assert all(e.cached_tokens is not None and e.later_prefix_tokens > 0 for e in later)
    print("episodes on vLLM: turns", [len(e.turns) for e in group], "lengths",
          [len(e.response_ids) for e in group], "later turns' prefix tokens",
          [e.later_prefix_tokens for e in later], "cached", [e.cached_tokens for e in later],
          f"hit {figures.get('prefix_cache_hit', 0):.0%}")
    assert figures["prefix_cache_hit"] > 0


def _logprobs_under(models, prompt, gen, tok) -> list:
    """Transformers' log-probs of `gen`'s tokens after `prompt` under each of `models`."""
    b = make_batch([prompt], [gen.response_ids], tok.pad_token_id)
    with torch.no_grad():
        return [token_logprobs(m, b)[0][b.mask[0].bool()] for m in models]


def _kept_change_points(prompts, results, old, new, tok, tol: float):
    """A keeping update's samples checked against (model, version) `old` and `new`:
    each sample's versions are old, new or old then new; its tokens before the change
    point have the old model's log-probs (within `tol`), the token at it not. Returns
    how many went on midway, and how far each one's new tokens are from a fresh
    prefix's log-probs under the new model."""
    (old_model, v_old), (new_model, v_new) = old, new
    midway, stale = 0, []
    for prompt, (group, _, _) in zip(prompts, results):
        for gen in group:
            lo, ln = _logprobs_under((old_model, new_model), prompt, gen, tok)
            got = torch.tensor(gen.logprobs)
            assert [v for _, v, _ in gen.versions] in ([v_old], [v_new], [v_old, v_new]), \
                gen.versions
            p = next((q for q, v, _ in gen.versions if v == v_new), len(gen.response_ids))
            if p:  # the old weights' tokens, exactly those
                assert (got[:p] - lo[:p]).abs().max().item() < tol, gen.versions
            if 0 < p < len(gen.response_ids):
                midway += 1
                assert (got[p] - lo[p]).abs().item() > tol, (p, gen.versions)
                stale.append((got[p:] - ln[p:]).abs().max().item())
    return midway, stale


def _updated_while_streaming(engine, prompts, params, load, calls=None):
    """Every prompt's group submitted, `load` run once tokens stream back (how many
    does not matter to the checks; a fixed sleep came before the first token on a
    loaded machine); each group's (generations, version, epoch). `calls` gets the
    request id of each request the engine submits to vLLM."""
    engine.generate(prompts[:1], params)  # warm: the first forward is slow
    streamed = threading.Event()
    generate = engine.llm.generate

    def counting(*args, **kwargs):
        if calls is not None:
            calls.append(kwargs.get("request_id"))

        async def stream():
            async for out in generate(*args, **kwargs):
                if any(c.token_ids for c in out.outputs):
                    streamed.set()
                yield out
        return stream()

    engine.llm.generate = counting
    try:
        futures = [engine.submit(p, params, i) for i, p in enumerate(prompts)]
        assert streamed.wait(120), "no token streamed back in 120 s"
        load()
        return [f.result(timeout=300) for f in futures]
    finally:
        engine.llm.__dict__.pop("generate", None)


def test_a_keeping_update_pauses_the_requests_with_their_cache_and_marks_each_token(
        engine, tok):
    """workflow.interruptCache keep: an update pauses vLLM's requests with their KV
    cache (pause_generation keep), loads the new weights and resumes them; no request
    is submitted again. Each sample's change point is exact: its tokens before it have
    the old weights' log-probs (transformers on the whole sequence), the token at it
    does not (the new weights sampled it, on the old weights' cache)."""
    old, new = _policy(tok, seed=0), _policy(tok, seed=0, noise=0.05)
    engine.load_weights(old.state_dict(), 30)
    engine.interruptible(keep=True)
    calls = []
    prompts = [tok.encode(f"{i}+{3 * i}=") for i in range(16)]
    try:
        results = _updated_while_streaming(
            engine, prompts, SamplingParams(n=4, max_new_tokens=120),
            lambda: engine.load_weights(new.state_dict(), 31), calls)
    finally:
        engine.interrupting = engine.keeping = False
    assert len(calls) == len(prompts), calls  # one request a group: none submitted again
    midway, stale = _kept_change_points(prompts, results, (old, 30), (new, 31), tok, TOL)
    print(f"keeping update: {midway} of {4 * len(prompts)} samples went on midway on their "
          f"cache; pause and load {engine.drain_seconds * 1e3:.0f} + "
          f"{engine.reload_seconds * 1e3:.0f} ms; the new weights' tokens differ from a "
          f"fresh prefix's log-probs by at most {max(stale, default=0):.2e} (the kept cache)")
    assert midway > 0


def test_an_interrupting_update_aborts_a_group_that_entered_generation_just_before_it(
        engine, tok):
    """The update's task runs right after a group entered generation and before the
    group's request is registered (or reaches vLLM): the update aborts it all the same,
    so the group goes on under the new weights instead of draining under the old."""
    import asyncio

    old, new = _policy(tok, seed=0), _policy(tok, seed=0, noise=0.05)
    engine.load_weights(old.state_dict(), 20)
    engine.interrupting = True
    path = None
    try:
        from safetensors.torch import save_file

        from rljob.rollout.vllm_engine import version_file

        tensors = {k: v.detach().contiguous().clone() for k, v in new.state_dict().items()}
        path = version_file(sum(t.numel() * t.element_size() for t in tensors.values()))
        save_file(tensors, path)
        params = SamplingParams(n=2, max_new_tokens=60)

        async def race():
            # both queued on the engine's loop, the group first: it enters generation
            # and schedules its request's task, the update runs before that task
            group = asyncio.ensure_future(engine._group(tok.encode("12+34="), params, 7))
            swap = asyncio.ensure_future(engine._swap(path, 21, engine.epoch))
            await swap
            return await group

        gens = engine._call(race(), timeout=300)
    finally:
        engine.interrupting = False
        if path:
            os.unlink(path)
    versions = [g.versions for g in gens[0]]
    print("versions of the raced group's samples:", versions)
    # the group went on under the new weights (drained, no sample would have a token
    # of them: the old version would have written them whole; a sample that ended
    # before the abort came has none either way)
    assert any(v == 21 for vs in versions for _, v, _ in vs), versions


def test_an_interrupting_update_aborts_the_groups_in_flight_and_they_go_on(engine, tok):
    """weightUpdate interrupt: an update aborts the groups in flight, loads the new
    weights and each unfinished sample goes on from its tokens so far. Each sample's
    tokens before its change point have the old weights' log-probs, after it the new
    weights' (transformers on the whole sequence, within the tier's tolerance), and
    some samples were interrupted midway."""
    old, new = _policy(tok, seed=0), _policy(tok, seed=0, noise=0.05)
    engine.load_weights(old.state_dict(), 10)
    engine.interrupting = True
    prompts = [tok.encode(f"{i}+{2 * i}=") for i in range(16)]
    try:
        results = _updated_while_streaming(
            engine, prompts, SamplingParams(n=4, max_new_tokens=120),
            lambda: engine.load_weights(new.state_dict(), 11))
    finally:
        engine.interrupting = False
    midway = 0
    for prompt, (group, version, epoch) in zip(prompts, results):
        assert len(group) == 4 and (version, epoch) == group[0].versions[0][1:]
        for gen in group:
            lo, ln = _logprobs_under((old, new), prompt, gen, tok)
            got = torch.tensor(gen.logprobs)
            assert len(got) == len(gen.response_ids) <= 120
            bounds = [p for p, _, _ in gen.versions] + [len(gen.response_ids)]
            for (p, v, _), end in zip(gen.versions, bounds[1:]):
                assert v in (10, 11)
                ref = lo if v == 10 else ln
                if end > p:
                    assert (got[p:end] - ref[p:end]).abs().max().item() < TOL, gen.versions
            midway += len(gen.versions) == 2 and 0 < gen.versions[1][0] < len(gen.response_ids)
    print("lengths and change points:", [(len(g.response_ids), g.versions) for g in
                                         results[0][0]])
    print(f"interrupting update: {midway} of {4 * len(prompts)} samples went on under the "
          f"new weights midway; abort and load {engine.drain_seconds * 1e3:.0f} + "
          f"{engine.reload_seconds * 1e3:.0f} ms")
    assert midway > 0


@pytest.mark.parametrize("keep", [False, True], ids=["recompute", "keep"])
def test_an_update_while_episodes_wait_on_their_tool_loads_at_once_and_their_next_turn_is_new(
        engine, tok, keep):
    """weightUpdate interrupt, episodes on vLLM (recompute and keep): an update that
    comes while episodes of a group wait for their slow tool loads without waiting for
    any tool (an episode waiting holds no request; the others' requests in flight are
    interrupted), and each waiting episode's next turn runs under the new weights. Its
    first turn and the observation after it carry the old version, its next turn the
    new one: each model token has its own weights' log-prob on the whole episode
    (transformers, within the tier's tolerance)."""
    from rljob.environments import Environment, Reply

    old, new = _policy(tok, seed=0, noise=0.05), _policy(tok, seed=0, noise=0.1)
    engine.load_weights(old.state_dict(), 40)
    prompt = tok.encode("12+34=")
    stop = _stop_text(engine, tok, prompt)
    waiting: set = set()  # the environments inside their tool call now
    lock, entered, release = threading.Lock(), threading.Event(), threading.Event()

    class SlowTool(Environment):
        def step(self, turn):
            with lock:
                waiting.add(self)
            entered.set()
            assert release.wait(120), "never released"
            return Reply("[ok]", done=False)

    SlowTool.stop = stop
    engine.interruptible(keep=keep)
    try:
        episodes = engine.submit_episodes(prompt, {"prompt": "12+34="},
                                          SamplingParams(n=4, max_new_tokens=40), 7,
                                          SlowTool, 2, 40)
        try:
            assert entered.wait(120), "no episode called its tool"
            t0 = time.monotonic()
            update = threading.Thread(target=engine.load_weights,
                                      args=(new.state_dict(), 41))
            update.start()
            update.join(60)
            assert not update.is_alive(), "the update waited for the tool"
            loaded = time.monotonic() - t0
            with lock:  # held in their tool until the release: waiting at the update
                held = set(waiting)
        finally:
            release.set()
        group, version, epoch = episodes.result(timeout=300)
    finally:
        engine.interrupting = engine.keeping = False
    obs = tok.encode("[ok]", add_special_tokens=False)
    assert held and (version, epoch) == (40, 0), [e.turns for e in group]
    for e in group:
        lo, ln = _logprobs_under((old, new), prompt, e, tok)
        got = torch.tensor(e.logprobs)
        on = torch.tensor(e.loss_mask, dtype=torch.bool)
        if e.env not in held:  # generating at the update, or done before it
            p = e.versions[1][0] if len(e.versions) > 1 else len(e.response_ids)
            assert e.versions[0] == (0, 40, 0) and [v for _, v, _ in e.versions] in (
                [40], [40, 41]), e.versions
            assert (got[:p][on[:p]] - lo[:p][on[:p]]).abs().max().item() < TOL
            continue
        first = e.loss_mask.index(0)  # the first turn's tokens, then the observation
        at = first + len(obs)
        assert e.response_ids[first:at] == obs and len(e.turns) == 2
        assert e.versions == [(0, 40, 0), (at, 41, 0)], (e.versions, first)
        assert (got[:first] - lo[:first]).abs().max().item() < TOL
        if at < len(e.response_ids):
            assert (got[at:] - ln[at:]).abs().max().item() < TOL
    print(f"an update while {len(held)} of {len(group)} episodes waited on their tool "
          f"({'keep' if keep else 'recompute'}): loaded in {loaded * 1e3:.0f} ms; the "
          f"versions of each episode's tokens {[e.versions for e in group]}")


def _adapter(model, rank: int, seed: int, scale: float = 0.1) -> dict:
    """A LoRA adapter on every linear module of `model`'s layers under PEFT's saved
    names, as if trained (B away from zero)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and ".layers." in name:
            stem = f"base_model.model.{name}"
            out[f"{stem}.lora_A.weight"] = scale * torch.randn(rank, m.in_features, generator=g)
            out[f"{stem}.lora_B.weight"] = scale * torch.randn(m.out_features, rank,
                                                               generator=g)
    return out


def test_a_lora_adapter_is_served_per_version_in_place_and_its_base_once_a_life(tok):
    """model.lora on vLLM: a trainer life's first version (base + adapter) reloads the
    base and adds the adapter; each later version is the adapter alone, loaded in place
    of the one served (`add_lora` with load_inplace, one name and id); a new life's
    base reload (which drops vLLM's adapters) comes with its adapter again. The
    samples' log-probs are the merged model's, W + (alpha / r) B A, each version's."""
    from rljob.api.spec import LoraSpec
    from rljob.rollout.vllm_engine import VLLMEngine
    from rljob.weights.adapter import AdapterMerge

    spec = MODEL.model_copy(update={"lora": LoraSpec(rank=4, alpha=8)})
    engine = VLLMEngine(spec, RolloutSpec(engine="vllm", max_num_seqs=16), tok, "cpu", seed=0)
    try:
        merge = AdapterMerge(4, 8)
        prompts = [tok.encode(t) for t in PROMPTS_TEXT]
        base = _policy(tok, seed=0).state_dict()
        plain = _policy(tok, seed=0)

        def check(state, version, epoch=0):
            engine.load_weights(state, version, epoch)
            merged = merge(state)
            plain.load_state_dict(merged)
            groups = engine.generate(prompts, PARAMS)
            return _max_error(plain, tok, prompts, groups), groups

        err0, _ = check({**base, **_adapter(plain, 4, 1)}, 0)
        err1, groups = check(_adapter(plain, 4, 2), 1)  # the adapter alone
        assert engine._lora is not None and not engine._lora.load_inplace
        plain.load_state_dict(base)
        off = _max_error(plain, tok, prompts, groups)  # the base alone does not explain them
        again = _policy(tok, seed=3).state_dict()  # a new trainer life: its base
        err2, _ = check({**again, **_adapter(plain, 4, 4)}, 1, epoch=9)
        err3, _ = check(_adapter(plain, 4, 5), 2, epoch=9)
        print(f"LoRA on vLLM: max |logp error| vs the merged model {err0:.1e}, {err1:.1e} "
              f"(adapter only), {err2:.1e} (new base), {err3:.1e}; vs the base {off:.2f}")
        assert max(err0, err1, err2, err3) < 1e-4
        assert off > 1e-2
        # interruptCache keep: an adapter update while samples stream pauses them with
        # their cache; each sample's tokens before its change point are the old
        # adapter's, the one at it the new adapter's (small adapters on the seed-0
        # base: its samples run long, so most are under way when the update comes)
        check({**base, **_adapter(plain, 4, 6, scale=0.03)}, 2, epoch=10)
        before = {k: v.clone() for k, v in plain.state_dict().items()}
        new = _adapter(plain, 4, 7, scale=0.03)
        after = _policy(tok, seed=0)
        after.load_state_dict(merge(new))
        engine.interruptible(keep=True)
        many = [tok.encode(f"{i}+{3 * i}=") for i in range(16)]
        try:
            results = _updated_while_streaming(engine, many,
                                               SamplingParams(n=4, max_new_tokens=120),
                                               lambda: engine.load_weights(new, 3, epoch=10))
        finally:
            engine.interrupting = engine.keeping = False
        plain.load_state_dict(before)
        midway, _ = _kept_change_points(many, results, (plain, 2), (after, 3), tok, 1e-4)
        print(f"LoRA keeping update: {midway} of {4 * len(many)} samples went on midway "
              f"under the new adapter")
        assert midway > 0
    finally:
        engine.close()
