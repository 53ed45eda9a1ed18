"""A worker's end without Python's finalization.

A process that imported torch and transformers spends about 2.4 s of a core at
exit tearing their modules down one object at a time (measured on a 2-core
machine). A worker has nothing to gain from it: `end` does what an exit must
(joins the threads Python would join, runs the atexit functions, flushes every
open file) and then leaves with `os._exit`."""

from __future__ import annotations

import atexit
import gc
import io
import os
import signal
import threading
from typing import NoReturn


def end(code: int, interrupted: bool = False) -> NoReturn:
    """Exit with `code` as Python would, less the modules' teardown; `interrupted`:
    as Python ends on an uncaught KeyboardInterrupt (by SIGINT)."""
    threading._shutdown()  # type: ignore[attr-defined]  # as multiprocessing's children do
    atexit._run_exitfuncs()
    # the types of Python's open files, by type() (isinstance would ask every object
    # for its __class__, and some of torch's warn when asked)
    files = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    gc.unfreeze()  # those opened before the heap was settled too (infra/heap.py)
    for obj in gc.get_objects():
        if issubclass(type(obj), files):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


def exit_code(exc: SystemExit) -> int:
    """The status a SystemExit ends with (its message, if it has one, printed as
    Python prints it)."""
    import sys

    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1
