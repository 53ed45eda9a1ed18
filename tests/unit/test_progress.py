"""The run's progress figures (pure): smoothing, clock, ETA, the per-step line."""

from __future__ import annotations

from rljob import progress


def _m(step, t, reward):
    return {"step": step, "time": t, "reward_mean": reward, "loss": 0.5, "kl": None,
            "staleness_mean": 0.5, "staleness_max": 1, "tokens_per_second": 1000.0,
            "gen_seconds": 1.0, "train_seconds": 2.0}


def test_smoothing_clock_and_eta():
    assert progress.smoothed([1.0, 0.0, 0.0], alpha=0.5) == [1.0, 0.5, 0.25]
    assert [progress.clock(s) for s in (5, 65, 3725, None, -1)] == [
        "0:05", "1:05", "1:02:05", "--", "--"]
    ms = [_m(1, 100.0, 0.1), _m(2, 103.0, 0.2), _m(3, 106.0, 0.3)]
    assert progress.eta(ms[:1], 10) is None  # one step says nothing of the pace
    assert progress.eta(ms, 10) == 7 * 3.0
    assert progress.phase([], 10, 200) == "warm-up (200 steps) and start-up"
    assert progress.phase(ms, 10, 200) == "RL step 3/10"


def test_a_step_line_has_every_figure():
    ms = [_m(1, 100.0, 0.0), _m(2, 110.0, 1.0)]
    line = progress.step_line(ms, 4, elapsed=75)
    assert line == ("step 2/4 · reward 1.000 (smoothed 0.100) · loss 0.5000 · kl - · "
                    "staleness 0.50/1 · 1000 tok/s · Tgen 1.00s · Ttrain 2.00s · "
                    "elapsed 1:15 · ETA 0:20")
