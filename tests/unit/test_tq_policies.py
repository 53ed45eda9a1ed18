"""Claim policies (transferqueue/policies.py): the registry, the group-ordered
policies skew-aware dispatch uses, and a policy added by one class."""

from __future__ import annotations

import pytest

from rljob.transferqueue.policies import (CLAIM_POLICIES, ClaimPolicy, claim_policy,
                                          get_claim_policy, take_rows)
from rljob.transferqueue.state import ClaimRequest, ControllerError
from tests.unit.test_tq_controller import make


def table(lengths, group_size=2):
    """Rows ready for the rollout task, their lengths (predicted output lengths)."""
    c, clock = make()
    c.allocate(0, len(lengths), group_size=group_size)
    c.notify_written(list(range(len(lengths))), ["prompt"], lengths=lengths)
    return c


def claimed(c, count, policy, **kw):
    got = c.claim(ClaimRequest("rollout", count, policy=policy, min_count=1, **kw))
    return [r.index for r in got.rows] if got else []


def test_group_orders_take_whole_groups_longest_or_shortest_first():
    # groups: 0 → rows 0,1 (3+3), 1 → 2,3 (40+30), 2 → 4,5 (5+5), 3 → 6,7 (20+25)
    lengths = [3, 3, 40, 30, 5, 5, 20, 25]
    assert claimed(table(lengths), 4, "group_longest_first") == [2, 3, 6, 7]
    assert claimed(table(lengths), 4, "group_shortest_first") == [0, 1, 4, 5]
    assert claimed(table(lengths), 4, "group") == [0, 1, 2, 3]  # readiness order
    # a group never splits: 3 rows fit one group only
    assert claimed(table(lengths), 3, "group_longest_first") == [2, 3]
    # the token budget stops before the group that passes it (the first always goes)
    assert claimed(table(lengths), 8, "group_longest_first", token_budget=100) == [2, 3]


def test_group_orders_finish_the_older_step_first():
    # step 0: groups of 3+3 and 5+5; step 1 (released too, as in async): 40+30 and 20+25
    c, _ = make()
    c.allocate(0, 4, group_size=2)
    c.allocate(1, 4, group_size=2)
    c.notify_written(list(range(8)), ["prompt"], lengths=[3, 3, 5, 5, 40, 30, 20, 25])
    assert claimed(c, 2, "group_longest_first") == [2, 3]
    assert claimed(c, 4, "group_longest_first") == [0, 1, 4, 5]
    c, _ = make()
    c.allocate(0, 4, group_size=2)
    c.allocate(1, 4, group_size=2)
    c.notify_written(list(range(8)), ["prompt"], lengths=[30, 30, 5, 5, 1, 1, 20, 25])
    assert claimed(c, 6, "group_shortest_first") == [2, 3, 0, 1, 4, 5]


def test_incomplete_groups_wait():
    c, _ = make()
    c.allocate(0, 4, group_size=2)
    c.notify_written([0, 1, 2], ["prompt"], lengths=[1, 1, 50])  # group 1 lacks row 3
    assert claimed(c, 4, "group_longest_first") == [0, 1]


def test_the_registry_refuses_duplicates_and_strangers_and_names_the_choices():
    with pytest.raises(ValueError, match="registered already"):
        @claim_policy
        class Again(ClaimPolicy):
            name = "fifo"

            def pick(self, view, count, token_budget):
                return []
    with pytest.raises(TypeError):
        claim_policy(object)
    with pytest.raises(ValueError, match="unknown claim policy 'nope': use one of fifo, "):
        get_claim_policy("nope")
    with pytest.raises(ControllerError, match="unknown claim policy"):
        table([1, 1]).claim(ClaimRequest("rollout", 1, policy="nope"))


def test_a_new_policy_is_one_class():
    @claim_policy
    class Newest(ClaimPolicy):
        name = "test_newest"

        def pick(self, view, count, token_budget):
            return take_rows(sorted(view.indices(), reverse=True), view.rows, count,
                             token_budget)
    try:
        assert claimed(table([1, 2, 3, 4]), 3, "test_newest") == [3, 2, 1]
    finally:
        CLAIM_POLICIES.remove("test_newest")


def test_rollout_replicas_claim_by_the_dispatch_mode():
    from rljob.workflow.dispatch import rollout_claim_policy, tail_replicas

    assert rollout_claim_policy("fifo", 0, 3) == "group"
    # one replica: longest first (the long groups share a batch)
    assert rollout_claim_policy("skew_aware", 0, 1) == "group_longest_first"
    # several: one in five serves the predicted long tail, the others the short end
    assert [tail_replicas(r) for r in (1, 2, 5, 10, 11)] == [0, 1, 1, 2, 2]
    assert [rollout_claim_policy("skew_aware", i, 6) for i in range(6)] == [
        "group_longest_first"] + ["group_shortest_first"] * 5
    with pytest.raises(ValueError):
        rollout_claim_policy("random", 0, 1)
