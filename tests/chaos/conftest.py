"""The chaos tier's runs each start their own fork server: its tests kill it, and
count every process of a run (forks show their server's command line, which names
the run directory)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def own_fork_server(monkeypatch):
    monkeypatch.delenv("RLJOB_FORK_SERVER", raising=False)
