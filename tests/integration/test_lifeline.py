"""infra/lifeline.py with real processes: a worker that ignores the SIGTERM its parent's
death brings still goes, with what it started, within seconds of a SIGKILLed parent;
and infra/proctitle.py's title as `ps` reads it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from rljob.infra.lifeline import GRACE
from tests.chaos.test_faults import _alive

# the parent starts a child in a session of its own (as `rljob run` does), which titles
# itself, watches its parent, ignores SIGTERM and starts a grandchild
CHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    from rljob.infra.lifeline import watch_parent
    from rljob.infra.proctitle import set_title
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    set_title("trainer", 3, 4, "lifeline")
    watch_parent()
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(grandchild.pid, flush=True)
    time.sleep(600)
""")
PARENT = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE,
                             start_new_session=True, text=True)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    child.wait()
""")


def test_a_worker_goes_with_its_session_soon_after_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ))
    child, grandchild = map(int, parent.stdout.readline().split())
    ps = subprocess.run(["ps", "-o", "comm=,args=", "-p", str(child)], capture_output=True,
                        text=True).stdout.split(None, 1)
    assert ps[0] == "rljob-trainer3" and ps[1].strip() == "rljob: trainer rank 3/4 [lifeline]"
    time.sleep(GRACE + 0.5)  # alive while its parent is: the watch waits for the loss only
    assert _alive(child) and _alive(grandchild)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    t0 = time.monotonic()
    while _alive(child) or _alive(grandchild):
        assert time.monotonic() - t0 < GRACE + 2, "the orphan outlived its grace"
        time.sleep(0.05)
    assert time.monotonic() - t0 >= GRACE - 0.3  # it had its grace to stop as asked
