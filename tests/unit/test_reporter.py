"""The trainer's reporter sends each step's figures from its own thread, in step
order, while the next step runs: a report that failed raises at the next step,
and what is left goes out at close (a failure then is logged, not raised); a
checkpoint waits for the figures of the steps it holds."""

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


def test_figures_are_made_once_what_they_wait_for_returned_and_the_caller_goes_on():
    """sync and periodic: a step's figures wait until the replicas hold its weights
    (`after`), in the reporter's thread: the caller does not wait, and neither do the
    weight service's threads for the figures' Python."""
    tq, sinks = _Controller(), _Sinks()
    reporter = Reporter(tq, "trainer-0", sinks)
    out, made = threading.Event(), []

    def figures():
        made.append(out.is_set())
        return _figures(0)()

    reporter.submit(figures, after=lambda: out.wait(5))
    assert made == [] and not reporter._sent[0].done()  # submit returned at once
    threading.Timer(0.2, out.set).start()
    reporter.flush()
    assert made == [True] and sinks.written == [(0, 1)]
    reporter.close()


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


def test_flush_waits_for_every_submitted_report_and_raises_a_failure():
    tq, sinks = _Controller(), _Sinks()
    reporter = Reporter(tq, "trainer-0", sinks)
    gate = threading.Event()

    def slow():
        gate.wait(5)
        return _figures(0)()

    reporter.submit(slow)
    reporter.submit(_figures(1))
    threading.Timer(0.2, gate.set).start()
    reporter.flush()
    assert sinks.written == [(0, 1), (1, 2)]
    tq.fail = True
    reporter.submit(_figures(2))
    with pytest.raises(RuntimeError, match="controller away"):
        reporter.flush()
    reporter.close()


def test_a_checkpoint_is_taken_after_its_steps_figures_are_written(monkeypatch):
    """A trainer restarted from a checkpoint trains the steps after it again: the
    steps up to it must each have their line already (none is written twice over a
    gap)."""
    from rljob.trainer import worker as worker_module

    tq, sinks = _Controller(), _Sinks()
    reporter = Reporter(tq, "trainer-0", sinks)
    gate = threading.Event()

    def slow():
        gate.wait(0.3)  # the figures of step 3 take a while to make and send
        return _figures(3)()

    seen = []
    monkeypatch.setattr(worker_module, "commit",
                        lambda *args: seen.append(list(sinks.written)))
    trainer = object.__new__(worker_module.TrainerWorker)
    trainer.reporter, trainer.run_dir, trainer.version = reporter, None, 4
    trainer.policy = trainer.opt = trainer.consumer = trainer.lineage = None
    trainer.rank, trainer.world, trainer.uncommitted = 0, 1, []
    reporter.submit(slow)
    trainer.checkpoint()
    assert seen == [[(3, 4)]] and trainer.checkpointed == 4
    reporter.close()
