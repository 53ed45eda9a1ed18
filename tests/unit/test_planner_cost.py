"""Cost model, allocation (Algorithm 1 vs brute force) and the scale-out gain."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljob.planner.allocation import (
    allocate_brute_force,
    allocate_cross,
    allocate_single,
    fewest_of,
)
from rljob.planner.cost import Workload, generation_time, instance_time, wave_time
from rljob.infra.hardware import HARDWARE, Hardware
from rljob.planner.profile import (
    MODEL_PRESETS,
    GenProfile,
    ModelShape,
    Profile,
    TrainProfile,
)
from rljob.planner.scaling import decide, gain_of_one_more_replica, loss_of_one_fewer_replica

GEN = GenProfile([1, 8, 32, 64], [0.010, 0.011, 0.014, 0.018], 64)


def test_continuous_batching_reduces_to_streamrl_eq2_for_equal_lengths():
    for samples in (64, 128, 256):
        assert instance_time(GEN, samples * 300, 300) == pytest.approx(
            wave_time(GEN, 300, samples))  # PTL(64) · 300 · ⌈M/64⌉
    assert wave_time(GEN, 100, 65) == pytest.approx(GEN.ptl(64) * 100 * 2)


def test_a_static_batch_decodes_as_long_as_its_longest_row():
    """The hf engine's `generate` decodes a batch until its last row ends: a replica's
    Tgen is its batches (periodic: its share in four pieces of whole groups), each as
    many decode steps as the expected longest of its rows, a call a prompt width."""
    flat = GenProfile([1, 64], [0.01, 0.01], 64)
    lengths = [2] * 63 + [50]  # one long tail among 64
    work = Workload.from_lengths(lengths, 64, 8.0, group_size=4)
    assert work.longest_of(1) == pytest.approx(sum(lengths) / 64)  # one row: the mean
    assert work.longest_of(16) == pytest.approx(2 + 48 * (1 - (63 / 64) ** 16))
    assert work.longest_of(1e6) == pytest.approx(50)
    periodic = replace(work, mode="periodic", static=True)
    # 64 rows, one replica: 4 pieces of 16 rows
    assert generation_time(flat, periodic, 1) == pytest.approx(4 * 0.01 * work.longest_of(16))
    # two prompt widths, half the prompts each: 4 prompts a piece span 1.875 calls
    widths = replace(periodic, widths=(0.5, 0.5))
    assert widths.calls_per_batch(16) == pytest.approx(2 - 2 * 0.5 ** 4)
    calls = widths.calls_per_batch(16)
    assert generation_time(flat, widths, 1) == pytest.approx(
        4 * calls * 0.01 * work.longest_of(16 / calls))
    # continuous batching (vLLM) refills a finished row's slot: one batch of the share
    assert generation_time(flat, work, 1) == pytest.approx(
        instance_time(flat, 64 * work.mean_output, work.longest_of(64)))
    # without measured lengths: spread up to the cap, never below the mean
    assumed = Workload.assumed(64, 40)
    assert assumed.longest_of(1) == 20 and assumed.longest_of(39) == pytest.approx(39)


def test_a_plan_leaves_out_replicas_that_would_generate_slower():
    """Tgen can rise with replicas (more, smaller batches each): the allocation takes
    the best of fewer replicas instead of assuming it falls."""
    tgen = {1: 4.0, 2: 2.0, 3: 2.5, 4: 2.6, 5: 2.7}.__getitem__
    best = allocate_single(6, 1, [1], tgen, lambda n: 1.0)
    assert (best.rollout_replicas, best.gen_seconds) == (2, 2.0)
    assert fewest_of(tgen)(5) == 2.0 and fewest_of(tgen)(1) == 4.0


def test_profiles_interpolate_and_round_trip(tmp_path):
    assert GEN.ptl(16) == pytest.approx(0.011 + (0.014 - 0.011) * 8 / 24)
    assert GEN.ptl(1000) == GEN.ptl(64)  # bounded by the max batch
    measured = GenProfile.from_samples([(8, 0.02), (8, 0.03), (8, 0.025), (1, 0.01)], 32)
    assert measured.batch_sizes == [1, 8] and measured.ptl_seconds == [0.01, 0.025]
    train = TrainProfile([8, 16], [1000.0, 1800.0])
    assert 1000 < train.throughput(12) < 1800
    prof = Profile(GEN, train, [10, 20, 30])
    prof.save(tmp_path / "p.json")
    again = Profile.load(tmp_path / "p.json")
    assert again.gen.ptl(16) == GEN.ptl(16) and again.train.throughput(12) == train.throughput(12)
    with pytest.raises(ValueError, match="not a planner profile"):
        Profile.from_json('{"gen": {}}')


def test_analytic_profile_shapes_and_limits():
    gen = GenProfile.analytic(HARDWARE["ascend"], MODEL_PRESETS["qwen2.5-7b"], 4)
    lat = [gen.ptl(b) for b in (1, 16, 64, 256)]
    assert lat == sorted(lat) and gen.max_batch_size >= 64
    with pytest.raises(ValueError, match="raise rollout.tensorParallel"):
        GenProfile.analytic(HARDWARE["ascend"], MODEL_PRESETS["qwen2.5-72b"], 1)
    shape = ModelShape.from_config({"hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "intermediate_size": 128, "vocab_size": 32,
                                    "tie_word_embeddings": True})
    assert 60_000 < shape.params < 120_000


# ---- random small instances -------------------------------------------------------------
@st.composite
def instances(draw):
    hw = Hardware("x", draw(st.floats(1e11, 4e12)), draw(st.floats(1e13, 1e15)),
                  draw(st.floats(16e9, 96e9)), step_overhead=draw(st.floats(0, 0.01)),
                  comm_alpha=draw(st.floats(0, 0.2)))
    shape = ModelShape(draw(st.floats(0.1e9, 4e9)), draw(st.integers(8, 40)),
                       draw(st.integers(1, 8)), 128)
    gen = GenProfile.analytic(hw, shape, draw(st.sampled_from([1, 2, 4])), 1024)
    train = TrainProfile.analytic(hw, shape)
    mean = draw(st.floats(16, 2000))
    work = Workload(draw(st.integers(8, 4096)), mean, mean * draw(st.floats(1, 8)))
    return gen, train, work


@settings(max_examples=60, deadline=None)
@given(instances(), st.integers(4, 40), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]))
def test_algorithm1_equals_brute_force(inst, npus, npr, unit):
    gen, train, work = inst
    sizes = list(range(unit, npus + 1, unit))
    def tgen(r):
        return generation_time(gen, work, r)
    def ttrain(y):
        return train.step_seconds(work.train_tokens, y)
    if npus < npr + unit:
        with pytest.raises(ValueError):
            allocate_single(npus, npr, sizes, tgen, ttrain)
        return
    fast = allocate_single(npus, npr, sizes, tgen, ttrain)
    slow = allocate_brute_force(npus, npr, sizes, tgen, ttrain)
    assert fast.step_seconds == pytest.approx(slow.step_seconds, rel=1e-9)
    assert fast.npus == slow.npus
    assert fast.npus <= npus


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(4, 64), st.integers(2, 64))
def test_cross_datacenter_keeps_the_step_and_shrinks_the_faster_side(inst, rpool, tpool):
    gen, train, work = inst
    def tgen(r):
        return generation_time(gen, work, r)
    def ttrain(y):
        return train.step_seconds(work.train_tokens, y)
    sizes = list(range(1, tpool + 1))
    full = max(tgen(rpool), ttrain(tpool))
    a = allocate_cross(rpool, tpool, 1, sizes, tgen, ttrain)
    assert a.step_seconds == pytest.approx(full, rel=1e-9)
    assert a.rollout_npus <= rpool and a.trainer_npus <= tpool
    if a.rollout_replicas > 1 and a.rollout_npus < rpool:
        assert tgen(a.rollout_replicas - 1) > ttrain(tpool)  # one less would slow the step
    if a.trainer_npus > 1 and a.trainer_npus < tpool:
        assert ttrain(a.trainer_npus - 1) > tgen(rpool)


@settings(max_examples=80, deadline=None)
@given(instances(), st.integers(1, 30))
def test_gain_of_one_more_replica_is_nonnegative_and_comes_from_the_busiest_share(inst, replicas):
    """Replicas take whole groups: one more replica gains only where it lowers the
    busiest replica's share ⌈groups / replicas⌉ (73 samples: 7 each at 11 and 12
    replicas, 6 at 13)."""
    gen, _, work = inst
    g1 = gain_of_one_more_replica(gen, work, replicas)
    g2 = gain_of_one_more_replica(gen, work, replicas + 1)
    assert g1 >= 0 and g2 >= 0
    share = [math.ceil(work.samples / n) for n in (replicas, replicas + 1)]
    if share[0] == share[1]:
        assert g1 == 0
    assert loss_of_one_fewer_replica(gen, work, replicas + 1) == pytest.approx(g1)
    assert math.isinf(loss_of_one_fewer_replica(gen, work, 1))


def test_scale_decisions_follow_gap_and_gain():
    work = Workload(512, 400, 2000)
    gain = gain_of_one_more_replica(GEN, work, 2)
    assert gain > 0
    out = decide(GEN, work, 2, gen_seconds=10 + gain, train_seconds=10, min_replicas=1,
                 max_replicas=4)
    assert out.delta == 1 and out.gain == pytest.approx(gain)
    assert decide(GEN, work, 2, 10 + gain / 2, 10, 1, 4).delta == 0  # not worth a replica
    assert decide(GEN, work, 4, 10 + gain, 10, 1, 4).delta == 0  # at maxReplicas
    assert decide(GEN, work, 3, 1, 100, 1, 4).delta == 0  # scale-in not allowed
    assert decide(GEN, work, 3, 1, 100, 1, 4, allow_scale_in=True).delta == -1


def test_overlap_bounds_of_the_workflow_modes():
    from rljob.planner.cost import overlap_bound

    assert overlap_bound("sync", 1.0, 1.0) == 1.0
    assert overlap_bound("async", 1.0, 1.0) == 2.0
    assert overlap_bound("async", 0.4, 1.0) == pytest.approx(1.4)
    # periodic: one piece is sync; many pieces approach async
    assert overlap_bound("periodic", 1.0, 1.0, pieces=1) == 1.0
    assert overlap_bound("periodic", 1.0, 1.0, pieces=16) == pytest.approx(2 / (1 + 1 / 16))
    assert overlap_bound("periodic", 0.4, 1.0, pieces=4) == pytest.approx(1.4 / (0.35 + 0.75))
    # a generation batch that costs 0.2 s whatever its size: four pieces generate in
    # 0.2 + 0.05 each, so the rollout sets the pace (4 × 0.25 + the last 0.25 trained)
    assert overlap_bound("periodic", 0.4, 1.0, pieces=4, gen_fixed=0.2) == pytest.approx(
        1.4 / (0.25 + 0.25 + 3 * 0.25))
    assert overlap_bound("periodic", 0.4, 1.0, pieces=1, gen_fixed=0.2) == 1.0
    assert overlap_bound("periodic", 0.4, 1.0, pieces=4, gen_fixed=9) == pytest.approx(
        1.4 / (0.4 + 0.25 + 3 * 0.4))  # never more than the whole step's generation
    # the reference's forwards: sync splits them over both sides, async gives them to
    # whichever waits, up to evening the two sides out; periodic's trainer computes
    # each piece's itself (its replicas generate the next piece meanwhile), so one
    # piece is sync without the split, and many pieces hide what generation can
    assert overlap_bound("sync", 0.4, 1.0, t_either=0.3) == 1.0
    assert overlap_bound("async", 0.4, 1.0, t_either=0.3) == pytest.approx(1.55 / 1.0)
    assert overlap_bound("async", 0.4, 1.0, t_either=0.8) == pytest.approx(1.8 / 1.1)
    assert overlap_bound("periodic", 0.4, 1.0, pieces=1, t_either=0.8) == pytest.approx(
        1.8 / 2.2)
    assert overlap_bound("periodic", 0.4, 1.0, pieces=4, t_either=0.8) == pytest.approx(
        1.8 / (0.1 + 0.2 + 0.25 + 3 * 0.45))
    assert overlap_bound("periodic", 1.0, 0.4, pieces=4, t_either=0.2) == pytest.approx(
        1.5 / (0.25 + 0.05 + 0.1 + 3 * 0.25))  # generation-bound: the pieces' generation
    with pytest.raises(ValueError):
        overlap_bound("periodic", 0.0, 1.0)
    # the reference's forwards: shared where they are a task the replicas take, else the
    # trainer's (an accelerator): then async hides only what generation can
    from rljob.planner.cost import bound_times

    assert bound_times(1.0, 0.3, shared=True) == (1.0, 0.3)
    assert bound_times(1.0, 0.3, shared=False) == (1.3, 0.0)
    assert overlap_bound("async", 0.4, *bound_times(1.0, 0.8, False)) == pytest.approx(
        2.2 / 1.8)


def test_rollout_batches_a_step_by_mode():
    from rljob.workflow.tasks import rollout_batch_rows

    # 16 prompts × 16 samples, one replica, maxNumSeqs 256: the whole step in one batch
    assert rollout_batch_rows(256, 16, 1, 256) == 256
    assert rollout_batch_rows(256, 16, 1, 64) == 64
    assert rollout_batch_rows(256, 16, 2, 256) == 128  # a replica's share
    assert rollout_batch_rows(256, 16, 1, 256, "periodic") == 64  # four pieces a step
    assert rollout_batch_rows(32, 16, 1, 256, "periodic") == 16  # whole groups, at least one
    assert rollout_batch_rows(256, 16, 1, 8) == 16
