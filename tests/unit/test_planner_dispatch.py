"""Skew-aware dispatch: ranker recall, LPT bound, makespan vs random and oracle;
and the TransferQueue claim policies it plugs into."""

from __future__ import annotations

import itertools
import random

import pytest

from rljob.planner.dispatch import (
    compare_dispatch,
    lpt_dispatch,
    plan_dispatch,
    simulate_instance,
    synthetic_lengths,
    synthetic_prompts,
    tail_recall,
    claim_policy_for,
)
from rljob.infra.hardware import HARDWARE
from rljob.planner.profile import MODEL_PRESETS, GenProfile
from rljob.transferqueue.controller import Controller
from rljob.transferqueue.schema import TaskSpec, json_column
from rljob.transferqueue.state import ClaimRequest
from rljob.workflow.dispatch import LengthRanker

GEN = GenProfile([1, 16, 64], [0.010, 0.012, 0.020], 64)


def test_instance_simulation_matches_hand_counts():
    assert simulate_instance([100], GEN, batch=4) == pytest.approx(100 * GEN.ptl(1))
    # two sequences, one slot: one after the other
    assert simulate_instance([10, 30], GEN, batch=1) == pytest.approx(40 * GEN.ptl(1))
    # two slots: 10 steps at batch 2, then 20 at batch 1
    assert simulate_instance([10, 30], GEN, batch=2) == pytest.approx(
        10 * GEN.ptl(2) + 20 * GEN.ptl(1))


def test_lpt_is_within_four_thirds_of_the_optimum():
    rng = random.Random(3)
    for _ in range(60):
        machines = rng.randint(2, 3)
        jobs = [rng.randint(1, 100) for _ in range(rng.randint(machines + 1, 8))]
        loads = [sum(jobs[i] for i in ids) for ids in lpt_dispatch(range(len(jobs)), jobs,
                                                                     machines)]
        best = min(max(sum(j for j, m in zip(jobs, assign) if m == k) for k in range(machines))
                   for assign in itertools.product(range(machines), repeat=len(jobs)))
        assert max(loads) <= (4 / 3 - 1 / (3 * machines)) * best + 1e-9


def test_ranker_learns_the_long_tail():
    pool = synthetic_prompts(256, seed=1)
    ranker = LengthRanker()
    rng = random.Random(2)
    for step in range(10):
        prompts = rng.sample(pool, 64)
        ranker.observe(prompts, synthetic_lengths(prompts, seed=step))
    fresh = synthetic_prompts(200, seed=99)  # prompts never seen: the text model alone
    lengths = synthetic_lengths(fresh, seed=123)
    assert tail_recall(ranker.predict(fresh), lengths) >= 0.6  # random guessing: 0.2
    untrained = LengthRanker()
    assert tail_recall(untrained.predict(fresh), lengths) < 0.6


def test_skew_aware_dispatch_beats_random_and_nears_the_oracle():
    gen = GenProfile.analytic(HARDWARE["ascend"], MODEL_PRESETS["qwen2.5-7b"], 4)
    for seed in range(3):
        c = compare_dispatch(gen, instances=4, prompts_per_step=64, group_size=8, seed=seed,
                             batch=16)
        assert c.ours_makespan < c.random_makespan
        assert c.oracle_makespan <= c.ours_makespan * 1.001
        assert c.ours_makespan <= c.oracle_makespan * 1.05
        assert c.tail_recall >= 0.6


def test_algorithm2_gives_the_tail_its_own_instances_when_that_pays():
    # a steep latency curve: decoding the tail at a small batch is much faster
    steep = GenProfile([1, 8, 64], [0.005, 0.01, 0.06], 64)
    lengths = [4000] * 4 + [200] * 252
    plan = plan_dispatch([float(x) for x in lengths], 4, steep, batch=64, tail=4 / 256)
    assert plan.long_tail_instances >= 1
    long_instances = plan.assignment[:plan.long_tail_instances]
    assert {i for ids in long_instances for i in ids} == {0, 1, 2, 3}
    assert claim_policy_for(0, plan) == "longest_first"
    assert claim_policy_for(3, plan) == "shortest_first"


def test_transferqueue_serves_long_rows_to_long_tail_replicas():
    c = Controller(1, 60)
    c.register([TaskSpec("driver", frozenset(), (json_column("prompt"),)),
                TaskSpec("rollout", frozenset({"prompt"}))])
    start = c.reserve(6)
    predicted = [50, 900, 30, 4000, 120, 60]  # the driver writes predicted lengths
    c.notify_written(list(range(start, start + 6)), ["prompt"], lengths=predicted,
                     create=True, partition=0)
    longest = c.claim(ClaimRequest("rollout", 2, policy="longest_first"))
    assert [r.length for r in longest.rows] == [4000, 900]
    shortest = c.claim(ClaimRequest("rollout", 2, policy="shortest_first"))
    assert [r.length for r in shortest.rows] == [30, 50]
