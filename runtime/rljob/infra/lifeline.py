"""A worker ends within seconds of whoever started it, however that one ends.

`rljob run` starts each worker with a death signal (PR_SET_PDEATHSIG: SIGTERM when the
run goes, even by SIGKILL), and the worker stops as it would when asked. A stop can hang
on what went with the run (a peer it reports to, a controller that is gone), so a
worker also watches its parent: once the parent is gone, its own session (itself and
what it started: vLLM's engine core, tool servers) is SIGKILLed `grace` seconds later,
whatever it is doing then (in a group not its own, itself alone). `rljob run` asks its
workers for this (contract.LIFELINE_ENV); a worker a user starts by hand lives on.
"""

from __future__ import annotations

import os
import signal
import threading
import time

GRACE = 2.0  # as infra/forkserver.STOP_GRACE: every process of a run goes within 5 s


def orphaned(started_by: int, parent: int) -> bool:
    """Whether a process started by `started_by` has lost it (pure: `parent` is its
    parent now; an orphan is reparented to init or a subreaper)."""
    return started_by > 1 and parent != started_by


def watch_parent(grace: float = GRACE, interval: float = 0.2) -> threading.Thread | None:
    """Start the watch (a daemon thread); None where there is no parent to lose (PID 1 of
    a container, or a child of init)."""
    started_by = os.getppid()
    if started_by <= 1:
        return None

    def watch() -> None:
        while not orphaned(started_by, os.getppid()):
            time.sleep(interval)
        time.sleep(grace)
        if os.getpgid(0) == os.getpid():  # its own group (`rljob run` gives each worker
            os.killpg(os.getpid(), signal.SIGKILL)  # a session): what it started too
        os.kill(os.getpid(), signal.SIGKILL)  # in another's group: itself alone

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread
