"""Idle cores lent between a local run's trainer and rollouts (infra/cores.py)."""

from __future__ import annotations

import os

import pytest
import torch

from rljob.api import RLJob
from rljob.infra.cores import BUSY, LAYOUT, CoreShare, Layout, _pin_all, cores_now, write_layout
from rljob.local import LocalRun

TWO = Layout(("trainer-0", "rollout-0"), ((0,), (1,)))


def test_a_waiting_side_lends_its_cores_to_the_other():
    assert cores_now(TWO, "trainer-0", [True, False]) == (0, 1)  # the rollout is parked
    assert cores_now(TWO, "trainer-0", [True, True]) == (0,)  # it generates: its core back
    assert cores_now(TWO, "rollout-0", [False, True]) == (0, 1)  # the trainer waits
    assert cores_now(TWO, "rollout-0", [True, True]) == (1,)


def test_lent_cores_are_split_among_the_borrowing_role_and_never_lent_twice():
    layout = Layout(("trainer-0", "rollout-0", "rollout-1"), ((0, 1), (2,), (3,)))
    idle_trainer = [False, True, True]
    got = [cores_now(layout, w, idle_trainer) for w in ("rollout-0", "rollout-1")]
    assert got == [(0, 2), (1, 3)]
    # workers of one role never lend to each other
    assert cores_now(layout, "rollout-0", [True, True, False]) == (2,)
    # a core two workers share (fewer cores than workers) is nobody's to lend
    shared = Layout(("trainer-0", "rollout-0", "rollout-1"), ((0,), (1,), (0,)))
    assert cores_now(shared, "rollout-0", [False, True, True]) == (1,)


def _job(engine: str = "hf", trainer: str = "torch") -> RLJob:
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"},
        "spec": {"model": {"path": "random:examples/models/tiny-qwen2",
                           "tokenizer": "builtin:char"},
                 "dataset": {"path": "examples/data/arith.jsonl"},
                 "rollout": {"engine": engine}, "trainer": {"engine": trainer},
                 "reward": {"name": "exact_match"}}})


def test_rljob_run_writes_the_layout_where_cores_can_be_lent(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    run = LocalRun(_job(), tmp_path, lend_cores=True)
    assert run.core_layout() == TWO
    write_layout(tmp_path, run.core_layout())
    assert (tmp_path / BUSY).read_bytes() == b"\0\0"
    # vLLM runs threads of its own; without --lend-cores; one core: nothing to lend
    assert LocalRun(_job(engine="vllm"), tmp_path, lend_cores=True).core_layout() is None
    assert LocalRun(_job(), tmp_path).core_layout() is None
    write_layout(tmp_path, None)  # an earlier run's files go
    assert not (tmp_path / LAYOUT).exists() and not (tmp_path / BUSY).exists()
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    assert LocalRun(_job(), tmp_path, lend_cores=True).core_layout() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_borrower_follows_the_lenders_busy_byte_between_layers(tmp_path):
    """Two workers' views of one run directory (as two processes map it): the
    trainer computes on both cores while the rollout is parked and gives the
    rollout's core back before its next layer once the rollout computes."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    write_layout(tmp_path, Layout(("trainer-0", "rollout-0"), ((cores[0],), (cores[1],))))
    trainer, rollout = CoreShare(tmp_path, "trainer-0"), CoreShare(tmp_path, "rollout-0")
    before = os.sched_getaffinity(0), torch.get_num_threads()
    seen = []
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    layers = torch.nn.ModuleList(list(model))
    trainer.hook(torch.nn.ModuleDict({"layers": layers}))
    layers[1].register_forward_pre_hook(
        lambda *_: seen.append((torch.get_num_threads(), trainer.busy())))
    try:
        with trainer.computing():
            assert torch.get_num_threads() == 2 and os.sched_getaffinity(0) == set(cores)
            with rollout.computing():  # the rollout starts generating
                model(torch.ones(1, 4))  # the trainer's next layers run on its own core
                assert os.sched_getaffinity(0) == {cores[0]}
            model(torch.ones(1, 4)).sum().backward()  # parked again: lent back
            assert torch.get_num_threads() == 2
        # idle, it keeps its threads (a change of thread count is dear); the next
        # compute next to a busy rollout runs on its own core
        assert torch.get_num_threads() == 2 and (tmp_path / BUSY).read_bytes() == b"\0\0"
        with rollout.computing(), trainer.computing():
            assert torch.get_num_threads() == 1 and os.sched_getaffinity(0) == {cores[0]}
        assert seen == [(1, [True, True]), (2, [True, False])]
    finally:
        _pin_all(tuple(before[0]))
        torch.set_num_threads(before[1])
        trainer.close()
        rollout.close()


def test_the_same_bits_at_one_and_two_threads():
    """Lending changes the threads a computation uses, not its result: periodic
    stays equal to sync bit for bit only while this holds for the models we run."""
    from rljob.inputs.models import build_model, load_tokenizer

    job = _job().spec
    tok = load_tokenizer(job.model)
    model = build_model(job.model, tok, seed=0, dtype=torch.float32)
    ids = torch.randint(0, len(tok), (16, 40), generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()

    def run(threads: int):
        torch.set_num_threads(threads)
        model.zero_grad()
        logits = model(ids).logits
        torch.log_softmax(logits, -1).mean().backward()
        return logits.detach().clone(), [p.grad.clone() for p in model.parameters()]

    try:
        one, two = run(1), run(2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0])
    assert all(torch.equal(a, b) for a, b in zip(one[1], two[1]))
