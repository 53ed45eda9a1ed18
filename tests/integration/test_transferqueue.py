"""TransferQueue against real redis-server and controller processes."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
import uuid

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rljob.transferqueue import (
    TaskSpec,
    TransferQueueClient,
    TransferQueueError,
    json_column,
    scalar,
    tensor,
)
from rljob.transferqueue.proto import transferqueue_pb2 as pb
from rljob.transferqueue.schema import ColumnError
from rljob.transferqueue.storage.base import cell_key
from tests.integration.conftest import TQServer

DRIVER = TaskSpec("driver", (), [json_column("prompt"), tensor("prompt_ids", "int32")])
ROLLOUT = TaskSpec("rollout", ["prompt_ids"], [tensor("response_ids", "int32"), scalar("reward"),
                                           tensor("logp", "float32")])
TRAIN = TaskSpec("train", ["response_ids", "reward"])


def prompts(n):
    return {"prompt": [f"p{i}" for i in range(n)],
            "prompt_ids": [np.arange(i % 5 + 1, dtype=np.int32) for i in range(n)]}


def respond(client, batch, version=0):
    n = len(batch)
    ids = [np.full(r.index % 7 + 1, r.index, dtype=np.int32) for r in batch.rows]
    return client.write(batch.indices, {
        "response_ids": ids, "reward": [float(r.index) for r in batch.rows],
        "logp": [np.zeros(len(x), np.float32) for x in ids]},
        versions=[version] * n, length_column="response_ids")


@pytest.fixture(params=["redis", "memory"])
def server(request, redis_units):
    s = TQServer(redis_units if request.param == "redis" else None)
    yield s
    s.stop()


def test_round_trip_streams_rows_through_tasks_and_clears(server, redis_units):
    with TransferQueueClient(server.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        idx = c.put(0, prompts(8), length_column="prompt_ids")
        assert idx == list(range(8))
        b = c.claim_get("rollout", 8, ["prompt", "prompt_ids"])
        assert b.data["prompt"] == [f"p{i}" for i in range(8)]
        assert [len(x) for x in b.data["prompt_ids"]] == [i % 5 + 1 for i in range(8)]
        assert b.data["prompt_ids"][3].dtype == np.int32
        assert c.claim("train", 1).rows == []  # nothing ready yet for train
        assert respond(c, b) == 8
        c.ack(b)
        t = c.claim_get("train", 8, ["response_ids", "reward"])
        assert [r.length for r in t.rows] == [i % 7 + 1 for i in range(8)]
        assert t.data["reward"] == [float(i) for i in range(8)]
        # zero-copy: a read-only view straight over the received buffer
        assert not t.data["response_ids"][0].flags.writeable
        st = c.stats()
        assert st.rows == 8
        # the claim names its consumer (this process): who holds rows, for the operator
        assert [(x.task, x.consumer, x.claimed) for x in st.consumers] == [
            ("train", c._data.consumer, 8)]
        c.ack(t)
        st = c.stats()
        assert not st.consumers
        assert st.rows == 0 and st.cleared_partitions == 1
        job = c._data.job
    if "--redis" in server.proc.args:
        # cells are deleted in the background right after the last ack
        deadline = time.monotonic() + 10
        while any(r.client.keys(f"{job}:[0-9]*") for r in redis_units):  # cells, not the journal
            assert time.monotonic() < deadline, "cleared partition left cells in redis"
            time.sleep(0.05)


def test_tasks_are_independent(tq):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, TaskSpec("a", ["prompt"]), TaskSpec("b", ["prompt"]))
        c.put(0, prompts(6))
        got_a = c.claim("a", 10)
        got_b = c.claim("b", 10)
        assert got_a.indices == got_b.indices == list(range(6))
        c.ack(got_a)
        assert c.claim("a", 10).rows == []
        assert c.stats().rows == 6  # b has not acked yet: nothing cleared
        c.ack(got_b)
        assert c.stats().rows == 0


def test_group_policy_claims_complete_groups_only(tq):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        idx = c.put(0, prompts(8), group_size=4)
        b = c.claim("rollout", 8)
        first = [r for r in b.rows if r.index in idx[:4]]
        # only group 0 (rows 0-3) and one row of group 1 get responses
        partial = type(b)("rollout", b.lease, first + [b.rows[4]])
        respond(c, partial)
        assert c.claim("train", 8, policy="group").indices == idx[:4]
        c.release(b)


def test_token_balanced_claims_split_lengths_over_ranks(tq):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        c.put(0, prompts(16))
        b = c.claim("rollout", 16)
        lengths = [1, 50, 3, 40, 2, 30, 8, 25, 9, 12, 7, 5, 33, 4, 6, 10]
        c.write(b.indices, {"response_ids": [np.zeros(n, np.int32) for n in lengths],
                            "reward": [0.0] * 16}, length_column="response_ids")
        t = c.claim("train", 16, policy="token_balanced", dp_size=4)
        sums = [sum(r.length for r in t.rows if r.rank == k) for k in range(4)]
        counts = [sum(1 for r in t.rows if r.rank == k) for k in range(4)]
        assert counts == [4, 4, 4, 4]
        # total 245 (61.25 per rank); round-robin by index would give 45..96
        assert max(sums) - min(sums) <= 0.15 * sum(lengths) / 4, sums
        budget = c.claim("train", 16, token_budget=1)  # rows are leased already
        assert budget.rows == []


def test_staleness_filter_discards_or_regenerates_and_counts(tq):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        c.put(0, prompts(4))
        b = c.claim("rollout", 4)
        c.write(b.indices[:2], {"response_ids": [np.zeros(2, np.int32)] * 2, "reward": [1.0, 1.0]},
                versions=[0, 0])
        c.write(b.indices[2:], {"response_ids": [np.zeros(2, np.int32)] * 2, "reward": [1.0, 1.0]},
                versions=[3, 3])
        c.ack(b)
        fresh = c.claim("train", 4, min_version=2, min_count=1, on_stale="regenerate",
                        stale_producer="rollout")
        assert fresh.indices == [2, 3]
        again = c.claim("rollout", 4, min_count=1)
        assert again.indices == [0, 1]  # stale rows went back to be generated again
        stats = {s.name: s for s in c.stats().tasks}
        assert stats["train"].stale_regenerated == 2
        c.write(again.indices, {"response_ids": [np.zeros(2, np.int32)] * 2,
                                "reward": [0.0, 0.0]}, versions=[1, 1])
        c.ack(again)
        assert c.claim("train", 4, min_version=2, min_count=1).rows == []
        stats = {s.name: s for s in c.stats().tasks}
        assert stats["train"].stale_discarded == 2  # counted, never silent


def test_unacked_rows_return_after_the_lease_and_acked_never_do(redis_units):
    """The lease is 3 s: the claim right after the ack must come well inside it on a
    loaded machine; the unacked rows are then polled for until they come back, no
    sooner than the lease and only those."""
    lease = 3.0
    server = TQServer(redis_units, lease_seconds=lease)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(DRIVER, TaskSpec("t", ["prompt"]))
            c.put(0, prompts(4))
            claimed_at = time.monotonic()
            first = c.claim("t", 4)
            c.ack(first, first.indices[:2])
            assert c.claim("t", 4, min_count=1).rows == []
            deadline = claimed_at + lease + 30
            while not (again := c.claim("t", 4, min_count=1)).rows:
                assert time.monotonic() < deadline, "the unacked rows never came back"
                time.sleep(0.1)
            assert time.monotonic() - claimed_at >= lease
            assert again.indices == first.indices[2:]
            with pytest.raises(TransferQueueError) as err:
                c.ack(first)  # the old lease is gone
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert {s.name: s.expired for s in c.stats().tasks}["t"] == 2
    finally:
        server.stop()


def test_a_claim_whose_lease_ran_out_before_its_read_is_dropped(redis_units, caplog):
    """A consumer paused between its claim and its read (SIGSTOP, a starved process)
    past its lease: another consumer got the rows, read and acked them, and the table
    cleared their cells. Its claim_get then gives an empty batch and says why, where
    it raised DATA_LOSS (and a rollout exited with it)."""
    server = TQServer(redis_units, lease_seconds=1.0)
    try:
        with TransferQueueClient(server.address) as a, \
                TransferQueueClient(server.address) as b:
            a.register(DRIVER, TaskSpec("t", ["prompt"]))
            a.put(0, prompts(4))
            claim = a._claim  # claim_get's claim (its answer, before the read)

            def claim_then_pause(*args, **kwargs):
                held = claim(*args, **kwargs)
                assert len(held.rows.index) == 4
                deadline = time.monotonic() + 30
                while not (other := b.claim("t", 4, min_count=4)).rows:  # the lease ran out
                    assert time.monotonic() < deadline, "the rows never came back"
                    time.sleep(0.1)
                b.get(other, ["prompt"])
                b.ack(other)
                while True:  # the partition's cells are deleted in the background
                    try:
                        b.get(other, ["prompt"])
                    except TransferQueueError:
                        break
                    assert time.monotonic() < deadline, "the acked rows' cells stayed"
                    time.sleep(0.05)
                return held

            a._claim = claim_then_pause
            with caplog.at_level("WARNING", logger="rljob.transferqueue"):
                got = a.claim_get("t", 4, ["prompt"])
            assert got.rows == [] and got.lease == ""
            assert "dropped a claim of 4 rows of t" in caplog.text, caplog.text
            assert "DATA_LOSS" in caplog.text and "is not held" in caplog.text, caplog.text
            # a read that fails while the lease is held still raises, and its rows go
            # back at once (not after the lease)

            def claim_then_lose(*args, **kwargs):
                held = claim(*args, **kwargs)
                for r in redis_units:
                    for key in r.client.keys(f"{a._data.job}:[0-9]*"):
                        r.client.delete(key)
                return held

            a._claim = claim_then_lose
            a.put(1, prompts(2))
            with pytest.raises(TransferQueueError) as err:
                a.claim_get("t", 2, ["prompt"])
            assert err.value.code == grpc.StatusCode.DATA_LOSS
            assert len(b.claim("t", 2, min_count=2, wait=0.5).rows) == 2
    finally:
        server.stop()


def claiming(client, task, count, **kwargs):
    """A claim of `client` in a thread of its own, started: (thread, result), where
    result gets the claim's `batch` and the seconds it `waited` once it is answered."""
    result = {}

    def claim():
        t0 = time.monotonic()
        result["batch"] = client.claim(task, count, **kwargs)
        result["waited"] = time.monotonic() - t0

    th = threading.Thread(target=claim)
    th.start()
    return th, result


def test_long_poll_claim_wakes_on_write(tq):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        th, result = claiming(c, "t", 2, wait=10)
        time.sleep(0.3)
        c.put(0, prompts(2))
        th.join(15)
        assert len(result["batch"]) == 2
        assert result["waited"] < 5


def test_a_wake_answers_the_waiting_claims_of_its_client_with_what_is_ready(tq):
    """A worker whose claim waits for one kind of work wakes it when another kind
    arrives: the claim answers at once with whatever is ready; a wake that came
    before the claim was sent counts when the claim says `since`; claims of other
    clients and claims sent later wait as asked."""
    with TransferQueueClient(tq.address) as c, TransferQueueClient(tq.address) as other:
        c.register(DRIVER, TaskSpec("t", ["prompt"]), TaskSpec("u", ["prompt"]))
        c.put(0, prompts(2))
        mine, my_result = claiming(c, "t", 5, wait=10)
        theirs, their_result = claiming(other, "u", 5, wait=10)
        time.sleep(0.5)  # both wait: 2 rows are ready, they ask for 5
        assert "batch" not in my_result and "batch" not in their_result
        assert c._session.call("wake", pb.WakeRequest()).woken == 1
        mine.join(5)
        assert my_result["waited"] < 3  # woken: not its 10 s
        assert sorted(my_result["batch"].indices) == [0, 1]  # what was ready, leased
        time.sleep(0.3)
        assert "batch" not in their_result  # another client's claim still waits
        assert other._session.call("wake", pb.WakeRequest()).woken == 1
        theirs.join(5)
        assert len(their_result["batch"]) == 2

        # a wake before the claim: counted with `since` read before it, not without
        since = c.wakes
        c.wake()
        t0 = time.monotonic()
        assert not c.claim("t", 1, wait=10, since=since)
        assert time.monotonic() - t0 < 3
        t0 = time.monotonic()
        assert not c.claim("t", 1, wait=0.5, since=c.wakes)
        assert time.monotonic() - t0 >= 0.45


def test_a_bound_holds_later_partitions_back_and_a_new_bound_answers_the_waiting_claim(tq):
    """A rollout replica's release: its claims take rows of partitions up to its bound
    only (a later step's prompts wait in the table); a `bound` op of its client
    answers its waiting claim under the new bound, without a new claim; another
    client's claims are not bounded by it; an explicit max_partition wins."""
    with TransferQueueClient(tq.address) as c, TransferQueueClient(tq.address) as other:
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        c.put(0, prompts(2))
        c.put(1, prompts(2))
        c.bound("t", 0)
        first = c.claim("t", 4, min_count=1, wait=5)
        assert {r.partition for r in first.rows} == {0}
        th, result = claiming(c, "t", 2, wait=10)
        time.sleep(0.5)
        assert "batch" not in result  # partition 1's rows are ready, beyond the bound
        c.bound("t", 1)
        th.join(5)
        assert result["waited"] < 3  # answered by the bound, not its 10 s
        assert {r.partition for r in result["batch"].rows} == {1}
        c.release(result["batch"])
        # the bound is the client's: another client's claims take any partition
        assert {r.partition for r in other.claim("t", 2, wait=1).rows} == {1}
        c.put(2, prompts(2))
        t0 = time.monotonic()
        assert not c.claim("t", 2, wait=0.5)  # partition 2 is beyond the bound 1
        assert time.monotonic() - t0 >= 0.45
        assert {r.partition for r in c.claim("t", 2, max_partition=2).rows} == {2}


def test_a_one_partition_claim_takes_the_oldest_partition_that_answers_it(tq):
    """A rollout replica generates a batch with one step's weights and seeds: its
    claims take rows of one partition, the oldest whose ready rows answer the claim
    (a claim without the option takes the oldest rows across partitions)."""
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        c.put(0, prompts(2))
        c.put(1, prompts(4))
        c.put(2, prompts(4))
        mixed = c.claim("t", 4)
        assert [r.partition for r in mixed.rows] == [0, 0, 1, 1]
        c.release(mixed)
        # partition 0's two rows cannot answer a claim of four; partition 1's can
        four = c.claim("t", 4, one_partition=True)
        assert [r.partition for r in four.rows] == [1] * 4
        c.release(four)
        one = c.claim("t", 4, min_count=1, one_partition=True)
        assert [r.partition for r in one.rows] == [0, 0]
        # partition 1's four rows answer a claim of at least 3; partition 2's stay
        three = c.claim("t", 8, min_count=3, one_partition=True)
        assert [r.partition for r in three.rows] == [1] * 4
        # bounded to partition 1, nothing is left that answers: the claim waits
        t0 = time.monotonic()
        assert not c.claim("t", 8, min_count=1, one_partition=True, max_partition=1,
                           wait=0.5)
        assert time.monotonic() - t0 >= 0.45
        c.release(one)
        th, result = claiming(c, "t", 8, min_count=3, one_partition=True, wait=10)
        th.join(5)  # partition 0's two rows cannot answer it; partition 2's four do
        assert [r.partition for r in result["batch"].rows] == [2] * 4


def test_bad_requests_get_clear_errors_and_change_nothing(redis_units):
    server = TQServer(redis_units, max_row_bytes=1024)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(DRIVER, ROLLOUT)
            c.put(0, prompts(2))
            before = c.stats()
            with pytest.raises(TransferQueueError, match="unknown task 'nobody'") as err:
                c.claim("nobody", 1)
            assert err.value.code == grpc.StatusCode.NOT_FOUND
            with pytest.raises(ColumnError, match="unknown column 'nope'"):
                c.write([0], {"nope": [1]})
            with pytest.raises(ColumnError, match="holds int32, got float64"):
                c.write([0], {"response_ids": [np.zeros(3)]})
            with pytest.raises(ColumnError, match="larger than max_row_bytes=1024"):
                c.put(0, {"prompt": ["x"], "prompt_ids": [np.zeros(1000, np.int32)]})
            with pytest.raises(TransferQueueError, match="already declared as tensor") as err:
                c.register(TaskSpec("other", (), [scalar("response_ids", "int64")]))
            assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(TransferQueueError, match="consumes undeclared column"):
                c.register(TaskSpec("late", ["missing_col"]))
            with pytest.raises(TransferQueueError, match="unknown row index"):
                c.write([999], {"reward": [1.0]})
            after = c.stats()
            assert after == before
            assert {s.name for s in after.tasks} == {"driver", "rollout"}
    finally:
        server.stop()


def test_health_metrics_and_graceful_shutdown(redis_units):
    server = TQServer(redis_units)
    with grpc.insecure_channel(server.address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    with TransferQueueClient(server.address) as c:
        c.register(DRIVER)
        c.put(0, prompts(3))
        c.report_metrics(step=4, gen_seconds=2.5, train_seconds=1.5, tokens_per_second=900.0)
        assert c.stats().metrics.step == 4
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics").read().decode()
    assert 'rljob_tq_rows{rljob="' in body and "} 3.0" in body
    assert not re.search(r'[{,]job="', body)  # the scrape's label, not ours
    assert "rljob_job_gen_seconds" in body
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=20) == 0


def test_cells_shard_over_units_by_index(tq, redis_units):
    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        idx = c.put(7, prompts(4))
        job = c._data.job
        for i in idx:
            owner = redis_units[i % 2].client
            other = redis_units[(i + 1) % 2].client
            assert owner.exists(cell_key(job, i, "prompt")) and not other.exists(cell_key(job, i, "prompt"))


def test_a_client_learns_columns_registered_by_another(tq):
    with TransferQueueClient(tq.address) as early, TransferQueueClient(tq.address) as late:
        late.register(DRIVER, TaskSpec("t", ["prompt"]))
        late.put(0, prompts(2))
        b = early.claim_get("t", 2, ["prompt"])  # registered after `early` connected
        assert b.data["prompt"] == ["p0", "p1"]


def test_non_blocking_puts_surface_refusals_on_flush(redis_units):
    server = TQServer(redis_units, max_row_bytes=1024)
    try:
        with TransferQueueClient(server.address) as c:
            c.register(DRIVER, TaskSpec("t", ["prompt"]))
            assert len(c.put(0, prompts(4), wait=False)) == 4
            c.flush()
            assert c.stats().rows == 4
            c._data.max_row_bytes = 0  # skip the client-side check: the controller refuses
            c.put(0, {"prompt": ["x"], "prompt_ids": [np.zeros(1000, np.int32)]}, wait=False)
            with pytest.raises(TransferQueueError, match="exceed max_row_bytes=1024") as err:
                c.flush()
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert c.stats().rows == 4
    finally:
        server.stop()


def test_session_reconnects_after_a_controller_restart(redis_units):
    server = TQServer(redis_units)
    port = server.port
    c = TransferQueueClient(server.address)
    c.register(DRIVER, TaskSpec("t", ["prompt"]))
    c.put(0, prompts(1))
    assert len(c.claim("t", 1)) == 1
    stopper = threading.Timer(0.5, server.stop)
    stopper.start()
    with pytest.raises(TransferQueueError) as err:
        c.claim("t", 1, wait=30)  # in flight when the controller goes away
    stopper.join()
    assert err.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    # a controller is back on the same address: the next call opens a new session
    import subprocess
    args = [a if a != "127.0.0.1:0" else f"127.0.0.1:{port}" for a in server.proc.args]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in proc.stdout.readline()
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        assert len(c.put(0, prompts(2))) == 2
        assert len(c.claim("t", 2)) == 2
    finally:
        proc.terminate()
        proc.wait()
        c.close()


def test_stream_loader_prefetches_and_gives_back_on_early_exit(tq):
    from rljob.transferqueue.loader import stream_loader

    with TransferQueueClient(tq.address) as c:
        c.register(DRIVER, TaskSpec("t", ["prompt"]))
        c.put(0, prompts(12))
        seen = []
        for batch in stream_loader(c, "t", ["prompt"], 4, prefetch=2, wait=0.5):
            seen.append(batch.indices)
            time.sleep(0.3)  # the step: two more batches are claimed meanwhile
            break  # leave without finishing the step
        # nothing was acked; the batch in hand and the prefetched ones are back at once
        again = c.claim("t", 12, min_count=12)
        assert sorted(again.indices) == list(range(12))
        assert {s.name: s for s in c.stats().tasks}["t"].acked == 0
        c.release(again)
        got = [b.indices for b in stream_loader(c, "t", ["prompt"], 4, prefetch=1,
                                                 stop_when_idle=1.0, wait=0.5)]
        assert sorted(i for b in got for i in b) == list(range(12))
        assert {s.name: s for s in c.stats().tasks}["t"].acked == 12


def test_a_replaced_controller_stops_at_its_next_write(redis_units):
    """A replacement controller pod starts while the old one still drains: the
    replacement takes the table over, the old one is fenced off at its next write
    (it stops without answering), and nothing it accepted before is lost."""
    job = f"fenced{uuid.uuid4().hex[:8]}"
    old = TQServer(redis_units, job=job)
    try:
        with TransferQueueClient(old.address) as c:
            c.register(DRIVER, TaskSpec("t", ["prompt"]))
            c.put(0, prompts(2))
        new = TQServer(redis_units, job=job)
        try:
            with TransferQueueClient(old.address) as c, pytest.raises(TransferQueueError):
                c.put(1, prompts(3))
            assert old.proc.wait(timeout=20) == 3  # EXIT_STORAGE_LOST: fail-stop
            assert "a newer controller took the table over" in old.proc.stdout.read()
            with TransferQueueClient(new.address) as c:
                assert c.stats().rows == 2
                c.register(DRIVER, TaskSpec("t", ["prompt"]))
                assert len(c.put(1, prompts(3))) == 3
                assert len(c.claim("t", 5)) == 5
        finally:
            new.stop()
    finally:
        old.stop()


def test_a_fenced_write_with_ack_acks_its_rows_and_reads_back_under_each_lease(server):
    """A producer's write and ack in one notify: the rows leave its lease acked, the
    next task reads the cells of two leases (two tag sets in one claim's answer), and
    an ack without a lease is refused before anything changes."""
    with TransferQueueClient(server.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        c.put(0, prompts(8))
        first, second = c.claim("rollout", 4), c.claim("rollout", 4)
        for batch in (first, second):
            ids = [np.full(3, r.index, np.int32) for r in batch.rows]
            newly = c.write(batch.indices, {
                "response_ids": ids, "reward": [float(r.index) for r in batch.rows],
                "logp": [np.full(3, -r.index, np.float32) for r in batch.rows]},
                length_column="response_ids", lease=batch, ack=True)
            assert newly == 4
        stats = {s.name: s for s in c.stats().tasks}
        assert (stats["rollout"].acked, stats["rollout"].claimed) == (8, 0)
        with pytest.raises(TransferQueueError) as err:
            c.ack(first)  # acked by the write: the lease is gone
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        t = c.claim_get("train", 8, ["response_ids", "reward", "logp", "prompt"])
        assert len(t.tag_sets) == 2  # each lease's tags once, not once a row
        assert sorted({r.tag_set for r in t.rows}) == [1, 2]
        assert [x.tolist() for x in t.data["response_ids"]] == [[i] * 3 for i in t.indices]
        assert [x.tolist() for x in t.data["logp"]] == [[-i] * 3 for i in t.indices]
        assert t.data["prompt"] == [f"p{i}" for i in t.indices]
        with pytest.raises(ValueError, match="pass lease"):
            c.write(t.indices, {"reward": [0.0] * 8}, ack=True)
        channel = grpc.insecure_channel(server.address)
        try:
            from rljob.transferqueue.proto import transferqueue_pb2 as pb
            from rljob.transferqueue.proto import transferqueue_pb2_grpc as pbg

            with pytest.raises(grpc.RpcError) as raw:
                pbg.TransferQueueControllerStub(channel).NotifyWritten(
                    pb.NotifyWrittenRequest(indices=t.indices, columns=["reward"], ack=True,
                                            task="rollout"), timeout=30)
            assert raw.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "fenced write" in raw.value.details()
        finally:
            channel.close()
        c.ack(t)
        assert c.stats().rows == 0


def test_memory_units_cells_travel_in_the_notify_and_the_claim(tq_memory, monkeypatch):
    """Memory units live in the controller: a put's and a fenced write's cells go in
    their notify, a claim_get's come back in the claim's answer (rows under two
    leases' tags included), and no Put or Get of the storage service is made. A
    refused fenced write stores none of its cells."""
    from rljob.transferqueue.storage.memory import RemoteMemoryUnit

    def no_call(*_args, **_kw):
        raise AssertionError("a memory unit's Put or Get was called")

    for name in ("put", "get", "get_cells"):
        monkeypatch.setattr(RemoteMemoryUnit, name, no_call)
    with TransferQueueClient(tq_memory.address) as c:
        c.register(DRIVER, ROLLOUT, TRAIN)
        c.put(0, prompts(8))
        first = c.claim_get("rollout", 4, ["prompt_ids"])
        second = c.claim_get("rollout", 4, ["prompt_ids"])
        assert [x.tolist() for x in first.data["prompt_ids"] + second.data["prompt_ids"]] == \
            [list(range(i % 5 + 1)) for i in first.indices + second.indices]
        for batch in (first, second):
            c.write(batch.indices, {
                "response_ids": [np.full(3, r.index, np.int32) for r in batch.rows],
                "reward": [float(r.index) for r in batch.rows],
                "logp": [np.full(3, -r.index, np.float32) for r in batch.rows]},
                length_column="response_ids", lease=batch, ack=True)
        t = c.claim_get("train", 8, ["response_ids", "reward", "prompt"])
        assert sorted({r.tag_set for r in t.rows}) == [1, 2]
        assert [x.tolist() for x in t.data["response_ids"]] == [[i] * 3 for i in t.indices]
        assert list(t.data["reward"]) == [float(i) for i in t.indices]
        assert t.data["prompt"] == [f"p{i}" for i in t.indices]
        c.ack(t)
        deadline = time.monotonic() + 10
        while c.stats().cleared_partitions < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(TransferQueueError, match="no longer in the table"):
            c.write(first.indices, {"reward": [0.0] * 4}, lease=first)  # a late writer

        # a write under a lease that is not held: refused, nothing of it stored
        c.put(1, prompts(2))
        held = c.claim("rollout", 2)
        c.release(held)
        with pytest.raises(TransferQueueError) as err:
            c.write(held.indices, {"response_ids": [np.zeros(1, np.int32)] * 2,
                                   "reward": [0.0] * 2, "logp": [np.zeros(1, np.float32)] * 2},
                    lease=held)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        monkeypatch.undo()
        cells = c._data.units[0].get_cells([(i, f"reward:{held.lease}") for i in held.indices])
        assert cells == [None, None]
