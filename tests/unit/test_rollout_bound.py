"""A rollout replica gives back rows whose step its weights cannot train within
maxStaleness (after a trainer restart from an older checkpoint) instead of
generating samples the trainer would refuse."""

from __future__ import annotations

from types import SimpleNamespace

from rljob.api import RLJob
from rljob.rollout.worker import RolloutWorker


def _worker(mode: str, k: int | None, version: int):
    workflow = {"mode": mode, **({"maxStaleness": k} if k else {})}
    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "b"},
        "spec": {"model": {"path": "m"}, "dataset": {"path": "d.jsonl"},
                 "workflow": workflow}})
    w = RolloutWorker.__new__(RolloutWorker)
    given, waited = [], []
    w.spec = job.spec
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
