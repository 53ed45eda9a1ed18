"""infra/heap.py, in a fresh interpreter each (a frozen heap is the process's for
good): what a process imported is out of its later collections, and no collection
runs while it imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUNTIME = str(Path(__file__).resolve().parents[2] / "runtime")


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={"PYTHONPATH": RUNTIME})
    return json.loads(out.stdout)


def test_what_was_imported_is_frozen_out_of_later_collections():
    seen = _run("""
import gc, json
from rljob.infra.heap import importing
collections = []
gc.callbacks.append(lambda phase, info: collections.append(1) if phase == "start" else None)
before = len(gc.get_objects())
with importing():
    inside = gc.isenabled()
    made = len(collections)
    import email.parser, decimal, numpy
    cycles = [[] for _ in range(20_000)]  # each a container: would set off collections
    for c in cycles:
        c.append(c)
    during = len(collections) - made
print(json.dumps({"before": before, "after": len(gc.get_objects()),
                  "frozen": gc.get_freeze_count(), "inside": inside, "during": during,
                  "enabled": gc.isenabled()}))
""")
    assert not seen["inside"] and seen["enabled"]  # off while importing, on again after
    assert seen["during"] == 0  # 20 000 new containers set off none
    # what the collector visits now is what comes after: the imports are frozen
    assert seen["frozen"] > seen["before"] and seen["after"] < seen["before"] // 10


def test_a_process_without_collection_stays_without():
    seen = _run("""
import gc, json
from rljob.infra.heap import importing
gc.disable()
with importing():
    import decimal
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
""")
    assert not seen["enabled"] and seen["frozen"] > 0


def test_at_exit_the_heap_is_unfrozen_for_finalization_to_free():
    seen = _run("""
import atexit, gc, json
from rljob.infra.heap import settle_heap
n = atexit._ncallbacks()
settle_heap()
settle_heap()  # once more: one atexit function all the same
frozen = gc.get_freeze_count()
added = atexit._ncallbacks() - n
atexit._run_exitfuncs()
print(json.dumps({"frozen": frozen, "at_exit": gc.get_freeze_count(), "added": added}))
""")
    assert seen["frozen"] > 0 and seen["at_exit"] == 0 and seen["added"] == 1
