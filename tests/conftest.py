"""One standing fork server for the session's `rljob run`s (infra/forkserver.py).

Each `rljob run` forks its CPU workers from a server that imported torch and
transformers: about 8 s of a core, and the wait for it, at the start of every run. A
session runs many short jobs, so it starts one standing server (`--listen`) and hands
it to every run through `RLJOB_FORK_SERVER`; a run whose interpreter or PYTHONPATH
differs from the server's starts one of its own, as does every run of the chaos tier
(tests/chaos/conftest.py), which kills and counts a run's own processes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def standing_fork_server(request):
    items = request.session.items
    if (os.environ.get("RLJOB_FORK_SERVER") or os.environ.get("RLJOB_FORK_WORKERS") == "0"
            or all(Path(str(item.fspath)).parent.name == "cluster" for item in items)):
        yield None  # given, not wanted, or no test here runs a local job
        return
    from rljob.infra.forkserver import preload_modules, start_standing

    where = Path(tempfile.mkdtemp(prefix="rljob-forkserver-"))
    server = start_standing(where / "sock", preload_modules("qwen2"), where / "log")
    os.environ["RLJOB_FORK_SERVER"] = str(where / "sock")
    try:
        yield where / "sock"
    finally:
        os.environ.pop("RLJOB_FORK_SERVER", None)
        server.terminate()
        server.wait(60)
        shutil.rmtree(where, ignore_errors=True)
