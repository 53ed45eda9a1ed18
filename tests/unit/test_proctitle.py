"""A worker's process title (infra/proctitle.py) and when it counts as orphaned
(infra/lifeline.py): the pure parts."""

from __future__ import annotations

from rljob.infra.lifeline import orphaned
from rljob.infra.proctitle import COMM_BYTES, worker_title


def test_each_role_says_what_it_is_in_ps_and_top():
    cases = {("trainer", 0, 2, "quickstart"): ("rljob: trainer rank 0/2 [quickstart]",
                                                "rljob-trainer0"),
             ("rollout", 11, None, "job"): ("rljob: rollout replica 11 [job]", "rljob-rollout11"),
             ("transferqueue", None, None, "job"): ("rljob: transferqueue [job]", "rljob-tq"),
             ("driver", None, None, None): ("rljob: driver", "rljob-driver"),
             ("fork server", None, None, "runs/q"): ("rljob: fork server [runs/q]",
                                                     "rljob-forksrv")}
    for args, (title, comm) in cases.items():
        got = worker_title(*args)
        assert (got.title, got.comm) == (title, comm), args


def test_the_short_name_fits_the_kernels_and_keeps_the_role():
    got = worker_title("rollout", 123456, None, "x")
    assert len(got.comm.encode()) <= COMM_BYTES and got.comm.startswith("rljob-rollout")


def test_an_orphan_is_a_process_whose_parent_changed():
    assert orphaned(500, 1) and orphaned(500, 77)  # init, or a subreaper
    assert not orphaned(500, 500)
    assert not orphaned(1, 1) and not orphaned(0, 0)  # nobody to lose


def test_only_rljob_runs_workers_watch_their_parent(monkeypatch):
    """`rljob run` asks its workers to end with it (LIFELINE_ENV); a worker a user starts
    by hand, in the background of a shell that then exits, lives on."""
    import threading

    from rljob.cli.worker import _become
    from rljob.contract import LIFELINE_ENV

    import setproctitle

    def watching() -> int:
        return sum(t.name == "lifeline" for t in threading.enumerate())

    title, comm = setproctitle.getproctitle(), open("/proc/self/comm").read().strip()
    before = watching()
    try:
        monkeypatch.delenv(LIFELINE_ENV, raising=False)
        _become("driver", job="by-hand")
        assert watching() == before
        monkeypatch.setenv(LIFELINE_ENV, "1")
        _become("driver", job="of-a-run")
        assert watching() == before + 1  # a daemon thread: it ends with the test process
    finally:  # this process is pytest's: its own title again
        setproctitle.setproctitle(title)
        with open("/proc/self/comm", "w") as f:
            f.write(comm)
