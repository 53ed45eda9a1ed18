"""A rollout replica gives back rows whose step its weights cannot train within
maxStaleness (after a trainer restart from an older checkpoint) instead of
generating samples the trainer would refuse."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from rljob.api import RLJob
from rljob.rollout.worker import RolloutWorker
from rljob.workflow.release import ReleaseRule


def _worker(mode: str, k: int | None, version: int):
    workflow = {"mode": mode, **({"maxStaleness": k} if k else {})}
    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "b"},
        "spec": {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"},
                 "workflow": workflow}})
    w = RolloutWorker.__new__(RolloutWorker)
    given, waited = [], []
    w.spec = job.spec
    w.rule = ReleaseRule.of(job.spec)
    w._bound_lock, w._held, w._swapped, w._sent_bound = threading.Lock(), None, None, None
    w._started = threading.Event()
    w.engine = SimpleNamespace(version=version)
    w._give_back = lambda batches: given.extend(batches)
    w.metrics = SimpleNamespace(given_back=SimpleNamespace(inc=lambda n: None))
    w.receiver = SimpleNamespace(wait_version=lambda v, timeout: waited.append(v))
    return w, given, waited


def _batch(step: int):
    return SimpleNamespace(rows=[SimpleNamespace(partition=step)] * 4)


def test_rows_beyond_the_bound_go_back_and_the_replica_waits_for_newer_weights():
    w, given, waited = _worker("async", 2, version=5)
    assert not w.beyond_bound(_batch(7))  # 7 - 2 <= 5: trainable
    assert given == []
    b = _batch(8)  # 8 - 2 > 5: the trainer would refuse what these weights make
    assert w.beyond_bound(b)
    assert given == [b] and waited == [6]


def test_on_policy_modes_never_give_rows_back():
    for mode in ("sync", "periodic"):
        w, given, _ = _worker(mode, None, version=0)
        assert not w.beyond_bound(_batch(3)) and given == []


def _claiming(mode: str, holds: int):
    """A worker whose claim brings a batch of step 3, holding weights `holds`; the
    trainer's latest is asked through `asked`."""
    import threading

    w, _, _ = _worker(mode, 1 if mode == "async" else None, version=holds)
    batch = SimpleNamespace(rows=[SimpleNamespace(partition=3)] * 4)
    asked = []
    w.consumer = SimpleNamespace(tq=SimpleNamespace(claim_get=lambda *a, **k: batch),
                                 keeper=SimpleNamespace(hold=lambda b: None))
    w.spans = SimpleNamespace(claimed=lambda b, step: None)
    w.claim_rows, w.claim_policy, w.g, w.stop = 4, "fifo", 4, threading.Event()
    w.wait_weights = True
    w.receiver = SimpleNamespace(holds=lambda v: holds >= v, version=holds,
                                 latest=lambda: asked.append(1) or (4, 2))
    return w, batch, asked


def test_an_on_policy_claim_asks_the_trainer_only_when_the_steps_weights_are_not_held():
    """sync and periodic: the driver released the step once every live replica held
    its weights, and none newer comes before it is trained, so a replica that holds
    them generates at once; one that does not (it was not live then) asks the trainer
    for its newest and waits for them. async asks every time."""
    for mode in ("sync", "periodic"):
        w, batch, asked = _claiming(mode, holds=3)
        assert w.claim() == (batch, (-1, 0)) and asked == []
        w, batch, asked = _claiming(mode, holds=2)
        assert w.claim() == (batch, (4, 2)) and asked == [1]
    w, batch, asked = _claiming("async", holds=3)
    assert w.claim() == (batch, (4, 2)) and asked == [1]


def test_a_replicas_claims_are_bounded_by_the_weights_it_holds():
    """The bound its claims carry, moved at each swap: the last step the weights it
    holds may generate (on-policy their own step, async(k) k past it)."""
    import threading

    for mode, k, version, bound in (("sync", None, 4, 4), ("periodic", None, 0, 0),
                                    ("async", 2, 4, 6), ("async", 1, 4, 5)):
        w, _, _ = _worker(mode, k, version)
        sent = []
        w.consumer = SimpleNamespace(tq=SimpleNamespace(bound=lambda t, p: sent.append((t, p))))
        w.receiver = SimpleNamespace(version=version)
        w.rule = ReleaseRule.of(w.spec)
        w._bound_lock = threading.Lock()
        w._rebound()
        assert sent == [("rollout", bound)], mode


def test_a_replica_holds_the_next_steps_batch_until_a_swap_lets_it_generate_it(monkeypatch):
    """The batched loop's claims take a step past the bound (AHEAD): a batch of it is
    held (its rows kept, the bound back at the weights' own so that the claims meanwhile
    take only rows the current step still needs), a swap to weights that may generate
    it wakes the loop and hands it over, and the receiver's thread moves the bound (a
    step past again) once that generation started; a swap to older weights (a trainer
    restarted from an older checkpoint) gives it back."""
    import time

    from rljob.rollout import worker
    from rljob.rollout.worker import AHEAD

    monkeypatch.setattr(worker, "SWAP_YIELD", 30.0)

    assert AHEAD == 1
    w, given, _ = _worker("sync", None, version=4)
    sent = []
    w.consumer = SimpleNamespace(tq=SimpleNamespace(bound=lambda t, p: sent.append(p)))
    w.receiver = SimpleNamespace(version=4)
    w.ahead = AHEAD
    w._rebound()
    assert sent == [5]  # step 5's prompts are claimed while weights 4 generate step 4
    assert w._verdict(_batch(4)) == "now" and w._verdict(_batch(5)) == "hold"
    held = (_batch(5), (-1, 0))
    w._hold(held)
    assert sent == [5, 4]  # holding step 5: claims take step 4's rows only
    assert w._take_held() is None and not w._swapped.done()
    swapped = w._swapped
    w.receiver.version = 5  # the swap: the receiver's thread calls _on_swap
    receiver = threading.Thread(target=w._on_swap)
    receiver.start()
    swapped.result(timeout=10)  # the loop wakes
    assert w._take_held() is held and w._held is None
    time.sleep(0.05)
    assert receiver.is_alive() and sent == [5, 4]  # the loop's generation goes first
    w._started.set()  # it started: the receiver's thread goes on
    receiver.join(timeout=10)
    assert not receiver.is_alive() and sent == [5, 4, 6]
    # async(2): weights 4 generate up to step 6; step 7 is held, step 8 goes back
    w, given, _ = _worker("async", 2, version=4)
    w.consumer = SimpleNamespace(tq=SimpleNamespace(bound=lambda t, p: None))
    w.receiver, w.ahead = SimpleNamespace(version=4), AHEAD
    assert [w._verdict(_batch(s)) for s in (6, 7, 8)] == ["now", "hold", "back"]
    w.engine = SimpleNamespace(version=4)
    assert not w.beyond_bound(_batch(7)) and given == []
    # a swap to older weights: the held batch goes back, nothing is handed over
    w._hold((_batch(7), (-1, 0)))
    w.receiver.version = 2
    t0 = time.monotonic()
    w._on_swap()  # no loop waits for this swap: the thread does not wait either
    assert time.monotonic() - t0 < 10
    assert w._take_held() is None and w._held is None
    assert [b.rows[0].partition for b in given] == [7]


def test_a_replicas_claim_takes_one_steps_rows_and_a_held_one_asks_no_trainer():
    """A batch is generated with one step's weights and seeds: the claim asks for one
    partition's rows. A batch of the step ahead (held until a swap) does not ask the
    trainer for its newest weights at the claim: it is generated at the swap."""
    w, batch, asked = _claiming("sync", holds=2)
    kwargs = []
    w.consumer.tq.claim_get = lambda *a, **k: kwargs.append(k) or batch
    w.ahead = 1  # the batched loop's AHEAD: step 3 is one past weights 2's bound
    assert w.claim() == (batch, (-1, 0)) and asked == []
    assert kwargs[0]["one_partition"] is True
