"""A run that cannot make progress says why at once: the cause of a worker's
failure from its log, the same cause twice ends the run, a summary without steps
prints no nan. And when a run is done: every trainer rank exited 0 and the driver
has ended (it logs what its length ranker learned on its way out), or its grace is
over."""

from __future__ import annotations

import subprocess
import time

import pytest

from rljob.api import RLJob
from rljob.liveview import summary_line
from rljob.local import JobFailed, LocalRun, failure_cause

VLLM_LOG = """INFO starting vLLM
(Worker pid=1) ERROR Traceback (most recent call last):
(Worker pid=1) ERROR 11-26 12:03:33 [multiproc_executor.py:1063] Traceback (most recent call last):
Traceback (most recent call last):
  File "/x/weight_utils.py", line 10, in load
    assert loaded_weight.shape[output_dim] == self.org_vocab_size
AssertionError: embedding rows 152064 != 151665

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/x/core.py", line 3, in run
    raise RuntimeError("Engine core initialization failed. Failed core proc(s): {}")
RuntimeError: Engine core initialization failed. Failed core proc(s): {}
"""


def test_the_cause_is_the_last_tracebacks_last_line():
    assert failure_cause(VLLM_LOG) == (
        "RuntimeError: Engine core initialization failed. Failed core proc(s): {} "
        "(first error: AssertionError: embedding rows 152064 != 151665)")
    assert failure_cause("INFO fine\nKilled\n") is None


def _run(tmp_path) -> LocalRun:
    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "f"},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl"}}})
    return LocalRun(job, tmp_path)


def _dies(run: LocalRun, name: str, text: str) -> None:
    """A life of `name` that wrote `text` to its log and exited."""
    log = run.layout.log(name)
    log.parent.mkdir(parents=True, exist_ok=True)
    run._life[name] = log.stat().st_size if log.exists() else 0
    with log.open("a") as f:
        f.write(text)
    run._same_failure_again(name)


def test_the_same_failure_twice_with_no_step_between_ends_the_run(tmp_path):
    run = _run(tmp_path)
    boom = "Traceback (most recent call last):\n  File x\nValueError: bad checkpoint\n"
    _dies(run, "rollout-0", boom)
    with pytest.raises(JobFailed, match=r"rollout-0 failed twice the same way with no step "
                       r"done in between: ValueError: bad checkpoint \(logs/rollout-0.log\)"):
        _dies(run, "rollout-0", "INFO starting again\n" + boom)


def test_failures_that_differ_or_between_steps_restart_as_before(tmp_path):
    run = _run(tmp_path)
    _dies(run, "trainer-0", "Traceback (most recent call last):\nOSError: one\n")
    _dies(run, "trainer-0", "Traceback (most recent call last):\nOSError: two\n")  # differs
    run.layout.metrics.write_text('{"step": 1}\n')  # the job made a step
    _dies(run, "trainer-0", "Traceback (most recent call last):\nOSError: two\n")
    _dies(run, "trainer-0", "killed by SIGKILL\n")  # no traceback: a chaos kill
    _dies(run, "trainer-0", "Traceback (most recent call last):\nOSError: two\n")


def test_a_summary_without_steps_prints_no_nan():
    assert summary_line({"steps": 0}, 361) == "0 steps in 361s"
    line = summary_line({"steps": 3, "reward_first": 0.25, "reward_last": 0.5,
                         "bubble_ratio": 0.4}, 20)
    assert line == "3 steps in 20s; mean reward 0.250 → 0.500; bubble ratio 40%"
    assert "nan" not in summary_line({"steps": 1, "reward_first": float("nan"),
                                      "reward_last": 0.1, "bubble_ratio": float("nan")}, 5)


def test_rljob_run_names_the_fields_only_a_cluster_applies():
    from rljob.local import cluster_only_fields

    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "f"},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl", "pvc": "data"},
                 "rollout": {"replicas": 1, "resources": {"cpu": "2"}},
                 "scheduling": {"priorityClassName": "high"},
                 "runPolicy": {"backoffLimit": 2}}})
    assert cluster_only_fields(job) == ["spec.scheduling", "spec.dataset.pvc",
                                        "spec.rollout.resources"]
    # a resumed run's job.yaml has every field written out: the same ones, no more
    resumed = RLJob.model_validate(job.to_wire())
    assert {"image", "transfer_queue", "accelerator"} <= resumed.spec.model_fields_set
    assert cluster_only_fields(resumed) == cluster_only_fields(job)
    # a field set to its default changes nothing here
    same = RLJob.model_validate({**job.to_wire(), "spec": {
        "model": {"path": "random:x"}, "dataset": {"path": "d.jsonl"},
        "transferQueue": {"storageUnits": 1}, "image": "rljob/runtime:0.1.0"}})
    assert cluster_only_fields(same) == []


def _tiny_job(name: str = "quickstart", **spec) -> RLJob:
    """A job of the tiny random model, for the live view's tests."""
    return RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl"}, **spec}})


def test_the_live_table_fits_an_80_column_terminal():
    import io
    import time
    from pathlib import Path

    from rich.console import Console

    from rljob.liveview import RunView

    class Runner:
        run_dir, steps, restarts = Path("/nonexistent"), 300, {"rollout-1": 1}
        events = ["12:00:01 rollout-1 exited with 1; restart 1/3 in 1s"]

        def metrics(self):
            return [dict(step=i, reward_mean=0.41234, loss=-0.01234, kl=0.00123,
                         staleness_mean=0.75, staleness_max=1, tokens_per_second=123456.0,
                         gen_seconds=12.34, train_seconds=23.45, time=100.0 + i)
                    for i in range(290, 300)]

    job = _tiny_job()
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    console.print(RunView(Runner(), job, console, 0, time.monotonic()).render())
    lines = out.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    assert "…" not in out.getvalue()  # no figure cut
    assert any("299/300" in x and "-0.0123" in x and "123456" in x for x in lines)


def test_the_resume_command_and_the_outputs_are_never_wrapped(tmp_path):
    import io
    import time

    from rich.console import Console

    from rljob.liveview import RunView

    directory = tmp_path / ("runs-with-a-rather-long-name-" + "x" * 40) / "quickstart-20261128"
    (directory / "checkpoints").mkdir(parents=True)
    (directory / "metrics.jsonl").write_text("")

    class Runner:
        restarts, events = {}, []

        def metrics(self):
            return []

        def resume_step(self):
            return 12

    job = _tiny_job()
    out = io.StringIO()  # a log file: rich's 80 columns, no terminal
    console = Console(file=out, width=80)
    file = tmp_path / "examples" / "quickstart.yaml"
    RunView(Runner(), job, console, 0, time.monotonic()).summary(directory, {}, 130, file)
    lines = out.getvalue().splitlines()
    assert f"rljob run {file} --resume {directory}" in lines
    assert any(x.startswith(f"wrote {directory}/{{") for x in lines)


def test_a_resumed_run_says_and_sums_up_only_its_own_steps(tmp_path):
    import io
    import time

    from rich.console import Console

    from rljob.liveview import RunView

    now = time.time()
    old = [dict(step=s, reward_mean=0.1, loss=0.0, kl=0.0, staleness_mean=0.0, staleness_max=0,
                tokens_per_second=1.0, gen_seconds=1.0, train_seconds=1.0, time=now - 500 + s)
           for s in range(1, 51)]

    class Runner:
        run_dir, steps, restarts, events = tmp_path, 60, {}, []
        ms = list(old)

        def metrics(self):
            return list(self.ms)

        def resume_step(self):
            return 0

    job = _tiny_job()
    out = io.StringIO()
    runner = Runner()
    view = RunView(runner, job, Console(file=out, width=80), 0, time.monotonic() - 10,
                   resumed=True)
    lines = view.open()
    lines.update()
    assert "step 50/60" not in out.getvalue()  # the earlier run's steps are not said again
    # the resumed run trains step 41 on (its checkpoint's) again, then 42
    runner.ms = old[:40] + [dict(old[40], time=now + 1, reward_mean=0.5),
                            dict(old[41], time=now + 2, reward_mean=0.7)]
    lines.update()
    said = [x for x in out.getvalue().splitlines() if x.startswith("step ")]
    assert [x.split(" · ")[0] for x in said] == ["step 41/60", "step 42/60"]
    view.summary(tmp_path, {"steps": 42, "reward_first": 0.1, "reward_last": 0.7}, 0,
                 tmp_path / "job.yaml")
    summary = out.getvalue().splitlines()[-2]
    assert summary.startswith("2 steps (41-42) in ")
    assert "mean reward 0.500 → 0.700" in summary


def test_an_episodic_job_shows_turns_and_tool_calls_in_80_columns():
    import io
    import time

    from rich.console import Console

    from rljob import progress
    from rljob.liveview import RunView

    class Runner:
        run_dir, steps, restarts, events = None, 300, {}, []

        def metrics(self):
            return [dict(step=i, reward_mean=0.41234, loss=-0.01234, kl=0.00123,
                         staleness_mean=0.75, staleness_max=1, tokens_per_second=123456.0,
                         gen_seconds=12.34, train_seconds=23.45, time=100.0 + i,
                         turns_mean=2.375, turns_max=4, tool_calls=49, tool_errors=2,
                         malformed_calls=3) for i in range(290, 300)]

    job = _tiny_job("calc", rollout={"environment": "calculator"})
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    console.print(RunView(Runner(), job, console, 0, time.monotonic()).render())
    lines = out.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80 and "…" not in out.getvalue()
    assert any("turns" in x and "calls" in x for x in lines)
    assert any("299/300" in x and "2.4" in x and "49/5" in x for x in lines)
    line = progress.step_line(Runner().metrics(), 300, elapsed=5)
    assert " · turns 2.4 · tool calls/failed 49/5 · " in line


def _ended(code: int) -> subprocess.Popen:
    proc = subprocess.Popen(["sh", "-c", f"exit {code}"])
    proc.wait()
    return proc


def test_a_run_waits_for_its_driver_after_the_trainer(tmp_path):
    run = _run(tmp_path)
    driver = subprocess.Popen(["sleep", "30"])
    try:
        run.procs.update({"trainer-0": _ended(0), "driver": driver})
        assert run.supervise() is False  # the driver is still logging its last lines
        driver.terminate()
        driver.wait()
        assert run.supervise() is True
    finally:
        driver.kill()


def test_a_driver_that_does_not_end_is_stopped_after_its_grace(tmp_path, monkeypatch):
    monkeypatch.setattr("rljob.local.DRIVER_GRACE_S", 0.2)
    run = _run(tmp_path)
    driver = subprocess.Popen(["sleep", "30"])
    try:
        run.procs.update({"trainer-0": _ended(0), "trainer-1": _ended(0), "driver": driver})
        assert run.supervise() is False
        time.sleep(0.3)
        assert run.supervise() is True
    finally:
        driver.kill()
        driver.wait()


def test_a_run_is_not_done_while_a_trainer_rank_runs(tmp_path):
    run = _run(tmp_path)
    rank = subprocess.Popen(["sleep", "30"])
    try:
        run.procs.update({"trainer-0": _ended(0), "trainer-1": rank, "driver": _ended(0)})
        assert run.supervise() is False
    finally:
        rank.kill()
        rank.wait()
