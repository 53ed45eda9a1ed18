"""A worker's timeline names its garbage collections (infra/timeline.py): one that
took GC_SPAN or longer is a "gc" span of the step of the span before it, written with
the next span; neither drawn nor counted as work; the log stops listening when it
closes."""

from __future__ import annotations

import gc

from rljob.infra import timeline
from rljob.infra.timeline import DATA, SpanLog, load_spans


def test_a_long_collection_is_a_gc_span_of_the_step_before_it(tmp_path, monkeypatch):
    log = SpanLog(tmp_path, "trainer-0")
    log.add("train", 1.0, 2.0, 3)
    monkeypatch.setattr(timeline, "GC_SPAN", 0.0)  # every collection counts
    gc.collect()
    log.add("optimizer", 2.0, 2.5, 4)
    monkeypatch.setattr(timeline, "GC_SPAN", 60.0)  # none does
    gc.collect()
    log.add("weight-sync", 2.5, 3.0, 5)
    log.close()
    spans = load_spans(tmp_path)
    kinds = [s.kind for s in spans]
    assert kinds[0] == "train" and kinds[-2:] == ["optimizer", "weight-sync"]
    pauses = [s for s in spans if s.kind == "gc"]
    assert pauses and kinds.index("gc") < kinds.index("optimizer")
    assert all(s.step == 3 and s.end >= s.start for s in pauses)
    assert "gc" in DATA  # not drawn, not work
    assert log._collected not in gc.callbacks


def test_a_log_without_a_run_directory_does_not_listen():
    log = SpanLog(None, "rollout-0")
    assert log._collected not in gc.callbacks
    log.add("generate", 0.0, 1.0, 0)
    log.close()
