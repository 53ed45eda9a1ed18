"""Token balancing across data-parallel ranks (Karmarkar–Karp)."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rljob.transferqueue.samplers import balance_over_ranks, rank_sums


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 4096), min_size=1, max_size=64), st.integers(1, 8))
def test_every_item_gets_a_rank_and_sizes_are_equal(lengths, k):
    ranks = balance_over_ranks(lengths, k)
    assert len(ranks) == len(lengths) and all(0 <= r < k for r in ranks)
    counts = [ranks.count(r) for r in range(k)]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=2, max_size=24), st.integers(2, 4))
def test_spread_is_at_most_the_largest_item(lengths, k):
    sums = rank_sums(lengths, balance_over_ranks(lengths, k, equal_size=False), k)
    assert max(sums) - min(sums) <= max(lengths)


def _best_spread(lengths, k):
    best = None
    for assign in itertools.product(range(k), repeat=len(lengths)):
        sums = rank_sums(lengths, assign, k)
        spread = max(sums) - min(sums)
        best = spread if best is None else min(best, spread)
    return best


def test_close_to_optimal_on_small_instances_and_far_better_than_round_robin():
    rng = random.Random(0)
    kk_total = rr_total = opt_total = 0
    for _ in range(40):
        lengths = [rng.randint(1, 500) for _ in range(8)]
        kk = rank_sums(lengths, balance_over_ranks(lengths, 2, equal_size=False), 2)
        rr = rank_sums(lengths, [i % 2 for i in range(8)], 2)
        kk_total += max(kk) - min(kk)
        rr_total += max(rr) - min(rr)
        opt_total += _best_spread(lengths, 2)
    assert kk_total <= 3 * rr_total / 10
    assert kk_total <= opt_total + 40 * 60  # within ~60 tokens of optimal on average
