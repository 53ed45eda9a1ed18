"""When a local run is done: every trainer rank exited 0 and the driver has ended
(it logs what its length ranker learned on its way out), or its grace is over."""

from __future__ import annotations

import subprocess
import time

import rljob.local as local
from rljob.api import RLJob
from rljob.local import LocalRun


def _run(tmp_path) -> LocalRun:
    job = RLJob.model_validate({
        "apiVersion": "rljob.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "s"},
        "spec": {"model": {"path": "random:x", "tokenizer": "builtin:char"},
                 "dataset": {"path": "d.jsonl"}}})
    return LocalRun(job, tmp_path)


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
    monkeypatch.setattr(local, "DRIVER_GRACE_S", 0.2)
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
