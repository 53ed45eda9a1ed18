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
    # the last step's metrics are in, the run is not over: say what it does
    assert progress.phase(ms, 3, 200) == "RL step 3/3 done: writing the final weights"


def test_the_warm_up_reports_its_progress_to_the_view(tmp_path):
    from rljob.infra.rundir import RunDir
    from rljob.liveview import RunView
    from rljob.trainer.warmup import warmup_reporter

    report = warmup_reporter(RunDir(tmp_path))
    runner = type("Runner", (), {"run_dir": tmp_path})()
    view = RunView(runner, None, None, warmup=200, started=0.0)
    assert view.warm() is None  # before the first report
    report(40, 200, 1.2345)
    assert progress.phase([], 10, 200, view.warm()).startswith("warm-up 40/200 (loss 1.234, ")
    assert view.warm()["seconds"] >= 0
    # the time left at the warm-up's pace so far: 40 steps in 20 s, 160 to go
    assert progress.phase([], 10, 200, {"step": 40, "of": 200, "loss": 1.2345, "seconds": 20}
                          ) == "warm-up 40/200 (loss 1.234, 1:20 left)"
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


def test_the_wide_line_adds_the_off_policy_figures_and_an_alert_is_said_once():
    ms = [_m(1, 100.0, 0.0), _m(2, 110.0, 1.0)]
    ms[1] |= {"clip": 0.0123, "is_weight_mean": 0.998, "is_weight_max": 2.5, "is_capped": 0.01,
              "is_ess": 0.97}  # no fresh sample this step: no mismatch figure
    line = progress.step_line(ms, 4, elapsed=75, wide=True)
    assert ("Ttrain 2.00s · clipped 0.012 · IS w mean 0.998 · IS w max 2.50 · capped 0.010 · "
            "ESS 0.970 · mismatch - · elapsed") in line
    assert "IS w" not in progress.step_line(ms, 4, elapsed=75)
    assert progress.alerts(ms) == []
    ms += [_m(3, 120.0, 1.0) | {"off_policy_alert": "mismatch 0.8"},
           _m(4, 130.0, 1.0) | {"off_policy_alert": "mismatch 0.8"}]
    assert progress.alerts(ms) == ["step 3: mismatch 0.8"]


def test_the_trainer_gauges_show_the_off_policy_figures():
    from prometheus_client import generate_latest

    from rljob.infra.worker_metrics import WorkerMetrics
    from rljob.trainer.sinks import PrometheusSink

    prom = WorkerMetrics("trainer-0", None)
    m = _m(1, 100.0, 0.5) | {"samples": 4, "tokens": 12, "is_weight_mean": 1.01,
                             "is_weight_max": 3.0, "is_capped": 0.02, "is_ess": 0.9,
                             "logp_mismatch_mean": 2e-3, "logp_mismatch_max": None}
    PrometheusSink(prom).write(m, 1)
    body = generate_latest(prom.registry).decode()
    for series, value in (("rljob_job_importance_weight_mean", 1.01),
                          ("rljob_job_importance_weight_max", 3.0),
                          ("rljob_job_importance_capped_ratio", 0.02),
                          ("rljob_job_importance_ess_ratio", 0.9),
                          ("rljob_job_logprob_mismatch_nats", 2e-3)):
        assert f'{series}{{worker="trainer-0"}} {value}' in body
    assert 'rljob_job_logprob_mismatch_max_nats{worker="trainer-0"} 0.0' in body  # never set
