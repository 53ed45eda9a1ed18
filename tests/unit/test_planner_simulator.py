"""The pipeline simulator against closed forms and the papers' directions."""

from __future__ import annotations

import pytest

from rljob.planner.simulator import PipelineConfig, compare_modes, plot_gantt, simulate


def balanced(**kw) -> PipelineConfig:
    # 256 samples per step over 2 × 8 slots: 16 waves of 0.25 s -> Tgen = 4 s;
    # Ttrain = 256 × 4/256 = 4 s: perfect balance
    base = dict(steps=30, samples_per_step=256, micro_batch=16, replicas=2, slots=8,
                gen_mean=0.25, train_per_sample=4.0 / 256)
    return PipelineConfig(**{**base, **kw})


def test_sync_is_the_sum_of_both_stages():
    res = simulate(balanced(mode="sync"))
    assert res.step_seconds == pytest.approx(4.0 + 4.0, rel=0.02)
    assert max(res.staleness) == 0


def test_periodic_approaches_twice_sync_at_perfect_balance():
    sync, periodic = (r.step_seconds for r in compare_modes(
        balanced(), (("sync", False), ("periodic", True))))
    waves = 16
    closed_form = 2 * waves / (waves + 1)  # the last wave's training cannot overlap
    speedup = sync / periodic
    assert speedup == pytest.approx(closed_form, rel=0.10)
    assert speedup == pytest.approx(2.0, rel=0.10)  # Periodic Asynchrony's limit


def test_async_runs_at_the_slower_stage():
    res = simulate(balanced(mode="async"))
    assert res.step_seconds == pytest.approx(4.0, rel=0.10)
    gen_heavy = simulate(balanced(mode="async", gen_mean=0.5))  # Tgen 8 s, Ttrain 4 s
    assert gen_heavy.step_seconds == pytest.approx(8.0, rel=0.10)
    sync_heavy = simulate(balanced(mode="sync", gen_mean=0.5))
    assert sync_heavy.step_seconds == pytest.approx(12.0, rel=0.10)


@pytest.mark.parametrize("k", [1, 2])
def test_async_never_trains_a_sample_staler_than_k(k):
    res = simulate(balanced(mode="async", max_staleness=k, gen_sigma=0.8, gen_mean=0.3))
    assert max(res.staleness) <= k
    assert max(res.staleness) >= 1  # and it does run ahead
    for mode in ("sync", "periodic"):
        assert max(simulate(balanced(mode=mode, gen_sigma=0.8)).staleness) == 0


def test_streaming_then_async_each_gain_like_asyncflow_table1(tmp_path):
    tail = balanced(gen_sigma=0.8, weight_sync_seconds=0.5)
    base, stream, asyn = compare_modes(tail, (("sync", False), ("periodic", True),
                                              ("async", True)))
    assert stream.throughput > 1.2 * base.throughput
    assert asyn.throughput > 1.2 * stream.throughput
    assert base.bubble_ratio > stream.bubble_ratio > asyn.bubble_ratio
    out = tmp_path / "gantt.png"
    plot_gantt([base, stream, asyn], str(out), window=40)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="mode must be"):
        PipelineConfig(mode="fast")
    with pytest.raises(ValueError, match="micro_batch must divide"):
        PipelineConfig(samples_per_step=10, micro_batch=3)


def test_a_replica_generates_as_the_runtime_batches_it():
    """The simulator's decode slots are the rows a replica generates together in the
    runtime (workflow/tasks.py `rollout_batch_rows`): periodic splits a replica's
    share of a step into four generate calls, each decoding at a quarter batch."""
    from rljob.api.spec import RLJobSpec
    from rljob.planner.job import job_model, pipeline_config
    from rljob.planner.profile import GenProfile, Profile, TrainProfile

    spec = RLJobSpec.model_validate({
        "model": {"path": "random:examples/models/tiny-qwen2", "tokenizer": "builtin:char"},
        "dataset": {"path": "examples/data/arith.jsonl"},
        "algorithm": {"promptsPerStep": 16, "groupSize": 16, "samplesPerMicroBatch": 32},
        "rollout": {"maxNewTokens": 22, "maxNumSeqs": 256}})
    # a tiny model: a decode step costs about the same at any batch
    prof = Profile(GenProfile([1, 256], [0.016, 0.018], 256), TrainProfile([1], [5000.0]),
                   [22] * 256, 10.0)
    model = job_model(spec, prof)
    sync, periodic = (pipeline_config(model, mode) for mode in ("sync", "periodic"))
    assert (sync.slots, periodic.slots) == (256, 64)
    # a sample decodes its 22 tokens at the batch's step time: a quarter of the batch
    # is barely cheaper a step on a model this small
    assert sync.gen_mean == pytest.approx(22 * 0.018 + 0)
    assert periodic.gen_mean == pytest.approx(22 * prof.gen.ptl(64))
