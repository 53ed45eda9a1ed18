"""A run's timeline panels (pure): the whole run, its first steps and its steady state."""

from __future__ import annotations

from rljob.infra.timeline import Span, run_panels


def _spans(steps: int) -> list[Span]:
    out = []
    for t in range(steps):
        out.append(Span("rollout-0", "generate", t * 10.0, t * 10.0 + 6, t))
        out.append(Span("rollout-0", "weight-sync", t * 10.0 + 9, t * 10.0 + 9.5, t + 1))
        out.append(Span("trainer-0", "train", t * 10.0 + 6, t * 10.0 + 9, t))
    return out


def test_a_long_run_gets_a_window_on_its_first_steps_and_its_steady_state():
    panels = run_panels(_spans(20), "job", 0.25)
    titles = [t for t, _ in panels]
    assert titles[0] == "job: all 20 steps, bubble ratio 25%"
    assert titles[1].startswith("job: first steps (steps 1-3), bubble ratio ")
    assert titles[2].startswith("job: steady state (steps 18-20), bubble ratio ")
    # titles number steps from 1, as metrics.jsonl does (a span's step t is step t + 1)
    assert {s.step for s in panels[1][1]} == {0, 1, 2}
    assert {s.step for s in panels[2][1]} == {17, 18, 19}
    # the window keeps the weight syncs of its steps
    assert any(s.kind == "weight-sync" for s in panels[2][1])


def test_a_short_run_is_one_panel():
    assert len(run_panels(_spans(6), "job", 0.1)) == 1
