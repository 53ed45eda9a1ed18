"""A run that cannot make progress says why at once: the cause of a worker's
failure from its log, the same cause twice ends the run, a summary without steps
prints no nan."""

from __future__ import annotations

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

    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "quickstart"},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl"}}})
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    console.print(RunView(Runner(), job, console, 0, time.monotonic()).render())
    lines = out.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    assert "…" not in out.getvalue()  # no figure cut
    assert any("299/300" in x and "-0.0123" in x and "123456" in x for x in lines)
