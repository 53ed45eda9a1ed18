"""The trainer's step claims against a real TransferQueue controller: rows whose
lease expired while the trainer held them (its controller or storage was away
longer than a lease term) come back, are claimed again, and are still trained
exactly once and acked under the new lease."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rljob.api.validation import load_rljob
from rljob.inputs.data import load_examples
from rljob.inputs.models import load_tokenizer
from rljob.preflight import resolve_paths
from rljob.trainer.source import StepSource
from rljob.transferqueue import TransferQueueClient
from rljob.transferqueue.consumer import LeaseKeeper
from rljob.workflow.driver import Workflow
from rljob.workflow.tasks import ROLLOUT_READS, tasks_for

from .conftest import TQServer

REPO = Path(__file__).resolve().parents[2]


class SwitchedKeeper:
    """A LeaseKeeper that keeps nothing alive until switched on."""

    def __init__(self, client):
        self.keeper, self.on = LeaseKeeper(client), threading.Event()

    def hold(self, batch):
        if self.on.is_set():
            self.keeper.hold(batch)

    def drop(self, batch):
        self.keeper.drop(batch)

    def close(self):
        self.keeper.close()


def _roll_out(client: TransferQueueClient, rows: int) -> None:
    """What a rollout replica writes for `rows` rows: constant samples, acked."""
    batch = client.claim_get("rollout", rows, ROLLOUT_READS, wait=5.0, min_count=rows)
    assert len(batch) == rows, len(batch)
    k = len(batch)
    client.write(batch.indices, {
        "response_ids": [np.array([5, 6, 7], np.int32)] * k,
        "rollout_logp": [np.array([-1.0, -1.0, -1.0], np.float32)] * k,
        "reward": [1.0] * k, "reward_error": [""] * k,
        "started_at": [time.time()] * k, "finished_at": [time.time()] * k,
        "weights_epoch": [0] * k, "gen_calls": [[]] * k,
    }, versions=[0] * k, length_column="response_ids", lease=batch)
    client.ack(batch)
    # the reference task (what the trainer or an idle replica computes): constant
    # log-probs; the trainer claims a row once it has them
    ref = client.claim_get("reference", rows, ["response_ids"], wait=5.0, min_count=rows)
    assert len(ref) == rows, len(ref)
    client.write(ref.indices, {"ref_logp": [np.array([-1.0] * 3, np.float32)] * rows},
                 lease=ref)
    client.ack(ref)


def test_rows_claimed_again_after_their_lease_expired_are_trained_once():
    job = resolve_paths(load_rljob(str(REPO / "examples/quickstart.yaml")), REPO / "examples")
    spec = job.spec
    assert spec.workflow.mode == "async"  # arrival order: a slot listed twice would be trained twice
    assert spec.algorithm.kl_coef > 0  # the reference's log-probs are a task of their own
    n, g = spec.algorithm.samples_per_step, spec.algorithm.group_size
    half = n // 2 - (n // 2) % g
    server = TQServer(None, lease_seconds=2.0)
    client = TransferQueueClient(server.address)
    source = keeper = None
    try:
        client.register(*tasks_for(spec))
        flow = Workflow(spec, client, None, load_tokenizer(spec.model))
        flow.put_prepared(0, flow.prepare_prompts(load_examples(spec.dataset)
                                                  [:spec.algorithm.step_prompts]))
        keeper = SwitchedKeeper(client)
        source = StepSource(spec, client, 0, keeper)
        _roll_out(client, half)
        deadline = time.monotonic() + 20
        while source.rows_claimed < half:
            assert time.monotonic() < deadline, source.rows_claimed
            time.sleep(0.05)
        keeper.on.set()  # from now on leases are kept alive: the first one is not
        while True:  # the first lease expired and the claimer took its rows again
            train = {t.name: t for t in client.stats().tasks}["train"]
            if (train.expired, train.claimed, train.ready) == (half, half, 0):
                break
            assert time.monotonic() < deadline, train
            time.sleep(0.05)
        _roll_out(client, n - half)

        trained = []
        while (chunk := source.next_micro_batch()) is not None:
            trained += [s.slot for s in chunk]
            assert all(s.ref_logp == [-1.0] * 3 for s in chunk)
        assert sorted(trained) == list(range(n)), trained
        assert (source.rows_claimed, source.rows_reclaimed) == (n, half)
        leases = source.take_leases()
        assert sum(len(b) for b in leases) == n  # the expired lease holds none of them
        for batch in leases:
            client.ack(batch)  # each lease is held: none of them is the expired one
        train = {t.name: t for t in client.stats().tasks}["train"]
        assert (train.acked, train.expired) == (n, half)
    finally:
        if source is not None:
            source.close()
        if keeper is not None:
            keeper.close()
        client.close()
        server.stop()


class WaitingIdle:
    """Idle work whose claim waits and never finds rows (a partition nobody writes):
    only a wake ends it before its time."""

    def __init__(self, address: str):
        self.tq = TransferQueueClient(address)
        self.waited: list[float] = []
        self.pool = ThreadPoolExecutor(1)

    def mark(self) -> int:
        return self.tq.wakes

    def wake(self) -> None:
        self.tq.wake()

    def claim(self, partition: int, wait: float, since: int | None = None) -> Future:
        def claim():
            t0 = time.monotonic()
            batch = self.tq.claim("reference", 4, partition=partition + 99, wait=wait,
                                  min_count=1, since=since)
            self.waited.append(time.monotonic() - t0)
            return batch

        return self.pool.submit(claim)

    def work(self, batch) -> int:
        assert not batch.rows
        return 0

    def abandon(self, claim: Future) -> None:
        self.wake()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.tq.close()


def test_arrivals_wake_the_trainers_idle_claim(monkeypatch):
    """While the trainer waits for a micro-batch, its idle work (the reference task)
    waits in a claim of its own; the step's rows arriving go to training at once, and
    end that claim on the controller, not after its wait."""
    from rljob.trainer import source as source_mod

    monkeypatch.setattr(source_mod, "IDLE_WAIT", 60.0)
    job = resolve_paths(load_rljob(str(REPO / "examples/quickstart.yaml")), REPO / "examples")
    spec = job.spec
    n = spec.algorithm.samples_per_step
    server = TQServer(None)
    client = TransferQueueClient(server.address)
    source = keeper = idle = None
    try:
        client.register(*tasks_for(spec))
        flow = Workflow(spec, client, None, load_tokenizer(spec.model))
        flow.put_prepared(0, flow.prepare_prompts(load_examples(spec.dataset)
                                                  [:spec.algorithm.step_prompts]))
        idle = WaitingIdle(server.address)
        keeper = LeaseKeeper(client)
        source = StepSource(spec, client, 0, keeper, idle=idle)
        def roll_out():
            with TransferQueueClient(server.address) as rollout:
                _roll_out(rollout, n)

        threading.Timer(1.0, roll_out).start()
        t0 = time.monotonic()
        trained = []
        while (chunk := source.next_micro_batch()) is not None:
            trained += [s.slot for s in chunk]
        assert sorted(trained) == list(range(n))
        # the rows came about 1 s in: the trainer did not wait out its idle claim's 60 s
        assert time.monotonic() - t0 < 30
        # and their arrival ended that claim on the controller too (the step holds on)
        deadline = time.monotonic() + 10
        while not idle.waited:
            assert time.monotonic() < deadline, "the arrivals left the idle claim waiting"
            time.sleep(0.05)
        assert max(idle.waited) < 30, idle.waited
        for batch in source.take_leases():
            client.ack(batch)
    finally:
        if source is not None:
            source.close()
        if keeper is not None:
            keeper.close()
        if idle is not None:
            idle.close()
        client.close()
        server.stop()


def test_a_trainers_steps_claim_from_the_one_thread_it_gives_them():
    """The trainer hands each step's source its one claimer thread (a thread started
    a step waits until it runs, before the step's first claim): two steps in a row
    each get their rows from it, and no thread of their own is started."""
    job = resolve_paths(load_rljob(str(REPO / "examples/quickstart.yaml")), REPO / "examples")
    spec = job.spec
    n = spec.algorithm.samples_per_step
    server = TQServer(None)
    client = TransferQueueClient(server.address)
    claimers = ThreadPoolExecutor(1, thread_name_prefix="test-step-claimer")
    keeper = source = None
    try:
        client.register(*tasks_for(spec))
        flow = Workflow(spec, client, None, load_tokenizer(spec.model))
        examples = load_examples(spec.dataset)[:spec.algorithm.step_prompts]
        keeper = LeaseKeeper(client)
        for step in (0, 1):
            flow.put_prepared(step, flow.prepare_prompts(examples))
            source = StepSource(spec, client, step, keeper, claimers=claimers)
            _roll_out(client, n)
            trained = []
            while (chunk := source.next_micro_batch()) is not None:
                trained += [s.slot for s in chunk]
            assert sorted(trained) == list(range(n)), (step, trained)
            assert not [t for t in threading.enumerate() if t.name == "rljob-step-claimer"]
            for batch in source.take_leases():
                client.ack(batch)
            source = None
        assert len(claimers._threads) == 1
        train = {t.name: t for t in client.stats().tasks}["train"]
        assert train.acked == 2 * n
    finally:
        if source is not None:
            source.close()
        claimers.shutdown()
        if keeper is not None:
            keeper.close()
        client.close()
        server.stop()
