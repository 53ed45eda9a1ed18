"""The trainer's reporter sends each step's figures from its own thread, in step
order, while the next step runs: a report that failed raises at the next step,
and what is left goes out at close (a failure then is logged, not raised)."""

from __future__ import annotations

import threading

import pytest

from rljob.trainer.report import CONTROLLER_FIGURES, Reporter


class _Controller:
    def __init__(self):
        self.steps, self.fail = [], False
        self.threads = set()

    def report_metrics(self, step, source, profile, **figures):
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("controller away")
        self.steps.append(step)


class _Sinks:
    def __init__(self):
        self.written, self.closed = [], False

    def write(self, m, version):
        self.written.append((m["step"], version))

    def close(self):
        self.closed = True


def _figures(step):
    return lambda: ({"step": step, **{k: 0.0 for k in CONTROLLER_FIGURES}}, step + 1)


def test_figures_go_out_in_step_order_from_the_reporters_thread(caplog):
    tq, sinks = _Controller(), _Sinks()
    reporter = Reporter(tq, "trainer-0", sinks)
    for step in range(20):
        reporter.submit(_figures(step))
    reporter.close()
    assert tq.steps == list(range(1, 21))
    assert sinks.written == [(s, s + 1) for s in range(20)] and sinks.closed
    assert tq.threads and all(n.startswith("rljob-report") for n in tq.threads)


def test_a_failed_report_raises_at_the_next_step_and_is_logged_at_close(caplog):
    tq, sinks = _Controller(), _Sinks()
    reporter = Reporter(tq, "trainer-0", sinks)
    tq.fail = True
    reporter.submit(_figures(0))
    reporter._sent[0].exception()  # wait until it has failed
    with pytest.raises(RuntimeError, match="controller away"):
        reporter.submit(_figures(1))  # not sent: the trainer stops here
    reporter.submit(_figures(2))  # (were it to go on, its failure is for later)
    reporter.close()  # step 2's report fails too: logged
    assert "not reported: controller away" in caplog.text and sinks.closed
