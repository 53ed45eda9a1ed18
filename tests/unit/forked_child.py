"""A child for tests/unit/test_forkserver.py: `python -m tests.unit.forked_child OUT
[exit CODE | sleep | raise | open-file PATH | stop-file PATH]` writes what it sees of
itself to OUT, then does what its arguments say."""

import gc
import json
import os
import signal
import sys
import time

if __name__ == "__main__":
    out, *what = sys.argv[1:]
    if what[:1] == ["stop-file"]:
        # as the trainer does: SIGTERM stops it, it writes what it has, exits 0 (set
        # before OUT is written: a test that saw OUT may signal it)
        def stop(*_):
            with open(what[1], "w") as f:
                f.write("checkpointed\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
    torch = sys.modules.get("torch")
    # written whole under another name, then renamed: a test that sees OUT reads it all
    with open(out + ".part", "w") as f:
        json.dump({"pid": os.getpid(), "sid": os.getsid(0), "argv": sys.argv[1:],
                   "env": {k: os.environ.get(k) for k in ("POD_NAME", "OMP_NUM_THREADS")},
                   "cpus": sorted(os.sched_getaffinity(0)),
                   "threads": torch.get_num_threads() if torch else None, "cwd": os.getcwd(),
                   "preloaded": torch is not None,
                   # the server's imports, frozen out of the child's collections
                   "frozen": gc.get_freeze_count(), "collecting": gc.isenabled()}, f)
    os.replace(out + ".part", out)
    print("hello from the child")
    if what[:1] == ["exit"]:
        sys.exit(int(what[1]))
    if what[:1] == ["sleep"]:
        time.sleep(600)
    if what[:1] == ["stop-file"]:
        time.sleep(600)
    if what[:1] == ["raise"]:
        raise RuntimeError("the child failed")
    if what[:1] == ["open-file"]:
        # written, never flushed or closed: the exit flushes it
        kept = open(what[1], "w")
        kept.write("unflushed line\n")
