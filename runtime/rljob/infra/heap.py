"""The garbage collector in a long-running worker: what it imported is frozen out of
every later collection.

A worker imports torch, transformers, grpc and protobuf before it does anything:
hundreds of thousands of objects that live as long as the process. Python's full
collection visits every tracked object, so each one in a worker that had imported
torch took 0.47-0.49 s of a core (measured with `gc.callbacks` in a sync run on the
2-core machine: the trainer, the rollout replica and the driver, forks of `rljob
run`'s fork server, each made one as the first step started, three at once on two
cores), and one of the TransferQueue controller's took 62 ms in the middle of the
run, holding a step up. `settle_heap` collects once and moves what is left into the
collector's permanent generation (`gc.freeze`), so a later full collection visits
only what the process made after it: in the same run since, the forks' first ones
took 14-36 ms and the controller's 21 ms. A fork server settles after its imports,
before it forks: a fork's collections then never write to the pages it shares with
the server (copy-on-write keeps them shared).

Frozen objects are still freed when nothing refers to them; only a cycle among them
would stay, so the call goes where what lives then lives as long as the process:
after a process's imports, and after a trainer's or a rollout replica's set-up (its
model, engine and clients; `run_trainer`, `run_rollout`), never in library code (like
`tune_allocator`, it is the entrypoint's choice). At exit they are unfrozen, so a
normal exit frees them as before and `quickexit.end` finds every open file. A
worker's timeline shows each collection of a millisecond or more ("gc" spans,
infra/timeline.py)."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_AT_EXIT: list[bool] = []  # the atexit function is registered (once a process)


def settle_heap() -> int:
    """Collect, then freeze what is left; returns how many objects are frozen now.
    At exit they are unfrozen (an atexit function), so Python's finalization frees
    them as before (some extensions report what is still alive then as leaked)."""
    gc.collect()
    gc.freeze()
    if not _AT_EXIT:
        atexit.register(gc.unfreeze)
        _AT_EXIT.append(True)
    return gc.get_freeze_count()


@contextmanager
def importing() -> Iterator[None]:
    """Around a process's imports: no collection while they run, then `settle_heap`.
    What an import makes stays, so the collections it sets off find next to nothing
    to free: the fork server's imports (torch, transformers, the model's classes) set
    off 948, 1.5-1.7 s together, and now one, settle_heap's (0.5-0.7 s); the
    imports' CPU went from 3.6-3.7 s to 3.2-3.4 s (three runs each, 2-core machine)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        settle_heap()
        if enabled:
            gc.enable()
