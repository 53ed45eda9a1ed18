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
    assert progress.phase([], 10, 200) == "start-up, then warm-up (200 steps)"
    assert progress.phase([], 10, 0) == "start-up"
    assert progress.phase(ms, 10, 200) == "RL step 3/10"


def test_the_warm_up_reports_its_progress_to_the_view(tmp_path):
    from rljob.infra.rundir import RunDir
    from rljob.liveview import RunView
    from rljob.trainer.worker import warmup_reporter

    report = warmup_reporter(RunDir(tmp_path))
    runner = type("Runner", (), {"run_dir": tmp_path})()
    view = RunView(runner, None, None, warmup=200, started=0.0)
    assert view.warm() is None  # before the first report
    report(40, 200, 1.2345)
    assert progress.phase([], 10, 200, view.warm()) == "warm-up 40/200 (loss 1.234)"
    report(200, 200, 0.5)
    assert progress.phase([], 10, 200, view.warm()) == (
        "warm-up done (loss 0.500), start-up of RL step 1")
    assert "warm-up 7/9" in progress.header("job", [], 10, 9, 5.0,
                                            warm={"step": 7, "of": 9, "loss": 2.0})
    assert warmup_reporter(None) is None


def test_a_step_line_has_every_figure():
    ms = [_m(1, 100.0, 0.0), _m(2, 110.0, 1.0)]
    line = progress.step_line(ms, 4, elapsed=75)
    assert line == ("step 2/4 · reward 1.000 (smoothed 0.100) · loss 0.5000 · kl - · "
                    "staleness 0.50/1 · 1000 tok/s · Tgen 1.00s · Ttrain 2.00s · "
                    "elapsed 1:15 · ETA 0:20")
