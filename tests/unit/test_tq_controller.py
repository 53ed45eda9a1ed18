"""The TransferQueue controller state machine, with a fake clock (pure logic)."""

from __future__ import annotations

import pytest

from rljob.transferqueue.controller import Controller
from rljob.transferqueue.schema import TaskSpec, json_column, scalar, tensor
from rljob.transferqueue.state import ClaimRequest, Conflict, ControllerError, NotFound


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(units=2, lease=10.0):
    clock = Clock()
    c = Controller(units, lease, clock)
    c.register([
        TaskSpec("driver", frozenset(), (json_column("prompt"),)),
        TaskSpec("rollout", frozenset({"prompt"}), (tensor("resp", "int32"), scalar("reward"))),
        TaskSpec("adv", frozenset({"reward"}), (scalar("advantage"),)),
        TaskSpec("train", frozenset({"resp", "advantage"})),
    ])
    return c, clock


def claim(c, task, count, **kw):
    return c.claim(ClaimRequest(task, count, **kw))


def test_rows_become_ready_per_task_as_columns_arrive():
    c, _ = make()
    rows = c.allocate(0, 4, group_size=2)
    assert [r.unit for r in rows] == [0, 1, 0, 1] and [r.group for r in rows] == [0, 0, 1, 1]
    assert c.notify_written([0, 1, 2, 3], ["prompt"]) == 4  # ready for rollout only
    assert claim(c, "adv", 1) is None
    got = claim(c, "rollout", 4)
    assert [r.index for r in got.rows] == [0, 1, 2, 3]
    c.notify_written([0, 1], ["resp", "reward"], lengths=[5, 7], versions=[0, 0])
    assert claim(c, "train", 1) is None  # advantage missing
    # group policy: group 0 complete for adv, group 1 not
    adv = claim(c, "adv", 4, policy="group", min_count=1)
    assert [r.index for r in adv.rows] == [0, 1]


def test_ack_is_final_and_release_returns_rows():
    c, _ = make()
    c.allocate(0, 3)
    c.notify_written([0, 1, 2], ["prompt"])
    got = claim(c, "rollout", 3)
    assert c.release("rollout", got.lease) == 3
    again = claim(c, "rollout", 3)
    assert [r.index for r in again.rows] == [0, 1, 2]
    n, cleared = c.ack("rollout", again.lease, [0])
    assert n == 1 and cleared == []
    c.release("rollout", again.lease)
    assert [r.index for r in claim(c, "rollout", 3, min_count=1).rows] == [1, 2]
    with pytest.raises(Conflict, match="is not held"):
        c.ack("rollout", again.lease)


def test_leases_expire_back_to_ready():
    c, clock = make(lease=5.0)
    c.allocate(0, 2)
    c.notify_written([0, 1], ["prompt"])
    first = claim(c, "rollout", 2)
    clock.t = 4.9
    assert claim(c, "rollout", 1) is None
    clock.t = 5.0
    second = claim(c, "rollout", 2)
    assert [r.index for r in second.rows] == [0, 1]
    assert c.tasks["rollout"].expired == 2
    with pytest.raises(Conflict):
        c.ack("rollout", first.lease)


def test_partition_cleared_when_every_consumer_acked():
    c, _ = make()
    c.allocate(0, 2)
    c.allocate(1, 2)
    c.notify_written([0, 1, 2, 3], ["prompt", "resp", "reward", "advantage"])
    cleared = []
    for task in ("rollout", "adv", "train"):
        got = claim(c, task, 2, partition=0)
        _, cl = c.ack(task, got.lease)
        cleared += cl
    assert [cl.partition for cl in cleared] == [0]
    assert sorted(i for _, i, _ in cleared[0].cells) == [0, 1]
    assert set(c.rows) == {2, 3} and c.cleared_partitions == 1


def test_token_budget_and_balanced_ranks():
    c, _ = make()
    c.allocate(0, 6)
    c.notify_written(list(range(6)), ["prompt", "resp", "advantage"], lengths=[4, 4, 4, 4, 4, 4])
    got = claim(c, "train", 6, token_budget=10, min_count=1)
    assert len(got.rows) == 2
    bal = claim(c, "train", 4, policy="token_balanced", dp_size=2)
    assert sorted(r.rank for r in bal.rows) == [0, 0, 1, 1]


def test_bad_requests_change_nothing():
    c, _ = make()
    c.allocate(0, 2)
    snapshot = {i: (set(r.written), r.length) for i, r in c.rows.items()}
    with pytest.raises(NotFound, match="unknown column"):
        c.notify_written([0, 1], ["prompt", "bogus"])
    with pytest.raises(NotFound, match="unknown row"):
        c.notify_written([0, 99], ["prompt"])
    with pytest.raises(ControllerError, match="lengths has 1 entries for 2 rows"):
        c.notify_written([0, 1], ["prompt"], lengths=[3])
    assert {i: (set(r.written), r.length) for i, r in c.rows.items()} == snapshot
    with pytest.raises(NotFound, match="unknown task"):
        claim(c, "ghost", 1)
    with pytest.raises(ControllerError, match="unknown claim policy"):
        claim(c, "rollout", 1, policy="random")
    with pytest.raises(ControllerError, match="not a multiple of group_size"):
        c.allocate(0, 3, group_size=2)
    with pytest.raises(Conflict, match="already declared"):
        c.register([TaskSpec("x", frozenset(), (scalar("resp", "int32"),))])
    assert "x" not in c.tasks


def test_late_registered_task_sees_existing_rows():
    c, _ = make()
    c.allocate(0, 2)
    c.notify_written([0, 1], ["prompt"])
    c.register([TaskSpec("audit", frozenset({"prompt"}))])
    assert [r.index for r in claim(c, "audit", 2).rows] == [0, 1]


def test_regenerate_clears_producer_and_downstream_columns():
    c, _ = make()
    c.allocate(0, 1)
    c.notify_written([0], ["prompt", "resp", "reward", "advantage"], versions=[0])
    got = claim(c, "train", 1, min_version=1, on_stale="regenerate", stale_producer="rollout",
                min_count=1)
    assert got is None
    row = c.rows[0]
    assert row.written == {"prompt"}  # resp, reward and advantage must be made again
    assert [r.index for r in claim(c, "rollout", 1).rows] == [0]
    assert c.tasks["train"].stale_regenerated == 1


def test_independent_flows_clear_independently():
    c = Controller(1, 10.0, Clock())
    c.register([TaskSpec("pa", frozenset(), (tensor("a", "uint8"),)),
                TaskSpec("ca", frozenset({"a"})),
                TaskSpec("pb", frozenset(), (tensor("b", "uint8"),)),
                TaskSpec("cb", frozenset({"b"}))])
    start = c.reserve(4)
    c.notify_written([start, start + 1], ["a"], create=True, partition=0)
    c.notify_written([start + 2, start + 3], ["b"], create=True, partition=1)
    got = claim(c, "ca", 4, min_count=1)
    _, cleared = c.ack("ca", got.lease)
    assert [cl.partition for cl in cleared] == [0]  # cb never needed flow a's rows
    assert set(c.rows) == {start + 2, start + 3}


def test_reserved_indices_create_rows_once():
    c, _ = make()
    start = c.reserve(2)
    c.notify_written([start, start + 1], ["prompt"], create=True, partition=3, group_size=2)
    assert c.rows[start].group == c.rows[start + 1].group and c.rows[start].partition == 3
    with pytest.raises(Conflict, match="not reserved"):
        c.notify_written([start], ["prompt"], create=True, partition=3)
    with pytest.raises(Conflict, match="not reserved"):
        c.notify_written([start + 99], ["prompt"], create=True, partition=3)


def test_consumer_stats_show_who_holds_rows():
    c, clock = make()
    c.allocate(0, 6)
    c.notify_written(list(range(6)), ["prompt"])
    a = claim(c, "rollout", 2, consumer="job-rollout-0")
    b = claim(c, "rollout", 3, consumer="job-rollout-1")
    claim(c, "rollout", 1)  # anonymous claims are not listed
    assert c.consumer_stats() == [
        {"task": "rollout", "consumer": "job-rollout-0", "claimed": 2},
        {"task": "rollout", "consumer": "job-rollout-1", "claimed": 3}]
    c.ack("rollout", a.lease)
    c.release("rollout", b.lease)
    assert c.consumer_stats() == []
    claim(c, "rollout", 2, consumer="job-rollout-1")
    clock.t += 11  # an expired lease no longer counts
    c.expire()
    assert c.consumer_stats() == []


def _state(c):
    """What a client can observe of a controller: rows, leases, ready sets."""
    return ({i: (sorted(r.written), sorted(r.acked), dict(r.leased), r.version)
             for i, r in c.rows.items()},
            {n: ({k: sorted(le.rows) for k, le in s.leases.items()}, s.n_ready, s.claimed,
                 s.acked, s.stale_regenerated) for n, s in c.tasks.items()})


def test_a_consumer_refuses_part_of_its_lease_for_regeneration():
    c, _ = make()
    c.allocate(0, 4, group_size=2)
    c.notify_written([0, 1, 2, 3], ["prompt"])
    made = claim(c, "rollout", 4)
    c.notify_written([0, 1, 2, 3], ["resp", "reward", "advantage"], versions=[3] * 4)
    c.ack("rollout", made.lease)
    got = claim(c, "train", 4)
    with pytest.raises(ControllerError, match="not in lease"):
        c.regenerate("train", got.lease, [0, 7], "rollout")
    assert c.regenerate("train", got.lease, [2, 3], "rollout") == 2
    assert c.rows[2].written == {"prompt"} and "train" not in c.rows[2].leased
    assert [r.index for r in claim(c, "rollout", 4, min_count=1).rows] == [2, 3]
    acked, _ = c.ack("train", got.lease)
    assert acked == 2  # the rest of the lease is still held and acks as usual
    assert c.tasks["train"].stale_regenerated == 2


def test_rows_regenerated_before_their_producer_acked_are_made_again():
    """A consumer may claim rows as soon as they are written, before the producer acks
    its lease; if it sends them back for regeneration then, the producer's late ack
    must not count them as made (they would be ready for no task, ever)."""
    c, _ = make()
    c.allocate(0, 4, group_size=2)
    c.notify_written([0, 1, 2, 3], ["prompt"])
    made = claim(c, "rollout", 4)
    c.notify_written([0, 1, 2, 3], ["resp", "reward", "advantage"], versions=[1] * 4)
    got = claim(c, "train", 4)
    assert c.regenerate("train", got.lease, [0, 1], "rollout") == 2
    compacted = Controller(2, 10.0, Clock())
    compacted.replay(c.snapshot())  # a restarted controller remembers the same
    for ctl in (c, compacted):
        acked, _ = ctl.ack("rollout", made.lease)  # the late ack, whole lease
        assert acked == 2
        assert [r.index for r in claim(ctl, "rollout", 4, min_count=1).rows] == [0, 1]
    with pytest.raises(ControllerError, match="not held"):
        c.ack("rollout", made.lease, [0])


def test_replaying_the_journal_rebuilds_the_same_state():
    c, clock = make()
    c.allocate(0, 4, group_size=2)
    c.notify_written([0, 1, 2, 3], ["prompt"])
    r = claim(c, "rollout", 4)
    c.notify_written([0, 1, 2, 3], ["resp", "reward"], versions=[1] * 4, lengths=[2, 3, 4, 5])
    c.ack("rollout", r.lease)
    c.notify_written([0, 1, 2, 3], ["advantage"])
    t = claim(c, "train", 4)
    c.regenerate("train", t.lease, [0, 1], "rollout")
    clock.t = 100.0
    c.expire()  # the train lease of rows 2, 3 expired
    records = c.drain()
    again = Controller(2, 10.0, Clock())
    again.replay(records)
    assert _state(again) == _state(c)
    compacted = Controller(2, 10.0, Clock())
    compacted.replay(c.snapshot())
    assert _state(compacted)[0] == _state(c)[0]


def _check_ready_sets(c):
    """Each task's ready bookkeeping equals what the rows say: a row is ready for a
    task that consumes columns when they are all written and the task has neither
    acked nor leased it."""
    for name, s in c.tasks.items():
        want: dict[int, set[int]] = {}
        for r in c.rows.values():
            if (s.spec.consumes and s.spec.consumes <= r.written and name not in r.acked
                    and name not in r.leased):
                want.setdefault(r.partition, set()).add(r.index)
        assert {p: set(ix) for p, ix in s.ready.items()} == want, name
        assert s.ready_parts == sorted(want) and s.n_ready == sum(map(len, want.values()))
        groups: dict[int, int] = {}
        for ix in want.values():
            for i in ix:
                groups[c.rows[i].group] = groups.get(c.rows[i].group, 0) + 1
        assert {g: n for g, n in s.group_ready.items() if n} == groups, name


def test_ready_sets_follow_random_writes_claims_acks_releases_and_expiries():
    import random

    rng = random.Random(7)
    c, clock = make(units=2, lease=5.0)
    arrivals = {n: 0 for n in c.tasks}
    produce = {"rollout": ["resp", "reward"], "adv": ["advantage"]}
    held: list[tuple[str, object]] = []
    for op in range(600):
        kind = rng.choice(["put", "claim", "claim", "write", "ack", "release", "tick"])
        if kind == "put" or not c.rows:
            n = 2 * rng.randint(1, 4)
            rows = c.allocate(4 * (op // 60) + rng.randint(0, 3), n, group_size=2)  # later ones
            c.notify_written([r.index for r in rows], ["prompt"])
        elif kind == "claim":
            task = rng.choice(["rollout", "adv", "train"])
            got = claim(c, task, rng.randint(1, 6), min_count=1)
            if got is not None:
                held.append((task, got))
        elif held and kind in ("write", "ack", "release"):
            task, got = held.pop(rng.randrange(len(held)))
            if got.lease not in c.tasks[task].leases:
                continue  # expired meanwhile
            live = sorted(c.tasks[task].leases[got.lease].rows)
            if task in produce and kind != "release":  # a producer acks what it wrote
                c.notify_written(live, produce[task], versions=[0] * len(live), task=task,
                                 lease=got.lease)
                c.ack(task, got.lease)
            elif kind == "release":
                c.release(task, got.lease)
            else:
                some = live[:rng.randint(1, len(live))]
                c.ack(task, got.lease, some)
                if some != live:
                    held.append((task, got))
        elif kind == "tick":
            clock.t += rng.choice([0.5, 2.0, 6.0])
            c.expire()
        _check_ready_sets(c)
        for name, s in c.tasks.items():
            assert s.arrivals >= arrivals[name]
            arrivals[name] = s.arrivals
    assert c.cleared_partitions > 0 and c.tasks["train"].acked > 0
