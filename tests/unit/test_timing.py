"""Tgen and Ttrain from known spans (workflow/timing.py), and the trainer's step
figures built on them: queueing before generation is not generation."""

from __future__ import annotations

import pytest

from rljob.trainer.report import step_metrics
from rljob.trainer.source import Sample
from rljob.workflow.timing import (busy_seconds, generation_queue_seconds,
                                   generation_seconds, training_seconds)


def test_busy_seconds_is_the_union_of_the_spans():
    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0, 4), (1, 5), (7, 8)]) == 6.0  # overlap counted once, gap not
    assert busy_seconds([(7, 8), (0, 4), (1, 2)]) == 5.0  # any order, nested
    assert busy_seconds([(0, 1), (1, 2)]) == 2.0  # touching
    assert busy_seconds([(3, 3), (5, 4)]) == 0.0  # empty spans


def test_two_replicas_generating_in_parallel_count_once():
    # replica A generates groups over [10, 14], replica B over [11, 16]
    assert generation_seconds([(10, 12), (12, 14), (11, 16)]) == 6.0
    # the trainer's micro-steps with waits for samples between them
    assert training_seconds([(0, 1), (3, 4.5), (4.5, 5)]) == 3.0


def sample(slot, released, started, finished, length=4):
    return Sample(slot=slot, group=slot // 2, version=0, prompt_ids=[1, 2],
                  response_ids=[3] * length, rollout_logp=[0.0] * length, reward=1.0,
                  released_at=released, started_at=started, finished_at=finished)


def test_a_step_queued_behind_the_previous_one_reports_its_generation_only():
    """Async: step t's prompts are released at 100 while the replicas still finish
    step t−1 until 130; they generate t over [130, 140] and [131, 142]. Tgen is 12
    (not the 42 from release to the last finished group); the queueing, 30, is
    reported beside it; tokens/s are over the generation time."""
    samples = [sample(0, 100, 130, 140), sample(1, 100, 130, 140),
               sample(2, 100, 131, 142), sample(3, 100, 131, 142)]
    m = step_metrics(0, samples, [(150, 151), (152, 153.5)], 60.0,
                     {"loss": 0.0, "kl": 0.0, "clip": 0.0})
    assert m["gen_seconds"] == 12.0
    assert m["gen_queue_seconds"] == 30.0
    assert m["train_seconds"] == 2.5
    assert m["tokens_per_second"] == pytest.approx(16 / 12.0)


def test_prompts_put_before_their_release_queue_from_the_release():
    """The driver puts a step's prompts a step ahead of their release; their queueing
    counts from the later of the put and the publish of the weights that release the
    step (`released`), not from the put."""
    samples = [sample(0, 90, 130, 140), sample(1, 90, 130, 140)]
    common = ([(150, 151)], 60.0, {"loss": 0.0, "kl": 0.0, "clip": 0.0})
    assert step_metrics(0, samples, *common)["gen_queue_seconds"] == 40.0
    assert step_metrics(0, samples, *common, released=120.0)["gen_queue_seconds"] == 10.0
    assert step_metrics(0, samples, *common, released=80.0)["gen_queue_seconds"] == 40.0


def test_the_tokens_on_a_kept_cache_are_counted_under_interrupt_cache_keep():
    """An interrupted sample's tokens from its first change on attended to a cache
    the older version computed, where updates keep it; none where they recompute."""
    kept = sample(0, 90, 130, 140, length=10)
    kept.versions = [(0, 0, 0), (6, 1, 0)]
    plain = sample(1, 90, 130, 140, length=10)
    common = ([(150, 151)], 60.0, {"loss": 0.0, "kl": 0.0, "clip": 0.0})
    m = step_metrics(0, [kept, plain], *common, kept_cache=True)
    assert m["kept_cache_tokens"] == 4 and m["interrupted"] == 1
    assert step_metrics(0, [kept, plain], *common)["kept_cache_tokens"] == 0
