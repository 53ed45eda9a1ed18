"""The pure parts of `rljob bench overhead` and of the benchmarks' step breakdown."""

from __future__ import annotations

import pytest

from rljob.infra.timeline import Span


def test_a_steps_parts_are_each_roles_spans_a_step():
    from rljob_bench.workflow import step_parts

    spans = [Span("trainer-0", "train", 0.0, 0.3, 5), Span("trainer-0", "train", 1.0, 1.1, 6),
             Span("rollout-0", "generate", 0.0, 0.2, 5), Span("rollout-1", "generate", 0.0, 0.4, 5),
             Span("trainer-0", "weight-sync", 0.4, 0.5, 5)]
    parts = step_parts(spans, steps=2)
    assert parts["trainer"]["train"] == pytest.approx(0.2)
    assert parts["trainer"]["weight-sync"] == pytest.approx(0.05)
    assert parts["rollout"] == {"generate": pytest.approx(0.3)}


def test_compute_adds_up_in_sync_and_takes_the_busier_side_when_overlapped():
    from rljob_bench.overhead import compute_ms

    parts = {"trainer": {"train": 0.030, "optimizer": 0.002, "reference": 0.008,
                         "weight-sync": 0.5},
             "rollout": {"generate": 0.020, "reference": 0.004, "weight-sync": 0.5}}
    assert compute_ms("sync", parts) == pytest.approx(64.0)  # weight-sync is not compute
    assert compute_ms("async", parts) == pytest.approx(40.0)
    assert compute_ms("periodic", parts) == pytest.approx(40.0)
    assert compute_ms("sync", {}) == 0.0


def test_busy_time_is_the_union_of_every_workers_compute():
    from rljob.infra.timeline import busy_seconds, covered

    assert covered([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert covered([]) == 0.0
    spans = [Span("trainer-0", "train", 0.0, 0.3, 5), Span("rollout-0", "generate", 0.2, 0.5, 5),
             Span("rollout-0", "claim", 0.5, 0.9, 5),  # the data path: no compute
             Span("trainer-0", "reference", 0.8, 1.2, 6)]
    assert busy_seconds(spans, (0.0, 1.0)) == pytest.approx(0.7)  # [0, 0.5] and [0.8, 1.0]
    assert busy_seconds(spans, (0.0, 1.0), kinds=("train",)) == pytest.approx(0.3)


def test_cpu_between_reads_each_end_off_the_line_between_the_reads_around_it():
    from rljob_bench.workflow import cpu_between

    reads = [(10.0, 1.0), (11.0, 1.5), (12.0, 3.5)]  # (wall, CPU seconds)
    assert cpu_between(reads, 10.0, 12.0) == pytest.approx(2.5)
    # 10.5 → 1.25 (between the first two reads), 11.5 → 2.5 (between the last two)
    assert cpu_between(reads, 10.5, 11.5) == pytest.approx(1.25)
    # before the first read and after the last: none used there (started late, ended)
    assert cpu_between(reads, 0.0, 100.0) == pytest.approx(2.5)
    assert cpu_between(reads, 12.5, 13.0) == 0.0
    assert cpu_between(reads[:1], 10.0, 12.0) is None  # one read says nothing
